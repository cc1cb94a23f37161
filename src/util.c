/*-------------------------------------------------------------------------
 *
 * util.c
 *	  Small helpers every part uses (util.h): the settings read across
 *	  modules, advisory lock tags, kept plans, column defaults, background
 *	  worker entries and their start (the configuration read once).
 *
 * The bottom of the module graph: calls nothing of the extension's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "parser/parse_relation.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "rewrite/rewriteHandler.h"
#include "utils/guc.h"
#include "utils/rel.h"
#include "utils/resowner.h"

#include "compat.h"
#include "shmem.h"
#include "util.h"

char	   *outbox_database = NULL;
char	   *outbox_role = NULL;
int			outbox_workers = 1;
bool		outbox_enable_test_hooks = false;
static int	outbox_test_start_delay_ms = 0;

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

	DefineCustomIntVariable("outbox.test_start_delay",
							"With outbox.enable_test_hooks: a publisher's start is delayed this long with reloads ignored (for tests only).",
							"As PostgreSQL ignores SIGHUP between a background worker's fork and its entry point.",
							&outbox_test_start_delay_ms,
							0, 0, 60 * 1000,
							PGC_POSTMASTER,
							GUC_NOT_IN_SAMPLE | GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/*
 * Fill in a background worker of this library that connects to a database:
 * function, type (also its name until the caller sets one) and restart time.
 */
void
outbox_bgworker_init(BackgroundWorker *worker, const char *function,
					 const char *type, int restart_time)
{
	memset(worker, 0, sizeof(*worker));
	worker->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker->bgw_restart_time = restart_time;
	strlcpy(worker->bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker->bgw_function_name, function, BGW_MAXLEN);
	strlcpy(worker->bgw_type, type, BGW_MAXLEN);
	strlcpy(worker->bgw_name, type, BGW_MAXLEN);
}

/*
 * Test hook (outbox.enable_test_hooks, outbox.test_start_delay): the
 * worker's start delayed with SIGHUP ignored, as PostgreSQL ignores it
 * from the worker's fork to its entry point; a reload signalled meanwhile
 * is lost, as one in that window is (outbox_reload_at_start's case).
 */
void
outbox_test_start_delay(void)
{
	if (!outbox_enable_test_hooks || outbox_test_start_delay_ms <= 0)
		return;
	pqsignal(SIGHUP, SIG_IGN);
	BackgroundWorkerUnblockSignals();
	ereport(LOG,
			(errmsg("outbox: test hook: %s start delayed by %d ms, reloads ignored",
					MyBgworkerEntry->bgw_type, outbox_test_start_delay_ms)));
	pg_usleep(outbox_test_start_delay_ms * 1000L);
	BackgroundWorkerBlockSignals();
}

/*
 * The configuration files read once as a worker starts, after its SIGHUP
 * handler is in place: PostgreSQL discards a reload signalled between the
 * worker's fork and its entry point (BackgroundWorkerMain() sets SIGHUP to
 * SIG_IGN), and a worker forked before the postmaster reloaded would keep
 * the older settings until the next reload.
 */
void
outbox_reload_at_start(void)
{
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
}

/*
 * fn(arg), or *failed if it raised an error or returned NULL: the error is
 * caught by a subtransaction and discarded.  For a parse or look-up whose
 * failure means "not there" where the server has no soft errors for it.
 */
Datum
outbox_call_catching(PGFunction fn, Datum arg, bool *failed)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile Datum result = (Datum) 0;
	volatile bool ok = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		LOCAL_FCINFO(fcinfo, 1);

		InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
		fcinfo->args[0].value = arg;
		fcinfo->args[0].isnull = false;
		result = fn(fcinfo);
		ok = !fcinfo->isnull;
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	*failed = !ok;
	return ok ? result : (Datum) 0;
}

/* Hash of an aggregate id key (a char *). */
static uint32
aggregate_hash(const void *key, Size keysize)
{
	const char *s = *(const char *const *) key;

	return hash_bytes((const unsigned char *) s, strlen(s));
}

/* Compare two aggregate id keys. */
static int
aggregate_match(const void *key1, const void *key2, Size keysize)
{
	return strcmp(*(const char *const *) key1, *(const char *const *) key2);
}

/* A hash table keyed by aggregate id (a char * as the entry's first field). */
HTAB *
outbox_aggregate_table(const char *name, Size entrysize, long nelem, MemoryContext cxt)
{
	HASHCTL		hctl;

	memset(&hctl, 0, sizeof(hctl));
	hctl.keysize = sizeof(char *);
	hctl.entrysize = entrysize;
	hctl.hash = aggregate_hash;
	hctl.match = aggregate_match;
	hctl.hcxt = cxt;
	return hash_create(name, nelem, &hctl,
					   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
}
