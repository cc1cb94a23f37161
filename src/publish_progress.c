/*-------------------------------------------------------------------------
 *
 * publish_progress.c
 *	  Reading and recording aggregates' progress in aggregate_publication
 *	  without a statement.  Read: each row found by its primary key with
 *	  the read's snapshot.  Recorded: each row found, locked, checked to be
 *	  the version the read saw, and updated through the relation's own
 *	  update, index and trigger code (as logical replication's apply
 *	  updates a row); an aggregate that had no row gets one, inserted
 *	  through the relation's insert code with the table's defaults.  The
 *	  common settling -- nothing dead-lettered or skipped -- spent most of
 *	  its time starting the executor for an UPDATE or INSERT of a few rows;
 *	  the other settlings still run publish_settle.c's statement.
 *
 *	  Where each aggregate's row was last written or read is remembered
 *	  (the worker's, lost on restart), and the next read looks there first:
 *	  a row visible to the read's snapshot at that place, of that aggregate,
 *	  is the one its key would find (the key is unique), without the index
 *	  descent that was a sixth of a publisher's CPU at a steady load.  A
 *	  place that holds something else (an operator's update since, a row
 *	  vacuumed away, a TRUNCATE) falls back to the key.
 *
 *	  Locking: each row is locked (FOR NO KEY UPDATE) before it is
 *	  written; a row updated since the read (an operator, a failure
 *	  recorded) is left alone, as the statement's "xmin = the version read"
 *	  leaves it.  A row to insert is first looked for with a dirty
 *	  snapshot: one that exists is left alone, as the statement's ON
 *	  CONFLICT DO NOTHING leaves it, and one being inserted or deleted (an
 *	  operator's function) is waited for and looked for again.  Neither
 *	  wait blocks: a row another transaction holds (an operator's, open)
 *	  makes its aggregate "busy", left for a later settling, so that the
 *	  others are recorded meanwhile; the statement waited, and with it the
 *	  whole worker, for as long as that transaction stayed open.  One
 *	  inserted between the look and ours fails the settling with a unique
 *	  violation; its marks are held and the retry finds the row.  A row
 *	  trigger that skips the write leaves the aggregate unrecorded.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/sysattr.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "shmem.h"
#include "stats.h"
#include "util.h"
#include "publish.h"

/* The columns of aggregate_publication written or read here. */
typedef enum ProgressColumn
{
	PC_AGGREGATE_ID,
	PC_LAST_PUBLISHED_VERSION,
	PC_LAST_PUBLISHED_AT,
	PC_ATTEMPTS,
	PC_LAST_ERROR,
	PC_CATCH_UP,
	PC_NEXT_ATTEMPT_AT,
	PC_UPDATED_AT,
	PC_PAUSED,
	PC_BLOCKED_VERSION,
	PC_NCOLUMNS
} ProgressColumn;

static const char *const progress_names[PC_NCOLUMNS] = {
	[PC_AGGREGATE_ID] = "aggregate_id",
	[PC_LAST_PUBLISHED_VERSION] = "last_published_version",
	[PC_LAST_PUBLISHED_AT] = "last_published_at",
	[PC_ATTEMPTS] = "attempts",
	[PC_LAST_ERROR] = "last_error",
	[PC_CATCH_UP] = "catch_up",
	[PC_NEXT_ATTEMPT_AT] = "next_attempt_at",
	[PC_UPDATED_AT] = "updated_at",
	[PC_PAUSED] = "paused",
	[PC_BLOCKED_VERSION] = "blocked_version",
};

/* What became of an aggregate's progress in a settling. */
typedef enum ProgressOutcome
{
	PROGRESS_RECORDED,			/* written (or, from find_and_lock, locked) */
	PROGRESS_CHANGED,			/* its row changed since the read: not written */
	PROGRESS_BUSY				/* another transaction holds its row: later */
} ProgressOutcome;

static Oid	publication_relid = InvalidOid;
static int	progress_columns[PC_NCOLUMNS];	/* 0-based attribute indexes */

/*
 * The defaults of the columns an insert does not set, planned in
 * defaults_context; valid while defaults is not NULL and no relcache
 * invalidation of the table (an ALTER TABLE, perhaps one the settling's own
 * lock waited for) came since (defaults_stale).
 */
static MemoryContext defaults_context = NULL;
static OutboxColumnDefault *defaults = NULL;
static int	ndefaults = 0;
static bool defaults_stale = false;

/*
 * Where rows of aggregates were last seen (known_cxt; KNOWN_ROWS_MAX at
 * most, then forgotten at once): what the next read looks at first.
 */
typedef struct KnownRow
{
	char	   *aggregate_id;	/* the key, in known_cxt */
	ItemPointerData tid;
} KnownRow;

#define KNOWN_ROWS_MAX 100000

static MemoryContext known_cxt = NULL;
static HTAB *known_rows = NULL;
static long known_count = 0;

/* Remember that the aggregate's row was at tid. */
static void
remember_row(const char *aggregate_id, ItemPointer tid)
{
	KnownRow   *k;
	bool		found;

	if (known_cxt == NULL)
		known_cxt = AllocSetContextCreate(TopMemoryContext, "outbox progress places",
										  ALLOCSET_DEFAULT_SIZES);
	if (known_rows == NULL || known_count >= KNOWN_ROWS_MAX)
	{
		MemoryContextReset(known_cxt);
		known_rows = outbox_aggregate_table("outbox progress places", sizeof(KnownRow),
											1024, known_cxt);
		known_count = 0;
	}
	k = hash_search(known_rows, &aggregate_id, HASH_ENTER, &found);
	if (!found)
	{
		k->aggregate_id = MemoryContextStrdup(known_cxt, aggregate_id);
		known_count++;
	}
	k->tid = *tid;
}

/* Where the aggregate's row was last seen, or NULL. */
static ItemPointer
known_row(const char *aggregate_id)
{
	KnownRow   *k;

	if (known_rows == NULL)
		return NULL;
	k = hash_search(known_rows, &aggregate_id, HASH_FIND, NULL);
	return k ? &k->tid : NULL;
}

/* A relcache invalidation of aggregate_publication or of everything. */
static void
progress_relcache_callback(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == publication_relid)
		defaults_stale = true;
}

/* Look up aggregate_publication in namespace nsp, and its columns. */
void
publish_progress_prepare(Oid nsp)
{
	Oid			relid = publish_table_columns(nsp, "aggregate_publication", progress_names,
											  PC_NCOLUMNS, progress_columns);

	/* A new table (the extension made again); the callback covers the old one. */
	if (relid != publication_relid)
		defaults_stale = true;
	publication_relid = relid;
}

/*
 * The planned defaults of the columns an insert into rel (locked) does not
 * set.  Published only once complete: an error leaves none.
 */
static void
load_defaults(Relation rel)
{
	const int  *c = progress_columns;
	AttrNumber	set[] = {c[PC_AGGREGATE_ID] + 1, c[PC_LAST_PUBLISHED_VERSION] + 1,
	c[PC_LAST_PUBLISHED_AT] + 1, c[PC_UPDATED_AT] + 1};
	MemoryContext oldcxt;
	OutboxColumnDefault *loaded;
	int			n;

	if (defaults_context == NULL)
	{
		defaults_context = AllocSetContextCreate(TopMemoryContext, "outbox progress defaults",
												 ALLOCSET_SMALL_SIZES);
		CacheRegisterRelcacheCallback(progress_relcache_callback, (Datum) 0);
	}
	defaults = NULL;
	ndefaults = 0;
	MemoryContextReset(defaults_context);
	/* Cleared first: an invalidation while planning marks them again. */
	defaults_stale = false;
	oldcxt = MemoryContextSwitchTo(defaults_context);
	loaded = palloc(sizeof(OutboxColumnDefault) * RelationGetDescr(rel)->natts);
	n = outbox_column_defaults(rel, set, lengthof(set), loaded);
	MemoryContextSwitchTo(oldcxt);
	ndefaults = n;
	defaults = loaded;
}

/* The primary key of aggregate_publication (rel). */
static Oid
primary_key(Relation rel)
{
	Oid			pkey = outbox_primary_key_index(rel);

	if (!OidIsValid(pkey))
		elog(ERROR, "table aggregate_publication has no primary key");
	return pkey;
}

/* The table the progress is read from and written to. */
Oid
publish_progress_relid(void)
{
	return publication_relid;
}

static bool find_row(IndexScanDesc scan, Relation pkey, const char *aggregate_id,
					 TupleTableSlot *slot);

/* Whether the row in slot is the aggregate's. */
static bool
same_aggregate(TupleTableSlot *slot, const char *aggregate_id)
{
	bool		isnull;
	text	   *id = DatumGetTextPP(slot_getattr(slot, progress_columns[PC_AGGREGATE_ID] + 1,
												 &isnull));

	return !isnull && VARSIZE_ANY_EXHDR(id) == strlen(aggregate_id) &&
		memcmp(VARDATA_ANY(id), aggregate_id, VARSIZE_ANY_EXHDR(id)) == 0;
}

/*
 * The aggregate's row visible to snapshot into slot, if any: looked for
 * where it was last seen (if the table still reaches there: nblocks), then
 * by the key, and where the key found it remembered.
 */
static bool
find_visible_row(Relation rel, IndexScanDesc scan, Relation pkey, BlockNumber nblocks,
				 Snapshot snapshot, const char *aggregate_id, TupleTableSlot *slot)
{
	ItemPointer tid = known_row(aggregate_id);

	if (tid != NULL && ItemPointerGetBlockNumber(tid) < nblocks &&
		table_tuple_fetch_row_version(rel, tid, snapshot, slot) &&
		same_aggregate(slot, aggregate_id))
		return true;
	outbox_count(OC_PROGRESS_KEY_LOOKUPS, 1);
	if (!find_row(scan, pkey, aggregate_id, slot))
		return false;
	remember_row(aggregate_id, &slot->tts_tid);
	return true;
}

/* The row of the aggregate the scan's key names into slot, if any. */
static bool
find_row(IndexScanDesc scan, Relation pkey, const char *aggregate_id, TupleTableSlot *slot)
{
	ScanKeyData key;

	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ, CStringGetTextDatum(aggregate_id));
	key.sk_collation = pkey->rd_indcollation[0];
	index_rescan(scan, &key, 1, NULL, 0);
	return index_getnext_slot(scan, ForwardScanDirection, slot);
}

/*
 * The progress of n aggregates as the active snapshot sees their rows, into
 * out[i]: whether it has one, its last published version, whether the
 * database lists it (paused, blocked, backing off or catching up: read by
 * index, not from the stream) and the row's version.
 */
void
publish_progress_read(char **ids, int n, PublishProgress *out)
{
	Relation	rel = publish_open_table(publication_relid, AccessShareLock, ACL_SELECT,
											 progress_names, PC_NCOLUMNS, progress_columns);
	Relation	pkey = index_open(primary_key(rel), AccessShareLock);
	IndexScanDesc scan = outbox_index_beginscan(rel, pkey, GetActiveSnapshot(), 1, 0);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	const int  *c = progress_columns;
	BlockNumber nblocks = RelationGetNumberOfBlocks(rel);

	for (int i = 0; i < n; i++)
	{
		bool		isnull;

		out[i].has_row = find_visible_row(rel, scan, pkey, nblocks, GetActiveSnapshot(),
										  ids[i], slot);
		if (!out[i].has_row)
		{
			ItemPointerSetInvalid(&out[i].tid);
			continue;
		}
		out[i].tid = slot->tts_tid;
		slot_getallattrs(slot);
		out[i].last_published_version = DatumGetInt64(slot->tts_values[c[PC_LAST_PUBLISHED_VERSION]]);
		out[i].listed = DatumGetBool(slot->tts_values[c[PC_PAUSED]]) ||
			!slot->tts_isnull[c[PC_BLOCKED_VERSION]] ||
			!slot->tts_isnull[c[PC_NEXT_ATTEMPT_AT]] ||
			DatumGetBool(slot->tts_values[c[PC_CATCH_UP]]);
		out[i].xmin = DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber,
															&isnull));
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(pkey, NoLock);
	table_close(rel, NoLock);
}

/* The writer's state for one settling. */
typedef struct ProgressWriter
{
	Relation	rel;
	Relation	pkey;
	EState	   *estate;
	ResultRelInfo *rri;
	EPQState	epq;
	IndexScanDesc scan;
	TupleTableSlot *found;		/* the row as found and locked */
	TupleTableSlot *next;		/* its new version, or a new row */
	BlockNumber nblocks;		/* the table's, under our lock (no truncation) */
	/* For inserts, set up by the first (insert_progress) */
	SnapshotData dirty;			/* sees rows being inserted too */
	IndexScanDesc dirty_scan;
	ExprState **defaults;		/* of the columns in defaults[] */
} ProgressWriter;

/*
 * Open aggregate_publication and its primary key for writing (inserts too
 * if insert: the privilege is checked).
 */
static void
writer_open(ProgressWriter *w, bool insert)
{
	Oid			pkey;

	w->rel = publish_open_table(publication_relid, RowExclusiveLock,
								ACL_SELECT | ACL_UPDATE | (insert ? ACL_INSERT : 0),
								progress_names, PC_NCOLUMNS, progress_columns);
	pkey = primary_key(w->rel);
	w->estate = outbox_simple_estate(w->rel, RowExclusiveLock);
	w->estate->es_snapshot = GetActiveSnapshot();
	w->estate->es_output_cid = GetCurrentCommandId(true);
	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
	ExecOpenIndices(w->rri, false);
	outbox_epq_init(&w->epq, w->estate);
	w->pkey = index_open(pkey, RowExclusiveLock);
	w->nblocks = RelationGetNumberOfBlocks(w->rel);
	w->scan = outbox_index_beginscan(w->rel, w->pkey, GetActiveSnapshot(), 1, 0);
	w->found = table_slot_create(w->rel, &w->estate->es_tupleTable);
	w->next = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(w->rel), &TTSOpsVirtual);
	w->dirty_scan = NULL;
}

/*
 * Set up inserting: the dirty scan, and the defaults of the columns an
 * insert does not set (planned once, their states in the executor's memory).
 */
static void
writer_prepare_insert(ProgressWriter *w)
{
	MemoryContext oldcxt;

	/* Under the table's lock: an ALTER TABLE it waited for is seen. */
	if (defaults == NULL || defaults_stale)
		load_defaults(w->rel);
	oldcxt = MemoryContextSwitchTo(w->estate->es_query_cxt);
	InitDirtySnapshot(w->dirty);
	w->dirty_scan = outbox_index_beginscan(w->rel, w->pkey, &w->dirty, 1, 0);
	w->defaults = palloc(sizeof(ExprState *) * Max(ndefaults, 1));
	for (int i = 0; i < ndefaults; i++)
		w->defaults[i] = ExecInitExpr(defaults[i].expr, NULL);
	MemoryContextSwitchTo(oldcxt);
}

/* Close what writer_open() opened (locks kept to commit). */
static void
writer_close(ProgressWriter *w)
{
	index_endscan(w->scan);
	if (w->dirty_scan != NULL)
		index_endscan(w->dirty_scan);
	EvalPlanQualEnd(&w->epq);
	ExecCloseResultRelations(w->estate);
	ExecCloseIndices(w->rri);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	index_close(w->pkey, NoLock);
	table_close(w->rel, NoLock);
}

/* Is the row in slot at version xmin, and the aggregate's (unless NULL)? */
static bool
row_is(TupleTableSlot *slot, const char *aggregate_id, TransactionId xmin)
{
	bool		isnull;

	if (DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber,
											  &isnull)) != xmin)
		return false;
	return aggregate_id == NULL || same_aggregate(slot, aggregate_id);
}

/*
 * Find the aggregate's row and lock it, if it is still the version read
 * (xmin): PROGRESS_RECORDED if locked (to be written), PROGRESS_CHANGED if
 * it is gone or changed since, PROGRESS_BUSY if another transaction holds
 * it.  Looked for first where
 * the read found it (tid, if valid): the version visible there, with the
 * same xmin and aggregate, is the one the key would find, without an
 * index descent (a settling does one per aggregate: ~12% of the worker's
 * main thread at a steady load against a real cluster).
 */
static ProgressOutcome
find_and_lock(ProgressWriter *w, const char *aggregate_id, TransactionId xmin, ItemPointer tid)
{
	TM_FailureData tmfd;
	TM_Result	result;

	/* (A vacuum since the read may have cut the table short of tid.) */
	if (!(ItemPointerIsValid(tid) && ItemPointerGetBlockNumber(tid) < w->nblocks &&
		  table_tuple_fetch_row_version(w->rel, tid, GetActiveSnapshot(), w->found) &&
		  row_is(w->found, aggregate_id, xmin)))
	{
		/* (The key matched the aggregate.) */
		if (!find_row(w->scan, w->pkey, aggregate_id, w->found) ||
			!row_is(w->found, NULL, xmin))
			return PROGRESS_CHANGED;
	}
	/* Not following updates: a newer version is not the one read. */
	result = table_tuple_lock(w->rel, &w->found->tts_tid, GetActiveSnapshot(), w->found,
							  GetCurrentCommandId(false), LockTupleNoKeyExclusive,
							  LockWaitSkip, 0, &tmfd);
	if (result == TM_WouldBlock)
		return PROGRESS_BUSY;
	return result == TM_Ok ? PROGRESS_RECORDED : PROGRESS_CHANGED;
}

/*
 * Write the locked row's new version: its progress reaches version, its
 * failures are cleared, and an aggregate that was backing off catches up
 * by index (see publish_settle.c's statement: the same update).  False if
 * a row trigger skipped the update (nothing was recorded).
 */
static bool
write_progress(ProgressWriter *w, int64 version, TimestampTz acked_at, TimestampTz now)
{
	TupleTableSlot *next = w->next;
	const int  *c = progress_columns;

	slot_getallattrs(w->found);
	ExecClearTuple(next);
	memcpy(next->tts_values, w->found->tts_values, sizeof(Datum) * next->tts_tupleDescriptor->natts);
	memcpy(next->tts_isnull, w->found->tts_isnull, sizeof(bool) * next->tts_tupleDescriptor->natts);
	/* (A re-sent older version moves neither the version nor its time.) */
	if (w->found->tts_isnull[c[PC_LAST_PUBLISHED_VERSION]] ||
		DatumGetInt64(w->found->tts_values[c[PC_LAST_PUBLISHED_VERSION]]) < version)
	{
		next->tts_values[c[PC_LAST_PUBLISHED_VERSION]] = Int64GetDatum(version);
		next->tts_isnull[c[PC_LAST_PUBLISHED_VERSION]] = false;
		next->tts_values[c[PC_LAST_PUBLISHED_AT]] = TimestampTzGetDatum(acked_at);
		next->tts_isnull[c[PC_LAST_PUBLISHED_AT]] = false;
	}
	next->tts_values[c[PC_ATTEMPTS]] = Int32GetDatum(0);
	next->tts_isnull[c[PC_ATTEMPTS]] = false;
	next->tts_isnull[c[PC_LAST_ERROR]] = true;
	if (!w->found->tts_isnull[c[PC_NEXT_ATTEMPT_AT]])
	{
		next->tts_values[c[PC_CATCH_UP]] = BoolGetDatum(true);
		next->tts_isnull[c[PC_CATCH_UP]] = false;
	}
	next->tts_isnull[c[PC_NEXT_ATTEMPT_AT]] = true;
	next->tts_values[c[PC_UPDATED_AT]] = TimestampTzGetDatum(now);
	next->tts_isnull[c[PC_UPDATED_AT]] = false;
	ExecStoreVirtualTuple(next);
	/* Set by the update: a BEFORE trigger that returned NULL leaves it so. */
	ItemPointerSetInvalid(&next->tts_tid);
	outbox_simple_update(w->rri, w->estate, &w->epq, w->found, next);
	return ItemPointerIsValid(&next->tts_tid);
}

/*
 * Insert the row of an aggregate that had none when read: it reached
 * version, acknowledged at acked_at; the other columns take their
 * defaults.  PROGRESS_CHANGED if a row exists (left alone) or a row
 * trigger skipped the insert, PROGRESS_BUSY if one is being inserted or
 * deleted by a transaction still open.
 */
static ProgressOutcome
insert_progress(ProgressWriter *w, const char *aggregate_id, int64 version,
				TimestampTz acked_at, TimestampTz now)
{
	TupleTableSlot *slot = w->next;
	ExprContext *econtext = GetPerTupleExprContext(w->estate);
	const int  *c = progress_columns;
	MemoryContext oldcxt;
	bool		inserted;

	if (w->dirty_scan == NULL)
		writer_prepare_insert(w);
	while (find_row(w->dirty_scan, w->pkey, aggregate_id, w->found))
	{
		TransactionId xwait = TransactionIdIsValid(w->dirty.xmin) ? w->dirty.xmin : w->dirty.xmax;

		if (!TransactionIdIsValid(xwait))
			return PROGRESS_CHANGED;
		if (!outbox_conditional_xact_wait(xwait))
			return PROGRESS_BUSY;
	}
	oldcxt = MemoryContextSwitchTo(econtext->ecxt_per_tuple_memory);
	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, sizeof(bool) * slot->tts_tupleDescriptor->natts);
	for (int i = 0; i < ndefaults; i++)
	{
		int			att = defaults[i].attnum - 1;

		slot->tts_values[att] = ExecEvalExpr(w->defaults[i], econtext, &slot->tts_isnull[att]);
	}
	slot->tts_values[c[PC_AGGREGATE_ID]] = CStringGetTextDatum(aggregate_id);
	slot->tts_isnull[c[PC_AGGREGATE_ID]] = false;
	slot->tts_values[c[PC_LAST_PUBLISHED_VERSION]] = Int64GetDatum(version);
	slot->tts_isnull[c[PC_LAST_PUBLISHED_VERSION]] = false;
	slot->tts_values[c[PC_LAST_PUBLISHED_AT]] = TimestampTzGetDatum(acked_at);
	slot->tts_isnull[c[PC_LAST_PUBLISHED_AT]] = false;
	slot->tts_values[c[PC_UPDATED_AT]] = TimestampTzGetDatum(now);
	slot->tts_isnull[c[PC_UPDATED_AT]] = false;
	ExecStoreVirtualTuple(slot);
	MemoryContextSwitchTo(oldcxt);
	/* Set by the insert: a BEFORE trigger that returned NULL leaves it so. */
	ItemPointerSetInvalid(&slot->tts_tid);
	outbox_simple_insert(w->rri, w->estate, slot);
	inserted = ItemPointerIsValid(&slot->tts_tid);
	if (inserted)
		remember_row(aggregate_id, &slot->tts_tid);
	ExecClearTuple(slot);
	ResetPerTupleExprContext(w->estate);
	return inserted ? PROGRESS_RECORDED : PROGRESS_CHANGED;
}

/*
 * Record the progress of n aggregates (ids[i] reached versions[i],
 * acknowledged at acked_at[i]; when read, its row was at version xmins[i],
 * at tids[i] if valid, or it had none: has_row[i] false); each one
 * recorded is entered into applied, each whose row another transaction
 * holds into busy (keys allocated in applied_cxt).  Returns the number
 * recorded.
 */
uint64
publish_progress_record(char **ids, int64 *versions, TransactionId *xmins, ItemPointerData *tids,
						bool *has_row, TimestampTz *acked_at, int n, TimestampTz now,
						HTAB *applied, HTAB *busy, MemoryContext applied_cxt)
{
	ProgressWriter w;
	uint64		recorded = 0;
	bool		insert = false;

	for (int i = 0; i < n && !insert; i++)
		insert = !has_row[i];
	writer_open(&w, insert);
	/*
	 * A row trigger an administrator added fires as for the statement (not
	 * statement-level or UPDATE OF triggers: no statement, no column list).
	 */
	AfterTriggerBeginQuery();
	for (int i = 0; i < n; i++)
	{
		ProgressOutcome outcome;
		char	   *key;

		if (!has_row[i])
			outcome = insert_progress(&w, ids[i], versions[i], acked_at[i], now);
		else
		{
			outcome = find_and_lock(&w, ids[i], xmins[i], &tids[i]);
			if (outcome == PROGRESS_RECORDED &&
				!write_progress(&w, versions[i], acked_at[i], now))
				outcome = PROGRESS_CHANGED;
			if (outcome == PROGRESS_RECORDED)
				remember_row(ids[i], &w.next->tts_tid);
		}
		if (outcome == PROGRESS_CHANGED)
			continue;
		key = MemoryContextStrdup(applied_cxt, ids[i]);
		(void) hash_search(outcome == PROGRESS_BUSY ? busy : applied, &key, HASH_ENTER, NULL);
		if (outcome == PROGRESS_RECORDED)
			recorded++;
	}
	AfterTriggerEndQuery(w.estate);
	writer_close(&w);
	CommandCounterIncrement();
	return recorded;
}
