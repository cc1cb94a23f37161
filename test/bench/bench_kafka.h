/*-------------------------------------------------------------------------
 *
 * bench_kafka.h
 *		What the benchmark tools (relay, peers, drain_wait, the inbox consumers)
 *		share: dying with a message, a clock, option parsing, the status
 *		file a publisher reports its progress in, checked libpq statements
 *		and the benchmark's librdkafka producer.
 *
 * test/bench/bench_kafka.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef BENCH_KAFKA_H
#define BENCH_KAFKA_H

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

extern void fatal(const char *fmt,...) __attribute__((format(printf, 1, 2), noreturn));
extern double now_s(void);
extern long parse_long(const char *opt, const char *val, long min, long max);
extern void write_status_file(const char *path, long settled, double last_settle,
							  long acked, int paused);

extern PGresult *exec_ok(PGconn *conn, const char *sql, ExecStatusType want);
extern PGresult *exec_params(PGconn *conn, const char *sql, int n,
							 const char *const *params, ExecStatusType want);

extern void conf_set(rd_kafka_conf_t *conf, const char *prop, const char *val);
extern rd_kafka_t *make_producer(const char *brokers, const char *client_id,
								 const char **extra, int nextra,
								 void (*dr_cb) (rd_kafka_t *rk,
												const rd_kafka_message_t *m,
												void *opaque));

#endif							/* BENCH_KAFKA_H */
