/*-------------------------------------------------------------------------
 *
 * drain_wait.c
 *		Time how long a publisher takes to settle everything pending.
 *
 *	drain_wait --dsn DSN --table T [--exec SQL] [--interval-ms 20]
 *	           [--timeout-s 600]
 *	drain_wait --dsn DSN --outbox [--exec SQL] ...
 *	drain_wait --dsn DSN --status-file F --events N [--exec SQL] ...
 *
 *	With --exec, first runs SQL (typically "BEGIN; <preload>; COMMIT") on
 *	its own connection; the clock starts when that returns, i.e. when the
 *	preload has committed and the publisher can see it.  Then, every
 *	--interval-ms on the same connection,
 *
 *	    SELECT EXISTS (SELECT 1 FROM T WHERE published_at IS NULL)
 *
 *	(what count(*) ... = 0 asks, but it stops at the first pending row of
 *	the partial index instead of counting 100,000 of them every 20 ms on a
 *	2-core machine) until it is false.  T is a relay's table (relay.c):
 *	the extension's outbox has no published_at.  Prints one line:
 *
 *	    drain: events=N seconds=S events_per_s=R table_seconds=TS first_ack_s=FA exec_s=E
 *
 *	seconds is the polled wall-clock time from commit to "nothing pending"
 *	(resolution: the interval plus one query); table_seconds is
 *	max(published_at) - commit time, from the table itself (published_at is
 *	when the last acknowledgement of the final batch came in, so it leaves
 *	out that batch's marking commit); first_ack_s is min(published_at) -
 *	commit time (start-up: wake-up, first fetch, first round trip); exec_s
 *	is how long --exec took (the preload itself).  N is
 *	the number of rows published since the commit.  Exit status 1 on
 *	timeout.
 *
 *	--outbox: the extension's outbox, which records no per-event publish
 *	time: an event is published once its aggregate's last_published_version
 *	reaches it.  Polls SELECT EXISTS (SELECT 1 FROM outbox_pending) (by the
 *	txid index, from the publisher's horizon on); N is the number of events
 *	settled meanwhile: those pending before --exec plus the rows added
 *	since (ids above the max id then);
 *	table_seconds is max(aggregate_publication.last_published_at) - commit
 *	(when Kafka acknowledged the last version settled);
 *	first_ack_s is min(last_published_at) - commit over the aggregates
 *	settled since the commit: each aggregate keeps only its latest settle
 *	time, so this is an upper bound of the first acknowledgement.
 *
 *	--status-file F --events N: for the peers (peers.c), which keep no
 *	per-event state in the database.  Reads "settled=S last_settle=EPOCH"
 *	from F before --exec (or takes S from --base S: a caller that resumes a
 *	stopped peer reads it before the resume, which a fast peer would
 *	otherwise race), then polls F every --interval-ms until settled >= S + N.  seconds is as above; table_seconds is last_settle
 *	(when the final batch was finished or its position confirmed) minus
 *	the commit time; first_ack_s is not known (printed as 0).
 *
 *	Both modes end the line with commit_epoch=E, the commit time (epoch
 *	seconds, PostgreSQL's clock), for callers that start the clock earlier.
 *
 * test/bench/drain_wait.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_kafka.h"

/* Read "settled=S last_settle=E" from a peer's status file (0 if absent). */
static long
read_status(const char *path, double *last)
{
	FILE	   *f = fopen(path, "r");
	long		settled = 0;

	*last = 0;
	if (f == NULL)
		return 0;
	if (fscanf(f, "settled=%ld last_settle=%lf", &settled, last) != 2)
		settled = 0;
	fclose(f);
	return settled;
}

int
main(int argc, char **argv)
{
	const char *dsn = NULL,
			   *table = NULL,
			   *exec = NULL,
			   *status_file = NULL;
	bool		outbox = false;
	long		want_events = 0,
				base = -1;
	char		id0[32] = "0";
	long		pending0 = 0;
	double		last_settle = 0;
	long		interval_ms = 20,
				timeout_s = 600;
	PGconn	   *conn;
	PGresult   *res;
	char		sql[1024];
	char		commit_epoch[64];
	double		t0,
				t1,
				texec = now_s(),
				deadline;

	for (int i = 1; i < argc; i++)
	{
		const char *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(argv[i], "--outbox") == 0)
		{
			outbox = true;
			continue;
		}
		if (val == NULL)
			fatal("option %s needs an argument", argv[i]);
		if (strcmp(argv[i], "--dsn") == 0)
			dsn = val;
		else if (strcmp(argv[i], "--table") == 0)
			table = val;
		else if (strcmp(argv[i], "--status-file") == 0)
			status_file = val;
		else if (strcmp(argv[i], "--events") == 0)
			want_events = parse_long(argv[i], val, 1, 1000000000);
		else if (strcmp(argv[i], "--base") == 0)
			base = parse_long(argv[i], val, 0, 1000000000);
		else if (strcmp(argv[i], "--exec") == 0)
			exec = val;
		else if (strcmp(argv[i], "--interval-ms") == 0)
			interval_ms = parse_long(argv[i], val, 1, 3600000);
		else if (strcmp(argv[i], "--timeout-s") == 0)
			timeout_s = parse_long(argv[i], val, 1, 86400);
		else
			fatal("unknown option \"%s\"", argv[i]);
		i++;
	}
	if (dsn == NULL || (table != NULL) + (status_file != NULL) + outbox != 1 ||
		(status_file != NULL && want_events < 1) || interval_ms < 1 || timeout_s < 1)
		fatal("usage: drain_wait --dsn DSN {--table T | --outbox | --status-file F --events N} [--base S] [--exec SQL] [--interval-ms 20] [--timeout-s 600]");
	if (status_file && base < 0)
		base = read_status(status_file, &last_settle);

	conn = PQconnectdb(dsn);
	if (PQstatus(conn) != CONNECTION_OK)
		fatal("could not connect: %s", PQerrorMessage(conn));

	if (outbox)
	{
		res = exec_ok(conn, "SELECT (SELECT coalesce(max(id), 0) FROM outbox), "
					  "(SELECT count(*) FROM outbox_pending)", PGRES_TUPLES_OK);
		snprintf(id0, sizeof(id0), "%s", PQgetvalue(res, 0, 0));
		pending0 = atol(PQgetvalue(res, 0, 1));
		PQclear(res);
	}
	if (exec)
	{
		texec = now_s();
		res = PQexec(conn, exec);
		if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)
			fatal("--exec failed: %s", PQerrorMessage(conn));
		PQclear(res);
	}
	t0 = now_s();
	res = exec_ok(conn, "SELECT extract(epoch FROM clock_timestamp())", PGRES_TUPLES_OK);
	snprintf(commit_epoch, sizeof(commit_epoch), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);

	if (table)
		snprintf(sql, sizeof(sql),
				 "SELECT EXISTS (SELECT 1 FROM %s WHERE published_at IS NULL)", table);
	else if (outbox)
		snprintf(sql, sizeof(sql), "SELECT EXISTS (SELECT 1 FROM outbox_pending)");
	deadline = t0 + timeout_s;
	for (;;)
	{
		double		before = now_s();
		int			pending;

		if (status_file)
			pending = read_status(status_file, &last_settle) < base + want_events;
		else
		{
			res = exec_ok(conn, sql, PGRES_TUPLES_OK);
			pending = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
			PQclear(res);
		}
		t1 = now_s();
		if (!pending)
			break;
		if (t1 > deadline)
		{
			fprintf(stderr, "drain_wait: still pending after %ld s\n", timeout_s);
			return 1;
		}
		{
			long		left_us = interval_ms * 1000 - (long) ((t1 - before) * 1e6);

			if (left_us > 0)
			{
				struct timespec ts = {left_us / 1000000, (left_us % 1000000) * 1000};

				nanosleep(&ts, NULL);
			}
		}
	}

	if (status_file)
	{
		double		secs = t1 - t0;

		printf("drain: events=%ld seconds=%.3f events_per_s=%.0f table_seconds=%.3f first_ack_s=0 exec_s=%.3f commit_epoch=%s\n",
			   want_events, secs, secs > 0 ? want_events / secs : 0,
			   last_settle - atof(commit_epoch), t0 - texec, commit_epoch);
		PQfinish(conn);
		return 0;
	}
	if (outbox)
		snprintf(sql, sizeof(sql),
				 "SELECT %ld + (SELECT count(*) FROM outbox WHERE id > %s), "
				 "coalesce(extract(epoch FROM max(last_published_at)) - %s, 0), "
				 "coalesce(extract(epoch FROM min(last_published_at)) - %s, 0) "
				 "FROM aggregate_publication WHERE last_published_at >= to_timestamp(%s)",
				 pending0, id0, commit_epoch, commit_epoch, commit_epoch);
	else
		snprintf(sql, sizeof(sql),
				 "SELECT count(*), "
				 "coalesce(extract(epoch FROM max(published_at)) - %s, 0), "
				 "coalesce(extract(epoch FROM min(published_at)) - %s, 0) "
				 "FROM %s WHERE published_at >= to_timestamp(%s)",
				 commit_epoch, commit_epoch, table, commit_epoch);
	res = exec_ok(conn, sql, PGRES_TUPLES_OK);
	{
		long		n = atol(PQgetvalue(res, 0, 0));
		double		secs = t1 - t0;

		printf("drain: events=%ld seconds=%.3f events_per_s=%.0f table_seconds=%.3f first_ack_s=%.3f exec_s=%.3f commit_epoch=%s\n",
			   n, secs, secs > 0 ? n / secs : 0,
			   atof(PQgetvalue(res, 0, 1)), atof(PQgetvalue(res, 0, 2)), t0 - texec, commit_epoch);
	}
	PQclear(res);
	PQfinish(conn);
	return 0;
}
