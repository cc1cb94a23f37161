/*-------------------------------------------------------------------------
 *
 * publish_settle.c
 *	  Settling: once all its messages are reported, an aggregate's
 *	  acknowledged prefix is marked published (dead-lettered, skipped), its
 *	  progress advanced and its first failure recorded, in short
 *	  transactions as reports come in.  What Kafka acknowledged is never
 *	  produced again by this worker: if marking fails, the marks are held
 *	  (the aggregates stay busy) and only the marking is retried.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "shmem.h"
#include "util.h"
#include "publish.h"

static const char *const action_disposition[] = {
	[EV_PUBLISH] = "published",
	[EV_DEAD_LETTER] = "dead_lettered",
	[EV_SKIP] = "skipped",
};

static SPIPlanPtr settle_plan = NULL;	/* planned for the arrays */
static SPIPlanPtr settle_small_plan = NULL; /* planned once */

/*
 * Most aggregates a settling records with the plan planned once: with the
 * arrays' redundant ANY conditions its worst join order costs n^2 array
 * reads, nothing next to a planning at this size.
 */
#define SETTLE_SMALL 64

/* Held marks (see PendingMarks), in marks_context. */
static MemoryContext marks_context = NULL;

static void release_collected(void);

/*
 * Settling waits this long after an aggregate became ready while other
 * messages are still out, so that one transaction settles the reports of
 * several partitions rather than one each: 5 ms, or as long as flights take
 * to be wholly reported if longer (a replicated cluster's partitions answer
 * tens of ms apart), and 1 ms more per 100 messages out (many take longer
 * to acknowledge), up to 100 ms.
 */
#define SETTLE_DELAY_MS 5
#define SETTLE_DELAY_MAX_MS 100

/* Since when an aggregate has been ready to settle (0: none is). */
static TimestampTz ready_since = 0;
PendingMarks *publish_pending_marks = NULL;

/* Set up this module's memory (in the worker, once). */
void
publish_settle_start(void)
{
	marks_context = AllocSetContextCreate(TopMemoryContext, "outbox pending marks",
										  ALLOCSET_DEFAULT_SIZES);
}

/* Prepare this module's plans for the extension in schema s (quoted). */
void
publish_settle_prepare(const char *s)
{
	Oid			types[9] = {TIMESTAMPTZOID, TEXTARRAYOID, INT8ARRAYOID, XIDARRAYOID,
	BOOLARRAYOID, INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID};
	const char *sql;

	if (settle_plan)
	{
		SPI_freeplan(settle_plan);
		SPI_freeplan(settle_small_plan);
	}

	/*
	 * One statement per settling: each aggregate's progress, recorded only
	 * on the row version read (a row an operator or a failure changed since
	 * lists the aggregate: it is read again by index, from its progress),
	 * or inserted if there was none; then the dispositions of dead-lettered
	 * and skipped events of the aggregates recorded.  Returns those.
	 * Published events are not written: progress says they are.  A listed
	 * aggregate's backoff, once over and published, becomes catch_up: the
	 * stream skipped its events meanwhile, and only a read by index that
	 * finds nothing more returns it to the stream.  last_published_at is
	 * when Kafka acknowledged the version ($9), not when it was settled.
	 */
	sql = psprintf(
				   "WITH u AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), "
				   "pg_catalog.unnest($4), pg_catalog.unnest($5), pg_catalog.unnest($9)) AS u(id, v, x, r, t)), "
				   "ins AS (INSERT INTO %s.aggregate_publication "
				   "(aggregate_id, last_published_version, last_published_at, updated_at) "
				   "SELECT u.id, u.v, u.t, $1 FROM u WHERE NOT u.r "
				   "ON CONFLICT (aggregate_id) DO NOTHING RETURNING aggregate_id), "
				   "upd AS (UPDATE %s.aggregate_publication a SET "
				   "last_published_version = GREATEST(a.last_published_version, u.v), "
				   "last_published_at = CASE WHEN u.v OPERATOR(pg_catalog.>) coalesce(a.last_published_version, 0) "
				   "THEN u.t ELSE a.last_published_at END, attempts = 0, last_error = NULL, "
				   "catch_up = a.catch_up OR a.next_attempt_at IS NOT NULL, "
				   "next_attempt_at = NULL, updated_at = $1 "
				   "FROM u WHERE u.r AND a.aggregate_id OPERATOR(pg_catalog.=) u.id AND a.xmin OPERATOR(pg_catalog.=) u.x "
				   "AND a.aggregate_id OPERATOR(pg_catalog.=) ANY ($2) "
				   "RETURNING a.aggregate_id), "
				   "done AS (SELECT aggregate_id FROM ins UNION ALL SELECT aggregate_id FROM upd), "
				   "disposed AS (UPDATE %s.outbox o SET disposition = d.action::%s.outbox_disposition, "
				   "disposed_at = $1, "
				   "attempts = o.attempts OPERATOR(pg_catalog.+) "
				   "CASE WHEN d.action OPERATOR(pg_catalog.=) 'skipped' THEN 0 ELSE 1 END "
				   "FROM ROWS FROM (pg_catalog.unnest($6), pg_catalog.unnest($7), pg_catalog.unnest($8)) "
				   "AS d(id, action, agg) "
				   "WHERE o.id OPERATOR(pg_catalog.=) d.id AND o.id OPERATOR(pg_catalog.=) ANY ($6) "
				   "AND d.agg OPERATOR(pg_catalog.=) ANY (SELECT aggregate_id FROM done)) "
				   "SELECT aggregate_id FROM done", s, s, s, s);
	settle_plan = outbox_keep_plan_options(sql, 9, types, CURSOR_OPT_CUSTOM_PLAN);
	settle_small_plan = outbox_keep_plan_options(sql, 9, types, CURSOR_OPT_GENERIC_PLAN);
}

/* An array of a 64-bit type (bigint, timestamptz) for a plan argument. */
static Datum
int64_array(int64 *v, int n, Oid type)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, type, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
}

/* A bigint[] for a plan argument. */
Datum
publish_int8_array(int64 *v, int n)
{
	return int64_array(v, n, INT8OID);
}

/* An xid[] of row versions. */
Datum
publish_xid_array(TransactionId *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = TransactionIdGetDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, XIDOID, sizeof(TransactionId), true,
										   TYPALIGN_INT));
}

/* A boolean[] for a plan argument. */
Datum
publish_bool_array(bool *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = BoolGetDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, BOOLOID, 1, true, TYPALIGN_CHAR));
}

/* A text[] for a plan argument. */
Datum
publish_text_array(char **v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = CStringGetTextDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/*
 * Record the aggregates' progress and the dispositions of their
 * dead-lettered and skipped events; note in pm->applied the aggregates
 * recorded (the others changed meanwhile and are read again by index, or,
 * noted in pm->busy, another transaction held their row).  Returns the
 * number recorded.
 */
static uint64
apply_marks(PendingMarks *pm, TimestampTz now)
{
	Datum		args[9];
	uint64		n;
	bool		small = pm->nprogress + pm->ndisposed <= SETTLE_SMALL;
	int			rc;

	if (pm->nprogress == 0)
		return 0;
	/* Empty for each attempt: a failed one's entries say nothing. */
	if (hash_get_num_entries(pm->applied) > 0 || hash_get_num_entries(pm->busy) > 0)
	{
		pm->applied = outbox_aggregate_table("outbox settled aggregates", sizeof(char *),
											  Max(pm->nprogress, 16), marks_context);
		pm->busy = outbox_aggregate_table("outbox busy progress rows", sizeof(char *), 16,
										   marks_context);
	}
	/*
	 * The common case, nothing dead-lettered or skipped: the rows updated
	 * or inserted directly (publish_progress.c).
	 */
	if (pm->ndisposed == 0)
		return publish_progress_record(pm->progress_ids, pm->progress_versions,
									   pm->progress_xmins, pm->progress_tids, pm->progress_rows,
									   pm->progress_acked_at, pm->nprogress, now,
									   pm->applied, pm->busy, marks_context);
	args[0] = TimestampTzGetDatum(now);
	args[1] = publish_text_array(pm->progress_ids, pm->nprogress);
	args[2] = publish_int8_array(pm->progress_versions, pm->nprogress);
	args[3] = publish_xid_array(pm->progress_xmins, pm->nprogress);
	args[4] = publish_bool_array(pm->progress_rows, pm->nprogress);
	args[5] = publish_int8_array(pm->disposed_ids, pm->ndisposed);
	args[6] = publish_text_array(pm->disposed_actions, pm->ndisposed);
	args[7] = publish_text_array(pm->disposed_aggregates, pm->ndisposed);
	args[8] = int64_array(pm->progress_acked_at, pm->nprogress, TIMESTAMPTZOID);
	rc = SPI_execute_plan(small ? settle_small_plan : settle_plan, args, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not record the aggregates' progress");
	n = SPI_processed;
	for (uint64 r = 0; r < n; r++)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(marks_context);
		char	   *id = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1);

		(void) hash_search(pm->applied, &id, HASH_ENTER, NULL);
		MemoryContextSwitchTo(oldcxt);
	}
	return n;
}

/*
 * Leave the aggregates whose row another transaction held (pm->busy) for a
 * later settling, after this one committed: collected again from their
 * flight's results then, after a backoff (100 ms, doubling, up to 1 s),
 * and busy meanwhile (their acknowledged events are not read again).
 */
static bool
defer_one(Flight *f, BatchAggregate *agg, void *arg)
{
	PendingMarks *pm = arg;

	if (!agg->collected || agg->settled ||
		hash_search(pm->busy, &agg->aggregate_id, HASH_FIND, NULL) == NULL)
		return false;
	if (agg->deferrals == 0)
		ereport(LOG,
				(errmsg("outbox: recording the progress of aggregate \"%s\" waits for another transaction",
						agg->aggregate_id),
				 errdetail("Its aggregate_publication row is locked, or being inserted, by a transaction still open. Its acknowledged events are kept and recorded once that transaction ends (read again if it changed the row); the other aggregates are settled meanwhile, unless a settling also has events to dead-letter or skip, or a failure to record on that row: those wait."),
				 errhint("Look in pg_stat_activity for a long-open transaction on aggregate_publication, such as one that called an outbox operator function.")));
	agg->collected = false;
	agg->complete = false;
	pm->nsettled[EV_PUBLISH] -= agg->nmarked;
	agg->retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												Min(100 << Min(agg->deferrals, 4), 1000));
	agg->deferrals++;
	return false;
}

/* See defer_one. */
static void
defer_busy(PendingMarks *pm)
{
	if (hash_get_num_entries(pm->busy) > 0)
		(void) publish_walk_aggregates(true, defer_one, pm);
}

/* Count what a committed marking settled. */
static void
count_settled(PendingMarks *pm, TimestampTz now)
{
	outbox_count(OC_EVENTS_PUBLISHED, pm->nsettled[EV_PUBLISH]);
	outbox_count(OC_EVENTS_DEAD_LETTERED, pm->nsettled[EV_DEAD_LETTER]);
	outbox_count(OC_EVENTS_SKIPPED, pm->nsettled[EV_SKIP]);
	outbox_count(OC_SETTLES, 1);
	publish_slot->last_batch_at = now;
}

/*
 * Retry recording what Kafka acknowledged after a settling failed, without
 * producing anything.  Returns the number of aggregates settled.
 */
int
publish_retry_marks(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			n = publish_pending_marks->nprogress;
	uint64		applied = 0;
	Oid			ext;
	bool		same;

	publish_set_state("marking published (retry)");
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	/* A dropped (or dropped and recreated) extension took the events with it. */
	ext = publish_lookup_extension();
	same = OidIsValid(ext) && ext == publish_pending_marks->extension;
	if (same)
	{
		applied = apply_marks(publish_pending_marks, now);
		publish_stream_store_horizon();
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();

	if (same)
	{
		int			nbusy = (int) hash_get_num_entries(publish_pending_marks->busy);
		int			nchanged = n - (int) applied - nbusy;

		defer_busy(publish_pending_marks);
		count_settled(publish_pending_marks, now);
		ereport(LOG,
				(errmsg("outbox: recorded the progress of " UINT64_FORMAT " of %d held aggregates after settling had failed", applied, n),
				 nchanged > 0
				 ? errdetail("%d aggregates changed meanwhile (an operator replayed, retried or settled events) are read again.",
							 nchanged) : 0));
	}
	else
	{
		ereport(LOG,
				(errmsg("outbox: dropped the progress of %d aggregates awaiting settling: the extension was dropped", n)));
		publish_stream_reset();
		n = 0;
	}
	release_collected();
	MemoryContextReset(marks_context);
	publish_pending_marks = NULL;
	return n;
}


/*
 * Empty marks for up to nevents events of naggregates of the extension
 * (InvalidOid: none), in marks_context.
 */
static PendingMarks *
new_marks(int nevents, int naggregates, Oid extension)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(marks_context);
	PendingMarks *pm = palloc0(sizeof(PendingMarks));

	pm->extension = extension;
	pm->progress_ids = palloc(sizeof(char *) * (naggregates + 1));
	pm->progress_versions = palloc(sizeof(int64) * (naggregates + 1));
	pm->progress_xmins = palloc(sizeof(TransactionId) * (naggregates + 1));
	pm->progress_tids = palloc(sizeof(ItemPointerData) * (naggregates + 1));
	pm->progress_rows = palloc(sizeof(bool) * (naggregates + 1));
	pm->progress_acked_at = palloc(sizeof(TimestampTz) * (naggregates + 1));
	pm->disposed_ids = palloc(sizeof(int64) * (nevents + 1));
	pm->disposed_actions = palloc(sizeof(char *) * (nevents + 1));
	pm->disposed_aggregates = palloc(sizeof(char *) * (nevents + 1));
	pm->applied = outbox_aggregate_table("outbox settled aggregates", sizeof(char *),
										  Max(naggregates, 16), marks_context);
	pm->busy = outbox_aggregate_table("outbox busy progress rows", sizeof(char *), 16,
									   marks_context);
	MemoryContextSwitchTo(oldcxt);
	return pm;
}

/* Add one acknowledged (dead-lettered, skipped) event of agg to the marks. */
static void
add_mark(PendingMarks *pm, BatchAggregate *agg, BatchEvent *ev, DeliveryResult *r)
{
	if (ev->action != EV_PUBLISH)
	{
		pm->disposed_ids[pm->ndisposed] = ev->id;
		pm->disposed_actions[pm->ndisposed] = (char *) action_disposition[ev->action];
		pm->disposed_aggregates[pm->ndisposed] = agg->aggregate_id;
		pm->ndisposed++;
	}
	pm->nsettled[ev->action]++;
	agg->nmarked++;
	/* (Once: an aggregate left for later is collected again.) */
	if (ev->action == EV_PUBLISH && agg->deferrals == 0)
		outbox_observe_latency(r->acked_at - ev->created_at);
}

/*
 * Acknowledgements without an offset: librdkafka implies them for the
 * messages of a failed request when a later request of the partition
 * succeeds (a broker checking idempotent sequence numbers accepts it only
 * then).  Rare, and the only record of them now that nothing is written
 * per event: the fault tests' verdict reads these lines.
 */
static void
log_implicit_acks(const char *aggregate_id, int64 from, int64 to)
{
	ereport(LOG,
			(errmsg("outbox: acknowledged without an offset: aggregate \"%s\" versions " INT64_FORMAT ".." INT64_FORMAT,
					aggregate_id, from, to)));
}

/*
 * After an aggregate's first failed event: warn if anything later was
 * acknowledged (it overtook the failure), and classify the failure,
 * counted unless count is false (classified before).  Returns true if it
 * is to be recorded (permanent, or a size refusal to retry alone).
 */
static bool
classify_failure(Flight *f, BatchEvent *failed, const char *aggregate_id, bool count)
{
	BatchEvent *events = f->events;
	DeliveryResult *results = f->results;
	DeliveryResult *r = &results[failed - events];
	bool		record = false;

	for (int j = failed->next; j >= 0; j = events[j].next)
		if (count && results[j].done && results[j].err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			outbox_count(OC_ORDER_VIOLATIONS, 1);
			ereport(WARNING,
					(errmsg("outbox: version " INT64_FORMAT " of aggregate \"%s\" was acknowledged although version " INT64_FORMAT " failed",
							events[j].version, aggregate_id, failed->version),
					 errhint("The broker accepted an out-of-sequence batch; with a real cluster and enable.idempotence this cannot happen.")));
			break;
		}

	if (publish_is_size_error(r->err) && failed->produced &&
		publish_shared_request(f, failed - events))
	{
		/* Maybe refused for others in its request: retried alone. */
		outbox_count(OC_DELIVERY_ERRORS_RETRIABLE, count ? 1 : 0);
		failed->retry_alone = true;
		record = true;
	}
	else if (outbox_kafka_error_is_permanent(r->err))
	{
		outbox_count(OC_DELIVERY_ERRORS_PERMANENT, count ? 1 : 0);
		record = true;
	}
	else
		outbox_count(OC_DELIVERY_ERRORS_RETRIABLE, count ? 1 : 0);
	if (count && (failed->next >= 0 || r->err != RD_KAFKA_RESP_ERR_NO_ERROR))
		outbox_count(OC_ORDER_GUARD_STOPS, 1);
	return record;
}

/*
 * An aggregate whose messages are all reported: its acknowledged prefix
 * goes into the marks, with its progress.  Returns its first failed event
 * to record, or NULL.
 */
static BatchEvent *
collect_aggregate(PendingMarks *pm, Flight *f, BatchAggregate *agg)
{
	BatchEvent *events = f->events;
	int64		last_acked = 0;
	TimestampTz acked_at = 0;
	int64		implicit_from = 0;
	int64		implicit_to = 0;
	BatchEvent *failed = NULL;

	agg->complete = true;
	agg->nmarked = 0;
	for (int i = agg->head; i >= 0; i = events[i].next)
	{
		DeliveryResult *r = &f->results[i];

		if (!events[i].produced && !r->done)
		{
			agg->complete = false;	/* never sent: the aggregate stopped earlier */
			break;
		}
		if (r->err != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			agg->complete = false;
			failed = &events[i];
			break;
		}
		add_mark(pm, agg, &events[i], r);
		if (r->offset < 0 && events[i].action != EV_SKIP)
		{
			if (implicit_from == 0)
				implicit_from = events[i].version;
			implicit_to = events[i].version;
		}
		last_acked = events[i].version;
		/* (A skipped event, never sent, has no acknowledgement: now.) */
		acked_at = r->acked_at != 0 ? r->acked_at : GetCurrentTimestamp();
	}
	if (implicit_from > 0 && agg->deferrals == 0)
		log_implicit_acks(agg->aggregate_id, implicit_from, implicit_to);
	if (last_acked > 0)
	{
		int			k = pm->nprogress++;

		pm->progress_ids[k] = MemoryContextStrdup(marks_context, agg->aggregate_id);
		pm->progress_versions[k] = last_acked;
		pm->progress_xmins[k] = agg->pub_xmin;
		pm->progress_tids[k] = agg->pub_tid;
		pm->progress_rows[k] = agg->pub_row;
		pm->progress_acked_at[k] = acked_at;
	}
	agg->collected = true;
	if (failed != NULL && classify_failure(f, failed, agg->aggregate_id, agg->deferrals == 0))
		return failed;
	return NULL;
}

/* What a settling collects: the marks, and the failures to record. */
typedef struct CollectState
{
	PendingMarks *pm;
	BatchEvent **failures;
	Flight	  **failure_flights;
	int			nfailures;
} CollectState;

/* Collect an aggregate whose messages are all reported (not yet collected). */
static bool
collect_ready(Flight *f, BatchAggregate *agg, void *arg)
{
	CollectState *cs = arg;
	BatchEvent *failed;

	if (!publish_aggregate_ready(agg))
		return false;
	failed = collect_aggregate(cs->pm, f, agg);
	if (failed != NULL)
	{
		cs->failure_flights[cs->nfailures] = f;
		cs->failures[cs->nfailures++] = failed;
	}
	return false;
}

/*
 * Record the failures collected, in the settling transaction; not those
 * of aggregates left for later (busy), which would wait for the row.
 */
static void
record_failures(BatchEvent **failures, Flight **failure_flights, int n, HTAB *busy)
{
	for (int k = 0; k < n; k++)
	{
		Flight	   *f = failure_flights[k];
		DeliveryResult *r = &f->results[failures[k] - f->events];
		char	   *msg;

		if (hash_search(busy, &failures[k]->aggregate_id, HASH_FIND, NULL) != NULL)
			continue;
		msg = psprintf("%s: %s", rd_kafka_err2name(r->err), rd_kafka_err2str(r->err));

		if (failures[k]->retry_alone)
			publish_note_size_error(failures[k], msg);
		else
		{
			BatchAggregate *agg = hash_search(f->aggregates, &failures[k]->aggregate_id,
											  HASH_FIND, NULL);

			publish_record_failure(failures[k], msg);
			/* The database lists it now: read by index after its backoff. */
			if (agg != NULL)
				agg->listed = true;
		}
	}
}

/* Was the aggregate's progress recorded by the settling that committed? */
static bool
progress_recorded(BatchAggregate *agg)
{
	PendingMarks *pm = publish_pending_marks;

	return pm != NULL &&
		hash_search(pm->applied, &agg->aggregate_id, HASH_FIND, NULL) != NULL;
}

/* Release one collected aggregate (see release_collected). */
static bool
release_one(Flight *f, BatchAggregate *agg, void *arg)
{
	if (agg->collected && !agg->settled)
	{
		bool		covered = agg->listed ||
			(agg->complete && !agg->maybe_more && progress_recorded(agg));

		publish_stream_settled(agg->aggregate_id, agg->owed, covered);
		publish_aggregate_settled(f, agg);
	}
	return false;
}

/*
 * Release the aggregates collected (their settling committed or was
 * dropped) and tell the stream what became of them: covered (progress
 * recorded for all it read, or listed by the database after a failure)
 * or to be read again by index.
 */
static void
release_collected(void)
{
	(void) publish_walk_aggregates(true, release_one, NULL);
	publish_free_settled_flights();
}

/* A failure recorded in an aborted settling was not recorded. */
static bool
forget_listing(Flight *f, BatchAggregate *agg, void *arg)
{
	if (agg->collected && !agg->settled)
		agg->listed = false;
	return false;
}

/*
 * After an error in the loop: the failures recorded in the aborted settling
 * are not; a settling that failed with progress keeps its aggregates
 * collected (busy) until publish_retry_marks() records it; one without
 * only had failures to record: its aggregates are read again by index.
 */
void
publish_settle_abort(void)
{
	(void) publish_walk_aggregates(true, forget_listing, NULL);
	if (publish_pending_marks == NULL)
		release_collected();
}

/*
 * Is a settling due?  When an aggregate is ready and either nothing else is
 * out, or its flight is wholly reported while a backlog is read, or it has
 * waited the settle delay.  If one will be due, *wait_ms (if given) says
 * when.
 */
bool
publish_settle_due(long *wait_ms)
{
	TimestampTz now;
	int			outstanding;
	long		delay;
	long		waited;

	if (!publish_any_ready())
	{
		ready_since = 0;
		return false;
	}
	now = GetCurrentTimestamp();
	if (ready_since == 0)
		ready_since = now;
	outstanding = publish_outstanding();
	/*
	 * While a backlog is read, the next read waits for room in flight: a
	 * flight wholly reported waits for no later one's reports.
	 */
	if (outstanding == 0 || (!publish_stream_manifest_done() && publish_flight_reported()))
		return true;
	delay = Min(Max(SETTLE_DELAY_MS, publish_reported_ms()) + outstanding / 100,
				SETTLE_DELAY_MAX_MS);
	waited = TimestampDifferenceMilliseconds(ready_since, now);
	if (waited >= delay)
		return true;
	if (wait_ms != NULL)
		*wait_ms = delay - waited;
	return false;
}

/*
 * Settle, in one short transaction, every aggregate whose messages are all
 * reported: mark its acknowledged prefix and record its first failure.
 * The others (messages still out) wait; a partition that does not
 * acknowledge holds up only its own aggregates.  From building the marks
 * until the commit, a failure keeps them for publish_retry_marks().
 * Returns the number of aggregates settled (their row held: not) and
 * failures recorded.
 */
int
publish_settle_ready(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			nevents = 0;
	int			naggregates = 0;
	PendingMarks *pm;
	int			nprogress = 0;
	int			nsettled;
	bool		applied;
	CollectState cs;

	if (!publish_settle_due(NULL))
		return 0;
	ready_since = 0;
	for (Flight *f = publish_flights; f != NULL; f = f->next)
	{
		nevents += f->nevents;
		naggregates += f->unsettled;
	}

	publish_set_state("marking published");
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());

	pm = new_marks(nevents, naggregates, publish_lookup_extension());
	cs.pm = pm;
	cs.failures = palloc(sizeof(BatchEvent *) * (naggregates + 1));
	cs.failure_flights = palloc(sizeof(Flight *) * (naggregates + 1));
	cs.nfailures = 0;
	(void) publish_walk_aggregates(false, collect_ready, &cs);

	if (pm->nprogress > 0)
		publish_pending_marks = pm;
	/* A dropped extension took the events with it: nothing to record. */
	applied = OidIsValid(pm->extension);
	if (applied)
	{
		nprogress = (int) apply_marks(pm, now);
		record_failures(cs.failures, cs.failure_flights, cs.nfailures, pm->busy);
		publish_stream_store_horizon();
	}

	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	elog(DEBUG1, "outbox: settled %d aggregates and %d failures in %ld ms", nprogress, cs.nfailures,
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), GetCurrentTimestamp()));

	/* (pm is in marks_context, reset below.) */
	nsettled = pm->nprogress - (int) hash_get_num_entries(pm->busy) + cs.nfailures;
	if (applied)
	{
		defer_busy(pm);
		count_settled(pm, now);
	}
	else
		publish_stream_reset();
	publish_pending_marks = pm;
	release_collected();
	MemoryContextReset(marks_context);
	publish_pending_marks = NULL;
	return nsettled;
}
