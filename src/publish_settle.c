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

#include "outbox.h"
#include "publish.h"

static const char *const action_disposition[] = {
	[EV_PUBLISH] = "published",
	[EV_DEAD_LETTER] = "dead_lettered",
	[EV_SKIP] = "skipped",
};

static SPIPlanPtr mark_plan = NULL;
static SPIPlanPtr progress_plan = NULL;

/* Held marks (see PendingMarks), in marks_context. */
static MemoryContext marks_context = NULL;

static void release_collected(void);

/*
 * Settling waits this long after an aggregate became ready while other
 * messages are still out, so that one transaction settles the reports of
 * several partitions rather than one each: 5 ms, and 1 ms more per 100
 * messages out (many take longer to acknowledge), up to 100 ms.
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
	Oid			mark_types[6] = {TIMESTAMPTZOID, INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID,
	TEXTARRAYOID, XIDARRAYOID};
	Oid			progress_types[3] = {TIMESTAMPTZOID, TEXTARRAYOID, INT8ARRAYOID};

	if (mark_plan)
	{
		SPI_freeplan(mark_plan);
		SPI_freeplan(progress_plan);
	}

	/*
	 * Rows are marked only as read (same xmin): an aggregate any of whose
	 * rows changed since (an operator's replay, retry or skip while marking
	 * was held) keeps all its rows pending, to be sent again in order.  The
	 * same xmin also means still pending (rows are read pending), so the
	 * update does not say "published_at IS NULL": that let the planner scan
	 * the pending index as the outer side of a nested loop over the marks
	 * whenever statistics said few rows were pending (test 123).
	 */
	mark_plan = outbox_keep_plan(psprintf(
									  "WITH u AS (SELECT * FROM unnest($2, $3, $4, $5, $6) AS u(id, p, off, d, x)), "
									  "changed AS (SELECT q.aggregate_id FROM u JOIN %s.outbox q ON q.id = u.id "
									  "WHERE q.xmin <> u.x OR q.published_at IS NOT NULL) "
									  "UPDATE %s.outbox o SET published_at = $1, disposition = u.d::%s.outbox_disposition, "
									  "attempts = o.attempts + CASE WHEN u.d = 'skipped' THEN 0 ELSE 1 END, "
									  "last_error = CASE WHEN u.d = 'published' THEN NULL ELSE o.last_error END, "
									  "kafka_partition = NULLIF(u.p, -1), kafka_offset = NULLIF(u.off, -1) "
									  "FROM u WHERE o.id = u.id AND o.xmin = u.x "
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
}

/* A bigint[] for a plan argument. */
static Datum
int8_array(int64 *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, INT8OID, 8, FLOAT8PASSBYVAL,
										   TYPALIGN_DOUBLE));
}

/* An integer[] for a plan argument. */
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

/* A text[] for a plan argument. */
static Datum
text_array(char **v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = CStringGetTextDatum(v[i]);
	return PointerGetDatum(construct_array(d, n, TEXTOID, -1, false, TYPALIGN_INT));
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
	publish_slot->last_batch_at = now;
}

/*
 * Retry marking what Kafka acknowledged after a marking failed, without
 * producing anything.  Returns the number of events marked.
 */
int
publish_retry_marks(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			n = publish_pending_marks->nmarks;
	uint64		marked = 0;
	bool		same;

	publish_set_state("marking published (retry)");
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	/* A dropped (or dropped and recreated) extension took the events with it. */
	same = publish_lookup_extension() &&
		get_extension_oid("outbox", true) == publish_pending_marks->extension;
	if (same)
		marked = apply_marks(publish_pending_marks, now);
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();

	if (same)
	{
		count_settled(publish_pending_marks, now);
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
	publish_pending_marks = NULL;
	release_collected();
	return n;
}


/* Empty marks for up to nevents events of naggregates, in marks_context. */
static PendingMarks *
new_marks(int nevents, int naggregates)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(marks_context);
	PendingMarks *pm = palloc0(sizeof(PendingMarks));

	pm->extension = get_extension_oid("outbox", true);
	pm->ids = palloc(sizeof(int64) * (nevents + 1));
	pm->xmins = palloc(sizeof(TransactionId) * (nevents + 1));
	pm->partitions = palloc(sizeof(int32) * (nevents + 1));
	pm->offsets = palloc(sizeof(int64) * (nevents + 1));
	pm->dispositions = palloc(sizeof(char *) * (nevents + 1));
	pm->progress_ids = palloc(sizeof(char *) * (naggregates + 1));
	pm->progress_versions = palloc(sizeof(int64) * (naggregates + 1));
	MemoryContextSwitchTo(oldcxt);
	return pm;
}

/* Add one acknowledged (or skipped) event to the marks. */
static void
add_mark(PendingMarks *pm, BatchEvent *ev, DeliveryResult *r)
{
	pm->ids[pm->nmarks] = ev->id;
	pm->xmins[pm->nmarks] = ev->xmin;
	pm->partitions[pm->nmarks] = r->partition;
	pm->offsets[pm->nmarks] = r->offset;
	pm->dispositions[pm->nmarks] = (char *) action_disposition[ev->action];
	pm->nmarks++;
	pm->nsettled[ev->action]++;
	if (ev->action == EV_PUBLISH)
		outbox_observe_latency(r->acked_at - ev->created_at);
}

/*
 * After an aggregate's first failed event: warn if anything later was
 * acknowledged (it overtook the failure), and classify the failure.
 * Returns true if it is to be recorded (permanent, or a size refusal to
 * retry alone).
 */
static bool
classify_failure(Flight *f, BatchEvent *failed, const char *aggregate_id)
{
	BatchEvent *events = f->events;
	DeliveryResult *results = f->results;
	DeliveryResult *r = &results[failed - events];
	bool		record = false;

	for (int j = failed->next; j >= 0; j = events[j].next)
		if (results[j].done && results[j].err == RD_KAFKA_RESP_ERR_NO_ERROR)
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
		outbox_count(OC_DELIVERY_ERRORS_RETRIABLE, 1);
		failed->retry_alone = true;
		record = true;
	}
	else if (outbox_kafka_error_is_permanent(r->err))
	{
		outbox_count(OC_DELIVERY_ERRORS_PERMANENT, 1);
		record = true;
	}
	else
		outbox_count(OC_DELIVERY_ERRORS_RETRIABLE, 1);
	if (failed->next >= 0 || r->err != RD_KAFKA_RESP_ERR_NO_ERROR)
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
	BatchEvent *failed = NULL;

	for (int i = agg->head; i >= 0; i = events[i].next)
	{
		DeliveryResult *r = &f->results[i];

		if (!events[i].produced && !r->done)
			break;				/* never sent: the aggregate stopped earlier */
		if (r->err != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			failed = &events[i];
			break;
		}
		add_mark(pm, &events[i], r);
		last_acked = events[i].version;
	}
	if (last_acked > 0)
	{
		pm->progress_ids[pm->nprogress] = MemoryContextStrdup(marks_context,
															  agg->aggregate_id);
		pm->progress_versions[pm->nprogress] = last_acked;
		pm->nprogress++;
	}
	agg->collected = true;
	if (failed != NULL && classify_failure(f, failed, agg->aggregate_id))
		return failed;
	return NULL;
}

/* Record the failures collected, in the settling transaction. */
static void
record_failures(BatchEvent **failures, Flight **failure_flights, int n)
{
	for (int k = 0; k < n; k++)
	{
		Flight	   *f = failure_flights[k];
		DeliveryResult *r = &f->results[failures[k] - f->events];
		char	   *msg = psprintf("%s: %s", rd_kafka_err2name(r->err),
								   rd_kafka_err2str(r->err));

		if (failures[k]->retry_alone)
			publish_note_size_error(failures[k], msg);
		else
			publish_record_failure(failures[k], msg);
	}
}

/* Release the aggregates collected (their settling committed or was dropped). */
static void
release_collected(void)
{
	for (Flight *f = publish_flights; f != NULL; f = f->next)
	{
		HASH_SEQ_STATUS seq;
		BatchAggregate *agg;

		if (f->unsettled == 0)
			continue;
		hash_seq_init(&seq, f->aggregates);
		while ((agg = hash_seq_search(&seq)) != NULL)
			if (agg->collected && !agg->settled)
				publish_aggregate_settled(f, agg);
	}
	publish_free_settled_flights();
}

/*
 * After an error in the loop: a settling that failed with marks keeps its
 * aggregates collected (busy) until publish_retry_marks() marks them; one
 * without marks only had failures to record, found again when re-sent.
 */
void
publish_settle_abort(void)
{
	if (publish_pending_marks == NULL)
		release_collected();
}

/*
 * Is a settling due?  When an aggregate is ready and either nothing else is
 * out or it has waited the settle delay.  If one will be due, *wait_ms (if
 * given) says when.
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
	if (outstanding == 0)
		return true;
	delay = Min(SETTLE_DELAY_MS + outstanding / 100, SETTLE_DELAY_MAX_MS);
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
 * Returns the number of events settled or failed.
 */
int
publish_settle_ready(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			nevents = 0;
	int			naggregates = 0;
	PendingMarks *pm;
	BatchEvent **failures;
	Flight	  **failure_flights;
	int			nfailures = 0;
	int			nmarks;
	bool		applied;

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

	pm = new_marks(nevents, naggregates);
	failures = palloc(sizeof(BatchEvent *) * (naggregates + 1));
	failure_flights = palloc(sizeof(Flight *) * (naggregates + 1));
	for (Flight *f = publish_flights; f != NULL; f = f->next)
	{
		HASH_SEQ_STATUS seq;
		BatchAggregate *agg;

		hash_seq_init(&seq, f->aggregates);
		while ((agg = hash_seq_search(&seq)) != NULL)
		{
			BatchEvent *failed;

			if (agg->settled || agg->collected || agg->unreported > 0)
				continue;
			failed = collect_aggregate(pm, f, agg);
			if (failed != NULL)
			{
				failure_flights[nfailures] = f;
				failures[nfailures++] = failed;
			}
		}
	}

	if (pm->nmarks > 0)
		publish_pending_marks = pm;
	/* A dropped extension took the events with it: nothing to mark. */
	applied = publish_lookup_extension() &&
		get_extension_oid("outbox", true) == pm->extension;
	if (applied)
	{
		apply_marks(pm, now);
		record_failures(failures, failure_flights, nfailures);
	}

	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	nmarks = pm->nmarks;
	elog(DEBUG1, "outbox: settled %d marks and %d failures in %ld ms", nmarks, nfailures,
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), GetCurrentTimestamp()));

	if (applied)
		count_settled(pm, now);
	MemoryContextReset(marks_context);
	publish_pending_marks = NULL;
	release_collected();
	return nmarks + nfailures;
}
