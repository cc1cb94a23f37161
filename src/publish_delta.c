/*-------------------------------------------------------------------------
 *
 * publish_delta.c
 *	  A delta's manifest read without a statement: the outbox's rows of the
 *	  transactions the read's snapshot sees and the previous read's did not
 *	  (PgQ's batch of a tick), of this worker's share of the buckets, found
 *	  through the txid index and ordered by aggregate (hashtext, then
 *	  version) in memory.
 *
 *	  The extension's txid index carries what the manifest needs besides
 *	  the row's place: (txid) INCLUDE (aggregate_version, id, aggregate_id).
 *	  The delta is then read from the index alone, without visiting the
 *	  heap: a row's transaction is judged by the txid in the entry (once per
 *	  transaction, entries of one transaction being adjacent), its share by
 *	  its aggregate's hash, and only this worker's share is kept, so a
 *	  worker's read of the heap is in proportion to its share, once per row
 *	  (publish_heap.c, where the row's own visibility is checked).  An entry
 *	  whose row version is not visible (an aborted subtransaction's, an
 *	  updated row's old version) is found missing there and looked up by
 *	  id: an updated row's versions share an id, so the manifest keeps one
 *	  entry per id.  Visiting the heap per entry to learn the aggregate cost
 *	  2,000 instructions an entry (a sixth of a drain's reading, callgrind),
 *	  and every worker paid it for the whole delta.
 *	  (Included columns, not keys: an emit's insert compares the txid alone,
 *	  and computes no expression.)
 *
 *	  With an index on txid alone (as 0.1.0 made it, or an administrator)
 *	  each entry's row is visited in the heap; without a usable txid index
 *	  (dropped, invalid) the same rows are found by a sequential scan, as
 *	  the statement it replaces would have.
 *
 *	  It replaces one SQL statement: its executor start-up (an init plan,
 *	  a sort node) was most of a small read's cost under a steady load, and
 *	  its sort spilled to disk past work_mem on a large delta (half of the
 *	  time of a 100,000-event delta).  The conditions are the statement's:
 *	  txid >= the previous snapshot's xmin (the index bound), not visible in
 *	  the previous snapshot, visible in this one; rows are visible to the
 *	  active snapshot, which is the read's.
 *
 *	  It also finds how far the WAL must be flushed before the delta's
 *	  events go out (invariant 1: a crash must not take back a published
 *	  event): a commit made visible with synchronous_commit on was flushed
 *	  before it became visible; an emitting transaction that commits with it
 *	  off is counted in shared memory from its pre-commit until the end of
 *	  its commit record is recorded there (shmem.c), so a read whose
 *	  snapshot sees it flushes that far, or to the end of the WAL while one
 *	  is still counted.  Under a steady load of synchronous emitters the
 *	  publisher then does not flush at all.
 *
 *	  A row written otherwise marks its transaction the same way, through
 *	  the outbox's triggers (outbox_note_write): a statement trigger for an
 *	  INSERT or COPY by the table's owner, a row trigger in replica mode for
 *	  logical replication's apply (which fires no statement trigger).  The
 *	  commit log's group LSN was the bound before the count; the publisher's
 *	  own asynchronous settling raised it in nearly every 32-transaction
 *	  group, which cost a flush per read.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/itup.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "common/hashfn.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/xid8.h"

#include "compat.h"
#include "shmem.h"
#include "stats.h"
#include "util.h"
#include "publish.h"

/* The columns a delta reads, and where they are in the outbox (0-based). */
enum
{
	DC_ID,
	DC_AGGREGATE_ID,
	DC_VERSION,
	DC_TXID,
	DC_NCOLUMNS
};
static const char *const delta_names[DC_NCOLUMNS] = {
	[DC_ID] = "id",
	[DC_AGGREGATE_ID] = "aggregate_id",
	[DC_VERSION] = "aggregate_version",
	[DC_TXID] = "txid",
};
static int	delta_columns[DC_NCOLUMNS];

/*
 * The highest commit LSN that must be flushed before the events of the
 * deltas read so far are published (only ever raised: flushing again is a
 * no-op).
 */
static XLogRecPtr commits_lsn = InvalidXLogRecPtr;

/* A row of the delta, as it is sorted. */
typedef struct DeltaRow
{
	int32		hash;			/* hashtext(aggregate_id), signed as in SQL */
	int64		version;
	int64		id;
	ItemPointerData tid;
} DeltaRow;

/*
 * The extension's index on outbox (txid), opened, if it is usable: looked up
 * by name under the heap's lock (a DROP INDEX before it left no stale OID;
 * one CONCURRENTLY, which does not conflict with that lock, can fail this
 * read once, and the loop reads again), a valid btree led by txid, not
 * partial.  NULL otherwise: the delta is then found by a sequential scan,
 * slower but the same rows.  *covering: it is the extension's (txid)
 * INCLUDE (aggregate_version, id, aggregate_id), read alone.
 */
static Relation
open_txid_index(Relation heap, bool *covering)
{
	Oid			indexoid = get_relname_relid("outbox_txid_idx", RelationGetNamespace(heap));
	Relation	index;
	int2vector *key;

	*covering = false;
	if (!OidIsValid(indexoid) || get_rel_relkind(indexoid) != RELKIND_INDEX)
		return NULL;
	index = index_open(indexoid, AccessShareLock);
	key = &index->rd_index->indkey;
	if (index->rd_index->indrelid != RelationGetRelid(heap) ||
		index->rd_rel->relam != BTREE_AM_OID ||
		!index->rd_index->indisvalid ||
		key->values[0] != delta_columns[DC_TXID] + 1 ||
		RelationGetIndexPredicate(index) != NIL)
	{
		index_close(index, AccessShareLock);
		return NULL;
	}
	*covering = index->rd_index->indnatts == 4 && index->rd_index->indnkeyatts == 1 &&
		key->values[1] == delta_columns[DC_VERSION] + 1 &&
		key->values[2] == delta_columns[DC_ID] + 1 &&
		key->values[3] == delta_columns[DC_AGGREGATE_ID] + 1;
	return index;
}

/* Delta row order: by hash, then version (then id: a stable order). */
static inline int
delta_row_cmp(const DeltaRow *x, const DeltaRow *y)
{
	if (x->hash != y->hash)
		return x->hash < y->hash ? -1 : 1;
	if (x->version != y->version)
		return x->version < y->version ? -1 : 1;
	return x->id < y->id ? -1 : (x->id > y->id ? 1 : 0);
}

/*
 * sort_delta_rows(rows, n): a sort specialised for DeltaRow, the comparison
 * inlined (qsort's calls through a pointer were a tenth of the worker's
 * time draining a 100,000-event backlog).
 */
#if OUTBOX_HAVE_SORT_TEMPLATE
#define ST_SORT sort_delta_rows
#define ST_ELEMENT_TYPE DeltaRow
#define ST_COMPARE(a, b) delta_row_cmp(a, b)
#define ST_SCOPE static
#define ST_DEFINE
#include "lib/sort_template.h"
#else
/* qsort comparator for PostgreSQL 13, which has no sort template. */
static int
delta_row_qsort_cmp(const void *a, const void *b)
{
	return delta_row_cmp(a, b);
}
#define sort_delta_rows(rows, n) qsort(rows, n, sizeof(DeltaRow), delta_row_qsort_cmp)
#endif

/*
 * Raise commits_lsn for the asynchronous emitters the read's snapshot (taken
 * before) may see: the highest end of their commit records, or the end of
 * the WAL now while one is between its pre-commit and that record's end
 * being noted (see shmem.c's count_async_commit).
 */
static void
note_async_emits(void)
{
	XLogRecPtr	lsn;

	/* After the snapshot, the count; after the count, the LSN. */
	pg_memory_barrier();
	if (pg_atomic_read_u32(&outbox_shared->async_emits_committing) > 0)
		lsn = GetXLogInsertRecPtr();
	else
	{
		pg_read_barrier();
		lsn = pg_atomic_read_u64(&outbox_shared->async_emit_lsn);
	}
	if (lsn > commits_lsn)
		commits_lsn = lsn;
}

/*
 * How far to flush the WAL before publishing what the deltas read: their
 * commits' needs, at most upto (the end of the WAL when the read's
 * snapshot was taken, which every commit it sees precedes).
 */
XLogRecPtr
publish_delta_flush_upto(XLogRecPtr upto)
{
	return Min(commits_lsn, upto);
}

/* Is this worker's share of the buckets the one of hash h? */
static inline bool
in_share(uint32 h, int nshares, int share)
{
	return nshares == 1 || (int) (OUTBOX_PUBLISH_BUCKET(h) % nshares) == share;
}

/* The delta's rows as they are found: an array that grows. */
typedef struct DeltaRows
{
	DeltaRow   *rows;
	int			n;
	int			size;
	int			nvisited;		/* rows visited in the heap to find them */
	int			nshares;		/* this worker's share of the buckets */
	int			share;
	Datum		from;			/* the previous read's snapshot */
	Datum		to;				/* this read's */
} DeltaRows;

/* Is transaction txid (xid8) of the delta: unseen by from, seen by to? */
static bool
txid_in_delta(DeltaRows *d, Datum txid)
{
	return !DatumGetBool(DirectFunctionCall2(pg_visible_in_snapshot, txid, d->from)) &&
		DatumGetBool(DirectFunctionCall2(pg_visible_in_snapshot, txid, d->to));
}

/* Add a row of the delta (hash: hashtext(aggregate_id)) if of our share. */
static inline void
add_row(DeltaRows *d, uint32 h, int64 version, int64 id, ItemPointer tid)
{
	DeltaRow   *r;

	if (!in_share(h, d->nshares, d->share))
		return;
	if (d->n == d->size)
	{
		d->size *= 2;
		d->rows = repalloc_huge(d->rows, sizeof(DeltaRow) * d->size);
	}
	r = &d->rows[d->n++];
	r->hash = (int32) h;
	r->version = version;
	r->id = id;
	r->tid = *tid;
}

/*
 * The row of the slot's row version, if it is of the delta and of this
 * worker's share.
 */
static void
add_if_in_delta(TupleTableSlot *slot, DeltaRows *d)
{
	bool		isnull;
	Datum		txid = slot_getattr(slot, delta_columns[DC_TXID] + 1, &isnull);
	text	   *agg;
	Datum		id;
	Datum		version;
	Datum		aggregate_id;

	d->nvisited++;
	/* (Not before the previous snapshot's xmin: visible in it.) */
	if (isnull || !txid_in_delta(d, txid))
		return;
	/* NOT NULL in the schema; a row without them is no event to publish. */
	aggregate_id = slot_getattr(slot, delta_columns[DC_AGGREGATE_ID] + 1, &isnull);
	if (isnull)
		return;
	version = slot_getattr(slot, delta_columns[DC_VERSION] + 1, &isnull);
	if (isnull)
		return;
	id = slot_getattr(slot, delta_columns[DC_ID] + 1, &isnull);
	if (isnull)
		return;
	agg = DatumGetTextPP(aggregate_id);
	/* hashtext() of a deterministic collation, as the SQL share and order use */
	add_row(d, hash_bytes((const unsigned char *) VARDATA_ANY(agg), VARSIZE_ANY_EXHDR(agg)),
			DatumGetInt64(version), DatumGetInt64(id), &slot->tts_tid);
}

/*
 * The delta's entries from the covering txid index alone (scan positioned
 * by the caller): (txid) INCLUDE (version, id, aggregate_id), each
 * transaction's verdict computed once for its run of adjacent entries.
 */
static void
read_index_only(IndexScanDesc scan, DeltaRows *d)
{
	FullTransactionId last = InvalidFullTransactionId;
	bool		last_in = false;
	ItemPointer tid;

	while ((tid = index_getnext_tid(scan, ForwardScanDirection)) != NULL)
	{
		IndexTuple	itup = scan->xs_itup;
		TupleDesc	desc = scan->xs_itupdesc;
		bool		isnull[4];
		Datum		txid = index_getattr(itup, 1, desc, &isnull[0]);
		Datum		version;
		Datum		id;
		Datum		aggregate_id;
		text	   *agg;

		CHECK_FOR_INTERRUPTS();
		if (isnull[0])
			continue;
		if (!FullTransactionIdEquals(DatumGetFullTransactionId(txid), last))
		{
			last = DatumGetFullTransactionId(txid);
			last_in = txid_in_delta(d, txid);
		}
		if (!last_in)
			continue;
		version = index_getattr(itup, 2, desc, &isnull[1]);
		id = index_getattr(itup, 3, desc, &isnull[2]);
		aggregate_id = index_getattr(itup, 4, desc, &isnull[3]);
		if (isnull[1] || isnull[2] || isnull[3])
			continue;
		agg = DatumGetTextPP(aggregate_id);
		/* hashtext() of a deterministic collation, as the SQL share and order use */
		add_row(d, hash_bytes((const unsigned char *) VARDATA_ANY(agg), VARSIZE_ANY_EXHDR(agg)),
				DatumGetInt64(version), DatumGetInt64(id), tid);
		if ((Pointer) agg != DatumGetPointer(aggregate_id))
			pfree(agg);
	}
}

/* Find the delta's rows through the txid index from the previous xmin on. */
static void
read_by_txid_index(Relation heap, Relation index, bool covering, TupleTableSlot *slot,
				   DeltaRows *d)
{
	IndexScanDesc scan = outbox_index_beginscan(heap, index, GetActiveSnapshot(), 1, 0);
	ScanKeyData key;

	ScanKeyInit(&key, 1, BTGreaterEqualStrategyNumber, F_XID8GE,
				DirectFunctionCall1(pg_snapshot_xmin, d->from));
	scan->xs_want_itup = covering;
	index_rescan(scan, &key, 1, NULL, 0);
	if (covering)
		read_index_only(scan, d);
	else
		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			CHECK_FOR_INTERRUPTS();
			add_if_in_delta(slot, d);
		}
	index_endscan(scan);
}

/*
 * The delta between snapshot from (the previous read's, as text) and the
 * read's snapshot to: its entries (palloc'd in the current context) in
 * aggregate order, one per row (by id), of the share-th of nshares shares.
 * Returns how many.
 */
int
publish_delta_read(const char *from, const char *to, int nshares, int share,
				   ManifestEntry **entries)
{
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "outbox delta",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext oldcxt = MemoryContextSwitchTo(cxt);
	Relation	heap = publish_open_table(publish_heap_relid(), AccessShareLock, ACL_SELECT,
										  delta_names, DC_NCOLUMNS, delta_columns);
	bool		covering;
	Relation	index = open_txid_index(heap, &covering);
	TupleTableSlot *slot = table_slot_create(heap, NULL);
	DeltaRows	d;
	ManifestEntry *out;
	int			n = 0;

	d.from = DirectFunctionCall1(pg_snapshot_in, CStringGetDatum(from));
	d.to = DirectFunctionCall1(pg_snapshot_in, CStringGetDatum(to));
	d.nshares = nshares;
	d.share = share;
	d.size = 1024;
	d.n = 0;
	d.nvisited = 0;
	d.rows = palloc(sizeof(DeltaRow) * d.size);

	note_async_emits();

	if (index != NULL)
	{
		read_by_txid_index(heap, index, covering, slot, &d);
		index_close(index, NoLock);
	}
	else
	{
		TableScanDesc scan = table_beginscan(heap, GetActiveSnapshot(), 0, NULL);

		while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
		{
			CHECK_FOR_INTERRUPTS();
			add_if_in_delta(slot, &d);
		}
		table_endscan(scan);
	}
	ExecDropSingleTupleTableSlot(slot);
	table_close(heap, NoLock);
	outbox_count(OC_HEAP_ROWS_READ, d.nvisited);

	sort_delta_rows(d.rows, d.n);
	MemoryContextSwitchTo(oldcxt);
	out = palloc_extended(sizeof(ManifestEntry) * Max(d.n, 1), MCXT_ALLOC_HUGE);
	for (int i = 0; i < d.n; i++)
	{
		/* An id's versions are adjacent (same hash and version): one entry. */
		if (n > 0 && out[n - 1].id == d.rows[i].id)
			continue;
		out[n].id = d.rows[i].id;
		out[n].tid = d.rows[i].tid;
		out[n].hash = d.rows[i].hash;
		n++;
	}
	MemoryContextDelete(cxt);
	*entries = out;
	return n;
}
