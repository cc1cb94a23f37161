/*-------------------------------------------------------------------------
 *
 * bench_kafka.c
 *		Helpers shared by the benchmark tools (with test/tools/tool_common.c
 *		for dying, option parsing and librdkafka properties): a clock, the
 *		status file, checked libpq statements, the inbox baselines' consumer
 *		and connection, and the one producer set-up
 *		every Kafka-writing baseline uses (relay.c, peers.c), so that they
 *		differ from the extension in what they read, never in how they send.
 *
 *	The producer: librdkafka defaults plus enable.idempotence=true (hence
 *	acks=all) and partitioner=murmur2_random, what the extension also uses;
 *	client.id; then every -X PROP=VAL, so they can override the above.
 *
 * test/bench/bench_kafka.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include "bench_kafka.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Monotonic seconds. */
double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/*
 * Rewrite a publisher's status file atomically (write, then rename):
 * "settled=N last_settle=EPOCH acked=N paused=0|1", what drain_wait
 * --status-file polls instead of querying the publisher's tables.
 */
void
write_status_file(const char *path, long settled, double last_settle,
				  long acked, int paused)
{
	char		tmp[4096];
	FILE	   *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (f == NULL)
		fatal("could not write \"%s\": %s", tmp, strerror(errno));
	fprintf(f, "settled=%ld last_settle=%.6f acked=%ld paused=%d\n",
			settled, last_settle, acked, paused);
	if (fclose(f) != 0 || rename(tmp, path) != 0)
		fatal("could not write \"%s\": %s", path, strerror(errno));
}

/* Run a statement (simple protocol) that must end in want; the result is the caller's. */
PGresult *
exec_ok(PGconn *conn, const char *sql, ExecStatusType want)
{
	PGresult   *res = PQexec(conn, sql);

	if (PQresultStatus(res) != want)
		fatal("\"%s\" failed: %s", sql, PQerrorMessage(conn));
	return res;
}

/* Run a statement with text parameters that must end in want; the result is the caller's. */
PGresult *
exec_params(PGconn *conn, const char *sql, int n, const char *const *params, ExecStatusType want)
{
	PGresult   *res = PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);

	if (PQresultStatus(res) != want)
		fatal("\"%s\" failed: %s", sql, PQerrorMessage(conn));
	return res;
}

/* The benchmark's producer (see the file header); says its settings on stderr. */
rd_kafka_t *
make_producer(const char *brokers, const char *client_id, const ToolList *extra,
			  void (*dr_cb) (rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque))
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char		errstr[512];
	char		linger[64];
	size_t		sz = sizeof(linger);
	rd_kafka_t *rk;

	conf_set(conf, "bootstrap.servers", brokers);
	conf_set(conf, "client.id", client_id);
	conf_set(conf, "enable.idempotence", "true");
	conf_set(conf, "partitioner", "murmur2_random");
	conf_set_extra(conf, extra);
	if (rd_kafka_conf_get(conf, "linger.ms", linger, &sz) != RD_KAFKA_CONF_OK)
		strcpy(linger, "?");
	fprintf(stderr, "%s: %s, librdkafka %s, enable.idempotence=true partitioner=murmur2_random linger.ms=%s\n",
			program_invocation_short_name, client_id, rd_kafka_version_str(), linger);
	rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		fatal("could not create producer: %s", errstr);
	return rk;
}

/*
 * Parse an inbox baseline's command line: the options both share into o
 * (--max-seconds defaults to 600), then the tool's own in more (a table
 * ended by a NULL name); die with the usage if a required one is missing.
 */
void
parse_inbox_options(int argc, char **argv, InboxOptions *o, const ToolOpt *more)
{
	const ToolOpt common[] = {
		{"--dsn", OPT_STRING, &o->dsn, 0, 0},
		{"--brokers", OPT_STRING, &o->brokers, 0, 0},
		{"--topic", OPT_STRING, &o->topic, 0, 0},
		{"--group", OPT_STRING, &o->group, 0, 0},
		{"--events", OPT_LONG, &o->events, 1, 1L << 40},
		{"--max-seconds", OPT_DOUBLE, &o->max_seconds, 0, 86400},
	};
	const int	ncommon = sizeof(common) / sizeof(common[0]);
	int			nmore = 0;
	ToolOpt    *opts;

	while (more[nmore].name != NULL)
		nmore++;
	opts = calloc((size_t) (ncommon + nmore + 1), sizeof(ToolOpt));
	if (opts == NULL)
		fatal("out of memory");
	memcpy(opts, common, sizeof(common));
	memcpy(opts + ncommon, more, (size_t) nmore * sizeof(ToolOpt));
	memset(o, 0, sizeof(*o));
	o->max_seconds = 600;
	parse_options(argc, argv, 1, opts, NULL);
	free(opts);
	if (!o->dsn || !o->brokers || !o->topic || !o->group || o->events <= 0)
		fatal("usage: %s --dsn DSN --brokers LIST --topic T --group G --events N",
			  program_invocation_short_name);
}

/* Connect to dsn or die. */
PGconn *
connect_db(const char *dsn)
{
	PGconn	   *conn = PQconnectdb(dsn);

	if (PQstatus(conn) != CONNECTION_OK)
		fatal("could not connect: %s", PQerrorMessage(conn));
	return conn;
}

/*
 * The inbox baselines' consumer: a high-level consumer of group on
 * brokers, with settings (NULL-ended name, value pairs) and an optional
 * rebalance callback, subscribed to topic.
 */
rd_kafka_t *
subscribe_consumer(const char *brokers, const char *group, const char *topic,
				   const char *const *settings,
				   void (*rebalance_cb) (rd_kafka_t *rk, rd_kafka_resp_err_t err,
										 rd_kafka_topic_partition_list_t *parts,
										 void *opaque))
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_topic_partition_list_t *tl;
	char		errstr[512];
	rd_kafka_t *rk;

	conf_set(conf, "bootstrap.servers", brokers);
	conf_set(conf, "group.id", group);
	for (int i = 0; settings[i] != NULL; i += 2)
		conf_set(conf, settings[i], settings[i + 1]);
	if (rebalance_cb != NULL)
		rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		fatal("could not create consumer: %s", errstr);
	rd_kafka_poll_set_consumer(rk);
	tl = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(tl, topic, RD_KAFKA_PARTITION_UA);
	if (rd_kafka_subscribe(rk, tl))
		fatal("could not subscribe to \"%s\"", topic);
	rd_kafka_topic_partition_list_destroy(tl);
	return rk;
}
