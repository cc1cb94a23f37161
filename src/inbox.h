/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  Private to the inbox workers: a subscription's Kafka consumer
 *	  (inbox_consumer.c) as the apply loop (inbox_worker.c) uses it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_INBOX_H
#define OUTBOX_INBOX_H

#include <librdkafka/rdkafka.h>

#include "nodes/pg_list.h"
#include "utils/array.h"
#include "utils/timestamp.h"

#include "outbox.h"

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

/* Settings (outbox.inbox_*) of the consumers */
extern char *inbox_kafka_credentials_file;

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
