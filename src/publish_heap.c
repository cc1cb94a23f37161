/*-------------------------------------------------------------------------
 *
 * publish_heap.c
 *	  A delta's events read from the outbox's heap where the delta found
 *	  them, a page at a time: one buffer look-up, pin and lock per page
 *	  rather than per event, and no executor, plan or tuple copying of SPI
 *	  in between (they were two thirds of the worker's CPU on a backlog).
 *
 *	  A row version not at its place any more (updated since: attempts, a
 *	  disposition; or gone) is reported missing and the caller finds the
 *	  row by id.  Rows are checked against the active snapshot as a TID
 *	  scan checks them, and against the id the delta recorded (the place may
 *	  hold another row after vacuum, TRUNCATE or VACUUM FULL).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "shmem.h"
#include "stats.h"
#include "util.h"
#include "publish.h"

/* After the event's columns: the one a row read must have NULL. */
#define HEAP_DISPOSITION EC_NCOLUMNS
#define HEAP_NCOLUMNS (EC_NCOLUMNS + 1)

/* The outbox table of the extension, and where each column is in it. */
static Oid	outbox_relid = InvalidOid;
static int	table_columns[HEAP_NCOLUMNS];

/* The outbox's column of each EventColumn, then the disposition. */
static const char *const column_names[HEAP_NCOLUMNS] = {
	[EC_ID] = "id",
	[EC_EVENT_ID] = "event_id",
	[EC_AGGREGATE_TYPE] = "aggregate_type",
	[EC_AGGREGATE_ID] = "aggregate_id",
	[EC_VERSION] = "aggregate_version",
	[EC_EVENT_TYPE] = "event_type",
	[EC_TOPIC] = "topic",
	[EC_HEADERS] = "headers",
	[EC_PAYLOAD] = "payload",
	[EC_CREATED_AT] = "created_at",
	[EC_ATTEMPTS] = "attempts",
	[EC_LAST_ERROR] = "last_error",
	[EC_DEAD_LETTER_REQUESTED] = "dead_letter_requested",
	[EC_PAYLOAD_BYTES] = "payload_bytes",
	[HEAP_DISPOSITION] = "disposition",
};

/*
 * The extension's table in namespace nsp, and where its n columns named in
 * names are (0-based, into columns).
 */
Oid
publish_table_columns(Oid nsp, const char *table, const char *const *names, int n,
					  int *columns)
{
	Oid			relid = get_relname_relid(table, nsp);

	if (!OidIsValid(relid))
		elog(ERROR, "the outbox extension's schema has no table %s", table);
	for (int i = 0; i < n; i++)
	{
		AttrNumber	attnum = get_attnum(relid, names[i]);

		if (attnum == InvalidAttrNumber)
			elog(ERROR, "table %s has no column %s", table, names[i]);
		columns[i] = attnum - 1;
	}
	return relid;
}

/* Look up the outbox of the extension in namespace nsp, and its columns. */
void
publish_heap_prepare(Oid nsp)
{
	outbox_relid = publish_table_columns(nsp, "outbox", column_names, HEAP_NCOLUMNS, table_columns);
}

/* The outbox table the plans are for. */
Oid
publish_heap_relid(void)
{
	return outbox_relid;
}

/*
 * The n columns (names) of rel must still be where columns says: if the
 * table changed since they were looked up (an ALTER EXTENSION UPDATE, an
 * administrator), look them up again now, under the caller's lock.
 */
static void
check_columns(Relation rel, const char *const *names, int n, int *columns)
{
	TupleDesc	desc = RelationGetDescr(rel);

	for (int i = 0; i < n; i++)
	{
		Form_pg_attribute att = columns[i] < desc->natts ? TupleDescAttr(desc, columns[i]) : NULL;

		if (att == NULL || att->attisdropped || strcmp(NameStr(att->attname), names[i]) != 0)
		{
			(void) publish_table_columns(RelationGetNamespace(rel), RelationGetRelationName(rel),
										 names, n, columns);
			return;
		}
	}
}

/*
 * Open the extension's table relid in mode, as the statement this replaces
 * would: the role must have acl on it, and row-level security that applies
 * to the role is refused rather than bypassed.  Its n columns (names) are
 * checked to be where columns says (check_columns).
 */
Relation
publish_open_table(Oid relid, LOCKMODE mode, AclMode acl, const char *const *names, int n,
				   int *columns)
{
	Relation	rel = table_open(relid, mode);

	/* Each privilege on its own: pg_class_aclcheck() accepts any one of several. */
	for (AclMode bit = 1; bit != 0 && bit <= acl; bit <<= 1)
	{
		AclResult	aclresult;

		if ((acl & bit) == 0)
			continue;
		aclresult = pg_class_aclcheck(relid, GetUserId(), bit);
		if (aclresult != ACLCHECK_OK)
			aclcheck_error(aclresult, OBJECT_TABLE, RelationGetRelationName(rel));
	}
	if (check_enable_rls(relid, InvalidOid, true) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("the outbox publisher does not support row-level security on table \"%s\"",
						RelationGetRelationName(rel)),
				 errhint("Disable row-level security on the extension's tables, or publish as a role that bypasses it (outbox.role).")));
	check_columns(rel, names, n, columns);
	return rel;
}

/* Open the outbox for a read (closed at its end, the lock kept to commit). */
Relation
publish_heap_open(void)
{
	return publish_open_table(outbox_relid, AccessShareLock, ACL_SELECT, column_names,
							  HEAP_NCOLUMNS, table_columns);
}

/* Where each event column (EventColumn) is in the outbox's rows (0-based). */
const int *
publish_heap_columns(void)
{
	return table_columns;
}

/* An entry's place as one number (block, then offset), and its position. */
typedef struct PlaceOrder
{
	uint64		place;
	int			pos;
} PlaceOrder;

/*
 * sort_places(places, n): by place, the comparison inlined (qsort_arg()
 * calling ItemPointerCompare() through pointers was a twelfth of a fetch).
 */
#if OUTBOX_HAVE_SORT_TEMPLATE
#define ST_SORT sort_places
#define ST_ELEMENT_TYPE PlaceOrder
#define ST_COMPARE(a, b) ((a)->place < (b)->place ? -1 : (a)->place > (b)->place ? 1 : 0)
#define ST_SCOPE static
#define ST_DEFINE
#include "lib/sort_template.h"
#else
/* qsort comparator for PostgreSQL 13, which has no sort template. */
static int
place_cmp(const void *a, const void *b)
{
	uint64		x = ((const PlaceOrder *) a)->place;
	uint64		y = ((const PlaceOrder *) b)->place;

	return x < y ? -1 : x > y ? 1 : 0;
}
#define sort_places(places, n) qsort(places, n, sizeof(PlaceOrder), place_cmp)
#endif

/*
 * The row of entry e on the locked page of buf if it is still there and
 * visible to snap (a copy in the current context), else NULL.
 */
static HeapTuple
fetch_on_page(Relation rel, Buffer buf, ManifestEntry *e, Snapshot snap)
{
	Page		page = BufferGetPage(buf);
	OffsetNumber off = ItemPointerGetOffsetNumber(&e->tid);
	ItemId		lp;
	HeapTupleData tup;
	TupleDesc	desc = RelationGetDescr(rel);
	bool		isnull;

	if (off < FirstOffsetNumber || off > PageGetMaxOffsetNumber(page))
		return NULL;
	lp = PageGetItemId(page, off);
	if (!ItemIdIsNormal(lp))
		return NULL;
	tup.t_data = (HeapTupleHeader) PageGetItem(page, lp);
	tup.t_len = ItemIdGetLength(lp);
	tup.t_self = e->tid;
	tup.t_tableOid = RelationGetRelid(rel);
	if (!HeapTupleSatisfiesVisibility(&tup, snap, buf))
		return NULL;
	/* Another row in the place, or one disposed of (not to be read). */
	if (DatumGetInt64(heap_getattr(&tup, table_columns[EC_ID] + 1, desc, &isnull)) != e->id ||
		!heap_attisnull(&tup, table_columns[HEAP_DISPOSITION] + 1, desc))
		return NULL;
	return heap_copytuple(&tup);
}

/*
 * The rows of the n entries, visible to the active snapshot, into rows[]
 * (copies in cxt; NULL for a row not at its entry's place any more).
 * The pages are visited in order, each once.
 */
void
publish_heap_fetch(Relation rel, ManifestEntry *entries, int n, HeapTuple *rows,
				   MemoryContext cxt)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(cxt);
	Snapshot	snap = GetActiveSnapshot();
	BlockNumber nblocks = RelationGetNumberOfBlocks(rel);
	PlaceOrder *order = palloc(sizeof(PlaceOrder) * Max(n, 1));
	Buffer		buf = InvalidBuffer;
	int			nread = 0;

	for (int i = 0; i < n; i++)
	{
		order[i].place = ((uint64) ItemPointerGetBlockNumber(&entries[i].tid) << 16) |
			ItemPointerGetOffsetNumber(&entries[i].tid);
		order[i].pos = i;
	}
	sort_places(order, n);
	for (int k = 0; k < n; k++)
	{
		ManifestEntry *e = &entries[order[k].pos];
		BlockNumber blk = ItemPointerGetBlockNumber(&e->tid);

		rows[order[k].pos] = NULL;
		/* A place past the end: the table was truncated since. */
		if (blk >= nblocks)
			continue;
		if (!BufferIsValid(buf) || BufferGetBlockNumber(buf) != blk)
		{
			if (BufferIsValid(buf))
				UnlockReleaseBuffer(buf);
			buf = ReadBuffer(rel, blk);
			LockBuffer(buf, BUFFER_LOCK_SHARE);
		}
		rows[order[k].pos] = fetch_on_page(rel, buf, e, snap);
		nread++;
	}
	if (BufferIsValid(buf))
		UnlockReleaseBuffer(buf);
	outbox_count(OC_HEAP_ROWS_READ, nread);
	pfree(order);
	MemoryContextSwitchTo(oldcxt);
}
