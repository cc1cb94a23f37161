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
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "parser/parse_relation.h"
#include "parser/scansup.h"
#include "port/pg_bswap.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
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
PG_FUNCTION_INFO_V1(outbox_emit_many_raw);
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
 * len (at most 64) bytes from pg_strong_random(), drawn 512 at a time: one
 * call costs as much as the rest of an event id.  Refilled in a new process
 * (never shared with a forked child).
 */
static void
strong_random_bytes(uint8 *buf, int len)
{
	static uint8 pool[512];
	static int	pool_left = 0;
	static int	pool_pid = 0;

	Assert(len <= 64);
	if (pool_left < len || pool_pid != MyProcPid)
	{
		if (!pg_strong_random(pool, sizeof(pool)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate random values")));
		pool_left = sizeof(pool);
		pool_pid = MyProcPid;
	}
	memcpy(buf, pool + sizeof(pool) - pool_left, len);
	/* Each byte is handed out once. */
	memset(pool + sizeof(pool) - pool_left, 0, len);
	pool_left -= len;
}

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

	strong_random_bytes(uuid->data + 8, UUID_LEN - 8);

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
	if (!outbox_topic_matches_list(topic, outbox_allowed_topics))
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

/*
 * The columns outbox_emit() sets; every other column of the outbox gets its
 * default (the id from its identity sequence, created_at...), so a column
 * with a default needs no change here, and one emit sets needs one line in
 * each of these two lists.
 */
typedef enum EmitColumn
{
	COL_EVENT_ID,
	COL_AGGREGATE_TYPE,
	COL_AGGREGATE_ID,
	COL_AGGREGATE_VERSION,
	COL_EVENT_TYPE,
	COL_TOPIC,
	COL_HEADERS,
	COL_PAYLOAD,
	COL_PAYLOAD_BYTES,
	EMIT_NCOLUMNS
} EmitColumn;

static const char *const emit_column_names[EMIT_NCOLUMNS] = {
	"event_id", "aggregate_type", "aggregate_id", "aggregate_version",
	"event_type", "topic", "headers", "payload", "payload_bytes"
};

/*
 * What outbox_emit() needs of the extension's tables, looked up once per
 * backend rather than per call (the reason it does not go through SPI:
 * parsing, planning and executor start-up cost more than the insert).
 * Reset by any relcache invalidation of the two tables, which also covers
 * their indexes, defaults and owner changing; rebuilt on the next call.
 */
typedef struct EmitRelations
{
	bool		valid;
	Oid			nspid;			/* the extension's schema */
	Oid			outbox;
	Oid			owner;			/* the outbox's owner, who writes it */
	Oid			position_index; /* unique (aggregate_id, aggregate_version) */
	Oid			event_id_index; /* unique (event_id) */
	AttrNumber	attnums[EMIT_NCOLUMNS];
	AttrNumber	id_attnum;
	int			ndefaults;
	OutboxColumnDefault *defaults; /* of the columns outbox_emit() leaves */
	Oid			publication;	/* aggregate_publication */
	Oid			publication_pkey;	/* (aggregate_id) */
	AttrNumber	last_published_attnum;
	int			nindexes;		/* the outbox's indexes */
	Oid		   *index_oids;
	IndexInfo **index_infos;	/* NULL: built per call */
	MemoryContext cxt;			/* the defaults and index infos */
} EmitRelations;

static EmitRelations rels;

/* Set by an invalidation of the tables while load_relations() runs. */
static bool rels_invalidated = false;

/*
 * The last version this transaction assigned, to the aggregate it emitted
 * to last, and the row that has it.  The transaction holds that
 * aggregate's lock since then, so no other can have added a version: while
 * the row is still visible to it, it is the last one, and the next event of
 * the aggregate (outbox_emit_many(), a statement emitting many events)
 * needs no look-up.  Forgotten when the transaction ends, when a
 * subtransaction aborts (the lock may have gone with it) and when the
 * tables are looked up again.
 */
static struct
{
	bool		valid;
	int64		version;
	ItemPointerData tid;
	char		aggregate_id[OUTBOX_MAX_IDENTIFIER_BYTES + 1];
} last_emit;

/* Transaction callback: last_emit is valid within one transaction only. */
static void
emit_xact_callback(XactEvent event, void *arg)
{
	last_emit.valid = false;
}

/* Subtransaction callback: an abort may have released the lock. */
static void
emit_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		last_emit.valid = false;
}

/* Whether relid is one of the outbox's indexes. */
static bool
is_outbox_index(Oid relid)
{
	for (int i = 0; i < rels.nindexes; i++)
		if (rels.index_oids[i] == relid)
			return true;
	return false;
}

/*
 * Relcache invalidation callback: forget the tables if either changed, or
 * an index of the outbox did (becoming ready for inserts, say).
 */
static void
emit_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == rels.outbox || relid == rels.publication ||
		is_outbox_index(relid))
	{
		rels.valid = false;
		rels_invalidated = true;
		last_emit.valid = false;
	}
}

/* A column of an extension table, or an error if it is missing. */
static AttrNumber
required_attnum(Relation rel, const char *name)
{
	AttrNumber	attnum = attnameAttNum(rel, name, false);

	if (attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("outbox_emit: column \"%s\" of table \"%s\" is missing",
						name, RelationGetRelationName(rel)),
				 errhint("Re-create the outbox extension.")));
	return attnum;
}

/*
 * The valid unique btree index of rel on exactly these columns, in this
 * order, or an error.
 */
static Oid
required_unique_index(Relation rel, int natts, const AttrNumber *attnums)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index form = index->rd_index;
		bool		match = form->indisunique && form->indisvalid &&
			form->indimmediate && index->rd_rel->relam == BTREE_AM_OID &&
			form->indnkeyatts == natts && RelationGetIndexPredicate(index) == NIL;

		for (int i = 0; match && i < natts; i++)
			match = form->indkey.values[i] == attnums[i];
		index_close(index, AccessShareLock);
		if (match)
			return lfirst_oid(lc);
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("outbox_emit: a unique index of table \"%s\" is missing",
					RelationGetRelationName(rel)),
			 errhint("Re-create the outbox extension.")));
	return InvalidOid;			/* keep compiler quiet */
}

/* A table of the extension, opened, or an error if it is missing. */
static Relation
open_extension_table(const char *name, Oid nspid)
{
	Oid			relid = get_relname_relid(name, nspid);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("outbox_emit: table \"%s\" of the outbox extension is missing", name),
				 errhint("Re-create the outbox extension.")));
	return table_open(relid, AccessShareLock);
}

/*
 * The outbox's indexes, with the IndexInfo of each plain btree index (no
 * expression) built once per backend, its predicate ready to evaluate,
 * rather than by ExecOpenIndices() and ExecInsertIndexTuples() on every
 * call.  Other indexes an administrator may add get theirs per call: their
 * access methods may keep per-call state in it.
 */
static void
load_indexes(Relation rel)
{
	List	   *oids = RelationGetIndexList(rel);
	MemoryContext old = MemoryContextSwitchTo(rels.cxt);
	ListCell   *lc;

	rels.index_oids = palloc(sizeof(Oid) * Max(list_length(oids), 1));
	rels.index_infos = palloc0(sizeof(IndexInfo *) * Max(list_length(oids), 1));
	foreach(lc, oids)
	{
		int			i = rels.nindexes;
		Relation	index;

		/* Known before it is opened: an invalidation meanwhile counts. */
		rels.index_oids[i] = lfirst_oid(lc);
		rels.nindexes++;
		index = index_open(lfirst_oid(lc), AccessShareLock);
		if (index->rd_rel->relam == BTREE_AM_OID && RelationGetIndexExpressions(index) == NIL)
		{
			IndexInfo  *info = BuildIndexInfo(index);

			if (info->ii_Predicate != NIL)
				info->ii_PredicateState =
					ExecInitQual((List *) expression_planner((Expr *) info->ii_Predicate), NULL);
			rels.index_infos[i] = info;
		}
		index_close(index, AccessShareLock);
	}
	MemoryContextSwitchTo(old);
}

/*
 * Opens the outbox's indexes for inserts into rri, as ExecOpenIndices()
 * does, with the IndexInfos load_indexes() built.
 */
static void
open_indexes(ResultRelInfo *rri)
{
	rri->ri_NumIndices = rels.nindexes;
	rri->ri_IndexRelationDescs = palloc(sizeof(Relation) * Max(rels.nindexes, 1));
	rri->ri_IndexRelationInfo = palloc(sizeof(IndexInfo *) * Max(rels.nindexes, 1));
	for (int i = 0; i < rels.nindexes; i++)
	{
		Relation	index = index_open(rels.index_oids[i], RowExclusiveLock);

		rri->ri_IndexRelationDescs[i] = index;
		rri->ri_IndexRelationInfo[i] = rels.index_infos[i] ? rels.index_infos[i] :
			BuildIndexInfo(index);
	}
}

/* The defaults of the outbox's columns that outbox_emit() does not set. */
static void
load_defaults(Relation rel)
{
	MemoryContext old = MemoryContextSwitchTo(rels.cxt);

	rels.defaults = palloc(sizeof(OutboxColumnDefault) * RelationGetDescr(rel)->natts);
	rels.ndefaults = outbox_column_defaults(rel, rels.attnums, EMIT_NCOLUMNS, rels.defaults);
	MemoryContextSwitchTo(old);
}

/* Looks up the extension's tables in schema nspid. */
static void
load_relations(Oid nspid)
{
	Relation	rel;
	AttrNumber	key[2];

	if (rels.cxt == NULL)
	{
		rels.cxt = AllocSetContextCreate(CacheMemoryContext, "outbox_emit relations",
										 ALLOCSET_SMALL_SIZES);
		CacheRegisterRelcacheCallback(emit_relcache_callback, (Datum) 0);
		RegisterXactCallback(emit_xact_callback, NULL);
		RegisterSubXactCallback(emit_subxact_callback, NULL);
	}
	MemoryContextReset(rels.cxt);
	/* Valid only once complete (an error leaves it invalid) and current. */
	rels.valid = false;
	last_emit.valid = false;
	rels_invalidated = false;
	rels.outbox = rels.publication = InvalidOid;
	rels.nindexes = 0;

	rel = open_extension_table("outbox", nspid);
	rels.outbox = RelationGetRelid(rel);
	rels.owner = rel->rd_rel->relowner;
	for (int c = 0; c < EMIT_NCOLUMNS; c++)
		rels.attnums[c] = required_attnum(rel, emit_column_names[c]);
	rels.id_attnum = required_attnum(rel, "id");
	key[0] = rels.attnums[COL_AGGREGATE_ID];
	key[1] = rels.attnums[COL_AGGREGATE_VERSION];
	rels.position_index = required_unique_index(rel, 2, key);
	rels.event_id_index = required_unique_index(rel, 1, &rels.attnums[COL_EVENT_ID]);
	load_defaults(rel);
	load_indexes(rel);
	table_close(rel, AccessShareLock);

	rel = open_extension_table("aggregate_publication", nspid);
	rels.publication = RelationGetRelid(rel);
	key[0] = required_attnum(rel, "aggregate_id");
	rels.publication_pkey = required_unique_index(rel, 1, key);
	rels.last_published_attnum = required_attnum(rel, "last_published_version");
	table_close(rel, AccessShareLock);

	/* An invalidation that arrived meanwhile makes the next call reload. */
	rels.nspid = nspid;
	rels.valid = !rels_invalidated;
}

/*
 * The outbox and aggregate_publication opened for the events of one call
 * (one outbox_emit(), or every event of an outbox_emit_many()), by the
 * first of them, under its aggregate's lock.  The look-ups use the indexes
 * the insert opens anyway.
 */
typedef struct EmitTarget
{
	MemoryContext cxt;			/* lives as long as the call */
	bool		open;
	Relation	rel;			/* the outbox */
	EState	   *estate;
	ResultRelInfo *rri;
	Relation	position_index; /* rri's, not opened again */
	Relation	event_id_index; /* rri's */
	TupleTableSlot *slot;		/* the new row */
	TupleTableSlot *found;		/* an outbox row a look-up reads */
	ExprState **defaults;		/* rels.defaults, ready to evaluate */
	Relation	publication;
	Relation	publication_pkey;
	TupleTableSlot *found_publication;
} EmitTarget;

/* Opens the tables for the events of a call (t->cxt set by the caller). */
static void
open_target(EmitTarget *t, Oid nspid)
{
	MemoryContext old_cxt = MemoryContextSwitchTo(t->cxt);
	TupleDesc	desc;

	if (!rels.valid || rels.nspid != nspid)
		load_relations(nspid);
	t->rel = table_open(rels.outbox, RowExclusiveLock);
	t->publication = table_open(rels.publication, AccessShareLock);
	/* Taking the locks may have processed an invalidation of the tables. */
	if (!rels.valid)
		load_relations(nspid);
	if (rels.outbox != RelationGetRelid(t->rel) ||
		rels.publication != RelationGetRelid(t->publication))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox_emit: the outbox extension's tables were replaced concurrently"),
				 errhint("Retry the transaction.")));
	desc = RelationGetDescr(t->rel);

	t->estate = outbox_simple_estate(t->rel, RowExclusiveLock);
	t->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(t->rri, t->rel, 1, NULL, 0);
	open_indexes(t->rri);
	t->position_index = t->event_id_index = NULL;
	for (int i = 0; i < t->rri->ri_NumIndices; i++)
	{
		Relation	index = t->rri->ri_IndexRelationDescs[i];

		if (RelationGetRelid(index) == rels.position_index)
			t->position_index = index;
		else if (RelationGetRelid(index) == rels.event_id_index)
			t->event_id_index = index;
	}
	if (t->position_index == NULL || t->event_id_index == NULL)
		elog(ERROR, "outbox_emit: a unique index of the outbox is not open");
	t->publication_pkey = index_open(rels.publication_pkey, AccessShareLock);

	MemoryContextSwitchTo(t->estate->es_query_cxt);
	t->slot = ExecInitExtraTupleSlot(t->estate, desc, &TTSOpsVirtual);
	t->found = table_slot_create(t->rel, &t->estate->es_tupleTable);
	t->found_publication = table_slot_create(t->publication, &t->estate->es_tupleTable);
	t->defaults = palloc(sizeof(ExprState *) * Max(rels.ndefaults, 1));
	for (int i = 0; i < rels.ndefaults; i++)
		t->defaults[i] = ExecInitExpr(rels.defaults[i].expr, NULL);
	MemoryContextSwitchTo(old_cxt);
	t->open = true;
}

/* Closes what open_target() opened, if it did. */
static void
close_target(EmitTarget *t)
{
	if (!t->open)
		return;
	/* The relations a trigger's firing opened (ExecGetTriggerResultRel). */
	ExecCloseResultRelations(t->estate);
	ExecCloseIndices(t->rri);
	ExecResetTupleTable(t->estate->es_tupleTable, false);
	FreeExecutorState(t->estate);
	index_close(t->publication_pkey, NoLock);
	table_close(t->publication, NoLock);
	table_close(t->rel, NoLock);
	t->open = false;
}

/*
 * Inserts the event (values and nulls indexed by EmitColumn) into the
 * outbox the way logical replication's apply worker inserts a row: the
 * relation's own insert, index, constraint and trigger code, without a
 * plan.  Returns the new row's id, and where it is in *tid.
 */
static int64
insert_event(EmitTarget *t, const Datum *values, const bool *nulls, ItemPointer tid)
{
	EState	   *estate = t->estate;
	ExprContext *econtext = GetPerTupleExprContext(estate);
	TupleTableSlot *slot = t->slot;
	MemoryContext old_cxt;
	bool		isnull;
	int64		id;

	/* Per event, not per call of outbox_emit_many(). */
	old_cxt = MemoryContextSwitchTo(econtext->ecxt_per_tuple_memory);
	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, sizeof(bool) * slot->tts_tupleDescriptor->natts);
	for (int c = 0; c < EMIT_NCOLUMNS; c++)
	{
		slot->tts_values[rels.attnums[c] - 1] = values[c];
		slot->tts_isnull[rels.attnums[c] - 1] = nulls[c];
	}
	for (int i = 0; i < rels.ndefaults; i++)
	{
		AttrNumber	attnum = rels.defaults[i].attnum;

		slot->tts_values[attnum - 1] = ExecEvalExpr(t->defaults[i], econtext,
													&slot->tts_isnull[attnum - 1]);
	}
	ExecStoreVirtualTuple(slot);
	MemoryContextSwitchTo(old_cxt);

	estate->es_output_cid = GetCurrentCommandId(true);
	AfterTriggerBeginQuery();
	outbox_simple_insert(t->rri, estate, slot);
	AfterTriggerEndQuery(estate);
	id = DatumGetInt64(slot_getattr(slot, rels.id_attnum, &isnull));
	*tid = slot->tts_tid;
	ExecClearTuple(slot);
	ResetPerTupleExprContext(estate);

	/* Later emits of this statement (emit_many, a query) must see it. */
	CommandCounterIncrement();
	return id;
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

/*
 * Whether heap has a row visible to snapshot whose first index column
 * equals key (text); the first in index order (backwards if backward).
 * If so, column attnum (bigint) of it in *value unless value is NULL.
 */
static bool
index_first_value(Relation heap, Relation index, TupleTableSlot *slot, Datum key,
				  Snapshot snapshot, bool backward, AttrNumber attnum, int64 *value)
{
	IndexScanDesc scan;
	ScanKeyData skey;
	bool		found;
	bool		isnull;

	ScanKeyEntryInitialize(&skey, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ, key);
	scan = outbox_index_beginscan(heap, index, snapshot, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	found = index_getnext_slot(scan, backward ? BackwardScanDirection : ForwardScanDirection,
							   slot);
	if (found && value != NULL)
	{
		Datum		d = slot_getattr(slot, attnum, &isnull);

		found = !isnull;
		if (found)
			*value = DatumGetInt64(d);
	}
	index_endscan(scan);
	/* Releases the heap page. */
	ExecClearTuple(slot);
	return found;
}

/*
 * The aggregate's last emitted version as seen by a snapshot; 0 if none.
 * It is in the outbox while any row of the aggregate is kept (the last
 * entry of the position index), and in aggregate_publication once
 * retention deleted them all (only published rows are ever deleted).
 */
static int64
last_version(EmitTarget *t, Datum aggregate_id, Snapshot snapshot)
{
	int64		in_outbox = 0;
	int64		published = 0;

	(void) index_first_value(t->rel, t->position_index, t->found, aggregate_id, snapshot,
							 true, rels.attnums[COL_AGGREGATE_VERSION], &in_outbox);
	(void) index_first_value(t->publication, t->publication_pkey, t->found_publication,
							 aggregate_id, snapshot, false, rels.last_published_attnum,
							 &published);
	return Max(in_outbox, published);
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
static Jsonb *
add_trace_context(Jsonb *headers)
{
	JsonbParseState *state = NULL;
	Jsonb	   *trace;

	if (outbox_traceparent == NULL || outbox_traceparent[0] == '\0')
		return headers;
	if (headers != NULL)
	{
		/* A malformed headers argument is validate_headers()'s to refuse. */
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
static size_t
payload_size(Datum payload, bool raw)
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
				 errhidestmt(hide_statement)));
	return bytes;
}

/*
 * The aggregate's last version under the aggregate's lock: from last_emit
 * if this transaction emitted to it last and that row is still there, else
 * looked up.  Under REPEATABLE READ or SERIALIZABLE, a serialization
 * failure if a version was committed after the transaction's snapshot.
 */
static int64
locked_last_version(EmitTarget *t, Datum aggregate_id, const char *aggregate_id_str,
					Snapshot snapshot)
{
	int64		last;

	if (last_emit.valid && strcmp(last_emit.aggregate_id, aggregate_id_str) == 0 &&
		table_tuple_fetch_row_version(t->rel, &last_emit.tid, snapshot, t->found))
	{
		ExecClearTuple(t->found);
		return last_emit.version;
	}

	last = last_version(t, aggregate_id, snapshot);
	if (IsolationUsesXactSnapshot())
	{
		int64		latest = last_version(t, aggregate_id, GetLatestSnapshot());

		if (latest != last)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent outbox_emit"),
					 errdetail("Aggregate \"%s\" reached version " INT64_FORMAT " in a transaction that committed after this one's snapshot was taken.",
							   display(aggregate_id_str), latest),
					 errhint("The transaction might succeed if retried."),
					 errhidestmt(hide_statement)));
	}
	return last;
}

/*
 * The version the event gets, read under the aggregate's lock: the next
 * one, or the caller's if above the last.  Checks a caller-given event_id
 * is new (event_id_given) for a clearer error than the unique index's.
 */
static int64
assign_version(EmitTarget *t, Datum aggregate_id, const char *aggregate_id_str,
			   Datum event_id, bool event_id_given, int64 version)
{
	Snapshot	snapshot;
	int64		last;

	/*
	 * Under READ COMMITTED this is a new snapshot, taken after the lock was
	 * granted, so it sees every version committed before.  A transaction
	 * snapshot can be older than the commit that released the lock: then a
	 * newer version exists that this transaction cannot see, and only a
	 * retry of the whole transaction can assign the next one.
	 */
	PushCopiedSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	snapshot = GetActiveSnapshot();

	/* Which aggregate has it is not the caller's to know. */
	if (event_id_given &&
		index_first_value(t->rel, t->event_id_index, t->found, event_id, snapshot,
						  false, InvalidAttrNumber, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("outbox_emit: event_id \"%s\" was already emitted",
						display(TextDatumGetCString(event_id))),
				 errhint("A retried transaction whose first attempt committed emits the same event_id twice."),
				 errhidestmt(hide_statement)));

	last = locked_last_version(t, aggregate_id, aggregate_id_str, snapshot);
	PopActiveSnapshot();

	if (version == 0)
	{
		if (last == PG_INT64_MAX)
			version_exhausted(aggregate_id_str);
		return last + 1;
	}
	if (version <= last)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: aggregate_version " INT64_FORMAT " is not above the last emitted version " INT64_FORMAT " of aggregate \"%s\"",
						version, last, display(aggregate_id_str)),
				 errhint("Omit aggregate_version to have the next version assigned."),
				 errhidestmt(hide_statement)));
	return version;
}

/* A validated event, as emit_event() writes it. */
typedef struct EmitArgs
{
	char	   *aggregate_type;
	char	   *aggregate_id;
	char	   *event_type;
	char	   *topic;
	char	   *event_id;
	bool		event_id_given; /* else a new uuid_v7 */
	Jsonb	   *headers;		/* NULL: none */
	Datum		payload;		/* jsonb, text or bytea */
	bool		payload_null;
	bool		raw;			/* payload is text or bytea */
	int64		version;		/* 0: the next one */
} EmitArgs;

/*
 * Serializes emitters of an aggregate until commit, so that versions are
 * assigned in commit order and a rollback leaves no hole.
 */
static void
lock_aggregate(const char *aggregate_id)
{
	LOCKTAG		tag;

	outbox_aggregate_locktag(&tag, aggregate_id, strlen(aggregate_id),
							 OUTBOX_LOCKSPACE_EMIT);
	/* Not waiting can fail only for want of room in the lock table. */
	if (outbox_lock_acquire(&tag, ExclusiveLock, false, false) ==
		LOCKACQUIRE_NOT_AVAIL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("outbox_emit: no room in the lock table for the lock of aggregate \"%s\"",
						display(aggregate_id)),
				 errdetail("Each aggregate a transaction emits to stays locked until the transaction ends; "
						   "the server's lock table holds about max_locks_per_transaction * (max_connections + max_prepared_transactions) locks."),
				 errhint("Emit to fewer aggregates per transaction, or raise max_locks_per_transaction."),
				 errhidestmt(hide_statement)));
}

/*
 * Writes the event to the outbox under its aggregate's lock, as the
 * outbox's owner (outbox_emit is not SECURITY DEFINER: this is the one
 * place that needs the owner's rights, and does only what is checked
 * above).  Fills result (emitted_event).
 */
static void
write_event(EmitArgs *a, EmitTarget *t, Oid nspid, Datum *result)
{
	Datum		values[EMIT_NCOLUMNS];
	bool		nulls[EMIT_NCOLUMNS];
	ItemPointerData tid;
	Oid			save_userid;
	int			save_sec_context;

	/* The relation path below checks nothing of the kind itself. */
	PreventCommandIfReadOnly("outbox_emit()");

	lock_aggregate(a->aggregate_id);
	if (!t->open)
		open_target(t, nspid);

	memset(nulls, false, sizeof(nulls));
	values[COL_EVENT_ID] = CStringGetTextDatum(a->event_id);
	values[COL_AGGREGATE_TYPE] = CStringGetTextDatum(a->aggregate_type);
	values[COL_AGGREGATE_ID] = CStringGetTextDatum(a->aggregate_id);
	values[COL_EVENT_TYPE] = CStringGetTextDatum(a->event_type);
	values[COL_TOPIC] = CStringGetTextDatum(a->topic);
	values[COL_HEADERS] = PointerGetDatum(a->headers);
	nulls[COL_HEADERS] = a->headers == NULL;
	/* A JSON payload goes to payload, a raw one to payload_bytes. */
	values[COL_PAYLOAD] = values[COL_PAYLOAD_BYTES] = a->payload;
	nulls[COL_PAYLOAD] = a->payload_null || a->raw;
	nulls[COL_PAYLOAD_BYTES] = a->payload_null || !a->raw;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(rels.owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE);
	a->version = assign_version(t, values[COL_AGGREGATE_ID], a->aggregate_id,
								values[COL_EVENT_ID], a->event_id_given, a->version);
	values[COL_AGGREGATE_VERSION] = Int64GetDatum(a->version);
	/* A trigger on the outbox may emit meanwhile: then its event is the last. */
	last_emit.valid = false;
	result[0] = Int64GetDatum(insert_event(t, values, nulls, &tid));
	SetUserIdAndSecContext(save_userid, save_sec_context);

	if (!last_emit.valid)
	{
		last_emit.valid = true;
		last_emit.version = a->version;
		last_emit.tid = tid;
		strlcpy(last_emit.aggregate_id, a->aggregate_id, sizeof(last_emit.aggregate_id));
	}

	result[1] = values[COL_EVENT_ID];
	result[2] = Int64GetDatum(a->version);
	result[3] = values[COL_TOPIC];
}

/* What emit_event() keeps for the calls of one query. */
typedef struct EmitCallInfo
{
	TupleDesc	tupdesc;		/* emitted_event, blessed */
	Oid			nspid;			/* the extension's schema */
} EmitCallInfo;

/* The call's EmitCallInfo, made by its first call. */
static EmitCallInfo *
emit_call_info(FunctionCallInfo fcinfo)
{
	EmitCallInfo *info = fcinfo->flinfo->fn_extra;
	MemoryContext old_cxt;
	TupleDesc	tupdesc;

	if (info != NULL)
		return info;
	old_cxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "outbox_emit must return a composite type");
	info = palloc(sizeof(EmitCallInfo));
	info->tupdesc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
	info->nspid = get_func_namespace(fcinfo->flinfo->fn_oid);
	MemoryContextSwitchTo(old_cxt);
	fcinfo->flinfo->fn_extra = info;
	return info;
}

/*
 * outbox_emit(aggregate_type, aggregate_id, event_type, payload,
 *			   topic, headers, event_id, aggregate_version), with a jsonb
 * payload, or a raw one (text or bytea, sent byte for byte) if raw; into
 * target, or into the outbox opened for this call if target is NULL.
 */
static Datum
emit_event(FunctionCallInfo fcinfo, bool raw, EmitTarget *target)
{
	EmitCallInfo *info = emit_call_info(fcinfo);
	EmitArgs	a;
	EmitTarget	own_target;
	size_t		payload_bytes = 0;
	size_t		header_bytes = 0;
	Datum		result[4];
	bool		result_nulls[4] = {false, false, false, false};

	hide_statement = has_huge_argument(fcinfo);
	a.raw = raw;
	a.aggregate_type = required_text_arg(fcinfo, 0, "aggregate_type");
	a.aggregate_id = required_text_arg(fcinfo, 1, "aggregate_id");
	a.event_type = required_text_arg(fcinfo, 2, "event_type");

	if (PG_ARGISNULL(4))
	{
		a.topic = default_topic(a.aggregate_type);
		validate_topic(a.topic, "outbox.default_topic and the aggregate type");
	}
	else
	{
		a.topic = text_to_cstring(PG_GETARG_TEXT_PP(4));
		validate_topic(a.topic, "the topic argument");
	}

	a.headers = add_trace_context(PG_ARGISNULL(5) ? NULL : PG_GETARG_JSONB_P(5));
	if (a.headers != NULL)
		header_bytes = validate_headers(a.headers);

	a.payload_null = PG_ARGISNULL(3);
	a.payload = a.payload_null ? (Datum) 0 : PG_GETARG_DATUM(3);
	if (!a.payload_null)
		payload_bytes = payload_size(a.payload, raw);

	a.version = PG_ARGISNULL(7) ? 0 : PG_GETARG_INT64(7);
	if (!PG_ARGISNULL(7) && a.version <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_emit: aggregate_version must be positive, not " INT64_FORMAT,
						a.version),
				 errhidestmt(hide_statement)));

	a.event_id_given = !PG_ARGISNULL(6);
	if (a.event_id_given)
	{
		a.event_id = text_to_cstring(PG_GETARG_TEXT_PP(6));
		check_identifier(a.event_id, "event_id");
	}
	else
	{
		pg_uuid_t	uuid;

		generate_uuid_v7(&uuid);
		a.event_id = DatumGetCString(DirectFunctionCall1(uuid_out, UUIDPGetDatum(&uuid)));
	}

	check_record_size(payload_bytes, header_bytes,
					  publisher_record_bytes(a.aggregate_type, a.aggregate_id, a.event_type,
											 a.event_id, a.topic));

	if (target == NULL)
	{
		own_target.cxt = CurrentMemoryContext;
		own_target.open = false;
		write_event(&a, &own_target, info->nspid, result);
		close_target(&own_target);
	}
	else
		write_event(&a, target, info->nspid, result);
	outbox_note_emit();

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(info->tupdesc, result, result_nulls)));
}

/* outbox_emit(): an event with a JSON payload (or none). */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	return emit_event(fcinfo, false, NULL);
}

/*
 * outbox_emit_raw(): an event whose payload (text or bytea, both a varlena
 * of bytes) reaches Kafka exactly as given.
 */
Datum
outbox_emit_raw(PG_FUNCTION_ARGS)
{
	return emit_event(fcinfo, true, NULL);
}

/* Error context of outbox_emit_many(): which event failed. */
static void
emit_many_error_context(void *arg)
{
	errcontext("outbox_emit_many, event %d", *(int *) arg);
}

/*
 * outbox_emit_many(events outbox_event[]): each event, in array order, as
 * outbox_emit() would emit it (outbox_emit_raw() if raw), in one call (no
 * statement per event).
 */
static Datum
emit_many(FunctionCallInfo fcinfo, bool raw)
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
	EmitTarget	target;
	MemoryContext event_cxt;
	MemoryContext old_cxt;

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
	/* The outbox is opened once for all events; memory is per event. */
	target.cxt = CurrentMemoryContext;
	target.open = false;
	event_cxt = AllocSetContextCreate(CurrentMemoryContext, "outbox_emit_many event",
									  ALLOCSET_DEFAULT_SIZES);
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
		old_cxt = MemoryContextSwitchTo(event_cxt);
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

		event = DatumGetHeapTupleHeader(emit_event(call, raw, &target));
		tuple.t_len = HeapTupleHeaderGetDatumLength(event);
		tuple.t_data = event;
		tuplestore_puttuple(rsinfo->setResult, &tuple);
		MemoryContextSwitchTo(old_cxt);
		MemoryContextReset(event_cxt);
	}
	close_target(&target);
	MemoryContextDelete(event_cxt);
	error_context_stack = errcallback.previous;
	return (Datum) 0;
}

/* outbox_emit_many(): events with JSON payloads. */
Datum
outbox_emit_many(PG_FUNCTION_ARGS)
{
	return emit_many(fcinfo, false);
}

/*
 * outbox_emit_many_raw(): events whose payloads (outbox_event_bytea or
 * outbox_event_text) reach Kafka exactly as given.
 */
Datum
outbox_emit_many_raw(PG_FUNCTION_ARGS)
{
	return emit_many(fcinfo, true);
}
