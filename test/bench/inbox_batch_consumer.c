/*-------------------------------------------------------------------------
 *
 * inbox_batch_consumer.c
 *		Second baseline of the inbox benchmark (test/bench/inbox.sh): the
 *		best consumer a team writes by hand, a batch per transaction.
 *
 *	inbox_batch_consumer --dsn DSN --brokers LIST --topic T --group G
 *		--events N [--table TABLE] [--batch B] [--batch-ms MS] [--max-seconds S]
 *
 *		A librdkafka high-level consumer and one libpq connection.  It takes
 *		up to B messages (default 1000), or what came within MS ms (default
 *		100) of the first, then:
 *
 *		  BEGIN;
 *		  COPY public.TABLE (aggregate_id, version, payload) FROM STDIN;
 *		  INSERT INTO bench_offset ... ON CONFLICT DO UPDATE;  -- per partition
 *		  COMMIT;
 *
 *		Exactly-once by the offsets alone: they commit with the rows, a
 *		partition assigned starts at its stored offset (else the topic's
 *		beginning), and messages below it are dropped.  No event-id or
 *		version check: less than the inbox does.  TABLE (default
 *		bench_applied) and bench_offset (grp, topic, "partition",
 *		next_offset, primary key of the first three) must exist.  It stops
 *		after N messages and prints one line: "events <n> seconds <s>
 *		events/s <r> cpu_us_per_event <client> <backend>", timed from the
 *		first message; the CPU of this process and of its backend (from
 *		/proc), per event.
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_kafka.h"

/* A partition's next offset: the stored one, then past what was applied. */
typedef struct Part
{
	char		topic[256];
	int			partition;
	long long	next;			/* -1: from the beginning, nothing applied */
	int			moved;			/* applied in the current batch */
} Part;

#define MAX_PARTS 1024

static Part parts[MAX_PARTS];
static int	nparts;
static PGconn *db;
static const char *group;
static char copy_sql[512];
static int	rebalanced;

/* The partition's entry, added if new. */
static Part *
part(const char *topic, int partition)
{
	for (int i = 0; i < nparts; i++)
		if (parts[i].partition == partition && strcmp(parts[i].topic, topic) == 0)
			return &parts[i];
	if (nparts == MAX_PARTS)
		fatal("more than %d partitions", MAX_PARTS);
	snprintf(parts[nparts].topic, sizeof(parts[nparts].topic), "%s", topic);
	parts[nparts].partition = partition;
	parts[nparts].next = -1;
	parts[nparts].moved = 0;
	return &parts[nparts++];
}

/* Rebalance: assign each partition at its stored offset. */
static void
rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
			 rd_kafka_topic_partition_list_t *tl, void *opaque)
{
	(void) opaque;
	rebalanced = 1;
	if (err != RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
	{
		rd_kafka_assign(rk, NULL);
		return;
	}
	for (int i = 0; i < tl->cnt; i++)
	{
		char		pbuf[16];
		const char *p[3] = {group, tl->elems[i].topic, pbuf};
		PGresult   *r;
		Part	   *pt = part(tl->elems[i].topic, tl->elems[i].partition);

		snprintf(pbuf, sizeof(pbuf), "%d", tl->elems[i].partition);
		r = exec_params(db, "SELECT next_offset FROM public.bench_offset WHERE grp = $1 AND topic = $2 "
						"AND \"partition\" = $3", 3, p, PGRES_TUPLES_OK);
		pt->next = PQntuples(r) == 1 ? atoll(PQgetvalue(r, 0, 0)) : -1;
		tl->elems[i].offset = pt->next >= 0 ? pt->next : RD_KAFKA_OFFSET_BEGINNING;
		PQclear(r);
	}
	rd_kafka_assign(rk, tl);
}

/* Append s to the COPY text row in buf, escaped; returns the new length. */
static size_t
copy_field(char *buf, size_t len, size_t cap, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
	{
		char		c = s[i];
		const char *esc = c == '\\' ? "\\\\" : c == '\t' ? "\\t" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : NULL;

		if (len + 3 >= cap)
			fatal("row too long");
		if (esc)
		{
			memcpy(buf + len, esc, 2);
			len += 2;
		}
		else
			buf[len++] = c;
	}
	return len;
}

/* Append COPY's null (\N); returns the new length. */
static size_t
copy_null(char *buf, size_t len)
{
	memcpy(buf + len, "\\N", 2);
	return len + 2;
}

/* A header's value, escaped for COPY, or null if absent. */
static size_t
copy_header(char *buf, size_t len, size_t cap, rd_kafka_message_t *m, const char *name)
{
	rd_kafka_headers_t *hdrs;
	const void *v;
	size_t		sz;

	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
		rd_kafka_header_get_last(hdrs, name, &v, &sz) == RD_KAFKA_RESP_ERR_NO_ERROR && v != NULL)
		return copy_field(buf, len, cap, v, sz);
	return copy_null(buf, len);
}

/* The moved partitions' topics, numbers and next offsets as array literals. */
static void
offset_arrays(char *topics, char *nums, char *offsets, size_t cap)
{
	size_t		lt = 1,
				ln = 1,
				lo = 1;

	topics[0] = nums[0] = offsets[0] = '{';
	for (int i = 0; i < nparts; i++)
	{
		const char *sep = lt > 1 ? "," : "";

		if (!parts[i].moved)
			continue;
		lt += snprintf(topics + lt, cap - lt, "%s\"%s\"", sep, parts[i].topic);
		ln += snprintf(nums + ln, cap - ln, "%s%d", sep, parts[i].partition);
		lo += snprintf(offsets + lo, cap - lo, "%s%lld", sep, parts[i].next);
		if (lt >= cap - 2 || ln >= cap - 2 || lo >= cap - 2)
			fatal("too many partitions in a batch");
		parts[i].moved = 0;
	}
	snprintf(topics + lt, cap - lt, "}");
	snprintf(nums + ln, cap - ln, "}");
	snprintf(offsets + lo, cap - lo, "}");
}

/* One transaction: the batch's rows by COPY, its partitions' offsets. */
static long
apply_batch(rd_kafka_message_t **msgs, int n)
{
	static char row[1 << 20];
	static char topics[1 << 16],
				nums[1 << 14],
				offsets[1 << 15];
	const char *p[4] = {group, topics, nums, offsets};
	long		applied = 0;

	PQclear(exec_ok(db, "BEGIN", PGRES_COMMAND_OK));
	PQclear(exec_ok(db, copy_sql, PGRES_COPY_IN));
	for (int i = 0; i < n; i++)
	{
		rd_kafka_message_t *m = msgs[i];
		Part	   *pt = part(rd_kafka_topic_name(m->rkt), m->partition);
		size_t		len = 0;

		if (pt->next >= 0 && m->offset < pt->next)
			continue;			/* applied before: a re-delivery */
		len = copy_header(row, len, sizeof(row), m, "aggregate_id");
		row[len++] = '\t';
		len = copy_header(row, len, sizeof(row), m, "aggregate_version");
		row[len++] = '\t';
		len = m->payload ? copy_field(row, len, sizeof(row), m->payload, m->len) : copy_null(row, len);
		row[len++] = '\n';
		if (PQputCopyData(db, row, (int) len) != 1)
			fatal("COPY failed: %s", PQerrorMessage(db));
		pt->next = m->offset + 1;
		pt->moved = 1;
		applied++;
	}
	if (PQputCopyEnd(db, NULL) != 1)
		fatal("COPY failed: %s", PQerrorMessage(db));
	PQclear(exec_ok(db, "", PGRES_EMPTY_QUERY));
	/* One row per partition moved, in one statement. */
	offset_arrays(topics, nums, offsets, sizeof(nums));
	if (applied > 0)
		PQclear(exec_params(db, "INSERT INTO public.bench_offset (grp, topic, \"partition\", next_offset) "
							"SELECT $1, t, p, o FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(t, p, o) "
							"ON CONFLICT (grp, topic, \"partition\") DO UPDATE SET next_offset = excluded.next_offset",
							4, p, PGRES_COMMAND_OK));
	PQclear(exec_ok(db, "COMMIT", PGRES_COMMAND_OK));
	return applied;
}

/* CPU seconds (user + system) of a process, from /proc. */
static double
proc_cpu_s(int pid)
{
	char		path[64];
	unsigned long ut = 0,
				st = 0;
	FILE	   *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	if (fscanf(f, "%*d (%*[^)]) %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		ut = st = 0;
	fclose(f);
	return (double) (ut + st) / sysconf(_SC_CLK_TCK);
}

/* This process's CPU seconds (user + system). */
static double
self_cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int
main(int argc, char **argv)
{
	InboxOptions o;
	const char *table = "bench_applied";
	long		done = 0,
				batch = 1000,
				batch_ms = 100;
	double		t0 = 0,
				c0 = 0,
				b0 = 0,
				start = now_s();
	rd_kafka_t *rk;
	rd_kafka_message_t **msgs;
	int			backend;
	const char *const settings[] = {"enable.auto.commit", "false", NULL};
	const ToolOpt opts[] = {
		{"--table", OPT_STRING, &table, 0, 0},
		{"--batch", OPT_LONG, &batch, 1, 1000000},
		{"--batch-ms", OPT_LONG, &batch_ms, 1, 60000},
		{NULL, OPT_FLAG, NULL, 0, 0}
	};

	parse_inbox_options(argc, argv, &o, opts);
	group = o.group;
	snprintf(copy_sql, sizeof(copy_sql), "COPY public.%s (aggregate_id, version, payload) FROM STDIN", table);
	db = connect_db(o.dsn);
	backend = PQbackendPID(db);
	rk = subscribe_consumer(o.brokers, o.group, o.topic, settings, rebalance_cb);
	msgs = malloc(sizeof(*msgs) * batch);

	while (done < o.events && now_s() - start < o.max_seconds)
	{
		int			n = 0;
		double		first = 0;

		/* Up to a batch, or what came within batch_ms of the first. */
		while (n < batch && (first == 0 || now_s() - first < batch_ms / 1000.0))
		{
			rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, first == 0 ? 100 : 1);

			/* A rebalance: what was taken comes again from the offsets. */
			if (rebalanced)
			{
				while (n > 0)
					rd_kafka_message_destroy(msgs[--n]);
				rebalanced = 0;
			}
			if (!m)
			{
				if (first == 0)
					break;
				continue;
			}
			if (m->err)
			{
				rd_kafka_message_destroy(m);
				continue;
			}
			if (first == 0)
				first = now_s();
			msgs[n++] = m;
		}
		if (t0 == 0 && n > 0)
		{
			t0 = now_s();
			c0 = self_cpu_s();
			b0 = proc_cpu_s(backend);
		}
		if (n > 0)
			done += apply_batch(msgs, n);
		for (int i = 0; i < n; i++)
			rd_kafka_message_destroy(msgs[i]);
	}
	printf("events %ld seconds %.3f events/s %.0f cpu_us_per_event %.1f %.1f\n", done, now_s() - t0,
		   done / (now_s() - t0), (self_cpu_s() - c0) * 1e6 / (done ? done : 1),
		   (proc_cpu_s(backend) - b0) * 1e6 / (done ? done : 1));
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	PQfinish(db);
	free(msgs);
	return done >= o.events ? 0 : 1;
}
