/*-------------------------------------------------------------------------
 *
 * retention.c
 *	  Deleting settled outbox rows past outbox.retention and inbox entries
 *	  past outbox.inbox_retention, in small transactions, by publisher 0.
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
#include "outbox.h"
#include "publish.h"

int			outbox_retention_s = 7 * 24 * 3600;
int			outbox_inbox_retention_s = 30 * 24 * 3600;
int			outbox_retention_batch = 1000;

static SPIPlanPtr retention_plan = NULL;
static SPIPlanPtr inbox_retention_plan = NULL;
static TimestampTz last_retention_at = 0;
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
	Oid			retention_types[2] = {INT4OID, INT4OID};

	if (retention_plan)
	{
		SPI_freeplan(retention_plan);
		SPI_freeplan(inbox_retention_plan);
	}

	/*
	 * Retention looks at the oldest settled rows only (primary key order is
	 * emit order), so a call costs at most a batch of rows however young
	 * the table is; it deletes only what the aggregate's progress already
	 * covers, so that version assignment never needs a deleted row.  It
	 * skips rows locked by others (outbox_replay() updates an aggregate's
	 * rows in its own order): never waiting, it cannot deadlock with them.
	 */
	retention_plan = outbox_keep_plan(psprintf(
										   "DELETE FROM %s.outbox o USING ("
										   "SELECT d.id FROM (SELECT id, aggregate_id, aggregate_version, published_at "
										   "FROM %s.outbox WHERE published_at IS NOT NULL ORDER BY id LIMIT $2 "
										   "FOR UPDATE SKIP LOCKED) d "
										   "JOIN %s.aggregate_publication p ON p.aggregate_id = d.aggregate_id "
										   "WHERE d.published_at < pg_catalog.now() - pg_catalog.make_interval(secs => $1) "
										   "AND d.aggregate_version <= p.last_published_version) x "
										   "WHERE o.id = x.id", s, s, s),
								  2, retention_types);

	inbox_retention_plan = inbox_retention_prepare(s);
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
	Datum		args[2];

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	if (publish_lookup_extension())
	{
		args[1] = Int32GetDatum(outbox_retention_batch);
		if (outbox_retention_s >= 0)
		{
			args[0] = Int32GetDatum(outbox_retention_s);
			if (SPI_execute_plan(retention_plan, args, NULL, false, 0) != SPI_OK_DELETE)
				elog(ERROR, "outbox retention failed");
			deleted = SPI_processed;
		}
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
