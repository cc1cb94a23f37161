/*-------------------------------------------------------------------------
 *
 * emit.c
 *	  outbox_emit() and its siblings: assign an event its aggregate version
 *	  and write it to the outbox in the caller's transaction.
 *
 * Each call first checks its arguments (emit_check.c: identifiers, topic,
 * headers, sizes), before anything is locked or written.  Then it takes
 * its aggregate's lock (an advisory tag in the extension's own key space,
 * OUTBOX_LOCKSPACE_EMIT, held until the transaction ends), so emitters of
 * one aggregate are serialized and versions follow commit order; reads the
 * aggregate's last version under that lock, with a snapshot taken after it
 * was granted (under REPEATABLE READ or SERIALIZABLE a version committed
 * after the transaction's snapshot is a serialization failure); and inserts
 * the row through the table's own code, as the outbox's owner, with the
 * outbox's indexes and defaults looked up once per backend (reset by a
 * relcache invalidation of the tables).  The last version assigned in the
 * transaction is remembered, so that the next event of the same aggregate
 * needs no look-up.  Event ids are UUID version 7 unless the caller gives
 * one.  Emitters never wait for Kafka: a commit only wakes the publishers.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/time.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "access/transam.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "parser/parse_relation.h"
#include "port/pg_bswap.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
#include "utils/uuid.h"

#include "compat.h"
#include "kafka.h"
#include "emit.h"
#include "emit_check.h"
#include "shmem.h"
#include "util.h"
#include "record_headers.h"

PG_FUNCTION_INFO_V1(outbox_emit);
PG_FUNCTION_INFO_V1(outbox_emit_raw);
PG_FUNCTION_INFO_V1(outbox_emit_many);
PG_FUNCTION_INFO_V1(outbox_emit_many_raw);
PG_FUNCTION_INFO_V1(outbox_uuid_v7);

/*
 * len (at most 64) bytes from pg_strong_random(), drawn 512 at a time: one
 * call costs as much as the rest of an event id.  Refilled in a new process
 * (never shared with a forked child).
 */
static void
strong_random_bytes(uint8 *buf, int len)
{
	static uint8 pool[512];
	static int	pool_left = 0;
	static int	pool_pid = 0;

	Assert(len <= 64);
	if (pool_left < len || pool_pid != MyProcPid)
	{
		if (!pg_strong_random(pool, sizeof(pool)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate random values")));
		pool_left = sizeof(pool);
		pool_pid = MyProcPid;
	}
	memcpy(buf, pool + sizeof(pool) - pool_left, len);
	/* Each byte is handed out once. */
	memset(pool + sizeof(pool) - pool_left, 0, len);
	pool_left -= len;
}

/*
 * RFC 9562 version 7: 48 bits of Unix milliseconds, then random bits.
 * Within one backend the 12 bits after the timestamp count sub-millisecond
 * calls so that ids from one session sort in creation order.
 */
static void
generate_uuid_v7(pg_uuid_t *uuid)
{
	static uint64 last_ms = 0;
	static uint16 seq = 0;
	struct timeval tv;
	uint64		ms;
	uint64		ms_be;

	gettimeofday(&tv, NULL);
	ms = (uint64) tv.tv_sec * 1000 + tv.tv_usec / 1000;
	if (ms <= last_ms)
	{
		/* Same millisecond (or clock stepped back): keep ids increasing. */
		if (++seq > 0x0fff)
		{
			seq = 0;
			last_ms++;
		}
		ms = last_ms;
	}
	else
	{
		last_ms = ms;
		seq = (uint16) (outbox_random_u32() & 0x07ff);
	}

	strong_random_bytes(uuid->data + 8, UUID_LEN - 8);

	ms_be = pg_hton64(ms << 16);
	memcpy(uuid->data, &ms_be, 6);
	uuid->data[6] = 0x70 | ((seq >> 8) & 0x0f);
	uuid->data[7] = seq & 0xff;
	uuid->data[8] = (uuid->data[8] & 0x3f) | 0x80;	/* RFC 4122 variant */
}

/*
 * A new UUID version 7 as text, as uuid_out() writes it (lowercase hex,
 * 8-4-4-4-12), without a function call through fmgr.
 */
static char *
uuid_v7_text(void)
{
	static const char hex[] = "0123456789abcdef";
	pg_uuid_t	uuid;
	char	   *out = palloc(2 * UUID_LEN + 5);
	char	   *p = out;

	generate_uuid_v7(&uuid);
	for (int i = 0; i < UUID_LEN; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[uuid.data[i] >> 4];
		*p++ = hex[uuid.data[i] & 0x0f];
	}
	*p = '\0';
	return out;
}

/* outbox_uuid_v7(): a new UUID version 7, as event ids are made. */
Datum
outbox_uuid_v7(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));

	generate_uuid_v7(uuid);
	PG_RETURN_UUID_P(uuid);
}

/*
 * The columns outbox_emit() sets; every other column of the outbox gets its
 * default (the id from its identity sequence, created_at...), so a column
 * with a default needs no change here, and one emit sets needs one line in
 * each of these two lists.
 */
typedef enum EmitColumn
{
	COL_EVENT_ID,
	COL_AGGREGATE_TYPE,
	COL_AGGREGATE_ID,
	COL_AGGREGATE_VERSION,
	COL_EVENT_TYPE,
	COL_TOPIC,
	COL_HEADERS,
	COL_PAYLOAD,
	COL_PAYLOAD_BYTES,
	EMIT_NCOLUMNS
} EmitColumn;

static const char *const emit_column_names[EMIT_NCOLUMNS] = {
	"event_id", "aggregate_type", "aggregate_id", "aggregate_version",
	"event_type", "topic", "headers", "payload", "payload_bytes"
};

/*
 * What outbox_emit() needs of the extension's tables, looked up once per
 * backend rather than per call (the reason it does not go through SPI:
 * parsing, planning and executor start-up cost more than the insert).
 * Reset by any relcache invalidation of the two tables, which also covers
 * their indexes, defaults and owner changing; rebuilt on the next call.
 */
typedef struct EmitRelations
{
	bool		valid;
	Oid			nspid;			/* the extension's schema */
	Oid			outbox;
	Oid			owner;			/* the outbox's owner, who writes it */
	Oid			position_index; /* unique (aggregate_id, aggregate_version) */
	Oid			event_id_index; /* unique (event_id) */
	AttrNumber	attnums[EMIT_NCOLUMNS];
	AttrNumber	id_attnum;
	int			ndefaults;
	OutboxColumnDefault *defaults; /* of the columns outbox_emit() leaves */
	Oid			publication;	/* aggregate_publication */
	Oid			publication_pkey;	/* (aggregate_id) */
	AttrNumber	last_published_attnum;
	int			nindexes;		/* the outbox's indexes */
	Oid		   *index_oids;
	IndexInfo **index_infos;	/* NULL: built per call */
	MemoryContext cxt;			/* the defaults and index infos */
	bool		defaults_builtin;	/* calling built-in functions only */
	ExprState **default_states; /* kept (see kept_default_states), or NULL */
	Oid			default_states_user;	/* whose EXECUTE rights they checked */
	uint64		states_inval_count; /* emit_inval_count when set up */
	MemoryContext states_cxt;	/* default_states', in cxt (NULL: none yet) */
} EmitRelations;

static EmitRelations rels;

/* Set by an invalidation of the tables while load_relations() runs. */
static bool rels_invalidated = false;

/*
 * Counts invalidations of functions, roles and role memberships: a cache
 * built from them (kept_default_states(), call_cache) is current while the
 * count is the one read before it was built.
 */
static uint64 emit_inval_count = 1;

/*
 * The result type and schema of the last emit function called, kept from
 * one query to the next rather than looked up on each (a prepared
 * statement's function is set up anew at each execution).
 */
static struct
{
	uint64		inval_count;	/* emit_inval_count when built (0: never) */
	Oid			fn_oid;
	Oid			rettype;		/* emitted_event */
	Oid			nspid;			/* the extension's schema */
}			call_cache;

/*
 * The last version this transaction assigned, to the aggregate it emitted
 * to last, and the row that has it.  The transaction holds that
 * aggregate's lock since then, so no other can have added a version: while
 * the row is still visible to it, it is the last one, and the next event of
 * the aggregate (outbox_emit_many(), a statement emitting many events)
 * needs no look-up.  Forgotten when the transaction ends, when a
 * subtransaction aborts (the lock may have gone with it) and when the
 * tables are looked up again.
 */
static struct
{
	bool		valid;
	int64		version;
	ItemPointerData tid;
	char		aggregate_id[OUTBOX_MAX_IDENTIFIER_BYTES + 1];
} last_emit;

/* Transaction callback: last_emit is valid within one transaction only. */
static void
emit_xact_callback(XactEvent event, void *arg)
{
	last_emit.valid = false;
}

/* Subtransaction callback: an abort may have released the lock. */
static void
emit_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		last_emit.valid = false;
}

/* Whether relid is one of the outbox's indexes. */
static bool
is_outbox_index(Oid relid)
{
	for (int i = 0; i < rels.nindexes; i++)
		if (rels.index_oids[i] == relid)
			return true;
	return false;
}

/*
 * Relcache invalidation callback: forget the tables if either changed, or
 * an index of the outbox did (becoming ready for inserts, say).
 */
static void
emit_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == rels.outbox || relid == rels.publication ||
		is_outbox_index(relid))
	{
		rels.valid = false;
		rels_invalidated = true;
		last_emit.valid = false;
	}
}

/*
 * Syscache invalidation callback (functions, roles, role memberships): a
 * function's result type, or the EXECUTE rights that kept default
 * expressions were set up with, may have changed.
 */
static void
emit_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	emit_inval_count++;
}

/* Registers the callbacks that keep this file's caches current, once. */
static void
register_callbacks(void)
{
	static bool registered = false;

	if (registered)
		return;
	CacheRegisterRelcacheCallback(emit_relcache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(PROCOID, emit_syscache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHOID, emit_syscache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHMEMMEMROLE, emit_syscache_callback, (Datum) 0);
	RegisterXactCallback(emit_xact_callback, NULL);
	RegisterSubXactCallback(emit_subxact_callback, NULL);
	registered = true;
}

/* A column of an extension table, or an error if it is missing. */
static AttrNumber
required_attnum(Relation rel, const char *name)
{
	AttrNumber	attnum = attnameAttNum(rel, name, false);

	if (attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("outbox_emit: column \"%s\" of table \"%s\" is missing",
						name, RelationGetRelationName(rel)),
				 errhint("Re-create the outbox extension.")));
	return attnum;
}

/*
 * The valid unique btree index of rel on exactly these columns, in this
 * order, or an error.
 */
static Oid
required_unique_index(Relation rel, int natts, const AttrNumber *attnums)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index form = index->rd_index;
		bool		match = form->indisunique && form->indisvalid &&
			form->indimmediate && index->rd_rel->relam == BTREE_AM_OID &&
			form->indnkeyatts == natts && RelationGetIndexPredicate(index) == NIL;

		for (int i = 0; match && i < natts; i++)
			match = form->indkey.values[i] == attnums[i];
		index_close(index, AccessShareLock);
		if (match)
			return lfirst_oid(lc);
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("outbox_emit: a unique index of table \"%s\" is missing",
					RelationGetRelationName(rel)),
			 errhint("Re-create the outbox extension.")));
	return InvalidOid;			/* keep compiler quiet */
}

/* A table of the extension, opened, or an error if it is missing. */
static Relation
open_extension_table(const char *name, Oid nspid)
{
	Oid			relid = get_relname_relid(name, nspid);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("outbox_emit: table \"%s\" of the outbox extension is missing", name),
				 errhint("Re-create the outbox extension.")));
	return table_open(relid, AccessShareLock);
}

/*
 * The outbox's indexes, with the IndexInfo of each plain btree index (no
 * expression) built once per backend, its predicate ready to evaluate,
 * rather than by ExecOpenIndices() and ExecInsertIndexTuples() on every
 * call.  Other indexes an administrator may add get theirs per call: their
 * access methods may keep per-call state in it.
 */
static void
load_indexes(Relation rel)
{
	List	   *oids = RelationGetIndexList(rel);
	MemoryContext old = MemoryContextSwitchTo(rels.cxt);
	ListCell   *lc;

	rels.index_oids = palloc(sizeof(Oid) * Max(list_length(oids), 1));
	rels.index_infos = palloc0(sizeof(IndexInfo *) * Max(list_length(oids), 1));
	foreach(lc, oids)
	{
		int			i = rels.nindexes;
		Relation	index;

		/* Known before it is opened: an invalidation meanwhile counts. */
		rels.index_oids[i] = lfirst_oid(lc);
		rels.nindexes++;
		index = index_open(lfirst_oid(lc), AccessShareLock);
		if (index->rd_rel->relam == BTREE_AM_OID && RelationGetIndexExpressions(index) == NIL)
		{
			IndexInfo  *info = BuildIndexInfo(index);

			if (info->ii_Predicate != NIL)
				info->ii_PredicateState =
					ExecInitQual((List *) expression_planner((Expr *) info->ii_Predicate), NULL);
			rels.index_infos[i] = info;
		}
		index_close(index, AccessShareLock);
	}
	MemoryContextSwitchTo(old);
}

/*
 * Opens the outbox's indexes for inserts into rri, as ExecOpenIndices()
 * does, with the IndexInfos load_indexes() built.
 */
static void
open_indexes(ResultRelInfo *rri)
{
	rri->ri_NumIndices = rels.nindexes;
	rri->ri_IndexRelationDescs = palloc(sizeof(Relation) * Max(rels.nindexes, 1));
	rri->ri_IndexRelationInfo = palloc(sizeof(IndexInfo *) * Max(rels.nindexes, 1));
	for (int i = 0; i < rels.nindexes; i++)
	{
		Relation	index = index_open(rels.index_oids[i], RowExclusiveLock);

		rri->ri_IndexRelationDescs[i] = index;
		rri->ri_IndexRelationInfo[i] = rels.index_infos[i] ? rels.index_infos[i] :
			BuildIndexInfo(index);
	}
}

/* check_functions_in_node() callback: whether a function is not built in. */
static bool
is_user_function(Oid funcid, void *context)
{
	return funcid >= FirstNormalObjectId;
}

/* Whether an expression calls a function that is not built in. */
static bool
calls_user_function(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (check_functions_in_node(node, is_user_function, context))
		return true;
	return expression_tree_walker(node, calls_user_function, context);
}

/*
 * Closes what open_indexes() opened, as ExecCloseIndices() does, but keeps
 * their locks until the transaction ends, as the outbox's: what planning
 * an INSERT does, and the next emit of the transaction finds them taken.
 */
static void
close_indexes(ResultRelInfo *rri)
{
	for (int i = 0; i < rri->ri_NumIndices; i++)
	{
		outbox_index_insert_cleanup(rri->ri_IndexRelationDescs[i],
									rri->ri_IndexRelationInfo[i]);
		index_close(rri->ri_IndexRelationDescs[i], NoLock);
	}
}

/* The defaults of the outbox's columns that outbox_emit() does not set. */
static void
load_defaults(Relation rel)
{
	MemoryContext old = MemoryContextSwitchTo(rels.cxt);

	rels.defaults = palloc(sizeof(OutboxColumnDefault) * RelationGetDescr(rel)->natts);
	rels.ndefaults = outbox_column_defaults(rel, rels.attnums, EMIT_NCOLUMNS, rels.defaults);
	rels.defaults_builtin = true;
	for (int i = 0; i < rels.ndefaults; i++)
		if (calls_user_function((Node *) rels.defaults[i].expr, NULL))
			rels.defaults_builtin = false;
	MemoryContextSwitchTo(old);
}

/*
 * The defaults' ExprStates kept from one call to the next (setting them up
 * cost a fortieth of an emit), or NULL: then each call sets up its own.
 * Kept only for defaults that call built-in functions alone (the table's
 * own: no user code, which might emit while one is being evaluated); for
 * the user whose EXECUTE rights their set-up checked; until the tables,
 * functions, roles or memberships change.
 */
static ExprState **
kept_default_states(void)
{
	uint64		inval_count = emit_inval_count;
	ExprState **states;
	MemoryContext old;

	if (!rels.defaults_builtin)
		return NULL;
	if (rels.default_states != NULL && rels.default_states_user == GetUserId() &&
		rels.states_inval_count == inval_count)
		return rels.default_states;
	rels.default_states = NULL;
	if (rels.states_cxt == NULL)
		rels.states_cxt = AllocSetContextCreate(rels.cxt, "outbox_emit defaults",
												ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(rels.states_cxt);
	old = MemoryContextSwitchTo(rels.states_cxt);
	states = palloc(sizeof(ExprState *) * Max(rels.ndefaults, 1));
	for (int i = 0; i < rels.ndefaults; i++)
		states[i] = ExecInitExpr(rels.defaults[i].expr, NULL);
	MemoryContextSwitchTo(old);
	/* An invalidation meanwhile makes the next call set them up again. */
	rels.default_states = states;
	rels.default_states_user = GetUserId();
	rels.states_inval_count = inval_count;
	return states;
}

/* Looks up the extension's tables in schema nspid. */
static void
load_relations(Oid nspid)
{
	Relation	rel;
	AttrNumber	key[2];

	if (rels.cxt == NULL)
	{
		rels.cxt = AllocSetContextCreate(CacheMemoryContext, "outbox_emit relations",
										 ALLOCSET_SMALL_SIZES);
		register_callbacks();
	}
	/* (Deletes states_cxt too.) */
	MemoryContextReset(rels.cxt);
	rels.states_cxt = NULL;
	rels.default_states = NULL;
	/* Valid only once complete (an error leaves it invalid) and current. */
	rels.valid = false;
	last_emit.valid = false;
	rels_invalidated = false;
	rels.outbox = rels.publication = InvalidOid;
	rels.nindexes = 0;

	rel = open_extension_table("outbox", nspid);
	rels.outbox = RelationGetRelid(rel);
	rels.owner = rel->rd_rel->relowner;
	for (int c = 0; c < EMIT_NCOLUMNS; c++)
		rels.attnums[c] = required_attnum(rel, emit_column_names[c]);
	rels.id_attnum = required_attnum(rel, "id");
	key[0] = rels.attnums[COL_AGGREGATE_ID];
	key[1] = rels.attnums[COL_AGGREGATE_VERSION];
	rels.position_index = required_unique_index(rel, 2, key);
	rels.event_id_index = required_unique_index(rel, 1, &rels.attnums[COL_EVENT_ID]);
	load_defaults(rel);
	load_indexes(rel);
	table_close(rel, AccessShareLock);

	rel = open_extension_table("aggregate_publication", nspid);
	rels.publication = RelationGetRelid(rel);
	key[0] = required_attnum(rel, "aggregate_id");
	rels.publication_pkey = required_unique_index(rel, 1, key);
	rels.last_published_attnum = required_attnum(rel, "last_published_version");
	table_close(rel, AccessShareLock);

	/* An invalidation that arrived meanwhile makes the next call reload. */
	rels.nspid = nspid;
	rels.valid = !rels_invalidated;
}

/*
 * The outbox and aggregate_publication opened for the events of one call
 * (one outbox_emit(), or every event of an outbox_emit_many()), by the
 * first of them, under its aggregate's lock.  The look-ups use the indexes
 * the insert opens anyway.
 */
typedef struct EmitTarget
{
	MemoryContext cxt;			/* lives as long as the call */
	bool		open;
	Relation	rel;			/* the outbox */
	EState	   *estate;
	ResultRelInfo *rri;
	Relation	position_index; /* rri's, not opened again */
	Relation	event_id_index; /* rri's */
	TupleTableSlot *slot;		/* the new row */
	TupleTableSlot *found;		/* an outbox row a look-up reads */
	ExprState **defaults;		/* rels.defaults, ready to evaluate */
	Relation	publication;
	Relation	publication_pkey;
	TupleTableSlot *found_publication;
} EmitTarget;

/* Opens the tables for the events of a call (t->cxt set by the caller). */
static void
open_target(EmitTarget *t, Oid nspid)
{
	MemoryContext old_cxt = MemoryContextSwitchTo(t->cxt);
	TupleDesc	desc;

	if (!rels.valid || rels.nspid != nspid)
		load_relations(nspid);
	t->rel = table_open(rels.outbox, RowExclusiveLock);
	t->publication = table_open(rels.publication, AccessShareLock);
	/* Taking the locks may have processed an invalidation of the tables. */
	if (!rels.valid)
		load_relations(nspid);
	if (rels.outbox != RelationGetRelid(t->rel) ||
		rels.publication != RelationGetRelid(t->publication))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox_emit: the outbox extension's tables were replaced concurrently"),
				 errhint("Retry the transaction.")));
	desc = RelationGetDescr(t->rel);

	t->estate = outbox_simple_estate(t->rel, RowExclusiveLock);
	t->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(t->rri, t->rel, 1, NULL, 0);
	open_indexes(t->rri);
	t->position_index = t->event_id_index = NULL;
	for (int i = 0; i < t->rri->ri_NumIndices; i++)
	{
		Relation	index = t->rri->ri_IndexRelationDescs[i];

		if (RelationGetRelid(index) == rels.position_index)
			t->position_index = index;
		else if (RelationGetRelid(index) == rels.event_id_index)
			t->event_id_index = index;
	}
	if (t->position_index == NULL || t->event_id_index == NULL)
		elog(ERROR, "outbox_emit: a unique index of the outbox is not open");
	t->publication_pkey = index_open(rels.publication_pkey, AccessShareLock);

	MemoryContextSwitchTo(t->estate->es_query_cxt);
	t->slot = ExecInitExtraTupleSlot(t->estate, desc, &TTSOpsVirtual);
	t->found = table_slot_create(t->rel, &t->estate->es_tupleTable);
	t->found_publication = table_slot_create(t->publication, &t->estate->es_tupleTable);
	t->defaults = kept_default_states();
	if (t->defaults == NULL)
	{
		t->defaults = palloc(sizeof(ExprState *) * Max(rels.ndefaults, 1));
		for (int i = 0; i < rels.ndefaults; i++)
			t->defaults[i] = ExecInitExpr(rels.defaults[i].expr, NULL);
	}
	MemoryContextSwitchTo(old_cxt);
	t->open = true;
}

/* Closes what open_target() opened, if it did. */
static void
close_target(EmitTarget *t)
{
	if (!t->open)
		return;
	/* The relations a trigger's firing opened (ExecGetTriggerResultRel). */
	ExecCloseResultRelations(t->estate);
	close_indexes(t->rri);
	ExecResetTupleTable(t->estate->es_tupleTable, false);
	FreeExecutorState(t->estate);
	index_close(t->publication_pkey, NoLock);
	table_close(t->publication, NoLock);
	table_close(t->rel, NoLock);
	t->open = false;
}

/*
 * Inserts the event (values and nulls indexed by EmitColumn) into the
 * outbox the way logical replication's apply worker inserts a row: the
 * relation's own insert, index, constraint and trigger code, without a
 * plan.  Returns the new row's id, and where it is in *tid.
 */
static int64
insert_event(EmitTarget *t, const Datum *values, const bool *nulls, ItemPointer tid)
{
	EState	   *estate = t->estate;
	ExprContext *econtext = GetPerTupleExprContext(estate);
	TupleTableSlot *slot = t->slot;
	MemoryContext old_cxt;
	bool		isnull;
	int64		id;

	/* Per event, not per call of outbox_emit_many(). */
	old_cxt = MemoryContextSwitchTo(econtext->ecxt_per_tuple_memory);
	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, sizeof(bool) * slot->tts_tupleDescriptor->natts);
	for (int c = 0; c < EMIT_NCOLUMNS; c++)
	{
		slot->tts_values[rels.attnums[c] - 1] = values[c];
		slot->tts_isnull[rels.attnums[c] - 1] = nulls[c];
	}
	for (int i = 0; i < rels.ndefaults; i++)
	{
		AttrNumber	attnum = rels.defaults[i].attnum;

		slot->tts_values[attnum - 1] = ExecEvalExpr(t->defaults[i], econtext,
													&slot->tts_isnull[attnum - 1]);
	}
	ExecStoreVirtualTuple(slot);
	MemoryContextSwitchTo(old_cxt);

	estate->es_output_cid = GetCurrentCommandId(true);
	AfterTriggerBeginQuery();
	outbox_simple_insert(t->rri, estate, slot);
	AfterTriggerEndQuery(estate);
	id = DatumGetInt64(slot_getattr(slot, rels.id_attnum, &isnull));
	*tid = slot->tts_tid;
	ExecClearTuple(slot);
	ResetPerTupleExprContext(estate);

	/* Later emits of this statement (emit_many, a query) must see it. */
	CommandCounterIncrement();
	return id;
}

/* An aggregate at the largest version has no next one: never wrap around. */
static void
version_exhausted(const char *aggregate_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
			 errmsg("outbox_emit: aggregate \"%s\" has no version left", emit_display(aggregate_id)),
			 errdetail("Its last version is " INT64_FORMAT ", the largest a bigint holds.", PG_INT64_MAX),
			 errhidestmt(emit_hide_statement)));
}

/*
 * Whether heap has a row visible to snapshot whose first index column
 * equals key (text); the first in index order (backwards if backward).
 * If so, column attnum (bigint) of it in *value unless value is NULL.
 */
static bool
index_first_value(Relation heap, Relation index, TupleTableSlot *slot, Datum key,
				  Snapshot snapshot, bool backward, AttrNumber attnum, int64 *value)
{
	IndexScanDesc scan;
	ScanKeyData skey;
	bool		found;
	bool		isnull;

	ScanKeyEntryInitialize(&skey, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ, key);
	scan = outbox_index_beginscan(heap, index, snapshot, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	found = index_getnext_slot(scan, backward ? BackwardScanDirection : ForwardScanDirection,
							   slot);
	if (found && value != NULL)
	{
		Datum		d = slot_getattr(slot, attnum, &isnull);

		found = !isnull;
		if (found)
			*value = DatumGetInt64(d);
	}
	index_endscan(scan);
	/* Releases the heap page. */
	ExecClearTuple(slot);
	return found;
}

/*
 * The aggregate's last emitted version as seen by a snapshot; 0 if none.
 * It is in the outbox while any row of the aggregate is kept (the last
 * entry of the position index), and in aggregate_publication once
 * retention deleted them all (only published rows are ever deleted).
 */
static int64
last_version(EmitTarget *t, Datum aggregate_id, Snapshot snapshot)
{
	int64		in_outbox = 0;
	int64		published = 0;

	(void) index_first_value(t->rel, t->position_index, t->found, aggregate_id, snapshot,
							 true, rels.attnums[COL_AGGREGATE_VERSION], &in_outbox);
	(void) index_first_value(t->publication, t->publication_pkey, t->found_publication,
							 aggregate_id, snapshot, false, rels.last_published_attnum,
							 &published);
	return Max(in_outbox, published);
}

/*
 * The aggregate's last version under the aggregate's lock: from last_emit
 * if this transaction emitted to it last and that row is still there, else
 * looked up.  Under REPEATABLE READ or SERIALIZABLE, a serialization
 * failure if a version was committed after the transaction's snapshot.
 */
static int64
locked_last_version(EmitTarget *t, Datum aggregate_id, const char *aggregate_id_str,
					Snapshot snapshot)
{
	int64		last;

	if (last_emit.valid && strcmp(last_emit.aggregate_id, aggregate_id_str) == 0 &&
		table_tuple_fetch_row_version(t->rel, &last_emit.tid, snapshot, t->found))
	{
		ExecClearTuple(t->found);
		return last_emit.version;
	}

	last = last_version(t, aggregate_id, snapshot);
	if (IsolationUsesXactSnapshot())
	{
		int64		latest = last_version(t, aggregate_id, GetLatestSnapshot());

		if (latest != last)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent outbox_emit"),
					 errdetail("Aggregate \"%s\" reached version " INT64_FORMAT " in a transaction that committed after this one's snapshot was taken.",
							   emit_display(aggregate_id_str), latest),
					 errhint("The transaction might succeed if retried."),
					 errhidestmt(emit_hide_statement)));
	}
	return last;
}

/*
 * The version the event gets, read under the aggregate's lock: the next
 * one, or the caller's if above the last.  Checks a caller-given event_id
 * is new (event_id_given) for a clearer error than the unique index's.
 */
static int64
assign_version(EmitTarget *t, Datum aggregate_id, const char *aggregate_id_str,
			   Datum event_id, bool event_id_given, int64 version)
{
	Snapshot	snapshot;
	int64		last;

	/*
	 * Under READ COMMITTED this is a new snapshot, taken after the lock was
	 * granted, so it sees every version committed before.  A transaction
	 * snapshot can be older than the commit that released the lock: then a
	 * newer version exists that this transaction cannot see, and only a
	 * retry of the whole transaction can assign the next one.
	 */
	PushCopiedSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	snapshot = GetActiveSnapshot();

	/* Which aggregate has it is not the caller's to know. */
	if (event_id_given &&
		index_first_value(t->rel, t->event_id_index, t->found, event_id, snapshot,
						  false, InvalidAttrNumber, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("outbox_emit: event_id \"%s\" was already emitted",
						emit_display(TextDatumGetCString(event_id))),
				 errhint("A retried transaction whose first attempt committed emits the same event_id twice."),
				 errhidestmt(emit_hide_statement)));

	last = locked_last_version(t, aggregate_id, aggregate_id_str, snapshot);
	PopActiveSnapshot();

	if (version == 0)
	{
		if (last == PG_INT64_MAX)
			version_exhausted(aggregate_id_str);
		return last + 1;
	}
	if (version <= last)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: aggregate_version " INT64_FORMAT " is not above the last emitted version " INT64_FORMAT " of aggregate \"%s\"",
						version, last, emit_display(aggregate_id_str)),
				 errhint("Omit aggregate_version to have the next version assigned."),
				 errhidestmt(emit_hide_statement)));
	return version;
}

/* A validated event, as emit_event() writes it. */
typedef struct EmitArgs
{
	char	   *aggregate_type;
	char	   *aggregate_id;
	char	   *event_type;
	char	   *topic;
	char	   *event_id;
	bool		event_id_given; /* else a new uuid_v7 */
	Jsonb	   *headers;		/* NULL: none */
	Datum		payload;		/* jsonb, text or bytea */
	bool		payload_null;
	bool		raw;			/* payload is text or bytea */
	int64		version;		/* 0: the next one */
	Datum		text[EMIT_NCOLUMNS];	/* the argument's text, if one is */
} EmitArgs;

/*
 * A text column's value: the argument as given (no copy), or text made of
 * value (a default topic, a new event id).
 */
static Datum
arg_text(EmitArgs *a, EmitColumn column, const char *value)
{
	if (a->text[column] != (Datum) 0)
		return a->text[column];
	return CStringGetTextDatum(value);
}

/*
 * Serializes emitters of an aggregate until commit, so that versions are
 * assigned in commit order and a rollback leaves no hole.
 */
static void
lock_aggregate(const char *aggregate_id)
{
	LOCKTAG		tag;

	outbox_aggregate_locktag(&tag, aggregate_id, strlen(aggregate_id),
							 OUTBOX_LOCKSPACE_EMIT);
	/* Not waiting can fail only for want of room in the lock table. */
	if (outbox_lock_acquire(&tag, ExclusiveLock, false, false) ==
		LOCKACQUIRE_NOT_AVAIL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("outbox_emit: no room in the lock table for the lock of aggregate \"%s\"",
						emit_display(aggregate_id)),
				 errdetail("Each aggregate a transaction emits to stays locked until the transaction ends; "
						   "the server's lock table holds about max_locks_per_transaction * (max_connections + max_prepared_transactions) locks."),
				 errhint("Emit to fewer aggregates per transaction, or raise max_locks_per_transaction."),
				 errhidestmt(emit_hide_statement)));
}

/*
 * Writes the event to the outbox under its aggregate's lock, as the
 * outbox's owner (outbox_emit is not SECURITY DEFINER: this is the one
 * place that needs the owner's rights, and does only what is checked
 * above).  Fills result (emitted_event).
 */
static void
write_event(EmitArgs *a, EmitTarget *t, Oid nspid, Datum *result)
{
	Datum		values[EMIT_NCOLUMNS];
	bool		nulls[EMIT_NCOLUMNS];
	ItemPointerData tid;
	Oid			save_userid;
	int			save_sec_context;

	/* The relation path below checks nothing of the kind itself. */
	PreventCommandIfReadOnly("outbox_emit()");

	lock_aggregate(a->aggregate_id);
	if (!t->open)
		open_target(t, nspid);

	memset(nulls, false, sizeof(nulls));
	values[COL_EVENT_ID] = arg_text(a, COL_EVENT_ID, a->event_id);
	values[COL_AGGREGATE_TYPE] = arg_text(a, COL_AGGREGATE_TYPE, a->aggregate_type);
	values[COL_AGGREGATE_ID] = arg_text(a, COL_AGGREGATE_ID, a->aggregate_id);
	values[COL_EVENT_TYPE] = arg_text(a, COL_EVENT_TYPE, a->event_type);
	values[COL_TOPIC] = arg_text(a, COL_TOPIC, a->topic);
	values[COL_HEADERS] = PointerGetDatum(a->headers);
	nulls[COL_HEADERS] = a->headers == NULL;
	/* A JSON payload goes to payload, a raw one to payload_bytes. */
	values[COL_PAYLOAD] = values[COL_PAYLOAD_BYTES] = a->payload;
	nulls[COL_PAYLOAD] = a->payload_null || a->raw;
	nulls[COL_PAYLOAD_BYTES] = a->payload_null || !a->raw;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(rels.owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	a->version = assign_version(t, values[COL_AGGREGATE_ID], a->aggregate_id,
								values[COL_EVENT_ID], a->event_id_given, a->version);
	values[COL_AGGREGATE_VERSION] = Int64GetDatum(a->version);
	/* A trigger on the outbox may emit meanwhile: then its event is the last. */
	last_emit.valid = false;
	result[0] = Int64GetDatum(insert_event(t, values, nulls, &tid));
	SetUserIdAndSecContext(save_userid, save_sec_context);

	if (!last_emit.valid)
	{
		last_emit.valid = true;
		last_emit.version = a->version;
		last_emit.tid = tid;
		strlcpy(last_emit.aggregate_id, a->aggregate_id, sizeof(last_emit.aggregate_id));
	}

	result[1] = values[COL_EVENT_ID];
	result[2] = Int64GetDatum(a->version);
	result[3] = values[COL_TOPIC];
}

/* What emit_event() keeps for the calls of one query. */
typedef struct EmitCallInfo
{
	Oid			rettype;		/* emitted_event */
	Oid			nspid;			/* the extension's schema */
} EmitCallInfo;

/* The call's EmitCallInfo, made by its first call from call_cache. */
static EmitCallInfo *
emit_call_info(FunctionCallInfo fcinfo)
{
	EmitCallInfo *info = fcinfo->flinfo->fn_extra;
	uint64		inval_count = emit_inval_count;
	TupleDesc	tupdesc;

	if (info != NULL)
		return info;
	if (call_cache.inval_count != inval_count || call_cache.fn_oid != fcinfo->flinfo->fn_oid)
	{
		register_callbacks();
		call_cache.inval_count = 0;
		if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE ||
			tupdesc->tdtypeid == RECORDOID)
			elog(ERROR, "outbox_emit must return a named composite type");
		call_cache.rettype = tupdesc->tdtypeid;
		call_cache.nspid = get_func_namespace(fcinfo->flinfo->fn_oid);
		call_cache.fn_oid = fcinfo->flinfo->fn_oid;
		/* An invalidation meanwhile makes the next query look them up. */
		call_cache.inval_count = inval_count;
	}
	info = MemoryContextAlloc(fcinfo->flinfo->fn_mcxt, sizeof(EmitCallInfo));
	info->rettype = call_cache.rettype;
	info->nspid = call_cache.nspid;
	fcinfo->flinfo->fn_extra = info;
	return info;
}

/* The attributes of emitted_event: id, event_id, aggregate_version, topic. */
#define EMITTED_NATTS 4

/*
 * The emitted_event (type rettype) of values, with the type cache's
 * descriptor: current, and a named type's (no blessing needed).
 */
static Datum
emitted_event(Oid rettype, Datum *values)
{
	bool		nulls[EMITTED_NATTS] = {false, false, false, false};
	TupleDesc	desc = lookup_rowtype_tupdesc(rettype, -1);
	HeapTuple	tuple;

	if (desc->natts != EMITTED_NATTS)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox_emit: type %s has %d attributes, not %d",
						format_type_be(rettype), desc->natts, EMITTED_NATTS),
				 errhint("Re-create the outbox extension.")));
	tuple = heap_form_tuple(desc, values, nulls);
	ReleaseTupleDesc(desc);
	return HeapTupleGetDatum(tuple);
}

/*
 * outbox_emit(aggregate_type, aggregate_id, event_type, payload,
 *			   topic, headers, event_id, aggregate_version), with a jsonb
 * payload, or a raw one (text or bytea, sent byte for byte) if raw; into
 * target, or into the outbox opened for this call if target is NULL.
 */
static Datum
emit_event(FunctionCallInfo fcinfo, bool raw, EmitTarget *target)
{
	EmitCallInfo *info = emit_call_info(fcinfo);
	EmitArgs	a;
	EmitTarget	own_target;
	size_t		payload_bytes = 0;
	size_t		header_bytes = 0;
	Datum		result[EMITTED_NATTS];

	emit_hide_statement = emit_has_huge_argument(fcinfo);
	a.raw = raw;
	memset(a.text, 0, sizeof(a.text));
	a.aggregate_type = emit_required_text_arg(fcinfo, 0, "aggregate_type",
											  &a.text[COL_AGGREGATE_TYPE]);
	a.aggregate_id = emit_required_text_arg(fcinfo, 1, "aggregate_id",
											&a.text[COL_AGGREGATE_ID]);
	a.event_type = emit_required_text_arg(fcinfo, 2, "event_type", &a.text[COL_EVENT_TYPE]);

	if (PG_ARGISNULL(4))
	{
		a.topic = emit_default_topic(a.aggregate_type);
		emit_validate_topic(a.topic, "outbox.default_topic and the aggregate type");
	}
	else
	{
		a.text[COL_TOPIC] = PointerGetDatum(PG_GETARG_TEXT_PP(4));
		a.topic = text_to_cstring(DatumGetTextPP(a.text[COL_TOPIC]));
		emit_validate_topic(a.topic, "the topic argument");
	}

	a.headers = emit_add_trace_context(PG_ARGISNULL(5) ? NULL : PG_GETARG_JSONB_P(5));
	if (a.headers != NULL)
		header_bytes = emit_validate_headers(a.headers);

	a.payload_null = PG_ARGISNULL(3);
	a.payload = a.payload_null ? (Datum) 0 : PG_GETARG_DATUM(3);
	if (!a.payload_null)
		payload_bytes = emit_payload_size(a.payload, raw);

	a.version = PG_ARGISNULL(7) ? 0 : PG_GETARG_INT64(7);
	if (!PG_ARGISNULL(7) && a.version <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: aggregate_version must be positive, not " INT64_FORMAT,
						a.version),
				 errhidestmt(emit_hide_statement)));

	a.event_id_given = !PG_ARGISNULL(6);
	if (a.event_id_given)
	{
		a.text[COL_EVENT_ID] = PointerGetDatum(PG_GETARG_TEXT_PP(6));
		a.event_id = text_to_cstring(DatumGetTextPP(a.text[COL_EVENT_ID]));
		emit_check_identifier(a.event_id, "event_id");
	}
	else
		a.event_id = uuid_v7_text();

	emit_check_record_size(payload_bytes, header_bytes,
						   emit_publisher_record_bytes(a.aggregate_type, a.aggregate_id, a.event_type,
													   a.event_id, a.topic));

	if (target == NULL)
	{
		own_target.cxt = CurrentMemoryContext;
		own_target.open = false;
		write_event(&a, &own_target, info->nspid, result);
		close_target(&own_target);
	}
	else
		write_event(&a, target, info->nspid, result);
	outbox_note_emit();

	PG_RETURN_DATUM(emitted_event(info->rettype, result));
}

/* outbox_emit(): an event with a JSON payload (or none). */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	return emit_event(fcinfo, false, NULL);
}

/*
 * outbox_emit_raw(): an event whose payload (text or bytea, both a varlena
 * of bytes) reaches Kafka exactly as given.
 */
Datum
outbox_emit_raw(PG_FUNCTION_ARGS)
{
	return emit_event(fcinfo, true, NULL);
}

/* Error context of outbox_emit_many(): which event failed. */
static void
emit_many_error_context(void *arg)
{
	errcontext("outbox_emit_many, event %d", *(int *) arg);
}

/*
 * outbox_emit_many(events outbox_event[]): each event, in array order, as
 * outbox_emit() would emit it (outbox_emit_raw() if raw), in one call (no
 * statement per event).
 */
static Datum
emit_many(FunctionCallInfo fcinfo, bool raw)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *events;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			nelems;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	TupleDesc	event_desc = NULL;
	int			current = 0;
	ErrorContextCallback errcallback;
	EmitTarget	target;
	MemoryContext event_cxt;
	MemoryContext old_cxt;

	LOCAL_FCINFO(call, 8);

	InitMaterializedSRF(fcinfo, 0);
	if (PG_ARGISNULL(0))
		return (Datum) 0;
	events = PG_GETARG_ARRAYTYPE_P(0);
	get_typlenbyvalalign(ARR_ELEMTYPE(events), &typlen, &typbyval, &typalign);
	deconstruct_array(events, ARR_ELEMTYPE(events), typlen, typbyval, typalign,
					  &elems, &elem_nulls, &nelems);

	/* Each event is one outbox_emit() call, with this function's result type. */
	InitFunctionCallInfoData(*call, fcinfo->flinfo, 8, InvalidOid, NULL, NULL);
	errcallback.callback = emit_many_error_context;
	errcallback.arg = &current;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;
	/* The outbox is opened once for all events; memory is per event. */
	target.cxt = CurrentMemoryContext;
	target.open = false;
	event_cxt = AllocSetContextCreate(CurrentMemoryContext, "outbox_emit_many event",
									  ALLOCSET_DEFAULT_SIZES);
	for (int i = 0; i < nelems; i++)
	{
		HeapTupleHeader event;
		HeapTupleData tuple;
		Datum		args[8];
		bool		nulls[8];

		current = i + 1;
		if (elem_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("outbox_emit_many: event %d is NULL", i + 1)));
		event = DatumGetHeapTupleHeader(elems[i]);
		if (event_desc == NULL)
		{
			event_desc = lookup_rowtype_tupdesc_copy(HeapTupleHeaderGetTypeId(event),
													 HeapTupleHeaderGetTypMod(event));
			if (event_desc->natts != 8)
				elog(ERROR, "outbox_emit_many: outbox_event must have 8 fields");
		}
		old_cxt = MemoryContextSwitchTo(event_cxt);
		tuple.t_len = HeapTupleHeaderGetDatumLength(event);
		ItemPointerSetInvalid(&tuple.t_self);
		tuple.t_tableOid = InvalidOid;
		tuple.t_data = event;
		heap_deform_tuple(&tuple, event_desc, args, nulls);
		for (int a = 0; a < 8; a++)
		{
			call->args[a].value = args[a];
			call->args[a].isnull = nulls[a];
		}

		event = DatumGetHeapTupleHeader(emit_event(call, raw, &target));
		tuple.t_len = HeapTupleHeaderGetDatumLength(event);
		tuple.t_data = event;
		tuplestore_puttuple(rsinfo->setResult, &tuple);
		MemoryContextSwitchTo(old_cxt);
		MemoryContextReset(event_cxt);
	}
	close_target(&target);
	MemoryContextDelete(event_cxt);
	error_context_stack = errcallback.previous;
	return (Datum) 0;
}

/* outbox_emit_many(): events with JSON payloads. */
Datum
outbox_emit_many(PG_FUNCTION_ARGS)
{
	return emit_many(fcinfo, false);
}

/*
 * outbox_emit_many_raw(): events whose payloads (outbox_event_bytea or
 * outbox_event_text) reach Kafka exactly as given.
 */
Datum
outbox_emit_many_raw(PG_FUNCTION_ARGS)
{
	return emit_many(fcinfo, true);
}
