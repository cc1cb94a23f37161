/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  Shared memory, the settings read at server start, the commit
 *	  callback that wakes the publisher, and helpers every part uses
 *	  (_PG_init, which calls them, is in init.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "parser/parse_relation.h"
#include "postmaster/bgworker.h"
#include "replication/walsender.h"
#include "rewrite/rewriteHandler.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "compat.h"
#include "outbox.h"
#include "kafka.h"
#include "emit.h"
#include "inbox_worker.h"
#include "launcher.h"
#include "worker.h"

OutboxShared *outbox_shared = NULL;

char	   *outbox_database = NULL;
char	   *outbox_role = NULL;
int			outbox_workers = 1;
bool		outbox_enable_test_hooks = false;

static bool emitted_in_xact = false;
static bool xact_callback_registered = false;
/* This transaction is counted in async_emits_committing. */
static bool async_counted = false;

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

/* Create or attach to our shared memory (from the shmem startup hook). */
void
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
	for (int i = 0; i < OUTBOX_MAX_DATABASES; i++)
	{
		outbox_stats_init(&outbox_shared->databases[i].stats, found);
		if (!found)
			outbox_worker_slots_init(outbox_shared->databases[i].workers);
	}
	LWLockRelease(AddinShmemInitLock);
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
			if (emitted_in_xact && outbox_shared != NULL)
				wake_publishers(true);
			emitted_in_xact = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* A prepared emit is found by the fallback poll once committed. */
			emitted_in_xact = false;
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
 * An executor state for writing rel's rows without a plan, the way logical
 * replication's apply does: its range table holds rel (locked in mode).
 */
struct EState *
outbox_simple_estate(Relation rel, LOCKMODE mode)
{
	EState	   *estate = CreateExecutorState();
	RangeTblEntry *rte = makeNode(RangeTblEntry);

	rte->rtekind = RTE_RELATION;
	rte->relid = RelationGetRelid(rel);
	rte->relkind = rel->rd_rel->relkind;
	rte->rellockmode = mode;
	outbox_init_range_table(estate, rte);
	return estate;
}

/*
 * The defaults of rel's columns that are neither dropped nor among set (nset
 * attribute numbers), planned, in the current memory context, into defaults
 * (room for rel's natts).  Returns how many.
 */
int
outbox_column_defaults(Relation rel, const AttrNumber *set, int nset,
					   OutboxColumnDefault *defaults)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			n = 0;

	for (AttrNumber attnum = 1; attnum <= desc->natts; attnum++)
	{
		bool		skip = TupleDescAttr(desc, attnum - 1)->attisdropped;
		Node	   *expr;

		for (int i = 0; !skip && i < nset; i++)
			skip = set[i] == attnum;
		if (skip || (expr = build_column_default(rel, attnum)) == NULL)
			continue;
		defaults[n].attnum = attnum;
		defaults[n].expr = expression_planner((Expr *) expr);
		n++;
	}
	return n;
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
 * The lock tag of an aggregate in one of our advisory key spaces.  Two
 * aggregates whose 64-bit hashes collide share a lock: that costs
 * parallelism, never correctness.
 */
void
outbox_aggregate_locktag(LOCKTAG *tag, const char *aggregate_id, int len,
						 uint16 space)
{
	uint64		h = hash_bytes_extended((const unsigned char *) aggregate_id,
										len, 0);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32),
						 (uint32) h, space);
}

/*
 * The publisher's lock of the bucket holding an aggregate.  The bucket is
 * hashtext(aggregate_id) modulo OUTBOX_PUBLISH_BUCKETS, the same expression
 * the worker's query uses to split buckets between workers.
 */
void
outbox_publish_locktag(LOCKTAG *tag, const char *aggregate_id)
{
	uint32		h = hash_bytes((const unsigned char *) aggregate_id,
							   strlen(aggregate_id));

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, 0,
						 OUTBOX_PUBLISH_BUCKET(h),
						 OUTBOX_LOCKSPACE_PUBLISH);
}

/* Prepare and keep one plan (the publisher's and the inbox workers'). */
SPIPlanPtr
outbox_keep_plan(const char *query, int nargs, Oid *argtypes)
{
	return outbox_keep_plan_options(query, nargs, argtypes, 0);
}

/*
 * The same, with cursor options: CURSOR_OPT_CUSTOM_PLAN plans a statement
 * at every execution, for its parameters' values (plan_cache_mode = auto).
 */
SPIPlanPtr
outbox_keep_plan_options(const char *query, int nargs, Oid *argtypes, int cursor_options)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(query, nargs, argtypes, cursor_options);

	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", query,
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	return plan;
}

/*
 * Settings of the preloaded publisher, most read only at server start.
 * PostgreSQL allows defining PGC_POSTMASTER ones only
 * while shared_preload_libraries is processed (FATAL otherwise), and only
 * then do they mean anything: without the preload there is no publisher.
 */
void
outbox_postmaster_settings_init(void)
{
	DefineCustomStringVariable("outbox.database",
							   "Serve only this database (empty: outbox.databases decides).",
							   "Kept for compatibility: a name here acts as outbox.databases = that name.",
							   &outbox_database,
							   "",
							   PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.role",
							   "Role the publisher connects as (empty: the bootstrap superuser).",
							   "The role needs SELECT and UPDATE on outbox and INSERT, SELECT and UPDATE on aggregate_publication.",
							   &outbox_role,
							   "",
							   PGC_POSTMASTER,
							   0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.workers",
							"Number of publisher workers per database.",
							"0 disables publishing.",
							&outbox_workers,
							1, 0, OUTBOX_MAX_WORKERS,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("outbox.enable_test_hooks",
							 "Allows outbox_test_fatal_error() (for fault-injection tests only).",
							 NULL,
							 &outbox_enable_test_hooks,
							 false,
							 PGC_POSTMASTER,
							 GUC_NOT_IN_SAMPLE,
							 NULL, NULL, NULL);
}
