/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The publisher: a background worker that sends each aggregate's
 *	  pending events to Kafka in version order.
 *
 * One batch is one transaction:
 *
 *	1. read the oldest pending events (ORDER BY id: per aggregate that is
 *	   version order, since emitters of an aggregate are serialized until
 *	   commit) of this worker's share of the buckets (split among the
 *	   workers alive), skipping paused, blocked and backing-off aggregates,
 *	   up to outbox.batch_events and outbox.batch_bytes;
 *	2. flush the WAL up to what that snapshot can see (and wait for
 *	   outbox.standby_confirmations standbys), so that only durable commits
 *	   are published;
 *	3. try-lock each aggregate in the publish key space; one that another
 *	   worker holds is skipped, that worker publishes its events;
 *	4. produce the events of the locked aggregates, each aggregate's in
 *	   version order and to one destination (the rest waits for a later
 *	   batch), and wait for all delivery reports;
 *	5. mark each aggregate's acknowledged prefix published, record the
 *	   first failure, and commit once.  If marking fails, what Kafka
 *	   acknowledged is kept and only the marking is retried.
 *
 * No snapshot is held while waiting for Kafka, only the aggregates' advisory
 * locks, which emitters never take.  A batch waits at most
 * outbox.delivery_timeout; messages still unacknowledged then stay with
 * librdkafka, which retries them forever, and their aggregates are "stalled":
 * later batches leave them alone until those reports come in, so a stuck
 * partition holds up only its own aggregates and copies never pile up.  Nothing is marked before Kafka
 * acknowledged it, so a crash anywhere means re-sending (duplicates), never
 * loss.  Because one producer delivers a prefix of what it is given, and a
 * batch starts at the first unpublished version, every re-send starts at or
 * below what a consumer has already seen: after dropping re-deliveries it
 * sees each version once, in order.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "outbox.h"
#include "kafka.h"
#include "record_headers.h"

/* Backoff of the whole worker after an error, and of a failing aggregate. */
#define WORKER_ERROR_BACKOFF_MS 1000
#define WORKER_ERROR_BACKOFF_MAX_MS 30000

/* How often an idle worker serves late delivery reports while any are due. */
#define STALLED_POLL_MS 10

/* How often a batch looks at the standbys' flush positions while waiting. */
#define STANDBY_POLL_MS 10

/* What a batch does with an event. */
typedef enum EventAction
{
	EV_PUBLISH,					/* to its topic */
	EV_DEAD_LETTER,				/* to outbox.dead_letter_topic */
	EV_SKIP						/* nowhere: recorded as skipped */
} EventAction;

static const char *const action_disposition[] = {
	[EV_PUBLISH] = "published",
	[EV_DEAD_LETTER] = "dead_lettered",
	[EV_SKIP] = "skipped",
};

typedef struct BatchEvent
{
	int64		id;
	char	   *event_id;
	char	   *aggregate_type;
	char	   *aggregate_id;
	int64		version;
	char	   *event_type;
	char	   *topic;
	Jsonb	   *headers;
	char	   *payload;		/* the value's bytes, NULL for a null payload */
	size_t		payload_len;
	TimestampTz created_at;
	int			attempts;
	char	   *last_error;
	bool		dead_letter_requested;
	TransactionId xmin;			/* the row version read: marks apply to it only */
	EventAction action;
	bool		produced;
	bool		solo;			/* produced with nothing else in flight */
	bool		retry_alone;	/* refused for size, maybe for others: no attempt */
	int			next;			/* next event of the same aggregate, or -1 */
} BatchEvent;

typedef enum AggregateState
{
	AGG_ACTIVE,					/* locked by us, events being produced */
	AGG_SKIPPED,				/* another worker holds it, or over the limit */
	AGG_STOPPED,				/* an event failed to enqueue: send no more */
	AGG_DEFERRED				/* the rest waits for a later batch */
} AggregateState;

typedef struct BatchAggregate
{
	char	   *aggregate_id;	/* hash key: must be first */
	AggregateState state;
	const char *destination;	/* topic of its first produced event */
	int			head;
	int			tail;
} BatchAggregate;

/* Set by SIGHUP, handled at the top of the loop. */
static int	worker_index;
static rd_kafka_t *producer = NULL;
static DeliveryTracker tracker;

/*
 * Stalled aggregates: those with messages of an abandoned batch still in the
 * producer, with a count of them; and per abandoned batch, which aggregate
 * each outstanding message belongs to.  All in stall_context, reset when the
 * producer is destroyed (its messages go with it).
 */
typedef struct StalledAggregate
{
	char	   *aggregate_id;	/* hash key: must be first */
	int			outstanding;
} StalledAggregate;

typedef struct StalledBatch
{
	uint32		generation;
	int			nmessages;
	int			outstanding;
	StalledAggregate **aggregate;	/* per message index; NULL once settled */
	struct StalledBatch *next;
} StalledBatch;

static MemoryContext stall_context = NULL;
static HTAB *stalled_aggregates = NULL;
static StalledBatch *stalled_batches = NULL;
static uint32 producer_fingerprint = 0;
static MemoryContext batch_context = NULL;

/*
 * The batch being produced, so that an error can hand its messages still in
 * flight to the stall bookkeeping (see end_batch_tracking).
 */
static BatchEvent *batch_events = NULL;
static int	batch_nevents = 0;
static bool batch_stalled = false;

/* Messages of earlier batches were in flight when this one began producing. */
static bool batch_after_stall = false;

/*
 * What Kafka acknowledged but is not yet marked in the database: kept (in
 * marks_context) when marking fails, and only the marking is retried, so
 * that an acknowledged event is never produced again by this worker.
 */
typedef struct PendingMarks
{
	Oid			extension;		/* the rows' ids mean nothing in another one */
	int			nmarks;
	int64	   *ids;
	TransactionId *xmins;
	int32	   *partitions;
	int64	   *offsets;
	char	  **dispositions;
	int			nprogress;
	char	  **progress_ids;
	int64	   *progress_versions;
	int64		nsettled[lengthof(action_disposition)];
} PendingMarks;

static MemoryContext marks_context = NULL;
static PendingMarks *pending_marks = NULL;

/* A reload was processed since the producer settings were last compared. */
static bool reloaded_in_batch = false;

static Oid	plans_nspid = InvalidOid;
static SPIPlanPtr fetch_plan = NULL;
static SPIPlanPtr mark_plan = NULL;
static SPIPlanPtr progress_plan = NULL;
static SPIPlanPtr fail_event_plan = NULL;
static SPIPlanPtr fail_aggregate_plan = NULL;
static SPIPlanPtr policy_plan = NULL;
static SPIPlanPtr retention_plan = NULL;
static SPIPlanPtr inbox_retention_plan = NULL;
static TimestampTz last_retention_at = 0;
static bool retention_behind = false;

static char last_logged_error[256];

/* Show what this worker does, in outbox_workers() and pg_stat_activity. */
static void
set_state(const char *state)
{
	OutboxWorkerSlot *slot = &outbox_shared->workers[worker_index];

	strlcpy(slot->state, state, sizeof(slot->state));
	pgstat_report_activity(STATE_RUNNING, state);
}

/*
 * What hinders publishing, for outbox_workers() and outbox_status: the
 * last error of the loop (e.g. a producer that cannot be created), else a
 * broker-level condition (e.g. all brokers down), else nothing.
 */
static void
set_problem(const char *error)
{
	OutboxWorkerSlot *slot = &outbox_shared->workers[worker_index];
	TimestampTz since = 0;
	const char *problem = error ? error : outbox_kafka_condition(&since);

	if (problem == NULL)
	{
		slot->problem[0] = '\0';
		slot->problem_since = 0;
		return;
	}
	if (strncmp(slot->problem, problem, sizeof(slot->problem) - 1) != 0)
	{
		strlcpy(slot->problem, problem, sizeof(slot->problem));
		slot->problem_since = since ? since : GetCurrentTimestamp();
	}
}

/* Leave the slot; the workers still alive take over this one's buckets. */
static void
worker_exit(int code, Datum arg)
{
	OutboxWorkerSlot *slot = &outbox_shared->workers[worker_index];

	slot->latch = NULL;
	slot->pid = 0;
	strlcpy(slot->state, "stopped", sizeof(slot->state));
	outbox_wake_workers();
	outbox_producer_destroy(producer);
	producer = NULL;
}

/*
 * This worker's share of the publish buckets: its rank among the workers
 * alive now, and their number.  A configured worker that never started
 * (max_worker_processes too low) or is dead until its restart owns no
 * share, so no bucket waits for it; while membership changes, two workers
 * may both fetch a bucket for a moment, and its try-lock decides.
 */
static void
bucket_share(int *nshares, int *share)
{
	int			n = 0;

	*share = 0;
	for (int i = 0; i < outbox_workers; i++)
	{
		pid_t		pid = outbox_shared->workers[i].pid;

		if (i == worker_index)
			*share = n++;
		else if (pid != 0 && (kill(pid, 0) == 0 || errno != ESRCH))
			n++;
	}
	*nshares = n;
}

static uint32
aggregate_hash(const void *key, Size keysize)
{
	const char *s = *(const char *const *) key;

	return hash_bytes((const unsigned char *) s, strlen(s));
}

static int
aggregate_match(const void *key1, const void *key2, Size keysize)
{
	return strcmp(*(const char *const *) key1, *(const char *const *) key2);
}

/* A hash table keyed by aggregate id (a char * as the entry's first field). */
static HTAB *
aggregate_table(const char *name, Size entrysize, long nelem, MemoryContext cxt)
{
	HASHCTL		hctl;

	memset(&hctl, 0, sizeof(hctl));
	hctl.keysize = sizeof(char *);
	hctl.entrysize = entrysize;
	hctl.hash = aggregate_hash;
	hctl.match = aggregate_match;
	hctl.hcxt = cxt;
	return hash_create(name, nelem, &hctl,
					   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
}

static void
reset_stalled(void)
{
	MemoryContextReset(stall_context);
	stalled_batches = NULL;
	stalled_aggregates = aggregate_table("outbox stalled aggregates",
										 sizeof(StalledAggregate), 64, stall_context);
}

/* A report of an abandoned batch arrived: its aggregate may be free again. */
static void
stale_report(uint32 generation, int index)
{
	StalledBatch **link = &stalled_batches;
	StalledBatch *sb;
	StalledAggregate *agg;

	while ((sb = *link) != NULL && sb->generation != generation)
		link = &sb->next;
	if (sb == NULL || index < 0 || index >= sb->nmessages ||
		(agg = sb->aggregate[index]) == NULL)
		return;

	sb->aggregate[index] = NULL;
	if (--agg->outstanding == 0)
	{
		char	   *key = agg->aggregate_id;

		(void) hash_search(stalled_aggregates, &key, HASH_REMOVE, NULL);
		pfree(key);
	}
	if (--sb->outstanding == 0)
	{
		*link = sb->next;
		pfree(sb->aggregate);
		pfree(sb);
	}
}

/* The batch stops waiting: remember whose messages are still out there. */
static void
stall_batch(BatchEvent *events, int nevents)
{
	StalledBatch *sb = MemoryContextAllocZero(stall_context, sizeof(StalledBatch));

	sb->generation = tracker.generation;
	sb->nmessages = nevents;
	sb->aggregate = MemoryContextAllocZero(stall_context,
										   sizeof(StalledAggregate *) * nevents);
	for (int i = 0; i < nevents; i++)
	{
		StalledAggregate *agg;
		bool		found;

		if (!events[i].produced || tracker.results[i].done)
			continue;
		agg = hash_search(stalled_aggregates, &events[i].aggregate_id, HASH_ENTER, &found);
		if (!found)
		{
			agg->aggregate_id = MemoryContextStrdup(stall_context, events[i].aggregate_id);
			agg->outstanding = 0;
		}
		agg->outstanding++;
		sb->aggregate[i] = agg;
		sb->outstanding++;
	}
	sb->next = stalled_batches;
	stalled_batches = sb;
}

/*
 * Stop tracking the current batch, after it committed or failed: its
 * reports are stale from now on.  Messages still in flight stall their
 * aggregates (unless the batch already stalled them), so that no later batch
 * sends copies of them, and the tracker no longer points into batch_context,
 * which the next batch resets while those reports can still arrive.
 */
static void
end_batch_tracking(void)
{
	if (tracker.results != NULL && !batch_stalled && tracker.outstanding > 0 &&
		producer != NULL)
		stall_batch(batch_events, batch_nevents);
	tracker.generation++;
	tracker.results = NULL;
	tracker.nresults = 0;
	tracker.outstanding = 0;
	batch_events = NULL;
	batch_nevents = 0;
	batch_stalled = false;
}

/* The stalled aggregates' ids, for the fetch query to leave out. */
static Datum
stalled_array(void)
{
	long		n = hash_get_num_entries(stalled_aggregates);
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));
	HASH_SEQ_STATUS seq;
	StalledAggregate *agg;
	int			i = 0;

	hash_seq_init(&seq, stalled_aggregates);
	while ((agg = hash_seq_search(&seq)) != NULL)
		d[i++] = CStringGetTextDatum(agg->aggregate_id);
	return PointerGetDatum(construct_array(d, i, TEXTOID, -1, false, TYPALIGN_INT));
}

static void
drop_producer(void)
{
	outbox_producer_destroy(producer);
	producer = NULL;
	reset_stalled();
}

/* Schema of the extension in this database, or NULL if not installed. */
static char *
extension_schema(Oid *nspid)
{
	bool		isnull;
	int			rc;

	rc = SPI_execute("SELECT e.extnamespace, n.nspname FROM pg_catalog.pg_extension e "
					 "JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
					 "WHERE e.extname = 'outbox'", true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not look up the outbox extension");
	if (SPI_processed == 0)
		return NULL;
	*nspid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
	return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
}

/* Prepare and keep one plan (the publisher's and the inbox workers'). */
SPIPlanPtr
outbox_keep_plan(const char *query, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan = SPI_prepare(query, nargs, argtypes);

	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", query,
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	return plan;
}

static void
prepare_plans(Oid nspid, const char *schema)
{
	const char *s = quote_identifier(schema);
	Oid			fetch_types[4] = {INT4OID, INT4OID, INT4OID, TEXTARRAYOID};
	Oid			mark_types[6] = {TIMESTAMPTZOID, INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID,
	TEXTARRAYOID, XIDARRAYOID};
	Oid			progress_types[3] = {TIMESTAMPTZOID, TEXTARRAYOID, INT8ARRAYOID};
	Oid			fail_event_types[3] = {INT8OID, TEXTOID, INT4OID};
	Oid			fail_aggregate_types[6] = {TEXTOID, INT4OID, TEXTOID, INT4OID, INT8OID, BOOLOID};
	Oid			policy_types[2] = {TEXTOID, TEXTOID};
	Oid			retention_types[2] = {INT4OID, INT4OID};

	if (fetch_plan)
	{
		SPI_freeplan(fetch_plan);
		SPI_freeplan(mark_plan);
		SPI_freeplan(progress_plan);
		SPI_freeplan(fail_event_plan);
		SPI_freeplan(fail_aggregate_plan);
		SPI_freeplan(policy_plan);
		SPI_freeplan(retention_plan);
		SPI_freeplan(inbox_retention_plan);
		fetch_plan = NULL;
	}
	plans_nspid = InvalidOid;

	fetch_plan = outbox_keep_plan(psprintf(
									   "SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, "
									   "o.aggregate_version, o.event_type, o.topic, o.headers, "
									   "o.payload::text, o.created_at, o.attempts, o.last_error, "
									   "o.dead_letter_requested, o.xmin, o.payload_bytes "
									   "FROM %s.outbox o "
									   "WHERE o.published_at IS NULL "
									   "AND NOT coalesce((SELECT c.paused FROM %s.publisher_control c), false) "
									   "AND ($2 = 1 OR ((pg_catalog.hashtext(o.aggregate_id) & 2147483647) %% %d) %% $2 = $3) "
									   "AND NOT (o.aggregate_id OPERATOR(pg_catalog.=) ANY ($4)) "
									   "AND NOT EXISTS (SELECT 1 FROM %s.aggregate_publication p "
									   "WHERE p.aggregate_id = o.aggregate_id "
									   "AND (p.paused OR p.blocked_version IS NOT NULL "
									   "OR p.next_attempt_at > pg_catalog.now())) "
									   "ORDER BY o.id LIMIT $1", s, s, OUTBOX_PUBLISH_BUCKETS, s),
							  4, fetch_types);

	/*
	 * Rows are marked only as read (same xmin): an aggregate any of whose
	 * rows changed since (an operator's replay, retry or skip while marking
	 * was held) keeps all its rows pending, to be sent again in order.
	 */
	mark_plan = outbox_keep_plan(psprintf(
									  "WITH u AS (SELECT * FROM unnest($2, $3, $4, $5, $6) AS u(id, p, off, d, x)), "
									  "changed AS (SELECT q.aggregate_id FROM u JOIN %s.outbox q ON q.id = u.id "
									  "WHERE q.xmin <> u.x OR q.published_at IS NOT NULL) "
									  "UPDATE %s.outbox o SET published_at = $1, disposition = u.d::%s.outbox_disposition, "
									  "attempts = o.attempts + CASE WHEN u.d = 'skipped' THEN 0 ELSE 1 END, "
									  "last_error = CASE WHEN u.d = 'published' THEN NULL ELSE o.last_error END, "
									  "kafka_partition = NULLIF(u.p, -1), kafka_offset = NULLIF(u.off, -1) "
									  "FROM u WHERE o.id = u.id AND o.published_at IS NULL AND o.xmin = u.x "
									  "AND o.aggregate_id NOT IN (SELECT c.aggregate_id FROM changed c)", s, s, s),
							 6, mark_types);

	progress_plan = outbox_keep_plan(psprintf(
										  "INSERT INTO %s.aggregate_publication AS a "
										  "(aggregate_id, last_published_version, last_published_at, updated_at) "
										  "SELECT u.id, u.v, $1, $1 FROM unnest($2, $3) AS u(id, v) "
										  "WHERE NOT EXISTS (SELECT 1 FROM %s.outbox o WHERE o.aggregate_id = u.id "
										  "AND o.aggregate_version <= u.v AND o.published_at IS NULL) "
										  "ON CONFLICT (aggregate_id) DO UPDATE SET "
										  "last_published_version = GREATEST(a.last_published_version, excluded.last_published_version), "
										  "last_published_at = excluded.last_published_at, "
										  "attempts = 0, last_error = NULL, next_attempt_at = NULL, "
										  "updated_at = excluded.updated_at", s, s),
								 3, progress_types);

	fail_event_plan = outbox_keep_plan(psprintf(
											"UPDATE %s.outbox SET attempts = attempts + $3, last_error = $2 "
											"WHERE id = $1 RETURNING attempts", s),
								   3, fail_event_types);

	/*
	 * A permanent error backs the aggregate off exponentially.  After
	 * max_attempts the poison policy applies: block stops the aggregate at
	 * that version until an operator acts; the others apply in the next
	 * batch, at once (and back off again if even that fails).
	 */
	fail_aggregate_plan = outbox_keep_plan(psprintf(
												"INSERT INTO %s.aggregate_publication AS a "
												"(aggregate_id, attempts, last_error, next_attempt_at, "
												"blocked_version, blocked_at, updated_at) "
												"VALUES ($1, $2, $3, CASE WHEN $2 <> $4 THEN pg_catalog.clock_timestamp() + "
												"pg_catalog.make_interval(secs => LEAST(60, 2 ^ ($2 - 1))) END, "
												"CASE WHEN $2 >= $4 AND $6 THEN $5 END, "
												"CASE WHEN $2 >= $4 AND $6 THEN pg_catalog.clock_timestamp() END, "
												"pg_catalog.clock_timestamp()) "
												"ON CONFLICT (aggregate_id) DO UPDATE SET "
												"attempts = excluded.attempts, last_error = excluded.last_error, "
												"next_attempt_at = excluded.next_attempt_at, "
												"blocked_version = excluded.blocked_version, "
												"blocked_at = excluded.blocked_at, updated_at = excluded.updated_at", s),
									   6, fail_aggregate_types);

	policy_plan = outbox_keep_plan(psprintf(
										"SELECT policy FROM %s.poison_policy "
										"WHERE topic = $1 OR aggregate_type = $2 "
										"ORDER BY topic IS NULL LIMIT 1", s),
							   2, policy_types);

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

	inbox_retention_plan = outbox_keep_plan(psprintf(
												 "DELETE FROM %s.inbox i USING ("
												 "SELECT consumer, event_id FROM %s.inbox "
												 "WHERE processed_at < pg_catalog.now() - pg_catalog.make_interval(secs => $1) "
												 "ORDER BY processed_at LIMIT $2) x "
												 "WHERE i.consumer = x.consumer AND i.event_id = x.event_id", s, s),
										2, retention_types);
	plans_nspid = nspid;
}

/* The Kafka timestamp of an event: its emit time, in Unix milliseconds. */
static int64
timestamptz_to_unix_ms(TimestampTz t)
{
	return t / 1000 +
		(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
}

/*
 * The record's headers: the caller's, then the publisher's own
 * (record_headers.h; outbox_emit() refuses those names), and on a
 * dead-lettered record why, with the error cut to what outbox_emit()
 * counted when it checked the record's size.
 */
static rd_kafka_headers_t *
build_headers(BatchEvent *ev)
{
	rd_kafka_headers_t *hdrs = rd_kafka_headers_new(8);
	char		version[32];

	if (ev->headers != NULL)
	{
		JsonbIterator *it = JsonbIteratorInit(&ev->headers->root);
		JsonbValue	v;
		JsonbIteratorToken tok;
		char	   *key = NULL;
		int			keylen = 0;

		while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		{
			if (tok == WJB_KEY)
			{
				key = v.val.string.val;
				keylen = v.val.string.len;
			}
			else if (tok == WJB_VALUE && v.type == jbvString)
				rd_kafka_header_add(hdrs, key, keylen, v.val.string.val,
									v.val.string.len);
		}
	}
	snprintf(version, sizeof(version), INT64_FORMAT, ev->version);
	/* "id" too: where Debezium's outbox event router puts the event id. */
	rd_kafka_header_add(hdrs, OUTBOX_HEADER_ID, -1, ev->event_id, -1);
	rd_kafka_header_add(hdrs, OUTBOX_HEADER_EVENT_ID, -1, ev->event_id, -1);
	rd_kafka_header_add(hdrs, OUTBOX_HEADER_EVENT_TYPE, -1, ev->event_type, -1);
	rd_kafka_header_add(hdrs, OUTBOX_HEADER_AGGREGATE_TYPE, -1, ev->aggregate_type, -1);
	rd_kafka_header_add(hdrs, OUTBOX_HEADER_AGGREGATE_ID, -1, ev->aggregate_id, -1);
	rd_kafka_header_add(hdrs, OUTBOX_HEADER_AGGREGATE_VERSION, -1, version, -1);
	if (ev->action == EV_DEAD_LETTER)
	{
		char		attempts[16];
		const char *error = ev->last_error ? ev->last_error : "dead-lettered by an operator";

		snprintf(attempts, sizeof(attempts), "%d", ev->attempts);
		rd_kafka_header_add(hdrs, OUTBOX_HEADER_DEAD_LETTER_ORIGINAL_TOPIC, -1, ev->topic, -1);
		rd_kafka_header_add(hdrs, OUTBOX_HEADER_DEAD_LETTER_ERROR, -1, error,
							pg_mbcliplen(error, strlen(error), OUTBOX_DEAD_LETTER_ERROR_MAX_BYTES));
		rd_kafka_header_add(hdrs, OUTBOX_HEADER_DEAD_LETTER_ATTEMPTS, -1, attempts, -1);
	}
	return hdrs;
}

/*
 * Hand one event to librdkafka.  Returns the error if it could not be
 * enqueued (then nothing later of its aggregate may be sent in this batch).
 */
static rd_kafka_resp_err_t
produce_event(BatchEvent *ev, int index, TimestampTz deadline)
{
	for (;;)
	{
		rd_kafka_headers_t *hdrs = build_headers(ev);
		const char *topic = ev->action == EV_DEAD_LETTER
			? outbox_dead_letter_topic : ev->topic;
		rd_kafka_resp_err_t err;

		err = rd_kafka_producev(producer,
								RD_KAFKA_V_TOPIC(topic),
								RD_KAFKA_V_KEY(ev->aggregate_id, strlen(ev->aggregate_id)),
								RD_KAFKA_V_VALUE(ev->payload, ev->payload_len),
								RD_KAFKA_V_TIMESTAMP(timestamptz_to_unix_ms(ev->created_at)),
								RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								RD_KAFKA_V_HEADERS(hdrs),
								RD_KAFKA_V_OPAQUE(outbox_delivery_opaque(tracker.generation, index)),
								RD_KAFKA_V_END);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			ev->produced = true;
			tracker.outstanding++;
			/* librdkafka has its own copy: keep one per batch, not two. */
			if (ev->payload != NULL)
			{
				pfree(ev->payload);
				ev->payload = NULL;
				ev->payload_len = 0;
			}
			return err;
		}
		rd_kafka_headers_destroy(hdrs);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL ||
			GetCurrentTimestamp() >= deadline)
			return err;
		/* Let delivery reports drain the queue, then try again. */
		rd_kafka_poll(producer, 10);
		CHECK_FOR_INTERRUPTS();
	}
}

/* Wait for the current batch's delivery reports, up to the deadline. */
static bool
await_deliveries(TimestampTz deadline)
{
	while (tracker.outstanding > 0)
	{
		long		remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
																deadline);

		if (remaining <= 0)
			return false;
		/* rd_kafka_poll returns as soon as a report arrives. */
		rd_kafka_poll(producer, (int) Min(remaining, 100));
		CHECK_FOR_INTERRUPTS();
	}
	return true;
}

static Datum
int8_array(int64 *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, INT8OID, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}

static Datum
int4_array(int32 *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = Int32GetDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, INT4OID, 4, true, TYPALIGN_INT));
}

/* An xid[] of row versions, for the marking to compare with xmin. */
static Datum
xid_array(TransactionId *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = TransactionIdGetDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, XIDOID, sizeof(TransactionId), true,
										   TYPALIGN_INT));
}

static Datum
text_array(char **v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = CStringGetTextDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/* The poison policy of an event: per topic, else aggregate type, else GUC. */
static PoisonPolicy
poison_policy(BatchEvent *ev)
{
	Datum		args[2] = {CStringGetTextDatum(ev->topic),
	CStringGetTextDatum(ev->aggregate_type)};
	bool		push = !ActiveSnapshotSet();
	char	   *policy = NULL;

	/* Called while producing, when the batch holds no snapshot. */
	if (push)
		PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_execute_plan(policy_plan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the poison policy");
	if (SPI_processed > 0)
		policy = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	if (push)
		PopActiveSnapshot();

	if (policy == NULL)
		return (PoisonPolicy) outbox_poison_policy;
	if (strcmp(policy, "dead_letter") == 0)
		return POISON_DEAD_LETTER;
	if (strcmp(policy, "skip") == 0)
		return POISON_SKIP;
	return POISON_BLOCK;
}

/*
 * Record a permanent failure of one event and back its aggregate off; after
 * max_attempts, apply the poison policy.
 */
static void
record_failure(BatchEvent *ev, const char *msg)
{
	Datum		ev_args[3] = {Int64GetDatum(ev->id), CStringGetTextDatum(msg),
	Int32GetDatum(1)};
	Datum		agg_args[6];
	bool		isnull;
	int32		attempts;
	PoisonPolicy policy = POISON_BLOCK;

	if (SPI_execute_plan(fail_event_plan, ev_args, NULL, false, 1) != SPI_OK_UPDATE_RETURNING ||
		SPI_processed != 1)
		elog(ERROR, "could not record the failure of event " INT64_FORMAT, ev->id);
	attempts = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 1, &isnull));
	if (attempts >= outbox_max_attempts)
		policy = poison_policy(ev);

	agg_args[0] = CStringGetTextDatum(ev->aggregate_id);
	agg_args[1] = Int32GetDatum(attempts);
	agg_args[2] = CStringGetTextDatum(msg);
	agg_args[3] = Int32GetDatum(outbox_max_attempts);
	agg_args[4] = Int64GetDatum(ev->version);
	agg_args[5] = BoolGetDatum(policy == POISON_BLOCK);
	if (SPI_execute_plan(fail_aggregate_plan, agg_args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the failure of aggregate \"%s\"", ev->aggregate_id);

	if (attempts < outbox_max_attempts)
		ereport(LOG,
				(errmsg("outbox: event %s (aggregate \"%s\" version " INT64_FORMAT ") failed, attempt %d of %d",
						ev->event_id, ev->aggregate_id, ev->version, attempts, outbox_max_attempts),
				 errdetail("Topic \"%s\": %s.", ev->topic, msg)));
	else if (policy == POISON_BLOCK)
		ereport(LOG,
				(errmsg("outbox: aggregate \"%s\" blocked at version " INT64_FORMAT " after %d attempts",
						ev->aggregate_id, ev->version, attempts),
				 errdetail("Event %s to topic \"%s\" failed: %s.", ev->event_id, ev->topic, msg),
				 errhint("Fix the cause, then SELECT outbox_retry('%s'), or outbox_skip() or outbox_dead_letter() the event.",
						 ev->aggregate_id)));
	else
		ereport(LOG,
				(errmsg("outbox: event %s (aggregate \"%s\" version " INT64_FORMAT ") failed %d times and will be %s",
						ev->event_id, ev->aggregate_id, ev->version, attempts,
						policy == POISON_SKIP ? "skipped" : "dead-lettered"),
				 errdetail("Topic \"%s\": %s.", ev->topic, msg)));
}

/* Where an event goes: its topic, or the dead-letter topic. */
static const char *
event_destination(BatchEvent *ev)
{
	return ev->action == EV_DEAD_LETTER ? outbox_dead_letter_topic : ev->topic;
}

/* Is this a refusal for size, which a broker judges per request? */
static bool
is_size_error(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
		err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE;
}

/* Was the event's last failure a refusal for size (then it is sent alone)? */
static bool
last_error_is_size(BatchEvent *ev)
{
	const char *names[] = {rd_kafka_err2name(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE),
	rd_kafka_err2name(RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE)};

	if (ev->last_error == NULL)
		return false;
	for (int i = 0; i < lengthof(names); i++)
	{
		size_t		len = strlen(names[i]);

		if (strncmp(ev->last_error, names[i], len) == 0 && ev->last_error[len] == ':')
			return true;
	}
	return false;
}

/*
 * Could the broker have judged this event's size together with others?  It
 * checks max.message.bytes per record batch, one per partition: shared if
 * another event of this batch went to the same topic and partition (or to
 * the same topic, unreported), or earlier batches had messages in flight.
 */
static bool
shared_request(BatchEvent *events, int nevents, int index)
{
	DeliveryResult *r = &tracker.results[index];

	if (events[index].solo)
		return false;
	if (batch_after_stall)
		return true;
	for (int j = 0; j < nevents; j++)
	{
		DeliveryResult *o = &tracker.results[j];

		if (j != index && events[j].produced &&
			(!o->done || o->partition == r->partition) &&
			strcmp(event_destination(&events[j]), event_destination(&events[index])) == 0)
			return true;
	}
	return false;
}

/*
 * Produce an event refused for size before with nothing else in flight, so
 * that the broker judges it alone: first wait for what this batch produced,
 * then for its own report.  Returns false, producing nothing, while messages
 * of earlier batches are in flight (they could share its request).
 */
static bool
produce_alone(BatchEvent *ev, int index, TimestampTz deadline)
{
	rd_kafka_resp_err_t err;

	if (hash_get_num_entries(stalled_aggregates) > 0 || !await_deliveries(deadline))
		return false;
	err = produce_event(ev, index, deadline);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		tracker.results[index].done = true;
		tracker.results[index].err = err;
		return true;
	}
	ev->solo = await_deliveries(deadline);
	return true;
}

/*
 * Produce one event of an active aggregate, or settle it without sending
 * (skip), or stop or defer the aggregate.  Idempotence orders messages only
 * within a partition, so a batch sends an aggregate's events to one
 * destination (topic, and with the key, partition): the first event bound
 * elsewhere and the rest wait for a later batch, which starts only once
 * these are settled (stalled aggregates are not fetched).  Returns 1 if a
 * failure was recorded, else 0.
 */
static int
produce_in_order(BatchEvent *ev, int i, BatchAggregate *agg, TimestampTz deadline)
{
	rd_kafka_resp_err_t err;

	/* An event out of attempts gets its aggregate's poison policy. */
	if (ev->dead_letter_requested)
		ev->action = EV_DEAD_LETTER;
	else if (ev->attempts >= outbox_max_attempts)
	{
		PoisonPolicy policy = poison_policy(ev);

		if (policy == POISON_BLOCK)
		{
			/* The policy became block since the last attempt. */
			agg->state = AGG_STOPPED;
			PushActiveSnapshot(GetTransactionSnapshot());
			record_failure(ev, ev->last_error ? ev->last_error : "out of attempts");
			PopActiveSnapshot();
			return 1;
		}
		ev->action = policy == POISON_SKIP ? EV_SKIP : EV_DEAD_LETTER;
	}
	if (ev->action == EV_SKIP)
	{
		DeliveryResult *r = &tracker.results[i];

		/* Settled without sending, in its place in the aggregate. */
		r->done = true;
		r->err = RD_KAFKA_RESP_ERR_NO_ERROR;
		r->partition = -1;
		r->offset = -1;
		return 0;
	}
	if (agg->destination != NULL &&
		strcmp(agg->destination, event_destination(ev)) != 0)
	{
		agg->state = AGG_DEFERRED;
		return 0;
	}

	if (ev->attempts > 0 || last_error_is_size(ev))
		outbox_count(OC_RETRIES, 1);
	if (last_error_is_size(ev))
	{
		/* Alone, as its aggregate's only event of the batch. */
		agg->state = AGG_DEFERRED;
		if (agg->destination == NULL && produce_alone(ev, i, deadline))
			agg->destination = event_destination(ev);
		return 0;
	}
	err = produce_event(ev, i, deadline);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		/* Later versions must not overtake this one. */
		agg->state = AGG_STOPPED;
		tracker.results[i].done = true;
		tracker.results[i].err = err;
	}
	agg->destination = event_destination(ev);
	return 0;
}

/*
 * An event refused for size in a request it shared: the broker judges
 * max.message.bytes per request, so the refusal may be for the others.
 * Record the error without counting an attempt or backing off; the next
 * batch sends it alone (produce_alone), and only a refusal then counts.
 */
static void
note_size_error(BatchEvent *ev, const char *msg)
{
	Datum		args[3] = {Int64GetDatum(ev->id), CStringGetTextDatum(msg),
	Int32GetDatum(0)};

	if (SPI_execute_plan(fail_event_plan, args, NULL, false, 1) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "could not record the failure of event " INT64_FORMAT, ev->id);
	ereport(LOG,
			(errmsg("outbox: event %s (aggregate \"%s\" version " INT64_FORMAT ") was refused for size with other messages; it is sent alone next, no attempt counted",
					ev->event_id, ev->aggregate_id, ev->version),
			 errdetail("Topic \"%s\": %s.", event_destination(ev), msg)));
}

/*
 * After a reload: a producer built from old Kafka settings (brokers,
 * properties, or the credentials file's content) is replaced.
 */
static void
check_producer_settings(void)
{
	if (producer != NULL &&
		outbox_kafka_config_fingerprint() != producer_fingerprint)
	{
		ereport(LOG, (errmsg("outbox: Kafka settings changed, recreating the producer")));
		drop_producer();
	}
}

static void
ensure_producer(void)
{
	if (producer != NULL)
		return;
	producer_fingerprint = outbox_kafka_config_fingerprint();
	producer = outbox_producer_create(&tracker);
	outbox_count(OC_PRODUCER_CREATIONS, 1);
}

static void
copy_row(BatchEvent *ev, HeapTuple tup, TupleDesc desc)
{
	bool		isnull;
	Datum		d;

	ev->id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	ev->event_id = SPI_getvalue(tup, desc, 2);
	ev->aggregate_type = SPI_getvalue(tup, desc, 3);
	ev->aggregate_id = SPI_getvalue(tup, desc, 4);
	ev->version = DatumGetInt64(SPI_getbinval(tup, desc, 5, &isnull));
	ev->event_type = SPI_getvalue(tup, desc, 6);
	ev->topic = SPI_getvalue(tup, desc, 7);
	d = SPI_getbinval(tup, desc, 8, &isnull);
	ev->headers = isnull ? NULL : DatumGetJsonbPCopy(d);
	/* A raw payload's exact bytes, else the JSON payload's text. */
	d = SPI_getbinval(tup, desc, 15, &isnull);
	if (!isnull)
	{
		bytea	   *raw = DatumGetByteaPP(d);

		/* A chunk of its own: produce_event() frees it once sent. */
		ev->payload_len = VARSIZE_ANY_EXHDR(raw);
		ev->payload = palloc(ev->payload_len + 1);
		memcpy(ev->payload, VARDATA_ANY(raw), ev->payload_len);
		if ((Pointer) raw != DatumGetPointer(d))
			pfree(raw);
	}
	else
	{
		ev->payload = SPI_getvalue(tup, desc, 9);
		ev->payload_len = ev->payload ? strlen(ev->payload) : 0;
	}
	ev->created_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, 10, &isnull));
	ev->attempts = DatumGetInt32(SPI_getbinval(tup, desc, 11, &isnull));
	ev->last_error = SPI_getvalue(tup, desc, 12);
	ev->dead_letter_requested = DatumGetBool(SPI_getbinval(tup, desc, 13, &isnull));
	ev->xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 14, &isnull));
	ev->action = EV_PUBLISH;
	ev->produced = false;
	ev->solo = false;
	ev->retry_alone = false;
	ev->next = -1;
}

/* Bytes an event holds in memory: what outbox.batch_bytes counts. */
static int64
event_bytes(BatchEvent *ev)
{
	return sizeof(BatchEvent) + strlen(ev->event_id) + strlen(ev->aggregate_type) +
		strlen(ev->aggregate_id) + strlen(ev->event_type) + strlen(ev->topic) +
		(ev->headers ? VARSIZE(ev->headers) : 0) +
		ev->payload_len +
		(ev->last_error ? strlen(ev->last_error) : 0);
}

/*
 * Read the batch into batch_context: at most outbox.batch_events events and,
 * past the first, outbox.batch_bytes of them.  A cursor, read in chunks
 * sized by the bytes left, keeps the rows in memory at once near that bound
 * however large the events are.  Returns the number of events.
 */
static int
fetch_events(Datum *args, BatchEvent **events_out)
{
	Portal		portal = SPI_cursor_open(NULL, fetch_plan, args, NULL, true);
	int			max = outbox_batch_events;
	int			size = Min(max, 1024);
	BatchEvent *events = MemoryContextAlloc(batch_context, sizeof(BatchEvent) * size);
	int			n = 0;
	int64		bytes = 0;
	long		chunk = 16;

	while (n < max && bytes < outbox_batch_bytes)
	{
		long		want = Min(chunk, max - n);
		uint64		nrows;

		SPI_cursor_fetch(portal, true, want);
		nrows = SPI_processed;
		for (uint64 r = 0; r < nrows && bytes < outbox_batch_bytes; r++)
		{
			MemoryContext oldcxt = MemoryContextSwitchTo(batch_context);

			if (n == size)
			{
				size = Min(max, size * 2);
				events = repalloc(events, sizeof(BatchEvent) * size);
			}
			copy_row(&events[n], SPI_tuptable->vals[r], SPI_tuptable->tupdesc);
			MemoryContextSwitchTo(oldcxt);
			bytes += event_bytes(&events[n]);
			n++;
		}
		SPI_freetuptable(SPI_tuptable);
		if (nrows < (uint64) want)
			break;				/* no more pending events */
		/* As many rows as the bytes left hold, at the average size so far. */
		chunk = Max(1, Min(1000, (outbox_batch_bytes - bytes) / Max(bytes / Max(n, 1), 1)));
	}
	SPI_cursor_close(portal);
	*events_out = events;
	return n;
}

/*
 * Wait until outbox.standby_confirmations walsenders report WAL flushed up
 * to upto, so that a failover cannot take back what is about to be
 * published.  Polls: walsenders do not wake us.
 */
static void
wait_for_standbys(XLogRecPtr upto)
{
	bool		waited = false;

	while (outbox_standby_confirmations > 0)
	{
		int			confirmed = 0;

		for (int i = 0; i < max_wal_senders; i++)
		{
			WalSnd	   *walsnd = &WalSndCtl->walsnds[i];
			pid_t		pid;
			XLogRecPtr	flush;

			SpinLockAcquire(&walsnd->mutex);
			pid = walsnd->pid;
			flush = walsnd->flush;
			SpinLockRelease(&walsnd->mutex);
			if (pid != 0 && flush != InvalidXLogRecPtr && flush >= upto)
				confirmed++;
		}
		if (confirmed >= outbox_standby_confirmations)
			break;
		if (!waited)
		{
			set_state("waiting for standbys");
			waited = true;
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 STANDBY_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		/* Lets an operator lower the setting to get publishing going. */
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			reloaded_in_batch = true;
		}
	}
}

/*
 * The end of the WAL inserted so far, as a position XLogFlush() accepts.
 * GetXLogInsertRecPtr() gives where the next record will start: right after
 * a page header when the last record ended on a page boundary, a position
 * not yet written, so that flushing up to it fails ("flush request not
 * satisfied") until someone else writes WAL.  The header has no record
 * bytes, so the page start covers every commit before it.
 */
static XLogRecPtr
wal_insert_end(void)
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
 * Publish only durable commits.  Everything the batch's snapshot sees was
 * committed before upto (a commit record is inserted before the transaction
 * becomes visible), but with synchronous_commit = off it may not be on disk
 * yet: a crash would take back an event Kafka already has, and its version
 * would go to another event.  Flush (a no-op when the WAL writer or the
 * emitters got there first), then wait for the standbys if configured.
 */
static void
make_durable(XLogRecPtr upto)
{
	set_state("flushing WAL");
	XLogFlush(upto);
	elog(DEBUG1, "outbox: WAL flushed at %ld ms",
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), GetCurrentTimestamp()));
	wait_for_standbys(upto);
}

/*
 * Mark acknowledged events settled and advance their aggregates' progress.
 * Only rows still as read are marked: an aggregate with a row an operator
 * changed meanwhile (held marks: outbox_replay(), outbox_retry(),
 * outbox_skip()) is left pending and sent again, and progress covers only
 * versions with nothing pending up to them.
 * Returns the number of rows marked.
 */
static uint64
apply_marks(PendingMarks *pm, TimestampTz now)
{
	Datum		args[6];
	uint64		marked;

	if (pm->nmarks == 0)
		return 0;
	args[0] = TimestampTzGetDatum(now);
	args[1] = int8_array(pm->ids, pm->nmarks);
	args[2] = int4_array(pm->partitions, pm->nmarks);
	args[3] = int8_array(pm->offsets, pm->nmarks);
	args[4] = text_array(pm->dispositions, pm->nmarks);
	args[5] = xid_array(pm->xmins, pm->nmarks);
	if (SPI_execute_plan(mark_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not mark events published");
	marked = SPI_processed;

	args[1] = text_array(pm->progress_ids, pm->nprogress);
	args[2] = int8_array(pm->progress_versions, pm->nprogress);
	if (SPI_execute_plan(progress_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record aggregate progress");
	return marked;
}

/* Count what a committed marking settled. */
static void
count_settled(PendingMarks *pm, TimestampTz now)
{
	outbox_count(OC_EVENTS_PUBLISHED, pm->nsettled[EV_PUBLISH]);
	outbox_count(OC_EVENTS_DEAD_LETTERED, pm->nsettled[EV_DEAD_LETTER]);
	outbox_count(OC_EVENTS_SKIPPED, pm->nsettled[EV_SKIP]);
	outbox_shared->workers[worker_index].last_batch_at = now;
}

/*
 * Retry marking what Kafka acknowledged after a marking failed, without
 * producing anything.  Returns the number of events marked.
 */
static int
retry_marks(void)
{
	char	   *schema;
	Oid			nspid = InvalidOid;
	TimestampTz now = GetCurrentTimestamp();
	int			n = pending_marks->nmarks;
	uint64		marked = 0;
	bool		same;

	set_state("marking published (retry)");
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	schema = extension_schema(&nspid);
	/* A dropped (or dropped and recreated) extension took the events with it. */
	same = schema != NULL && get_extension_oid("outbox", true) == pending_marks->extension;
	if (same)
	{
		if (nspid != plans_nspid)
			prepare_plans(nspid, schema);
		marked = apply_marks(pending_marks, now);
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();

	if (same)
	{
		count_settled(pending_marks, now);
		ereport(LOG,
				(errmsg("outbox: marked " UINT64_FORMAT " acknowledged events published after marking had failed", marked),
				 marked < (uint64) n
				 ? errdetail("%d events changed meanwhile (an operator replayed, retried or settled them) were left to be sent again.",
							 n - (int) marked) : 0));
	}
	else
	{
		ereport(LOG,
				(errmsg("outbox: dropped %d acknowledged events awaiting marking: the extension was dropped", n)));
		n = 0;
	}
	MemoryContextReset(marks_context);
	pending_marks = NULL;
	return n;
}

/*
 * One batch.  Returns the number of events it settled: acknowledged, or
 * failed and recorded (0 when there is nothing to do, -1 when the extension
 * is not installed).
 */
static int
run_batch(void)
{
	int			nfailed = 0;
	MemoryContext oldcxt;
	HTAB	   *aggregates;
	BatchEvent *events;
	int			nevents;
	int			naggregates = 0;
	char	   *schema;
	Oid			nspid = InvalidOid;
	Datum		fetch_args[4];
	int			nshares;
	int			share;
	XLogRecPtr	visible_upto;
	TimestampTz deadline;
	bool		complete;
	PendingMarks *pm;
	int			nmarks;
	BatchEvent **failures;
	int			nfailures = 0;
	HASH_SEQ_STATUS seq;
	BatchAggregate *agg;
	TimestampTz now;

	MemoryContextReset(batch_context);

	set_state("reading pending events");
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());

	schema = extension_schema(&nspid);
	if (schema == NULL)
	{
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
		return -1;
	}
	if (nspid != plans_nspid)
		prepare_plans(nspid, schema);

	/* Every commit this snapshot sees ends before this WAL position. */
	visible_upto = wal_insert_end();

	bucket_share(&nshares, &share);
	fetch_args[0] = Int32GetDatum(outbox_batch_events);
	fetch_args[1] = Int32GetDatum(nshares);
	fetch_args[2] = Int32GetDatum(share);
	fetch_args[3] = stalled_array();
	nevents = fetch_events(fetch_args, &events);
	elog(DEBUG1, "outbox: fetched %d events in %ld ms", nevents,
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), GetCurrentTimestamp()));
	if (nevents == 0)
	{
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
		return 0;
	}

	/* Release the snapshot: nothing below needs one until marking. */
	PopActiveSnapshot();

	make_durable(visible_upto);
	ensure_producer();

	/* A new generation: reports of earlier batches are stale from now on. */
	tracker.generation++;
	tracker.results = MemoryContextAllocZero(batch_context, sizeof(DeliveryResult) * nevents);
	tracker.nresults = nevents;
	tracker.outstanding = 0;
	batch_events = events;
	batch_nevents = nevents;
	batch_stalled = false;

	aggregates = aggregate_table("outbox batch aggregates", sizeof(BatchAggregate),
								 1024, batch_context);

	set_state("producing");
	batch_after_stall = hash_get_num_entries(stalled_aggregates) > 0;
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   outbox_delivery_timeout_ms);
	for (int i = 0; i < nevents; i++)
	{
		BatchEvent *ev = &events[i];
		bool		found;

		agg = hash_search(aggregates, &ev->aggregate_id, HASH_ENTER, &found);
		if (!found)
		{
			LOCKTAG		tag;

			agg->head = agg->tail = i;
			agg->destination = NULL;
			if (naggregates >= outbox_batch_aggregates)
				agg->state = AGG_SKIPPED;
			else
			{
				outbox_publish_locktag(&tag, ev->aggregate_id);
				if (LockAcquire(&tag, ExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
				{
					agg->state = AGG_SKIPPED;
					outbox_count(OC_AGGREGATES_LOCK_SKIPPED, 1);
				}
				else
				{
					agg->state = AGG_ACTIVE;
					naggregates++;
				}
			}
		}
		else
		{
			events[agg->tail].next = i;
			agg->tail = i;
		}

		if (agg->state == AGG_ACTIVE)
			nfailed += produce_in_order(ev, i, agg, deadline);
	}

	elog(DEBUG1, "outbox: produced %d events of %d aggregates at %ld ms", tracker.outstanding, naggregates,
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), GetCurrentTimestamp()));
	if (outbox_enable_test_hooks &&
		pg_atomic_exchange_u32(&outbox_shared->inject_fatal_error, 0) != 0)
	{
		ereport(LOG, (errmsg("outbox: test hook: raising a fatal producer error")));
		rd_kafka_test_fatal_error(producer, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
								  "outbox_test_fatal_error()");
	}

	set_state("awaiting acknowledgements");
	complete = await_deliveries(deadline);
	if (!complete)
	{
		outbox_count(OC_DELIVERY_TIMEOUTS, 1);
		stall_batch(events, nevents);
		batch_stalled = true;
	}
	now = GetCurrentTimestamp();
	elog(DEBUG1, "outbox: acknowledged at %ld ms",
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), now));

	/* Each aggregate's acknowledged prefix, and its first failure. */
	set_state("marking published");
	PushActiveSnapshot(GetTransactionSnapshot());
	oldcxt = MemoryContextSwitchTo(marks_context);
	pm = palloc0(sizeof(PendingMarks));
	pm->extension = get_extension_oid("outbox", true);
	pm->ids = palloc(sizeof(int64) * nevents);
	pm->xmins = palloc(sizeof(TransactionId) * nevents);
	pm->partitions = palloc(sizeof(int32) * nevents);
	pm->offsets = palloc(sizeof(int64) * nevents);
	pm->dispositions = palloc(sizeof(char *) * nevents);
	pm->progress_ids = palloc(sizeof(char *) * (naggregates + 1));
	pm->progress_versions = palloc(sizeof(int64) * (naggregates + 1));
	MemoryContextSwitchTo(oldcxt);
	failures = MemoryContextAlloc(batch_context, sizeof(BatchEvent *) * (naggregates + 1));

	hash_seq_init(&seq, aggregates);
	while ((agg = hash_seq_search(&seq)) != NULL)
	{
		int64		last_acked = 0;
		BatchEvent *failed = NULL;
		int			i;

		if (agg->state == AGG_SKIPPED)
			continue;
		for (i = agg->head; i >= 0; i = events[i].next)
		{
			DeliveryResult *r = &tracker.results[i];

			if (!events[i].produced && !r->done)
				break;			/* never sent: the aggregate stopped earlier */
			if (!r->done || r->err != RD_KAFKA_RESP_ERR_NO_ERROR)
			{
				failed = &events[i];
				break;
			}
			pm->ids[pm->nmarks] = events[i].id;
			pm->xmins[pm->nmarks] = events[i].xmin;
			pm->partitions[pm->nmarks] = r->partition;
			pm->offsets[pm->nmarks] = r->offset;
			pm->dispositions[pm->nmarks] = (char *) action_disposition[events[i].action];
			pm->nmarks++;
			pm->nsettled[events[i].action]++;
			last_acked = events[i].version;
			if (events[i].action == EV_PUBLISH)
				outbox_observe_latency(r->acked_at - events[i].created_at);
		}
		if (last_acked > 0)
		{
			pm->progress_ids[pm->nprogress] = MemoryContextStrdup(marks_context,
																  agg->aggregate_id);
			pm->progress_versions[pm->nprogress] = last_acked;
			pm->nprogress++;
		}
		if (failed == NULL)
			continue;

		/* Anything acknowledged after the failure overtook it. */
		for (int j = failed->next; j >= 0; j = events[j].next)
			if (tracker.results[j].done &&
				tracker.results[j].err == RD_KAFKA_RESP_ERR_NO_ERROR)
			{
				outbox_count(OC_ORDER_VIOLATIONS, 1);
				ereport(WARNING,
						(errmsg("outbox: version " INT64_FORMAT " of aggregate \"%s\" was acknowledged although version " INT64_FORMAT " failed",
								events[j].version, agg->aggregate_id, failed->version),
						 errhint("The broker accepted an out-of-sequence batch; with a real cluster and enable.idempotence this cannot happen.")));
				break;
			}

		{
			DeliveryResult *r = &tracker.results[failed - events];

			if (!r->done)
				continue;		/* still in flight: timed out, retried later */
			if (is_size_error(r->err) && failed->produced &&
				shared_request(events, nevents, failed - events))
			{
				/* Maybe refused for others in its request: retried alone. */
				outbox_count(OC_DELIVERY_ERRORS_RETRIABLE, 1);
				failed->retry_alone = true;
				failures[nfailures++] = failed;
			}
			else if (outbox_kafka_error_is_permanent(r->err))
			{
				outbox_count(OC_DELIVERY_ERRORS_PERMANENT, 1);
				failures[nfailures++] = failed;
			}
			else
				outbox_count(OC_DELIVERY_ERRORS_RETRIABLE, 1);
			if (failed->next >= 0 || r->err != RD_KAFKA_RESP_ERR_NO_ERROR)
				outbox_count(OC_ORDER_GUARD_STOPS, 1);
		}
	}

	/* From here until the commit, a failure keeps the marks for retry_marks(). */
	if (pm->nmarks > 0)
		pending_marks = pm;
	apply_marks(pm, now);
	for (int f = 0; f < nfailures; f++)
	{
		DeliveryResult *r = &tracker.results[failures[f] - events];
		char	   *msg = psprintf("%s: %s", rd_kafka_err2name(r->err),
								   rd_kafka_err2str(r->err));

		if (failures[f]->retry_alone)
			note_size_error(failures[f], msg);
		else
			record_failure(failures[f], msg);
	}
	nfailed += nfailures;

	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	nmarks = pm->nmarks;
	elog(DEBUG1, "outbox: committed %d marks at %ld ms", nmarks,
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), GetCurrentTimestamp()));

	outbox_count(OC_BATCHES, 1);
	count_settled(pm, now);
	MemoryContextReset(marks_context);
	pending_marks = NULL;

	/* From here on, reports of this batch are stale (see stale_report). */
	end_batch_tracking();

	if (outbox_producer_fatal_pending() || rd_kafka_fatal_error(producer, NULL, 0))
	{
		char		reason[512];
		rd_kafka_resp_err_t err = rd_kafka_fatal_error(producer, reason, sizeof(reason));

		outbox_count(OC_DELIVERY_ERRORS_FATAL, 1);
		ereport(LOG,
				(errmsg("outbox: fatal Kafka producer error, recreating the producer"),
				 errdetail("%s: %s", rd_kafka_err2name(err), reason)));
		drop_producer();
	}
	return nmarks + nfailed;
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
	char	   *schema;
	Oid			nspid = InvalidOid;
	uint64		deleted = 0;
	uint64		inbox_deleted = 0;
	Datum		args[2];

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	schema = extension_schema(&nspid);
	if (schema != NULL)
	{
		if (nspid != plans_nspid)
			prepare_plans(nspid, schema);
		args[1] = Int32GetDatum(outbox_retention_batch);
		if (outbox_retention_s >= 0)
		{
			args[0] = Int32GetDatum(outbox_retention_s);
			if (SPI_execute_plan(retention_plan, args, NULL, false, 0) != SPI_OK_DELETE)
				elog(ERROR, "outbox retention failed");
			deleted = SPI_processed;
		}
		if (outbox_inbox_retention_s >= 0)
		{
			args[0] = Int32GetDatum(outbox_inbox_retention_s);
			if (SPI_execute_plan(inbox_retention_plan, args, NULL, false, 0) != SPI_OK_DELETE)
				elog(ERROR, "inbox retention failed");
			inbox_deleted = SPI_processed;
		}
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
	set_state("retention");
	while ((full = retention_batch()) &&
		   !TimestampDifferenceExceeds(start, GetCurrentTimestamp(), 100))
		CHECK_FOR_INTERRUPTS();
	retention_behind = full;
	last_retention_at = start;
}

/*
 * Sleep up to wait_ms or until woken.  While aggregates are stalled, serve
 * their late delivery reports every few milliseconds, and return as soon
 * as one frees an aggregate, so that it is not held up by the poll
 * interval.  Returns the WaitLatch result (0 when a report ended the wait).
 */
static int
idle_wait(long wait_ms)
{
	TimestampTz end = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);

	for (;;)
	{
		long		nstalled = hash_get_num_entries(stalled_aggregates);
		long		remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), end);
		int			rc;

		if (nstalled > 0 && producer != NULL)
			remaining = Min(remaining, STALLED_POLL_MS);
		rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					   remaining, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		if (producer != NULL)
			rd_kafka_poll(producer, 0);
		if (rc & WL_LATCH_SET)
			return rc;
		if (hash_get_num_entries(stalled_aggregates) < nstalled)
			return 0;
		if (GetCurrentTimestamp() >= end)
			return rc;
	}
}

/* Log an error caught in the loop (once per condition) and show it in the slot. */
static void
log_worker_error(void)
{
	ErrorData  *edata;
	MemoryContext oldcxt = MemoryContextSwitchTo(batch_context);

	edata = CopyErrorData();
	MemoryContextSwitchTo(oldcxt);
	FlushErrorState();

	/* Once per condition: repeats of the same message go to DEBUG1. */
	if (strncmp(last_logged_error, edata->message, sizeof(last_logged_error) - 1) != 0)
	{
		ereport(LOG,
				(errmsg("outbox: publisher error: %s", edata->message),
				 edata->detail ? errdetail_internal("%s", edata->detail) : 0,
				 errhint("The publisher retries with backoff.")));
		strlcpy(last_logged_error, edata->message, sizeof(last_logged_error));
	}
	else
		elog(DEBUG1, "outbox: publisher error (repeated): %s", edata->message);
	if (pending_marks != NULL)
		set_problem(psprintf("marking %d acknowledged events failed (held, not sent again): %s",
							 pending_marks->nmarks, edata->message));
	else
		set_problem(edata->detail
					? psprintf("%s: %s", edata->message, edata->detail)
					: edata->message);
	outbox_count(OC_WORKER_ERRORS, 1);
}

/*
 * Connecting fails with FATAL for a wrong outbox.database or outbox.role:
 * say which settings to look at.
 */
static void
connect_error_context(void *arg)
{
	errcontext("outbox publisher connecting to database \"%s\" (outbox.database) as %s (outbox.role)",
			   outbox_database,
			   outbox_role[0] ? psprintf("role \"%s\"", outbox_role) : "the bootstrap superuser");
}

static emit_log_hook_type prev_emit_log_hook = NULL;

/*
 * While connecting: record a failure for the status views; a failure that
 * repeats the previous attempt's is not logged again.
 */
static void
connect_log_hook(ErrorData *edata)
{
	OutboxWorkerSlot *slot = &outbox_shared->workers[worker_index];

	if (edata->elevel >= ERROR && edata->message != NULL)
	{
		char		problem[OUTBOX_PROBLEM_LEN];

		snprintf(problem, sizeof(problem), "cannot connect (outbox.database, outbox.role): %s",
				 edata->message);
		if (strcmp(slot->problem, problem) == 0)
		{
			edata->output_to_server = false;
		}
		else
		{
			strlcpy(slot->problem, problem, sizeof(slot->problem));
			slot->problem_since = GetCurrentTimestamp();
		}
		slot->connect_failures++;
	}
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*
 * Connect to outbox.database as outbox.role.  After failures in a row
 * (PostgreSQL restarts us every 5 s), wait longer first, up to 5 minutes:
 * a wrong setting costs a FATAL line once and a retry now and then, not a
 * fast loop.
 */
static void
connect_to_database(void)
{
	OutboxWorkerSlot *slot = &outbox_shared->workers[worker_index];
	ErrorContextCallback errcb;

	if (slot->connect_failures > 0)
	{
		long		wait_ms = (Min(5L << Min(slot->connect_failures, 6), 300) - 5) * 1000L;
		TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);

		/* The latch may be set for other reasons: wait out the time. */
		while ((wait_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until)) > 0)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 wait_ms, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
	}

	errcb.callback = connect_error_context;
	errcb.arg = NULL;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = connect_log_hook;

	BackgroundWorkerInitializeConnection(outbox_database,
										 outbox_role[0] ? outbox_role : NULL, 0);

	emit_log_hook = prev_emit_log_hook;
	error_context_stack = errcb.previous;
	slot->connect_failures = 0;
	slot->problem[0] = '\0';
	slot->problem_since = 0;
}

void
outbox_worker_main(Datum main_arg)
{
	OutboxWorkerSlot *slot;
	int			error_backoff_ms = WORKER_ERROR_BACKOFF_MS;
	bool		logged_missing = false;

	worker_index = DatumGetInt32(main_arg);

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	connect_to_database();
	/* Every name in our queries resolves in pg_catalog or is qualified. */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * A marking lost in a crash only means sending those events again: no
	 * need to wait for the WAL flush on every batch.
	 */
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * The pending fraction swings from nothing to everything faster than
	 * statistics follow; an estimate of a few pending rows made the fetch a
	 * bitmap scan of every pending row plus a sort.  Walking the pending
	 * index in id order is right at any backlog.
	 */
	SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);

	batch_context = AllocSetContextCreate(TopMemoryContext, "outbox batch",
										  ALLOCSET_DEFAULT_SIZES);
	marks_context = AllocSetContextCreate(TopMemoryContext, "outbox pending marks",
										  ALLOCSET_DEFAULT_SIZES);
	stall_context = AllocSetContextCreate(TopMemoryContext, "outbox stalled aggregates",
										  ALLOCSET_DEFAULT_SIZES);
	reset_stalled();
	tracker.stale_report = stale_report;
	slot = &outbox_shared->workers[worker_index];
	slot->pid = MyProcPid;
	slot->latch = MyLatch;
	on_shmem_exit(worker_exit, (Datum) 0);
	/* The others shrink their shares of the buckets. */
	outbox_wake_workers();

	ereport(LOG,
			(errmsg("outbox publisher %d started for database \"%s\"",
					worker_index, outbox_database)));

	for (;;)
	{
		int			n = 0;
		bool		failed = false;
		long		wait_ms;
		int			rc;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			reloaded_in_batch = true;
		}
		/* Also after a reload served while waiting for standbys. */
		if (reloaded_in_batch)
		{
			reloaded_in_batch = false;
			check_producer_settings();
		}

		PG_TRY();
		{
			/* Acknowledged but unmarked events are marked, never re-sent. */
			if (pending_marks != NULL)
				n = retry_marks();
			else
			{
				/* Early, so that a configuration it refuses shows while idle. */
				ensure_producer();
				n = run_batch();
			}
			/* One worker keeps the tables small. */
			if (worker_index == 0 &&
				(retention_behind ||
				 TimestampDifferenceExceeds(last_retention_at, GetCurrentTimestamp(), 1000)))
				run_retention();
		}
		PG_CATCH();
		{
			HOLD_INTERRUPTS();
			log_worker_error();
			AbortCurrentTransaction();
			end_batch_tracking();
			RESUME_INTERRUPTS();
			failed = true;
		}
		PG_END_TRY();

		/*
		 * Report table statistics as a backend does between transactions:
		 * the marking updates and retention deletes are the outbox's dead
		 * tuples, and autovacuum only sees what is reported.
		 */
		(void) pgstat_report_stat(false);

		if (failed)
		{
			wait_ms = error_backoff_ms;
			error_backoff_ms = Min(error_backoff_ms * 2, WORKER_ERROR_BACKOFF_MAX_MS);
		}
		else
		{
			error_backoff_ms = WORKER_ERROR_BACKOFF_MS;
			last_logged_error[0] = '\0';
			if (n < 0 && !logged_missing)
			{
				ereport(LOG,
						(errmsg("outbox: extension \"outbox\" is not installed in database \"%s\"; waiting",
								outbox_database)));
				logged_missing = true;
			}
			else if (n >= 0)
				logged_missing = false;
			set_problem(NULL);
			/* After progress, look again at once: more is probably waiting. */
			if (n > 0)
				continue;
			/* Idle: is a broker-level condition over? */
			outbox_producer_probe(producer);
			set_problem(NULL);
			wait_ms = outbox_poll_interval_ms;
		}

		if (pending_marks != NULL)
			set_state("marking failed: acknowledged events held");
		else if (failed)
			set_state("error, retrying");
		else if (hash_get_num_entries(stalled_aggregates) > 0)
		{
			char		state[sizeof(slot->state)];

			snprintf(state, sizeof(state), "idle, %ld aggregates awaiting Kafka",
					 hash_get_num_entries(stalled_aggregates));
			set_state(state);
		}
		else
			set_state("idle");
		pgstat_report_activity(STATE_IDLE, NULL);
		rc = idle_wait(wait_ms);
		if (rc & WL_LATCH_SET)
			outbox_count(OC_WAKEUPS, 1);
		else if (rc & WL_TIMEOUT)
			outbox_count(OC_POLLS, 1);
	}
}
