/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  Publisher and inbox counters kept in shared memory since server start.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_STATS_H
#define OUTBOX_STATS_H

#include "port/atomics.h"

/* Names map to Prometheus metrics: outbox_<name>_total. */
typedef enum OutboxCounter
{
	OC_EVENTS_PUBLISHED,
	OC_EVENTS_DEAD_LETTERED,
	OC_EVENTS_SKIPPED,
	OC_BATCHES,
	OC_SETTLES,
	OC_DELIVERY_ERRORS_RETRIABLE,
	OC_DELIVERY_ERRORS_PERMANENT,
	OC_DELIVERY_ERRORS_FATAL,
	OC_DELIVERY_TIMEOUTS,
	OC_RETRIES,
	OC_PRODUCER_CREATIONS,
	OC_WAKEUPS,
	OC_REPORT_WAKEUPS,
	OC_POLLS,
	OC_AGGREGATES_LOCK_SKIPPED,
	OC_ORDER_GUARD_STOPS,
	OC_ORDER_VIOLATIONS,
	OC_STALE_REPORTS,
	OC_HEAP_ROWS_READ,
	OC_PROGRESS_KEY_LOOKUPS,
	OC_WORKER_ERRORS,
	OC_RETENTION_DELETED,
	OC_INBOX_RETENTION_DELETED,
	/* The inbox workers' (src/inbox_worker.c), counted once committed. */
	OC_INBOX_APPLIED,
	OC_INBOX_DUPLICATES,
	OC_INBOX_GAPS,
	OC_INBOX_HANDLER_ERRORS,
	OC_INBOX_DEAD_LETTERED,
	OC_INBOX_SKIPPED,
	OC_INBOX_BATCHES,
	OC_INBOX_BATCH_FALLBACKS,
	OC_INBOX_REBALANCES,
	OC_INBOX_WORKER_ERRORS,
	OC_INBOX_KAFKA_ERRORS,
	OC_NUM_COUNTERS
} OutboxCounter;

/* Upper bounds (ms) of the emit-to-acknowledgement latency histogram. */
#define OUTBOX_LATENCY_BUCKETS 34

typedef struct OutboxStats
{
	pg_atomic_uint64 counters[OC_NUM_COUNTERS];
	pg_atomic_uint64 latency[OUTBOX_LATENCY_BUCKETS + 1];	/* last: +Inf */
	pg_atomic_uint64 latency_sum_us;
} OutboxStats;

extern const char *const outbox_counter_names[OC_NUM_COUNTERS];
extern const double outbox_latency_bounds_ms[OUTBOX_LATENCY_BUCKETS];

extern void outbox_stats_init(OutboxStats *stats, bool found);
extern void outbox_stats_shmem_startup(bool found);
extern void outbox_count(OutboxCounter c, uint64 n);
extern void outbox_observe_latency(int64 usec);

#endif							/* OUTBOX_STATS_H */
