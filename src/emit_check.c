/*-------------------------------------------------------------------------
 *
 * emit_check.c
 *	  outbox_emit()'s checks of its arguments, before anything is written:
 *	  identifiers, topics, headers, the payload's and the record's size;
 *	  the trace context it adds to the headers; and the settings they read
 *	  (outbox.default_topic, outbox.max_payload_bytes,
 *	  outbox.dead_letter_topic, outbox.allowed_topics, outbox.traceparent,
 *	  outbox.tracestate).
 *
 * Everything here is computed from the call's arguments and the settings:
 * no table is read, no lock taken, so a refused event costs the emitter
 * nothing but the error.  Errors carry an SQLSTATE and say which argument
 * or setting is at fault; values are cut in messages (emit_display), and an
 * argument larger than any identifier may be keeps the statement, which
 * repeats it, out of the server log (emit_hide_statement, set per call by
 * emit.c).  A topic is refused where Kafka would refuse it, when it is
 * Kafka's own or the dead-letter topic, or when outbox.allowed_topics does
 * not allow it.  The GUC check hooks must not ereport: they report through
 * GUC_check_errdetail().  Also outbox_check_arg() and
 * outbox_check_text_arg(), the argument checks of inbox_claim() and the
 * operator functions.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "parser/scansup.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "kafka.h"
#include "emit.h"
#include "emit_check.h"
#include "record_headers.h"

PG_FUNCTION_INFO_V1(outbox_check_arg);

/* Kafka's own limit on topic names (Topic.MAX_NAME_LENGTH). */
#define KAFKA_TOPIC_MAX_LEN 249

/* Headers the publisher sets itself from the event's identity. */
static const char *const reserved_headers[] = {
	OUTBOX_HEADER_ID, OUTBOX_HEADER_EVENT_ID, OUTBOX_HEADER_EVENT_TYPE,
	OUTBOX_HEADER_AGGREGATE_TYPE, OUTBOX_HEADER_AGGREGATE_ID,
	OUTBOX_HEADER_AGGREGATE_VERSION
};

/*
 * What a Kafka record costs beyond its key, value and headers, as librdkafka
 * counts it against message.max.bytes (a v2 record's length, attributes,
 * timestamp and offset deltas and length varints, at their largest: 36
 * bytes, measured with librdkafka 2.0.2), and at most what each header adds
 * beyond its name and value (two length varints; 2 bytes for short ones).
 */
#define KAFKA_RECORD_OVERHEAD 36
#define KAFKA_HEADER_OVERHEAD 10

/* Values longer than this are cut in error messages. */
#define OUTBOX_DISPLAY_BYTES 64

char	   *outbox_default_topic = NULL;
int			outbox_max_payload_bytes = 1024 * 1024;
char	   *outbox_dead_letter_topic = NULL;

/* outbox.allowed_topics: comma-separated patterns, '*' matches anything. */
static char *outbox_allowed_topics = NULL;

/* W3C trace context of the session, captured into each event's headers. */
static char *outbox_traceparent = NULL;
static char *outbox_tracestate = NULL;

/* W3C Trace Context: most list members of a tracestate, and its length. */
#define TRACESTATE_MAX_MEMBERS 32
#define TRACESTATE_MAX_BYTES 512

/*
 * Set when an argument of the current call is larger than any valid
 * identifier: its errors then leave the statement out of the server log, so
 * that a megabyte argument is not logged again on every failed call.
 */
bool		emit_hide_statement = false;

/*
 * A value as shown in an error message: cut (at a character boundary) after
 * OUTBOX_DISPLAY_BYTES bytes.
 */
const char *
emit_display(const char *value)
{
	int			len = strlen(value);

	if (len <= OUTBOX_DISPLAY_BYTES)
		return value;
	return psprintf("%.*s...", pg_mbcliplen(value, len, OUTBOX_DISPLAY_BYTES), value);
}

/* An identifier argument must be neither empty nor overlong. */
void
emit_check_identifier(const char *value, const char *name)
{
	size_t		len = strlen(value);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: %s must not be empty", name)));
	if (len > OUTBOX_MAX_IDENTIFIER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("outbox_emit: %s is too long (%zu bytes)", name, len),
				 errdetail("%s may have at most %d bytes.", name,
						   OUTBOX_MAX_IDENTIFIER_BYTES),
				 errhidestmt(true)));
}

/*
 * The argument checks of inbox_claim() and the operator functions: not
 * NULL, not empty, not overlong.  An overlong value's error leaves the
 * statement, which repeats the value, out of the server log.
 */
void
outbox_check_text_arg(const char *name, Datum value, bool isnull)
{
	int64		len;

	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", name)));
	len = toast_raw_datum_size(value) - VARHDRSZ;
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", name)));
	if (len > OUTBOX_MAX_IDENTIFIER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long (" INT64_FORMAT " bytes)", name, len),
				 errdetail("It may have at most %d bytes.", OUTBOX_MAX_IDENTIFIER_BYTES),
				 errhidestmt(true)));
}

/* outbox_check_arg(name, value): outbox_check_text_arg() for SQL callers. */
Datum
outbox_check_arg(PG_FUNCTION_ARGS)
{
	outbox_check_text_arg(text_to_cstring(PG_GETARG_TEXT_PP(0)),
						  PG_GETARG_DATUM(1), PG_ARGISNULL(1));
	PG_RETURN_VOID();
}

/*
 * Text argument argno, checked as an identifier; it must not be NULL.  The
 * argument's text (detoasted) in *text_value.
 */
char *
emit_required_text_arg(FunctionCallInfo fcinfo, int argno, const char *name, Datum *text_value)
{
	char	   *value;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox_emit: %s must not be NULL", name)));
	*text_value = PointerGetDatum(PG_GETARG_TEXT_PP(argno));
	value = text_to_cstring(DatumGetTextPP(*text_value));
	emit_check_identifier(value, name);
	return value;
}

/*
 * Why Kafka would reject a topic name, or NULL if it would not.  Also the
 * GUC check of outbox.dead_letter_topic, so it must not ereport.
 */
const char *
outbox_topic_error(const char *topic)
{
	size_t		len = topic ? strlen(topic) : 0;

	if (len == 0)
		return "Kafka topic names must not be empty.";
	if (len > KAFKA_TOPIC_MAX_LEN)
		return "Kafka topic names have at most 249 characters.";
	if (strcmp(topic, ".") == 0 || strcmp(topic, "..") == 0)
		return "Kafka topic names must not be \".\" or \"..\".";
	for (const char *p = topic; *p; p++)
	{
		unsigned char c = (unsigned char) *p;

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
			return "Kafka topic names may contain only ASCII letters, digits, '.', '_' and '-'.";
	}
	return NULL;
}

/*
 * Whether topic matches the pattern [p, pend), in which '*' matches any run
 * of characters (backtracking to the last '*' only: enough for globs).
 */
static bool
topic_matches(const char *topic, const char *p, const char *pend)
{
	const char *star = NULL;
	const char *resume = NULL;

	while (*topic)
	{
		if (p < pend && *p == '*')
		{
			star = p++;
			resume = topic;
		}
		else if (p < pend && *p == *topic)
		{
			p++;
			topic++;
		}
		else if (star != NULL)
		{
			p = star + 1;
			topic = ++resume;
		}
		else
			return false;
	}
	while (p < pend && *p == '*')
		p++;
	return p == pend;
}

/*
 * Calls fn for each trimmed item of a comma-separated list until it returns
 * true; returns whether one did.
 */
static bool
any_list_item(const char *list, bool (*fn) (const char *item, const char *end, void *arg),
			  void *arg)
{
	const char *p = list ? list : "";

	for (;;)
	{
		const char *next = strchr(p, ',');
		const char *end = next ? next : p + strlen(p);

		while (p < end && *p == ' ')
			p++;
		while (end > p && end[-1] == ' ')
			end--;
		if (fn(p, end, arg))
			return true;
		if (next == NULL)
			return false;
		p = next + 1;
	}
}

/* any_list_item() callback: whether the pattern item matches the topic. */
static bool
pattern_matches(const char *item, const char *end, void *topic)
{
	return end > item && topic_matches((const char *) topic, item, end);
}

/* Kafka treats '.' and '_' alike when it checks topic names for collisions. */
static bool
same_kafka_topic(const char *a, const char *b)
{
	for (; *a && *b; a++, b++)
		if ((*a == '.' ? '_' : *a) != (*b == '.' ? '_' : *b))
			return false;
	return *a == *b;
}

/*
 * Reject what a Kafka broker would reject, and what an emitter may not
 * reach, before anything is written.
 */
void
emit_validate_topic(const char *topic, const char *origin)
{
	const char *err = outbox_topic_error(topic);

	if (err != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: invalid topic name \"%s\"", emit_display(topic)),
				 errdetail("%s", err),
				 errhint("The topic came from %s.", origin),
				 errhidestmt(emit_hide_statement)));
	if (strncmp(topic, "__", 2) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox_emit: topic \"%s\" is internal to Kafka", topic),
				 errdetail("Topics whose names begin with \"__\", such as __consumer_offsets and __transaction_state, belong to Kafka itself."),
				 errhint("The topic came from %s.", origin),
				 errhidestmt(emit_hide_statement)));
	if (outbox_dead_letter_topic != NULL &&
		same_kafka_topic(topic, outbox_dead_letter_topic))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox_emit: topic \"%s\" is the dead-letter topic", topic),
				 errdetail("Only the publisher writes to outbox.dead_letter_topic (Kafka treats '.' and '_' in topic names alike)."),
				 errhint("The topic came from %s.", origin),
				 errhidestmt(emit_hide_statement)));
	if (!outbox_topic_matches_list(topic, outbox_allowed_topics))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox_emit: topic \"%s\" is not allowed", topic),
				 errdetail("outbox.allowed_topics is \"%s\".", emit_display(outbox_allowed_topics)),
				 errhint("The topic came from %s; a superuser can allow it in outbox.allowed_topics.", origin),
				 errhidestmt(emit_hide_statement)));
}

/* An item of outbox.allowed_topics that is not a pattern of topic names. */
static bool
bad_pattern(const char *item, const char *end, void *arg)
{
	if (item == end)
	{
		GUC_check_errdetail("Patterns must not be empty.");
		return true;
	}
	if (end - item > KAFKA_TOPIC_MAX_LEN)
	{
		GUC_check_errdetail("Patterns have at most %d characters.", KAFKA_TOPIC_MAX_LEN);
		return true;
	}
	for (const char *p = item; p < end; p++)
	{
		unsigned char c = (unsigned char) *p;

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' || c == '*'))
		{
			GUC_check_errdetail("Patterns may contain only ASCII letters, digits, '.', '_', '-' and '*'.");
			return true;
		}
	}
	return false;
}

/*
 * GUC check of a list of topic patterns (outbox.allowed_topics,
 * outbox.inbox_allowed_topics).  An empty list allows no topic.
 */
bool
outbox_check_topic_patterns(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[strspn(*newval, " ")] == '\0')
		return true;
	return !any_list_item(*newval, bad_pattern, NULL);
}

/* Whether a pattern of the comma-separated list matches the topic. */
bool
outbox_topic_matches_list(const char *topic, const char *patterns)
{
	return any_list_item(patterns, pattern_matches, (void *) topic);
}

/* Whether [p, p + len) is lowercase hex digits (not all zero if nonzero). */
static bool
is_hex(const char *p, int len, bool nonzero)
{
	bool		seen_nonzero = false;

	for (int i = 0; i < len; i++)
	{
		if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
			return false;
		seen_nonzero |= p[i] != '0';
	}
	return seen_nonzero || !nonzero;
}

/*
 * outbox.traceparent: empty, or a W3C traceparent,
 * version "-" trace-id "-" parent-id "-" flags in lowercase hex.  Version
 * 00 has exactly these four fields; later versions may append more.
 */
static bool
check_traceparent(char **newval, void **extra, GucSource source)
{
	const char *v = *newval;
	size_t		len = v ? strlen(v) : 0;

	if (len == 0)
		return true;
	/* Version ff is invalid; version 00 has no further fields. */
	if (len < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' ||
		!is_hex(v, 2, false) || strncmp(v, "ff", 2) == 0 ||
		!is_hex(v + 3, 32, true) || !is_hex(v + 36, 16, true) ||
		!is_hex(v + 53, 2, false) ||
		(len > 55 && (strncmp(v, "00", 2) == 0 || v[55] != '-')))
	{
		GUC_check_errdetail("A traceparent is version-traceid-parentid-flags in lowercase hex "
							"(2, 32, 16 and 2 digits), e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01; "
							"the ids must not be all zeros.");
		return false;
	}
	return true;
}

/* A tracestate list member: key "=" value (W3C Trace Context, 3.3.1). */
static bool
valid_tracestate_member(const char *p, const char *end)
{
	const char *eq = memchr(p, '=', end - p);

	if (eq == NULL || eq == p || eq - p > 256 || eq + 1 == end || end - eq - 1 > 256)
		return false;
	for (const char *c = p; c < eq; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
			  *c == '_' || *c == '-' || *c == '*' || *c == '/' || *c == '@'))
			return false;
	for (const char *c = eq + 1; c < end; c++)
		if (*c < 0x20 || *c > 0x7e || *c == ',' || *c == '=')
			return false;
	return end[-1] != ' ';
}

/* outbox.tracestate: empty, or a W3C tracestate list of key=value members. */
static bool
check_tracestate(char **newval, void **extra, GucSource source)
{
	const char *p = *newval ? *newval : "";
	int			members = 0;

	if (*p == '\0')
		return true;
	if (strlen(p) > TRACESTATE_MAX_BYTES)
	{
		GUC_check_errdetail("A tracestate has at most %d bytes.", TRACESTATE_MAX_BYTES);
		return false;
	}
	for (;;)
	{
		const char *next = strchr(p, ',');
		const char *end = next ? next : p + strlen(p);

		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		/* Empty members are allowed and ignored. */
		if (end > p && (!valid_tracestate_member(p, end) || ++members > TRACESTATE_MAX_MEMBERS))
		{
			GUC_check_errdetail("A tracestate is a comma-separated list of at most %d key=value members "
								"(keys: lowercase letters, digits, '_', '-', '*', '/', '@'; values: printable ASCII except ',' and '=').",
								TRACESTATE_MAX_MEMBERS);
			return false;
		}
		if (next == NULL)
			return true;
		p = next + 1;
	}
}

/* The default topic must not be empty. */
static bool
check_default_topic(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
	{
		GUC_check_errdetail("The default topic must not be empty.");
		return false;
	}
	return true;
}

/* The dead-letter topic must be a topic outbox_emit() could name. */
static bool
check_dead_letter_topic(char **newval, void **extra, GucSource source)
{
	const char *err = outbox_topic_error(*newval);

	if (err != NULL)
	{
		GUC_check_errdetail("%s", err);
		return false;
	}
	return true;
}

/* Settings of outbox_emit(); called from _PG_init(). */
void
outbox_define_emit_settings(void)
{
	DefineCustomStringVariable("outbox.default_topic",
							   "Topic of events emitted without one; {aggregate_type} is replaced.",
							   "The default routes like Debezium's outbox event router.",
							   &outbox_default_topic,
							   "outbox.event.{aggregate_type}",
							   PGC_SUSET,
							   0,
							   check_default_topic, NULL, NULL);

	DefineCustomIntVariable("outbox.max_payload_bytes",
							"Largest payload outbox_emit() accepts, as JSON text.",
							NULL,
							&outbox_max_payload_bytes,
							1024 * 1024, 1, MaxAllocSize / 2,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	/* Read by the publisher too; outbox_emit() refuses it as a topic. */
	DefineCustomStringVariable("outbox.dead_letter_topic",
							   "Topic poison events are sent to under the dead_letter policy.",
							   NULL,
							   &outbox_dead_letter_topic,
							   "outbox.dead_letter",
							   PGC_SIGHUP,
							   0,
							   check_dead_letter_topic, NULL, NULL);

	DefineCustomStringVariable("outbox.allowed_topics",
							   "Topics outbox_emit() may write to: comma-separated patterns in which * matches any characters.",
							   "Kafka's internal topics (names beginning with __) and outbox.dead_letter_topic are refused "
							   "whatever this allows; an empty list allows no topic.",
							   &outbox_allowed_topics,
							   "*",
							   PGC_SUSET,
							   GUC_LIST_INPUT,
							   outbox_check_topic_patterns, NULL, NULL);
	DefineCustomStringVariable("outbox.traceparent",
							   "W3C traceparent that outbox_emit() adds to the headers of the events it writes.",
							   "Set by the application or its tracing instrumentation, e.g. with SET LOCAL; "
							   "a traceparent header given by the caller takes precedence.",
							   &outbox_traceparent,
							   "",
							   PGC_USERSET,
							   GUC_NOT_IN_SAMPLE,
							   check_traceparent, NULL, NULL);
	DefineCustomStringVariable("outbox.tracestate",
							   "W3C tracestate that outbox_emit() adds to the headers of the events it writes, with outbox.traceparent.",
							   NULL,
							   &outbox_tracestate,
							   "",
							   PGC_USERSET,
							   GUC_NOT_IN_SAMPLE,
							   check_tracestate, NULL, NULL);
}

/* The default topic: outbox.default_topic with {aggregate_type} replaced. */
char *
emit_default_topic(const char *aggregate_type)
{
	static const char placeholder[] = "{aggregate_type}";
	StringInfoData buf;
	const char *p = outbox_default_topic;
	const char *hit;

	initStringInfo(&buf);
	while ((hit = strstr(p, placeholder)) != NULL)
	{
		appendBinaryStringInfo(&buf, p, hit - p);
		appendStringInfoString(&buf, aggregate_type);
		p = hit + strlen(placeholder);
	}
	appendStringInfoString(&buf, p);
	return buf.data;
}

/* Drops the blanks around the header name [*name, *name + *len). */
static void
trim_blanks(const char **name, int *len)
{
	while (*len > 0 && scanner_isspace((*name)[0]))
	{
		(*name)++;
		(*len)--;
	}
	while (*len > 0 && scanner_isspace((*name)[*len - 1]))
		(*len)--;
}

/* Whether [name, name + len) is one of names, ignoring case. */
static bool
name_in(const char *name, int len, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (strlen(names[i]) == len && pg_strncasecmp(name, names[i], len) == 0)
			return true;
	return false;
}

/*
 * Whether a consumer could take a header name for one the publisher sets:
 * compared case-insensitively, ignoring surrounding blanks.
 */
static bool
header_is_reserved(const char *name, int len)
{
	int			prefix_len = strlen(OUTBOX_HEADER_DEAD_LETTER_PREFIX);

	trim_blanks(&name, &len);
	if (len >= prefix_len &&
		pg_strncasecmp(name, OUTBOX_HEADER_DEAD_LETTER_PREFIX, prefix_len) == 0)
		return true;
	return name_in(name, len, reserved_headers, lengthof(reserved_headers));
}

/*
 * Headers travel as Kafka record headers: a flat map of names to strings.
 * The identity and dead-letter headers are the publisher's, so callers may
 * not set them, nor anything a consumer could mistake for them.  Returns
 * what the headers add to the record, as librdkafka counts it.
 */
size_t
emit_validate_headers(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	   *key = NULL;
	size_t		bytes = 0;

	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: headers must be a JSON object"),
				 errdetail("Headers are sent as Kafka record headers: names mapped to string values.")));

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			key = pnstrdup(v.val.string.val, v.val.string.len);
			if (key[0] == '\0')
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("outbox_emit: header names must not be empty"),
						 errhidestmt(emit_hide_statement)));
			if (header_is_reserved(key, strlen(key)))
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("outbox_emit: header \"%s\" is reserved", emit_display(key)),
						 errdetail("The publisher sets id, event_id, event_type, aggregate_type, aggregate_id, aggregate_version and dead_letter_* itself; "
								   "names are compared case-insensitively, ignoring surrounding blanks."),
						 errhidestmt(emit_hide_statement)));
			bytes += v.val.string.len + KAFKA_HEADER_OVERHEAD;
		}
		else if (tok == WJB_VALUE && v.type != jbvString)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("outbox_emit: header \"%s\" must have a string value", emit_display(key)),
					 errhint("Convert numbers and booleans to strings, e.g. with to_jsonb(x::text)."),
					 errhidestmt(emit_hide_statement)));
		else if (tok == WJB_VALUE)
			bytes += v.val.string.len;
	}
	return bytes;
}

/*
 * What the publisher adds to every record besides the caller's headers: the
 * key and the identity headers, and the dead-letter headers in case the
 * event ends up there.
 */
size_t
emit_publisher_record_bytes(const char *aggregate_type, const char *aggregate_id,
							const char *event_type, const char *event_id,
							const char *topic)
{
	const char *const names[] = {
		OUTBOX_HEADER_ID, OUTBOX_HEADER_EVENT_ID, OUTBOX_HEADER_EVENT_TYPE,
		OUTBOX_HEADER_AGGREGATE_TYPE, OUTBOX_HEADER_AGGREGATE_ID,
		OUTBOX_HEADER_AGGREGATE_VERSION,
		OUTBOX_HEADER_DEAD_LETTER_ORIGINAL_TOPIC,
		OUTBOX_HEADER_DEAD_LETTER_ERROR, OUTBOX_HEADER_DEAD_LETTER_ATTEMPTS
	};
	const size_t values = 2 * strlen(event_id) + strlen(event_type) +
		strlen(aggregate_type) + strlen(aggregate_id) +
		20 /* version */ + strlen(topic) +
		OUTBOX_DEAD_LETTER_ERROR_MAX_BYTES + 10 /* attempts */ ;
	size_t		bytes = KAFKA_RECORD_OVERHEAD + strlen(aggregate_id) + values;

	for (int i = 0; i < lengthof(names); i++)
		bytes += strlen(names[i]) + KAFKA_HEADER_OVERHEAD;
	return bytes;
}

/*
 * Whether any text or jsonb argument of this call (all but the last, the
 * version) is larger than an identifier may be.
 */
bool
emit_has_huge_argument(FunctionCallInfo fcinfo)
{
	for (int i = 0; i < PG_NARGS() - 1; i++)
		if (!PG_ARGISNULL(i) &&
			toast_raw_datum_size(PG_GETARG_DATUM(i)) > OUTBOX_MAX_IDENTIFIER_BYTES + VARHDRSZ)
			return true;
	return false;
}

/*
 * The record must fit librdkafka's message.max.bytes with its key and all
 * headers, or the publisher could never send it.
 */
void
emit_check_record_size(size_t payload_bytes, size_t header_bytes, size_t publisher_bytes)
{
	int			max_bytes = outbox_kafka_message_max_bytes;
	size_t		total = payload_bytes + header_bytes + publisher_bytes;

	if (total > (size_t) max_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("outbox_emit: event is too large for Kafka (%zu bytes with its key and headers)", total),
				 errdetail("The producer's message.max.bytes is %d bytes; the payload has %zu, the caller's headers %zu, "
						   "the key, the publisher's headers and the record overhead %zu.",
						   max_bytes, payload_bytes, header_bytes, publisher_bytes),
				 errhint("message.max.bytes is set in outbox.kafka_properties, together with the broker's and topic's limits."),
				 errhidestmt(emit_hide_statement)));
}

/* Adds a text value to a JSONB object under construction. */
static void
push_string(JsonbParseState **state, JsonbIteratorToken tok, const char *str)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) str;
	v.val.string.len = strlen(str);
	(void) pushJsonbValue(state, tok, &v);
}

/*
 * Whether the caller's headers carry a trace context: a traceparent or
 * tracestate header, its name compared as header_is_reserved() does
 * (case-insensitively, ignoring surrounding blanks), as W3C Trace Context
 * names its HTTP headers and as consumers' propagators may read them.
 */
static bool
has_trace_header(Jsonb *headers)
{
	const char *const names[] = {OUTBOX_HEADER_TRACEPARENT, OUTBOX_HEADER_TRACESTATE};
	JsonbIterator *it = JsonbIteratorInit(&headers->root);
	JsonbIteratorToken tok;
	JsonbValue	v;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		const char *name = v.val.string.val;
		int			len = v.val.string.len;

		if (tok != WJB_KEY)
			continue;
		trim_blanks(&name, &len);
		if (name_in(name, len, names, lengthof(names)))
			return true;
	}
	return false;
}

/*
 * The headers with the session's trace context (outbox.traceparent and
 * outbox.tracestate) added, unless there is none or the caller set trace
 * headers of its own (in any letter case): then the caller's trace context
 * is kept whole, never mixed with the session's.
 */
Jsonb *
emit_add_trace_context(Jsonb *headers)
{
	JsonbParseState *state = NULL;
	Jsonb	   *trace;

	if (outbox_traceparent == NULL || outbox_traceparent[0] == '\0')
		return headers;
	if (headers != NULL)
	{
		/* A malformed headers argument is emit_validate_headers()'s to refuse. */
		if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
			return headers;
		if (has_trace_header(headers))
			return headers;
	}
	(void) pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	push_string(&state, WJB_KEY, OUTBOX_HEADER_TRACEPARENT);
	push_string(&state, WJB_VALUE, outbox_traceparent);
	if (outbox_tracestate != NULL && outbox_tracestate[0] != '\0')
	{
		push_string(&state, WJB_KEY, OUTBOX_HEADER_TRACESTATE);
		push_string(&state, WJB_VALUE, outbox_tracestate);
	}
	trace = JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
	if (headers == NULL)
		return trace;
	return DatumGetJsonbP(DirectFunctionCall2(jsonb_concat, JsonbPGetDatum(headers),
											  JsonbPGetDatum(trace)));
}

/* Bytes escape_json() writes for a JSON string, quotes included. */
static size_t
json_string_bytes(const char *p, int len)
{
	size_t		bytes = 2;

	for (const char *end = p + len; p < end; p++)
	{
		switch (*p)
		{
			case '\b':
			case '\f':
			case '\n':
			case '\r':
			case '\t':
			case '"':
			case '\\':
				bytes += 2;
				break;
			default:
				bytes += (unsigned char) *p < ' ' ? 6 : 1;	/* \u00XX */
				break;
		}
	}
	return bytes;
}

/* Bytes jsonb_out() writes for a scalar. */
static size_t
json_scalar_bytes(JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			return 4;
		case jbvBool:
			return v->val.boolean ? 4 : 5;
		case jbvString:
			return json_string_bytes(v->val.string.val, v->val.string.len);
		case jbvNumeric:
			return strlen(DatumGetCString(DirectFunctionCall1(numeric_out,
															  NumericGetDatum(v->val.numeric))));
		default:
			elog(ERROR, "unexpected jsonb scalar type %d", (int) v->type);
	}
	return 0;					/* keep compiler quiet */
}

/*
 * The length of jsonb's text (JsonbToCString()'s output) without writing
 * it: brackets, ", " between members, ": " after keys, escaped strings,
 * numbers as numeric_out() writes them.  A raw scalar is written alone.
 */
static size_t
jsonb_text_bytes(Jsonb *jb)
{
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbIteratorToken tok;
	JsonbValue	v;
	size_t		bytes = 0;

	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_ARRAY:
				if (!v.val.array.rawScalar)
					bytes += 2 + (v.val.array.nElems > 0 ? 2 * (v.val.array.nElems - 1) : 0);
				break;
			case WJB_BEGIN_OBJECT:
				bytes += 2 + (v.val.object.nPairs > 0 ? 2 * (v.val.object.nPairs - 1) : 0);
				break;
			case WJB_KEY:
				bytes += json_string_bytes(v.val.string.val, v.val.string.len) + 2;
				break;
			case WJB_VALUE:
			case WJB_ELEM:
				bytes += json_scalar_bytes(&v);
				break;
			default:
				break;
		}
	}
	return bytes;
}

/*
 * The payload's size as the publisher sends it: a raw (text or bytea)
 * payload's bytes, a JSON payload's text (computed, not rendered: that
 * cost as much as the rest of an emit for a payload of a few kB).
 * Refused over outbox.max_payload_bytes.
 */
size_t
emit_payload_size(Datum payload, bool raw)
{
	size_t		bytes;

	if (raw)
		bytes = toast_raw_datum_size(payload) - VARHDRSZ;
	else
		bytes = jsonb_text_bytes(DatumGetJsonbP(payload));
	if (bytes > (size_t) outbox_max_payload_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("outbox_emit: payload is too large (%zu bytes)", bytes),
				 errdetail("outbox.max_payload_bytes is %d bytes.",
						   outbox_max_payload_bytes),
				 errhint("Raise outbox.max_payload_bytes only together with the broker's and topic's message size limits."),
				 errhidestmt(emit_hide_statement)));
	return bytes;
}

