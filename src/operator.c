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
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "launcher.h"
#include "shmem.h"
#include "util.h"

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

/* Wake every publisher when this transaction commits (outbox_resume()). */
Datum
outbox_wake_on_commit(PG_FUNCTION_ARGS)
{
	outbox_note_control();
	PG_RETURN_VOID();
}

/* One row of outbox_workers(): worker i of database entry db. */
static void
put_worker_row(ReturnSetInfo *rsinfo, OutboxDatabase *db, int i)
{
	OutboxWorkerSlot *slot = &db->workers[i];
	Datum		values[7];
	bool		nulls[7] = {false, false, false, false, false, false, false};
	char		state[sizeof(slot->state)];
	char		problem[sizeof(slot->problem)];
	Name		name = palloc(sizeof(NameData));

	/* Unlocked reads: a torn string is at worst momentarily odd. */
	memcpy(state, slot->state, sizeof(state));
	state[sizeof(state) - 1] = '\0';
	memcpy(problem, slot->problem, sizeof(problem));
	problem[sizeof(problem) - 1] = '\0';
	memcpy(name, &db->name, sizeof(NameData));
	NameStr(*name)[NAMEDATALEN - 1] = '\0';

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
	values[6] = NameGetDatum(name);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * outbox_workers() RETURNS TABLE (worker int, pid int, state text,
 * last_batch_at timestamptz, problem text, problem_since timestamptz,
 * database name): the outbox.workers workers of every database that has
 * the extension and is served, cluster-wide.
 */
Datum
outbox_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, 0);

	/* Not preloaded: no workers, and outbox_status still works. */
	if (outbox_shared == NULL)
		return (Datum) 0;

	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
	{
		OutboxDatabase *db = &outbox_shared->databases[e];

		/*
		 * Where the extension is absent there is at most a probe now and
		 * then: not listed.  Where it is not known yet, the probe (worker
		 * 0) is, with what keeps it from connecting, if anything.
		 */
		if (!OidIsValid(db->dboid) || db->state == ODB_ABSENT)
			continue;
		for (int i = 0; i < (db->state == ODB_SERVED ? outbox_workers : 1); i++)
			put_worker_row(rsinfo, db, i);
	}
	return (Datum) 0;
}

/*
 * Whether this server's configuration gives this database a publisher;
 * for PUBLISHER_OTHER_DATABASE, *why says which setting leaves it out.
 */
static PublisherAbsence
publisher_absence(const char **why)
{
	HeapTuple	tup;
	Form_pg_database f;
	bool		wanted;

	*why = NULL;
	if (outbox_shared == NULL)
		return PUBLISHER_NOT_PRELOADED;
	if (outbox_workers == 0)
		return PUBLISHER_DISABLED;
	tup = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(MyDatabaseId));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for database %u", MyDatabaseId);
	f = (Form_pg_database) GETSTRUCT(tup);
	wanted = outbox_database_wanted(NameStr(f->datname), f->datistemplate,
									f->datallowconn, why);
	ReleaseSysCache(tup);
	return wanted ? PUBLISHER_PRESENT : PUBLISHER_OTHER_DATABASE;
}

/* This database's workers, as publisher_state describes them. */
static const char *
workers_state(OutboxDatabase *db, char **detail)
{
	int			running = 0;
	const char *problem = NULL;

	for (int i = 0; i < outbox_workers; i++)
	{
		OutboxWorkerSlot *slot = &db->workers[i];

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
	if (pg_atomic_read_u32(&outbox_shared->databases_waiting) > 0)
		*detail = psprintf("Databases take turns (outbox.max_workers = %d): this one's turn began at %s; "
						   "it lasts outbox.worker_time_slice while others wait.",
						   outbox_max_workers, timestamptz_to_str(db->turn_started));
	else if (running < outbox_workers)
		*detail = psprintf("%d of %d publisher workers are running; the others' events wait.",
						   running, outbox_workers);
	return "running";
}

/*
 * The publisher's state for this database, in a word, and why (NULL when
 * all is well): the configuration first, then the launcher's view, then
 * the workers' own reports.
 */
static const char *
publisher_state(char **detail)
{
	const char *why;
	OutboxDatabase *db;

	*detail = NULL;
	switch (publisher_absence(&why))
	{
		case PUBLISHER_NOT_PRELOADED:
			*detail = "outbox is not in shared_preload_libraries, so no publisher was started; "
				"events wait in the outbox until it is added and the server restarted.";
			return "not running";
		case PUBLISHER_DISABLED:
			*detail = "outbox.workers is 0: publishing is disabled; events wait in the outbox.";
			return "not running";
		case PUBLISHER_OTHER_DATABASE:
			*detail = psprintf("No publisher serves this database: %s; events emitted here are not published.",
							   why);
			return "not serving this database";
		case PUBLISHER_PRESENT:
			break;
	}

	db = outbox_database_entry(MyDatabaseId);
	if (db == NULL || db->state == ODB_ABSENT)
	{
		*detail = "The publisher launcher has not taken this database up yet (it looks every second); "
			"see the server log if this lasts.";
		return "not running";
	}
	if (db->held_until > GetCurrentTimestamp())
	{
		*detail = "Paused while a DROP DATABASE, ALTER DATABASE or CREATE DATABASE ... TEMPLATE needs this database to itself.";
		return "not running";
	}
	if (db->waiting_since != 0)
	{
		*detail = psprintf("outbox.max_workers (%d) is lower than the workers all databases ask for: "
						   "databases take turns of outbox.worker_time_slice, and this one waits for its turn since %s.",
						   outbox_max_workers, timestamptz_to_str(db->waiting_since));
		return "waiting for its turn";
	}
	return workers_state(db, detail);
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
	const char *why;

	/* The launcher looks here again as soon as this commits. */
	outbox_launcher_probe_at_commit();
	switch (publisher_absence(&why))
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
					 errdetail("Not served because %s; events emitted here wait.", why),
					 errhint("Add this database to outbox.databases (or clear outbox.database) and reload.")));
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
				 errmsg("outbox must be loaded via shared_preload_libraries"),
				 errhint("Add outbox to shared_preload_libraries in postgresql.conf and restart the server.")));
	if (!outbox_enable_test_hooks)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox test hooks are disabled"),
				 errhint("Start the server with outbox.enable_test_hooks = on.")));
	pg_atomic_write_u32(&outbox_shared->inject_fatal_error, 1);
	outbox_wake_workers();
	PG_RETURN_VOID();
}
