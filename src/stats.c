/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Publisher counters and the latency histogram, and the SQL functions
 *	  that expose them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "utils/builtins.h"
#include "utils/float.h"

#include "compat.h"
#include "shmem.h"
#include "stats.h"

PG_FUNCTION_INFO_V1(outbox_counters);
PG_FUNCTION_INFO_V1(outbox_latency_histogram);

const char *const outbox_counter_names[OC_NUM_COUNTERS] = {
	[OC_EVENTS_PUBLISHED] = "events_published",
	[OC_EVENTS_DEAD_LETTERED] = "events_dead_lettered",
	[OC_EVENTS_SKIPPED] = "events_skipped",
	[OC_BATCHES] = "batches",
	[OC_SETTLES] = "settles",
	[OC_DELIVERY_ERRORS_RETRIABLE] = "delivery_errors_retriable",
	[OC_DELIVERY_ERRORS_PERMANENT] = "delivery_errors_permanent",
	[OC_DELIVERY_ERRORS_FATAL] = "delivery_errors_fatal",
	[OC_DELIVERY_TIMEOUTS] = "delivery_timeouts",
	[OC_RETRIES] = "retries",
	[OC_PRODUCER_CREATIONS] = "producer_creations",
	[OC_WAKEUPS] = "wakeups",
	[OC_REPORT_WAKEUPS] = "report_wakeups",
	[OC_POLLS] = "polls",
	[OC_AGGREGATES_LOCK_SKIPPED] = "aggregates_lock_skipped",
	[OC_ORDER_GUARD_STOPS] = "order_guard_stops",
	[OC_ORDER_VIOLATIONS] = "order_violations",
	[OC_STALE_REPORTS] = "stale_reports",
	[OC_HEAP_ROWS_READ] = "heap_rows_read",
	[OC_PROGRESS_KEY_LOOKUPS] = "progress_key_lookups",
	[OC_WORKER_ERRORS] = "worker_errors",
	[OC_RETENTION_DELETED] = "retention_deleted",
	[OC_INBOX_RETENTION_DELETED] = "inbox_retention_deleted",
	[OC_INBOX_APPLIED] = "inbox_applied",
	[OC_INBOX_DUPLICATES] = "inbox_duplicates",
	[OC_INBOX_GAPS] = "inbox_gaps",
	[OC_INBOX_HANDLER_ERRORS] = "inbox_handler_errors",
	[OC_INBOX_DEAD_LETTERED] = "inbox_dead_lettered",
	[OC_INBOX_SKIPPED] = "inbox_skipped",
	[OC_INBOX_BATCHES] = "inbox_batches",
	[OC_INBOX_BATCH_FALLBACKS] = "inbox_batch_fallbacks",
	[OC_INBOX_REBALANCES] = "inbox_rebalances",
	[OC_INBOX_WORKER_ERRORS] = "inbox_worker_errors",
	[OC_INBOX_KAFKA_ERRORS] = "inbox_kafka_errors",
};

/*
 * Fine where a healthy publisher's latency lies (a millisecond or two of
 * linger and round trip, a read interval of a few): a p99 read from the
 * histogram is off by at most its bucket's width, 0.5-1 ms up to 10 ms.
 */
const double outbox_latency_bounds_ms[OUTBOX_LATENCY_BUCKETS] = {
	0.5, 1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 30, 40, 50,
	75, 100, 150, 200, 300, 500, 750, 1000, 2000, 5000, 10000, 30000, 60000,
	300000
};

/* Whether the counters are in shared memory: loaded at server start. */
static bool shared_stats = false;

/*
 * Attach to one database's counters in shared memory, initializing them if
 * new (or reset: a database taken up by the launcher starts from zero).
 */
void
outbox_stats_init(OutboxStats *stats, bool found)
{
	shared_stats = true;
	if (found)
		return;
	for (int i = 0; i < OC_NUM_COUNTERS; i++)
		pg_atomic_init_u64(&stats->counters[i], 0);
	for (int i = 0; i <= OUTBOX_LATENCY_BUCKETS; i++)
		pg_atomic_init_u64(&stats->latency[i], 0);
	pg_atomic_init_u64(&stats->latency_sum_us, 0);
}

/*
 * Attach to every database's counters in shared memory (from the shmem
 * startup hook, after outbox_shmem_startup, found telling whether the
 * memory existed already).
 */
void
outbox_stats_shmem_startup(bool found)
{
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	for (int i = 0; i < OUTBOX_MAX_DATABASES; i++)
		outbox_stats_init(&outbox_shared->databases[i].stats, found);
	LWLockRelease(AddinShmemInitLock);
}

/* The counters of this database, or NULL if no publisher serves it. */
static OutboxStats *
my_stats(void)
{
	return outbox_database_stats(MyDatabaseId);
}

/* Add n to a counter of this database. */
void
outbox_count(OutboxCounter c, uint64 n)
{
	OutboxStats *stats = my_stats();

	if (stats != NULL && n > 0)
		pg_atomic_fetch_add_u64(&stats->counters[c], n);
}

/* Count one emit-to-acknowledgement latency in the histogram. */
void
outbox_observe_latency(int64 usec)
{
	OutboxStats *stats = my_stats();
	int			i;

	if (stats == NULL)
		return;
	if (usec < 0)
		usec = 0;
	for (i = 0; i < OUTBOX_LATENCY_BUCKETS; i++)
		if (usec <= outbox_latency_bounds_ms[i] * 1000.0)
			break;
	pg_atomic_fetch_add_u64(&stats->latency[i], 1);
	pg_atomic_fetch_add_u64(&stats->latency_sum_us, (uint64) usec);
}

/* The SQL functions need the counters: the library must be preloaded. */
static void
require_shared_memory(void)
{
	if (!shared_stats)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox must be loaded via shared_preload_libraries"),
				 errhint("Add outbox to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/* An atomic counter's value, zero if there is no counter. */
#define READ_COUNTER(stats, field) \
	((stats) ? (int64) pg_atomic_read_u64(&(stats)->field) : 0)

/*
 * outbox_counters() RETURNS TABLE (name text, value bigint): this
 * database's publishers' counters, since the launcher took it up.
 */
Datum
outbox_counters(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OutboxStats *stats;

	require_shared_memory();
	stats = my_stats();
	InitMaterializedSRF(fcinfo, 0);
	for (int i = 0; i < OC_NUM_COUNTERS; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = CStringGetTextDatum(outbox_counter_names[i]);
		values[1] = Int64GetDatum(READ_COUNTER(stats, counters[i]));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	/* The histogram's sum, so that a mean can be derived as Prometheus does. */
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = CStringGetTextDatum("latency_sum_us");
		values[1] = Int64GetDatum(READ_COUNTER(stats, latency_sum_us));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * outbox_latency_histogram() RETURNS TABLE (le_ms float8, count bigint)
 * Cumulative, as Prometheus histograms are; the last row's le_ms is
 * 'Infinity'.
 */
Datum
outbox_latency_histogram(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	uint64		cumulative = 0;
	OutboxStats *stats;

	require_shared_memory();
	stats = my_stats();
	InitMaterializedSRF(fcinfo, 0);
	for (int i = 0; i <= OUTBOX_LATENCY_BUCKETS; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		cumulative += READ_COUNTER(stats, latency[i]);
		values[0] = Float8GetDatum(i < OUTBOX_LATENCY_BUCKETS
								   ? outbox_latency_bounds_ms[i]
								   : get_float8_infinity());
		values[1] = Int64GetDatum((int64) cumulative);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
