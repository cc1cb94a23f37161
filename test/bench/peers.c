/*-------------------------------------------------------------------------
 *
 * peers.c
 *		The publishers a user would pick instead of the extension, written
 *		for the benchmark suite (test/bench/run.sh, section p), with the same
 *		librdkafka producer as relay.c (make_producer() of bench_kafka.c:
 *		defaults plus enable.idempotence=true, hence acks=all, and
 *		partitioner=murmur2_random, client.id, -X overrides); key =
 *		aggregate_id, value = payload, headers event_id, event_type,
 *		aggregate_type, aggregate_id, aggregate_version.
 *
 *	peers pgq --dsn DSN --brokers LIST --topic T --queue Q [--consumer C]
 *		[--poll-ms 10] [common options]
 *
 *		A PgQ consumer (Debian's postgresql-15-pgq3).  Events are inserted
 *		with pgq.insert_event(Q, event_type, payload, aggregate_id,
 *		aggregate_version, event_id, created_at in epoch microseconds).  The
 *		relay is also the queue's ticker (what pgqd would do): every loop
 *
 *		  SELECT pgq.ticker(Q);               -- a tick if events are new
 *		  SELECT pgq.next_batch(Q, C);        -- NULL: sleep --poll-ms
 *		  SELECT ... FROM pgq.get_batch_events(batch_id);
 *		  produce every event; rd_kafka_flush() until all are acknowledged;
 *		  SELECT pgq.finish_batch(batch_id);
 *
 *		each statement its own transaction.  run.sh sets the queue's
 *		ticker_max_lag to 0 (pgq.set_queue_config), so a tick is made
 *		whenever new events exist (PgQ's default waits for 500 events or
 *		3 s).  PgQ lets one
 *		consumer hold one batch at a time, so this is stop-and-wait per batch.
 *
 *	peers logical --dsn DSN --brokers LIST --slot S --publication P
 *		[--messages] [common options]
 *
 *		Debezium's architecture: a logical replication slot with pgoutput,
 *		streamed over the replication protocol (START_REPLICATION, protocol
 *		version 1, publication P).  By default it publishes the INSERTs into
 *		a plain outbox table (columns aggregate_id, aggregate_version,
 *		topic, event_id, event_type, aggregate_type, payload, created_at);
 *		with --messages, transactional pg_logical_emit_message(true,
 *		'outbox', content) records whose content is the newline-separated
 *		topic, aggregate_id, aggregate_version, event_id, event_type,
 *		aggregate_type, created_at (epoch microseconds), payload.  Produces
 *		as it reads (no wait per transaction); the slot's flush position
 *		is confirmed only up to the end of the last transaction whose
 *		messages, and those of every earlier one, Kafka has acknowledged
 *		(standby status update at most every 5 ms, or when nothing is in
 *		flight, or when the server asks).  SIGUSR2 pauses (settles what is in
 *		flight, closes the connection: no walsender decodes meanwhile) and
 *		resumes (connects, START_REPLICATION from the confirmed position);
 *		the status file says paused=1 while paused.
 *
 *	Common options: --status-file F (rewritten after every settle: "settled=N
 *	last_settle=EPOCH acked=N", what drain_wait --status-file polls),
 *	--latency-file F (at exit, one line per acknowledged event: ms from
 *	its created_at to its delivery report), --max-seconds S, -X prop=val.
 *	SIGUSR1 starts the totals and latencies afresh (after a warm-up event;
 *	the settled count of the status file keeps counting);
 *	SIGTERM/SIGINT stops after the current batch, waits for outstanding
 *	acknowledgements, settles them and prints one line of totals.  A failed
 *	delivery ends the process with status 1: nothing is settled past it,
 *	so a restart re-sends (as either tool would).
 *
 * test/bench/peers.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include "bench_kafka.h"

/* microseconds between the Unix epoch and PostgreSQL's (2000-01-01) */
#define PG_EPOCH_OFFSET_US	INT64_C(946684800000000)

static volatile sig_atomic_t stop_requested = 0;
static volatile sig_atomic_t reset_requested = 0;
static volatile sig_atomic_t pause_toggled = 0;
static bool paused = false;

/* Settings shared by both modes. */
static const char *status_file;
static const char *latency_file;
static long max_seconds;

/* Totals since the last reset. */
static long n_produced,
			n_acked,
			n_settled,
			n_batches;
static double last_settle;		/* epoch seconds */
static double *latencies;		/* ms, per acknowledged event */
static size_t n_lat,
			cap_lat;

/* SIGUSR1 resets the totals; SIGUSR2 pauses or resumes; SIGTERM/SIGINT stop. */
static void
on_signal(int sig)
{
	if (sig == SIGUSR1)
		reset_requested = 1;
	else if (sig == SIGUSR2)
		pause_toggled = 1;
	else
		stop_requested = 1;
}

/* Wall-clock microseconds since the Unix epoch (PostgreSQL's clock too). */
static int64_t
wall_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/*
 * Apply a pending SIGUSR1: totals and latencies start afresh.  The settled
 * count stays monotonic: drain_wait reads it before a preload and waits for
 * that plus the events.
 */
static void
maybe_reset(void)
{
	if (!reset_requested)
		return;
	reset_requested = 0;
	n_produced = n_acked = n_batches = 0;
	n_lat = 0;
}

/* Rewrite the status file (see write_status_file), if there is one. */
static void
write_status(void)
{
	if (status_file != NULL)
		write_status_file(status_file, n_settled, last_settle, n_acked, paused ? 1 : 0);
}

/* Count events settled just now (a finished batch, a confirmed LSN). */
static void
settled(long n)
{
	if (n <= 0)
		return;
	n_settled += n;
	last_settle = (double) wall_us() / 1e6;
	write_status();
}

/* Write the per-event latencies (ms), one a line. */
static void
write_latencies(void)
{
	FILE	   *f;

	if (latency_file == NULL)
		return;
	f = fopen(latency_file, "w");
	if (f == NULL)
		fatal("could not write \"%s\": %s", latency_file, strerror(errno));
	for (size_t i = 0; i < n_lat; i++)
		fprintf(f, "%.3f\n", latencies[i]);
	if (fclose(f) != 0)
		fatal("could not write \"%s\": %s", latency_file, strerror(errno));
}

/* ---- producer ---------------------------------------------------------- */

/* What a delivery report needs: the event's creation time, its transaction. */
typedef struct Msg
{
	int64_t		created_us;
	long		txn;			/* logical mode: sequence number of its transaction */
} Msg;

/* logical mode: transactions read, in commit order, in a ring */
typedef struct Txn
{
	uint64_t	end_lsn;
	long		outstanding;
	long		events;
	bool		committed;
} Txn;

#define TXN_RING	65536
static Txn *txns;
static long txn_head,			/* oldest transaction not yet settled */
			txn_tail;			/* next free sequence number */

static long outstanding;		/* messages awaiting their delivery report */

/* Delivery report: count the ack, its latency, its transaction. */
static void
dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	Msg		   *msg = (Msg *) m->_private;

	(void) rk;
	(void) opaque;
	if (msg == NULL)
		return;					/* not ours: every message produce() sends has one */
	outstanding--;
	if (m->err)
		fatal("delivery failed: %s (exiting unsettled: a restart re-sends)",
			  rd_kafka_err2str(m->err));
	n_acked++;
	if (msg->created_us > 0)
	{
		if (n_lat == cap_lat)
		{
			cap_lat = cap_lat ? cap_lat * 2 : 65536;
			latencies = realloc(latencies, cap_lat * sizeof(double));
			if (latencies == NULL)
				fatal("out of memory");
		}
		latencies[n_lat++] = (double) (wall_us() - msg->created_us) / 1000.0;
	}
	if (msg->txn >= 0)
		txns[msg->txn % TXN_RING].outstanding--;
	free(msg);
}

/* One event as the extension sends it (lengths: -1 = NUL-terminated). */
typedef struct Event
{
	const char *topic;
	const char *key;
	int			keylen;
	const char *version;
	int			versionlen;
	const char *event_id;
	int			event_idlen;
	const char *event_type;
	int			event_typelen;
	const char *aggregate_type;
	int			aggregate_typelen;
	const char *payload;		/* NULL: tombstone */
	int			payloadlen;
	int64_t		created_us;
} Event;

/* Produce one event; waits (serving reports) while the local queue is full. */
static void
produce(rd_kafka_t *rk, const Event *e, long txn)
{
	Msg		   *msg = malloc(sizeof(Msg));

	if (msg == NULL)
		fatal("out of memory");
	msg->created_us = e->created_us;
	msg->txn = txn;
	for (;;)
	{
		rd_kafka_headers_t *hdrs = rd_kafka_headers_new(5);
		rd_kafka_resp_err_t err;

		rd_kafka_header_add(hdrs, "event_id", -1, e->event_id, e->event_idlen);
		rd_kafka_header_add(hdrs, "event_type", -1, e->event_type, e->event_typelen);
		rd_kafka_header_add(hdrs, "aggregate_type", -1, e->aggregate_type, e->aggregate_typelen);
		rd_kafka_header_add(hdrs, "aggregate_id", -1, e->key, e->keylen);
		rd_kafka_header_add(hdrs, "aggregate_version", -1, e->version, e->versionlen);
		err = rd_kafka_producev(rk,
								RD_KAFKA_V_TOPIC(e->topic),
								RD_KAFKA_V_KEY(e->key, (size_t) e->keylen),
								RD_KAFKA_V_VALUE((void *) e->payload,
												 e->payload ? (size_t) e->payloadlen : 0),
								RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								RD_KAFKA_V_HEADERS(hdrs),
								RD_KAFKA_V_OPAQUE(msg),
								RD_KAFKA_V_END);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
			break;
		rd_kafka_headers_destroy(hdrs);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			fatal("produce failed: %s", rd_kafka_err2str(err));
		rd_kafka_poll(rk, 10);
	}
	outstanding++;
	n_produced++;
}

/* Wait for every outstanding delivery report (rd_kafka_flush, as relay.c). */
static void
flush_all(rd_kafka_t *rk)
{
	while (outstanding > 0 || rd_kafka_outq_len(rk) > 0)
		rd_kafka_flush(rk, 1000);
}

/* Print the totals line. */
static void
print_totals(const char *mode, double busy_s)
{
	printf("peers: mode=%s events=%ld acked=%ld settled=%ld batches=%ld busy_s=%.3f\n",
		   mode, n_produced, n_acked, n_settled, n_batches, busy_s);
	fflush(stdout);
}

/* ---- PgQ --------------------------------------------------------------- */

/* Parse a decimal epoch-microseconds field, 0 if absent. */
static int64_t
parse_us(const char *s, int len)
{
	int64_t		v = 0;

	for (int i = 0; i < len && s[i] >= '0' && s[i] <= '9'; i++)
		v = v * 10 + (s[i] - '0');
	return v;
}

/* Produce a fetched PgQ batch (text columns: type, data, extra1..4). */
static void
produce_pgq_batch(rd_kafka_t *rk, const char *topic, PGresult *res)
{
	for (int i = 0; i < PQntuples(res); i++)
	{
		Event		e = {0};

		e.topic = topic;
		e.event_type = PQgetvalue(res, i, 0);
		e.event_typelen = PQgetlength(res, i, 0);
		e.payload = PQgetisnull(res, i, 1) ? NULL : PQgetvalue(res, i, 1);
		e.payloadlen = PQgetlength(res, i, 1);
		e.key = PQgetvalue(res, i, 2);
		e.keylen = PQgetlength(res, i, 2);
		e.version = PQgetvalue(res, i, 3);
		e.versionlen = PQgetlength(res, i, 3);
		e.event_id = PQgetvalue(res, i, 4);
		e.event_idlen = PQgetlength(res, i, 4);
		e.aggregate_type = "order";
		e.aggregate_typelen = 5;
		e.created_us = parse_us(PQgetvalue(res, i, 5), PQgetlength(res, i, 5));
		produce(rk, &e, -1);
	}
}

/* The PgQ consumer loop: tick, next_batch, get events, produce, flush, finish. */
static int
run_pgq(const char *dsn, rd_kafka_t *rk, const char *topic, const char *queue,
		const char *consumer, long poll_ms)
{
	PGconn	   *conn = PQconnectdb(dsn);
	double		started = now_s(),
				busy = 0;
	const char *qparams[2] = {queue, consumer};

	if (PQstatus(conn) != CONNECTION_OK)
		fatal("could not connect: %s", PQerrorMessage(conn));
	PQclear(exec_params(conn, "SET application_name = 'outbox-bench-pgq'", 0, NULL, PGRES_COMMAND_OK));
	write_status();
	while (!stop_requested)
	{
		PGresult   *res;
		char		batch_id[32];
		const char *bparams[1] = {batch_id};
		double		t0;
		long		n;

		maybe_reset();
		if (max_seconds > 0 && now_s() - started > max_seconds)
			break;
		t0 = now_s();
		PQclear(exec_params(conn, "SELECT pgq.ticker($1)", 1, qparams, PGRES_TUPLES_OK));
		res = exec_params(conn, "SELECT pgq.next_batch($1, $2)", 2, qparams, PGRES_TUPLES_OK);
		if (PQgetisnull(res, 0, 0))
		{
			PQclear(res);
			rd_kafka_poll(rk, 0);
			usleep((useconds_t) poll_ms * 1000);
			continue;
		}
		snprintf(batch_id, sizeof(batch_id), "%s", PQgetvalue(res, 0, 0));
		PQclear(res);
		res = exec_params(conn,
						  "SELECT ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4 "
						  "FROM pgq.get_batch_events($1)", 1, bparams, PGRES_TUPLES_OK);
		n = PQntuples(res);
		produce_pgq_batch(rk, topic, res);
		PQclear(res);
		flush_all(rk);
		PQclear(exec_params(conn, "SELECT pgq.finish_batch($1)", 1, bparams, PGRES_TUPLES_OK));
		if (n > 0)
		{
			n_batches++;			/* empty ticks make empty batches: not counted */
			busy += now_s() - t0;
			settled(n);
		}
	}
	flush_all(rk);
	print_totals("pgq", busy);
	PQfinish(conn);
	return 0;
}

/* ---- logical decoding --------------------------------------------------- */

/* Columns of the outbox table, by their position in pgoutput's Relation. */
enum
{
	COL_AGG_ID, COL_VERSION, COL_TOPIC, COL_EVENT_ID, COL_EVENT_TYPE,
	COL_AGG_TYPE, COL_PAYLOAD, COL_CREATED, NCOLS
};
static const char *const col_names[NCOLS] = {
	"aggregate_id", "aggregate_version", "topic", "event_id", "event_type",
	"aggregate_type", "payload", "created_at"
};

typedef struct Reader
{
	const char *p;
	const char *end;
} Reader;

/* Take n bytes from the message or die. */
static const char *
take(Reader *r, size_t n)
{
	const char *p = r->p;

	if ((size_t) (r->end - r->p) < n)
		fatal("truncated pgoutput message");
	r->p += n;
	return p;
}

/* Big-endian integers and C strings of the replication protocol. */
static uint64_t
rd64(Reader *r)
{
	uint64_t	v;

	memcpy(&v, take(r, 8), 8);
	return be64toh(v);
}

static uint32_t
rd32(Reader *r)
{
	uint32_t	v;

	memcpy(&v, take(r, 4), 4);
	return be32toh(v);
}

static uint16_t
rd16(Reader *r)
{
	uint16_t	v;

	memcpy(&v, take(r, 2), 2);
	return be16toh(v);
}

static const char *
rdstr(Reader *r)
{
	const char *s = r->p;
	const char *nul = memchr(r->p, '\0', (size_t) (r->end - r->p));

	if (nul == NULL)
		fatal("unterminated string in pgoutput message");
	r->p = nul + 1;
	return s;
}

/* Parse "YYYY-MM-DD HH:MM:SS[.ffffff]+00" (TimeZone UTC) to epoch µs. */
static int64_t
parse_timestamptz(const char *s, int len)
{
	char		buf[64];
	struct tm	tm = {0};
	int			consumed = 0;
	int64_t		us = 0;
	const char *p;

	if (len <= 0 || len >= (int) sizeof(buf))
		return 0;
	memcpy(buf, s, (size_t) len);
	buf[len] = '\0';
	if (sscanf(buf, "%d-%d-%d %d:%d:%d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
			   &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &consumed) != 6)
		return 0;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	p = buf + consumed;
	if (*p == '.')
	{
		int			digits = 0;

		for (p++; *p >= '0' && *p <= '9'; p++, digits++)
			us = us * 10 + (*p - '0');
		for (; digits < 6; digits++)
			us *= 10;
	}
	return (int64_t) timegm(&tm) * 1000000 + us;
}

typedef struct Logical
{
	rd_kafka_t *rk;
	bool		messages;
	uint32_t	relid;			/* the outbox table's relation id, 0 unknown */
	int			colpos[NCOLS];
	long		cur;			/* sequence number of the open transaction, -1 */
	uint64_t	confirmed;		/* flush position to report */
	uint64_t	received;		/* highest WAL end seen */
} Logical;

/*
 * Produce, in the open transaction, the event whose fields stand at at[] in
 * val/len: topic, key, version, event_id, event_type, aggregate_type and
 * payload (NULL: tombstone), in that order, both pgoutput forms
 * (a row, a logical message) being the same fields in other places.
 */
static void
produce_fields(Logical *lg, const char *const *val, const int *len,
			   const int at[7], int64_t created_us)
{
	char		topic[256];
	Event		e = {0};

	if (len[at[0]] >= (int) sizeof(topic))
		fatal("topic too long");
	memcpy(topic, val[at[0]], (size_t) len[at[0]]);
	topic[len[at[0]]] = '\0';
	e.topic = topic;
	e.key = val[at[1]], e.keylen = len[at[1]];
	e.version = val[at[2]], e.versionlen = len[at[2]];
	e.event_id = val[at[3]], e.event_idlen = len[at[3]];
	e.event_type = val[at[4]], e.event_typelen = len[at[4]];
	e.aggregate_type = val[at[5]], e.aggregate_typelen = len[at[5]];
	e.payload = val[at[6]], e.payloadlen = len[at[6]];
	e.created_us = created_us;
	txns[lg->cur % TXN_RING].outstanding++;
	txns[lg->cur % TXN_RING].events++;
	produce(lg->rk, &e, lg->cur);
}

/* Relation message: remember where our columns are. */
static void
on_relation(Logical *lg, Reader *r)
{
	uint32_t	relid = rd32(r);
	int			natts;

	(void) rdstr(r);			/* namespace */
	(void) rdstr(r);			/* relation name: the publication has one table */
	(void) take(r, 1);			/* replica identity */
	natts = rd16(r);
	for (int c = 0; c < NCOLS; c++)
		lg->colpos[c] = -1;
	for (int i = 0; i < natts; i++)
	{
		const char *name;

		(void) take(r, 1);		/* flags */
		name = rdstr(r);
		(void) rd32(r);			/* type */
		(void) rd32(r);			/* typmod */
		for (int c = 0; c < NCOLS; c++)
			if (strcmp(name, col_names[c]) == 0)
				lg->colpos[c] = i;
	}
	for (int c = 0; c < NCOLS; c++)
		if (lg->colpos[c] < 0)
			fatal("published table has no column \"%s\"", col_names[c]);
	lg->relid = relid;
}

/* Insert message: produce the new row. */
static void
on_insert(Logical *lg, Reader *r)
{
	uint32_t	relid = rd32(r);
	const char *val[64];
	int			len[64];
	int			natts;

	if (relid != lg->relid || lg->cur < 0)
		fatal("insert into an unknown relation %u, or outside a transaction", relid);
	if (*take(r, 1) != 'N')
		fatal("insert without a new tuple");
	natts = rd16(r);
	if (natts > 64)
		fatal("too many columns");
	for (int i = 0; i < natts; i++)
	{
		char		kind = *take(r, 1);

		val[i] = NULL;
		len[i] = 0;
		if (kind == 't')
		{
			len[i] = (int) rd32(r);
			val[i] = take(r, (size_t) len[i]);
		}
		else if (kind != 'n')
			fatal("unexpected tuple column kind '%c'", kind);
	}
	{
		const int  *pos = lg->colpos;
		const int	at[7] = {pos[COL_TOPIC], pos[COL_AGG_ID], pos[COL_VERSION],
			pos[COL_EVENT_ID], pos[COL_EVENT_TYPE], pos[COL_AGG_TYPE], pos[COL_PAYLOAD]};

		for (int i = 1; i < 6; i++)
			if (val[at[i]] == NULL)
				fatal("outbox row with a NULL key column");
		produce_fields(lg, val, len, at,
					   parse_timestamptz(val[pos[COL_CREATED]], len[pos[COL_CREATED]]));
	}
}

/* Logical message: "topic\nkey\nversion\nid\ntype\naggtype\ncreated_us\npayload". */
static void
on_message(Logical *lg, Reader *r)
{
	uint8_t		flags = (uint8_t) *take(r, 1);
	const char *prefix;
	const char *content,
			   *f[8];
	int			flen[8];
	uint32_t	clen;
	const int	at[7] = {0, 1, 2, 3, 4, 5, 7};

	(void) rd64(r);				/* lsn */
	prefix = rdstr(r);
	clen = rd32(r);
	content = take(r, clen);
	if (!(flags & 1) || strcmp(prefix, "outbox") != 0)
		return;					/* not ours, or not transactional */
	if (lg->cur < 0)
		fatal("transactional message outside a transaction");
	for (int i = 0; i < 8; i++)
	{
		const char *end = content + clen;
		const char *nl = i < 7 ? memchr(content, '\n', (size_t) (end - content)) : NULL;

		if (i < 7 && nl == NULL)
			fatal("logical message with fewer than 8 fields");
		f[i] = content;
		flen[i] = (int) ((i < 7 ? nl : end) - content);
		content = i < 7 ? nl + 1 : end;
	}
	produce_fields(lg, f, flen, at, parse_us(f[6], flen[6]));
}

/* One pgoutput message of an XLogData record. */
static void
on_pgoutput(Logical *lg, Reader *r)
{
	char		kind = *take(r, 1);

	switch (kind)
	{
		case 'B':
			while (txn_tail - txn_head >= TXN_RING)
				rd_kafka_poll(lg->rk, 10);	/* ring full: wait for acks */
			lg->cur = txn_tail++;
			txns[lg->cur % TXN_RING] = (Txn) {0};
			break;
		case 'C':
			(void) take(r, 1);	/* flags */
			(void) rd64(r);		/* commit lsn */
			if (lg->cur < 0)
				fatal("commit outside a transaction");
			txns[lg->cur % TXN_RING].end_lsn = rd64(r);
			txns[lg->cur % TXN_RING].committed = true;
			lg->cur = -1;
			break;
		case 'R':
			on_relation(lg, r);
			break;
		case 'I':
			on_insert(lg, r);
			break;
		case 'M':
			on_message(lg, r);
			break;
		case 'O':
		case 'Y':
			break;				/* origin, type: nothing to do */
		default:
			fatal("unexpected pgoutput message '%c'", kind);
	}
}

/* Move past the acknowledged prefix of transactions; events it held. */
static long
advance(Logical *lg)
{
	long		n = 0;

	while (txn_head < txn_tail)
	{
		Txn		   *t = &txns[txn_head % TXN_RING];

		if (!t->committed || t->outstanding > 0)
			break;
		lg->confirmed = t->end_lsn;
		n += t->events;
		txn_head++;
	}
	return n;
}

/* Standby status update: written = flushed = applied = confirmed. */
static void
send_status(PGconn *conn, Logical *lg, bool reply)
{
	char		buf[1 + 8 * 4 + 1];
	char	   *p = buf;
	uint64_t	v;
	int64_t		now = wall_us() - PG_EPOCH_OFFSET_US;

	*p++ = 'r';
	for (int i = 0; i < 3; i++)
	{
		v = htobe64(lg->confirmed);
		memcpy(p, &v, 8);
		p += 8;
	}
	v = htobe64((uint64_t) now);
	memcpy(p, &v, 8);
	p += 8;
	*p++ = reply ? 1 : 0;
	if (PQputCopyData(conn, buf, (int) (p - buf)) <= 0 || PQflush(conn) != 0)
		fatal("could not send feedback: %s", PQerrorMessage(conn));
}

/* Handle one CopyData message of the replication stream. */
static void
on_copydata(PGconn *conn, Logical *lg, const char *buf, int len, bool *reply)
{
	Reader		r = {buf, buf + len};
	char		kind = *take(&r, 1);

	if (kind == 'w')
	{
		(void) rd64(&r);		/* start */
		lg->received = rd64(&r);
		(void) rd64(&r);		/* send time */
		on_pgoutput(lg, &r);
	}
	else if (kind == 'k')
	{
		(void) rd64(&r);		/* wal end */
		(void) rd64(&r);		/* send time */
		if (*take(&r, 1))
			*reply = true;
	}
	else
		fatal("unexpected replication message '%c'", kind);
	(void) conn;
}

/* START_REPLICATION from the slot's confirmed position. */
static void
start_replication(PGconn *conn, const char *slot, const char *publication, bool messages)
{
	char		sql[1024];
	PGresult   *res;

	snprintf(sql, sizeof(sql),
			 "START_REPLICATION SLOT \"%s\" LOGICAL 0/0 (proto_version '1', "
			 "publication_names '\"%s\"'%s)", slot, publication,
			 messages ? ", messages 'true'" : "");
	res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_COPY_BOTH)
		fatal("%s failed: %s", sql, PQerrorMessage(conn));
	PQclear(res);
}

/* Connect for replication (timestamps in UTC, ISO) and start streaming. */
static PGconn *
start_stream(const char *dsn, const char *slot, const char *publication, bool messages)
{
	const char *keys[] = {"dbname", "replication", "application_name", "options", NULL};
	const char *vals[] = {dsn, "database", messages ? "outbox-bench-logmsg" : "outbox-bench-logical",
	"-c TimeZone=UTC -c DateStyle=ISO", NULL};
	PGconn	   *conn = PQconnectdbParams(keys, vals, 1);

	if (PQstatus(conn) != CONNECTION_OK)
		fatal("could not connect for replication: %s", PQerrorMessage(conn));
	start_replication(conn, slot, publication, messages);
	return conn;
}

/*
 * Pause (SIGUSR2): everything produced is acknowledged and its position
 * confirmed, then the replication connection is closed.  Unlike a stopped
 * process (whose walsender would go on decoding into the socket buffers),
 * a paused relay leaves nothing running on the server; resuming connects
 * again and streams from the confirmed position (what a restarted Debezium
 * connector does).  An open transaction's events already produced are sent
 * again then.
 */
static void
pause_stream(PGconn *conn, Logical *lg, uint64_t *sent)
{
	flush_all(lg->rk);
	if (advance(lg) > 0 || lg->confirmed > *sent)
		send_status(conn, lg, false);
	*sent = lg->confirmed;
	PQfinish(conn);
	txn_head = txn_tail;
	lg->cur = -1;
	paused = true;
	write_status();
}

/* Wait until the connection or the producer's queue has something, at most ms. */
static void
wait_input(PGconn *conn, int kafka_fd, long ms)
{
	fd_set		rfds;
	struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
	int			pq = PQsocket(conn);
	char		drain[64];

	FD_ZERO(&rfds);
	FD_SET(pq, &rfds);
	FD_SET(kafka_fd, &rfds);
	if (select((pq > kafka_fd ? pq : kafka_fd) + 1, &rfds, NULL, NULL, &tv) < 0 && errno != EINTR)
		fatal("select failed: %s", strerror(errno));
	if (FD_ISSET(kafka_fd, &rfds))
		while (read(kafka_fd, drain, sizeof(drain)) > 0)
			;
	if (FD_ISSET(pq, &rfds) && !PQconsumeInput(conn))
		fatal("replication connection lost: %s", PQerrorMessage(conn));
}

/* The streaming loop: read, produce, confirm what Kafka has acknowledged. */
static int
run_logical(const char *dsn, rd_kafka_t *rk, const char *slot, const char *publication,
			bool messages)
{
	PGconn	   *conn = start_stream(dsn, slot, publication, messages);
	Logical		lg = {.rk = rk, .messages = messages, .cur = -1};
	uint64_t	sent = 0;
	long		unsent_events = 0;
	double		last_send = now_s(),
				started = now_s(),
				busy = 0;
	int			pipefd[2];

	txns = calloc(TXN_RING, sizeof(Txn));
	if (txns == NULL || pipe2(pipefd, O_NONBLOCK | O_CLOEXEC) != 0)
		fatal("setup failed: %s", strerror(errno));
	/* the main queue (delivery reports) wakes select() through the pipe */
	rd_kafka_queue_io_event_enable(rd_kafka_queue_get_main(rk), pipefd[1], "1", 1);
	write_status();
	for (;;)
	{
		char	   *buf;
		int			len = 0;
		bool		reply = false;
		double		t0 = now_s();
		long		got = 0;

		maybe_reset();
		if (max_seconds > 0 && now_s() - started > max_seconds)
			stop_requested = 1;
		if (pause_toggled && !stop_requested)
		{
			pause_toggled = 0;
			if (!paused)
				pause_stream(conn, &lg, &sent);
			else
			{
				conn = start_stream(dsn, slot, publication, messages);
				paused = false;
				write_status();
			}
		}
		if (paused)
		{
			if (stop_requested)
				break;
			rd_kafka_poll(rk, 100);
			continue;
		}
		while (!stop_requested && (len = PQgetCopyData(conn, &buf, 1)) > 0)
		{
			on_copydata(conn, &lg, buf, len, &reply);
			PQfreemem(buf);
			if (++got % 1000 == 0)
				rd_kafka_poll(rk, 0);
		}
		if (!stop_requested && len < 0)
		{
			PGresult   *res = PQgetResult(conn);

			fatal("replication stream ended (%s): %s",
				  res ? PQresStatus(PQresultStatus(res)) : "no result", PQerrorMessage(conn));
		}
		rd_kafka_poll(rk, 0);
		unsent_events += advance(&lg);
		if (got > 0)
			busy += now_s() - t0;
		if (reply || (lg.confirmed > sent && (now_s() - last_send >= 0.005 || outstanding == 0)) ||
			now_s() - last_send >= 1.0)
		{
			send_status(conn, &lg, false);
			last_send = now_s();
			if (lg.confirmed > sent)
			{
				sent = lg.confirmed;
				n_batches++;
				settled(unsent_events);
				unsent_events = 0;
			}
		}
		if (stop_requested)
		{
			if (outstanding == 0 && lg.confirmed == sent && txn_head == txn_tail)
				break;
			if (outstanding == 0 && txn_head < txn_tail && lg.cur == txn_tail - 1)
				break;			/* a transaction cut off mid-stream: not settled */
			rd_kafka_poll(rk, 10);
			continue;
		}
		wait_input(conn, pipefd[0], lg.confirmed > sent ? 5 : 1000);
	}
	print_totals(messages ? "logical-messages" : "logical", busy);
	if (!paused)
		PQfinish(conn);
	return 0;
}

/* ---- main -------------------------------------------------------------- */

/* Print the usage. */
static void
usage(FILE *out)
{
	fprintf(out,
			"Usage: peers pgq --dsn DSN --brokers LIST --topic T --queue Q [--consumer C] [--poll-ms 10]\n"
			"       peers logical --dsn DSN --brokers LIST --slot S --publication P [--messages]\n"
			"  common: [--status-file F] [--latency-file F] [--max-seconds S] [-X PROP=VAL ...]\n");
}

int
main(int argc, char **argv)
{
	const char *dsn = NULL,
			   *brokers = NULL,
			   *topic = NULL,
			   *queue = NULL,
			   *consumer = "relay",
			   *slot = NULL,
			   *publication = NULL,
			   *mode;
	ToolList	extra = {0};
	long		poll_ms = 10;
	bool		messages = false;
	rd_kafka_t *rk;
	int			rc;
	const ToolOpt opts[] = {
		{"--dsn", OPT_STRING, &dsn, 0, 0},
		{"--brokers", OPT_STRING, &brokers, 0, 0},
		{"--topic", OPT_STRING, &topic, 0, 0},
		{"--queue", OPT_STRING, &queue, 0, 0},
		{"--consumer", OPT_STRING, &consumer, 0, 0},
		{"--slot", OPT_STRING, &slot, 0, 0},
		{"--publication", OPT_STRING, &publication, 0, 0},
		{"--messages", OPT_FLAG, &messages, 0, 0},
		{"--poll-ms", OPT_LONG, &poll_ms, 0, 3600000},
		{"--max-seconds", OPT_LONG, &max_seconds, 0, 86400},
		{"--status-file", OPT_STRING, &status_file, 0, 0},
		{"--latency-file", OPT_STRING, &latency_file, 0, 0},
		{"-X", OPT_LIST, &extra, 0, 0},
		{NULL, OPT_FLAG, NULL, 0, 0}
	};

	if (argc < 2 || (strcmp(argv[1], "pgq") != 0 && strcmp(argv[1], "logical") != 0))
	{
		usage(argc > 1 && strcmp(argv[1], "--help") == 0 ? stdout : stderr);
		return argc > 1 && strcmp(argv[1], "--help") == 0 ? 0 : 2;
	}
	mode = argv[1];
	parse_options(argc, argv, 2, opts, usage);
	if (dsn == NULL || brokers == NULL)
		fatal("--dsn and --brokers are required (try --help)");
	if (strcmp(mode, "pgq") == 0 && (topic == NULL || queue == NULL))
		fatal("pgq needs --topic and --queue");
	if (strcmp(mode, "logical") == 0 && (slot == NULL || publication == NULL))
		fatal("logical needs --slot and --publication");

	signal(SIGTERM, on_signal);
	signal(SIGUSR1, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGUSR2, on_signal);
	rk = make_producer(brokers,
					   strcmp(mode, "pgq") == 0 ? "outbox-bench-pgq" :
					   messages ? "outbox-bench-logmsg" : "outbox-bench-logical",
					   &extra, dr_cb);
	if (strcmp(mode, "pgq") == 0)
		rc = run_pgq(dsn, rk, topic, queue, consumer, poll_ms);
	else
		rc = run_logical(dsn, rk, slot, publication, messages);
	write_latencies();
	rd_kafka_destroy(rk);
	return rc;
}
