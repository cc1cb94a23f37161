/*-------------------------------------------------------------------------
 *
 * publish.h
 *	  The publisher's private declarations, shared by its modules:
 *	  worker.c (the loop), publish_read.c, publish_durable.c,
 *	  publish_settle.c, publish_stream.c, publish_produce.c,
 *	  publish_poison.c, publish_delta.c, publish_progress.c,
 *	  publish_heap.c, retention.c, publish_extension.c, publish_shares.c
 *	  and publish_state.c.  Nothing outside the publisher includes this.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_PUBLISH_H
#define OUTBOX_PUBLISH_H

#include "access/xlogdefs.h"
#include "storage/itemptr.h"
#include "utils/relcache.h"
#include "executor/spi.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"

#include "kafka.h"
#include "shmem.h"
#include "util.h"

/* What a batch does with an event. */
typedef enum EventAction
{
	EV_PUBLISH,					/* to its topic */
	EV_DEAD_LETTER,				/* to outbox.dead_letter_topic */
	EV_SKIP						/* nowhere: recorded as skipped */
} EventAction;

#define EV_NUM_ACTIONS (EV_SKIP + 1)

struct BatchAggregate;

/* One pending event as read, and what became of it. */
typedef struct BatchEvent
{
	int64		id;
	char	   *event_id;
	char	   *aggregate_type;
	char	   *aggregate_id;
	int64		version;
	char	   *event_type;
	char	   *topic;
	int			event_id_len;	/* strlen() of the names, read with them */
	int			aggregate_type_len;
	int			aggregate_id_len;
	int			event_type_len;
	int			topic_len;
	Jsonb	   *headers;
	char	   *payload;		/* the value's bytes, NULL for a null payload */
	size_t		payload_len;
	TimestampTz created_at;
	int			attempts;
	char	   *last_error;
	bool		dead_letter_requested;
	TransactionId pub_xmin;		/* its aggregate_publication row as read */
	ItemPointerData pub_tid;	/* ... where it was (invalid: not known) */
	bool		pub_row;		/* ... if there was one */
	int64		owed;			/* the stream's delta that owes it (0: none) */
	bool		maybe_more;		/* read by index, and the read was cut short */
	EventAction action;
	bool		produced;
	bool		solo;			/* produced with nothing else in flight */
	bool		retry_alone;	/* refused for size, maybe for others: no attempt */
	int			next;			/* next event of the same aggregate, or -1 */
	struct BatchAggregate *agg; /* its aggregate in the flight, once produced */
} BatchEvent;

typedef enum AggregateState
{
	AGG_ACTIVE,					/* locked by us, events being produced */
	AGG_SKIPPED,				/* another worker holds it, or over the limit */
	AGG_STOPPED,				/* an event failed to enqueue: send no more */
	AGG_DEFERRED				/* the rest waits for a later batch */
} AggregateState;

/* One aggregate of a batch: its events are a list through BatchEvent.next. */
typedef struct BatchAggregate
{
	char	   *aggregate_id;	/* hash key: must be first */
	AggregateState state;
	const char *destination;	/* topic of its first produced event */
	int			head;
	int			tail;
	int			nevents;		/* its events in the batch */
	int			unreported;		/* produced messages not yet reported */
	bool		collected;		/* its outcome is in a settling transaction */
	bool		settled;		/* ... which committed (or nothing to settle) */
	/* From its first event: */
	int64		owed;			/* the stream's delta that owes it (0: none) */
	TransactionId pub_xmin;		/* progress applies only to this row version */
	ItemPointerData pub_tid;	/* ... found there first (invalid: by key) */
	bool		pub_row;		/* ... or, if false, to no row */
	bool		maybe_more;		/* may have more events than it read */
	/* Its outcome, once collected: */
	bool		complete;		/* every event read was settled */
	bool		listed;			/* a failure made the database list it */
	int			nmarked;		/* events its last collection marked */
	/* Settlings that found its row held by another transaction: */
	int			deferrals;
	TimestampTz retry_at;		/* ... and when to try again (0: now) */
} BatchAggregate;

/*
 * A flight: one batch read and produced in one transaction, whose messages
 * are in flight until Kafka reports them and whose aggregates stay "busy"
 * (not read again) until their outcome is committed.  It lives in its own
 * memory context until every aggregate is settled.
 */
typedef struct Flight
{
	uint32		generation;		/* carried in its messages' opaque */
	MemoryContext cxt;
	BatchEvent *events;
	int			nevents;
	int64		bytes;			/* what outbox.batch_bytes counts */
	DeliveryResult *results;	/* per event */
	HTAB	   *aggregates;		/* BatchAggregate by aggregate id */
	int			outstanding;	/* produced, not yet reported */
	int			unsettled;		/* locked aggregates not yet settled */
	int			live_events;	/* events of those: what is in flight */
	TimestampTz produced_at;
	bool		timed_out;		/* unreported past outbox.delivery_timeout */
	bool		report_failed;	/* a message's report was a failure */
	bool		untimed;		/* out before the producer's first report (its
								 * time includes connecting) */
	bool		after_others;	/* other flights had messages out meanwhile */
	struct Flight *next;
} Flight;

/*
 * What Kafka acknowledged but is not yet recorded in the database: kept
 * (in its own memory context) when settling fails, and only the settling
 * is retried, so that an acknowledged event is never produced again by
 * this worker.  Progress is per aggregate (last_published_version, applied
 * only to the row version read); only dead-lettered and skipped events
 * are written per event.
 */
typedef struct PendingMarks
{
	Oid			extension;		/* the rows' ids mean nothing in another one */
	int			nprogress;
	char	  **progress_ids;
	int64	   *progress_versions;
	TransactionId *progress_xmins;
	ItemPointerData *progress_tids; /* where that row version was */
	bool	   *progress_rows;	/* false: no row when read (insert) */
	TimestampTz *progress_acked_at; /* when Kafka acknowledged that version */
	int			ndisposed;
	int64	   *disposed_ids;
	char	  **disposed_actions;
	char	  **disposed_aggregates;
	int64		nsettled[EV_NUM_ACTIONS];
	HTAB	   *applied;		/* aggregates whose progress was recorded */
	HTAB	   *busy;			/* ... and those left for a later settling */
} PendingMarks;

/* publish_state.c: this worker's entry, index and slot, reload and stop; below every step */
extern OutboxDatabase *publish_database;
extern int	publish_worker_index;
extern OutboxWorkerSlot *publish_slot;
extern bool publish_reloaded;
extern int	outbox_batch_events;
extern int	outbox_batch_bytes;
extern bool publish_listed_changed;
extern void publish_state_init(void);
extern void publish_set_state(const char *state);
extern void publish_process_reload(void);
extern void publish_stop_setup(void);
extern bool publish_stop_requested(void);
extern void publish_stop_bound(bool holding);

/*
 * publish_extension.c: the extension's look-up, and the steps' hooks it
 * runs: plans when the extension (re)appears (schema quoted), columns at
 * every look-up, and a table whose invalidation means looking up again.
 */
typedef struct PublishExtensionHook
{
	void		(*plans) (const char *schema);
	void		(*columns) (Oid nsp);
	Oid			(*relid) (void);
} PublishExtensionHook;
extern void publish_extension_hooks(const PublishExtensionHook *hooks, int n);
extern Oid	publish_lookup_extension(void);

/* publish_shares.c: the buckets shared out between the database's workers */
extern uint32 publish_reading_workers(Oid ext);
extern void publish_bucket_share(uint32 members, int *nshares, int *share);
extern void publish_note_peer_buckets(void);
extern bool publish_bucket_busy_elsewhere(int bucket);
extern bool publish_shares_agreed(void);

/* worker.c: the loop */
extern int	outbox_poll_interval_ms;

/*
 * Keep a plan of the publisher's, planned once: with only nested loops over
 * indexes allowed (worker_setup) the plan does not depend on parameters.
 */
static inline SPIPlanPtr
publish_keep_plan(const char *query, int nargs, Oid *argtypes)
{
	return outbox_keep_plan_options(query, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
}

/* publish_read.c: plans, and reading pending events */
extern int	outbox_read_interval_ms;
extern int	outbox_read_commits;
extern bool publish_read_paused;
extern void publish_read_init(void);
extern long publish_read_gap_ms(void);
extern void publish_read_prepare(const char *s);
extern void publish_read_columns(Oid nsp);
extern Oid	publish_read_control_relid(void);
extern int	publish_fetch(Flight *f, int nshares, int share, int max_events, int64 max_bytes);
extern XLogRecPtr publish_read_flush_upto(XLogRecPtr upto);

/* One event of a delta's manifest: where to fetch it, and what it must be. */
typedef struct ManifestEntry
{
	int64		id;
	ItemPointerData tid;		/* its row version when the delta was read */
	int32		hash;			/* hashtext(aggregate_id): the order's first key */
} ManifestEntry;

/*
 * The columns an event is made of, in the order the reads by SQL select
 * them (EVENT_COLUMNS); rows read from the heap have them where the table
 * has them (publish_heap_columns()).
 */
typedef enum EventColumn
{
	EC_ID,
	EC_EVENT_ID,
	EC_AGGREGATE_TYPE,
	EC_AGGREGATE_ID,
	EC_VERSION,
	EC_EVENT_TYPE,
	EC_TOPIC,
	EC_HEADERS,
	EC_PAYLOAD,
	EC_CREATED_AT,
	EC_ATTEMPTS,
	EC_LAST_ERROR,
	EC_DEAD_LETTER_REQUESTED,
	EC_PAYLOAD_BYTES,
	EC_NCOLUMNS
} EventColumn;

/* An aggregate's progress as its row says (publish_progress_read). */
typedef struct PublishProgress
{
	bool		has_row;
	bool		listed;			/* paused, blocked, backing off or catching up */
	int64		last_published_version;
	TransactionId xmin;			/* the row's version */
	ItemPointerData tid;		/* ... and where it is */
} PublishProgress;

/* publish_progress.c: progress read, and the common settling, without a statement */
extern void publish_progress_prepare(Oid nsp);
extern void publish_progress_read(char **ids, int n, PublishProgress *out);
extern Oid	publish_progress_relid(void);
extern uint64 publish_progress_record(char **ids, int64 *versions, TransactionId *xmins,
									  ItemPointerData *tids, bool *has_row,
									  TimestampTz *acked_at, int n,
									  TimestampTz now, HTAB *applied, HTAB *busy,
									  MemoryContext applied_cxt);

/* publish_heap.c: a delta's rows from the heap, a page at a time */
extern Oid	publish_table_columns(Oid nsp, const char *table, const char *const *names, int n,
								  int *columns);
extern void publish_heap_prepare(Oid nsp);
extern Relation publish_open_table(Oid relid, LOCKMODE mode, AclMode acl, const char *const *names,
								   int n, int *columns);
extern Oid	publish_heap_relid(void);
extern Relation publish_heap_open(void);
extern const int *publish_heap_columns(void);
extern void publish_heap_fetch(Relation rel, ManifestEntry *entries, int n, HeapTuple *rows,
							   MemoryContext cxt);

/* publish_delta.c: a delta's manifest, read through the txid index */
extern int	publish_delta_read(const char *from, const char *to, int nshares, int share,
							   ManifestEntry **entries);
extern XLogRecPtr publish_delta_flush_upto(XLogRecPtr upto);

/* publish_stream.c: the stream of commits, diverted aggregates, the horizon */
extern void publish_stream_start(void);
extern void publish_stream_prepare(const char *schema);
extern void publish_stream_reset(void);
extern void publish_stream_begin(int nshares, int share);
extern bool publish_stream_claim_committed(void);
extern bool publish_stream_reading(int nshares, int share);
extern void publish_stream_store_horizon(void);
extern const char *publish_stream_read_from(void);
extern bool publish_stream_manifest_done(void);
extern bool publish_stream_manifest_at_aggregate(void);
extern void publish_stream_new_delta(const char *snapshot, ManifestEntry *entries, int n);
extern int	publish_stream_next_ids(int max, ManifestEntry **entries, int64 *seq);
extern void publish_stream_ids_done(void);
extern void publish_stream_owe(int64 seq);
extern bool publish_stream_is_diverted(const char *aggregate_id);
extern void publish_stream_divert(const char *aggregate_id, int64 seq);
extern int	publish_stream_diverted_ready(char ***ids, int max,
										  bool (*busy) (const char *aggregate_id));
extern int64 publish_stream_undivert(const char *aggregate_id, bool release);
extern void publish_stream_settled(const char *aggregate_id, int64 seq, bool covered);
extern long publish_stream_diverted_count(void);

/* publish_durable.c: publish only durable commits */
extern int	outbox_standby_confirmations;
extern void publish_durable_init(void);
extern XLogRecPtr publish_wal_insert_end(void);
extern void publish_make_durable(XLogRecPtr flush_upto, XLogRecPtr upto);

/* publish_produce.c: the producer, and tracking what is in flight */
extern int	outbox_delivery_timeout_ms;
extern int	outbox_batch_aggregates;
extern rd_kafka_t *publish_producer;
extern Flight *publish_flights;
extern void publish_produce_init(void);
extern void publish_produce_start(void);
extern void publish_check_producer_settings(void);
extern bool publish_producer_outdated(void);
extern bool publish_producer_replace_due(void);
extern void publish_ensure_producer(void);
extern void publish_drop_producer(void);
extern void publish_check_fatal(void);
typedef bool (*AggregateVisitor) (Flight *f, BatchAggregate *agg, void *arg);
extern bool publish_walk_aggregates(bool unsettled_only, AggregateVisitor visit, void *arg);
extern Flight *publish_flight_begin(void);
extern int	publish_produce_flight(Flight *f, TimestampTz deadline);
extern void publish_flight_end(Flight *f);
extern bool publish_aggregate_busy(const char *aggregate_id);
extern void publish_aggregate_settled(Flight *f, BatchAggregate *agg);
extern void publish_free_settled_flights(void);
extern void publish_in_flight(int *events, int64 *bytes);
extern long publish_hold_reading_ms(void);
extern long publish_reported_ms(void);
extern long publish_reports_quiet_ms(void);
extern void publish_serve_reports(bool unwatched);
extern int	publish_check_timeouts(void);
extern long publish_stalled_count(void);
extern long publish_deferred_count(void);
extern int	publish_reports_fd(void);
extern bool publish_aggregate_ready(BatchAggregate *agg);
extern bool publish_any_ready(void);
extern bool publish_flight_reported(void);
extern int	publish_outstanding(void);
extern bool publish_shared_request(Flight *f, int index);

/* publish_poison.c: failures and the poison policy */
extern int	outbox_max_attempts;
extern int	outbox_poison_policy;
extern void publish_poison_init(void);
extern void publish_poison_prepare(const char *schema);
extern PoisonPolicy publish_poison_policy(BatchEvent *ev);
extern const char *publish_event_destination(BatchEvent *ev);
extern void publish_record_failure(BatchEvent *ev, const char *msg);
extern void publish_note_size_error(BatchEvent *ev, const char *msg);
extern bool publish_is_size_error(rd_kafka_resp_err_t err);
extern bool publish_last_error_is_size(BatchEvent *ev);

/* publish_settle.c: settling acknowledged events; array arguments of plans */
extern PendingMarks *publish_pending_marks;
extern void publish_settle_start(void);
extern void publish_settle_prepare(const char *schema);
extern int	publish_settle_ready(void);
extern bool publish_settle_due(long *wait_ms);
extern void publish_settle_abort(void);
extern int	publish_retry_marks(void);
extern Datum publish_int8_array(int64 *v, int n);
extern Datum publish_xid_array(TransactionId *v, int n);
extern Datum publish_bool_array(bool *v, int n);
extern Datum publish_text_array(char **v, int n);

/* retention.c: deleting what is past outbox.retention */
extern void publish_retention_init(void);
extern void publish_retention_prepare(const char *schema);
extern void publish_retention_maybe(void);

#endif							/* OUTBOX_PUBLISH_H */
