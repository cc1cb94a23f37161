/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  What differs between the PostgreSQL versions outbox builds on (13-17).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COMPAT_H
#define OUTBOX_COMPAT_H

#include "funcapi.h"
#include "miscadmin.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

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
