/*-------------------------------------------------------------------------
 *
 * inbox_worker.c
 *	  Inbox workers: apply the events of subscribed Kafka topics to
 *	  PostgreSQL through a handler function, exactly once, in order.
 *
 * A launcher, connected to no database, starts outbox.inbox_workers
 * dynamic workers once their database exists, and again when one exits;
 * with no single inbox database set, in every database the publishers
 * serve where something is subscribed.
 * Each subscription (table inbox_subscription) is a Kafka consumer group
 * of this cluster and database; every worker runs one librdkafka consumer
 * per subscription (src/inbox_consumer.c), so Kafka spreads the partitions
 * over the workers.  The position of record is the table inbox_offset,
 * written in the same transaction as the handlers' effects: on assignment
 * a worker starts each partition there (else at the topic's beginning), and a batch
 * locks the partitions' rows and ignores messages below the stored offset,
 * so a crash, a rebalance or a re-delivery never applies a message twice.
 * Offsets are committed to Kafka afterwards, for lag monitoring only.
 *
 * A batch is one transaction, which takes messages until
 * outbox.inbox_batch_time is used (the worker must poll within
 * max.poll.interval.ms to stay in its group); the rest stays in memory for
 * the next one.  It runs without subtransactions and, if anything fails,
 * again with one per message.  For each message: deduplicate by the
 * aggregate's last applied version (inbox_aggregate) and by the inbox
 * table (event_id header, else topic/partition/offset), then
 * call the handler as the role that subscribed, in a security-restricted
 * operation.  A failing handler stops its partition at that message, which
 * is retried with backoff (outbox.inbox_retry_backoff, doubling) and, after
 * outbox.inbox_max_attempts, blocked, dead-lettered or skipped
 * (outbox.inbox_poison_policy).  A version above the next expected one is a
 * gap: applied and counted, or blocked (outbox.inbox_gap_policy).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "access/htup_details.h"
#include "common/hashfn.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "common/jsonapi.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "access/heapam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_database.h"
#include "utils/fmgroids.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "compat.h"
#include "kafka.h"
#include "launcher.h"
#include "outbox.h"
#include "inbox_worker.h"
#include "inbox.h"

int			inbox_workers = 1;
char	   *inbox_database = NULL;
char	   *inbox_brokers = NULL;
char	   *inbox_kafka_properties = NULL;
int			inbox_batch_size = 1000;
int			inbox_batch_time_ms = 1000;
int			inbox_max_attempts = 5;
int			inbox_retry_backoff_ms = 1000;
int			inbox_poison_policy = POISON_BLOCK;
int			inbox_gap_policy = INBOX_GAP_APPLY;

/* Subscriptions are looked up again this often (and paused partitions). */
#define INBOX_REFRESH_MS 1000
/* Sleep while every consumer's queue is empty (a fetch sets no latch). */
#define INBOX_IDLE_WAIT_MS 20
/* Longest backoff of a failing handler, and of the worker after an error. */
#define INBOX_MAX_BACKOFF_MS (5 * 60 * 1000)
#define INBOX_ERROR_BACKOFF_MS 1000
/* Longest outbox.inbox_batch_time: an hour. */
#define INBOX_MAX_BATCH_TIME_MS (3600 * 1000)
/* Messages of a transaction's first chunk on the fast path (at most). */
#define INBOX_FIRST_CHUNK 16

static const struct config_enum_entry poison_options[] = {
	{"block", POISON_BLOCK, false},
	{"dead_letter", POISON_DEAD_LETTER, false},
	{"skip", POISON_SKIP, false},
	{NULL, 0, false}
};

static const struct config_enum_entry gap_options[] = {
	{"apply", INBOX_GAP_APPLY, false},
	{"block", INBOX_GAP_BLOCK, false},
	{NULL, 0, false}
};

/* A partition's row of inbox_offset, locked for the batch. */
typedef struct PartState
{
	char	   *topic;
	int32		partition;
	int64		next_offset;	/* -1: none stored yet */
	int			attempts;
	char	   *last_error;
	TimestampTz next_attempt_at;	/* 0: none */
	TimestampTz blocked_at;		/* 0: not blocked */
	char	   *blocked_reason;
	bool		accept_gap;
	bool		skip_requested;
	bool		stopped;		/* no more messages of it in this batch */
	bool		was_paused;		/* stopped before this batch */
	int64		stop_offset;
	int64		last_applied_offset;	/* -1: none in this batch */
	int64		applied,
				duplicates,
				gaps,
				errors,
				dead_lettered,
				skipped;
} PartState;

/* A message claimed and handled at the end of a batch (fast path). */
typedef struct PendingApply
{
	PartState  *ps;
	int64		offset;
	char	   *identity;
	Datum		message;
	bool		gap;
} PendingApply;

typedef struct PendingList
{
	PendingApply *items;
	int			n;
	HTAB	   *identities;		/* of every message of the batch taken */
} PendingList;

/* An aggregate's last applied version, cached for one batch. */
typedef struct InboxAggregate
{
	char	   *aggregate_id;	/* hash key: must be first */
	int64		last_version;	/* 0: none */
	bool		stored;			/* has a row, read at tid */
	ItemPointerData tid;
	bool		dirty;
} InboxAggregate;

/* The headers the publisher sets, parsed from one message. */
typedef struct MessageMeta
{
	char	   *event_id;
	char	   *event_type;
	char	   *aggregate_type;
	char	   *aggregate_id;
	int64		aggregate_version;	/* 0: none */
	Datum		headers;		/* jsonb, or 0 */
} MessageMeta;

static int	worker_index;
static MemoryContext subs_context = NULL;
static MemoryContext loop_context = NULL;
static List *subs = NIL;
static uint32 consumer_fingerprint = 0;
static bool consumer_configured = false;
static TimestampTz last_refresh = 0;
static char last_logged_error[256];

/* Kept plans, for the schema they were prepared in. */
static Oid	plans_nspid = InvalidOid;
static Oid	message_typid = InvalidOid;
static TupleDesc message_desc = NULL;
static SPIPlanPtr subs_plan,
			offset_lock_plan,
			offset_insert_plan,
			offset_update_plan,
			offset_read_plan,
			agg_read_plan,
			agg_flush_plan,
			agg_update_plan,
			claim_plan,
			claim_many_plan,
			dead_letter_plan,
			retention_plan;

/* When this worker last ran inbox retention. */
static TimestampTz last_retention = 0;

/* ---------- settings ---------- */

/* Define the outbox.inbox_* settings and, when preloading, the workers. */
void
inbox_worker_init(void)
{
	BackgroundWorker worker;

	DefineCustomStringVariable("outbox.inbox_brokers",
							   "Kafka bootstrap servers of the inbox workers (empty: outbox.brokers).",
							   NULL, &inbox_brokers, "",
							   PGC_SIGHUP, 0, NULL, NULL, NULL);
	inbox_consumer_settings_init();
	DefineCustomIntVariable("outbox.inbox_batch_size",
							"Most messages one inbox transaction applies.",
							NULL, &inbox_batch_size, 1000, 1, 100000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.inbox_batch_time",
							"Longest an inbox transaction goes on taking messages.",
							"Once it is used the transaction commits what it applied and the worker polls Kafka "
							"again; at most a third of the consumer's max.poll.interval.ms is used.",
							&inbox_batch_time_ms, 1000, 1, INBOX_MAX_BATCH_TIME_MS,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.inbox_max_attempts",
							"Attempts at a message whose handler fails before the poison policy applies.",
							NULL, &inbox_max_attempts, 5, 1, 1000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.inbox_retry_backoff",
							"Wait before the first retry of a failed handler; it doubles with each attempt.",
							NULL, &inbox_retry_backoff_ms, 1000, 10, INBOX_MAX_BACKOFF_MS,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomEnumVariable("outbox.inbox_poison_policy",
							 "What happens to a message whose handler keeps failing.",
							 "block: its partition stops there; dead_letter: it goes to table inbox_dead_letter; skip: it is dropped.",
							 &inbox_poison_policy, POISON_BLOCK, poison_options,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomEnumVariable("outbox.inbox_gap_policy",
							 "What happens to an event above the next expected version of its aggregate.",
							 "apply: it is applied and counted as a gap; block: its partition stops there until inbox_retry() or inbox_skip().",
							 &inbox_gap_policy, INBOX_GAP_APPLY, gap_options,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);

	/* The workers' own settings exist only where they can run. */
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("outbox.inbox_workers",
							"Number of inbox workers.",
							"0 disables the inbox workers; they idle while nothing is subscribed.",
							&inbox_workers, 1, 0, INBOX_MAX_WORKERS,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("outbox.inbox_database",
							   "Database whose inbox subscriptions the inbox workers serve (empty: outbox.database, else every served database with subscriptions).",
							   NULL, &inbox_database, "",
							   PGC_POSTMASTER, 0, NULL, NULL, NULL);

	if (inbox_workers == 0)
		return;
	outbox_bgworker_init(&worker, "inbox_launcher_main", "outbox inbox launcher", 5);
	RegisterBackgroundWorker(&worker);
}

/* ---------- the launcher ---------- */

/*
 * The inbox workers' one database: outbox.inbox_database, else
 * outbox.database; NULL when neither is set: then they run in every
 * database the publishers serve (see inbox_launch_everywhere).
 */
static const char *
inbox_target_database(void)
{
	if (inbox_database[0] != '\0')
		return inbox_database;
	return outbox_database[0] != '\0' ? outbox_database : NULL;
}

/* How long a database where nothing is subscribed is left without inbox workers. */
#define INBOX_RECHECK_MS (60 * 1000)

/* Start inbox worker i of publisher database entry e (main_arg: e + 1, i). */
static bool
start_database_inbox_worker(int e, int i, BackgroundWorkerHandle **handle)
{
	BackgroundWorker worker;

	outbox_bgworker_init(&worker, "inbox_worker_main", "outbox inbox worker", BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox inbox worker %d of %s", i,
			 NameStr(outbox_shared->databases[e].name));
	worker.bgw_main_arg = UInt32GetDatum(((uint32) (e + 1) << 16) | (uint32) i);
	worker.bgw_notify_pid = MyProcPid;
	return RegisterDynamicBackgroundWorker(&worker, handle);
}

/*
 * With no single inbox database set: run outbox.inbox_workers in every
 * database the publishers serve (has the extension, is not held by a
 * DROP/ALTER DATABASE).  A worker that finds nothing subscribed there
 * exits and marks the database idle for INBOX_RECHECK_MS.
 */
static void
inbox_launch_everywhere(void)
{
	static BackgroundWorkerHandle *handles[OUTBOX_MAX_DATABASES][INBOX_MAX_WORKERS];
	static TimestampTz next_start[OUTBOX_MAX_DATABASES][INBOX_MAX_WORKERS];
	static Oid	served[OUTBOX_MAX_DATABASES];
	TimestampTz now = GetCurrentTimestamp();

	/*
	 * Bumped by every inbox_subscribe() (or CREATE EXTENSION) commit: an
	 * idle mark made before it no longer holds, so every database is looked
	 * at again.
	 */
	uint32		generation = pg_atomic_read_u32(&outbox_shared->probe_generation);

	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
	{
		OutboxDatabase *db = &outbox_shared->databases[e];

		/* The entry went to another database: forget the old one's workers. */
		if (served[e] != db->dboid)
		{
			memset(next_start[e], 0, sizeof(next_start[e]));
			served[e] = db->dboid;
		}
		/* Idle, unless something was subscribed since the worker looked. */
		if (!OidIsValid(db->dboid) || db->state != ODB_SERVED || db->held_until > now ||
			(db->inbox_idle_until > now && db->inbox_idle_generation == generation))
			continue;
		for (int i = 0; i < inbox_workers; i++)
		{
			pid_t		pid;

			if (handles[e][i] != NULL &&
				GetBackgroundWorkerPid(handles[e][i], &pid) != BGWH_STOPPED)
				continue;
			if (now < next_start[e][i])
				continue;
			if (handles[e][i] != NULL)
				pfree(handles[e][i]);
			handles[e][i] = NULL;
			next_start[e][i] = TimestampTzPlusMilliseconds(now, 5000);
			if (!start_database_inbox_worker(e, i, &handles[e][i]))
			{
				ereport(LOG,
						(errmsg("outbox inbox launcher: no background worker slot for inbox worker %d of database \"%s\"",
								i, NameStr(db->name)),
						 errhint("Raise max_worker_processes.")));
				return;
			}
		}
	}
}

/*
 * Does the database exist?  Connected to no database, only shared catalogs
 * can be read, and only by a heap scan: an index scan may need to build
 * the index's relcache entry from pg_class (a fresh cluster has no cached
 * one), which fails outside a database.
 */
static bool
database_exists(const char *db)
{
	Relation	rel;
	ScanKeyData key;
	TableScanDesc scan;
	bool		exists;

	StartTransactionCommand();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_database_datname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum(db));
	scan = table_beginscan_catalog(rel, 1, &key);
	exists = HeapTupleIsValid(heap_getnext(scan, ForwardScanDirection));
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return exists;
}

/* Start inbox worker i; false if no background worker slot is free. */
static bool
start_inbox_worker(int i, BackgroundWorkerHandle **handle)
{
	BackgroundWorker worker;

	outbox_bgworker_init(&worker, "inbox_worker_main", "outbox inbox worker", BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox inbox worker %d", i);
	worker.bgw_main_arg = Int32GetDatum(i);
	worker.bgw_notify_pid = MyProcPid;
	return RegisterDynamicBackgroundWorker(&worker, handle);
}

/*
 * The launcher, connected to no database, starts the inbox workers once
 * their database exists and starts again any that exits.  A missing
 * database (say outbox.database is wrong) is logged once and costs a look
 * every few seconds, not a worker failing with FATAL every 5 s.
 */
void
inbox_launcher_main(Datum main_arg)
{
	const char *db = inbox_target_database();
	BackgroundWorkerHandle *handles[INBOX_MAX_WORKERS] = {0};

	TimestampTz next_start[INBOX_MAX_WORKERS] = {0};
	bool		logged_missing = false;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		bool		exists;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		if (db == NULL)
		{
			inbox_launch_everywhere();
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 1000, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			continue;
		}
		exists = database_exists(db);
		if (!exists && !logged_missing)
			ereport(LOG,
					(errmsg("outbox inbox launcher: database \"%s\" does not exist; waiting", db),
					 errhint("Set outbox.inbox_database (else outbox.database) to the consumers' database.")));
		logged_missing = !exists;
		for (int i = 0; exists && i < inbox_workers; i++)
		{
			pid_t		pid;

			if (handles[i] != NULL &&
				GetBackgroundWorkerPid(handles[i], &pid) != BGWH_STOPPED)
				continue;
			if (now < next_start[i])
				continue;
			/* A worker that stops is started again, at most every 5 s. */
			next_start[i] = TimestampTzPlusMilliseconds(now, 5000);
			if (!start_inbox_worker(i, &handles[i]))
				ereport(LOG,
						(errmsg("outbox inbox launcher: no background worker slot for inbox worker %d", i),
						 errhint("Raise max_worker_processes.")));
		}
		pgstat_report_activity(STATE_IDLE, NULL);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 exists ? 1000 : 5000, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* ---------- Kafka consumers (inbox_consumer.c) ---------- */

/* on_shmem_exit: close the consumers when stopped (static members stay in their groups). */
static void
inbox_worker_exit(int code, Datum arg)
{
	ListCell   *lc;

	foreach(lc, subs)
		inbox_consumer_destroy((InboxSub *) lfirst(lc));
}

/* ---------- plans ---------- */

/*
 * Find the extension and prepare the plans (again if it moved); false if it
 * is not installed.  Called inside a transaction, connected to SPI.
 */
static bool
prepare_plans(void)
{
	Oid			nspid;
	const char *s;
	Oid			t3[] = {TEXTOID, TEXTOID, INT4OID};
	Oid			t2[] = {TEXTOID, TEXTOID};
	Oid			tarr[] = {TEXTOID, TEXTARRAYOID};
	Oid			tflush[] = {TEXTOID, TEXTARRAYOID, INT8ARRAYOID};
	Oid			tupdagg[] = {TEXTOID, TIDARRAYOID, TEXTARRAYOID, INT8ARRAYOID};
	Oid			tupd[] = {TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, INT8OID,
		INT8OID, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID, INT4OID, TEXTOID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, BOOLOID, BOOLOID};
	Oid			tdl[4];
	bool		isnull;

	if (SPI_execute("SELECT e.extnamespace, n.nspname FROM pg_catalog.pg_extension e "
					"JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace "
					"WHERE e.extname OPERATOR(pg_catalog.=) 'outbox'", true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up the outbox extension");
	if (SPI_processed == 0)
		return false;
	nspid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 1, &isnull));
	if (nspid == plans_nspid)
		return true;
	s = quote_identifier(SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2));

	message_typid = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
									CStringGetDatum("inbox_message"),
									ObjectIdGetDatum(nspid));
	if (!OidIsValid(message_typid))
		elog(ERROR, "type inbox_message of the outbox extension is missing");
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		message_desc = lookup_rowtype_tupdesc_copy(message_typid, -1);
		MemoryContextSwitchTo(old);
	}

	subs_plan = outbox_keep_plan(psprintf(
								   "SELECT s.consumer, s.topics, s.topics::pg_catalog.text, s.handler::pg_catalog.oid, s.owner::pg_catalog.oid "
								   "FROM %s.inbox_subscription s ORDER BY s.consumer", s), 0, NULL);
	offset_lock_plan = outbox_keep_plan(psprintf(
										  "SELECT o.next_offset, o.attempts, o.last_error, o.next_attempt_at, "
										  "o.blocked_at, o.blocked_reason, o.accept_gap, o.skip_requested "
										  "FROM %s.inbox_offset o WHERE o.consumer OPERATOR(pg_catalog.=) $1 "
										  "AND o.topic OPERATOR(pg_catalog.=) $2 "
										  "AND o.\"partition\" OPERATOR(pg_catalog.=) $3 FOR UPDATE", s), 3, t3);
	offset_insert_plan = outbox_keep_plan(psprintf(
											"INSERT INTO %s.inbox_offset (consumer, topic, \"partition\") "
											"VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", s), 3, t3);
	offset_read_plan = outbox_keep_plan(psprintf(
										  "SELECT o.next_offset, o.blocked_at IS NULL AND "
										  "(o.next_attempt_at IS NULL OR o.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()) "
										  "FROM %s.inbox_offset o WHERE o.consumer OPERATOR(pg_catalog.=) $1 "
										  "AND o.topic OPERATOR(pg_catalog.=) $2 "
										  "AND o.\"partition\" OPERATOR(pg_catalog.=) $3", s), 3, t3);
	offset_update_plan = outbox_keep_plan(psprintf(
											"UPDATE %s.inbox_offset o SET next_offset = $4, high_watermark = $5, "
											"last_applied_offset = coalesce($6, o.last_applied_offset), "
											"last_applied_at = CASE WHEN $6 IS NULL THEN o.last_applied_at ELSE pg_catalog.clock_timestamp() END, "
											"applied = o.applied OPERATOR(pg_catalog.+) $7, "
											"duplicates = o.duplicates OPERATOR(pg_catalog.+) $8, "
											"gaps = o.gaps OPERATOR(pg_catalog.+) $9, "
											"errors = o.errors OPERATOR(pg_catalog.+) $10, "
											"dead_lettered = o.dead_lettered OPERATOR(pg_catalog.+) $11, "
											"skipped = o.skipped OPERATOR(pg_catalog.+) $12, attempts = $13, last_error = $14, "
											"next_attempt_at = $15, blocked_at = $16, blocked_reason = $17, "
											"accept_gap = $18, skip_requested = $19, updated_at = pg_catalog.clock_timestamp() "
											"WHERE o.consumer OPERATOR(pg_catalog.=) $1 AND o.topic OPERATOR(pg_catalog.=) $2 "
											"AND o.\"partition\" OPERATOR(pg_catalog.=) $3",
											s), lengthof(tupd), tupd);
	agg_read_plan = outbox_keep_plan(psprintf(
									   "SELECT a.aggregate_id, a.last_version, a.ctid FROM %s.inbox_aggregate a "
									   "WHERE a.consumer OPERATOR(pg_catalog.=) $1 "
									   "AND a.aggregate_id OPERATOR(pg_catalog.=) ANY ($2)", s), 2, tarr);

	/*
	 * The rows just read, updated where they are: a nested loop of TID
	 * scans in the arrays' order (the lock order), whatever their size, so
	 * the generic plan.  A row updated meanwhile is followed to its new
	 * version, or not returned (then upserted).
	 */
	agg_update_plan = SPI_prepare_cursor(psprintf(
												  "UPDATE %s.inbox_aggregate a SET last_version = GREATEST(a.last_version, u.v), "
												  "updated_at = pg_catalog.clock_timestamp() "
												  "FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4)) AS u(t, id, v) "
												  "WHERE a.ctid OPERATOR(pg_catalog.=) u.t AND a.consumer OPERATOR(pg_catalog.=) $1 "
												  "AND a.aggregate_id OPERATOR(pg_catalog.=) u.id "
												  "RETURNING a.aggregate_id", s),
										 lengthof(tupdagg), tupdagg, CURSOR_OPT_GENERIC_PLAN);
	if (agg_update_plan == NULL)
		elog(ERROR, "SPI_prepare_cursor failed: %s", SPI_result_code_string(SPI_result));
	SPI_keepplan(agg_update_plan);
	/*
	 * No ON CONFLICT: the version check has dropped the duplicates of
	 * published events, those within the batch are dropped before, and a
	 * plain insert descends the index once, not twice.  A claim already
	 * there is a unique violation, which sends the batch to the careful
	 * path (claim_plan, one by one).
	 */
	claim_many_plan = outbox_keep_plan(psprintf(
										 "INSERT INTO %s.inbox (consumer, event_id) "
										 "SELECT $1, u.id FROM pg_catalog.unnest($2) AS u(id)", s), 2, tarr);
	agg_flush_plan = outbox_keep_plan(psprintf(
										"INSERT INTO %s.inbox_aggregate AS a (consumer, aggregate_id, last_version) "
										"SELECT $1, u.id, u.v FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS u(id, v) "
										"ON CONFLICT (consumer, aggregate_id) DO UPDATE SET "
										"last_version = GREATEST(a.last_version, excluded.last_version), "
										"updated_at = pg_catalog.clock_timestamp()", s), 3, tflush);
	claim_plan = outbox_keep_plan(psprintf(
									"INSERT INTO %s.inbox (consumer, event_id) VALUES ($1, $2) "
									"ON CONFLICT DO NOTHING", s), 2, t2);
	tdl[0] = TEXTOID;
	tdl[1] = message_typid;
	tdl[2] = TEXTOID;
	tdl[3] = INT4OID;
	dead_letter_plan = outbox_keep_plan(psprintf(
										  "INSERT INTO %s.inbox_dead_letter (consumer, message, error, attempts) "
										  "VALUES ($1, $2, $3, $4)", s), 4, tdl);
	retention_plan = inbox_retention_prepare(s);
	inbox_state_prepare(s, worker_index);
	plans_nspid = nspid;
	return true;
}

/* ---------- retention ---------- */

/*
 * The inbox retention statement for the extension in schema s (quoted),
 * kept; run by inbox_retention_delete().  The publisher's retention uses it
 * too.  It skips rows locked by others: never waiting, it cannot deadlock.
 */
SPIPlanPtr
inbox_retention_prepare(const char *s)
{
	Oid			types[2] = {INT4OID, INT4OID};

	return outbox_keep_plan(psprintf("DELETE FROM %s.inbox i USING ("
									 "SELECT consumer, event_id FROM %s.inbox "
									 "WHERE processed_at OPERATOR(pg_catalog.<) "
									 "(pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => $1)) "
									 "ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED) x "
									 "WHERE i.consumer OPERATOR(pg_catalog.=) x.consumer "
									 "AND i.event_id OPERATOR(pg_catalog.=) x.event_id", s, s),
							2, types);
}

/*
 * Delete up to outbox.retention_batch inbox claims older than
 * outbox.inbox_retention with a plan of inbox_retention_prepare(); returns
 * how many.  In a transaction, connected to SPI.
 */
uint64
inbox_retention_delete(SPIPlanPtr plan)
{
	Datum		args[2];

	args[0] = Int32GetDatum(outbox_inbox_retention_s);
	args[1] = Int32GetDatum(outbox_retention_batch);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "inbox retention failed");
	return SPI_processed;
}

/* ---------- subscriptions ---------- */

/*
 * Why a subscription cannot run (NULL if it can); checked at each refresh,
 * so that a role or handler changed since inbox_subscribe() (its owner, a
 * revoked privilege) or a topic outbox.inbox_allowed_topics no longer
 * allows stops it.
 */
static const char *
subscription_problem(Oid owner, Oid handler, ArrayType *topics)
{
	Datum	   *elems;
	int			n;
	InboxHandlerProblem problem;

	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(owner)))
		return "its role no longer exists";
	if (superuser_arg(owner))
		return "its role is a superuser: handlers never run as one";
	problem = inbox_handler_problem(handler, owner);
	if (problem != HANDLER_OK)
		return inbox_handler_problem_text(problem);
	deconstruct_array(topics, TEXTOID, -1, false, TYPALIGN_INT, &elems, NULL, &n);
	for (int i = 0; i < n; i++)
	{
		const char *topic = TextDatumGetCString(elems[i]);
		const char *why = inbox_topic_problem(topic);

		if (why != NULL)
			return psprintf("topic \"%s\" may not be subscribed to: %s", topic, why);
	}
	return NULL;
}

/* This worker's state of a subscription, or NULL. */
static InboxSub *
find_sub(const char *consumer)
{
	ListCell   *lc;

	foreach(lc, subs)
	{
		InboxSub   *sub = lfirst(lc);

		if (strcmp(sub->consumer, consumer) == 0)
			return sub;
	}
	return NULL;
}

/*
 * Bring the consumers in line with inbox_subscription: join the groups of
 * new subscriptions, leave those of removed ones, subscribe to changed
 * topics (a changed handler or role needs nothing of Kafka).  In a
 * transaction; false if the extension is not installed.
 */
static bool
refresh_subscriptions(void)
{
	ListCell   *lc;
	MemoryContext old;

	if (!prepare_plans())
		return false;
	if (SPI_execute_plan(subs_plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read inbox subscriptions");

	foreach(lc, subs)
		((InboxSub *) lfirst(lc))->seen = false;
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *consumer = SPI_getvalue(tup, desc, 1);
		char	   *topics = SPI_getvalue(tup, desc, 3);
		Oid			handler = DatumGetObjectId(SPI_getbinval(tup, desc, 4, &isnull));
		Oid			owner = DatumGetObjectId(SPI_getbinval(tup, desc, 5, &isnull));
		InboxSub   *sub = find_sub(consumer);
		ArrayType  *topic_array = DatumGetArrayTypeP(SPI_getbinval(tup, desc, 2, &isnull));
		const char *problem = subscription_problem(owner, handler, topic_array);

		if (sub != NULL)
		{
			/* A new handler or role needs no new consumer: nothing to rejoin. */
			sub->handler = handler;
			sub->owner = owner;
			if (strcmp(sub->topics, topics) != 0)
				inbox_consumer_resubscribe(sub, topic_array, topics);
		}
		if (sub == NULL)
		{
			old = MemoryContextSwitchTo(subs_context);
			sub = palloc0(sizeof(InboxSub));
			sub->consumer = pstrdup(consumer);
			sub->topics = pstrdup(topics);
			sub->handler = handler;
			sub->owner = owner;
			sub->usable = true;
			subs = lappend(subs, sub);
			MemoryContextSwitchTo(old);
		}
		sub->seen = true;
		if ((problem != NULL) == sub->usable)
		{
			if (problem)
				ereport(WARNING,
						(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
						 errmsg("outbox inbox: subscription \"%s\" is not applied: %s",
								consumer, problem),
						 errhint("Subscribe again as a role that owns and may execute the handler, to allowed topics.")));
			sub->usable = (problem == NULL);
		}
		if (!sub->usable)
			inbox_consumer_destroy(sub);
		else if (sub->rk == NULL)
			inbox_consumer_create(sub, topic_array, worker_index);
	}
	foreach(lc, subs)
	{
		InboxSub   *sub = lfirst(lc);

		if (!sub->seen)
		{
			ereport(LOG, (errmsg("outbox inbox worker %d: consumer \"%s\" unsubscribed",
								 worker_index, sub->consumer)));
			inbox_consumer_destroy(sub);
			subs = foreach_delete_current(subs, lc);
		}
	}
	return true;
}

/* Assign what the group gave us, each partition at its stored offset. */
static void
apply_assignment(InboxSub *sub)
{
	rd_kafka_topic_partition_list_t *parts = sub->pending_assign;
	rd_kafka_resp_err_t err;

	for (int i = 0; i < parts->cnt; i++)
	{
		Datum		args[3];
		bool		isnull = true;
		Datum		d = (Datum) 0;

		args[0] = CStringGetTextDatum(sub->consumer);
		args[1] = CStringGetTextDatum(parts->elems[i].topic);
		args[2] = Int32GetDatum(parts->elems[i].partition);
		if (SPI_execute_plan(offset_read_plan, args, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read stored inbox offsets");
		if (SPI_processed == 1)
			d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		/*
		 * Nothing stored: the beginning of the topic, never the offset a
		 * group member committed (the subscription's start is ours alone).
		 */
		parts->elems[i].offset = isnull ? RD_KAFKA_OFFSET_BEGINNING : DatumGetInt64(d);
	}
	sub->pending_assign = NULL;
	err = rd_kafka_assign(sub->rk, parts);
	rd_kafka_topic_partition_list_destroy(parts);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("outbox inbox: could not assign partitions of consumer \"%s\": %s",
						sub->consumer, rd_kafka_err2str(err))));
	elog(DEBUG1, "outbox inbox worker %d: consumer \"%s\" assigned %d partitions",
		 worker_index, sub->consumer, parts->cnt);
}

/* Resume paused partitions whose wait is over, at their stored offsets. */
static void
resume_partitions(InboxSub *sub, TimestampTz now)
{
	ListCell   *lc;

	foreach(lc, sub->paused)
	{
		PausedPartition *pp = lfirst(lc);
		Datum		args[3];
		bool		isnull;
		bool		ready;
		int64		offset;
		rd_kafka_topic_partition_list_t *tl;
		rd_kafka_error_t *error;

		if (pp->resume_at > now)
			continue;
		args[0] = CStringGetTextDatum(sub->consumer);
		args[1] = CStringGetTextDatum(pp->topic);
		args[2] = Int32GetDatum(pp->partition);
		if (SPI_execute_plan(offset_read_plan, args, NULL, true, 1) != SPI_OK_SELECT ||
			SPI_processed != 1)
			elog(ERROR, "could not read the stored offset of a paused partition");
		offset = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		ready = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
		if (!ready)
		{
			/* Blocked (or backing off longer): look again later. */
			pp->resume_at = TimestampTzPlusMilliseconds(now, INBOX_REFRESH_MS);
			continue;
		}
		tl = rd_kafka_topic_partition_list_new(1);
		rd_kafka_topic_partition_list_add(tl, pp->topic, pp->partition)->offset = offset;
		error = rd_kafka_seek_partitions(sub->rk, tl, 0);
		if (error != NULL)
		{
			elog(DEBUG1, "outbox inbox: seek failed: %s", rd_kafka_error_string(error));
			rd_kafka_error_destroy(error);
		}
		rd_kafka_resume_partitions(sub->rk, tl);
		rd_kafka_topic_partition_list_destroy(tl);
		pfree(pp->topic);
		pfree(pp);
		sub->paused = foreach_delete_current(sub->paused, lc);
	}
}

/* ---------- messages ---------- */

/* A header value as text, or NULL if it is not valid text. */
static char *
header_text(const void *value, size_t size)
{
	if (value == NULL || memchr(value, '\0', size) != NULL ||
		!pg_verifymbstr((const char *) value, (int) size, true))
		return NULL;
	return pnstrdup((const char *) value, size);
}

/* A jsonb string value (or null) of the header object being built. */
static void
push_jsonb_text(JsonbParseState **state, JsonbIteratorToken token, char *text)
{
	JsonbValue	v;

	v.type = text ? jbvString : jbvNull;
	if (text)
	{
		v.val.string.val = text;
		v.val.string.len = strlen(text);
	}
	(void) pushJsonbValue(state, token, &v);
}

/*
 * The message's headers as jsonb (built directly, not printed and parsed:
 * the same object, a repeated name keeping its last value), and the ones
 * the publisher sets.
 */
static void
parse_headers(const rd_kafka_message_t *m, MessageMeta *meta)
{
	rd_kafka_headers_t *hdrs = NULL;
	JsonbParseState *state = NULL;
	const char *name;
	const void *value;
	size_t		size;

	memset(meta, 0, sizeof(*meta));
	if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return;
	(void) pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; i++)
	{
		char	   *v = header_text(value, size);

		if (!pg_verifymbstr(name, strlen(name), true))
			continue;
		push_jsonb_text(&state, WJB_KEY, pstrdup(name));
		push_jsonb_text(&state, WJB_VALUE, v);
		if (v == NULL)
			continue;
		if (strcmp(name, "event_id") == 0 && v[0] != '\0')
			meta->event_id = v;
		else if (strcmp(name, "event_type") == 0)
			meta->event_type = v;
		else if (strcmp(name, "aggregate_type") == 0)
			meta->aggregate_type = v;
		else if (strcmp(name, "aggregate_id") == 0 && v[0] != '\0')
			meta->aggregate_id = v;
		else if (strcmp(name, "aggregate_version") == 0)
		{
			char	   *end;
			long long	ver = strtoll(v, &end, 10);

			if (*end == '\0' && ver > 0)
				meta->aggregate_version = ver;
		}
	}
	meta->headers = JsonbPGetDatum(JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL)));
}

/*
 * The payload as jsonb if it is JSON text jsonb accepts, else 0.  On the
 * fast path an object or array (what the publisher sends) is parsed once,
 * by jsonb_in: if it is not JSON after all, the error sends the batch to the
 * careful path, which checks first.
 */
static Datum
payload_jsonb(const rd_kafka_message_t *m, bool careful)
{
	char	   *text = header_text(m->payload, m->len);
	JsonLexContext *lex;
	bool		ok;
	const char *p;

	if (text == NULL || m->payload == NULL)
		return (Datum) 0;
	for (p = text; *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'; p++)
		;
	if (!careful && (*p == '{' || *p == '['))
		return DirectFunctionCall1(jsonb_in, CStringGetDatum(text));
	lex = outbox_json_lexer(text, strlen(text), GetDatabaseEncoding());
	ok = (pg_parse_json(lex, &nullSemAction) == JSON_SUCCESS);
	if (!ok)
		return (Datum) 0;
	return outbox_jsonb_or_null(text, careful);
}

/* The inbox_message composite handed to the handler. */
static Datum
message_datum(InboxSub *sub, const rd_kafka_message_t *m, MessageMeta *meta,
			  bool careful)
{
	Datum		values[14];
	bool		nulls[14];
	rd_kafka_timestamp_type_t tstype;
	int64		ts = rd_kafka_message_timestamp(m, &tstype);
	char	   *key = m->key ? header_text(m->key, m->key_len) : NULL;
	Datum		payload = payload_jsonb(m, careful);
	bytea	   *bytes = NULL;

	memset(nulls, 0, sizeof(nulls));
	values[0] = CStringGetTextDatum(sub->consumer);
	values[1] = CStringGetTextDatum(rd_kafka_topic_name(m->rkt));
	values[2] = Int32GetDatum(m->partition);
	values[3] = Int64GetDatum(m->offset);
#define TEXT_OR_NULL(i, s) ((s) ? (values[i] = CStringGetTextDatum(s)) : (nulls[i] = true, (Datum) 0))
	TEXT_OR_NULL(4, key);
	TEXT_OR_NULL(5, meta->event_id);
	TEXT_OR_NULL(6, meta->event_type);
	TEXT_OR_NULL(7, meta->aggregate_type);
	TEXT_OR_NULL(8, meta->aggregate_id);
#undef TEXT_OR_NULL
	values[9] = Int64GetDatum(meta->aggregate_version);
	nulls[9] = meta->aggregate_version == 0;
	values[10] = meta->headers;
	nulls[10] = meta->headers == (Datum) 0;
	values[11] = payload;
	nulls[11] = payload == (Datum) 0;
	if (m->payload != NULL)
	{
		bytes = palloc(VARHDRSZ + m->len);
		SET_VARSIZE(bytes, VARHDRSZ + m->len);
		memcpy(VARDATA(bytes), m->payload, m->len);
		values[12] = PointerGetDatum(bytes);
	}
	nulls[12] = bytes == NULL;
	/* Milliseconds since the Unix epoch to microseconds since 2000. */
	values[13] = TimestampTzGetDatum(ts * 1000 -
									 (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY);
	nulls[13] = ts < 0;
	/* heap_form_tuple has filled in the composite's header: no copy. */
	return HeapTupleGetDatum(heap_form_tuple(message_desc, values, nulls));
}

/* ---------- one batch ---------- */

static void end_step(void);

/* Hash of an InboxAggregate key (a char * to the aggregate id). */
static uint32
agg_hash(const void *key, Size keysize)
{
	const char *s = *(const char *const *) key;

	return hash_bytes((const unsigned char *) s, strlen(s));
}

/* Key comparison of the aggregate-id-keyed tables. */
static int
agg_match(const void *key1, const void *key2, Size keysize)
{
	return strcmp(*(const char *const *) key1, *(const char *const *) key2);
}

/*
 * Read the last versions of every aggregate the batch's messages name, in
 * one statement, into the batch's cache.
 */
static void
load_aggregates(HTAB *aggs, InboxSub *sub, MessageMeta *metas, int n)
{
	Datum	   *ids = palloc(sizeof(Datum) * Max(n, 1));
	int			k = 0;
	Datum		args[2];

	for (int i = 0; i < n; i++)
	{
		char	   *key = metas[i].aggregate_id;
		bool		found;
		InboxAggregate *a;

		if (key == NULL || metas[i].aggregate_version <= 0)
			continue;
		a = hash_search(aggs, &key, HASH_ENTER, &found);
		if (found)
			continue;
		a->aggregate_id = key;
		a->last_version = 0;
		a->stored = false;
		a->dirty = false;
		ids[k++] = CStringGetTextDatum(key);
	}
	if (k == 0)
		return;
	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = PointerGetDatum(construct_array(ids, k, TEXTOID, -1, false, TYPALIGN_INT));
	if (SPI_execute_plan(agg_read_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read inbox aggregate versions");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char	   *key = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		bool		isnull;
		InboxAggregate *a = hash_search(aggs, &key, HASH_FIND, NULL);

		if (a == NULL)
			continue;
		a->last_version = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
													  SPI_tuptable->tupdesc, 2, &isnull));
		a->tid = *(ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[i],
															  SPI_tuptable->tupdesc, 3, &isnull));
		a->stored = true;
	}
}

/* The cached version state of an aggregate (loaded by load_aggregates). */
static InboxAggregate *
aggregate_state(HTAB *aggs, const char *aggregate_id)
{
	char	   *key = (char *) aggregate_id;
	InboxAggregate *a = hash_search(aggs, &key, HASH_FIND, NULL);

	if (a == NULL)
		elog(ERROR, "inbox batch lost track of aggregate \"%s\"", aggregate_id);
	return a;
}

/* Record a disposed-of event as claimed, so a replay of it is a duplicate. */
static void
claim(InboxSub *sub, const char *identity, bool *claimed)
{
	Datum		args[2];

	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = CStringGetTextDatum(identity);
	if (SPI_execute_plan(claim_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "inbox claim failed");
	if (claimed)
		*claimed = SPI_processed == 1;
}

/*
 * Release the session-level advisory locks a handler took: they would
 * outlive its call (even a failed one: a subtransaction's abort keeps them)
 * and hold other sessions out in the handler's name.  The worker takes none.
 */
static void
forget_session_locks(void)
{
	LockReleaseSession(USER_LOCKMETHOD);
}

/*
 * Call the handler the way PostgreSQL runs untrusted code as another role
 * (the apply worker's switch to a table owner): as the subscription's role,
 * in a security-restricted operation (no SET ROLE, temporary objects,
 * PREPARE, LISTEN or held cursors), at a GUC nest level of its own that is
 * rolled back afterwards, so no setting it changes, even at session level
 * (search_path above all), reaches the worker's statements or the next
 * handler; session advisory locks it took are released.  On error the
 * (sub)transaction's abort restores the user and the settings.
 */
static void
call_handler(InboxSub *sub, FmgrInfo *flinfo, Datum message)
{
	Oid			save_userid;
	int			save_sec;
	int			save_nestlevel;
	LOCAL_FCINFO(fcinfo, 1);

	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(sub->owner, save_sec | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();
	InitFunctionCallInfoData(*fcinfo, flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = message;
	fcinfo->args[0].isnull = false;
	(void) FunctionCallInvoke(fcinfo);
	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec);
	forget_session_locks();
}

/* Stop a partition at a message for the rest of the batch. */
static void
stop_partition(PartState *ps, int64 offset)
{
	ps->stopped = true;
	ps->stop_offset = offset;
}

/* The message is done with: the partition moves past it. */
static void
advance(PartState *ps, const rd_kafka_message_t *m)
{
	ps->next_offset = m->offset + 1;
}

/* A failed handler: back off, or apply the poison policy. */
static void
handler_failed(InboxSub *sub, PartState *ps, const rd_kafka_message_t *m,
			   Datum message, InboxAggregate *agg, int64 version,
			   const char *identity, const char *error)
{
	ps->errors++;
	ps->attempts++;
	ps->last_error = pstrdup(error);
	if (ps->attempts < inbox_max_attempts)
	{
		int64		wait = Min((int64) inbox_retry_backoff_ms << Min(ps->attempts - 1, 20),
							   INBOX_MAX_BACKOFF_MS);

		/* The first failure at a message is logged; the block, if any, too. */
		if (ps->attempts == 1)
			ereport(LOG,
					(errmsg("outbox inbox: consumer \"%s\": handler failed at offset %lld of partition %d of topic \"%s\"; retrying in %lld ms",
							sub->consumer, (long long) m->offset, m->partition, ps->topic,
							(long long) wait),
					 errdetail_internal("%s", error),
					 errhint("After %d attempts outbox.inbox_poison_policy (%s) applies.",
							 inbox_max_attempts, GetConfigOption("outbox.inbox_poison_policy", false, false))));
		ps->next_attempt_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait);
		stop_partition(ps, m->offset);
		return;
	}
	switch ((PoisonPolicy) inbox_poison_policy)
	{
		case POISON_BLOCK:
			ps->blocked_at = GetCurrentTimestamp();
			ps->blocked_reason = psprintf("handler failed %d times", ps->attempts);
			ps->next_attempt_at = 0;
			stop_partition(ps, m->offset);
			ereport(LOG,
					(errmsg("outbox inbox: consumer \"%s\" blocked at offset %lld of partition %d of topic \"%s\"",
							sub->consumer, (long long) m->offset, m->partition, ps->topic),
					 errdetail_internal("%s", error),
					 errhint("Fix the handler, then call inbox_retry() or inbox_skip().")));
			return;
		case POISON_DEAD_LETTER:
			{
				Datum		args[4];

				args[0] = CStringGetTextDatum(sub->consumer);
				args[1] = message;
				args[2] = CStringGetTextDatum(error);
				args[3] = Int32GetDatum(ps->attempts);
				if (SPI_execute_plan(dead_letter_plan, args, NULL, false, 0) != SPI_OK_INSERT)
					elog(ERROR, "could not insert an inbox dead letter");
				ps->dead_lettered++;
				break;
			}
		case POISON_SKIP:
			ps->skipped++;
			break;
	}
	claim(sub, identity, NULL);
	if (agg != NULL && version > agg->last_version)
	{
		agg->last_version = version;
		agg->dirty = true;
	}
	ps->attempts = 0;
	ps->next_attempt_at = 0;
	advance(ps, m);
}

/* What the inbox deduplicates on: event_id, else topic/partition/offset. */
static char *
message_identity(PartState *ps, const rd_kafka_message_t *m, MessageMeta *meta)
{
	if (meta->event_id)
		return meta->event_id;
	return psprintf("%s/%d/%lld", ps->topic, m->partition, (long long) m->offset);
}

/*
 * Drop the message an operator skipped (inbox_skip): claimed and its version
 * recorded like one skipped by the policy, so neither a replay nor the next
 * version of its aggregate sees a hole.
 */
static void
skip_message(InboxSub *sub, PartState *ps, HTAB *aggs, const rd_kafka_message_t *m,
			 MessageMeta *meta)
{
	claim(sub, message_identity(ps, m, meta), NULL);
	if (meta->aggregate_id && meta->aggregate_version > 0)
	{
		InboxAggregate *agg = aggregate_state(aggs, meta->aggregate_id);

		if (meta->aggregate_version > agg->last_version)
		{
			agg->last_version = meta->aggregate_version;
			agg->dirty = true;
		}
	}
	ps->skip_requested = false;
	ps->skipped++;
	advance(ps, m);
}

/*
 * Claim the message and, if it is new, run the handler, in a subtransaction
 * (the careful path).  Returns the error message of a failure, NULL on
 * success.
 */
static char *
claim_and_handle(InboxSub *sub, FmgrInfo *flinfo, const char *identity,
				 Datum message, bool *claimed)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	char	   *volatile error = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		claim(sub, identity, claimed);
		if (*claimed)
			call_handler(sub, flinfo, message);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		forget_session_locks();
		error = edata->message;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return error;
}

/*
 * Claim the pending messages (one chunk) in one statement, then run their
 * handlers in message order (so per partition in offset order).  An error
 * aborts the batch, which is then applied again carefully.
 */
static void
apply_pending(InboxSub *sub, FmgrInfo *flinfo, PendingList *pending)
{
	Datum	   *ids;
	Datum		args[2];
	TimestampTz start = GetCurrentTimestamp();

	if (pending->n == 0)
		return;
	ids = palloc(sizeof(Datum) * pending->n);
	for (int i = 0; i < pending->n; i++)
		ids[i] = CStringGetTextDatum(pending->items[i].identity);
	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = PointerGetDatum(construct_array(ids, pending->n, TEXTOID, -1, false, TYPALIGN_INT));
	if (SPI_execute_plan(claim_many_plan, args, NULL, false, 0) != SPI_OK_INSERT ||
		SPI_processed != (uint64) pending->n)
		elog(ERROR, "inbox claim failed");

	for (int i = 0; i < pending->n; i++)
	{
		PendingApply *pa = &pending->items[i];

		CHECK_FOR_INTERRUPTS();
		call_handler(sub, flinfo, pa->message);
		pa->ps->applied++;
		pa->ps->gaps += pa->gap ? 1 : 0;
		pa->ps->last_applied_offset = Max(pa->ps->last_applied_offset, pa->offset);
	}
	/* What a message costs, to size the next chunk. */
	sub->msg_cost_us = (double) (GetCurrentTimestamp() - start) / pending->n;
	pending->n = 0;
}

/*
 * Apply one message at the partition's next offset.  With a pending list
 * (fast path) the claim and the handler are deferred to apply_pending(),
 * and the message is taken as applied; an error there aborts the batch.
 */
static void
apply_message(InboxSub *sub, PartState *ps, HTAB *aggs, FmgrInfo *flinfo,
			  const rd_kafka_message_t *m, MessageMeta *meta, PendingList *pending)
{
	InboxAggregate *agg = NULL;
	char	   *identity;
	bool		gap = false;
	bool		claimed = false;
	Datum		message;
	char	   *error;

	identity = message_identity(ps, m, meta);
	if (meta->aggregate_id && meta->aggregate_version > 0)
	{
		agg = aggregate_state(aggs, meta->aggregate_id);
		if (meta->aggregate_version <= agg->last_version)
		{
			ps->duplicates++;
			advance(ps, m);
			return;
		}
		gap = meta->aggregate_version > agg->last_version + 1;
		if (gap && inbox_gap_policy == INBOX_GAP_BLOCK && !ps->accept_gap)
		{
			ps->blocked_at = GetCurrentTimestamp();
			ps->blocked_reason = psprintf("gap: aggregate \"%s\" expected version %lld, got %lld",
										  meta->aggregate_id, (long long) agg->last_version + 1,
										  (long long) meta->aggregate_version);
			stop_partition(ps, m->offset);
			return;
		}
	}
	if (pending != NULL)
	{
		bool		dup;

		/* An event twice in the batch: its first copy is the one applied. */
		(void) hash_search(pending->identities, &identity, HASH_ENTER, &dup);
		if (dup)
			ps->duplicates++;
		else
		{
			PendingApply *pa = &pending->items[pending->n++];

			pa->ps = ps;
			pa->offset = m->offset;
			pa->identity = identity;
			pa->message = message_datum(sub, m, meta, false);
			pa->gap = gap;
			ps->accept_gap &= !gap;
		}
	}
	else
	{
		message = message_datum(sub, m, meta, true);
		error = claim_and_handle(sub, flinfo, identity, message, &claimed);
		if (error != NULL)
		{
			handler_failed(sub, ps, m, message, agg, meta->aggregate_version, identity, error);
			return;
		}
		if (!claimed)
			ps->duplicates++;
		else
		{
			ps->applied++;
			ps->gaps += gap ? 1 : 0;
			ps->last_applied_offset = m->offset;
			ps->accept_gap = false;
		}
	}
	ps->attempts = 0;
	ps->next_attempt_at = 0;
	if (agg != NULL && meta->aggregate_version > agg->last_version)
	{
		agg->last_version = meta->aggregate_version;
		agg->dirty = true;
	}
	advance(ps, m);
}

/* Lock (creating if need be) a partition's row and load its state. */
static void
lock_partition(InboxSub *sub, PartState *ps)
{
	Datum		args[3];
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = CStringGetTextDatum(ps->topic);
	args[2] = Int32GetDatum(ps->partition);
	for (int tries = 0;; tries++)
	{
		if (SPI_execute_plan(offset_lock_plan, args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not lock an inbox partition");
		if (SPI_processed == 1 || tries > 0)
			break;
		if (SPI_execute_plan(offset_insert_plan, args, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not create an inbox partition");
	}
	if (SPI_processed != 1)
		elog(ERROR, "inbox partition row vanished");
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	d = SPI_getbinval(tup, desc, 1, &isnull);
	ps->next_offset = isnull ? -1 : DatumGetInt64(d);
	ps->attempts = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
	ps->last_error = SPI_getvalue(tup, desc, 3);
	d = SPI_getbinval(tup, desc, 4, &isnull);
	ps->next_attempt_at = isnull ? 0 : DatumGetTimestampTz(d);
	d = SPI_getbinval(tup, desc, 5, &isnull);
	ps->blocked_at = isnull ? 0 : DatumGetTimestampTz(d);
	ps->blocked_reason = SPI_getvalue(tup, desc, 6);
	ps->accept_gap = DatumGetBool(SPI_getbinval(tup, desc, 7, &isnull));
	ps->skip_requested = DatumGetBool(SPI_getbinval(tup, desc, 8, &isnull));
	ps->last_applied_offset = -1;
}

/* Write a partition's new state, in the batch's transaction. */
static void
save_partition(InboxSub *sub, PartState *ps)
{
	Datum		v[19];
	char		n[19];
	int64		lo,
				hi;

	memset(n, ' ', sizeof(n));
	v[0] = CStringGetTextDatum(sub->consumer);
	v[1] = CStringGetTextDatum(ps->topic);
	v[2] = Int32GetDatum(ps->partition);
	v[3] = Int64GetDatum(ps->next_offset);
	n[3] = ps->next_offset < 0 ? 'n' : ' ';
	/* Cached from fetch responses: no round trip. */
	if (rd_kafka_get_watermark_offsets(sub->rk, ps->topic, ps->partition, &lo, &hi) == RD_KAFKA_RESP_ERR_NO_ERROR && hi >= 0)
		v[4] = Int64GetDatum(hi);
	else
		n[4] = 'n';
	v[5] = Int64GetDatum(ps->last_applied_offset);
	n[5] = ps->last_applied_offset < 0 ? 'n' : ' ';
	v[6] = Int64GetDatum(ps->applied);
	v[7] = Int64GetDatum(ps->duplicates);
	v[8] = Int64GetDatum(ps->gaps);
	v[9] = Int64GetDatum(ps->errors);
	v[10] = Int64GetDatum(ps->dead_lettered);
	v[11] = Int64GetDatum(ps->skipped);
	v[12] = Int32GetDatum(ps->attempts);
	v[13] = ps->last_error ? CStringGetTextDatum(ps->last_error) : (n[13] = 'n', (Datum) 0);
	v[14] = TimestampTzGetDatum(ps->next_attempt_at);
	n[14] = ps->next_attempt_at == 0 ? 'n' : ' ';
	v[15] = TimestampTzGetDatum(ps->blocked_at);
	n[15] = ps->blocked_at == 0 ? 'n' : ' ';
	v[16] = ps->blocked_reason ? CStringGetTextDatum(ps->blocked_reason) : (n[16] = 'n', (Datum) 0);
	v[17] = BoolGetDatum(ps->accept_gap);
	v[18] = BoolGetDatum(ps->skip_requested);
	if (SPI_execute_plan(offset_update_plan, v, n, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not store an inbox offset");
}

/* qsort comparator: partitions by topic, then number (the lock order). */
static int
part_cmp(const void *a, const void *b)
{
	const PartState *x = a;
	const PartState *y = b;
	int			c = strcmp(x->topic, y->topic);

	return c != 0 ? c : (x->partition > y->partition) - (x->partition < y->partition);
}

/* qsort comparator of aggregate ids (the lock order of the flush). */
static int
agg_cmp(const void *a, const void *b)
{
	return strcmp((*(InboxAggregate *const *) a)->aggregate_id, (*(InboxAggregate *const *) b)->aggregate_id);
}

/*
 * Update the rows of the moved aggregates that load_aggregates read (list,
 * sorted), by ctid: no index descent, no speculative insertion.  Those
 * updated are no longer dirty.
 */
static void
update_stored_aggregates(InboxSub *sub, HTAB *aggs, InboxAggregate **list, int k)
{
	Datum	   *tids = palloc(sizeof(Datum) * Max(k, 1));
	Datum	   *ids = palloc(sizeof(Datum) * Max(k, 1));
	Datum	   *vers = palloc(sizeof(Datum) * Max(k, 1));
	int			m = 0;
	Datum		args[4];

	for (int i = 0; i < k; i++)
	{
		if (!list[i]->stored)
			continue;
		tids[m] = PointerGetDatum(&list[i]->tid);
		ids[m] = CStringGetTextDatum(list[i]->aggregate_id);
		vers[m] = Int64GetDatum(list[i]->last_version);
		m++;
	}
	if (m == 0)
		return;
	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = PointerGetDatum(construct_array(tids, m, TIDOID, sizeof(ItemPointerData), false, TYPALIGN_SHORT));
	args[2] = PointerGetDatum(construct_array(ids, m, TEXTOID, -1, false, TYPALIGN_INT));
	args[3] = PointerGetDatum(construct_array(vers, m, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	if (SPI_execute_plan(agg_update_plan, args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "could not update inbox aggregate versions");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char	   *key = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);

		aggregate_state(aggs, key)->dirty = false;
	}
}

/*
 * Store the versions of the aggregates the batch moved: rows read before
 * are updated in place, the others (new, or moved meanwhile) upserted.
 * Both in aggregate id order, the lock order.
 */
static void
flush_aggregates(InboxSub *sub, HTAB *aggs)
{
	long		n = hash_get_num_entries(aggs);
	InboxAggregate **list = palloc(sizeof(InboxAggregate *) * Max(n, 1));
	Datum	   *ids = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *vers = palloc(sizeof(Datum) * Max(n, 1));
	HASH_SEQ_STATUS seq;
	InboxAggregate *a;
	int			k = 0;
	int			m = 0;
	Datum		args[3];

	hash_seq_init(&seq, aggs);
	while ((a = hash_seq_search(&seq)) != NULL)
		if (a->dirty)
			list[k++] = a;
	if (k == 0)
		return;
	qsort(list, k, sizeof(InboxAggregate *), agg_cmp);
	update_stored_aggregates(sub, aggs, list, k);
	for (int i = 0; i < k; i++)
	{
		if (!list[i]->dirty)
			continue;
		ids[m] = CStringGetTextDatum(list[i]->aggregate_id);
		vers[m] = Int64GetDatum(list[i]->last_version);
		m++;
	}
	if (m == 0)
		return;
	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = PointerGetDatum(construct_array(ids, m, TEXTOID, -1, false, TYPALIGN_INT));
	args[2] = PointerGetDatum(construct_array(vers, m, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	if (SPI_execute_plan(agg_flush_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not store inbox aggregate versions");
}

/* The partition states of a batch, one per partition seen, sorted. */
static PartState *
batch_partitions(rd_kafka_message_t **msgs, int n, int *nparts)
{
	PartState  *parts = palloc0(sizeof(PartState) * n);
	int			k = 0;

	for (int i = 0; i < n; i++)
	{
		const char *topic = rd_kafka_topic_name(msgs[i]->rkt);
		int			j;

		for (j = 0; j < k; j++)
			if (parts[j].partition == msgs[i]->partition && strcmp(parts[j].topic, topic) == 0)
				break;
		if (j == k)
		{
			parts[k].topic = pstrdup(topic);
			parts[k].partition = msgs[i]->partition;
			k++;
		}
	}
	qsort(parts, k, sizeof(PartState), part_cmp);
	*nparts = k;
	return parts;
}

/* The batch's state of a message's partition. */
static PartState *
find_part(PartState *parts, int nparts, const rd_kafka_message_t *m)
{
	const char *topic = rd_kafka_topic_name(m->rkt);

	for (int j = 0; j < nparts; j++)
		if (parts[j].partition == m->partition && strcmp(parts[j].topic, topic) == 0)
			return &parts[j];
	elog(ERROR, "inbox batch lost track of a partition");
	return NULL;				/* keep compiler quiet */
}

/* Is the partition paused, waiting to be resumed at its stored offset? */
static bool
is_paused(InboxSub *sub, PartState *ps)
{
	ListCell   *lc;

	foreach(lc, sub->paused)
	{
		PausedPartition *pp = lfirst(lc);

		if (pp->partition == ps->partition && strcmp(pp->topic, ps->topic) == 0)
			return true;
	}
	return false;
}

/* Pause a stopped partition where it stopped; it resumes from the table. */
static void
pause_partition(InboxSub *sub, PartState *ps)
{
	rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(1);
	MemoryContext old = MemoryContextSwitchTo(subs_context);
	PausedPartition *pp = palloc(sizeof(PausedPartition));

	pp->topic = pstrdup(ps->topic);
	pp->partition = ps->partition;
	pp->resume_at = ps->blocked_at != 0 ? TimestampTzPlusMilliseconds(GetCurrentTimestamp(), INBOX_REFRESH_MS)
		: ps->next_attempt_at;
	sub->paused = lappend(sub->paused, pp);
	MemoryContextSwitchTo(old);
	rd_kafka_topic_partition_list_add(tl, ps->topic, ps->partition);
	rd_kafka_pause_partitions(sub->rk, tl);
	rd_kafka_topic_partition_list_destroy(tl);
}

/* Add a committed batch's outcome to the shared counters. */
static void
count_batch(PartState *parts, int nparts)
{
	int64		sums[6] = {0};

	for (int i = 0; i < nparts; i++)
	{
		sums[0] += parts[i].applied;
		sums[1] += parts[i].duplicates;
		sums[2] += parts[i].gaps;
		sums[3] += parts[i].errors;
		sums[4] += parts[i].dead_lettered;
		sums[5] += parts[i].skipped;
	}
	outbox_count(OC_INBOX_APPLIED, sums[0]);
	outbox_count(OC_INBOX_DUPLICATES, sums[1]);
	outbox_count(OC_INBOX_GAPS, sums[2]);
	outbox_count(OC_INBOX_HANDLER_ERRORS, sums[3]);
	outbox_count(OC_INBOX_DEAD_LETTERED, sums[4]);
	outbox_count(OC_INBOX_SKIPPED, sums[5]);
	outbox_count(OC_INBOX_BATCHES, 1);
}

/*
 * Messages the fast path looked at in the current transaction, including
 * those of the chunk being applied: after a failure the careful path goes
 * no further (its time budget is then spent on the messages that failed).
 */
static int	batch_reached = 0;

/* The time budget of one transaction of the subscription, in ms. */
static int
batch_time(InboxSub *sub)
{
	return Max(Min(inbox_batch_time_ms, sub->max_poll_ms / 3), 1);
}

/*
 * Messages of the next chunk of the fast path: no more than were handled
 * so far in the transaction (the first chunk is small), nor than the
 * measured cost says fit in the time left.  The budget is checked between
 * chunks, so a chunk overruns it by no more than the time already spent
 * while the handlers' cost holds.
 */
static int
chunk_size(InboxSub *sub, int handled, TimestampTz deadline)
{
	double		fit = INT_MAX;
	TimestampTz now = GetCurrentTimestamp();

	if (sub->msg_cost_us > 0)
		fit = (deadline > now ? (double) (deadline - now) : 0) / sub->msg_cost_us;
	return (int) Max(Min(Min(fit, (double) (handled > 0 ? handled : INBOX_FIRST_CHUNK)),
						 (double) INT_MAX), 1);
}

/*
 * Go through the first n held messages in order until the time budget is
 * used: checked after each handled message on the careful path, after each
 * chunk on the fast path.  Returns the number of messages looked at; adds
 * those applied or dropped as duplicates to *done.
 */
static int
apply_messages(InboxSub *sub, PartState *parts, int nparts, HTAB *aggs,
			   FmgrInfo *flinfo, MessageMeta *metas, int n, bool careful,
			   TimestampTz deadline, int *done)
{
	PendingList pending;
	int			handled = 0;
	int			chunk = chunk_size(sub, 0, deadline);
	int			i;

	pending.items = palloc(sizeof(PendingApply) * Max(n, 1));
	pending.n = 0;
	pending.identities = NULL;
	if (!careful)
	{
		HASHCTL		hctl;

		memset(&hctl, 0, sizeof(hctl));
		hctl.keysize = sizeof(char *);
		hctl.entrysize = sizeof(char *);
		hctl.hcxt = CurrentMemoryContext;
		hctl.hash = agg_hash;
		hctl.match = agg_match;
		pending.identities = hash_create("inbox batch identities", Max(n, 16), &hctl,
										 HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
	}
	for (i = 0; i < n; i++)
	{
		rd_kafka_message_t *m = sub->msgs[i];
		PartState  *ps = find_part(parts, nparts, m);

		CHECK_FOR_INTERRUPTS();
		batch_reached = i + 1;
		if (ps->stopped)
			continue;
		/* Already applied: a re-delivery, or another worker's. */
		if (ps->next_offset >= 0 && m->offset < ps->next_offset)
			continue;
		if (ps->blocked_at != 0 ||
			(ps->next_attempt_at != 0 && ps->next_attempt_at > GetCurrentTimestamp()))
		{
			stop_partition(ps, m->offset);
			continue;
		}
		if (ps->skip_requested)
		{
			skip_message(sub, ps, aggs, m, &metas[i]);
			(*done)++;
			continue;
		}
		apply_message(sub, ps, aggs, flinfo, m, &metas[i], careful ? NULL : &pending);
		if (!ps->stopped)
			(*done)++;
		handled++;
		if (!careful && pending.n < chunk)
			continue;
		if (!careful)
		{
			apply_pending(sub, flinfo, &pending);
			chunk = chunk_size(sub, handled, deadline);
		}
		if (GetCurrentTimestamp() >= deadline)
		{
			i++;
			break;
		}
	}
	if (!careful)
		apply_pending(sub, flinfo, &pending);
	return i;
}

/*
 * After the commit, give back the messages looked at and those of the
 * partitions that stopped (paused: they come again from the stored offset
 * once resumed); keep the rest, in order, for the next transaction.
 */
static void
keep_rest(InboxSub *sub, PartState *parts, int nparts, int looked)
{
	int			k = 0;

	for (int i = 0; i < sub->nmsgs; i++)
	{
		rd_kafka_message_t *m = sub->msgs[i];

		if (i < looked || find_part(parts, nparts, m)->stopped)
			rd_kafka_message_destroy(m);
		else
			sub->msgs[k++] = m;
	}
	sub->nmsgs = k;
}

/*
 * Apply the first n held messages in one transaction, until its time
 * budget runs out at deadline.  Returns the number of messages applied or
 * dropped as duplicates; keeps those it did not look at.
 */
static int
run_batch(InboxSub *sub, int n, bool careful, TimestampTz deadline)
{
	int			nparts;
	PartState  *parts;
	HASHCTL		hctl;
	HTAB	   *aggs;
	FmgrInfo	flinfo;
	rd_kafka_topic_partition_list_t *commit;
	int			done = 0;
	int			looked;
	MessageMeta *metas;

	/* Until the messages are gone through, a failure covers them all. */
	batch_reached = n;
	parts = batch_partitions(sub->msgs, sub->nmsgs, &nparts);
	memset(&hctl, 0, sizeof(hctl));
	hctl.keysize = sizeof(char *);
	hctl.entrysize = sizeof(InboxAggregate);
	hctl.hcxt = CurrentMemoryContext;
	hctl.hash = agg_hash;
	hctl.match = agg_match;
	aggs = hash_create("inbox aggregates", 256, &hctl,
					   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);

	metas = palloc(sizeof(MessageMeta) * Max(n, 1));
	for (int i = 0; i < n; i++)
		parse_headers(sub->msgs[i], &metas[i]);
	load_aggregates(aggs, sub, metas, n);

	fmgr_info(sub->handler, &flinfo);
	for (int i = 0; i < nparts; i++)
	{
		lock_partition(sub, &parts[i]);
		/* Messages fetched before it was paused: they come again. */
		if (is_paused(sub, &parts[i]))
		{
			parts[i].stopped = true;
			parts[i].was_paused = true;
		}
	}

	looked = apply_messages(sub, parts, nparts, aggs, &flinfo, metas, n, careful,
							deadline, &done);

	flush_aggregates(sub, aggs);
	commit = rd_kafka_topic_partition_list_new(nparts);
	for (int i = 0; i < nparts; i++)
	{
		save_partition(sub, &parts[i]);
		if (parts[i].next_offset >= 0)
			rd_kafka_topic_partition_list_add(commit, parts[i].topic,
											  parts[i].partition)->offset = parts[i].next_offset;
	}
	end_step();
	count_batch(parts, nparts);
	keep_rest(sub, parts, nparts, looked);

	/* Stopped partitions wait; the rest of their messages come again. */
	for (int i = 0; i < nparts; i++)
		if (parts[i].stopped && !parts[i].was_paused)
			pause_partition(sub, &parts[i]);
	/* For lag monitoring only: the table is the position of record. */
	if (commit->cnt > 0)
		(void) rd_kafka_commit(sub->rk, commit, 1);
	rd_kafka_topic_partition_list_destroy(commit);
	return done;
}

/* ---------- the loop ---------- */

/*
 * Take what the consumer has fetched, without waiting, up to a batch.  This
 * is also what keeps the consumer in its group (max.poll.interval.ms).
 * After a rebalance what was held is dropped: it comes again from the
 * stored offsets once the new assignment is applied.
 */
static void
poll_consumer(InboxSub *sub)
{
	rd_kafka_message_t *m;

	if (sub->msgs_size < inbox_batch_size)
	{
		MemoryContext old = MemoryContextSwitchTo(subs_context);

		sub->msgs = sub->msgs == NULL
			? palloc(sizeof(rd_kafka_message_t *) * inbox_batch_size)
			: repalloc(sub->msgs, sizeof(rd_kafka_message_t *) * inbox_batch_size);
		sub->msgs_size = inbox_batch_size;
		MemoryContextSwitchTo(old);
	}
	while (sub->nmsgs < inbox_batch_size &&
		   (m = rd_kafka_consumer_poll(sub->rk, 0)) != NULL)
	{
		if (m->err)
		{
			if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
				elog(DEBUG1, "outbox inbox: consumer \"%s\": %s", sub->consumer,
					 rd_kafka_message_errstr(m));
			rd_kafka_message_destroy(m);
			continue;
		}
		sub->msgs[sub->nmsgs++] = m;
	}
	/* The callback ran inside a poll: no message of a new assignment yet. */
	if (sub->rebalanced)
	{
		inbox_drop_messages(sub);
		sub->rebalanced = false;
	}
}

/*
 * Begin a transaction with SPI and a snapshot, for one step.  What the step
 * allocates goes to the loop's context, not SPI's (freed at SPI_finish).
 */
static void
begin_step(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	MemoryContextSwitchTo(loop_context);
}

/* Commit the step; back in the loop's context (commit leaves us in Top). */
static void
end_step(void)
{
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	MemoryContextSwitchTo(loop_context);
}

/*
 * Apply held messages in one transaction, for at most the time budget:
 * first without subtransactions (the common case, several times faster);
 * if anything fails, roll back and apply them again one subtransaction
 * each (with a budget of its own, and no further than the failed attempt
 * got), so that a failing handler meets its retry and poison policies.
 * What the budget left is kept for the next transaction, after a poll.
 */
static int
apply_batch(InboxSub *sub)
{
	volatile bool careful = false;
	int			done = 0;
	int			n = sub->nmsgs;

	for (;;)
	{
		volatile bool failed = false;
		TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														   batch_time(sub));

		/* What a handler that failed in an earlier attempt left. */
		forget_session_locks();
		PG_TRY();
		{
			begin_step();
			done = run_batch(sub, n, careful, deadline);
		}
		PG_CATCH();
		{
			if (careful)
			{
				/*
				 * The consumer has moved past messages it did not apply:
				 * assign again, from the stored offsets.
				 */
				if (sub->rk != NULL && sub->pending_assign == NULL)
					(void) rd_kafka_assignment(sub->rk, &sub->pending_assign);
				inbox_drop_messages(sub);
				PG_RE_THROW();
			}
			failed = true;
		}
		PG_END_TRY();
		if (!failed)
			break;
		HOLD_INTERRUPTS();
		elog(DEBUG1, "outbox inbox: batch of \"%s\" failed, applying it message by message",
			 sub->consumer);
		FlushErrorState();
		AbortCurrentTransaction();
		RESUME_INTERRUPTS();
		MemoryContextSwitchTo(loop_context);
		careful = true;
		n = Max(Min(batch_reached, n), 1);
		outbox_count(OC_INBOX_BATCH_FALLBACKS, 1);
	}
	return done;
}

/*
 * Inbox retention (outbox.inbox_retention) of a database the publisher does
 * not serve (where it does, the publisher runs it): worker 0, once a second,
 * in transactions of outbox.retention_batch rows, for at most a tenth of a
 * second.  Old claims are deleted whether the workers or inbox_claim() made
 * them.
 */
static void
inbox_retention(void)
{
	TimestampTz start = GetCurrentTimestamp();
	uint64		deleted;

	if (worker_index != 0 || outbox_inbox_retention_s < 0 || plans_nspid == InvalidOid ||
		(outbox_workers > 0 && outbox_database_stats(MyDatabaseId) != NULL) ||
		!TimestampDifferenceExceeds(last_retention, start, 1000))
		return;
	last_retention = start;
	pgstat_report_activity(STATE_RUNNING, "inbox retention");
	do
	{
		begin_step();
		deleted = inbox_retention_delete(retention_plan);
		end_step();
		outbox_count(OC_INBOX_RETENTION_DELETED, deleted);
	} while (deleted >= (uint64) outbox_retention_batch &&
			 !TimestampDifferenceExceeds(start, GetCurrentTimestamp(), 100));
}

/*
 * One pass: refresh subscriptions when due, assign and resume partitions,
 * then take a batch from each consumer and apply it.  Returns the number of
 * messages handled; -1 if the extension is not installed.
 */
static int
inbox_step(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			total = 0;
	ListCell   *lc;

	if (TimestampDifferenceExceeds(last_refresh, now, INBOX_REFRESH_MS) || plans_nspid == InvalidOid)
	{
		bool		installed;

		pgstat_report_activity(STATE_RUNNING, "refreshing subscriptions");
		begin_step();
		installed = refresh_subscriptions();
		end_step();
		last_refresh = now;
		if (!installed)
		{
			foreach(lc, subs)
				inbox_consumer_destroy((InboxSub *) lfirst(lc));
			subs = NIL;
			plans_nspid = InvalidOid;
			return -1;
		}
	}
	inbox_retention();

	foreach(lc, subs)
	{
		InboxSub   *sub = lfirst(lc);

		if (sub->rk == NULL)
			continue;
		poll_consumer(sub);
		if (inbox_state_due(sub, now))
		{
			begin_step();
			inbox_state_save(sub);
			end_step();
		}
		if (sub->pending_assign != NULL)
		{
			/* What was fetched before is fetched again from the offsets. */
			inbox_drop_messages(sub);
			begin_step();
			apply_assignment(sub);
			end_step();
			poll_consumer(sub);
		}
		else if (sub->paused != NIL)
		{
			begin_step();
			resume_partitions(sub, now);
			end_step();
		}
		if (sub->nmsgs == 0)
			continue;
		pgstat_report_activity(STATE_RUNNING, psprintf("applying %d messages of \"%s\"",
													   sub->nmsgs, sub->consumer));
		total += apply_batch(sub);
	}
	return total;
}

/* Log a worker error once per condition. */
static void
log_inbox_error(void)
{
	ErrorData  *edata;
	MemoryContext old = MemoryContextSwitchTo(loop_context);

	edata = CopyErrorData();
	MemoryContextSwitchTo(old);
	FlushErrorState();
	if (strncmp(last_logged_error, edata->message, sizeof(last_logged_error) - 1) != 0)
	{
		ereport(LOG,
				(errmsg("outbox inbox worker %d: %s", worker_index, edata->message),
				 edata->detail ? errdetail_internal("%s", edata->detail) : 0,
				 errhint("The inbox worker retries with backoff.")));
		strlcpy(last_logged_error, edata->message, sizeof(last_logged_error));
	}
}

/*
 * Recreate the consumers when the Kafka settings change (brokers,
 * properties, the credentials file's content): they join again with them.
 */
static void
check_consumer_settings(void)
{
	ListCell   *lc;
	uint32		fingerprint = inbox_consumer_fingerprint();

	if (consumer_configured && fingerprint == consumer_fingerprint)
		return;
	if (consumer_configured)
	{
		ereport(LOG, (errmsg("outbox inbox worker %d: Kafka settings changed, recreating the consumers",
							 worker_index)));
		foreach(lc, subs)
			inbox_consumer_destroy((InboxSub *) lfirst(lc));
		list_free(subs);
		subs = NIL;
		MemoryContextReset(subs_context);
		last_refresh = 0;
	}
	consumer_fingerprint = fingerprint;
	consumer_configured = true;
}

/* The publisher database entry this worker runs in, if started per database. */
static OutboxDatabase *inbox_entry = NULL;

/* on_shmem_exit: no longer in the entry's list of inbox workers. */
static void
inbox_leave_database(int code, Datum arg)
{
	inbox_entry->inbox_pids[worker_index] = 0;
}

/*
 * Connect to the worker's database: one of the publishers' databases
 * (main_arg: entry + 1, index), listed there so that a DROP DATABASE can
 * stop it; or the one inbox database.  Returns its name.
 */
static const char *
inbox_connect(Datum main_arg)
{
	uint32		entry = DatumGetUInt32(main_arg) >> 16;
	const char *db;

	worker_index = DatumGetUInt32(main_arg) & 0xffff;
	if (entry == 0)
	{
		db = inbox_target_database();
		BackgroundWorkerInitializeConnection(db, NULL, 0);
		return db;
	}
	inbox_entry = &outbox_shared->databases[entry - 1];
	inbox_entry->inbox_pids[worker_index] = MyProcPid;
	on_shmem_exit(inbox_leave_database, (Datum) 0);
	db = pstrdup(NameStr(inbox_entry->name));
	BackgroundWorkerInitializeConnection(db, NULL, 0);
	/* The entry went to another database, or a DROP DATABASE holds it. */
	if (MyDatabaseId != inbox_entry->dboid ||
		inbox_entry->held_until > GetCurrentTimestamp())
		proc_exit(0);
	return db;
}

/* An inbox worker: apply every subscription of its database, forever. */
void
inbox_worker_main(Datum main_arg)
{
	const char *db;
	int			backoff_ms = INBOX_ERROR_BACKOFF_MS;
	bool		logged_missing = false;
	uint32		generation = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	db = inbox_connect(main_arg);
	/* Our own statements name everything qualified. */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	/* Our statements are short: compiling them would take longer. */
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	subs_context = AllocSetContextCreate(TopMemoryContext, "inbox subscriptions",
										 ALLOCSET_DEFAULT_SIZES);
	loop_context = AllocSetContextCreate(TopMemoryContext, "inbox loop",
										 ALLOCSET_DEFAULT_SIZES);
	check_consumer_settings();
	on_shmem_exit(inbox_worker_exit, (Datum) 0);
	ereport(LOG, (errmsg("outbox inbox worker %d started for database \"%s\"",
						 worker_index, db)));

	for (;;)
	{
		int			n = 0;
		bool		failed = false;
		long		wait_ms;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			check_consumer_settings();
		}
		MemoryContextReset(loop_context);
		MemoryContextSwitchTo(loop_context);
		/* Before the subscriptions are read: one committed later bumps it. */
		generation = pg_atomic_read_u32(&outbox_shared->probe_generation);

		PG_TRY();
		{
			n = inbox_step();
		}
		PG_CATCH();
		{
			HOLD_INTERRUPTS();
			log_inbox_error();
			AbortCurrentTransaction();
			RESUME_INTERRUPTS();
			failed = true;
			outbox_count(OC_INBOX_WORKER_ERRORS, 1);
		}
		PG_END_TRY();
		MemoryContextSwitchTo(loop_context);
		(void) pgstat_report_stat(false);

		if (failed)
		{
			wait_ms = backoff_ms;
			backoff_ms = Min(backoff_ms * 2, 60 * 1000);
		}
		else
		{
			backoff_ms = INBOX_ERROR_BACKOFF_MS;
			last_logged_error[0] = '\0';
			/* One of many databases, nothing subscribed (or no extension): free the slot a while. */
			if (inbox_entry != NULL && subs == NIL && n <= 0)
			{
				inbox_entry->inbox_idle_generation = generation;
				pg_write_barrier();
				inbox_entry->inbox_idle_until =
					TimestampTzPlusMilliseconds(GetCurrentTimestamp(), INBOX_RECHECK_MS);
				proc_exit(0);
			}
			if (n < 0 && !logged_missing)
				ereport(LOG,
						(errmsg("outbox inbox worker %d: extension \"outbox\" is not installed in database \"%s\"; waiting",
								worker_index, db)));
			logged_missing = (n < 0);
			if (n > 0)
				continue;
			/* Idle: nothing subscribed waits for the refresh. */
			wait_ms = subs == NIL ? INBOX_REFRESH_MS : INBOX_IDLE_WAIT_MS;
		}
		pgstat_report_activity(STATE_IDLE, NULL);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 wait_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
