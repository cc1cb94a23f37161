/*-------------------------------------------------------------------------
 *
 * emit_check.h
 *	  Private to outbox_emit(): the checks of its arguments (emit_check.c)
 *	  as its insert path (emit.c) calls them.  emit.h is what the rest of
 *	  the extension sees.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_EMIT_CHECK_H
#define OUTBOX_EMIT_CHECK_H

#include "fmgr.h"
#include "utils/jsonb.h"

/*
 * Identifiers are indexed (unique btree entries must stay well below a
 * third of a page) and travel as the Kafka key and headers of every event.
 */
#define OUTBOX_MAX_IDENTIFIER_BYTES 1024

/* Set per call: its errors leave the statement out of the server log. */
extern bool emit_hide_statement;

extern const char *emit_display(const char *value);
extern void emit_check_identifier(const char *value, const char *name);
extern char *emit_required_text_arg(FunctionCallInfo fcinfo, int argno, const char *name,
									 Datum *text_value);
extern char *emit_default_topic(const char *aggregate_type);
extern void emit_validate_topic(const char *topic, const char *origin);
extern size_t emit_validate_headers(Jsonb *headers);
extern Jsonb *emit_add_trace_context(Jsonb *headers);
extern size_t emit_publisher_record_bytes(const char *aggregate_type, const char *aggregate_id,
										  const char *event_type, const char *event_id,
										  const char *topic);
extern bool emit_has_huge_argument(FunctionCallInfo fcinfo);
extern void emit_check_record_size(size_t payload_bytes, size_t header_bytes,
								   size_t publisher_bytes);
extern size_t emit_payload_size(Datum payload, bool raw);

#endif							/* OUTBOX_EMIT_CHECK_H */
