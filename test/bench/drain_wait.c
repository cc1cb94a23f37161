/*-------------------------------------------------------------------------
 *
 * drain_wait.c
 *		Time how long a publisher takes to publish a known number of events,
 *		watching what the publisher itself reports, never its tables.
 *
 *	drain_wait --dsn DSN --counter --events N [--base B] [--exec SQL]
 *	           [--interval-ms 20] [--timeout-s 600] [--pids P,P,...]
 *	drain_wait --dsn DSN --status-file F --events N [--base B] [--exec SQL] ...
 *
 *	With --exec, first runs SQL (typically "BEGIN; <preload>; COMMIT") on
 *	its own connection; the clock starts when that returns, i.e. when the
 *	preload has committed and the publisher can see it.  Then, every
 *	--interval-ms, it reads the publisher's progress until it has grown by
 *	N past the base B:
 *
 *	--counter: the extension's shared-memory counter events_published
 *	(outbox_counters(), src/stats.c: events whose publication the worker
 *	has recorded, i.e. acknowledged by Kafka and settled), one function
 *	call on the same connection, which reads no table.  Polling the
 *	outbox_pending view instead walks the settled part of the preload's
 *	range at every poll and competes with the worker for the CPU: the
 *	benchmark would disturb what it measures.
 *
 *	--status-file F: a relay's or peer's own report (relay.c, peers.c):
 *	"settled=S last_settle=EPOCH ..." rewritten after every settle; read
 *	from the file, no database query while the clock runs.
 *
 *	B is the progress read just before --exec, or --base B (a caller that
 *	resumes a stopped publisher reads it before the resume, which a fast
 *	publisher would otherwise race, or one that emitted under pgbench
 *	reads it before pgbench started).  Prints one line:
 *
 *	    drain: events=N seconds=S events_per_s=R table_seconds=TS first_ack_s=FA exec_s=E commit_epoch=C busy_cores=B pids_cores=P
 *
 *	seconds is the polled wall-clock time from commit to "all N
 *	published" (resolution: the interval); exec_s is how long --exec took
 *	(the preload itself); commit_epoch the commit time (epoch seconds,
 *	PostgreSQL's clock), for callers that start the clock earlier.  After
 *	the clock has stopped, --counter reads aggregate_publication once:
 *	table_seconds is max(last_published_at) - commit (when Kafka
 *	acknowledged the last version settled), first_ack_s min(last_published_at)
 *	- commit over the aggregates settled since (each keeps only its latest
 *	settle time: an upper bound of the first acknowledgement).  With
 *	--status-file, table_seconds is the file's last_settle - commit and
 *	first_ack_s is not known (0).  busy_cores is the machine's CPU time
 *	(every core's, /proc/stat) between the commit and the end, divided by
 *	that time: how many of the cores the drain kept busy; pids_cores the
 *	same for the processes --pids lists (all their threads), 0 without.
 *	Clock ticks are coarse (10 ms): meaningful over rounds, not one short
 *	drain.  Exit status 1 on timeout.
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
#include <unistd.h>

#include "bench_kafka.h"

/* The options. */
typedef struct Options
{
	const char *dsn;
	const char *exec;
	const char *status_file;
	bool		counter;
	long		events;
	long		base;
	long		interval_ms;
	long		timeout_s;
	const char *pids;			/* comma-separated, or NULL */
} Options;

/* Clock ticks every core spent busy (not idle or waiting on I/O) so far. */
static double
machine_busy_ticks(void)
{
	FILE	   *f = fopen("/proc/stat", "r");
	unsigned long long v[8] = {0};

	if (f == NULL)
		return 0;
	/* cpu user nice system idle iowait irq softirq steal */
	if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu",
			   &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) != 8)
		memset(v, 0, sizeof(v));
	fclose(f);
	return (double) (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
}

/* Clock ticks (user + system, every thread) of the processes in pids. */
static double
pids_ticks(const char *pids)
{
	double		t = 0;
	const char *p = pids;

	while (p != NULL && *p != '\0')
	{
		char		path[64];
		char		line[1024];
		FILE	   *f;
		long		pid = strtol(p, NULL, 10);

		snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
		f = fopen(path, "r");
		if (f != NULL && fgets(line, sizeof(line), f) != NULL)
		{
			char	   *rest = strrchr(line, ')');
			unsigned long utime = 0,
						stime = 0;

			/* after "pid (comm)": state, then fields 4-13, then utime stime */
			if (rest != NULL &&
				sscanf(rest + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
					   &utime, &stime) == 2)
				t += utime + stime;
		}
		if (f != NULL)
			fclose(f);
		p = strchr(p, ',');
		if (p != NULL)
			p++;
	}
	return t;
}

/* Read "settled=S last_settle=E" from a status file (0 if absent). */
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

/* The extension's events_published counter (shared memory, no table). */
static long
read_counter(PGconn *conn)
{
	PGresult   *res = exec_ok(conn,
							  "SELECT coalesce(max(value), 0) FROM outbox_counters() "
							  "WHERE name = 'events_published'", PGRES_TUPLES_OK);
	long		n = atol(PQgetvalue(res, 0, 0));

	PQclear(res);
	return n;
}

/* The publisher's progress: the counter, or the status file's settled count. */
static long
progress(const Options *o, PGconn *conn, double *last)
{
	*last = 0;
	return o->counter ? read_counter(conn) : read_status(o->status_file, last);
}

/* Parse the command line into o, or die with the usage. */
static void
read_options(int argc, char **argv, Options *o)
{
	const ToolOpt opts[] = {
		{"--counter", OPT_FLAG, &o->counter, 0, 0},
		{"--dsn", OPT_STRING, &o->dsn, 0, 0},
		{"--status-file", OPT_STRING, &o->status_file, 0, 0},
		{"--events", OPT_LONG, &o->events, 1, 1000000000},
		{"--base", OPT_LONG, &o->base, 0, 1000000000000L},
		{"--exec", OPT_STRING, &o->exec, 0, 0},
		{"--interval-ms", OPT_LONG, &o->interval_ms, 1, 3600000},
		{"--timeout-s", OPT_LONG, &o->timeout_s, 1, 86400},
		{"--pids", OPT_STRING, &o->pids, 0, 0},
		{NULL, OPT_FLAG, NULL, 0, 0}
	};

	memset(o, 0, sizeof(*o));
	o->base = -1;
	o->interval_ms = 20;
	o->timeout_s = 600;
	parse_options(argc, argv, 1, opts, NULL);
	if (o->dsn == NULL || (o->status_file != NULL) + o->counter != 1 || o->events < 1)
		fatal("usage: drain_wait --dsn DSN {--counter | --status-file F} --events N [--base B] [--exec SQL] [--interval-ms 20] [--timeout-s 600] [--pids P,P,...]");
}

/* Sleep what is left of one interval that started at before. */
static void
sleep_rest(long interval_ms, double before)
{
	long		left_us = interval_ms * 1000 - (long) ((now_s() - before) * 1e6);

	if (left_us > 0)
	{
		struct timespec ts = {left_us / 1000000, (left_us % 1000000) * 1000};

		nanosleep(&ts, NULL);
	}
}

/* Print the result line (see the header); reads tables only now, untimed. */
static void
print_result(const Options *o, PGconn *conn, double secs, double texec,
			 double last_settle, const char *commit_epoch, double busy, double pids)
{
	double		table_s = 0,
				first_s = 0;

	if (o->counter)
	{
		char		sql[512];
		PGresult   *res;

		snprintf(sql, sizeof(sql),
				 "SELECT coalesce(extract(epoch FROM max(last_published_at)) - %s, 0), "
				 "coalesce(extract(epoch FROM min(last_published_at)) - %s, 0) "
				 "FROM aggregate_publication WHERE last_published_at >= to_timestamp(%s)",
				 commit_epoch, commit_epoch, commit_epoch);
		res = exec_ok(conn, sql, PGRES_TUPLES_OK);
		table_s = atof(PQgetvalue(res, 0, 0));
		first_s = atof(PQgetvalue(res, 0, 1));
		PQclear(res);
	}
	else
		table_s = last_settle - atof(commit_epoch);
	printf("drain: events=%ld seconds=%.3f events_per_s=%.0f table_seconds=%.3f first_ack_s=%.3f exec_s=%.3f commit_epoch=%s busy_cores=%.2f pids_cores=%.2f\n",
		   o->events, secs, secs > 0 ? o->events / secs : 0, table_s, first_s,
		   texec, commit_epoch, secs > 0 ? busy / secs : 0, secs > 0 ? pids / secs : 0);
}

int
main(int argc, char **argv)
{
	Options		o;
	PGconn	   *conn;
	PGresult   *res;
	char		commit_epoch[64];
	double		last_settle = 0,
				hz = (double) sysconf(_SC_CLK_TCK),
				busy0,
				pids0,
				texec,
				t0,
				t1;

	read_options(argc, argv, &o);
	conn = PQconnectdb(o.dsn);
	if (PQstatus(conn) != CONNECTION_OK)
		fatal("could not connect: %s", PQerrorMessage(conn));
	if (o.base < 0)
		o.base = progress(&o, conn, &last_settle);

	texec = now_s();
	if (o.exec)
	{
		res = PQexec(conn, o.exec);
		if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)
			fatal("--exec failed: %s", PQerrorMessage(conn));
		PQclear(res);
	}
	t0 = now_s();
	busy0 = machine_busy_ticks();
	pids0 = pids_ticks(o.pids);
	res = exec_ok(conn, "SELECT extract(epoch FROM clock_timestamp())", PGRES_TUPLES_OK);
	snprintf(commit_epoch, sizeof(commit_epoch), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);

	for (;;)
	{
		double		before = now_s();
		bool		done = progress(&o, conn, &last_settle) >= o.base + o.events;

		t1 = now_s();
		if (done)
			break;
		if (t1 > t0 + o.timeout_s)
		{
			fprintf(stderr, "drain_wait: %ld events not published after %ld s\n",
					o.events, o.timeout_s);
			return 1;
		}
		sleep_rest(o.interval_ms, before);
	}
	print_result(&o, conn, t1 - t0, t0 - texec, last_settle, commit_epoch,
				 (machine_busy_ticks() - busy0) / hz, (pids_ticks(o.pids) - pids0) / hz);
	PQfinish(conn);
	return 0;
}
