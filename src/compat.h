/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  What differs between the PostgreSQL versions outbox builds on (13-18):
 *	  every PG_VERSION_NUM test of the extension is here, as a macro, an
 *	  inline function or an OUTBOX_HAVE_* flag.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COMPAT_H
#define OUTBOX_COMPAT_H

#include "access/genam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "catalog/pg_database.h"
#include "catalog/pg_proc.h"
#include "common/jsonapi.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "parser/parse_relation.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/fmgrprotos.h"
#include "utils/memutils.h"
#include "utils/relcache.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "util.h"
#if PG_VERSION_NUM >= 160000
#include "nodes/miscnodes.h"
#endif

#if PG_VERSION_NUM < 150000
#define MarkGUCPrefixReserved(prefix) EmitWarningsOnPlaceholders(prefix)

/* InitMaterializedSRF() arrived in 15: the same set-up, by hand. */
static inline void
InitMaterializedSRF(FunctionCallInfo fcinfo, int flags)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	tupdesc;
	MemoryContext oldcxt;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		!(rsinfo->allowedModes & SFRM_Materialize))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	oldcxt = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = tuplestore_begin_heap(true, false, work_mem);
	rsinfo->setDesc = CreateTupleDescCopy(tupdesc);
	MemoryContextSwitchTo(oldcxt);
}

/* pg_prng arrived in 15. */
#define outbox_random_u32() ((uint32) random())
#else
#include "common/pg_prng.h"
#define outbox_random_u32() pg_prng_uint32(&pg_global_prng_state)
#endif

#if PG_VERSION_NUM < 140000
/* pg_lltoa() returns the length from 14 on. */
#include "utils/builtins.h"

static inline int
outbox_lltoa(int64 value, char *a)
{
	pg_lltoa(value, a);
	return (int) strlen(a);
}
#else
#define outbox_lltoa(value, a) pg_lltoa(value, a)
#endif

#if PG_VERSION_NUM < 140000
/* Closing the relations a trigger's firing opened was split out in 14. */
#define ExecCloseResultRelations(estate) ExecCleanUpTriggerState(estate)

static inline long
TimestampDifferenceMilliseconds(TimestampTz start_time, TimestampTz stop_time)
{
	TimestampTz diff = stop_time - start_time;

	if (diff <= 0)
		return 0;
	return (long) Min(diff / 1000, (TimestampTz) INT_MAX);
}
#endif

/* A wait event set that lives until freed (PG17 ties them to resource owners). */
#if PG_VERSION_NUM >= 170000
#define outbox_create_wait_set(nevents) CreateWaitEventSet(NULL, (nevents))
#else
#define outbox_create_wait_set(nevents) CreateWaitEventSet(TopMemoryContext, (nevents))
#endif

/* What an index access method keeps between inserts is released (17). */
#if PG_VERSION_NUM >= 170000
#define outbox_index_insert_cleanup(index, info) index_insert_cleanup((index), (info))
#else
#define outbox_index_insert_cleanup(index, info) ((void) 0)
#endif


/* shmem_request_hook arrived in 15; before, shared memory is asked for in _PG_init. */
#define OUTBOX_HAVE_SHMEM_REQUEST_HOOK (PG_VERSION_NUM >= 150000)

/* lib/sort_template.h arrived in 14; 13 sorts with qsort(). */
#define OUTBOX_HAVE_SORT_TEMPLATE (PG_VERSION_NUM >= 140000)

/* A ProcessUtility hook's parameters, and passing them on (14 added readOnlyTree). */
#if PG_VERSION_NUM >= 140000
#define OUTBOX_UTILITY_ARGS PlannedStmt *pstmt, const char *queryString, bool readOnlyTree, \
	ProcessUtilityContext context, ParamListInfo params, QueryEnvironment *queryEnv, \
	DestReceiver *dest, QueryCompletion *qc
#define OUTBOX_UTILITY_PASS pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc
#else
#define OUTBOX_UTILITY_ARGS PlannedStmt *pstmt, const char *queryString, \
	ProcessUtilityContext context, ParamListInfo params, QueryEnvironment *queryEnv, \
	DestReceiver *dest, QueryCompletion *qc
#define OUTBOX_UTILITY_PASS pstmt, queryString, context, params, queryEnv, dest, qc
#endif

/* Inserting and updating a row without a plan (14 passes the ResultRelInfo). */
#if PG_VERSION_NUM >= 140000
#define outbox_simple_insert(rri, estate, slot) \
	ExecSimpleRelationInsert((rri), (estate), (slot))
#define outbox_simple_update(rri, estate, epq, searchslot, slot) \
	ExecSimpleRelationUpdate((rri), (estate), (epq), (searchslot), (slot))
#else
#define outbox_simple_insert(rri, estate, slot) \
	((estate)->es_result_relation_info = (rri), ExecSimpleRelationInsert((estate), (slot)))
#define outbox_simple_update(rri, estate, epq, searchslot, slot) \
	((estate)->es_result_relation_info = (rri), \
	 ExecSimpleRelationUpdate((estate), (epq), (searchslot), (slot)))
#endif

/* EvalPlanQualInit() takes the result relations' indexes since 16: none here. */
#if PG_VERSION_NUM >= 160000
#define outbox_epq_init(epq, estate) EvalPlanQualInit((epq), (estate), NULL, NIL, -1, NIL)
#else
#define outbox_epq_init(epq, estate) EvalPlanQualInit((epq), (estate), NULL, NIL, -1)
#endif

/* Memory for a GUC's extra, which the GUC machinery free()s (guc_malloc exported in 16). */
#if PG_VERSION_NUM >= 160000
#define outbox_guc_malloc(size) guc_malloc(LOG, (size))
#else
#define outbox_guc_malloc(size) malloc(size)
#endif

/* A JSON lexer over a C string (17 can fill in a caller's context: none here). */
#if PG_VERSION_NUM >= 170000
#define outbox_json_lexer(json, len, encoding) \
	makeJsonLexContextCstringLen(NULL, (json), (len), (encoding), true)
#else
#define outbox_json_lexer(json, len, encoding) \
	makeJsonLexContextCstringLen((json), (len), (encoding), true)
#endif

/* An index scan; 18 can count it for EXPLAIN ANALYZE: not counted here. */
#if PG_VERSION_NUM >= 180000
#define outbox_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define outbox_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/*
 * Taking a lock without waiting: 18 can log the failure to get it
 * (log_lock_failure); ours are expected to fail and are not logged.
 */
#if PG_VERSION_NUM >= 180000
#define outbox_lock_acquire(tag, mode, session, dontwait) \
	LockAcquireExtended((tag), (mode), (session), (dontwait), false, NULL, false)
#define outbox_conditional_xact_wait(xid) ConditionalXactLockTableWait((xid), false)
#else
#define outbox_lock_acquire(tag, mode, session, dontwait) \
	LockAcquireExtended((tag), (mode), (session), (dontwait), false, NULL)
#define outbox_conditional_xact_wait(xid) ConditionalXactLockTableWait(xid)
#endif

/* A table's primary key (18 can skip a deferrable one: ours is not deferrable). */
#if PG_VERSION_NUM >= 180000
#define outbox_primary_key_index(rel) RelationGetPrimaryKeyIndex((rel), false)
#else
#define outbox_primary_key_index(rel) RelationGetPrimaryKeyIndex(rel)
#endif

/*
 * The range table of an executor state with one relation: 16 keeps the
 * permissions apart, 18 also wants the relations that are not pruned.
 */
static inline void
outbox_init_range_table(EState *estate, RangeTblEntry *rte)
{
#if PG_VERSION_NUM >= 160000
	List	   *perminfos = NIL;

	addRTEPermissionInfo(&perminfos, rte);
#if PG_VERSION_NUM >= 180000
	ExecInitRangeTable(estate, list_make1(rte), perminfos, bms_make_singleton(1));
#else
	ExecInitRangeTable(estate, list_make1(rte), perminfos);
#endif
#else
	ExecInitRangeTable(estate, list_make1(rte));
#endif
}

/*
 * The end of the WAL inserted so far, as a position XLogFlush() accepts
 * (17 has it; before, GetXLogInsertRecPtr() less a page header it points
 * right after).
 */
static inline XLogRecPtr
outbox_xlog_insert_end(void)
{
#if PG_VERSION_NUM >= 170000
	return GetXLogInsertEndRecPtr();
#else
	XLogRecPtr	ptr = GetXLogInsertRecPtr();

	if (XLogSegmentOffset(ptr, wal_segment_size) == SizeOfXLogLongPHD)
		return ptr - SizeOfXLogLongPHD;
	if (ptr % XLOG_BLCKSZ == SizeOfXLogShortPHD)
		return ptr - SizeOfXLogShortPHD;
	return ptr;
#endif
}

/*
 * JSON text as jsonb, or 0 if jsonb refuses it.  16 has soft input errors;
 * before, only the careful caller pays for a subtransaction that catches
 * the error (the other lets it fail its batch, which is then redone
 * carefully).
 */
static inline Datum
outbox_jsonb_or_null(char *text, bool careful)
{
#if PG_VERSION_NUM >= 160000
	ErrorSaveContext escontext = {T_ErrorSaveContext};
	Datum		result;

	if (!DirectInputFunctionCallSafe(jsonb_in, text, InvalidOid, -1,
									 (Node *) &escontext, &result))
		return (Datum) 0;
	return result;
#else
	bool		failed;
	Datum		result;

	if (!careful)
		return DirectFunctionCall1(jsonb_in, CStringGetDatum(text));
	result = outbox_call_catching(jsonb_in, CStringGetDatum(text), &failed);
	return failed ? (Datum) 0 : result;
#endif
}


/* A privilege check of any object, and an ownership check: by class since 16. */
#if PG_VERSION_NUM >= 160000
#define outbox_aclcheck(classid, objid, roleid, mode) \
	object_aclcheck((classid), (objid), (roleid), (mode))
#define outbox_ownercheck(classid, objid, roleid) \
	object_ownercheck((classid), (objid), (roleid))
#else
#include "catalog/pg_database.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_tablespace.h"
#include "utils/acl.h"

static inline AclResult
outbox_aclcheck(Oid classid, Oid objid, Oid roleid, AclMode mode)
{
	switch (classid)
	{
		case ProcedureRelationId:
			return pg_proc_aclcheck(objid, roleid, mode);
		case NamespaceRelationId:
			return pg_namespace_aclcheck(objid, roleid, mode);
		case TableSpaceRelationId:
			return pg_tablespace_aclcheck(objid, roleid, mode);
		case DatabaseRelationId:
			return pg_database_aclcheck(objid, roleid, mode);
	}
	elog(ERROR, "outbox_aclcheck: unexpected class %u", classid);
	return ACLCHECK_NO_PRIV;
}

static inline bool
outbox_ownercheck(Oid classid, Oid objid, Oid roleid)
{
	switch (classid)
	{
		case ProcedureRelationId:
			return pg_proc_ownercheck(objid, roleid);
		case DatabaseRelationId:
			return pg_database_ownercheck(objid, roleid);
	}
	elog(ERROR, "outbox_ownercheck: unexpected class %u", classid);
	return false;
}
#endif

#endif							/* OUTBOX_COMPAT_H */
