/*-------------------------------------------------------------------------
 *
 * operator.c
 *	  C helpers of the operator functions and status views: the publisher's
 *	  aggregate lock, waking the publisher, and per-worker state.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_lock_aggregate);
PG_FUNCTION_INFO_V1(outbox_wake_on_commit);
PG_FUNCTION_INFO_V1(outbox_worker_status);

/*
 * Wait for the publisher's lock of the aggregate's bucket, held until the
 * end of the transaction: a batch in flight for it finishes first, and no
 * new one starts until the operator's change is committed.
 */
Datum
outbox_lock_aggregate(PG_FUNCTION_ARGS)
{
	char	   *aggregate_id = text_to_cstring(PG_GETARG_TEXT_PP(0));
	LOCKTAG		tag;

	outbox_publish_locktag(&tag, aggregate_id);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	outbox_note_emit();
	PG_RETURN_VOID();
}

Datum
outbox_wake_on_commit(PG_FUNCTION_ARGS)
{
	outbox_note_emit();
	PG_RETURN_VOID();
}

/* outbox_workers() RETURNS TABLE (worker int, pid int, state text, last_batch_at timestamptz) */
Datum
outbox_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, 0);

	/* Not preloaded: no workers, and outbox_status still works. */
	if (outbox_shared == NULL)
		return (Datum) 0;

	for (int i = 0; i < outbox_workers; i++)
	{
		OutboxWorkerSlot *slot = &outbox_shared->workers[i];
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};
		char		state[sizeof(slot->state)];

		/* Unlocked reads: a torn state string is at worst momentarily odd. */
		memcpy(state, slot->state, sizeof(state));
		state[sizeof(state) - 1] = '\0';

		values[0] = Int32GetDatum(i);
		values[1] = Int32GetDatum(slot->pid);
		nulls[1] = slot->pid == 0;
		values[2] = CStringGetTextDatum(slot->pid == 0 ? "not running" : state);
		values[3] = TimestampTzGetDatum(slot->last_batch_at);
		nulls[3] = slot->last_batch_at == 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
