/*-------------------------------------------------------------------------
 *
 * publish_produce.c
 *	  Producing: the Kafka producer, a record's headers, producing each
 *	  locked aggregate's events in version order to one destination, and
 *	  tracking delivery reports, including those of abandoned batches
 *	  (their aggregates are "stalled" until the reports come in).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "emit.h"
#include "outbox.h"
#include "publish.h"
#include "record_headers.h"

int			outbox_delivery_timeout_ms = 10000;
int			outbox_batch_aggregates = 10000;

rd_kafka_t *publish_producer = NULL;
DeliveryTracker publish_tracker;
static uint32 producer_fingerprint = 0;

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
HTAB	   *publish_stalled_aggregates = NULL;
static StalledBatch *stalled_batches = NULL;

/*
 * The batch being produced, so that an error can hand its messages still in
 * flight to the stall bookkeeping (see publish_end_tracking).
 */
static BatchEvent *batch_events = NULL;
static int	batch_nevents = 0;
static bool batch_stalled = false;

/* Messages of earlier batches were in flight when this one began producing. */
static bool batch_after_stall = false;

/* Define this module's settings (from _PG_init). */
void
publish_produce_init(void)
{
	DefineCustomIntVariable("outbox.batch_aggregates",
							"Most aggregates one publisher transaction takes.",
							NULL,
							&outbox_batch_aggregates,
							10000, 1, 100000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.delivery_timeout",
							"How long a publisher transaction waits for Kafka's acknowledgements.",
							"Unacknowledged events stay pending and are sent again later; "
							"librdkafka itself never gives up on a message.",
							&outbox_delivery_timeout_ms,
							10000, 100, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* Hash of an aggregate id key (a char *). */
static uint32
aggregate_hash(const void *key, Size keysize)
{
	const char *s = *(const char *const *) key;

	return hash_bytes((const unsigned char *) s, strlen(s));
}

/* Compare two aggregate id keys. */
static int
aggregate_match(const void *key1, const void *key2, Size keysize)
{
	return strcmp(*(const char *const *) key1, *(const char *const *) key2);
}

/* A hash table keyed by aggregate id (a char * as the entry's first field). */
HTAB *
publish_aggregate_table(const char *name, Size entrysize, long nelem, MemoryContext cxt)
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

/* Forget every stalled aggregate (the producer and its messages are gone). */
static void
reset_stalled(void)
{
	MemoryContextReset(stall_context);
	stalled_batches = NULL;
	publish_stalled_aggregates = publish_aggregate_table("outbox stalled aggregates",
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

		(void) hash_search(publish_stalled_aggregates, &key, HASH_REMOVE, NULL);
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

	sb->generation = publish_tracker.generation;
	sb->nmessages = nevents;
	sb->aggregate = MemoryContextAllocZero(stall_context,
										   sizeof(StalledAggregate *) * nevents);
	for (int i = 0; i < nevents; i++)
	{
		StalledAggregate *agg;
		bool		found;

		if (!events[i].produced || publish_tracker.results[i].done)
			continue;
		agg = hash_search(publish_stalled_aggregates, &events[i].aggregate_id, HASH_ENTER, &found);
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
void
publish_end_tracking(void)
{
	if (publish_tracker.results != NULL && !batch_stalled && publish_tracker.outstanding > 0 &&
		publish_producer != NULL)
		stall_batch(batch_events, batch_nevents);
	publish_tracker.generation++;
	publish_tracker.results = NULL;
	publish_tracker.nresults = 0;
	publish_tracker.outstanding = 0;
	batch_events = NULL;
	batch_nevents = 0;
	batch_stalled = false;
}

/* The stalled aggregates' ids, for the fetch query to leave out. */
Datum
publish_stalled_array(void)
{
	long		n = hash_get_num_entries(publish_stalled_aggregates);
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));
	HASH_SEQ_STATUS seq;
	StalledAggregate *agg;
	int			i = 0;

	hash_seq_init(&seq, publish_stalled_aggregates);
	while ((agg = hash_seq_search(&seq)) != NULL)
		d[i++] = CStringGetTextDatum(agg->aggregate_id);
	return PointerGetDatum(construct_array(d, i, TEXTOID, -1, false, TYPALIGN_INT));
}

/* Destroy the producer; its messages, and so the stalls, go with it. */
void
publish_drop_producer(void)
{
	outbox_producer_destroy(publish_producer);
	publish_producer = NULL;
	reset_stalled();
}

/*
 * After a reload: a producer built from old Kafka settings (brokers,
 * properties, or the credentials file's content) is replaced.
 */
void
publish_check_producer_settings(void)
{
	if (publish_producer != NULL &&
		outbox_kafka_config_fingerprint() != producer_fingerprint)
	{
		ereport(LOG, (errmsg("outbox: Kafka settings changed, recreating the producer")));
		publish_drop_producer();
	}
}

/* Create the producer if there is none. */
void
publish_ensure_producer(void)
{
	if (publish_producer != NULL)
		return;
	producer_fingerprint = outbox_kafka_config_fingerprint();
	publish_producer = outbox_producer_create(&publish_tracker);
	outbox_count(OC_PRODUCER_CREATIONS, 1);
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

		err = rd_kafka_producev(publish_producer,
								RD_KAFKA_V_TOPIC(topic),
								RD_KAFKA_V_KEY(ev->aggregate_id, strlen(ev->aggregate_id)),
								RD_KAFKA_V_VALUE(ev->payload, ev->payload_len),
								RD_KAFKA_V_TIMESTAMP(timestamptz_to_unix_ms(ev->created_at)),
								RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								RD_KAFKA_V_HEADERS(hdrs),
								RD_KAFKA_V_OPAQUE(outbox_delivery_opaque(publish_tracker.generation, index)),
								RD_KAFKA_V_END);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			ev->produced = true;
			publish_tracker.outstanding++;
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
		rd_kafka_poll(publish_producer, 10);
		CHECK_FOR_INTERRUPTS();
	}
}

/* Wait for the current batch's delivery reports, up to the deadline. */
bool
publish_await_deliveries(TimestampTz deadline)
{
	while (publish_tracker.outstanding > 0)
	{
		long		remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
																deadline);

		if (remaining <= 0)
			return false;
		/* rd_kafka_poll returns as soon as a report arrives. */
		rd_kafka_poll(publish_producer, (int) Min(remaining, 100));
		CHECK_FOR_INTERRUPTS();
	}
	return true;
}

/* Where an event goes: its topic, or the dead-letter topic. */
const char *
publish_event_destination(BatchEvent *ev)
{
	return ev->action == EV_DEAD_LETTER ? outbox_dead_letter_topic : ev->topic;
}

/*
 * Could the broker have judged this event's size together with others?  It
 * checks max.message.bytes per record batch, one per partition: shared if
 * another event of this batch went to the same topic and partition (or to
 * the same topic, unreported), or earlier batches had messages in flight.
 */
bool
publish_shared_request(BatchEvent *events, int nevents, int index)
{
	DeliveryResult *r = &publish_tracker.results[index];

	if (events[index].solo)
		return false;
	if (batch_after_stall)
		return true;
	for (int j = 0; j < nevents; j++)
	{
		DeliveryResult *o = &publish_tracker.results[j];

		if (j != index && events[j].produced &&
			(!o->done || o->partition == r->partition) &&
			strcmp(publish_event_destination(&events[j]), publish_event_destination(&events[index])) == 0)
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

	if (hash_get_num_entries(publish_stalled_aggregates) > 0 || !publish_await_deliveries(deadline))
		return false;
	err = produce_event(ev, index, deadline);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		publish_tracker.results[index].done = true;
		publish_tracker.results[index].err = err;
		return true;
	}
	ev->solo = publish_await_deliveries(deadline);
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
		PoisonPolicy policy = publish_poison_policy(ev);

		if (policy == POISON_BLOCK)
		{
			/* The policy became block since the last attempt. */
			agg->state = AGG_STOPPED;
			PushActiveSnapshot(GetTransactionSnapshot());
			publish_record_failure(ev, ev->last_error ? ev->last_error : "out of attempts");
			PopActiveSnapshot();
			return 1;
		}
		ev->action = policy == POISON_SKIP ? EV_SKIP : EV_DEAD_LETTER;
	}
	if (ev->action == EV_SKIP)
	{
		DeliveryResult *r = &publish_tracker.results[i];

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
		if (agg->destination == NULL && produce_alone(ev, i, deadline))
			agg->destination = publish_event_destination(ev);
		return 0;
	}
	err = produce_event(ev, i, deadline);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		/* Later versions must not overtake this one. */
		agg->state = AGG_STOPPED;
		publish_tracker.results[i].done = true;
		publish_tracker.results[i].err = err;
	}
	agg->destination = publish_event_destination(ev);
	return 0;
}


/* Set up this module's memory and the tracker (in the worker, once). */
void
publish_produce_start(void)
{
	stall_context = AllocSetContextCreate(TopMemoryContext, "outbox stalled aggregates",
										  ALLOCSET_DEFAULT_SIZES);
	reset_stalled();
	publish_tracker.stale_report = stale_report;
}

/*
 * Track the reports of a new batch of nevents (results in cxt): a new
 * generation, so that reports of earlier batches are stale from now on.
 */
void
publish_begin_tracking(BatchEvent *events, int nevents, MemoryContext cxt)
{
	publish_tracker.generation++;
	publish_tracker.results = MemoryContextAllocZero(cxt, sizeof(DeliveryResult) * nevents);
	publish_tracker.nresults = nevents;
	publish_tracker.outstanding = 0;
	batch_events = events;
	batch_nevents = nevents;
	batch_stalled = false;
}

/* The batch stopped waiting at the deadline: its aggregates stall. */
void
publish_stall_current(void)
{
	outbox_count(OC_DELIVERY_TIMEOUTS, 1);
	stall_batch(batch_events, batch_nevents);
	batch_stalled = true;
}

/*
 * Try-lock each aggregate of the batch (an aggregate another worker holds
 * is skipped: that worker publishes it) and produce the locked ones' events
 * in order.  Returns the number of failures recorded while producing.
 */
int
publish_produce_batch(BatchEvent *events, int nevents, HTAB *aggregates,
					  int *naggregates, TimestampTz deadline)
{
	int			nfailed = 0;

	batch_after_stall = hash_get_num_entries(publish_stalled_aggregates) > 0;
	for (int i = 0; i < nevents; i++)
	{
		BatchEvent *ev = &events[i];
		BatchAggregate *agg;
		bool		found;

		agg = hash_search(aggregates, &ev->aggregate_id, HASH_ENTER, &found);
		if (!found)
		{
			LOCKTAG		tag;

			agg->head = agg->tail = i;
			agg->destination = NULL;
			if (*naggregates >= outbox_batch_aggregates)
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
					(*naggregates)++;
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
	return nfailed;
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
