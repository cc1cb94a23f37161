/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  Private to the inbox workers, shared by their parts: the loop
 *	  (inbox_worker.c: defining the settings, shared memory, subscriptions,
 *	  steps), a subscription's Kafka consumer (inbox_consumer.c), one batch
 *	  applied through the handler (inbox_apply.c), the statements on the
 *	  inbox tables (inbox_store.c), and below them all the settings' values
 *	  and one worker's state (inbox_state.c).  Nothing outside the inbox
 *	  includes this.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_INBOX_H
#define OUTBOX_INBOX_H

#include <librdkafka/rdkafka.h>

#include "executor/spi.h"
#include "nodes/pg_list.h"
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "shmem.h"
#include "util.h"

/* A partition stopped at a message: paused in Kafka until resume_at. */
typedef struct PausedPartition
{
	char	   *topic;
	int32		partition;
	TimestampTz resume_at;
} PausedPartition;

/* What inbox_status shows of a consumer's connection (inbox_consumer_state). */
typedef enum InboxKafkaState
{
	INBOX_KAFKA_RUNNING,
	INBOX_KAFKA_DISCONNECTED,
	INBOX_KAFKA_ERROR
} InboxKafkaState;

/* One subscription as served by this worker, in subs_context. */
typedef struct InboxSub
{
	char	   *consumer;
	char	   *topics;			/* text form of the array, to spot changes */
	Oid			handler;
	Oid			owner;
	bool		seen;			/* still subscribed at the last refresh */
	bool		usable;			/* owner and handler pass the checks */
	rd_kafka_t *rk;
	/* Set by the rebalance callback; assigned at stored offsets later. */
	rd_kafka_topic_partition_list_t *pending_assign;
	bool		rebalanced;		/* since the last poll: drop what is held */
	List	   *paused;			/* of PausedPartition */
	int			max_poll_ms;	/* its max.poll.interval.ms */
	double		msg_cost_us;	/* a message's claim and handler, measured; 0: not yet */
	/* Fetched and not yet applied, in fetch order (in subs_context). */
	rd_kafka_message_t **msgs;
	int			nmsgs;
	int			msgs_size;
	/* The Kafka connection, as the error callback last reported it. */
	int			worker;			/* this worker's index, for logs and the state */
	InboxKafkaState kafka_state;
	char		kafka_error[OUTBOX_PROBLEM_LEN];
	TimestampTz kafka_since;
	bool		kafka_state_dirty;	/* not yet in inbox_consumer_state */
	bool		kafka_fatal;	/* a fatal error since the state was last running */
	TimestampTz last_probe;
} InboxSub;

/* Subscriptions are looked up again this often (and paused partitions). */
#define INBOX_REFRESH_MS 1000
/* Longest backoff of a failing handler. */
#define INBOX_MAX_BACKOFF_MS (5 * 60 * 1000)

/* A partition's row of inbox_offset, locked for the batch. */
typedef struct PartState
{
	char	   *topic;
	int32		partition;
	int64		next_offset;	/* -1: none stored yet */
	int			attempts;
	char	   *last_error;
	TimestampTz next_attempt_at;	/* 0: none */
	TimestampTz blocked_at;		/* 0: not blocked */
	char	   *blocked_reason;
	bool		accept_gap;
	bool		skip_requested;
	bool		stopped;		/* no more messages of it in this batch */
	bool		was_paused;		/* stopped before this batch */
	int64		stop_offset;
	int64		last_applied_offset;	/* -1: none in this batch */
	int64		applied,
				duplicates,
				gaps,
				errors,
				dead_lettered,
				skipped;
} PartState;

/* An aggregate's last applied version, cached for one batch. */
typedef struct InboxAggregate
{
	char	   *aggregate_id;	/* hash key: must be first */
	int64		last_version;	/* 0: none */
	bool		stored;			/* has a row, read at tid */
	ItemPointerData tid;
	bool		dirty;
} InboxAggregate;

/* The headers the publisher sets, parsed from one message. */
typedef struct MessageMeta
{
	char	   *event_id;
	char	   *event_type;
	char	   *aggregate_type;
	char	   *aggregate_id;
	int64		aggregate_version;	/* 0: none */
	Datum		headers;		/* jsonb, or 0 */
} MessageMeta;

/* Settings (outbox.inbox_*) of the consumers */
extern char *inbox_kafka_credentials_file;

/* inbox_state.c: one worker's state, set by the loop */
extern int	inbox_worker_index;
extern MemoryContext inbox_subs_context;
extern MemoryContext inbox_loop_context;
extern void inbox_begin_step(void);
extern void inbox_end_step(void);

/* inbox_apply.c */
extern int	inbox_apply_batch(InboxSub *sub);

/* inbox_store.c: kept plans, for the schema they were prepared in */
extern Oid	inbox_plans_nspid;
extern TupleDesc inbox_message_desc;
extern SPIPlanPtr inbox_subs_plan,
			inbox_offset_read_plan,
			inbox_claim_many_plan,
			inbox_dead_letter_plan,
			inbox_retention_plan;
extern bool inbox_prepare_plans(void);
extern void inbox_load_aggregates(HTAB *aggs, InboxSub *sub, MessageMeta *metas, int n);
extern InboxAggregate *inbox_aggregate_state(HTAB *aggs, const char *aggregate_id);
extern void inbox_claim_message(InboxSub *sub, const char *identity, bool *claimed);
extern void inbox_lock_partition(InboxSub *sub, PartState *ps);
extern void inbox_save_partition(InboxSub *sub, PartState *ps);
extern void inbox_flush_aggregates(InboxSub *sub, HTAB *aggs);

/* inbox_consumer.c */
extern void inbox_consumer_settings_init(void);
extern uint32 inbox_consumer_fingerprint(void);
extern void inbox_consumer_create(InboxSub *sub, ArrayType *topics, int worker);
extern void inbox_consumer_resubscribe(InboxSub *sub, ArrayType *topics, const char *text);
extern void inbox_consumer_destroy(InboxSub *sub);
extern void inbox_drop_messages(InboxSub *sub);
extern void inbox_state_prepare(const char *schema, int worker);
extern bool inbox_state_due(InboxSub *sub, TimestampTz now);
extern void inbox_state_save(InboxSub *sub);

#endif							/* OUTBOX_INBOX_H */
