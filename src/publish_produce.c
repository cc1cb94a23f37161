/*-------------------------------------------------------------------------
 *
 * publish_produce.c
 *	  Producing and tracking what is in flight: the Kafka producer, a
 *	  record's headers, producing each locked aggregate's events in version
 *	  order to one destination, and the flights (batches produced whose
 *	  aggregates are not settled yet) that delivery reports fill in.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include "common/hashfn.h"
#include "miscadmin.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "emit.h"
#include "shmem.h"
#include "util.h"
#include "publish.h"
#include "record_headers.h"

/*
 * How long reading the next batch waits for the newest flight's reports:
 * the aggregates of a flight still out are diverted from the next read (to
 * be read by index later), so the healthy case waits the few milliseconds
 * acknowledgements take, and a partition that does not acknowledge holds
 * up reading only this long: 10 ms, or as long as flights have recently
 * taken to be wholly reported if that is longer (a replicated cluster on a
 * busy machine: reading then follows its pace rather than sending a small
 * batch every 10 ms, which on a real 3-broker cluster cost a third more
 * CPU per event at 2,000 events/s), and 1 ms more per 100 events of the
 * flight (a large one takes longer to acknowledge), up to 200 ms.  The
 * next read of a backlog, which starts with another aggregate, does not
 * wait (worker.c's pipeline_step).
 */
#define HOLD_READING_MS 10
#define HOLD_READING_MAX_MS 200


int			outbox_delivery_timeout_ms = 10000;
int			outbox_batch_aggregates = 10000;

rd_kafka_t *publish_producer = NULL;
static DeliveryTracker tracker;
static uint32 producer_fingerprint = 0;

/* Flights, newest first, each in its own context under flights_context. */
Flight	   *publish_flights = NULL;
static MemoryContext flights_context = NULL;
static uint32 next_generation = 1;

/*
 * Busy aggregates: locked by a flight and not settled yet, so not read
 * again.  Keys point into the flights' events, which outlive the entries.
 */
static HTAB *busy_aggregates = NULL;

/*
 * Busy aggregates per publish bucket; a bucket with any is shown busy in
 * the slot (busy_buckets), for the workers that take it over.
 */
static int32 bucket_busy[OUTBOX_PUBLISH_BUCKETS];

/*
 * The producer's main queue writes a byte to this pipe when it gets an
 * event (a delivery report), so that waiting on the latch also wakes for
 * reports: [0] is read, [1] written by librdkafka.
 */
static int	reports_pipe[2] = {-1, -1};

/* Define this module's settings (from _PG_init). */
void
publish_produce_init(void)
{
	DefineCustomIntVariable("outbox.batch_aggregates",
							"Most aggregates one publisher batch takes.",
							NULL,
							&outbox_batch_aggregates,
							10000, 1, 100000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.delivery_timeout",
							"How long messages may await Kafka's acknowledgement before their aggregates count as stalled.",
							"Stalled aggregates are shown in outbox_workers() and counted in delivery_timeouts; "
							"their messages stay with librdkafka, which never gives up on one, and a late "
							"acknowledgement is still recorded.  Also bounds waiting for room in a full producer queue.",
							&outbox_delivery_timeout_ms,
							10000, 100, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* The flight of a generation, or NULL. */
static Flight *
find_flight(uint32 generation)
{
	for (Flight *f = publish_flights; f != NULL; f = f->next)
		if (f->generation == generation)
			return f;
	return NULL;
}

/* Delivery report callback: the result slot of a tracked message. */
static DeliveryResult *
result_slot(uint32 generation, int index)
{
	Flight	   *f = find_flight(generation);

	if (f == NULL || index < 0 || index >= f->nevents || !f->events[index].produced)
		return NULL;
	return &f->results[index];
}

/*
 * A moving average of how long a flight took to be wholly reported (ms,
 * each sample at most HOLD_READING_MAX_MS): the hold follows it.
 */
static double reported_ms_avg = 0;

/*
 * How long the last timed flight took to be wholly reported, 0 if that is not
 * known (its last reports were served after a wait that did not watch for
 * them, the quiet window's) or it was a backlog's (half of
 * outbox.batch_events or more: large flights take longer): the next
 * flight's reports are then served as they come.  See
 * publish_reports_quiet_ms.
 */
static double reported_ms_last = 0;

/* Has the producer had a message acknowledged yet (it is connected)? */
static bool producer_reported = false;

/* The reports being served waited unwatched (publish_serve_reports). */
static bool serving_unwatched = false;

/* The quiet window of a flight (see publish_reports_quiet_ms), ms. */
static double
quiet_window_ms(void)
{
	return Min(reported_ms_avg, reported_ms_last) * 3 / 4;
}

/* Delivery report callback: one message less in flight. */
static void
delivered(uint32 generation, int index)
{
	Flight	   *f = find_flight(generation);
	BatchAggregate *agg;

	if (f->results[index].err != RD_KAFKA_RESP_ERR_NO_ERROR)
		f->report_failed = true;
	else
		producer_reported = true;
	f->outstanding--;
	/*
	 * A failure (a timeout, a leaderless partition) says nothing of the
	 * cluster's pace, nor does a first flight's connecting.
	 */
	if (f->outstanding == 0 && !f->report_failed && !f->untimed)
	{
		double		ms = Min((double) (GetCurrentTimestamp() - f->produced_at) / 1000.0,
							 HOLD_READING_MAX_MS);

		reported_ms_last = serving_unwatched || f->nevents >= outbox_batch_events / 2 ? 0 : ms;
		reported_ms_avg = reported_ms_avg == 0 ? ms : 0.8 * reported_ms_avg + 0.2 * ms;
	}
	/* (Its entry, kept at produce time: no look-up per report.) */
	agg = f->events[index].agg;
	if (agg != NULL)
		agg->unreported--;
}

/* Set up this module's memory and the tracker (in the worker, once). */
void
publish_produce_start(void)
{
	flights_context = AllocSetContextCreate(TopMemoryContext, "outbox flights",
											ALLOCSET_DEFAULT_SIZES);
	busy_aggregates = outbox_aggregate_table("outbox busy aggregates", sizeof(char *), 1024,
											  flights_context);
	tracker.result_slot = result_slot;
	tracker.delivered = delivered;
}

/* Wake the latch wait on delivery reports (see reports_pipe). */
static void
enable_report_events(void)
{
	rd_kafka_queue_t *q;

	if (reports_pipe[0] < 0)
	{
		if (pipe(reports_pipe) != 0)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("could not create a pipe for delivery report events: %m")));
		for (int i = 0; i < 2; i++)
			(void) fcntl(reports_pipe[i], F_SETFL, O_NONBLOCK);
	}
	q = rd_kafka_queue_get_main(publish_producer);
	rd_kafka_queue_io_event_enable(q, reports_pipe[1], "r", 1);
	rd_kafka_queue_destroy(q);
}

/* Create the producer if there is none. */
void
publish_ensure_producer(void)
{
	if (publish_producer != NULL)
		return;
	producer_fingerprint = outbox_kafka_config_fingerprint();
	publish_producer = outbox_producer_create(&tracker);
	outbox_count(OC_PRODUCER_CREATIONS, 1);
	enable_report_events();
}

/*
 * Destroy the producer.  Its messages go with it: those not reported by
 * then are settled as failed (retriable), so their aggregates are read and
 * sent again by the next producer, while what was acknowledged is marked.
 */
void
publish_drop_producer(void)
{
	outbox_producer_destroy(publish_producer);
	publish_producer = NULL;
	producer_reported = false;
	for (Flight *f = publish_flights; f != NULL; f = f->next)
	{
		HASH_SEQ_STATUS seq;
		BatchAggregate *agg;

		for (int i = 0; i < f->nevents; i++)
			if (f->events[i].produced && !f->results[i].done)
			{
				f->results[i].done = true;
				f->results[i].err = RD_KAFKA_RESP_ERR__PURGE_QUEUE;
			}
		f->outstanding = 0;
		hash_seq_init(&seq, f->aggregates);
		while ((agg = hash_seq_search(&seq)) != NULL)
			agg->unreported = 0;
	}
}

/* Since when the producer is built from outdated settings (0: it is not). */
static TimestampTz producer_outdated_since = 0;

/*
 * After a reload: a producer built from old Kafka settings (brokers,
 * properties, or the credentials file's content) is replaced.  Destroying
 * it would purge the messages in flight and send them all again, so it is
 * replaced once they are reported (meanwhile nothing new is read), or after
 * outbox.delivery_timeout if they never are (say the old brokers are gone).
 */
void
publish_check_producer_settings(void)
{
	if (publish_producer == NULL)
	{
		producer_outdated_since = 0;
		return;
	}
	if (producer_outdated_since == 0)
	{
		if (outbox_kafka_config_fingerprint() == producer_fingerprint)
			return;
		ereport(LOG,
				(errmsg("outbox: Kafka settings changed, recreating the producer"),
				 publish_flights != NULL ?
				 errdetail("Once the messages in flight are reported.") : 0));
		producer_outdated_since = GetCurrentTimestamp();
	}
	if (!publish_producer_replace_due())
		return;
	producer_outdated_since = 0;
	publish_drop_producer();
}

/* Is the producer to be replaced once its messages are reported? */
bool
publish_producer_outdated(void)
{
	return producer_outdated_since != 0;
}

/*
 * Is an outdated producer to be replaced now: its flights all settled, or
 * outbox.delivery_timeout past since its settings changed?
 */
bool
publish_producer_replace_due(void)
{
	return producer_outdated_since != 0 &&
		(publish_flights == NULL ||
		 TimestampDifferenceExceeds(producer_outdated_since, GetCurrentTimestamp(),
									outbox_delivery_timeout_ms));
}

/* After a fatal producer error: count it, log it, and start afresh. */
void
publish_check_fatal(void)
{
	if (outbox_producer_fatal_pending() || rd_kafka_fatal_error(publish_producer, NULL, 0))
	{
		char		reason[512];
		rd_kafka_resp_err_t err = rd_kafka_fatal_error(publish_producer, reason, sizeof(reason));

		outbox_count(OC_DELIVERY_ERRORS_FATAL, 1);
		ereport(LOG,
				(errmsg("outbox: fatal Kafka producer error, recreating the producer"),
				 errdetail("%s: %s", rd_kafka_err2name(err), reason)));
		publish_drop_producer();
	}
}

/* The Kafka timestamp of an event: its emit time, in Unix milliseconds. */
static int64
timestamptz_to_unix_ms(TimestampTz t)
{
	return t / 1000 +
		(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
}

/* A header whose name is a string literal, its length known. */
#define ADD_HEADER(hdrs, name, value, len) \
	rd_kafka_header_add((hdrs), (name), sizeof(name) - 1, (value), (len))

/*
 * The record's headers: the caller's, then the publisher's own
 * (record_headers.h; outbox_emit() refuses those names), and on a
 * dead-lettered record why, with the error cut to what outbox_emit()
 * counted when it checked the record's size.  Every length is passed:
 * librdkafka would measure each name and value again.
 */
static rd_kafka_headers_t *
build_headers(BatchEvent *ev)
{
	rd_kafka_headers_t *hdrs;
	char		version[32];
	int			version_len;
	int			n = 6;

	if (ev->headers != NULL)
		n += JB_ROOT_COUNT(ev->headers);
	if (ev->action == EV_DEAD_LETTER)
		n += 3;
	hdrs = rd_kafka_headers_new(n);
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
	version_len = outbox_lltoa(ev->version, version);
	/* "id" too: where Debezium's outbox event router puts the event id. */
	ADD_HEADER(hdrs, OUTBOX_HEADER_ID, ev->event_id, ev->event_id_len);
	ADD_HEADER(hdrs, OUTBOX_HEADER_EVENT_ID, ev->event_id, ev->event_id_len);
	ADD_HEADER(hdrs, OUTBOX_HEADER_EVENT_TYPE, ev->event_type, ev->event_type_len);
	ADD_HEADER(hdrs, OUTBOX_HEADER_AGGREGATE_TYPE, ev->aggregate_type, ev->aggregate_type_len);
	ADD_HEADER(hdrs, OUTBOX_HEADER_AGGREGATE_ID, ev->aggregate_id, ev->aggregate_id_len);
	ADD_HEADER(hdrs, OUTBOX_HEADER_AGGREGATE_VERSION, version, version_len);
	if (ev->action == EV_DEAD_LETTER)
	{
		char		attempts[16];
		const char *error = ev->last_error ? ev->last_error : "dead-lettered by an operator";

		snprintf(attempts, sizeof(attempts), "%d", ev->attempts);
		ADD_HEADER(hdrs, OUTBOX_HEADER_DEAD_LETTER_ORIGINAL_TOPIC, ev->topic, ev->topic_len);
		ADD_HEADER(hdrs, OUTBOX_HEADER_DEAD_LETTER_ERROR, error,
				   pg_mbcliplen(error, strlen(error), OUTBOX_DEAD_LETTER_ERROR_MAX_BYTES));
		ADD_HEADER(hdrs, OUTBOX_HEADER_DEAD_LETTER_ATTEMPTS, attempts, -1);
	}
	return hdrs;
}

/*
 * A new flight to read a batch into, in its own memory context: tracked
 * from the start, so that an error after producing part of it still sees
 * its reports in.
 */
Flight *
publish_flight_begin(void)
{
	MemoryContext cxt = AllocSetContextCreate(flights_context, "outbox flight",
											  ALLOCSET_DEFAULT_SIZES);
	Flight	   *f = MemoryContextAllocZero(cxt, sizeof(Flight));

	f->cxt = cxt;
	f->generation = next_generation++;
	/* Small at first (it grows): every turn walks it, a bucket at a time. */
	f->aggregates = outbox_aggregate_table("outbox flight aggregates", sizeof(BatchAggregate),
											32, cxt);
	f->produced_at = GetCurrentTimestamp();
	f->untimed = !producer_reported;
	for (Flight *o = publish_flights; o != NULL; o = o->next)
		if (o->outstanding > 0)
			f->after_others = true;
	f->next = publish_flights;
	publish_flights = f;
	return f;
}

/*
 * Done producing a flight: count the events of its busy aggregates (what
 * is in flight); the unproduced events' payloads are not needed.
 */
void
publish_flight_end(Flight *f)
{
	HASH_SEQ_STATUS seq;
	BatchAggregate *agg;

	f->produced_at = GetCurrentTimestamp();
	hash_seq_init(&seq, f->aggregates);
	while ((agg = hash_seq_search(&seq)) != NULL)
	{
		agg->nevents = 0;
		for (int i = agg->head; i >= 0; i = f->events[i].next)
			agg->nevents++;
		if (!agg->settled)
			f->live_events += agg->nevents;
	}
	for (int i = 0; i < f->nevents; i++)
		if (f->events[i].payload != NULL)
		{
			/* Not produced: the rows are read again later. */
			pfree(f->events[i].payload);
			f->events[i].payload = NULL;
		}
	publish_free_settled_flights();
}

/* Free the flights whose aggregates are all settled and messages reported. */
void
publish_free_settled_flights(void)
{
	Flight	  **link = &publish_flights;

	while (*link != NULL)
	{
		Flight	   *f = *link;

		if (f->unsettled == 0 && f->outstanding == 0)
		{
			*link = f->next;
			MemoryContextDelete(f->cxt);
		}
		else
			link = &f->next;
	}
}

/* The publish bucket of an aggregate (its lock's, and the shares'). */
static int
aggregate_bucket(const char *aggregate_id)
{
	return OUTBOX_PUBLISH_BUCKET(hash_bytes((const unsigned char *) aggregate_id,
											strlen(aggregate_id)));
}

/*
 * Count an aggregate in or out of the busy ones of its bucket; the slot
 * shows the bucket busy while any is.  Set while the bucket's lock is held
 * (take_aggregate), so a worker that locks it next sees the bit.
 */
static void
count_bucket_busy(const char *aggregate_id, int delta)
{
	int			b = aggregate_bucket(aggregate_id);
	uint32		bit = (uint32) 1 << (b % 32);

	bucket_busy[b] += delta;
	Assert(bucket_busy[b] >= 0);
	if (delta > 0 && bucket_busy[b] == delta)
		(void) pg_atomic_fetch_or_u32(&publish_slot->busy_buckets[b / 32], bit);
	else if (delta < 0 && bucket_busy[b] == 0)
		(void) pg_atomic_fetch_and_u32(&publish_slot->busy_buckets[b / 32], ~bit);
}

/*
 * Is the aggregate in a flight, not settled yet, here or (its bucket) at
 * another worker?  Then it is not read: what another worker has out is
 * settled by that worker, which owned the bucket until the shares changed.
 */
bool
publish_aggregate_busy(const char *aggregate_id)
{
	if (hash_search(busy_aggregates, &aggregate_id, HASH_FIND, NULL) != NULL)
		return true;
	return outbox_workers > 1 &&
		publish_bucket_busy_elsewhere(aggregate_bucket(aggregate_id));
}

/* An aggregate's outcome committed: it may be read again. */
void
publish_aggregate_settled(Flight *f, BatchAggregate *agg)
{
	Assert(!agg->settled);
	agg->settled = true;
	(void) hash_search(busy_aggregates, &agg->aggregate_id, HASH_REMOVE, NULL);
	count_bucket_busy(agg->aggregate_id, -1);
	f->unsettled--;
	f->live_events = Max(f->live_events - agg->nevents, 0);
}

/*
 * Events (and their bytes, pro rata) of busy aggregates: what is in flight,
 * bounded by outbox.batch_events and outbox.batch_bytes.  A flight's
 * settled events do not count, so an aggregate that does not acknowledge
 * holds back only its own.
 */
void
publish_in_flight(int *events, int64 *bytes)
{
	*events = 0;
	*bytes = 0;
	for (Flight *f = publish_flights; f != NULL; f = f->next)
	{
		*events += f->live_events;
		if (f->nevents > 0)
			*bytes += f->bytes * f->live_events / f->nevents;
	}
}

/*
 * Milliseconds until the newest flight, if it still awaits reports, is ms
 * old (plus 1 ms per 100 of its events if per_event), at most
 * HOLD_READING_MAX_MS; 0 if it is older or nothing is out.
 */
static long
newest_flight_younger_than(long ms, bool per_event)
{
	Flight	   *f = publish_flights;
	long		limit;
	long		age;

	if (f == NULL || f->outstanding == 0)
		return 0;
	limit = Min(ms + (per_event ? f->nevents / 100 : 0), HOLD_READING_MAX_MS);
	age = TimestampDifferenceMilliseconds(f->produced_at, GetCurrentTimestamp());
	return age < limit ? limit - age : 0;
}

/*
 * Milliseconds to hold reading the next batch back (see HOLD_READING_MS):
 * while the newest flight, produced moments ago, awaits reports.
 */
long
publish_hold_reading_ms(void)
{
	return newest_flight_younger_than(Max(HOLD_READING_MS, (long) reported_ms_avg), true);
}

/*
 * Milliseconds the reports of the newest flight are not worth waking for:
 * until it is three quarters as old as flights were when wholly reported
 * (the last one, or on average if less).  Its reports come per partition
 * and broker, tens of ms apart on a replicated cluster, and settling and
 * the next read wait for the last one anyway: serving each as it came cost
 * about ten sleeps and wake-ups of the worker per read.  A flight whose
 * last reports were served after the window is not timed, and the next one
 * has none, so that the window follows a cluster that became faster (or a
 * backlog's large flights followed by small ones) after one flight.  0 when
 * nothing is out.
 */
long
publish_reports_quiet_ms(void)
{
	return newest_flight_younger_than((long) quiet_window_ms(), false);
}

/* How long flights take to be wholly reported (ms, the moving average). */
long
publish_reported_ms(void)
{
	return (long) reported_ms_avg;
}

/*
 * Serve the delivery reports that arrived (and drain the wake-up pipe);
 * unwatched: the wait before did not watch for them, so they may have
 * arrived long before.
 */
void
publish_serve_reports(bool unwatched)
{
	char		buf[64];

	serving_unwatched = unwatched;
	if (reports_pipe[0] >= 0)
		while (read(reports_pipe[0], buf, sizeof(buf)) > 0)
			;
	if (publish_producer != NULL)
		rd_kafka_poll(publish_producer, 0);
	serving_unwatched = false;
}

/* The pipe to wait on for delivery reports, or -1. */
int
publish_reports_fd(void)
{
	return publish_producer != NULL ? reports_pipe[0] : -1;
}

/*
 * Flights whose messages have awaited acknowledgement longer than
 * outbox.delivery_timeout are counted once in delivery_timeouts, and their
 * unreported aggregates shown as stalled.  Returns the number newly timed
 * out.
 */
int
publish_check_timeouts(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			n = 0;

	for (Flight *f = publish_flights; f != NULL; f = f->next)
		if (!f->timed_out && f->outstanding > 0 &&
			TimestampDifferenceExceeds(f->produced_at, now, outbox_delivery_timeout_ms))
		{
			f->timed_out = true;
			outbox_count(OC_DELIVERY_TIMEOUTS, 1);
			n++;
		}
	return n;
}

/*
 * Call visit on the aggregates of every flight (of the flights with
 * unsettled ones only, if unsettled_only), until it returns true.  Returns
 * whether it did.
 */
bool
publish_walk_aggregates(bool unsettled_only, AggregateVisitor visit, void *arg)
{
	for (Flight *f = publish_flights; f != NULL; f = f->next)
	{
		HASH_SEQ_STATUS seq;
		BatchAggregate *agg;

		if (unsettled_only && f->unsettled == 0)
			continue;
		hash_seq_init(&seq, f->aggregates);
		while ((agg = hash_seq_search(&seq)) != NULL)
			if (visit(f, agg, arg))
			{
				hash_seq_term(&seq);
				return true;
			}
	}
	return false;
}

/* What count_aggregates counts, and how many so far. */
typedef struct CountState
{
	AggregateVisitor match;
	long		n;
} CountState;

/* Walker: count the aggregate if it matches. */
static bool
count_one(Flight *f, BatchAggregate *agg, void *arg)
{
	CountState *cs = arg;

	if (cs->match(f, agg, NULL))
		cs->n++;
	return false;
}

/* The aggregates (of unsettled flights only, if unsettled_only) match accepts. */
static long
count_aggregates(bool unsettled_only, AggregateVisitor match)
{
	CountState	cs = {match, 0};

	(void) publish_walk_aggregates(unsettled_only, count_one, &cs);
	return cs.n;
}

/* Has the aggregate messages out past outbox.delivery_timeout? */
static bool
is_stalled(Flight *f, BatchAggregate *agg, void *arg)
{
	return f->timed_out && agg->unreported > 0;
}

/* Aggregates with messages unacknowledged past outbox.delivery_timeout. */
long
publish_stalled_count(void)
{
	return count_aggregates(false, is_stalled);
}

/* Does the aggregate's progress wait for a row another transaction holds? */
static bool
is_deferred(Flight *f, BatchAggregate *agg, void *arg)
{
	return agg->deferrals > 0 && !agg->settled;
}

/* Aggregates whose progress waits for a row another transaction holds. */
long
publish_deferred_count(void)
{
	return count_aggregates(true, is_deferred);
}

/*
 * Is the aggregate ready to settle: all its messages reported, and not
 * left for later by a settling that found its row held?
 */
bool
publish_aggregate_ready(BatchAggregate *agg)
{
	return !agg->settled && !agg->collected && agg->unreported == 0 &&
		(agg->retry_at == 0 || agg->retry_at <= GetCurrentTimestamp());
}

/* Walker: is the aggregate ready to settle? */
static bool
is_ready(Flight *f, BatchAggregate *agg, void *arg)
{
	return publish_aggregate_ready(agg);
}

/* Is any aggregate ready to settle (all its messages reported)? */
bool
publish_any_ready(void)
{
	return publish_walk_aggregates(true, is_ready, NULL);
}

/*
 * Is a flight wholly reported, with an aggregate ready to settle?  Its
 * settling need not wait for later flights' reports.
 */
bool
publish_flight_reported(void)
{
	for (Flight *f = publish_flights; f != NULL; f = f->next)
	{
		HASH_SEQ_STATUS seq;
		BatchAggregate *agg;

		if (f->outstanding > 0 || f->unsettled == 0)
			continue;
		hash_seq_init(&seq, f->aggregates);
		while ((agg = hash_seq_search(&seq)) != NULL)
			if (publish_aggregate_ready(agg))
			{
				hash_seq_term(&seq);
				return true;
			}
	}
	return false;
}

/*
 * Hand one event to librdkafka.  Returns the error if it could not be
 * enqueued (then nothing later of its aggregate may be sent in this batch).
 */
static rd_kafka_resp_err_t
produce_event(Flight *f, BatchAggregate *agg, int index, TimestampTz deadline)
{
	BatchEvent *ev = &f->events[index];

	for (;;)
	{
		rd_kafka_headers_t *hdrs = build_headers(ev);
		rd_kafka_resp_err_t err;

		err = rd_kafka_producev(publish_producer,
								RD_KAFKA_V_TOPIC(publish_event_destination(ev)),
								RD_KAFKA_V_KEY(ev->aggregate_id, ev->aggregate_id_len),
								RD_KAFKA_V_VALUE(ev->payload, ev->payload_len),
								RD_KAFKA_V_TIMESTAMP(timestamptz_to_unix_ms(ev->created_at)),
								RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								RD_KAFKA_V_HEADERS(hdrs),
								RD_KAFKA_V_OPAQUE(outbox_delivery_opaque(f->generation, index)),
								RD_KAFKA_V_END);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			ev->produced = true;
			f->outstanding++;
			agg->unreported++;
			/* librdkafka has its own copy: keep one, not two. */
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
		rd_kafka_poll(publish_producer, 10);
		CHECK_FOR_INTERRUPTS();
		publish_stop_bound(true);	/* this flight is out */
	}
}

/* Wait for a flight's reports, up to the deadline. */
static bool
await_flight(Flight *f, TimestampTz deadline)
{
	while (f->outstanding > 0)
	{
		long		remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
																deadline);

		if (remaining <= 0)
			return false;
		/* rd_kafka_poll returns as soon as a report arrives. */
		rd_kafka_poll(publish_producer, (int) Min(remaining, 100));
		CHECK_FOR_INTERRUPTS();
		publish_stop_bound(true);	/* this flight is out */
	}
	return true;
}

/* Messages out, of all flights. */
int
publish_outstanding(void)
{
	int			n = 0;

	for (Flight *f = publish_flights; f != NULL; f = f->next)
		n += f->outstanding;
	return n;
}

/* Do other flights than f have messages out? */
static bool
others_in_flight(Flight *f)
{
	for (Flight *o = publish_flights; o != NULL; o = o->next)
		if (o != f && o->outstanding > 0)
			return true;
	return false;
}

/*
 * Could the broker have judged this event's size together with others?  It
 * checks max.message.bytes per record batch, one per partition: shared if
 * another event of this flight went to the same topic and partition (or to
 * the same topic, unreported), or other flights had messages out meanwhile.
 */
bool
publish_shared_request(Flight *f, int index)
{
	BatchEvent *events = f->events;
	DeliveryResult *r = &f->results[index];

	if (events[index].solo)
		return false;
	if (f->after_others)
		return true;
	for (int j = 0; j < f->nevents; j++)
	{
		DeliveryResult *o = &f->results[j];

		if (j != index && events[j].produced &&
			(!o->done || o->partition == r->partition) &&
			strcmp(publish_event_destination(&events[j]),
				   publish_event_destination(&events[index])) == 0)
			return true;
	}
	return false;
}

/*
 * Produce an event refused for size before with nothing else in flight, so
 * that the broker judges it alone: first wait for what this flight
 * produced, then for its own report.  Returns false, producing nothing,
 * while other flights have messages out (they could share its request).
 */
static bool
produce_alone(Flight *f, BatchAggregate *agg, int index, TimestampTz deadline)
{
	rd_kafka_resp_err_t err;

	if (others_in_flight(f) || !await_flight(f, deadline))
		return false;
	err = produce_event(f, agg, index, deadline);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		f->results[index].done = true;
		f->results[index].err = err;
		return true;
	}
	f->events[index].solo = await_flight(f, deadline);
	return true;
}

/*
 * Decide what an event out of attempts becomes under its poison policy.
 * Returns false if the policy is block (recorded; the aggregate stops).
 */
static bool
apply_poison_policy(BatchEvent *ev, BatchAggregate *agg)
{
	PoisonPolicy policy = publish_poison_policy(ev);

	if (policy == POISON_BLOCK)
	{
		/* The policy became block since the last attempt. */
		agg->state = AGG_STOPPED;
		PushActiveSnapshot(GetTransactionSnapshot());
		publish_record_failure(ev, ev->last_error ? ev->last_error : "out of attempts");
		PopActiveSnapshot();
		return false;
	}
	ev->action = policy == POISON_SKIP ? EV_SKIP : EV_DEAD_LETTER;
	return true;
}

/*
 * Produce one event of an active aggregate, or settle it without sending
 * (skip), or stop or defer the aggregate.  Idempotence orders messages only
 * within a partition, so a flight sends an aggregate's events to one
 * destination (topic, and with the key, partition): the first event bound
 * elsewhere and the rest wait for a later batch, which can read them only
 * once these are settled (busy aggregates are not read).  Returns 1 if a
 * failure was recorded, else 0.
 */
static int
produce_in_order(Flight *f, int i, BatchAggregate *agg, TimestampTz deadline)
{
	BatchEvent *ev = &f->events[i];
	rd_kafka_resp_err_t err;

	/* An event out of attempts gets its aggregate's poison policy. */
	if (ev->dead_letter_requested)
		ev->action = EV_DEAD_LETTER;
	else if (ev->attempts >= outbox_max_attempts && !apply_poison_policy(ev, agg))
		return 1;
	if (ev->action == EV_SKIP)
	{
		DeliveryResult *r = &f->results[i];

		/* Settled without sending, in its place in the aggregate. */
		r->done = true;
		r->err = RD_KAFKA_RESP_ERR_NO_ERROR;
		r->partition = -1;
		r->offset = -1;
		return 0;
	}
	if (agg->destination != NULL &&
		strcmp(agg->destination, publish_event_destination(ev)) != 0)
	{
		agg->state = AGG_DEFERRED;
		return 0;
	}

	if (ev->attempts > 0 || publish_last_error_is_size(ev))
		outbox_count(OC_RETRIES, 1);
	if (publish_last_error_is_size(ev))
	{
		/* Alone, as its aggregate's only event of the batch. */
		agg->state = AGG_DEFERRED;
		if (agg->destination == NULL && produce_alone(f, agg, i, deadline))
			agg->destination = publish_event_destination(ev);
		return 0;
	}
	err = produce_event(f, agg, i, deadline);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		/* Later versions must not overtake this one. */
		agg->state = AGG_STOPPED;
		f->results[i].done = true;
		f->results[i].err = err;
	}
	agg->destination = publish_event_destination(ev);
	return 0;
}

/*
 * Try-lock a new aggregate of the flight: one another worker holds is
 * skipped (that worker publishes it), and so is one over
 * outbox.batch_aggregates.  A locked one is busy until settled.
 */
static void
take_aggregate(Flight *f, BatchAggregate *agg, int *naggregates)
{
	LOCKTAG		tag;

	agg->state = AGG_SKIPPED;
	agg->settled = true;		/* nothing of it to settle */
	if (*naggregates >= outbox_batch_aggregates)
	{
		/* Read by index in a later batch. */
		publish_stream_divert(agg->aggregate_id, agg->owed);
		return;
	}
	outbox_publish_locktag(&tag, agg->aggregate_id);
	if (LockAcquire(&tag, ExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
	{
		outbox_count(OC_AGGREGATES_LOCK_SKIPPED, 1);
		publish_stream_divert(agg->aggregate_id, agg->owed);
		return;
	}
	/* Its bucket's former owner still settles it: later, by index. */
	if (outbox_workers > 1 &&
		publish_bucket_busy_elsewhere(aggregate_bucket(agg->aggregate_id)))
	{
		LockRelease(&tag, ExclusiveLock, false);
		outbox_count(OC_AGGREGATES_LOCK_SKIPPED, 1);
		publish_stream_divert(agg->aggregate_id, agg->owed);
		return;
	}
	agg->state = AGG_ACTIVE;
	agg->settled = false;
	(void) hash_search(busy_aggregates, &agg->aggregate_id, HASH_ENTER, NULL);
	count_bucket_busy(agg->aggregate_id, 1);
	f->unsettled++;
	(*naggregates)++;
}

/*
 * Lock the flight's aggregates and produce their events in order, without
 * waiting for acknowledgements.  Returns the number of failures recorded
 * while producing.
 */
int
publish_produce_flight(Flight *f, TimestampTz deadline)
{
	int			nfailed = 0;
	int			naggregates = 0;

	for (int i = 0; i < f->nevents; i++)
	{
		BatchEvent *ev = &f->events[i];
		BatchAggregate *agg;
		bool		found;

		/* An aggregate's events are mostly read one after another. */
		if (i > 0 && f->events[i - 1].aggregate_id_len == ev->aggregate_id_len &&
			strcmp(f->events[i - 1].aggregate_id, ev->aggregate_id) == 0)
		{
			agg = f->events[i - 1].agg;
			found = true;
		}
		else
			agg = hash_search(f->aggregates, &ev->aggregate_id, HASH_ENTER, &found);
		if (!found)
		{
			agg->head = agg->tail = i;
			agg->destination = NULL;
			agg->unreported = 0;
			agg->collected = false;
			agg->owed = ev->owed;
			agg->pub_xmin = ev->pub_xmin;
			agg->pub_tid = ev->pub_tid;
			agg->pub_row = ev->pub_row;
			agg->maybe_more = ev->maybe_more;
			agg->complete = false;
			agg->listed = false;
			agg->nmarked = 0;
			agg->deferrals = 0;
			agg->retry_at = 0;
			take_aggregate(f, agg, &naggregates);
		}
		else
		{
			f->events[agg->tail].next = i;
			agg->tail = i;
		}
		ev->agg = agg;

		if (agg->state == AGG_ACTIVE)
			nfailed += produce_in_order(f, i, agg, deadline);
	}
	elog(DEBUG1, "outbox: produced %d events of %d aggregates at %ld ms",
		 f->outstanding, naggregates,
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), GetCurrentTimestamp()));
	return nfailed;
}
