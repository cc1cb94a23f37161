/*-------------------------------------------------------------------------
 *
 * relay.c
 *		Baselines for the outbox benchmarks (test/bench/run.sh): the classic
 *		polling outbox relay, and a raw librdkafka producer (the limit).
 *
 *	relay [relay] --dsn DSN --brokers LIST [--table relay_outbox]
 *		[--batch 100] [--poll-ms 100] [--until-empty] [--max-seconds S]
 *		[--status-file F]
 *		[--delivery-timeout-ms 30000] [-X prop=val ...]
 *
 *		The hand-written relay every team writes, over a plain table
 *
 *		  relay_outbox(id bigserial PRIMARY KEY, aggregate_id text,
 *		               aggregate_version bigint, topic text, headers jsonb,
 *		               payload jsonb, created_at timestamptz
 *		               DEFAULT clock_timestamp(), published_at timestamptz)
 *		  + a partial index on (id) WHERE published_at IS NULL
 *
 *		One loop iteration is one transaction:
 *
 *		  BEGIN;
 *		  SELECT ... WHERE published_at IS NULL ORDER BY id LIMIT <batch>
 *		    FOR UPDATE SKIP LOCKED;
 *		  produce every row (key = aggregate_id, value = payload, headers =
 *		    the string members of headers, then aggregate_id and
 *		    aggregate_version -- with event_id, event_type and
 *		    aggregate_type stored in headers that is the extension's set);
 *		  one wait for all acknowledgements: rd_kafka_flush(), which polls
 *		    in steps of at most 10 ms, returning as soon as the last
 *		    delivery report has been served, and makes linger.ms count as
 *		    elapsed for the messages already queued;
 *		  UPDATE ... SET published_at = clock_timestamp()
 *		    WHERE id = ANY(<acknowledged ids>);
 *		  COMMIT;
 *
 *		An empty fetch sleeps --poll-ms (the idle poll interval); a
 *		non-empty one loops at once.  published_at is clock_timestamp(),
 *		taken right after the acknowledgements, not now() (which would be
 *		the transaction's start, before the SELECT, and would make the
 *		measured latency look better than it is).  Run one relay per table:
 *		two would keep per-aggregate order only by luck.
 *
 *		--until-empty: exit at the first empty fetch after a non-empty one.
 *		--status-file F: after every batch's COMMIT, rewrite F with the
 *		events marked since the start ("settled=N last_settle=EPOCH ...",
 *		write_status_file() of bench_kafka.c), what drain_wait --status-file
 *		polls: the end of a drain is known without querying the table.
 *		At exit (also on SIGTERM/SIGINT, after the current batch) it prints
 *		one line of totals (events, batches, time in each phase); SIGUSR1
 *		starts the totals afresh (run.sh sends it after a warm-up event).
 *
 *	relay raw --brokers LIST --topic T --events N [--aggregates A] [-X ...]
 *
 *		N messages of the benchmark's shape (key "order-<i mod A>", the five
 *		headers, the same payload text the SQL side stores), built in memory
 *		first; after a warm-up message (metadata, connections, producer id),
 *		produce them all and wait for every acknowledgement with
 *		rd_kafka_flush().  Prints events/s.
 *
 *	Producer settings (both modes, make_producer() of bench_kafka.c):
 *	librdkafka defaults plus enable.idempotence=true and
 *	partitioner=murmur2_random (what the extension also uses; it
 *	additionally sets linger.ms=2 and message.timeout.ms=0), client.id;
 *	-X overrides.
 *
 * test/bench/relay.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <endian.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_kafka.h"

/* The payload the SQL side stores, as jsonb renders it (keys by length). */
#define PAYLOAD_FMT "{\"seq\": %ld, \"note\": \"benchmark payload of about a hundred bytes\", \"amount\": 10, \"currency\": \"EUR\"}"

static volatile sig_atomic_t stop_requested = 0;
static volatile sig_atomic_t reset_requested = 0;

/* --status-file: where the relay reports its progress, and that progress */
static const char *status_file = NULL;
static long total_marked = 0;

static void
on_signal(int sig)
{
	if (sig == SIGUSR1)
		reset_requested = 1;
	else
		stop_requested = 1;
}

static void
sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	/* a signal interrupts the sleep; stop_requested is checked after */
	nanosleep(&ts, NULL);
}

/* ---- producer ---------------------------------------------------------- */

/* Per-batch delivery bookkeeping; reports of an older batch are ignored. */
typedef struct Delivery
{
	uint32_t	generation;
	int			n;
	int			outstanding;
	bool	   *ok;
	long		failures;
} Delivery;

static Delivery delivery;

static void *
make_opaque(uint32_t generation, int index)
{
	return (void *) (uintptr_t) (((uint64_t) generation << 32) | (uint32_t) index);
}

static void
dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	uint64_t	tag = (uint64_t) (uintptr_t) m->_private;
	uint32_t	generation = (uint32_t) (tag >> 32);
	int			index = (int) (uint32_t) tag;

	(void) rk;
	(void) opaque;
	if (generation != delivery.generation || index < 0 || index >= delivery.n)
		return;
	delivery.outstanding--;
	if (m->err)
	{
		if (delivery.failures++ < 10)
			fprintf(stderr, "relay: delivery failed: %s\n", rd_kafka_err2str(m->err));
		return;
	}
	delivery.ok[index] = true;
}

/* Wait for every outstanding message; false on timeout. */
static bool
flush_all(rd_kafka_t *rk, long timeout_ms)
{
	double		deadline = now_s() + timeout_ms / 1000.0;

	while (delivery.outstanding > 0 || rd_kafka_outq_len(rk) > 0)
	{
		double		left = deadline - now_s();

		if (left <= 0)
			return false;
		rd_kafka_flush(rk, left > 1.0 ? 1000 : (int) (left * 1000) + 1);
	}
	return true;
}

/* ---- binary result decoding ------------------------------------------- */

static int64_t
get_int8(const PGresult *res, int row, int col)
{
	uint64_t	v;

	if (PQgetlength(res, row, col) != 8)
		fatal("unexpected int8 length in column %d", col);
	memcpy(&v, PQgetvalue(res, row, col), 8);
	return (int64_t) be64toh(v);
}

static uint32_t
read_u32(const char **p)
{
	uint32_t	v;

	memcpy(&v, *p, 4);
	*p += 4;
	return be32toh(v);
}

/*
 * Add the headers of a binary text[] of alternating keys and values
 * (NULL for an empty or NULL headers object).  JSON null values are
 * skipped, as the extension skips non-string values.
 */
static void
add_array_headers(rd_kafka_headers_t *hdrs, const PGresult *res, int row, int col)
{
	const char *p;
	uint32_t	ndim;
	int32_t		nelems = 1;

	if (PQgetisnull(res, row, col))
		return;
	p = PQgetvalue(res, row, col);
	ndim = read_u32(&p);
	(void) read_u32(&p);		/* has-nulls flag */
	(void) read_u32(&p);		/* element type */
	if (ndim == 0)
		return;
	if (ndim != 1)
		fatal("headers: unexpected %u-dimensional array", ndim);
	nelems = (int32_t) read_u32(&p);
	(void) read_u32(&p);		/* lower bound */
	for (int i = 0; i + 1 < nelems; i += 2)
	{
		int32_t		klen = (int32_t) read_u32(&p);
		const char *k = p;
		int32_t		vlen;
		const char *v;

		if (klen < 0)
			fatal("headers: NULL key");
		p += klen;
		vlen = (int32_t) read_u32(&p);
		v = p;
		if (vlen >= 0)
		{
			p += vlen;
			rd_kafka_header_add(hdrs, k, klen, v, vlen);
		}
	}
}

/* ---- relay ------------------------------------------------------------- */

/* Count events marked by a committed batch into the status file, if any. */
static void
report_marked(int n)
{
	struct timespec ts;

	total_marked += n;
	if (status_file == NULL)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	write_status_file(status_file, total_marked,
					  (double) ts.tv_sec + (double) ts.tv_nsec / 1e9, total_marked, 0);
}

static int
run_relay(const char *dsn, const char *brokers, const char *table, int batch,
		  long poll_ms, bool until_empty, long max_seconds,
		  long delivery_timeout_ms, const ToolList *extra)
{
	PGconn	   *conn = PQconnectdb(dsn);
	rd_kafka_t *rk;
	char		sql[2048];
	char	   *ids;
	size_t		ids_cap;
	bool		seen_any = false;
	double		started = now_s();
	double		first_batch = 0,
				last_commit = 0;
	double		t_fetch = 0,
				t_produce = 0,
				t_ack = 0,
				t_mark = 0;
	long		nevents = 0,
				nbatches = 0,
				nempty = 0,
				ntimeouts = 0;

	if (PQstatus(conn) != CONNECTION_OK)
		fatal("could not connect: %s", PQerrorMessage(conn));
	PQclear(exec_ok(conn, "SET application_name = 'outbox-bench-relay'", PGRES_COMMAND_OK));

	snprintf(sql, sizeof(sql),
			 "SELECT r.id, r.aggregate_id, r.aggregate_version, r.topic, "
			 "(SELECT array_agg(x.v ORDER BY e.o, x.n) "
			 " FROM jsonb_each_text(r.headers) WITH ORDINALITY AS e(k, val, o) "
			 " CROSS JOIN LATERAL (VALUES (1, e.k), (2, e.val)) AS x(n, v)), "
			 "r.payload::text "
			 "FROM %s r WHERE r.published_at IS NULL "
			 "ORDER BY r.id LIMIT $1 FOR UPDATE SKIP LOCKED", table);
	PQclear(PQprepare(conn, "fetch", sql, 1, NULL));
	snprintf(sql, sizeof(sql),
			 "UPDATE %s SET published_at = clock_timestamp() "
			 "WHERE id = ANY($1::bigint[])", table);
	{
		PGresult   *res = PQprepare(conn, "mark", sql, 1, NULL);

		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			fatal("prepare failed: %s", PQerrorMessage(conn));
		PQclear(res);
	}

	rk = make_producer(brokers, "outbox-bench-relay", extra, dr_cb);
	report_marked(0);
	delivery.ok = calloc((size_t) batch, sizeof(bool));
	ids_cap = (size_t) batch * 24 + 16;
	ids = malloc(ids_cap);

	while (!stop_requested)
	{
		char		limit[16];
		const char *params[1] = {limit};
		PGresult   *res;
		int			n;
		double		t0,
					t1,
					t2,
					t3,
					t4;
		size_t		len;
		int			nok = 0;

		if (reset_requested)
		{
			/* SIGUSR1: start the totals afresh (after a warm-up) */
			reset_requested = 0;
			seen_any = false;
			first_batch = last_commit = 0;
			t_fetch = t_produce = t_ack = t_mark = 0;
			nevents = nbatches = nempty = ntimeouts = 0;
		}
		if (max_seconds > 0 && now_s() - started > max_seconds)
		{
			fprintf(stderr, "relay: --max-seconds reached\n");
			break;
		}
		t0 = now_s();
		PQclear(exec_ok(conn, "BEGIN", PGRES_COMMAND_OK));
		snprintf(limit, sizeof(limit), "%d", batch);
		res = PQexecPrepared(conn, "fetch", 1, params, NULL, NULL, 1);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			fatal("fetch failed: %s", PQerrorMessage(conn));
		n = PQntuples(res);
		if (n == 0)
		{
			PQclear(res);
			PQclear(exec_ok(conn, "COMMIT", PGRES_COMMAND_OK));
			nempty++;
			if (until_empty && seen_any)
				break;
			sleep_ms(poll_ms);
			rd_kafka_poll(rk, 0);
			continue;
		}
		if (!seen_any)
			first_batch = t0;
		seen_any = true;
		t1 = now_s();

		delivery.generation++;
		delivery.n = n;
		delivery.outstanding = 0;
		memset(delivery.ok, 0, sizeof(bool) * (size_t) n);
		for (int i = 0; i < n; i++)
		{
			const char *agg = PQgetvalue(res, i, 1);
			int			agglen = PQgetlength(res, i, 1);
			char		version[32];
			bool		tombstone = PQgetisnull(res, i, 5);

			snprintf(version, sizeof(version), "%" PRId64, get_int8(res, i, 2));
			for (;;)
			{
				rd_kafka_headers_t *hdrs = rd_kafka_headers_new(8);
				rd_kafka_resp_err_t err;

				add_array_headers(hdrs, res, i, 4);
				rd_kafka_header_add(hdrs, "aggregate_id", -1, agg, agglen);
				rd_kafka_header_add(hdrs, "aggregate_version", -1, version, -1);
				err = rd_kafka_producev(rk,
										RD_KAFKA_V_TOPIC(PQgetvalue(res, i, 3)),
										RD_KAFKA_V_KEY(agg, (size_t) agglen),
										RD_KAFKA_V_VALUE(tombstone ? NULL : PQgetvalue(res, i, 5),
														 tombstone ? 0 : (size_t) PQgetlength(res, i, 5)),
										RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
										RD_KAFKA_V_HEADERS(hdrs),
										RD_KAFKA_V_OPAQUE(make_opaque(delivery.generation, i)),
										RD_KAFKA_V_END);
				if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
				{
					delivery.outstanding++;
					break;
				}
				rd_kafka_headers_destroy(hdrs);
				if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
					fatal("produce failed: %s", rd_kafka_err2str(err));
				rd_kafka_poll(rk, 10);
			}
		}
		t2 = now_s();
		if (!flush_all(rk, delivery_timeout_ms))
			ntimeouts++;		/* mark what was acknowledged; the rest is re-sent */
		t3 = now_s();

		len = 0;
		ids[len++] = '{';
		for (int i = 0; i < n; i++)
		{
			if (!delivery.ok[i])
				continue;
			len += (size_t) snprintf(ids + len, ids_cap - len, "%s%" PRId64,
									 nok ? "," : "", get_int8(res, i, 0));
			nok++;
		}
		ids[len++] = '}';
		ids[len] = '\0';
		PQclear(res);
		{
			const char *mparams[1] = {ids};

			res = PQexecPrepared(conn, "mark", 1, mparams, NULL, NULL, 0);
			if (PQresultStatus(res) != PGRES_COMMAND_OK)
				fatal("mark failed: %s", PQerrorMessage(conn));
			PQclear(res);
		}
		PQclear(exec_ok(conn, "COMMIT", PGRES_COMMAND_OK));
		t4 = now_s();
		last_commit = t4;
		report_marked(nok);

		nevents += nok;
		nbatches++;
		t_fetch += t1 - t0;
		t_produce += t2 - t1;
		t_ack += t3 - t2;
		t_mark += t4 - t3;
	}

	{
		double		span = last_commit > first_batch ? last_commit - first_batch : 0;

		printf("relay: events=%ld batches=%ld empty_polls=%ld timeouts=%ld "
			   "busy_s=%.3f events_per_s=%.0f "
			   "avg_ms fetch=%.2f produce=%.2f ack=%.2f mark_commit=%.2f\n",
			   nevents, nbatches, nempty, ntimeouts, span,
			   span > 0 ? nevents / span : 0,
			   nbatches ? 1000 * t_fetch / nbatches : 0,
			   nbatches ? 1000 * t_produce / nbatches : 0,
			   nbatches ? 1000 * t_ack / nbatches : 0,
			   nbatches ? 1000 * t_mark / nbatches : 0);
		fflush(stdout);
	}
	flush_all(rk, 5000);
	rd_kafka_destroy(rk);
	PQfinish(conn);
	return delivery.failures ? 1 : 0;
}

/* ---- raw producer ----------------------------------------------------- */

typedef struct RawMsg
{
	char		key[32];
	char		version[24];
	char		event_id[40];
	char		payload[160];
} RawMsg;

static int
run_raw(const char *brokers, const char *topic, long nevents, long naggs,
		const ToolList *extra)
{
	RawMsg	   *msgs = calloc((size_t) nevents, sizeof(RawMsg));
	rd_kafka_t *rk;
	double		t0,
				t1;

	if (msgs == NULL)
		fatal("out of memory");
	/* built beforehand: only producing and acknowledging is timed */
	for (long i = 0; i < nevents; i++)
	{
		RawMsg	   *m = &msgs[i];

		snprintf(m->key, sizeof(m->key), "order-%ld", i % naggs);
		snprintf(m->version, sizeof(m->version), "%ld", i / naggs + 1);
		snprintf(m->event_id, sizeof(m->event_id), "%08lx-%04lx-7%03lx-8%03lx-%012lx",
				 (unsigned long) time(NULL), (i >> 24) & 0xffff, (i >> 12) & 0xfff,
				 (unsigned long) (i & 0xfff), (unsigned long) i);
		snprintf(m->payload, sizeof(m->payload), PAYLOAD_FMT, i);
	}

	rk = make_producer(brokers, "outbox-bench-raw", extra, dr_cb);

	/* warm-up: metadata, broker connections, idempotent producer id */
	delivery.generation = 1;
	delivery.n = 0;
	if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY("warmup", 6),
						  RD_KAFKA_V_VALUE("{}", 2), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
						  RD_KAFKA_V_END) != RD_KAFKA_RESP_ERR_NO_ERROR)
		fatal("warm-up produce failed");
	if (rd_kafka_flush(rk, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR)
		fatal("warm-up message not acknowledged within 30 s");

	delivery.generation = 2;
	delivery.n = (int) nevents;
	delivery.ok = calloc((size_t) nevents, sizeof(bool));
	delivery.outstanding = 0;
	t0 = now_s();
	for (long i = 0; i < nevents; i++)
	{
		RawMsg	   *m = &msgs[i];
		size_t		klen = strlen(m->key);
		rd_kafka_resp_err_t err;

		for (;;)
		{
			err = rd_kafka_producev(rk,
									RD_KAFKA_V_TOPIC(topic),
									RD_KAFKA_V_KEY(m->key, klen),
									RD_KAFKA_V_VALUE(m->payload, strlen(m->payload)),
									RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
									RD_KAFKA_V_HEADER("event_id", m->event_id, -1),
									RD_KAFKA_V_HEADER("event_type", "OrderPaid", -1),
									RD_KAFKA_V_HEADER("aggregate_type", "order", -1),
									RD_KAFKA_V_HEADER("aggregate_id", m->key, (ssize_t) klen),
									RD_KAFKA_V_HEADER("aggregate_version", m->version, -1),
									RD_KAFKA_V_OPAQUE(make_opaque(delivery.generation, (int) i)),
									RD_KAFKA_V_END);
			if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
				break;
			rd_kafka_poll(rk, 10);
		}
		if (err)
			fatal("produce failed: %s", rd_kafka_err2str(err));
		delivery.outstanding++;
	}
	if (!flush_all(rk, 300000))
		fatal("timed out waiting for acknowledgements");
	t1 = now_s();
	printf("raw: events=%ld aggregates=%ld seconds=%.3f events_per_s=%.0f failures=%ld\n",
		   nevents, naggs, t1 - t0, nevents / (t1 - t0), delivery.failures);
	rd_kafka_destroy(rk);
	return delivery.failures ? 1 : 0;
}

/* ---- main -------------------------------------------------------------- */

static void
usage(FILE *out)
{
	fprintf(out,
			"Usage: relay [relay] --dsn DSN --brokers LIST [--table relay_outbox] [--batch 100]\n"
			"             [--poll-ms 100] [--until-empty] [--max-seconds S] [--status-file F]\n"
			"             [--delivery-timeout-ms 30000] [-X PROP=VAL ...]\n"
			"       relay raw --brokers LIST --topic T --events N [--aggregates A] [-X PROP=VAL ...]\n");
}

int
main(int argc, char **argv)
{
	const char *dsn = NULL,
			   *brokers = NULL,
			   *topic = NULL,
			   *table = "relay_outbox";
	ToolList	extra = {0};
	long		batch = 100,
				poll_ms = 100,
				max_seconds = 0,
				delivery_timeout_ms = 30000,
				nevents = 0,
				naggs = 10000;
	bool		until_empty = false,
				raw = false;
	int			first = 1;
	const ToolOpt opts[] = {
		{"--dsn", OPT_STRING, &dsn, 0, 0},
		{"--brokers", OPT_STRING, &brokers, 0, 0},
		{"--table", OPT_STRING, &table, 0, 0},
		{"--status-file", OPT_STRING, &status_file, 0, 0},
		{"--topic", OPT_STRING, &topic, 0, 0},
		{"--until-empty", OPT_FLAG, &until_empty, 0, 0},
		{"--batch", OPT_LONG, &batch, 1, 1000000},
		{"--poll-ms", OPT_LONG, &poll_ms, 0, 3600000},
		{"--max-seconds", OPT_LONG, &max_seconds, 0, 86400},
		{"--delivery-timeout-ms", OPT_LONG, &delivery_timeout_ms, 1, 3600000},
		{"--events", OPT_LONG, &nevents, 1, 100000000},
		{"--aggregates", OPT_LONG, &naggs, 1, 100000000},
		{"-X", OPT_LIST, &extra, 0, 0},
		{NULL, OPT_FLAG, NULL, 0, 0}
	};

	if (argc > 1 && strcmp(argv[1], "raw") == 0)
		raw = true, first = 2;
	else if (argc > 1 && strcmp(argv[1], "relay") == 0)
		first = 2;
	parse_options(argc, argv, first, opts, usage);

	signal(SIGTERM, on_signal);
	signal(SIGUSR1, on_signal);
	signal(SIGINT, on_signal);
	if (raw)
	{
		if (brokers == NULL || topic == NULL || nevents == 0)
			fatal("raw needs --brokers, --topic and --events (try --help)");
		return run_raw(brokers, topic, nevents, naggs, &extra);
	}
	if (dsn == NULL || brokers == NULL)
		fatal("--dsn and --brokers are required (try --help)");
	return run_relay(dsn, brokers, table, (int) batch, poll_ms, until_empty, max_seconds,
					 delivery_timeout_ms, &extra);
}
