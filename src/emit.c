/*-------------------------------------------------------------------------
 *
 * emit.c
 *	  outbox_emit(): validate an event, assign its aggregate version and
 *	  write it to the outbox in the caller's transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/time.h>

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "parser/scansup.h"
#include "port/pg_bswap.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
#include "utils/uuid.h"

#include "compat.h"
#include "kafka.h"
#include "emit.h"
#include "outbox.h"
#include "record_headers.h"

PG_FUNCTION_INFO_V1(outbox_emit);
PG_FUNCTION_INFO_V1(outbox_emit_raw);
PG_FUNCTION_INFO_V1(outbox_emit_many);
PG_FUNCTION_INFO_V1(outbox_uuid_v7);
PG_FUNCTION_INFO_V1(outbox_check_arg);

/* Kafka's own limit on topic names (Topic.MAX_NAME_LENGTH). */
#define KAFKA_TOPIC_MAX_LEN 249

/*
 * Identifiers are indexed (unique btree entries must stay well below a
 * third of a page) and travel as the Kafka key and headers of every event.
 */
#define OUTBOX_MAX_IDENTIFIER_BYTES 1024

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
 * Plans are prepared once per backend, for the schema the extension lives
 * in; a re-created extension in another schema gets new plans.
 */
static Oid	plans_nspid = InvalidOid;
static SPIPlanPtr last_version_plan = NULL;
static SPIPlanPtr event_exists_plan = NULL;
static SPIPlanPtr insert_plan = NULL;

/*
 * RFC 9562 version 7: 48 bits of Unix milliseconds, then random bits.
 * Within one backend the 12 bits after the timestamp count sub-millisecond
 * calls so that ids from one session sort in creation order.
 */
static void
generate_uuid_v7(pg_uuid_t *uuid)
{
	static uint64 last_ms = 0;
	static uint16 seq = 0;
	struct timeval tv;
	uint64		ms;
	uint64		ms_be;

	gettimeofday(&tv, NULL);
	ms = (uint64) tv.tv_sec * 1000 + tv.tv_usec / 1000;
	if (ms <= last_ms)
	{
		/* Same millisecond (or clock stepped back): keep ids increasing. */
		if (++seq > 0x0fff)
		{
			seq = 0;
			last_ms++;
		}
		ms = last_ms;
	}
	else
	{
		last_ms = ms;
		seq = (uint16) (outbox_random_u32() & 0x07ff);
	}

	if (!pg_strong_random(uuid->data + 8, UUID_LEN - 8))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random values")));

	ms_be = pg_hton64(ms << 16);
	memcpy(uuid->data, &ms_be, 6);
	uuid->data[6] = 0x70 | ((seq >> 8) & 0x0f);
	uuid->data[7] = seq & 0xff;
	uuid->data[8] = (uuid->data[8] & 0x3f) | 0x80;	/* RFC 4122 variant */
}

Datum
outbox_uuid_v7(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));

	generate_uuid_v7(uuid);
	PG_RETURN_UUID_P(uuid);
}

/*
 * Set when an argument of the current call is larger than any valid
 * identifier: its errors then leave the statement out of the server log, so
 * that a megabyte argument is not logged again on every failed call.
 */
static bool hide_statement = false;

/*
 * A value as shown in an error message: cut (at a character boundary) after
 * OUTBOX_DISPLAY_BYTES bytes.
 */
static const char *
display(const char *value)
{
	int			len = strlen(value);

	if (len <= OUTBOX_DISPLAY_BYTES)
		return value;
	return psprintf("%.*s...", pg_mbcliplen(value, len, OUTBOX_DISPLAY_BYTES), value);
}

static void
check_identifier(const char *value, const char *name)
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
 * outbox_check_arg(name, value): the argument checks of inbox_claim() and
 * the operator functions.  In C so that an overlong value's error can leave
 * the statement, which repeats the value, out of the server log.
 */
Datum
outbox_check_arg(PG_FUNCTION_ARGS)
{
	char	   *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	int64		len;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", name)));
	len = toast_raw_datum_size(PG_GETARG_DATUM(1)) - VARHDRSZ;
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
	PG_RETURN_VOID();
}

static char *
required_text_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	char	   *value;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox_emit: %s must not be NULL", name)));
	value = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	check_identifier(value, name);
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
static void
validate_topic(const char *topic, const char *origin)
{
	const char *err = outbox_topic_error(topic);

	if (err != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: invalid topic name \"%s\"", display(topic)),
				 errdetail("%s", err),
				 errhint("The topic came from %s.", origin),
				 errhidestmt(hide_statement)));
	if (strncmp(topic, "__", 2) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox_emit: topic \"%s\" is internal to Kafka", topic),
				 errdetail("Topics whose names begin with \"__\", such as __consumer_offsets and __transaction_state, belong to Kafka itself."),
				 errhint("The topic came from %s.", origin),
				 errhidestmt(hide_statement)));
	if (outbox_dead_letter_topic != NULL &&
		same_kafka_topic(topic, outbox_dead_letter_topic))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox_emit: topic \"%s\" is the dead-letter topic", topic),
				 errdetail("Only the publisher writes to outbox.dead_letter_topic (Kafka treats '.' and '_' in topic names alike)."),
				 errhint("The topic came from %s.", origin),
				 errhidestmt(hide_statement)));
	if (!any_list_item(outbox_allowed_topics, pattern_matches, (void *) topic))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox_emit: topic \"%s\" is not allowed", topic),
				 errdetail("outbox.allowed_topics is \"%s\".", display(outbox_allowed_topics)),
				 errhint("The topic came from %s; a superuser can allow it in outbox.allowed_topics.", origin),
				 errhidestmt(hide_statement)));
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

static bool
check_allowed_topics(char **newval, void **extra, GucSource source)
{
	/* An empty list allows no topic. */
	if (*newval == NULL || (*newval)[strspn(*newval, " ")] == '\0')
		return true;
	return !any_list_item(*newval, bad_pattern, NULL);
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
							   check_allowed_topics, NULL, NULL);
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
static char *
default_topic(const char *aggregate_type)
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

/*
 * Whether a consumer could take a header name for one the publisher sets:
 * compared case-insensitively, ignoring surrounding blanks.
 */
static bool
header_is_reserved(const char *name, int len)
{
	int			prefix_len = strlen(OUTBOX_HEADER_DEAD_LETTER_PREFIX);

	while (len > 0 && scanner_isspace(name[0]))
	{
		name++;
		len--;
	}
	while (len > 0 && scanner_isspace(name[len - 1]))
		len--;
	if (len >= prefix_len &&
		pg_strncasecmp(name, OUTBOX_HEADER_DEAD_LETTER_PREFIX, prefix_len) == 0)
		return true;
	for (int i = 0; i < lengthof(reserved_headers); i++)
		if (strlen(reserved_headers[i]) == len &&
			pg_strncasecmp(name, reserved_headers[i], len) == 0)
			return true;
	return false;
}

/*
 * Headers travel as Kafka record headers: a flat map of names to strings.
 * The identity and dead-letter headers are the publisher's, so callers may
 * not set them, nor anything a consumer could mistake for them.  Returns
 * what the headers add to the record, as librdkafka counts it.
 */
static size_t
validate_headers(Jsonb *headers)
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
						 errhidestmt(hide_statement)));
			if (header_is_reserved(key, strlen(key)))
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("outbox_emit: header \"%s\" is reserved", display(key)),
						 errdetail("The publisher sets id, event_id, event_type, aggregate_type, aggregate_id, aggregate_version and dead_letter_* itself; "
								   "names are compared case-insensitively, ignoring surrounding blanks."),
						 errhidestmt(hide_statement)));
			bytes += v.val.string.len + KAFKA_HEADER_OVERHEAD;
		}
		else if (tok == WJB_VALUE && v.type != jbvString)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("outbox_emit: header \"%s\" must have a string value", display(key)),
					 errhint("Convert numbers and booleans to strings, e.g. with to_jsonb(x::text)."),
					 errhidestmt(hide_statement)));
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
static size_t
publisher_record_bytes(const char *aggregate_type, const char *aggregate_id,
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

static void
prepare_plans(Oid nspid)
{
	const char *nsp = quote_identifier(get_namespace_name(nspid));
	Oid			one_text[1] = {TEXTOID};
	Oid			insert_types[9] = {TEXTOID, TEXTOID, TEXTOID, INT8OID,
	TEXTOID, TEXTOID, JSONBOID, JSONBOID, BYTEAOID};
	SPIPlanPtr	plan;

	if (last_version_plan)
		SPI_freeplan(last_version_plan);
	if (event_exists_plan)
		SPI_freeplan(event_exists_plan);
	if (insert_plan)
		SPI_freeplan(insert_plan);
	last_version_plan = event_exists_plan = insert_plan = NULL;
	plans_nspid = InvalidOid;

	/*
	 * The last version lives in the outbox while any row of the aggregate is
	 * kept, and in aggregate_publication once retention deleted them all
	 * (only published rows are ever deleted).
	 */
	plan = SPI_prepare(psprintf("SELECT GREATEST("
								"(SELECT pg_catalog.max(o.aggregate_version) FROM %s.outbox o "
								"WHERE o.aggregate_id OPERATOR(pg_catalog.=) $1), "
								"(SELECT p.last_published_version FROM %s.aggregate_publication p "
								"WHERE p.aggregate_id OPERATOR(pg_catalog.=) $1))",
								nsp, nsp),
					   1, one_text);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	last_version_plan = plan;

	plan = SPI_prepare(psprintf("SELECT 1 FROM %s.outbox o WHERE o.event_id OPERATOR(pg_catalog.=) $1",
								nsp),
					   1, one_text);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	event_exists_plan = plan;

	/*
	 * Without a version, the insert assigns the next one itself: one
	 * statement instead of two on the common path.  Under READ COMMITTED
	 * its snapshot is taken after the lock was granted.  An aggregate at the
	 * largest bigint has no next version: then nothing is inserted.  (OFFSET
	 * 0 keeps the last version a subquery evaluated once, rather than
	 * inlined into each of its uses.)
	 */
	plan = SPI_prepare(psprintf("INSERT INTO %s.outbox (event_id, aggregate_id, aggregate_type, "
								"aggregate_version, event_type, topic, headers, payload, payload_bytes) "
								"SELECT $1, $2, $3, COALESCE($4, l.v OPERATOR(pg_catalog.+) 1), $5, $6, $7, $8, $9 "
								"FROM (SELECT COALESCE(GREATEST("
								"(SELECT pg_catalog.max(o.aggregate_version) FROM %s.outbox o "
								"WHERE o.aggregate_id OPERATOR(pg_catalog.=) $2), "
								"(SELECT p.last_published_version FROM %s.aggregate_publication p "
								"WHERE p.aggregate_id OPERATOR(pg_catalog.=) $2)), 0) AS v OFFSET 0) l "
								"WHERE $4 IS NOT NULL OR l.v OPERATOR(pg_catalog.<) " INT64_FORMAT " "
								"RETURNING id, aggregate_version",
								nsp, nsp, nsp, PG_INT64_MAX),
					   9, insert_types);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	insert_plan = plan;

	plans_nspid = nspid;
}

/* An aggregate at the largest version has no next one: never wrap around. */
static void
version_exhausted(const char *aggregate_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
			 errmsg("outbox_emit: aggregate \"%s\" has no version left", display(aggregate_id)),
			 errdetail("Its last version is " INT64_FORMAT ", the largest a bigint holds.", PG_INT64_MAX),
			 errhidestmt(hide_statement)));
}

/* The aggregate's last emitted version as seen by a snapshot; 0 if none. */
static int64
last_version(Datum aggregate_id, Snapshot snapshot)
{
	Datum		values[1] = {aggregate_id};
	bool		isnull;
	Datum		d;
	int			rc;

	if (snapshot != InvalidSnapshot)
		rc = SPI_execute_snapshot(last_version_plan, values, NULL, snapshot,
								  InvalidSnapshot, true, false, 1);
	else
		rc = SPI_execute_plan(last_version_plan, values, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox_emit: could not read the last version");
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? 0 : DatumGetInt64(d);
}

/*
 * Whether any text or jsonb argument of this call (all but the last, the
 * version) is larger than an identifier may be.
 */
static bool
has_huge_argument(FunctionCallInfo fcinfo)
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
static void
check_record_size(size_t payload_bytes, size_t header_bytes, size_t publisher_bytes)
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
				 errhidestmt(hide_statement)));
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
 * The headers with the session's trace context (outbox.traceparent and
 * outbox.tracestate) added, unless there is none or the caller set a
 * traceparent header: then the caller's trace context is kept whole.
 */
static Jsonb *
add_trace_context(Jsonb *headers)
{
	JsonbParseState *state = NULL;
	JsonbValue	key;
	Jsonb	   *trace;

	if (outbox_traceparent == NULL || outbox_traceparent[0] == '\0')
		return headers;
	if (headers != NULL)
	{
		/* A malformed headers argument is validate_headers()'s to refuse. */
		if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
			return headers;
		key.type = jbvString;
		key.val.string.val = OUTBOX_HEADER_TRACEPARENT;
		key.val.string.len = strlen(OUTBOX_HEADER_TRACEPARENT);
		if (findJsonbValueFromContainer(&headers->root, JB_FOBJECT, &key) != NULL)
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

/*
 * The payload's size as the publisher sends it: a raw (text or bytea)
 * payload's bytes, a JSON payload's text.  Refused over
 * outbox.max_payload_bytes.
 */
static size_t
payload_size(Datum payload, bool raw)
{
	size_t		bytes;

	if (raw)
		bytes = toast_raw_datum_size(payload) - VARHDRSZ;
	else
	{
		Jsonb	   *jb = DatumGetJsonbP(payload);
		char	   *json = JsonbToCString(NULL, &jb->root, VARSIZE(jb));

		bytes = strlen(json);
		pfree(json);
	}
	if (bytes > (size_t) outbox_max_payload_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("outbox_emit: payload is too large (%zu bytes)", bytes),
				 errdetail("outbox.max_payload_bytes is %d bytes.",
						   outbox_max_payload_bytes),
				 errhint("Raise outbox.max_payload_bytes only together with the broker's and topic's message size limits."),
				 errhidestmt(hide_statement)));
	return bytes;
}

/*
 * outbox_emit(aggregate_type, aggregate_id, event_type, payload,
 *			   topic, headers, event_id, aggregate_version), with a jsonb
 * payload, or a raw one (text or bytea, sent byte for byte) if raw.
 */
static Datum
emit_event(FunctionCallInfo fcinfo, bool raw)
{
	char	   *aggregate_type;
	char	   *aggregate_id;
	char	   *event_type;
	Datum		payload = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	Jsonb	   *headers = PG_ARGISNULL(5) ? NULL : PG_GETARG_JSONB_P(5);
	size_t		payload_bytes = 0;
	size_t		header_bytes = 0;
	char	   *topic;
	char	   *event_id;
	bool		version_given = !PG_ARGISNULL(7);
	int64		version = version_given ? PG_GETARG_INT64(7) : 0;
	int64		last = 0;
	Oid			nspid = get_func_namespace(fcinfo->flinfo->fn_oid);
	Datum		values[9];
	char		nulls[9];
	LOCKTAG		tag;
	TupleDesc	tupdesc;
	Datum		result[4];
	bool		result_nulls[4] = {false, false, false, false};
	int64		row_id;
	bool		isnull;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "outbox_emit must return a composite type");

	hide_statement = has_huge_argument(fcinfo);
	aggregate_type = required_text_arg(fcinfo, 0, "aggregate_type");
	aggregate_id = required_text_arg(fcinfo, 1, "aggregate_id");
	event_type = required_text_arg(fcinfo, 2, "event_type");

	if (PG_ARGISNULL(4))
	{
		topic = default_topic(aggregate_type);
		validate_topic(topic, "outbox.default_topic and the aggregate type");
	}
	else
	{
		topic = text_to_cstring(PG_GETARG_TEXT_PP(4));
		validate_topic(topic, "the topic argument");
	}

	headers = add_trace_context(headers);
	if (headers != NULL)
		header_bytes = validate_headers(headers);

	if (!PG_ARGISNULL(3))
		payload_bytes = payload_size(payload, raw);

	if (version_given && version <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: aggregate_version must be positive, not " INT64_FORMAT,
						version),
				 errhidestmt(hide_statement)));

	if (PG_ARGISNULL(6))
	{
		pg_uuid_t	uuid;

		generate_uuid_v7(&uuid);
		event_id = DatumGetCString(DirectFunctionCall1(uuid_out,
													   UUIDPGetDatum(&uuid)));
	}
	else
	{
		event_id = text_to_cstring(PG_GETARG_TEXT_PP(6));
		check_identifier(event_id, "event_id");
	}

	check_record_size(payload_bytes, header_bytes,
					  publisher_record_bytes(aggregate_type, aggregate_id,
											 event_type, event_id, topic));

	/*
	 * Serialize emitters of this aggregate until commit, so that versions
	 * are assigned in commit order and a rollback leaves no hole.
	 */
	outbox_aggregate_locktag(&tag, aggregate_id, strlen(aggregate_id),
							 OUTBOX_LOCKSPACE_EMIT);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (plans_nspid != nspid)
		prepare_plans(nspid);

	values[0] = CStringGetTextDatum(event_id);
	if (!PG_ARGISNULL(6))
	{
		if (SPI_execute_plan(event_exists_plan, values, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "outbox_emit: could not look up event_id");
		/* Which aggregate has it is not the caller's to know. */
		if (SPI_processed > 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNIQUE_VIOLATION),
					 errmsg("outbox_emit: event_id \"%s\" was already emitted", event_id),
					 errhint("A retried transaction whose first attempt committed emits the same event_id twice."),
					 errhidestmt(hide_statement)));
	}

	/*
	 * Under READ COMMITTED this query takes a snapshot after the lock was
	 * granted, so it sees every version committed before.  A transaction
	 * snapshot can be older than the commit that released the lock: then a
	 * newer version exists that this transaction cannot see, and only a
	 * retry of the whole transaction can assign the next one.
	 */
	values[1] = CStringGetTextDatum(aggregate_id);
	if (version_given || IsolationUsesXactSnapshot())
		last = last_version(values[1], InvalidSnapshot);
	if (IsolationUsesXactSnapshot())
	{
		int64		latest = last_version(values[1], GetLatestSnapshot());

		if (latest != last)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent outbox_emit"),
					 errdetail("Aggregate \"%s\" reached version " INT64_FORMAT " in a transaction that committed after this one's snapshot was taken.",
							   display(aggregate_id), latest),
					 errhint("The transaction might succeed if retried."),
					 errhidestmt(hide_statement)));
	}

	if (!version_given && IsolationUsesXactSnapshot())
	{
		if (last == PG_INT64_MAX)
			version_exhausted(aggregate_id);
		version = last + 1;
	}
	else if (version_given && version <= last)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: aggregate_version " INT64_FORMAT " is not above the last emitted version " INT64_FORMAT " of aggregate \"%s\"",
						version, last, display(aggregate_id)),
				 errhint("Omit aggregate_version to have the next version assigned."),
				 errhidestmt(hide_statement)));

	values[0] = CStringGetTextDatum(event_id);
	values[2] = CStringGetTextDatum(aggregate_type);
	values[3] = Int64GetDatum(version);	/* 0 and NULL: the insert assigns it */
	values[4] = CStringGetTextDatum(event_type);
	values[5] = CStringGetTextDatum(topic);
	values[6] = headers ? JsonbPGetDatum(headers) : (Datum) 0;
	/* A JSON payload goes to payload, a raw one to payload_bytes. */
	values[7] = raw ? (Datum) 0 : payload;
	values[8] = raw ? payload : (Datum) 0;
	memset(nulls, ' ', sizeof(nulls));
	if (version == 0)
		nulls[3] = 'n';
	if (!headers)
		nulls[6] = 'n';
	if (PG_ARGISNULL(3) || raw)
		nulls[7] = 'n';
	if (PG_ARGISNULL(3) || !raw)
		nulls[8] = 'n';
	/* values[1], the aggregate_id, was set above */

	if (SPI_execute_plan(insert_plan, values, nulls, false, 1) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "outbox_emit: insert failed");
	if (SPI_processed != 1)
		version_exhausted(aggregate_id);
	row_id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										 SPI_tuptable->tupdesc, 1, &isnull));
	version = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 2, &isnull));
	SPI_finish();

	outbox_note_emit();

	result[0] = Int64GetDatum(row_id);
	result[1] = CStringGetTextDatum(event_id);
	result[2] = Int64GetDatum(version);
	result[3] = CStringGetTextDatum(topic);
	tupdesc = BlessTupleDesc(tupdesc);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, result, result_nulls)));
}

/* outbox_emit(): an event with a JSON payload (or none). */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	return emit_event(fcinfo, false);
}

/*
 * outbox_emit_raw(): an event whose payload (text or bytea, both a varlena
 * of bytes) reaches Kafka exactly as given.
 */
Datum
outbox_emit_raw(PG_FUNCTION_ARGS)
{
	return emit_event(fcinfo, true);
}

/* Error context of outbox_emit_many(): which event failed. */
static void
emit_many_error_context(void *arg)
{
	errcontext("outbox_emit_many, event %d", *(int *) arg);
}

/*
 * outbox_emit_many(events outbox_event[]): each event, in array order, as
 * outbox_emit() would emit it, in one call (no statement per event).
 */
Datum
outbox_emit_many(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *events;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			nelems;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	TupleDesc	event_desc = NULL;
	int			current = 0;
	ErrorContextCallback errcallback;

	LOCAL_FCINFO(call, 8);

	InitMaterializedSRF(fcinfo, 0);
	if (PG_ARGISNULL(0))
		return (Datum) 0;
	events = PG_GETARG_ARRAYTYPE_P(0);
	get_typlenbyvalalign(ARR_ELEMTYPE(events), &typlen, &typbyval, &typalign);
	deconstruct_array(events, ARR_ELEMTYPE(events), typlen, typbyval, typalign,
					  &elems, &elem_nulls, &nelems);

	/* Each event is one outbox_emit() call, with this function's result type. */
	InitFunctionCallInfoData(*call, fcinfo->flinfo, 8, InvalidOid, NULL, NULL);
	errcallback.callback = emit_many_error_context;
	errcallback.arg = &current;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;
	for (int i = 0; i < nelems; i++)
	{
		HeapTupleHeader event;
		HeapTupleData tuple;
		Datum		args[8];
		bool		nulls[8];

		current = i + 1;
		if (elem_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("outbox_emit_many: event %d is NULL", i + 1)));
		event = DatumGetHeapTupleHeader(elems[i]);
		if (event_desc == NULL)
		{
			event_desc = lookup_rowtype_tupdesc_copy(HeapTupleHeaderGetTypeId(event),
													 HeapTupleHeaderGetTypMod(event));
			if (event_desc->natts != 8)
				elog(ERROR, "outbox_emit_many: outbox_event must have 8 fields");
		}
		tuple.t_len = HeapTupleHeaderGetDatumLength(event);
		ItemPointerSetInvalid(&tuple.t_self);
		tuple.t_tableOid = InvalidOid;
		tuple.t_data = event;
		heap_deform_tuple(&tuple, event_desc, args, nulls);
		for (int a = 0; a < 8; a++)
		{
			call->args[a].value = args[a];
			call->args[a].isnull = nulls[a];
		}

		event = DatumGetHeapTupleHeader(emit_event(call, false));
		tuple.t_len = HeapTupleHeaderGetDatumLength(event);
		tuple.t_data = event;
		tuplestore_puttuple(rsinfo->setResult, &tuple);
	}
	error_context_stack = errcallback.previous;
	return (Datum) 0;
}
