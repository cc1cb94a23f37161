/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The publisher: a background worker that sends each aggregate's
 *	  pending events to Kafka in version order, as a pipeline.
 *
 * Each turn of the loop (pipeline_step):
 *
 *	1. serve the delivery reports that came in (librdkafka wakes the wait
 *	   through a pipe when it has one);
 *	2. settle, in one short transaction, every aggregate whose messages are
 *	   all reported: mark its acknowledged prefix published and record its
 *	   first failure (publish_settle.c).  Reports of several partitions are
 *	   gathered for a few milliseconds while others are still out;
 *	3. if there is room in flight (outbox.batch_events, outbox.batch_bytes)
 *	   and the newest flight is not still awaiting its first reports (or a
 *	   backlog is being read: see pipeline_step), read a batch of at most
 *	   half the window into a new flight, in one transaction: the oldest pending
 *	   events (ORDER BY id: per aggregate that is version order, since
 *	   emitters of an aggregate are serialized until commit) of this
 *	   worker's share of the buckets, skipping paused, blocked and
 *	   backing-off aggregates and busy ones (in a flight, not settled yet);
 *	   flush the WAL up to what that snapshot can see (and wait for
 *	   outbox.standby_confirmations standbys), so that only durable commits
 *	   are published; try-lock each aggregate in the publish key space (one
 *	   another worker holds is skipped: that worker publishes it); produce
 *	   the locked aggregates' events, each aggregate's in version order and
 *	   to one destination; and commit without waiting for Kafka.
 *
 * So an aggregate has at most one flight's messages out at a time, and
 * the next batch is produced while earlier messages await
 * acknowledgement: a partition that does not acknowledge holds up only its
 * own aggregates, never a batch.  librdkafka never gives up on a message
 * (message.timeout.ms=0), so every message produced is reported some day,
 * and a late acknowledgement is recorded like any other; nothing is read
 * again while its aggregate is busy, so copies never pile up.  Messages
 * out longer than outbox.delivery_timeout only make their aggregates show
 * as stalled (outbox_workers(), delivery_timeouts).  While Kafka is
 * unreachable (all brokers down) no batch is read, so the events wait in
 * the outbox, not in the producer.
 *
 * No snapshot is held while messages are out, and no lock: the aggregates'
 * advisory locks are held only while producing.  Nothing is marked before
 * Kafka acknowledged it, so a crash anywhere means re-sending
 * (duplicates), never loss; if marking fails, what Kafka acknowledged is
 * held and only the marking is retried.  Because one producer delivers a
 * prefix of what it is given, and an aggregate is read again only after
 * its flight settled, from its first unpublished version, every re-send
 * starts at or below what a consumer has already seen: after dropping
 * re-deliveries it sees each version once, in order.
 *
 * SIGTERM (pg_terminate_backend, a fast shutdown or restart, the launcher)
 * stops the worker gracefully: it reads nothing more, settles what Kafka
 * acknowledges of its flights, and then exits as die() would have, at the
 * latest outbox.shutdown_timeout after the signal (a timeout then dies
 * wherever the worker is); a second SIGTERM dies at once.  One that comes
 * inside a step lets the step finish (a wait for standbys gives up, the
 * waits on the producer are bounded from then on).  At a fast shutdown the
 * postmaster waits for the workers before the shutdown checkpoint, so the
 * settling is part of it; an immediate shutdown (SIGQUIT) exits at once.
 * Dying with flights out re-sent every acknowledged but unsettled event
 * after the restart.
 *
 * Each read is of this worker's share of the publish buckets
 * (publish_shares.c); a bucket another worker still has busy is left to
 * it.  The state the steps share with the loop (this worker's slot, a
 * reload processed, the stop asked for) is in publish_state.c: the loop
 * sets and drives it, the steps only read it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "shmem.h"
#include "util.h"
#include "publish.h"
#include "worker.h"

/* Backoff of the whole worker after an error, and of a failing aggregate. */
#define WORKER_ERROR_BACKOFF_MS 1000
#define WORKER_ERROR_BACKOFF_MAX_MS 30000

/* How often a waiting worker looks at the producer while messages are out. */
#define STALLED_POLL_MS 100

int			outbox_poll_interval_ms = 1000;

/* Reset every turn of the loop: what a turn allocates between transactions. */
static MemoryContext loop_context = NULL;

/* When the broker-level condition was last probed. */
static TimestampTz last_probe_at = 0;

/* A read was due but came too soon after the previous one (outbox.read_interval). */
static bool read_wanted = false;
/* A read is held for the newest flight's reports (and said so: read_scheduled). */
static bool read_held = false;

static char last_logged_error[256];

/*
 * Define the publisher's settings (from _PG_init): each module its own.
 */
void
outbox_publisher_init(void)
{
	DefineCustomIntVariable("outbox.poll_interval",
							"Fallback poll interval of an idle publisher.",
							"Commits of emitting transactions wake the publisher at once; "
							"the poll catches events committed while it was not running.",
							&outbox_poll_interval_ms,
							1000, 10, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	publish_state_init();
	publish_read_init();
	publish_durable_init();
	publish_produce_init();
	publish_poison_init();
	publish_retention_init();
}

/*
 * What hinders publishing, for outbox_workers() and outbox_status: the
 * last error of the loop (e.g. a producer that cannot be created), else a
 * broker-level condition (e.g. all brokers down), else nothing.
 */
static void
set_problem(const char *error)
{
	OutboxWorkerSlot *slot = publish_slot;
	TimestampTz since = 0;
	const char *problem = error ? error : outbox_kafka_condition(&since);

	if (problem == NULL)
	{
		slot->problem[0] = '\0';
		slot->problem_since = 0;
		return;
	}
	if (strncmp(slot->problem, problem, sizeof(slot->problem) - 1) != 0)
	{
		strlcpy(slot->problem, problem, sizeof(slot->problem));
		slot->problem_since = since ? since : GetCurrentTimestamp();
	}
}

/* Leave the slot; the workers still alive take over this one's buckets. */
static void
worker_exit(int code, Datum arg)
{
	OutboxWorkerSlot *slot = publish_slot;

	slot->latch = NULL;
	/* What it had out is for the others to read again now. */
	for (int b = 0; b < OUTBOX_PUBLISH_BUCKETS / 32; b++)
		pg_atomic_write_u32(&slot->busy_buckets[b], 0);
	pg_atomic_write_u32(&slot->read_scheduled, OUTBOX_READ_NOT_SCHEDULED);
	pg_atomic_write_u32(&slot->reading_extension, 0);
	pg_atomic_write_u32(&slot->shares_view, 0);
	slot->pid = 0;
	strlcpy(slot->state, "stopped", sizeof(slot->state));
	outbox_wake_workers();
	outbox_producer_destroy(publish_producer);
	publish_producer = NULL;
}

/* Start a transaction of the loop, with SPI and a snapshot. */
static void
begin_step(const char *state)
{
	publish_set_state(state);
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
}

/* Commit a transaction of the loop (snapshot already popped if popped). */
static void
end_step(bool pop_snapshot)
{
	if (pop_snapshot)
		PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	MemoryContextSwitchTo(loop_context);
}

/* The fault-injection hook of outbox_test_fatal_error(), if armed. */
static void
test_fatal_error_hook(void)
{
	if (outbox_enable_test_hooks &&
		pg_atomic_exchange_u32(&outbox_shared->inject_fatal_error, 0) != 0)
	{
		ereport(LOG, (errmsg("outbox: test hook: raising a fatal producer error")));
		rd_kafka_test_fatal_error(publish_producer, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
								  "outbox_test_fatal_error()");
	}
}

/*
 * Read a batch into a new flight and produce it, in one transaction that
 * commits without waiting for Kafka: read the oldest pending events of this
 * worker's share (up to max_events and max_bytes, busy aggregates left
 * out), make what the snapshot saw durable, lock and produce.  Returns the
 * number of events read (-1: the extension is not installed).
 */
static int
run_flight(int max_events, int64 max_bytes)
{
	int			nshares;
	int			share;
	uint32		members;
	XLogRecPtr	visible_upto;
	Flight	   *f;
	int			nevents;
	Oid			ext;

	if (outbox_workers > 1)
		publish_note_peer_buckets();
	begin_step("reading pending events");
	ext = publish_lookup_extension();
	if (!OidIsValid(ext))
	{
		end_step(true);
		return -1;
	}

	/* Every commit this snapshot sees ends before this WAL position. */
	visible_upto = publish_wal_insert_end();

	members = publish_reading_workers(ext);
	publish_bucket_share(members, &nshares, &share);
	/*
	 * About to read again for other shares: until that read is done, our
	 * view says nothing (no store here or elsewhere may pass for it).
	 */
	if (!publish_stream_reading(nshares, share))
		pg_atomic_write_u32(&publish_slot->shares_view, 0);
	f = publish_flight_begin();
	nevents = publish_fetch(f, nshares, share, max_events, max_bytes);
	/* Read again from the oldest horizon for these shares (or paused: not yet). */
	if (publish_stream_reading(nshares, share))
		pg_atomic_write_u32(&publish_slot->shares_view, members);
	elog(DEBUG1, "outbox: fetched %d events in %ld ms", nevents,
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), GetCurrentTimestamp()));
	/* Release the snapshot: nothing below needs one. */
	PopActiveSnapshot();
	if (nevents > 0)
	{
		publish_make_durable(publish_read_flush_upto(visible_upto), visible_upto);
		publish_ensure_producer();
		publish_set_state("producing");
		publish_produce_flight(f, TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
															  outbox_delivery_timeout_ms));
		test_fatal_error_hook();
		outbox_count(OC_BATCHES, 1);
	}
	end_step(false);
	/* Our horizon row is committed: the others may leave our share to us. */
	if (publish_stream_claim_committed())
	{
		pg_atomic_write_u32(&publish_slot->reading_extension, ext);
		outbox_wake_workers();
	}
	publish_flight_end(f);
	return nevents;
}

/*
 * Is Kafka unreachable (a broker-level condition, e.g. all brokers down)
 * while messages are out?  Then no batch is read: the events wait in the
 * outbox, not in librdkafka, which would send them all at once when the
 * brokers are back, copies of any it had sent unanswered included.  The
 * first acknowledgement (or an idle probe) clears the condition.
 */
static bool
kafka_unreachable(void)
{
	TimestampTz since;

	return publish_outstanding() > 0 && outbox_kafka_condition(&since) != NULL;
}

/*
 * One turn of the pipeline: serve the delivery reports in, settle the
 * aggregates whose messages are all reported, and read and produce another
 * batch if there is room in flight (outbox.batch_events and batch_bytes)
 * and the newest flight is not still awaiting its first reports, or a
 * backlog is being read.  Returns
 * the number of events settled or read (-1: the extension is not
 * installed).
 */
static int
pipeline_step(void)
{
	int			n;
	int			nevents;
	int64		nbytes;
	bool		can_read;
	bool		backlog;

	/* Early, so that a configuration it refuses shows while idle. */
	publish_ensure_producer();
	publish_serve_reports(false);
	(void) publish_check_timeouts();
	n = publish_settle_ready();
	MemoryContextSwitchTo(loop_context);

	publish_in_flight(&nevents, &nbytes);
	/*
	 * Nothing more is read by a worker whose turn is over (it drains, then
	 * exits) or whose producer waits to be replaced (see
	 * publish_check_producer_settings).
	 */
	can_read = !publish_slot->yield && !publish_stop_requested() && !publish_producer_outdated() &&
		nevents < outbox_batch_events && nbytes < outbox_batch_bytes && !kafka_unreachable();
	/*
	 * A backlog (the newest delta has more to read) is read on without
	 * waiting for the newest flight's reports, a read at most half the
	 * window, so that one is read and produced while the one before awaits
	 * its acknowledgements: 1.3-1.5x the drain at a 5 ms round trip on the
	 * mock, the same at 0 ms.  Not if the rest starts with an aggregate
	 * the last read took part of: in flight, it and the rest of its events
	 * would be diverted, row by row (one aggregate's backlog, all of it).
	 */
	backlog = publish_stream_manifest_at_aggregate();
	if (can_read && (backlog || publish_hold_reading_ms() == 0))
	{
		/*
		 * Too soon after a read: idle_wait() waits out the gap first, or
		 * until a commit says outbox.read_commits came (the count before
		 * the flag, which is a barrier).
		 */
		read_wanted = publish_read_gap_ms() > 0;
		publish_slot->read_commits = (uint32) outbox_read_commits;
		(void) pg_atomic_exchange_u32(&publish_slot->read_scheduled,
									  read_wanted ? OUTBOX_READ_SCHEDULED : OUTBOX_READ_NOT_SCHEDULED);
		if (!read_wanted)
		{
			int			r;

			/* Before the read's snapshot: the commits counted are seen by it. */
			(void) pg_atomic_exchange_u32(&publish_slot->commits_unread, 0);
			r = run_flight(Min(outbox_batch_events - nevents, Max(outbox_batch_events / 2, 1)),
						   outbox_batch_bytes - nbytes);
			if (r < 0 && n == 0 && publish_flights == NULL)
				n = -1;
			else if (r > 0)
				n += r;
			/*
			 * Paused as a whole: no commit need wake the worker, as none
			 * can resume it (outbox_resume() wakes it unconditionally, a
			 * poll sees a hand-made change).  At 10,000 emits/s a paused
			 * worker woken every outbox.read_commits-th commit read 2,500
			 * times a second, and the emitters ran 15-20% slower.
			 */
			if (r == 0 && publish_read_paused)
				(void) pg_atomic_exchange_u32(&publish_slot->read_scheduled, OUTBOX_READ_HELD);
		}
	}
	else
	{
		/*
		 * Held for the newest flight's reports, the worker reads once they
		 * come (idle_wait() waits for them, bounded by the hold): no commit
		 * meanwhile need wake it, the outbox.read_commits-th neither, as
		 * none could end the hold.  At a steady 2,000 commits/s against a
		 * real 3-broker cluster, waking at each commit past the count made
		 * 1,300 wake-ups a second; now 55.
		 */
		read_held = can_read;
		(void) pg_atomic_exchange_u32(&publish_slot->read_scheduled,
									  can_read ? OUTBOX_READ_HELD : OUTBOX_READ_NOT_SCHEDULED);
	}
	publish_check_fatal();
	return n;
}

/*
 * Milliseconds reading is held back: for the newest flight's reports, and,
 * if a read is wanted, for the gap after the previous one.
 */
static long
read_hold_ms(void)
{
	long		hold = publish_hold_reading_ms();

	return read_wanted ? Max(hold, publish_read_gap_ms()) : hold;
}

/*
 * The set idle_wait() waits on: the latch, postmaster death and the
 * producer's report pipe (fd; -1: not the reports).  Both kept between
 * waits: WaitLatchOrSocket() builds and closes an epoll set at every call,
 * 11% of the worker's CPU at a steady 1,000 events/s.
 */
static WaitEventSet *
wait_set_for(int fd)
{
	static WaitEventSet *quiet_set = NULL;
	static WaitEventSet *set = NULL;
	static int	set_fd = -1;

	if (fd < 0)
	{
		if (quiet_set == NULL)
		{
			quiet_set = outbox_create_wait_set(2);
			AddWaitEventToSet(quiet_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
			AddWaitEventToSet(quiet_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		}
		return quiet_set;
	}
	if (set != NULL && fd == set_fd)
		return set;
	if (set != NULL)
		FreeWaitEventSet(set);
	set = outbox_create_wait_set(3);
	AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	AddWaitEventToSet(set, WL_SOCKET_READABLE, fd, NULL, NULL);
	set_fd = fd;
	return set;
}

/*
 * Sleep up to wait_ms or until woken: by the latch (a commit that emitted),
 * or by a delivery report that lets an aggregate settle, or when messages
 * pass outbox.delivery_timeout (to show them stalled), or when reading may
 * resume (not after an error: that waits out its backoff), or when a
 * producer left with old settings is to be replaced.  Returns the
 * WaitLatch result (0 when the wait ended otherwise).
 */
static int
idle_wait(long wait_ms, bool failed)
{
	TimestampTz end = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);

	/*
	 * A read put off (read_wanted, read_held) bounds the wait even if its time came
	 * meanwhile: commits do not wake a worker that said it will read
	 * (read_scheduled), so missing it would cost a whole poll interval.
	 */
	bool		held = !failed && (read_wanted || read_held || read_hold_ms() > 0);
	bool		settle = !failed && publish_pending_marks == NULL;

	for (;;)
	{
		long		remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), end);
		int			fd = publish_reports_fd();
		long		quiet = read_held ? publish_reports_quiet_ms() : 0;
		long		due_ms = 0;
		WaitEvent	event;
		int			rc;

		/* Also look now and then: a report event could go unnoticed. */
		if (publish_flights != NULL)
			remaining = Min(remaining, STALLED_POLL_MS);
		if (held)
			remaining = Min(remaining, Max(read_hold_ms(), 1));
		if (settle && !publish_settle_due(&due_ms) && publish_any_ready())
			remaining = Min(remaining, Max(due_ms, 1));
		/*
		 * Held for the newest flight, its early reports can wait (see
		 * publish_reports_quiet_ms); not while a full window in flight waits
		 * for settling to make room (a backlog's drain: 3x slower so).
		 */
		if (quiet > 0 && fd >= 0)
		{
			remaining = Min(remaining, quiet);
			fd = -1;
		}
		if (WaitEventSetWait(wait_set_for(fd), remaining, &event, 1, PG_WAIT_EXTENSION) == 0)
			rc = WL_TIMEOUT;
		else
			rc = event.events & (WL_LATCH_SET | WL_SOCKET_READABLE);
		if (rc & WL_SOCKET_READABLE)
			outbox_count(OC_REPORT_WAKEUPS, 1);
		ResetLatch(MyLatch);
		publish_serve_reports(fd < 0 && publish_reports_fd() >= 0);
		if (rc & WL_LATCH_SET)
			return rc;
		if (publish_check_timeouts() > 0 ||
			(settle && publish_settle_due(NULL)) ||
			(held && read_hold_ms() == 0) ||
			publish_producer_replace_due())
			return 0;
		if (GetCurrentTimestamp() >= end)
			return rc;
	}
}

/* Log an error caught in the loop (once per condition) and show it in the slot. */
static void
log_worker_error(void)
{
	ErrorData  *edata;
	MemoryContext oldcxt = MemoryContextSwitchTo(loop_context);

	edata = CopyErrorData();
	MemoryContextSwitchTo(oldcxt);
	FlushErrorState();

	/* Once per condition: repeats of the same message go to DEBUG1. */
	if (strncmp(last_logged_error, edata->message, sizeof(last_logged_error) - 1) != 0)
	{
		ereport(LOG,
				(errmsg("outbox: publisher error: %s", edata->message),
				 edata->detail ? errdetail_internal("%s", edata->detail) : 0,
				 errhint("The publisher retries with backoff.")));
		strlcpy(last_logged_error, edata->message, sizeof(last_logged_error));
	}
	else
		elog(DEBUG1, "outbox: publisher error (repeated): %s", edata->message);
	if (publish_pending_marks != NULL)
		set_problem(psprintf("recording the progress of %d aggregates failed (held, not sent again): %s",
							 publish_pending_marks->nprogress, edata->message));
	else
		set_problem(edata->detail
					? psprintf("%s: %s", edata->message, edata->detail)
					: edata->message);
	outbox_count(OC_WORKER_ERRORS, 1);
}

/*
 * Connecting fails with FATAL for a wrong outbox.role: say which setting
 * to look at.
 */
static void
connect_error_context(void *arg)
{
	errcontext("outbox publisher connecting to database \"%s\" as %s (outbox.role)",
			   NameStr(publish_database->name),
			   outbox_role[0] ? psprintf("role \"%s\"", outbox_role) : "the bootstrap superuser");
}

static emit_log_hook_type prev_emit_log_hook = NULL;

/*
 * While connecting: record a failure for the status views; a failure that
 * repeats the previous attempt's is not logged again.
 */
static void
connect_log_hook(ErrorData *edata)
{
	OutboxWorkerSlot *slot = publish_slot;

	if (edata->elevel >= ERROR && edata->message != NULL)
	{
		char		problem[OUTBOX_PROBLEM_LEN];

		snprintf(problem, sizeof(problem), "cannot connect (outbox.role): %s",
				 edata->message);
		if (strcmp(slot->problem, problem) == 0)
		{
			edata->output_to_server = false;
		}
		else
		{
			strlcpy(slot->problem, problem, sizeof(slot->problem));
			slot->problem_since = GetCurrentTimestamp();
		}
		slot->connect_failures++;
	}
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*
 * Connect to the launcher's database as outbox.role.  After failures in a
 * row (the launcher starts us again 5 s after an exit), wait longer first,
 * up to 5 minutes: a wrong setting costs a FATAL line once and a retry now
 * and then, not a fast loop.
 */
static void
connect_to_database(void)
{
	OutboxWorkerSlot *slot = publish_slot;
	ErrorContextCallback errcb;

	if (slot->connect_failures > 0)
	{
		long		wait_ms = (Min(5L << Min(slot->connect_failures, 6), 300) - 5) * 1000L;
		TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);

		/* The latch may be set for other reasons: wait out the time. */
		while ((wait_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until)) > 0)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 wait_ms, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
	}

	errcb.callback = connect_error_context;
	errcb.arg = NULL;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = connect_log_hook;

	BackgroundWorkerInitializeConnection(NameStr(publish_database->name),
										 outbox_role[0] ? outbox_role : NULL,
										 BGWORKER_BYPASS_ALLOWCONN);

	emit_log_hook = prev_emit_log_hook;
	error_context_stack = errcb.previous;
	slot->connect_failures = 0;
	slot->problem[0] = '\0';
	slot->problem_since = 0;
}

/* Is the extension installed in this database? */
static bool
extension_installed(void)
{
	bool		found;

	StartTransactionCommand();
	found = OidIsValid(get_extension_oid("outbox", true));
	CommitTransactionCommand();
	return found;
}

/*
 * Exit (status 0: the launcher probes again later) because the extension
 * is not, or no longer, installed here.
 */
static void
exit_extension_absent(void)
{
	if (publish_database->state == ODB_SERVED)
		ereport(LOG,
				(errmsg("outbox publisher %d: extension \"outbox\" is no longer installed in database \"%s\"; stopping",
						publish_worker_index, NameStr(publish_database->name))));
	publish_database->state = ODB_ABSENT;
	proc_exit(0);
}

/*
 * Whether to exit between two batches: when asked (the turn is over, the
 * database is dropped or left the settings), or when idle while another
 * database waits for a turn.  Never with acknowledged events unmarked or
 * messages in flight, which would be sent again.
 */
static bool
should_yield(bool idle)
{
	if (publish_pending_marks != NULL || publish_flights != NULL)
		return false;
	if (publish_slot->yield)
		return true;
	return idle && pg_atomic_read_u32(&outbox_shared->databases_waiting) > 0 &&
		TimestampDifferenceExceeds(publish_database->turn_started, GetCurrentTimestamp(), 1000);
}

/*
 * Take the slot the launcher gave us (database entry and index in
 * main_arg), connect, and check that the database is still ours to serve
 * and has the extension; else exit with status 0.  The first worker of a
 * database is thereby the launcher's probe of it.
 */
static void
join_database(Datum main_arg)
{
	publish_database = &outbox_shared->databases[DatumGetUInt32(main_arg) >> 16];
	publish_worker_index = DatumGetUInt32(main_arg) & 0xffff;
	publish_slot = &publish_database->workers[publish_worker_index];

	/* In the slot from the start, so that a DROP DATABASE finds us. */
	publish_slot->pid = MyProcPid;
	on_shmem_exit(worker_exit, (Datum) 0);
	strlcpy(publish_slot->state, "connecting", sizeof(publish_slot->state));
	connect_to_database();

	/*
	 * The entry was given to another database meanwhile, we are not wanted,
	 * or a DROP/ALTER DATABASE holds the database.
	 */
	if (MyDatabaseId != publish_database->dboid || publish_slot->yield ||
		publish_database->held_until > GetCurrentTimestamp())
		proc_exit(0);
	if (!extension_installed())
		exit_extension_absent();
	if (publish_database->state != ODB_SERVED)
	{
		/* The launcher starts the database's other workers now. */
		publish_database->state = ODB_SERVED;
		if (outbox_shared->launcher_latch != NULL)
			SetLatch(outbox_shared->launcher_latch);
	}
}

/*
 * What each step does when the extension (re)appears (its plans) and at
 * every look-up (its tables' columns), in this order, and the tables whose
 * invalidation means looking it up again (publish_extension.c).
 */
static const PublishExtensionHook extension_hooks[] = {
	{publish_read_prepare, NULL, NULL},
	{publish_stream_prepare, NULL, NULL},
	{publish_settle_prepare, NULL, NULL},
	{publish_poison_prepare, NULL, NULL},
	{publish_retention_prepare, NULL, NULL},
	{NULL, publish_heap_prepare, publish_heap_relid},
	{NULL, publish_progress_prepare, publish_progress_relid},
	{NULL, publish_read_columns, publish_read_control_relid},
};

/* The session settings and memory of a publisher, and its slot. */
static void
worker_setup(void)
{
	OutboxWorkerSlot *slot = publish_slot;

	/* Every name in our queries resolves in pg_catalog or is qualified. */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * A marking lost in a crash only means sending those events again: no
	 * need to wait for the WAL flush on every settling.
	 */
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * The pending fraction swings from nothing to everything faster than
	 * statistics follow; an estimate of a few pending rows made the fetch a
	 * bitmap scan of every pending row plus a sort.  Walking an index is
	 * right at any backlog.
	 */
	SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * Every statement of ours finds its rows by an index.  With statistics
	 * of an empty aggregate_publication (new, truncated) the read joined
	 * each event to a sequential scan of it, 20 times slower once it grew.
	 * A hash or merge join walks all of aggregate_publication for each
	 * chunk of events (11.5 ms for 1,000 events of 1,000 aggregates when
	 * it had 10,000 rows; 1.4 ms by a nested loop over its index).  JIT
	 * compiles for longer than these statements run.
	 */
	SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_hashjoin", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_mergejoin", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * Plans are kept: planning every statement at every execution cost 43%
	 * of the worker's CPU at a steady 1,000 events/s.  The few that join a
	 * batch's arrays to a table ask to be planned for the arrays' sizes
	 * (CURSOR_OPT_CUSTOM_PLAN): a generic plan made while
	 * aggregate_publication was empty re-read the settling's array for
	 * every row of it (7 times slower).  A server-wide plan_cache_mode
	 * would override both.
	 */
	SetConfigOption("plan_cache_mode", "auto", PGC_SUSET, PGC_S_OVERRIDE);

	loop_context = AllocSetContextCreate(TopMemoryContext, "outbox loop",
										 ALLOCSET_DEFAULT_SIZES);
	publish_settle_start();
	publish_stream_start();
	publish_produce_start();
	publish_extension_hooks(extension_hooks, lengthof(extension_hooks));
	slot->latch = MyLatch;
	/* The others shrink their shares of the buckets. */
	outbox_wake_workers();
}

/* Show what the worker waits for, before waiting. */
static void
show_waiting_state(bool failed)
{
	char		state[sizeof(((OutboxWorkerSlot *) NULL)->state)];
	long		n;

	if (publish_pending_marks != NULL)
		publish_set_state("marking failed: acknowledged events held");
	else if (failed)
		publish_set_state("error, retrying");
	else if ((n = publish_deferred_count()) > 0)
	{
		snprintf(state, sizeof(state), "idle, progress of %ld aggregates waits for a row lock", n);
		publish_set_state(state);
	}
	else if ((n = publish_stalled_count()) > 0)
	{
		snprintf(state, sizeof(state), "idle, %ld aggregates awaiting Kafka", n);
		publish_set_state(state);
	}
	else if (publish_flights != NULL)
		publish_set_state("awaiting acknowledgements");
	else if (publish_read_paused)
		publish_set_state("paused (outbox_pause())");
	else
		publish_set_state("idle");
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * One turn of the loop: retry held marks, or a pipeline step; then
 * retention.  Returns the number of events settled or read (-1: the
 * extension is not installed), and in *failed whether an error was caught.
 */
static int
loop_turn(bool *failed)
{
	int			n = 0;

	*failed = false;
	/* Only a pipeline step that puts a read off says one is coming. */
	read_wanted = false;
	read_held = false;
	pg_atomic_write_u32(&publish_slot->read_scheduled, OUTBOX_READ_NOT_SCHEDULED);
	PG_TRY();
	{
		/* Acknowledged but unmarked events are marked, never re-sent. */
		if (publish_pending_marks != NULL)
			n = publish_retry_marks();
		else
			n = pipeline_step();
		publish_retention_maybe();
	}
	PG_CATCH();
	{
		HOLD_INTERRUPTS();
		read_wanted = false;
		read_held = false;
		pg_atomic_write_u32(&publish_slot->read_scheduled, OUTBOX_READ_NOT_SCHEDULED);
		log_worker_error();
		AbortCurrentTransaction();
		publish_settle_abort();
		/* Read again from the horizon, as after a restart. */
		publish_stream_reset();
		RESUME_INTERRUPTS();
		*failed = true;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(loop_context);
	return n;
}

/*
 * If a stop was asked for: drain (no more reads; a timeout bounds it), and
 * once nothing is in flight or held, die as SIGTERM would have.
 */
static void
stop_or_drain(void)
{
	if (!publish_stop_requested())
		return;
	publish_stop_bound(publish_flights != NULL || publish_pending_marks != NULL);
	if (publish_flights == NULL && publish_pending_marks == NULL)
	{
		die(SIGTERM);
		CHECK_FOR_INTERRUPTS();
	}
}

/* Entry point of a publisher: connect, then run the pipeline until told to stop. */
void
outbox_worker_main(Datum main_arg)
{
	int			error_backoff_ms = WORKER_ERROR_BACKOFF_MS;

	outbox_test_start_delay();
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	outbox_reload_at_start();

	join_database(main_arg);
	worker_setup();
	/* From now on a SIGTERM first settles what is acknowledged. */
	publish_stop_setup();
	ereport(LOG,
			(errmsg("outbox publisher %d started for database \"%s\"",
					publish_worker_index, NameStr(publish_database->name))));

	for (;;)
	{
		int			n;
		bool		failed;
		long		wait_ms;
		int			rc;

		CHECK_FOR_INTERRUPTS();
		stop_or_drain();
		MemoryContextReset(loop_context);
		MemoryContextSwitchTo(loop_context);
		publish_process_reload();
		/* Also after a reload served while waiting for standbys. */
		if (publish_reloaded || publish_producer_outdated())
		{
			publish_reloaded = false;
			publish_check_producer_settings();
		}

		n = loop_turn(&failed);

		/*
		 * Report table statistics as a backend does between transactions:
		 * the marking updates and retention deletes are the outbox's dead
		 * tuples, and autovacuum only sees what is reported.
		 */
		(void) pgstat_report_stat(false);

		if (!failed && n < 0)
			exit_extension_absent();
		if (should_yield(failed || n == 0))
		{
			elog(DEBUG1, "outbox publisher %d makes way", publish_worker_index);
			proc_exit(0);
		}

		if (failed)
		{
			wait_ms = error_backoff_ms;
			error_backoff_ms = Min(error_backoff_ms * 2, WORKER_ERROR_BACKOFF_MAX_MS);
		}
		else
		{
			error_backoff_ms = WORKER_ERROR_BACKOFF_MS;
			last_logged_error[0] = '\0';
			set_problem(NULL);
			/*
			 * After progress, look again at once: more is probably waiting;
			 * and a producer left with old settings whose last flight
			 * settling freed is replaced at the top, not after a poll.
			 */
			if (n > 0 || publish_producer_replace_due())
				continue;
			/* Idle: is a broker-level condition over?  (Blocks up to 200 ms.) */
			if (TimestampDifferenceExceeds(last_probe_at, GetCurrentTimestamp(),
										   outbox_poll_interval_ms))
			{
				outbox_producer_probe(publish_producer);
				last_probe_at = GetCurrentTimestamp();
				set_problem(NULL);
			}
			wait_ms = outbox_poll_interval_ms;
		}

		show_waiting_state(failed);
		rc = idle_wait(wait_ms, failed);
		if (rc & WL_LATCH_SET)
			outbox_count(OC_WAKEUPS, 1);
		else if (rc & WL_TIMEOUT)
			outbox_count(OC_POLLS, 1);
	}
}
