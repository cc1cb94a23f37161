/*-------------------------------------------------------------------------
 *
 * bench_kafka.c
 *		Helpers shared by the benchmark tools: dying with a message, a clock,
 *		option parsing, checked libpq statements, and the one producer set-up
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

/* Print "<program>: <message>" and exit with status 1. */
void
fatal(const char *fmt,...)
{
	va_list		ap;

	fprintf(stderr, "%s: ", program_invocation_short_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

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

/* Parse a decimal option value within [min, max], or die naming the option. */
long
parse_long(const char *opt, const char *val, long min, long max)
{
	char	   *end;
	long		n;

	errno = 0;
	n = strtol(val, &end, 10);
	if (errno || end == val || *end || n < min || n > max)
		fatal("invalid %s \"%s\"", opt, val);
	return n;
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

/* Set one librdkafka property or die. */
void
conf_set(rd_kafka_conf_t *conf, const char *prop, const char *val)
{
	char		errstr[512];

	if (rd_kafka_conf_set(conf, prop, val, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
		fatal("%s", errstr);
}

/* The benchmark's producer (see the file header); says its settings on stderr. */
rd_kafka_t *
make_producer(const char *brokers, const char *client_id, const char **extra, int nextra,
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
	for (int i = 0; i < nextra; i++)
	{
		char	   *prop = strdup(extra[i]);
		char	   *eq = prop ? strchr(prop, '=') : NULL;

		if (eq == NULL)
			fatal("-X wants PROP=VAL, got \"%s\"", extra[i]);
		*eq = '\0';
		conf_set(conf, prop, eq + 1);
		free(prop);
	}
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
