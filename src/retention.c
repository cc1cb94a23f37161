/*-------------------------------------------------------------------------
 *
 * retention.c
 *	  Deleting settled outbox rows past outbox.retention and inbox entries
 *	  past outbox.inbox_retention, in small transactions, by publisher 0:
 *	  the settings, the statements and their runs.  Where no publisher
 *	  runs, inbox worker 0 runs the inbox's (inbox_worker.c schedules it,
 *	  with inbox_retention_delete).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "inbox_worker.h"
#include "shmem.h"
#include "util.h"
#include "publish.h"

int			outbox_retention_s = 7 * 24 * 3600;
int			outbox_inbox_retention_s = 30 * 24 * 3600;
int			outbox_retention_batch = 1000;

static SPIPlanPtr retention_plan = NULL;
static SPIPlanPtr inbox_retention_plan = NULL;
static TimestampTz last_retention_at = 0;

/* Where the walk over the outbox stopped (the last id looked at). */
static int64 retention_from_id = 0;
static bool retention_behind = false;

/* Define this module's settings (from _PG_init). */
void
publish_retention_init(void)
{
	DefineCustomIntVariable("outbox.retention",
							"How long published, dead-lettered and skipped events are kept.",
							"-1 keeps them forever.",
							&outbox_retention_s,
							7 * 24 * 3600, -1, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.inbox_retention",
							"How long inbox entries are kept.",
							"Must exceed the Kafka topics' retention plus the longest replay window, "
							"or a redelivered event passes the deduplication.  -1 keeps them forever.",
							&outbox_inbox_retention_s,
							30 * 24 * 3600, -1, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retention_batch",
							"Rows retention deletes per transaction.",
							NULL,
							&outbox_retention_batch,
							1000, 1, 100000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
}

/* Prepare this module's plans for the extension in schema s (quoted). */
void
publish_retention_prepare(const char *s)
{
	Oid			retention_types[3] = {INT4OID, INT4OID, INT8OID};

	if (retention_plan)
	{
		SPI_freeplan(retention_plan);
		SPI_freeplan(inbox_retention_plan);
	}

	/*
	 * Retention walks the rows in primary key order (emit order) from where
	 * it stopped ($3), a window of at most a batch of rows at a time, so a
	 * call costs at most that however large the table; of the window it
	 * deletes what is past outbox.retention and settled (at or below its
	 * aggregate's progress, so that version assignment never needs a
	 * deleted row).  It returns the number deleted, the first row of the
	 * window not past retention (where the walk starts over), and the last
	 * row looked at.  It locks only the rows past retention, skipping those
	 * locked by others (outbox_replay() updates an aggregate's rows in its
	 * own order): never waiting, it cannot deadlock with them.  Locking the
	 * whole window wrote a lock into up to a batch of young rows every
	 * second (WAL, dirty pages) only to find nothing to delete.
	 */
	retention_plan = publish_keep_plan(psprintf(
										   "WITH w AS (SELECT id, "
										   "created_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) "
										   "pg_catalog.make_interval(secs => $1)) AS old "
										   "FROM %s.outbox WHERE id OPERATOR(pg_catalog.>) $3 ORDER BY id LIMIT $2), "
										   "l AS (SELECT o.id, o.aggregate_id, o.aggregate_version FROM %s.outbox o "
										   "JOIN w ON o.id OPERATOR(pg_catalog.=) w.id WHERE w.old "
										   "FOR UPDATE OF o SKIP LOCKED), "
										   "d AS (DELETE FROM %s.outbox o USING l, %s.aggregate_publication p "
										   "WHERE o.id OPERATOR(pg_catalog.=) l.id AND p.aggregate_id OPERATOR(pg_catalog.=) l.aggregate_id "
										   "AND l.aggregate_version OPERATOR(pg_catalog.<=) p.last_published_version RETURNING o.id) "
										   "SELECT (SELECT pg_catalog.count(*) FROM d), "
										   "(SELECT pg_catalog.min(id) FROM w WHERE NOT old), "
										   "(SELECT pg_catalog.max(id) FROM w)", s, s, s, s),
								  3, retention_types);

	inbox_retention_plan = inbox_retention_prepare(s);
}

/* ---------- the inbox (also run by the inbox workers) ---------- */

/*
 * The inbox retention statement for the extension in schema s (quoted),
 * kept; run by inbox_retention_delete().  The publisher's retention uses it
 * too.  It skips rows locked by others: never waiting, it cannot deadlock.
 */
SPIPlanPtr
inbox_retention_prepare(const char *s)
{
	Oid			types[2] = {INT4OID, INT4OID};

	return outbox_keep_plan(psprintf("DELETE FROM %s.inbox i USING ("
									 "SELECT consumer, event_id FROM %s.inbox "
									 "WHERE processed_at OPERATOR(pg_catalog.<) "
									 "(pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => $1)) "
									 "ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED) x "
									 "WHERE i.consumer OPERATOR(pg_catalog.=) x.consumer "
									 "AND i.event_id OPERATOR(pg_catalog.=) x.event_id", s, s),
							2, types);
}

/*
 * Delete up to outbox.retention_batch inbox claims older than
 * outbox.inbox_retention with a plan of inbox_retention_prepare(); returns
 * how many.  In a transaction, connected to SPI.
 */
uint64
inbox_retention_delete(SPIPlanPtr plan)
{
	Datum		args[2];

	args[0] = Int32GetDatum(outbox_inbox_retention_s);
	args[1] = Int32GetDatum(outbox_retention_batch);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "inbox retention failed");
	return SPI_processed;
}

/*
 * Delete a window of settled outbox rows past outbox.retention, and move
 * the walk on: past the window if all of it was past retention (pending
 * rows stay behind), else back to the start, to look again at the pending
 * rows passed.  Returns the number deleted.
 */
static uint64
retention_outbox(void)
{
	Datum		args[3];
	bool		isnull;
	uint64		deleted;
	TupleDesc	desc;
	HeapTuple	tup;

	args[0] = Int32GetDatum(outbox_retention_s);
	args[1] = Int32GetDatum(outbox_retention_batch);
	args[2] = Int64GetDatum(retention_from_id);
	if (SPI_execute_plan(retention_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox retention failed");
	desc = SPI_tuptable->tupdesc;
	tup = SPI_tuptable->vals[0];
	deleted = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	(void) SPI_getbinval(tup, desc, 2, &isnull);
	if (!isnull)
		retention_from_id = 0;	/* reached the young rows */
	else
	{
		Datum		last = SPI_getbinval(tup, desc, 3, &isnull);

		retention_from_id = isnull ? 0 : DatumGetInt64(last);
	}
	return deleted;
}

/*
 * Delete settled outbox rows and inbox entries past their retention, in
 * transactions of outbox.retention_batch rows each: the deletes touch only
 * old rows, which emitters never read or lock.  Returns true if a batch was
 * full (more is probably due).
 */
static bool
retention_batch(void)
{
	uint64		deleted = 0;
	uint64		inbox_deleted = 0;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	if (OidIsValid(publish_lookup_extension()))
	{
		if (outbox_retention_s >= 0)
			deleted = retention_outbox();
		if (outbox_inbox_retention_s >= 0)
			inbox_deleted = inbox_retention_delete(inbox_retention_plan);
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	outbox_count(OC_RETENTION_DELETED, deleted);
	outbox_count(OC_INBOX_RETENTION_DELETED, inbox_deleted);
	return deleted >= (uint64) outbox_retention_batch ||
		inbox_deleted >= (uint64) outbox_retention_batch;
}

/*
 * Retention: batches until one is not full, for at most a tenth of a second
 * so that publishing is not held up.  Runs once a second, or after every
 * publishing batch while it is behind.
 */
static void
run_retention(void)
{
	TimestampTz start = GetCurrentTimestamp();
	bool		full;

	if (outbox_retention_s < 0 && outbox_inbox_retention_s < 0)
		return;
	publish_set_state("retention");
	while ((full = retention_batch()) &&
		   !TimestampDifferenceExceeds(start, GetCurrentTimestamp(), 100))
		CHECK_FOR_INTERRUPTS();
	retention_behind = full;
	last_retention_at = start;
}


/*
 * Publisher 0 keeps the tables small: retention once a second, or after
 * every publishing step while it is behind.
 */
void
publish_retention_maybe(void)
{
	if (publish_worker_index == 0 &&
		(retention_behind ||
		 TimestampDifferenceExceeds(last_retention_at, GetCurrentTimestamp(), 1000)))
		run_retention();
}
