/*-------------------------------------------------------------------------
 *
 * bench_kafka.h
 *		What the benchmark tools (relay, peers, drain_wait, the inbox consumers)
 *		share: all of test/tools/tool_common.h (dying with a message, option
 *		parsing, librdkafka properties), a clock, the status file a
 *		publisher reports its progress in, checked libpq statements, the
 *		inbox baselines' consumer and the benchmark's librdkafka producer.
 *
 * test/bench/bench_kafka.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef BENCH_KAFKA_H
#define BENCH_KAFKA_H

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "tool_common.h"

extern double now_s(void);
extern void write_status_file(const char *path, long settled, double last_settle,
							  long acked, int paused);

extern PGresult *exec_ok(PGconn *conn, const char *sql, ExecStatusType want);
extern PGresult *exec_params(PGconn *conn, const char *sql, int n,
							 const char *const *params, ExecStatusType want);

/* The command line both inbox baselines share. */
typedef struct InboxOptions
{
	const char *dsn;
	const char *brokers;
	const char *topic;
	const char *group;
	long		events;
	double		max_seconds;
} InboxOptions;

extern void parse_inbox_options(int argc, char **argv, InboxOptions *o,
								const ToolOpt *more);
extern PGconn *connect_db(const char *dsn);
extern rd_kafka_t *subscribe_consumer(const char *brokers, const char *group,
									  const char *topic, const char *const *settings,
									  void (*rebalance_cb) (rd_kafka_t *rk,
															rd_kafka_resp_err_t err,
															rd_kafka_topic_partition_list_t *parts,
															void *opaque));
extern rd_kafka_t *make_producer(const char *brokers, const char *client_id,
								 const ToolList *extra,
								 void (*dr_cb) (rd_kafka_t *rk,
												const rd_kafka_message_t *m,
												void *opaque));

#endif							/* BENCH_KAFKA_H */
