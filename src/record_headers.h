/*-------------------------------------------------------------------------
 *
 * record_headers.h
 *	  Names of the Kafka record headers the publisher sets itself.
 *
 * outbox_emit() refuses caller headers that a consumer could mistake for
 * these (compared case-insensitively, ignoring surrounding blanks), and
 * every name starting with the dead-letter prefix.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_RECORD_HEADERS_H
#define OUTBOX_RECORD_HEADERS_H

/*
 * The event's identity, on every record.  "id" carries the event id too:
 * it is where Debezium's outbox event router puts it.
 */
#define OUTBOX_HEADER_ID					"id"
#define OUTBOX_HEADER_EVENT_ID				"event_id"
#define OUTBOX_HEADER_EVENT_TYPE			"event_type"
#define OUTBOX_HEADER_AGGREGATE_TYPE		"aggregate_type"
#define OUTBOX_HEADER_AGGREGATE_ID			"aggregate_id"
#define OUTBOX_HEADER_AGGREGATE_VERSION		"aggregate_version"

/*
 * W3C trace context captured at emit from outbox.traceparent and
 * outbox.tracestate, unless the caller's headers set them.  Not reserved.
 */
#define OUTBOX_HEADER_TRACEPARENT			"traceparent"
#define OUTBOX_HEADER_TRACESTATE			"tracestate"

/* On records sent to outbox.dead_letter_topic. */
#define OUTBOX_HEADER_DEAD_LETTER_PREFIX	"dead_letter_"
#define OUTBOX_HEADER_DEAD_LETTER_ORIGINAL_TOPIC "dead_letter_original_topic"
#define OUTBOX_HEADER_DEAD_LETTER_ERROR		"dead_letter_error"
#define OUTBOX_HEADER_DEAD_LETTER_ATTEMPTS	"dead_letter_attempts"

/*
 * Longest dead_letter_error value the publisher sends; outbox_emit()
 * counts it when it checks that a record fits message.max.bytes.
 */
#define OUTBOX_DEAD_LETTER_ERROR_MAX_BYTES	256

#endif							/* OUTBOX_RECORD_HEADERS_H */
