/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  The extension's shared memory (OutboxShared, shmem.h, which states
 *	  its locking rules): its request and start-up, the look-up of a
 *	  database's entry, and the signals backends send the workers through
 *	  it (the commit callback that wakes the publishers, the probe that
 *	  wakes the launcher).
 *
 * The bottom of the module graph: calls no other module of the extension.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "compat.h"
#include "shmem.h"

OutboxShared *outbox_shared = NULL;

static bool emitted_in_xact = false;
/* An operator's change (e.g. outbox_resume()): wake every publisher at commit. */
static bool control_in_xact = false;
static bool xact_callback_registered = false;
/* This transaction is counted in async_emits_committing. */
static bool async_counted = false;
/* CREATE EXTENSION or inbox_subscribe() ran: wake the launcher at commit. */
static bool probe_at_commit = false;
static bool probe_callback_registered = false;

/* Shared memory the extension needs. */
static Size
outbox_shmem_size(void)
{
	return MAXALIGN(sizeof(OutboxShared));
}

/* Ask for our shared memory (from the shmem request hook, or _PG_init). */
void
outbox_shmem_request(void)
{
	RequestAddinShmemSpace(outbox_shmem_size());
}

/*
 * Create or attach to our shared memory (from the shmem startup hook).
 * Returns whether it existed already; the counters in it are stats.c's
 * (outbox_stats_shmem_startup).
 */
bool
outbox_shmem_startup(void)
{
	bool		found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_shared = ShmemInitStruct("outbox", outbox_shmem_size(), &found);
	if (!found)
	{
		memset(outbox_shared, 0, outbox_shmem_size());
		pg_atomic_init_u32(&outbox_shared->inject_fatal_error, 0);
		pg_atomic_init_u32(&outbox_shared->probe_generation, 0);
		pg_atomic_init_u32(&outbox_shared->databases_waiting, 0);
		pg_atomic_init_u32(&outbox_shared->async_emits_committing, 0);
		pg_atomic_init_u64(&outbox_shared->async_emit_lsn, 0);
	}
	for (int i = 0; !found && i < OUTBOX_MAX_DATABASES; i++)
		outbox_worker_slots_init(outbox_shared->databases[i].workers);
	LWLockRelease(AddinShmemInitLock);
	return found;
}

/* Empty publisher slots (a database's OUTBOX_MAX_WORKERS of them). */
void
outbox_worker_slots_init(OutboxWorkerSlot *slots)
{
	memset(slots, 0, sizeof(OutboxWorkerSlot) * OUTBOX_MAX_WORKERS);
	for (int w = 0; w < OUTBOX_MAX_WORKERS; w++)
	{
		pg_atomic_init_u32(&slots[w].read_scheduled, OUTBOX_READ_NOT_SCHEDULED);
		pg_atomic_init_u32(&slots[w].commits_unread, 0);
		pg_atomic_init_u32(&slots[w].reading_extension, 0);
		pg_atomic_init_u32(&slots[w].shares_view, 0);
		for (int b = 0; b < OUTBOX_PUBLISH_BUCKETS / 32; b++)
			pg_atomic_init_u32(&slots[w].busy_buckets[b], 0);
	}
}

/*
 * Wake the publishers of this database; on a commit (commit true) not those
 * about to read anyway (read_scheduled) unless this commit makes
 * outbox.read_commits since their last read, and never those holding reading
 * for their newest flight's reports: at 1,000 commits/s, nine wake-ups in
 * ten found a read already due and only cost CPU.  The commit
 * is visible before the flag is read, and a worker clears it before its
 * read's snapshot: a commit that finds it set is seen by that read.
 */
static void
wake_publishers(bool commit)
{
	OutboxDatabase *db = outbox_database_entry(MyDatabaseId);

	if (db == NULL)
		return;
	/* The commit is visible before a latch or flag is read. */
	pg_memory_barrier();
	for (int i = 0; i < OUTBOX_MAX_WORKERS; i++)
	{
		OutboxWorkerSlot *slot = &db->workers[i];
		Latch	   *latch = slot->latch;
		uint32		unread;

		if (latch == NULL)
			continue;
		if (!commit)
		{
			SetLatch(latch);
			continue;
		}
		unread = pg_atomic_add_fetch_u32(&slot->commits_unread, 1);
		switch (pg_atomic_read_u32(&slot->read_scheduled))
		{
			case OUTBOX_READ_NOT_SCHEDULED:
				SetLatch(latch);
				break;
			case OUTBOX_READ_SCHEDULED:
				if (unread >= slot->read_commits)
					SetLatch(latch);
				break;
			default:
				break;
		}
	}
}

/* Raise *v to at least lsn. */
static void
raise_lsn(pg_atomic_uint64 *v, uint64 lsn)
{
	uint64		cur = pg_atomic_read_u64(v);

	while (cur < lsn && !pg_atomic_compare_exchange_u64(v, &cur, lsn))
		;
}

/*
 * An emitting transaction about to commit asynchronously is counted from
 * before it becomes visible until its commit record's end is in
 * async_emit_lsn (or it aborted): a publisher whose snapshot sees it either
 * still counts it (and flushes to the end of the WAL) or finds its commit
 * in async_emit_lsn.  A synchronous commit is flushed before it becomes
 * visible, and COMMIT PREPARED always flushes: neither is counted.
 */
static void
count_async_commit(XactEvent event)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (emitted_in_xact && outbox_shared != NULL &&
				synchronous_commit == SYNCHRONOUS_COMMIT_OFF &&
				TransactionIdIsValid(GetTopTransactionIdIfAny()))
			{
				pg_atomic_fetch_add_u32(&outbox_shared->async_emits_committing, 1);
				async_counted = true;
			}
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (async_counted)
				raise_lsn(&outbox_shared->async_emit_lsn, XactLastCommitEnd);
			/* FALLTHROUGH */
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			if (async_counted)
				pg_atomic_fetch_sub_u32(&outbox_shared->async_emits_committing, 1);
			async_counted = false;
			break;
		default:
			break;
	}
}

/*
 * Wake every publisher when a transaction that emitted commits: the event is
 * visible from this moment, and waiting for the fallback poll would add its
 * whole interval to the latency.
 */
static void
outbox_xact_callback(XactEvent event, void *arg)
{
	count_async_commit(event);
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (control_in_xact && outbox_shared != NULL)
				wake_publishers(false);
			else if (emitted_in_xact && outbox_shared != NULL)
				wake_publishers(true);
			emitted_in_xact = false;
			control_in_xact = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* A prepared emit is found by the fallback poll once committed. */
			emitted_in_xact = false;
			control_in_xact = false;
			break;
		default:
			break;
	}
}

/* Wake the publishers of this database. */
void
outbox_wake_workers(void)
{
	wake_publishers(false);
}

/*
 * outbox_note_write() RETURNS trigger: a statement wrote rows into the
 * outbox without outbox_emit*() (an INSERT or COPY by its owner), or
 * logical replication's apply a row; its transaction is marked as theirs
 * is, for the publishers' flush.
 */
PG_FUNCTION_INFO_V1(outbox_note_write);
Datum
outbox_note_write(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox_note_write() must be called as a trigger"),
				 errhint("It is a trigger of the outbox table.")));
	outbox_note_emit();
	return PointerGetDatum(NULL);
}

/* This transaction emitted: wake the publishers when it commits. */
void
outbox_note_emit(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(outbox_xact_callback, NULL);
		xact_callback_registered = true;
	}
	emitted_in_xact = true;
}

/*
 * This transaction changed what publishers may read (an operator's
 * function): wake every publisher when it commits, also one that said
 * commits need not wake it (a paused one, one about to read anyway).
 */
void
outbox_note_control(void)
{
	outbox_note_emit();
	control_in_xact = true;
}

/* ---------- look-ups ---------- */

/* The entry of a database, or NULL if the launcher has none for it. */
OutboxDatabase *
outbox_database_entry(Oid dboid)
{
	static OutboxDatabase *cached = NULL;

	if (outbox_shared == NULL || !OidIsValid(dboid))
		return NULL;
	if (cached != NULL && cached->dboid == dboid)
		return cached;
	for (int i = 0; i < OUTBOX_MAX_DATABASES; i++)
	{
		if (outbox_shared->databases[i].dboid == dboid)
		{
			cached = &outbox_shared->databases[i];
			return cached;
		}
	}
	return NULL;
}

/* The counters of a database, or NULL if the launcher has no entry for it. */
OutboxStats *
outbox_database_stats(Oid dboid)
{
	OutboxDatabase *db = outbox_database_entry(dboid);

	return db ? &db->stats : NULL;
}

/* ---------- the launcher ---------- */

/* Wake the launcher, if it runs. */
void
outbox_wake_launcher(void)
{
	Latch	   *latch = outbox_shared->launcher_latch;

	if (latch != NULL)
		SetLatch(latch);
}

/* CREATE EXTENSION committed: the launcher probes every database again. */
static void
probe_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT && probe_at_commit && outbox_shared != NULL)
	{
		pg_atomic_fetch_add_u32(&outbox_shared->probe_generation, 1);
		outbox_wake_launcher();
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE)
		probe_at_commit = false;
}

/* Called by CREATE EXTENSION: have this database probed once it commits. */
void
outbox_launcher_probe_at_commit(void)
{
	if (outbox_shared == NULL)
		return;
	if (!probe_callback_registered)
	{
		RegisterXactCallback(probe_xact_callback, NULL);
		probe_callback_registered = true;
	}
	probe_at_commit = true;
}
