/*-------------------------------------------------------------------------
 *
 * operator.c
 *	  C helpers of the operator functions and status views: the publisher's
 *	  aggregate lock, waking the publisher, and per-worker state.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "commands/dbcommands.h"
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
PG_FUNCTION_INFO_V1(outbox_publisher);
PG_FUNCTION_INFO_V1(outbox_check_publisher);
PG_FUNCTION_INFO_V1(outbox_test_fatal_error);

/* Why no publisher serves this database, as outbox_publisher() says it. */
typedef enum PublisherAbsence
{
	PUBLISHER_PRESENT,
	PUBLISHER_NOT_PRELOADED,
	PUBLISHER_DISABLED,
	PUBLISHER_OTHER_DATABASE
} PublisherAbsence;

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

/*
 * outbox_workers() RETURNS TABLE (worker int, pid int, state text,
 * last_batch_at timestamptz, problem text, problem_since timestamptz)
 */
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
		Datum		values[6];
		bool		nulls[6] = {false, false, false, false, false, false};
		char		state[sizeof(slot->state)];
		char		problem[sizeof(slot->problem)];

		/* Unlocked reads: a torn string is at worst momentarily odd. */
		memcpy(state, slot->state, sizeof(state));
		state[sizeof(state) - 1] = '\0';
		memcpy(problem, slot->problem, sizeof(problem));
		problem[sizeof(problem) - 1] = '\0';

		values[0] = Int32GetDatum(i);
		values[1] = Int32GetDatum(slot->pid);
		nulls[1] = slot->pid == 0;
		values[2] = CStringGetTextDatum(slot->pid == 0 ? "not running" : state);
		values[3] = TimestampTzGetDatum(slot->last_batch_at);
		nulls[3] = slot->last_batch_at == 0;
		values[4] = CStringGetTextDatum(problem);
		nulls[4] = problem[0] == '\0';
		values[5] = TimestampTzGetDatum(slot->problem_since);
		nulls[5] = problem[0] == '\0' || slot->problem_since == 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* Whether this server's configuration gives this database a publisher. */
static PublisherAbsence
publisher_absence(void)
{
	if (outbox_shared == NULL)
		return PUBLISHER_NOT_PRELOADED;
	if (outbox_workers == 0)
		return PUBLISHER_DISABLED;
	if (strcmp(get_database_name(MyDatabaseId), outbox_database) != 0)
		return PUBLISHER_OTHER_DATABASE;
	return PUBLISHER_PRESENT;
}

/*
 * The publisher's state for this database, in a word, and why (NULL when
 * all is well): the configuration first, then the workers' own reports.
 */
static const char *
publisher_state(char **detail)
{
	int			running = 0;
	const char *problem = NULL;

	*detail = NULL;
	switch (publisher_absence())
	{
		case PUBLISHER_NOT_PRELOADED:
			*detail = "outbox is not in shared_preload_libraries, so no publisher was started; "
				"events wait in the outbox until it is added and the server restarted.";
			return "not running";
		case PUBLISHER_DISABLED:
			*detail = "outbox.workers is 0: publishing is disabled; events wait in the outbox.";
			return "not running";
		case PUBLISHER_OTHER_DATABASE:
			*detail = psprintf("The publisher serves database \"%s\" (outbox.database), not this one; "
							   "events emitted here are not published.", outbox_database);
			return "not serving this database";
		case PUBLISHER_PRESENT:
			break;
	}

	for (int i = 0; i < outbox_workers; i++)
	{
		OutboxWorkerSlot *slot = &outbox_shared->workers[i];

		if (slot->pid != 0)
			running++;
		if (problem == NULL && slot->problem[0] != '\0')
			problem = pnstrdup(slot->problem, sizeof(slot->problem) - 1);
	}
	if (running == 0)
	{
		*detail = problem
			? psprintf("No publisher worker is running: %s", problem)
			: "No publisher worker is running at the moment; see the server log.";
		return "not running";
	}
	if (problem != NULL)
	{
		*detail = (char *) problem;
		return "failing";
	}
	if (running < outbox_workers)
		*detail = psprintf("%d of %d publisher workers are running; the others' events wait.",
						   running, outbox_workers);
	return "running";
}

/* outbox_publisher(OUT state text, OUT detail text) */
Datum
outbox_publisher(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	char	   *detail;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	values[0] = CStringGetTextDatum(publisher_state(&detail));
	if (detail != NULL)
		values[1] = CStringGetTextDatum(detail);
	else
		nulls[1] = true;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values, nulls)));
}

/*
 * Called by CREATE EXTENSION: warn if no publisher will serve this
 * database, rather than let its events pile up unnoticed.
 */
Datum
outbox_check_publisher(PG_FUNCTION_ARGS)
{
	switch (publisher_absence())
	{
		case PUBLISHER_NOT_PRELOADED:
			ereport(WARNING,
					(errcode(ERRCODE_WARNING),
					 errmsg("outbox is not in shared_preload_libraries: no publisher will send this database's events"),
					 errdetail("outbox_emit() works; events wait in the outbox."),
					 errhint("Add outbox to shared_preload_libraries and restart the server.")));
			break;
		case PUBLISHER_DISABLED:
			ereport(WARNING,
					(errcode(ERRCODE_WARNING),
					 errmsg("outbox.workers is 0: no publisher will send this database's events"),
					 errhint("Set outbox.workers and restart the server.")));
			break;
		case PUBLISHER_OTHER_DATABASE:
			ereport(WARNING,
					(errcode(ERRCODE_WARNING),
					 errmsg("no publisher serves database \"%s\"",
							get_database_name(MyDatabaseId)),
					 errdetail("The publisher serves database \"%s\" (outbox.database); events emitted here wait.",
							   outbox_database),
					 errhint("Set outbox.database to this database and restart the server.")));
			break;
		case PUBLISHER_PRESENT:
			break;
	}
	PG_RETURN_VOID();
}

/*
 * outbox_test_fatal_error(): make each publisher raise a fatal producer
 * error (rd_kafka_test_fatal_error) in its next batch, after producing and
 * before the acknowledgements are in.  Refused unless the server was
 * started with outbox.enable_test_hooks = on.
 */
Datum
outbox_test_fatal_error(PG_FUNCTION_ARGS)
{
	if (outbox_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox must be loaded via shared_preload_libraries")));
	if (!outbox_enable_test_hooks)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox test hooks are disabled"),
				 errhint("Start the server with outbox.enable_test_hooks = on.")));
	pg_atomic_write_u32(&outbox_shared->inject_fatal_error, 1);
	outbox_wake_workers();
	PG_RETURN_VOID();
}
