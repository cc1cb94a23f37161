/*-------------------------------------------------------------------------
 *
 * publish_delta.c
 *	  A delta's manifest read without a statement: the outbox's rows of the
 *	  transactions the read's snapshot sees and the previous read's did not
 *	  (PgQ's batch of a tick), of this worker's share of the buckets, found
 *	  through the txid index and ordered by aggregate (hashtext, then
 *	  version) in memory.
 *
 *	  It replaces one SQL statement: its executor start-up (an init plan,
 *	  a sort node) was most of a small read's cost under a steady load, and
 *	  its sort spilled to disk past work_mem on a large delta (half of the
 *	  time of a 100,000-event delta).  The conditions are the statement's:
 *	  txid >= the previous snapshot's xmin (the index bound), not visible in
 *	  the previous snapshot, visible in this one; rows are visible to the
 *	  active snapshot, which is the read's.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_am.h"
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

#include "outbox.h"
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

/* The index on outbox (txid) of the extension. */
static Oid	txid_index = InvalidOid;

/* A row of the delta, as it is sorted. */
typedef struct DeltaRow
{
	int32		hash;			/* hashtext(aggregate_id), signed as in SQL */
	int64		version;
	int64		id;
	ItemPointerData tid;
} DeltaRow;

/* Look up the outbox's txid index of the extension in namespace nsp. */
void
publish_delta_prepare(Oid nsp)
{
	txid_index = get_relname_relid("outbox_txid_idx", nsp);
	if (!OidIsValid(txid_index))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("the outbox extension's index \"outbox_txid_idx\" is missing"),
				 errhint("Recreate it: CREATE INDEX outbox_txid_idx ON outbox (txid).")));
}

/* Open the txid index, checked to be a btree on the outbox's txid alone. */
static Relation
open_txid_index(Relation heap)
{
	Relation	index = index_open(txid_index, AccessShareLock);

	if (index->rd_index->indrelid != RelationGetRelid(heap) ||
		index->rd_rel->relam != BTREE_AM_OID ||
		index->rd_index->indnkeyatts != 1 ||
		index->rd_index->indkey.values[0] != delta_columns[DC_TXID] + 1 ||
		index->rd_indpred != NIL || !index->rd_index->indisvalid)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"%s\" is not the outbox extension's btree index on outbox (txid)",
						RelationGetRelationName(index)),
				 errhint("Recreate it: CREATE INDEX outbox_txid_idx ON outbox (txid).")));
	return index;
}

/* qsort comparator: by hash, then version (then id: a stable order). */
static int
delta_row_cmp(const void *a, const void *b)
{
	const DeltaRow *x = a;
	const DeltaRow *y = b;

	if (x->hash != y->hash)
		return x->hash < y->hash ? -1 : 1;
	if (x->version != y->version)
		return x->version < y->version ? -1 : 1;
	return x->id < y->id ? -1 : (x->id > y->id ? 1 : 0);
}

/* Is this worker's share of the buckets the one of hash h? */
static inline bool
in_share(uint32 h, int nshares, int share)
{
	return nshares == 1 || (int) (((h & 0x7fffffff) % OUTBOX_PUBLISH_BUCKETS) % nshares) == share;
}

/*
 * The rows of the slot's row version into rows[*n] if it is of the delta
 * (between the snapshots from and to) and of this worker's share.
 */
static void
add_if_in_delta(TupleTableSlot *slot, Datum from, Datum to, int nshares, int share,
				DeltaRow **rows, int *n, int *size)
{
	bool		isnull;
	Datum		txid = slot_getattr(slot, delta_columns[DC_TXID] + 1, &isnull);
	text	   *agg;
	uint32		h;
	DeltaRow   *r;

	if (isnull ||
		DatumGetBool(DirectFunctionCall2(pg_visible_in_snapshot, txid, from)) ||
		!DatumGetBool(DirectFunctionCall2(pg_visible_in_snapshot, txid, to)))
		return;
	agg = DatumGetTextPP(slot_getattr(slot, delta_columns[DC_AGGREGATE_ID] + 1, &isnull));
	/* hashtext() of a deterministic collation, as the SQL share and order use */
	h = hash_bytes((const unsigned char *) VARDATA_ANY(agg), VARSIZE_ANY_EXHDR(agg));
	if (!in_share(h, nshares, share))
		return;
	if (*n == *size)
	{
		*size *= 2;
		*rows = repalloc_huge(*rows, sizeof(DeltaRow) * *size);
	}
	r = &(*rows)[(*n)++];
	r->hash = (int32) h;
	r->version = DatumGetInt64(slot_getattr(slot, delta_columns[DC_VERSION] + 1, &isnull));
	r->id = DatumGetInt64(slot_getattr(slot, delta_columns[DC_ID] + 1, &isnull));
	r->tid = slot->tts_tid;
}

/*
 * The delta between snapshot from (the previous read's, as text) and the
 * read's snapshot to: its entries (palloc'd in the current context) in
 * aggregate order, of the share-th of nshares shares.  Returns how many.
 */
int
publish_delta_read(const char *from, const char *to, int nshares, int share,
				   ManifestEntry **entries)
{
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "outbox delta",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext oldcxt = MemoryContextSwitchTo(cxt);
	Datum		from_snap = DirectFunctionCall1(pg_snapshot_in, CStringGetDatum(from));
	Datum		to_snap = DirectFunctionCall1(pg_snapshot_in, CStringGetDatum(to));
	Relation	heap = publish_open_table(publish_heap_relid(), AccessShareLock, ACL_SELECT,
										  delta_names, DC_NCOLUMNS, delta_columns);
	Relation	index = open_txid_index(heap);
	TupleTableSlot *slot = table_slot_create(heap, NULL);
	IndexScanDesc scan;
	ScanKeyData key;
	int			size = 1024;
	int			n = 0;
	DeltaRow   *rows = palloc(sizeof(DeltaRow) * size);
	ManifestEntry *out;

	ScanKeyInit(&key, 1, BTGreaterEqualStrategyNumber, F_XID8GE,
				DirectFunctionCall1(pg_snapshot_xmin, from_snap));
	scan = index_beginscan(heap, index, GetActiveSnapshot(), 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		CHECK_FOR_INTERRUPTS();
		add_if_in_delta(slot, from_snap, to_snap, nshares, share, &rows, &n, &size);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(heap, NoLock);

	qsort(rows, n, sizeof(DeltaRow), delta_row_cmp);
	MemoryContextSwitchTo(oldcxt);
	out = palloc_extended(sizeof(ManifestEntry) * Max(n, 1), MCXT_ALLOC_HUGE);
	for (int i = 0; i < n; i++)
	{
		out[i].id = rows[i].id;
		out[i].tid = rows[i].tid;
	}
	MemoryContextDelete(cxt);
	*entries = out;
	return n;
}
