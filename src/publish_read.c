/*-------------------------------------------------------------------------
 *
 * publish_read.c
 *	  Reading pending events: the read's plans, and the fetch of the
 *	  oldest pending events of this worker's share, within the batch bounds.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "executor/tuptable.h"
#include "utils/fmgrprotos.h"
#include "utils/snapmgr.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#include "shmem.h"
#include "util.h"
#include "publish.h"

int			outbox_read_interval_ms = 10;
int			outbox_read_commits = 4;

/* When the last read began, and whether it took a full batch (a backlog). */
static TimestampTz last_read_at = 0;
static bool last_read_full = false;

/* The last read found publishing paused as a whole (outbox_pause()). */
bool		publish_read_paused = false;

/*
 * Whether the stream's manifest came from the statement without a horizon
 * (not from publish_delta_read, which finds what its commits need flushed),
 * and whether the last read took events of it or by index: then their
 * commits are made durable by flushing all the WAL the read could see.
 */
static bool manifest_unchecked = false;
static bool last_read_unchecked = false;

static SPIPlanPtr unsettled_plan = NULL;
static SPIPlanPtr fetch_id_plan = NULL;
static SPIPlanPtr listed_plan = NULL;
static SPIPlanPtr held_plan = NULL;
static SPIPlanPtr catch_up_plan = NULL;
static SPIPlanPtr clear_plan = NULL;

/* Most aggregates one read looks up by index. */
#define CATCH_UP_AGGREGATES 1000

/*
 * How often the aggregates the database lists are looked for while there
 * were none and nothing says there are new ones: a backoff's end or an
 * operator's function is seen this much later at most.
 */
#define LISTED_POLL_MS 100

static TimestampTz listed_read_at = 0;

/* Define this module's settings (from _PG_init). */
void
publish_read_init(void)
{
	DefineCustomIntVariable("outbox.read_interval",
							"Shortest time between two reads of a publisher that is not behind.",
							"After a read that found less than a full batch, commits wait this long to be "
							"read, produced and settled together: less CPU per event for this much latency "
							"at most.  A full batch (a backlog) is followed by the next read at once.",
							&outbox_read_interval_ms,
							10, 0, 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.read_commits",
							"Emitting commits that end a publisher's wait of outbox.read_interval early.",
							"A read that is not behind waits outbox.read_interval or until this many "
							"transactions that emitted have committed since the previous read began, "
							"whichever comes first: the faster events come, the sooner a read has enough "
							"of them to pay its fixed cost.  1 reads at every commit.",
							&outbox_read_commits,
							4, 1, 1000000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
}

/*
 * Milliseconds until a read wanted now may happen (outbox.read_interval, or
 * none once outbox.read_commits commits came).  It only delays a read:
 * while nothing wants one the worker waits as long as it would.
 */
long
publish_read_gap_ms(void)
{
	long		age;

	if (last_read_full ||
		pg_atomic_read_u32(&publish_slot->commits_unread) >= (uint32) outbox_read_commits)
		return 0;
	age = TimestampDifferenceMilliseconds(last_read_at, GetCurrentTimestamp());
	return age < outbox_read_interval_ms ? outbox_read_interval_ms - age : 0;
}

/* The columns of an event as copy_row() reads them. */
#define EVENT_COLUMNS \
	"o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version, " \
	"o.event_type, o.topic, o.headers, o.payload::pg_catalog.text, o.created_at, o.attempts, " \
	"o.last_error, o.dead_letter_requested, o.payload_bytes "

/* Where the columns are in a row of EVENT_COLUMNS: in EventColumn order. */
static const int sql_columns[EC_NCOLUMNS] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
#define COL_AGGREGATE_ID (EC_AGGREGATE_ID + 1)
/* The aggregate's row version, after EVENT_COLUMNS in a read by index. */
#define COL_PUB_XMIN (EC_NCOLUMNS + 1)

/*
 * The order a delta is read in: each aggregate's events together, in
 * version order (grouped by hash: only each aggregate's own order matters),
 * so that a batch holds whole aggregates and settles few rows.
 */
#define DELTA_ORDER " ORDER BY pg_catalog.hashtext(o.aggregate_id), o.aggregate_version"

/* This worker's share of the buckets ($n: the number of shares, $n+1: ours). */
#define SHARE(col, n, n1) \
	"(" n " OPERATOR(pg_catalog.=) 1 OR (((pg_catalog.hashtext(" col ") OPERATOR(pg_catalog.&) 2147483647) " \
	"OPERATOR(pg_catalog.%%) %d) OPERATOR(pg_catalog.%%) " n ") OPERATOR(pg_catalog.=) " n1 ")"

/* Prepare the stream's plans for the extension in schema s (quoted). */
static void
prepare_read_plans(const char *s)
{
	Oid			share_types[2] = {INT4OID, INT4OID};
	Oid			fetch_id_types[1] = {INT8ARRAYOID};
	Oid			listed_types[3] = {INT4OID, INT4OID, INT4OID};
	Oid			held_types[1] = {TEXTARRAYOID};
	Oid			catch_up_types[2] = {TEXTARRAYOID, INT4OID};
	Oid			clear_types[2] = {TEXTARRAYOID, XIDARRAYOID};

	publish_listed_changed = true;

	/* Without a horizon (first start, after a restore): every unsettled event. */
	unsettled_plan = publish_keep_plan(psprintf(
											   "SELECT o.id, o.ctid, pg_catalog.hashtext(o.aggregate_id) FROM %s.outbox o "
											   "LEFT JOIN %s.aggregate_publication p ON p.aggregate_id OPERATOR(pg_catalog.=) o.aggregate_id "
											   "WHERE o.aggregate_version OPERATOR(pg_catalog.>) coalesce(p.last_published_version, 0) "
											   "AND o.disposition IS NULL "
											   "AND " SHARE("o.aggregate_id", "$1", "$2") DELTA_ORDER,
											   s, s, OUTBOX_PUBLISH_BUCKETS),
									  2, share_types);

	/*
	 * A delta's events are read where the delta found them
	 * (publish_heap.c); a row version that moved since is found by id.
	 * Then their aggregates' progress, once per aggregate
	 * (publish_progress_read).
	 */
	fetch_id_plan = publish_keep_plan(psprintf(
											  "SELECT o.id, o.ctid FROM %s.outbox o "
											  "WHERE o.id OPERATOR(pg_catalog.=) ANY ($1) AND o.disposition IS NULL", s),
									 1, fetch_id_types);

	/* Listed aggregates that may be published now (catch_up, backoff over). */
	listed_plan = publish_keep_plan(psprintf(
											"SELECT p.aggregate_id, p.xmin FROM %s.aggregate_publication p "
											"WHERE (p.catch_up OR p.next_attempt_at IS NOT NULL) "
											"AND NOT p.paused AND p.blocked_version IS NULL "
											"AND (p.next_attempt_at IS NULL OR p.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()) "
											"AND " SHARE("p.aggregate_id", "$1", "$2") " LIMIT $3",
											s, OUTBOX_PUBLISH_BUCKETS),
								   3, listed_types);

	/* Of these aggregates, the ones listed and held (paused, blocked, backing off). */
	held_plan = publish_keep_plan(psprintf(
										  "SELECT p.aggregate_id FROM %s.aggregate_publication p "
										  "WHERE p.aggregate_id OPERATOR(pg_catalog.=) ANY ($1) AND (p.paused OR p.blocked_version IS NOT NULL "
										  "OR p.next_attempt_at OPERATOR(pg_catalog.>) pg_catalog.now())", s),
								 1, held_types);

	/* Aggregates' unsettled events by index, each aggregate's in version order. */
	catch_up_plan = outbox_keep_plan_options(psprintf(
											  "SELECT " EVENT_COLUMNS ", p.xmin FROM %s.outbox o "
											  "LEFT JOIN %s.aggregate_publication p ON p.aggregate_id OPERATOR(pg_catalog.=) o.aggregate_id "
											  "WHERE o.aggregate_id OPERATOR(pg_catalog.=) ANY ($1) "
											  "AND o.aggregate_version OPERATOR(pg_catalog.>) coalesce(p.last_published_version, 0) "
											  "AND o.disposition IS NULL "
											  "AND NOT coalesce(p.paused OR p.blocked_version IS NOT NULL "
											  "OR p.next_attempt_at OPERATOR(pg_catalog.>) pg_catalog.now(), false) "
											  "ORDER BY o.aggregate_id, o.aggregate_version LIMIT $2", s, s),
									 2, catch_up_types, CURSOR_OPT_CUSTOM_PLAN);

	/*
	 * Listed aggregates a read found nothing pending for go back to the
	 * stream, unless their row changed since (an operator, a failure).
	 */
	clear_plan = outbox_keep_plan_options(psprintf(
										   "UPDATE %s.aggregate_publication p SET catch_up = false, "
										   "next_attempt_at = NULL, updated_at = pg_catalog.clock_timestamp() "
										   "FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS u(id, x) "
										   "WHERE p.aggregate_id OPERATOR(pg_catalog.=) u.id AND p.xmin OPERATOR(pg_catalog.=) u.x", s),
								  2, clear_types, CURSOR_OPT_CUSTOM_PLAN);
}

/* Free the plans of the previous extension, if any. */
static void
free_read_plans(void)
{
	SPIPlanPtr *plans[] = {&unsettled_plan,
	&fetch_id_plan, &listed_plan, &held_plan, &catch_up_plan, &clear_plan};

	for (int i = 0; i < lengthof(plans); i++)
		if (*plans[i])
		{
			SPI_freeplan(*plans[i]);
			*plans[i] = NULL;
		}
}

/* publisher_control, and where its column paused is. */
static Oid	control_relid = InvalidOid;
static const char *const control_names[1] = {"paused"};
static int	control_columns[1];

/*
 * Is publishing paused as a whole (outbox_pause()), as the read's snapshot
 * sees publisher_control?  Read without a statement: a statement's executor
 * start-up per read was 5% of the worker's CPU under a steady load.
 */
static bool
publishing_paused(void)
{
	Relation	rel = publish_open_table(control_relid, AccessShareLock, ACL_SELECT, control_names,
										 1, control_columns);
	TableScanDesc scan = table_beginscan(rel, GetActiveSnapshot(), 0, NULL);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	bool		paused = false;

	/* One row (its primary key is a constant); the first, as LIMIT 1 took. */
	if (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		d = slot_getattr(slot, control_columns[0] + 1, &isnull);

		paused = !isnull && DatumGetBool(d);
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, NoLock);
	return paused;
}

/* The read's snapshot (the active one) as pg_current_snapshot()::text. */
static char *
read_snapshot_text(void)
{
	LOCAL_FCINFO(fcinfo, 0);
	Datum		snap;

	InitFunctionCallInfoData(*fcinfo, NULL, 0, InvalidOid, NULL, NULL);
	snap = pg_current_snapshot(fcinfo);
	return DatumGetCString(DirectFunctionCall1(pg_snapshot_out, snap));
}

/*
 * The extension (re)appeared in schema s (quoted): free the plans of the
 * previous one, prepare this one's (publish_extension.c calls it).
 */
void
publish_read_prepare(const char *s)
{
	free_read_plans();
	prepare_read_plans(s);
}

/* Where publisher_control's column is, in the extension's schema nsp. */
void
publish_read_columns(Oid nsp)
{
	control_relid = publish_table_columns(nsp, "publisher_control", control_names, 1,
										  control_columns);
}

/* publisher_control: its invalidation means looking the extension up again. */
Oid
publish_read_control_relid(void)
{
	return control_relid;
}


/* Column c of a deformed row as a C string (a copy), or NULL. */
static inline char *
column_text(Datum *values, bool *nulls, const int *col, EventColumn c)
{
	return nulls[col[c]] ? NULL : TextDatumGetCString(values[col[c]]);
}

/*
 * The bytes escape_json() escapes: the control characters, the double
 * quote and the backslash.
 */
static const bool json_escaped[256] = {
	[0x00] = true,[0x01] = true,[0x02] = true,[0x03] = true,[0x04] = true,
	[0x05] = true,[0x06] = true,[0x07] = true,[0x08] = true,[0x09] = true,
	[0x0a] = true,[0x0b] = true,[0x0c] = true,[0x0d] = true,[0x0e] = true,
	[0x0f] = true,[0x10] = true,[0x11] = true,[0x12] = true,[0x13] = true,
	[0x14] = true,[0x15] = true,[0x16] = true,[0x17] = true,[0x18] = true,
	[0x19] = true,[0x1a] = true,[0x1b] = true,[0x1c] = true,[0x1d] = true,
	[0x1e] = true,[0x1f] = true,['"'] = true,['\\'] = true
};

/*
 * Append two bytes (a separator, an escape): appendBinaryStringInfo()'s
 * call was a tenth of an event's JSON text.
 */
static inline void
append_two(StringInfo out, char a, char b)
{
	if (out->len + 2 >= out->maxlen)
		enlargeStringInfo(out, 2);
	out->data[out->len] = a;
	out->data[out->len + 1] = b;
	out->len += 2;
	out->data[out->len] = '\0';
}

/*
 * Append a JSON string of len bytes as escape_json() writes it (jsonb's own
 * text output), copying the runs that need no escape at once: escape_json()
 * appends byte by byte, on a copy (pnstrdup) of each string, and was a
 * third of the worker's cost of copying an event.
 */
static void
append_json_string(StringInfo out, const char *s, int len)
{
	const char *end = s + len;

	appendStringInfoCharMacro(out, '"');
	while (s < end)
	{
		const char *run = s;

		while (s < end && !json_escaped[(unsigned char) *s])
			s++;
		if (s > run)
		{
			if (out->len + (s - run) >= out->maxlen)
				enlargeStringInfo(out, s - run);
			memcpy(out->data + out->len, run, s - run);
			out->len += s - run;
			out->data[out->len] = '\0';
		}
		if (s == end)
			break;
		switch (*s)
		{
			case '\b':
				append_two(out, '\\', 'b');
				break;
			case '\f':
				append_two(out, '\\', 'f');
				break;
			case '\n':
				append_two(out, '\\', 'n');
				break;
			case '\r':
				append_two(out, '\\', 'r');
				break;
			case '\t':
				append_two(out, '\\', 't');
				break;
			case '"':
				append_two(out, '\\', '"');
				break;
			case '\\':
				append_two(out, '\\', '\\');
				break;
			default:
				appendStringInfo(out, "\\u%04x", (int) *s);
				break;
		}
		s++;
	}
	appendStringInfoCharMacro(out, '"');
}

/*
 * The stored form of a numeric (numeric.c, the same on disk in every
 * version): a 16-bit header, then base-10,000 digits; the short header
 * holds the sign, the display scale and the weight (of the first digit).
 */
#define NUMERIC_FORM_MASK		0xC000
#define NUMERIC_FORM_SHORT		0x8000
#define NUMERIC_SHORT_NEG		0x2000
#define NUMERIC_SHORT_DSCALE	0x1F80
#define NUMERIC_SHORT_WEIGHT_NEG 0x0040
#define NUMERIC_SHORT_WEIGHT	0x003F

/*
 * Append a short-form numeric without a fraction (display scale 0) as
 * numeric_out() writes it, from its digits; false for any other numeric,
 * left to numeric_out().  Its call was a fifth of an event's JSON text.
 */
static bool
append_integer_numeric(StringInfo out, Numeric num)
{
	const char *data = VARDATA_ANY(num);
	Size		size = VARSIZE_ANY_EXHDR(num);
	uint16		header;
	int			ndigits;
	int			weight;

	if (size < sizeof(uint16))
		return false;
	memcpy(&header, data, sizeof(header));
	if ((header & NUMERIC_FORM_MASK) != NUMERIC_FORM_SHORT ||
		(header & NUMERIC_SHORT_DSCALE) != 0 || (header & NUMERIC_SHORT_WEIGHT_NEG) != 0)
		return false;
	weight = header & NUMERIC_SHORT_WEIGHT;
	ndigits = (size - sizeof(uint16)) / sizeof(int16);
	if (ndigits == 0)
	{
		appendStringInfoCharMacro(out, '0');
		return true;
	}
	if (ndigits > weight + 1)
		return false;
	enlargeStringInfo(out, 1 + (weight + 1) * 4);
	if (header & NUMERIC_SHORT_NEG)
		out->data[out->len++] = '-';
	for (int i = 0; i <= weight; i++)
	{
		int16		d = 0;
		char		group[4];
		int			from = 0;

		if (i < ndigits)
			memcpy(&d, data + sizeof(uint16) + i * sizeof(int16), sizeof(d));
		for (int k = 3; k >= 0; k--, d /= 10)
			group[k] = '0' + d % 10;
		/* the first digit without its leading zeros, as numeric_out() */
		while (i == 0 && from < 3 && group[from] == '0')
			from++;
		memcpy(out->data + out->len, group + from, 4 - from);
		out->len += 4 - from;
	}
	out->data[out->len] = '\0';
	return true;
}

/* Append a scalar of a jsonb as jsonb's text output writes it. */
static void
append_json_scalar(StringInfo out, JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			appendBinaryStringInfo(out, "null", 4);
			break;
		case jbvString:
			append_json_string(out, v->val.string.val, v->val.string.len);
			break;
		case jbvNumeric:
			if (!append_integer_numeric(out, v->val.numeric))
				appendStringInfoString(out, DatumGetCString(DirectFunctionCall1(numeric_out,
																				NumericGetDatum(v->val.numeric))));
			break;
		case jbvBool:
			if (v->val.boolean)
				appendBinaryStringInfo(out, "true", 4);
			else
				appendBinaryStringInfo(out, "false", 5);
			break;
		default:
			elog(ERROR, "unknown jsonb scalar type %d", (int) v->type);
	}
}

/*
 * Append a jsonb's text, byte for byte what jsonb_out() (JsonbToCString,
 * without indentation) gives: ", " between items, ": " after a key, a raw
 * scalar without its brackets.  TAP 013 compares the two on every kind of
 * value.
 */
static void
append_jsonb_text(StringInfo out, Jsonb *jb)
{
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbValue	v;
	JsonbIteratorToken type;
	bool		first = true;
	bool		raw_scalar = false;

	while ((type = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		/* A key's value follows it at once: a scalar, or a container opening. */
		if ((type == WJB_BEGIN_ARRAY || type == WJB_BEGIN_OBJECT || type == WJB_KEY ||
			 type == WJB_ELEM) && !first)
			append_two(out, ',', ' ');
		switch (type)
		{
			case WJB_BEGIN_ARRAY:
				raw_scalar = v.val.array.rawScalar;
				if (!raw_scalar)
					appendStringInfoCharMacro(out, '[');
				first = true;
				break;
			case WJB_BEGIN_OBJECT:
				appendStringInfoCharMacro(out, '{');
				first = true;
				break;
			case WJB_KEY:
				append_json_scalar(out, &v);
				append_two(out, ':', ' ');
				/* a container value opens with first set: no ", " before it */
				first = true;
				break;
			case WJB_VALUE:
			case WJB_ELEM:
				append_json_scalar(out, &v);
				first = false;
				break;
			case WJB_END_ARRAY:
				if (!raw_scalar)
					appendStringInfoCharMacro(out, ']');
				first = false;
				break;
			case WJB_END_OBJECT:
				appendStringInfoCharMacro(out, '}');
				first = false;
				break;
			default:
				elog(ERROR, "unknown jsonb iterator token type %d", (int) type);
		}
	}
}

/*
 * The buffer a JSON payload's text is built in, emptied: one for the
 * worker's life rather than one per event, given back when a large
 * payload has grown it past PAYLOAD_SCRATCH_KEEP.
 */
#define PAYLOAD_SCRATCH_KEEP (64 * 1024)
static StringInfo
payload_scratch(void)
{
	static StringInfo scratch = NULL;

	if (scratch != NULL && scratch->maxlen > PAYLOAD_SCRATCH_KEEP)
	{
		pfree(scratch->data);
		pfree(scratch);
		scratch = NULL;
	}
	if (scratch == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);

		scratch = makeStringInfo();
		MemoryContextSwitchTo(oldcxt);
	}
	resetStringInfo(scratch);
	return scratch;
}

/* A raw payload's exact bytes, else the JSON payload's text, into ev. */
static void
copy_payload(BatchEvent *ev, Datum *values, bool *nulls, const int *col, bool json)
{
	if (!nulls[col[EC_PAYLOAD_BYTES]])
	{
		bytea	   *raw = DatumGetByteaPP(values[col[EC_PAYLOAD_BYTES]]);

		/* A chunk of its own: produce_event() frees it once sent. */
		ev->payload_len = VARSIZE_ANY_EXHDR(raw);
		ev->payload = palloc(ev->payload_len + 1);
		memcpy(ev->payload, VARDATA_ANY(raw), ev->payload_len);
		if ((Pointer) raw != DatumGetPointer(values[col[EC_PAYLOAD_BYTES]]))
			pfree(raw);
	}
	else if (nulls[col[EC_PAYLOAD]])
	{
		ev->payload = NULL;
		ev->payload_len = 0;
	}
	else if (json)
	{
		Jsonb	   *jb = DatumGetJsonbP(values[col[EC_PAYLOAD]]);
		StringInfo	buf = payload_scratch();

		/* Its text built aside and copied: the builder over-allocates. */
		append_jsonb_text(buf, jb);
		ev->payload_len = buf->len;
		ev->payload = palloc(buf->len + 1);
		memcpy(ev->payload, buf->data, buf->len + 1);
		if ((Pointer) jb != DatumGetPointer(values[col[EC_PAYLOAD]]))
			pfree(jb);
	}
	else
	{
		ev->payload = column_text(values, nulls, col, EC_PAYLOAD);
		ev->payload_len = strlen(ev->payload);
	}
}

/*
 * The event's names (event id, aggregate type and id, event type, topic:
 * text, never NULL in the table) as C strings in one allocation, rather
 * than one each: five per event were a tenth of copying it.  Their lengths
 * are kept too: the headers and the key need them.
 */
static void
copy_names(BatchEvent *ev, Datum *values, bool *nulls, const int *col)
{
	static const EventColumn names[] = {EC_EVENT_ID, EC_AGGREGATE_TYPE, EC_AGGREGATE_ID,
	EC_EVENT_TYPE, EC_TOPIC};
	char	  **dest[lengthof(names)] = {&ev->event_id, &ev->aggregate_type, &ev->aggregate_id,
	&ev->event_type, &ev->topic};
	int		   *dest_len[lengthof(names)] = {&ev->event_id_len, &ev->aggregate_type_len,
	&ev->aggregate_id_len, &ev->event_type_len, &ev->topic_len};
	text	   *t[lengthof(names)];
	Size		total = 0;
	char	   *p;

	for (int i = 0; i < lengthof(names); i++)
	{
		t[i] = nulls[col[names[i]]] ? NULL : DatumGetTextPP(values[col[names[i]]]);
		total += t[i] ? VARSIZE_ANY_EXHDR(t[i]) + 1 : 0;
	}
	p = palloc(Max(total, 1));
	for (int i = 0; i < lengthof(names); i++)
	{
		int			len;

		*dest[i] = NULL;
		*dest_len[i] = 0;
		if (t[i] == NULL)
			continue;
		len = VARSIZE_ANY_EXHDR(t[i]);
		memcpy(p, VARDATA_ANY(t[i]), len);
		p[len] = '\0';
		*dest[i] = p;
		*dest_len[i] = len;
		p += len + 1;
		if ((Pointer) t[i] != DatumGetPointer(values[col[names[i]]]))
			pfree(t[i]);
	}
}

/*
 * Copy one row into ev, in the current memory context: a row of the
 * outbox (columns where publish_heap_columns() says, the payload jsonb) or
 * of EVENT_COLUMNS (sql_columns, the payload's text); its aggregate's row
 * version (if it has a row) is pub_xmin, at pub_tid if known (NULL: not).
 * The row is deformed once.
 */
static void
copy_row(BatchEvent *ev, HeapTuple tup, TupleDesc desc, const int *col, bool pub_row,
		 TransactionId pub_xmin, const ItemPointerData *pub_tid)
{
	Datum		values_local[32];
	bool		nulls_local[32];
	Datum	   *values = values_local;
	bool	   *nulls = nulls_local;

	if (desc->natts > lengthof(values_local))
	{
		values = palloc(sizeof(Datum) * desc->natts);
		nulls = palloc(sizeof(bool) * desc->natts);
	}
	heap_deform_tuple(tup, desc, values, nulls);
	ev->id = DatumGetInt64(values[col[EC_ID]]);
	copy_names(ev, values, nulls, col);
	ev->version = DatumGetInt64(values[col[EC_VERSION]]);
	ev->headers = nulls[col[EC_HEADERS]] ? NULL : DatumGetJsonbPCopy(values[col[EC_HEADERS]]);
	copy_payload(ev, values, nulls, col,
				 TupleDescAttr(desc, col[EC_PAYLOAD])->atttypid == JSONBOID);
	ev->created_at = DatumGetTimestampTz(values[col[EC_CREATED_AT]]);
	ev->attempts = DatumGetInt32(values[col[EC_ATTEMPTS]]);
	ev->last_error = column_text(values, nulls, col, EC_LAST_ERROR);
	ev->dead_letter_requested = DatumGetBool(values[col[EC_DEAD_LETTER_REQUESTED]]);
	ev->pub_xmin = pub_xmin;
	if (pub_tid != NULL)
		ev->pub_tid = *pub_tid;
	else
		ItemPointerSetInvalid(&ev->pub_tid);
	ev->pub_row = pub_row;
	ev->action = EV_PUBLISH;
	ev->produced = false;
	ev->solo = false;
	ev->retry_alone = false;
	ev->next = -1;
	ev->agg = NULL;
	if (values != values_local)
	{
		pfree(values);
		pfree(nulls);
	}
}

/* Bytes an event holds in memory: what outbox.batch_bytes counts. */
static int64
event_bytes(BatchEvent *ev)
{
	return sizeof(BatchEvent) + ev->event_id_len + ev->aggregate_type_len +
		ev->aggregate_id_len + ev->event_type_len + ev->topic_len +
		(ev->headers ? VARSIZE(ev->headers) : 0) +
		ev->payload_len +
		(ev->last_error ? strlen(ev->last_error) : 0);
}

static void clear_caught_up(char **cand, int ncand, HTAB *caught, HTAB *listed);
struct ReadState;
static void mark_maybe_more(struct ReadState *rs, int from);

/* A flight's events as they are read. */
typedef struct ReadState
{
	Flight	   *f;
	int			size;			/* of f->events */
	int			max_events;
	int64		max_bytes;
	HTAB	   *caught;			/* aggregates read by index this time */
	HTAB	   *owed;			/* aggregates read from the stream this time */
} ReadState;

/* Is there room for another event? */
static bool
has_room(ReadState *rs)
{
	return rs->f->nevents < rs->max_events && rs->f->bytes < rs->max_bytes;
}

/*
 * How many rows to fetch next: as many as the bytes left hold at the
 * average size so far (16 before the first), at most max, so that the rows
 * in memory at once stay near outbox.batch_bytes however large the events.
 */
static int
chunk_size(ReadState *rs, int max)
{
	int64		room = rs->max_events - rs->f->nevents;
	int64		n;

	if (rs->f->nevents == 0)
		n = 16;
	else
		n = (rs->max_bytes - rs->f->bytes) / Max(rs->f->bytes / rs->f->nevents, 1) + 1;
	return (int) Max(1, Min(Min(room, max), n));
}

/*
 * Add a fetched row (its columns where col says) to the flight, owed by
 * delta seq (0: none); its aggregate's row version is pub_xmin (at
 * pub_tid, if known), if it has a row.
 */
static void
add_row(ReadState *rs, HeapTuple tup, TupleDesc desc, const int *col, int64 seq,
		bool maybe_more, bool pub_row, TransactionId pub_xmin, const ItemPointerData *pub_tid)
{
	Flight	   *f = rs->f;
	MemoryContext oldcxt = MemoryContextSwitchTo(f->cxt);
	BatchEvent *ev;

	if (f->nevents == rs->size)
	{
		rs->size = Min(rs->max_events, rs->size * 2);
		f->events = repalloc(f->events, sizeof(BatchEvent) * rs->size);
	}
	ev = &f->events[f->nevents];
	copy_row(ev, tup, desc, col, pub_row, pub_xmin, pub_tid);
	ev->owed = seq;
	ev->maybe_more = maybe_more;
	MemoryContextSwitchTo(oldcxt);
	f->bytes += event_bytes(ev);
	f->nevents++;
}

/* The text of column col of a fetched row (a palloc'd copy). */
static char *
row_text(HeapTuple tup, TupleDesc desc, int col)
{
	bool		isnull;

	return TextDatumGetCString(SPI_getbinval(tup, desc, col, &isnull));
}

/* Add an aggregate id to a set; returns true if it was new. */
static bool
set_add(HTAB *set, const char *aggregate_id)
{
	bool		found;
	char	   *key = (char *) aggregate_id;
	char	  **entry = hash_search(set, &key, HASH_ENTER, &found);

	if (!found)
		*entry = pstrdup(aggregate_id);
	return !found;
}

/* Is an aggregate id in a set? */
static bool
set_has(HTAB *set, const char *aggregate_id)
{
	char	   *key = (char *) aggregate_id;

	return hash_search(set, &key, HASH_FIND, NULL) != NULL;
}

/*
 * The aggregates to read by index now: the diverted ones not in flight,
 * and those the database lists that may be published (catch_up, backoff
 * over), in a set; listed ones' row versions in listed_xmins.  Diverted
 * ones the database holds (paused, blocked, backing off) are its now.
 */
static int
catch_up_candidates(int nshares, int share, HTAB *set, HTAB *listed_xmins)
{
	char	  **div;
	int			ndiv = publish_stream_diverted_ready(&div, CATCH_UP_AGGREGATES,
													 publish_aggregate_busy);
	Datum		args[3];
	int			n = 0;

	if (ndiv > 0)
	{
		args[0] = publish_text_array(div, ndiv);
		if (SPI_execute_plan(held_plan, args, NULL, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read the held aggregates");
		for (uint64 r = 0; r < SPI_processed; r++)
			(void) publish_stream_undivert(row_text(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1),
										   true);
		for (int i = 0; i < ndiv; i++)
			if (publish_stream_is_diverted(div[i]) && set_add(set, div[i]))
				n++;
	}

	if (!publish_listed_changed &&
		!TimestampDifferenceExceeds(listed_read_at, GetCurrentTimestamp(), LISTED_POLL_MS))
		return n;
	listed_read_at = GetCurrentTimestamp();
	args[0] = Int32GetDatum(nshares);
	args[1] = Int32GetDatum(share);
	args[2] = Int32GetDatum(CATCH_UP_AGGREGATES);
	if (SPI_execute_plan(listed_plan, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the listed aggregates");
	/*
	 * Any found: look again next time (the read that finds one with nothing
	 * more pending returns it to the stream); only none waits the poll.
	 */
	publish_listed_changed = SPI_processed > 0;
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tup = SPI_tuptable->vals[r];
		char	   *id = row_text(tup, SPI_tuptable->tupdesc, 1);
		bool		isnull;
		TransactionId xmin = DatumGetTransactionId(SPI_getbinval(tup, SPI_tuptable->tupdesc,
																 2, &isnull));

		if (publish_aggregate_busy(id))
			continue;
		if (set_add(set, id))
			n++;
		*(TransactionId *) ((char *) hash_search(listed_xmins, &id, HASH_ENTER, NULL) +
							sizeof(char *)) = xmin;
	}
	return n;
}

/*
 * Read the catch-up candidates' unsettled events by index into the flight.
 * A candidate found with nothing pending (when the read was not cut short)
 * goes back to the stream: a diverted one is dropped, a listed one cleared
 * unless its row changed.
 */
static void
read_by_index(ReadState *rs, int nshares, int share)
{
	HTAB	   *set = outbox_aggregate_table("outbox catch-up", sizeof(char *), 16,
											  CurrentMemoryContext);
	HTAB	   *listed = outbox_aggregate_table("outbox listed", sizeof(char *) + sizeof(TransactionId),
												 16, CurrentMemoryContext);
	int			ncand = catch_up_candidates(nshares, share, set, listed);
	char	  **cand;
	int			i = 0;
	HASH_SEQ_STATUS seq;
	char	  **entry;
	Datum		args[2];
	bool		truncated;
	int			limit = rs->max_events - rs->f->nevents;
	int			nbefore = rs->f->nevents;
	int64		owed = 0;
	Portal		portal;

	if (ncand == 0 || limit <= 0)
		return;
	cand = palloc(sizeof(char *) * ncand);
	hash_seq_init(&seq, set);
	while ((entry = hash_seq_search(&seq)) != NULL)
		cand[i++] = *entry;

	args[0] = publish_text_array(cand, ncand);
	args[1] = Int32GetDatum(limit);
	portal = SPI_cursor_open(NULL, catch_up_plan, args, NULL, true);
	truncated = false;
	for (;;)
	{
		SPI_cursor_fetch(portal, true, chunk_size(rs, 1000));
		for (uint64 r = 0; r < SPI_processed; r++)
		{
			HeapTuple	tup = SPI_tuptable->vals[r];
			char	   *id = row_text(tup, SPI_tuptable->tupdesc, COL_AGGREGATE_ID);
			bool		no_row;
			TransactionId xmin;

			if (!has_room(rs))
			{
				/* Cut short: what was not read stays listed or diverted. */
				truncated = true;
				break;
			}
			if (set_add(rs->caught, id))
				owed = publish_stream_undivert(id, false);
			xmin = DatumGetTransactionId(SPI_getbinval(tup, SPI_tuptable->tupdesc,
													   COL_PUB_XMIN, &no_row));
			add_row(rs, tup, SPI_tuptable->tupdesc, sql_columns, owed, false, !no_row, xmin, NULL);
		}
		if (SPI_processed == 0 || truncated)
			break;
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	last_read_unchecked |= rs->f->nevents > nbefore;
	/* The LIMIT reached means as much as a cut. */
	truncated = truncated || rs->f->nevents - nbefore >= limit;
	if (truncated)
		mark_maybe_more(rs, nbefore);
	if (!truncated)
		clear_caught_up(cand, ncand, rs->caught, listed);
	elog(DEBUG1, "outbox: read %d events of %d aggregates by index", rs->f->nevents, ncand);
}

/*
 * A read by index was cut short: each aggregate it read may have more
 * (read again by index once settled).
 */
static void
mark_maybe_more(struct ReadState *rs, int from)
{
	for (int i = from; i < rs->f->nevents; i++)
		rs->f->events[i].maybe_more = true;
}

/*
 * Candidates a complete read found nothing pending for: diverted ones are
 * dropped (paid), listed ones cleared (unless their row changed since).
 */
static void
clear_caught_up(char **cand, int ncand, HTAB *caught, HTAB *listed)
{
	char	  **ids = palloc(sizeof(char *) * ncand);
	TransactionId *xmins = palloc(sizeof(TransactionId) * ncand);
	int			n = 0;
	Datum		args[2];

	for (int i = 0; i < ncand; i++)
	{
		char	   *key = cand[i];
		char	   *entry;

		if (set_has(caught, cand[i]))
			continue;
		(void) publish_stream_undivert(cand[i], true);
		entry = hash_search(listed, &key, HASH_FIND, NULL);
		if (entry != NULL)
		{
			ids[n] = cand[i];
			xmins[n++] = *(TransactionId *) (entry + sizeof(char *));
		}
	}
	if (n == 0)
		return;
	args[0] = publish_text_array(ids, n);
	args[1] = publish_xid_array(xmins, n);
	if (SPI_execute_plan(clear_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not return aggregates to the stream");
}

/*
 * The (id, ctid[, hashtext(aggregate_id)]) rows SPI_tuptable holds as
 * manifest entries, in cxt.
 */
static ManifestEntry *
spi_entries(MemoryContext cxt)
{
	ManifestEntry *entries = MemoryContextAlloc(cxt, sizeof(ManifestEntry) * Max(SPI_processed, 1));

	for (uint64 r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tup = SPI_tuptable->vals[r];
		bool		isnull;

		entries[r].id = DatumGetInt64(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
		entries[r].tid = *(ItemPointer) DatumGetPointer(SPI_getbinval(tup, SPI_tuptable->tupdesc, 2,
																	  &isnull));
		entries[r].hash = SPI_tuptable->tupdesc->natts < 3 ? 0 :
			DatumGetInt32(SPI_getbinval(tup, SPI_tuptable->tupdesc, 3, &isnull));
	}
	return entries;
}

/* Read a new delta's manifest (at the read's snapshot, as text). */
static void
read_new_delta(const char *snapshot, int nshares, int share)
{
	const char *from = publish_stream_read_from();
	ManifestEntry *entries;
	Datum		args[2];
	int			n;

	manifest_unchecked = (from == NULL);
	if (from != NULL)
		n = publish_delta_read(from, snapshot, nshares, share, &entries);
	else
	{
		args[0] = Int32GetDatum(nshares);
		args[1] = Int32GetDatum(share);
		if (SPI_execute_plan(unsettled_plan, args, NULL, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not read the stream");
		entries = spi_entries(CurrentMemoryContext);
		n = (int) SPI_processed;
		SPI_freetuptable(SPI_tuptable);
	}
	publish_stream_new_delta(snapshot, entries, n);
	elog(DEBUG1, "outbox: delta of %d events at %s", n, snapshot);
}

/*
 * The run of a chunk's rows of one aggregate being streamed, and what was
 * decided for it, looked up once per run rather than per row.
 */
typedef struct StreamRun
{
	const char *id;				/* the aggregate (the chunk's copy); NULL: none */
	struct Progress *p;			/* its progress */
	bool		caught;			/* read by index this time: its rows dropped */
	bool		diverted;		/* in flight or diverted: its rows diverted */
	bool		owed;			/* this read's delta owes it already */
} StreamRun;

/*
 * One row of the stream: into the flight, or, if its aggregate is in
 * flight or diverted, diverted (read by index later); dropped if its
 * aggregate was just read by index (that read saw it).
 */
static void
stream_row(ReadState *rs, HeapTuple tup, TupleDesc desc, StreamRun *run, int64 seq,
		   const PublishProgress *pub)
{
	if (run->caught)
		return;
	if (!has_room(rs) || run->diverted)
	{
		publish_stream_owe(seq);
		publish_stream_divert(run->id, seq);
		run->diverted = true;
		return;
	}
	if (!run->owed)
	{
		run->owed = true;
		if (set_add(rs->owed, run->id))
			publish_stream_owe(seq);
	}
	add_row(rs, tup, desc, publish_heap_columns(), seq, false, pub->has_row, pub->xmin,
			&pub->tid);
}

/*
 * Most rows of a chunk of the manifest: they are fetched a heap page at a
 * time, and a backlog's rows of many aggregates are spread over the table,
 * so the more rows a chunk has, the more share a page visit (a chunk of
 * 1,000 rows of a 100,000-event backlog over 10,000 aggregates visited
 * nearly a page per row).
 */
#define STREAM_CHUNK_ROWS 8192

/* A chunk of the manifest being fetched: each event's row, once found. */
typedef struct Chunk
{
	ManifestEntry *entries;
	int			n;
	HeapTuple  *rows;			/* [n]; NULL: not found */
	char	  **aggregate_ids;	/* [n]: each row's */
	Relation	rel;			/* the outbox: the rows' descriptor */
	const int  *col;			/* where the rows' columns are */
	HTAB	   *progress;		/* aggregate id -> Progress */
} Chunk;

typedef struct ChunkPosition
{
	int64		id;				/* hash key: must be first */
	int			pos;
} ChunkPosition;

/* An aggregate's progress as the stream reads it. */
typedef struct Progress
{
	char	   *aggregate_id;	/* hash key: must be first */
	PublishProgress state;		/* as its row says */
} Progress;

/*
 * Fetch the chunk's missing rows (nmissing of them) by id: those that moved
 * since the delta (updated: attempts, a disposition) are found by index at
 * their new place.  Rows disposed of are not fetched.
 */
static void
fetch_moved(Chunk *c, int nmissing, MemoryContext cxt)
{
	HASHCTL		hctl;
	HTAB	   *positions;
	int64	   *ids = MemoryContextAlloc(cxt, sizeof(int64) * nmissing);
	ManifestEntry *moved;
	HeapTuple  *rows;
	int			n = 0;
	Datum		arg;

	memset(&hctl, 0, sizeof(hctl));
	hctl.keysize = sizeof(int64);
	hctl.entrysize = sizeof(ChunkPosition);
	hctl.hcxt = cxt;
	positions = hash_create("outbox moved rows", nmissing, &hctl,
							HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (int i = 0; i < c->n; i++)
		if (c->rows[i] == NULL)
		{
			ChunkPosition *cp = hash_search(positions, &c->entries[i].id, HASH_ENTER, NULL);

			cp->pos = i;
			ids[n++] = c->entries[i].id;
		}
	arg = publish_int8_array(ids, n);
	if (SPI_execute_plan(fetch_id_plan, &arg, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the stream's events");
	moved = spi_entries(cxt);
	n = (int) SPI_processed;
	SPI_freetuptable(SPI_tuptable);
	elog(DEBUG1, "outbox: %d of %d events moved since the delta was read, %d found by id",
		 nmissing, c->n, n);
	rows = MemoryContextAlloc(cxt, sizeof(HeapTuple) * Max(n, 1));
	publish_heap_fetch(c->rel, moved, n, rows, cxt);
	for (int i = 0; i < n; i++)
	{
		ChunkPosition *cp = hash_search(positions, &moved[i].id, HASH_FIND, NULL);

		if (cp != NULL)
			c->rows[cp->pos] = rows[i];
	}
}

/* Fetch the chunk's rows: where the delta found them, else by id. */
static void
fetch_chunk(Chunk *c, MemoryContext cxt)
{
	int			nmissing = 0;

	c->rows = MemoryContextAlloc(cxt, sizeof(HeapTuple) * Max(c->n, 1));
	publish_heap_fetch(c->rel, c->entries, c->n, c->rows, cxt);
	for (int i = 0; i < c->n; i++)
		if (c->rows[i] == NULL)
			nmissing++;
	if (nmissing > 0)
		fetch_moved(c, nmissing, cxt);
}

/* Read the progress of the chunk's aggregates, once each. */
static void
fetch_progress(Chunk *c, MemoryContext cxt)
{
	char	  **ids = MemoryContextAlloc(cxt, sizeof(char *) * Max(c->n, 1));
	Progress  **entries = MemoryContextAlloc(cxt, sizeof(Progress *) * Max(c->n, 1));
	PublishProgress *found;
	int			nids = 0;
	Progress   *prev = NULL;	/* the previous row's aggregate */
	int			prev_len = 0;

	c->progress = outbox_aggregate_table("outbox progress", sizeof(Progress), c->n, cxt);
	c->aggregate_ids = MemoryContextAlloc(cxt, sizeof(char *) * c->n);

	for (int i = 0; i < c->n; i++)
	{
		char	   *id;
		Progress   *p;
		bool		isnull;
		bool		known;
		text	   *t;

		if (c->rows[i] == NULL)
			continue;
		t = DatumGetTextPP(heap_getattr(c->rows[i], c->col[EC_AGGREGATE_ID] + 1,
										RelationGetDescr(c->rel), &isnull));
		/* An aggregate's rows are together in the chunk: the same as before? */
		if (prev != NULL && VARSIZE_ANY_EXHDR(t) == prev_len &&
			memcmp(VARDATA_ANY(t), prev->aggregate_id, prev_len) == 0)
		{
			c->aggregate_ids[i] = prev->aggregate_id;
			continue;
		}
		id = text_to_cstring(t);
		p = hash_search(c->progress, &id, HASH_ENTER, &known);
		if (!known)
		{
			p->aggregate_id = MemoryContextStrdup(cxt, id);
			ids[nids] = p->aggregate_id;
			entries[nids++] = p;
		}
		c->aggregate_ids[i] = p->aggregate_id;
		prev = p;
		prev_len = strlen(p->aggregate_id);
		pfree(id);
	}
	found = MemoryContextAlloc(cxt, sizeof(PublishProgress) * Max(nids, 1));
	publish_progress_read(ids, nids, found);
	for (int i = 0; i < nids; i++)
		entries[i]->state = found[i];
}

/*
 * The chunk's events, in the manifest's order, to the stream: those still
 * unsettled of aggregates not listed (the others are read by index).
 */
static void
stream_chunk(ReadState *rs, Chunk *c, int64 seq)
{
	TupleDesc	desc = RelationGetDescr(c->rel);
	StreamRun	run = {NULL};

	for (int i = 0; i < c->n; i++)
	{
		HeapTuple	tup = c->rows[i];
		bool		isnull;

		if (tup == NULL)
			continue;
		if (c->aggregate_ids[i] != run.id)
		{
			run.id = c->aggregate_ids[i];
			run.p = hash_search(c->progress, &run.id, HASH_FIND, NULL);
			run.caught = set_has(rs->caught, run.id);
			run.diverted = publish_aggregate_busy(run.id) || publish_stream_is_diverted(run.id);
			run.owed = false;
		}
		if (run.p->state.has_row &&
			(run.p->state.listed ||
			 DatumGetInt64(heap_getattr(tup, c->col[EC_VERSION] + 1, desc, &isnull)) <=
			 run.p->state.last_published_version))
			continue;
		stream_row(rs, tup, desc, &run, seq, &run.p->state);
	}
}

/* Read the stream's next events into the flight, a new delta if due. */
static void
read_stream(ReadState *rs, const char *snapshot, int nshares, int share)
{
	/*
	 * Kept, with a first block that holds a chunk of the benchmark's events:
	 * allocating and freeing the blocks of every chunk was 10% of the
	 * worker's CPU on a backlog (glibc's malloc, free and consolidation).
	 */
	static MemoryContext chunk_cxt = NULL;
	Relation	rel = NULL;

	if (chunk_cxt == NULL)
		chunk_cxt = AllocSetContextCreate(TopMemoryContext, "outbox chunk",
										  0, 512 * 1024, 8 * 1024 * 1024);

	if (publish_stream_manifest_done())
		read_new_delta(snapshot, nshares, share);
	while (has_room(rs))
	{
		Chunk		c;
		int64		seq;

		c.n = publish_stream_next_ids(chunk_size(rs, STREAM_CHUNK_ROWS), &c.entries, &seq);
		if (c.n == 0)
			break;
		if (rel == NULL)
			rel = publish_heap_open();
		c.rel = rel;
		c.col = publish_heap_columns();
		fetch_chunk(&c, chunk_cxt);
		fetch_progress(&c, chunk_cxt);
		stream_chunk(rs, &c, seq);
		MemoryContextReset(chunk_cxt);
		publish_stream_ids_done();
	}
	if (rel != NULL)
		table_close(rel, NoLock);
	MemoryContextReset(chunk_cxt);
}

/*
 * How far to flush the WAL before publishing the last read's events: all
 * the read could see (upto) if it read any by index or from a manifest
 * without a horizon, else what the deltas' commits need.
 */
XLogRecPtr
publish_read_flush_upto(XLogRecPtr upto)
{
	return last_read_unchecked ? upto : publish_delta_flush_upto(upto);
}

/*
 * Read a batch into the flight (in the read transaction, with its
 * snapshot): first aggregates to read by index (diverted, or listed by the
 * database and free to go), then the stream of new commits, at most
 * max_events and, past the first, max_bytes.  Returns the number of events,
 * or 0 if publishing is paused as a whole.
 */
int
publish_fetch(Flight *f, int nshares, int share, int max_events, int64 max_bytes)
{
	ReadState	rs;
	char	   *snapshot;

	last_read_at = GetCurrentTimestamp();
	last_read_full = false;
	publish_read_paused = publishing_paused();
	if (publish_read_paused)
		return 0;
	snapshot = read_snapshot_text();

	publish_stream_begin(nshares, share);
	rs.f = f;
	rs.size = Min(max_events, 1024);
	rs.max_events = max_events;
	rs.max_bytes = max_bytes;
	/* Small at first (they grow): a read of a steady load holds a few. */
	rs.caught = outbox_aggregate_table("outbox caught up", sizeof(char *), 16, CurrentMemoryContext);
	rs.owed = outbox_aggregate_table("outbox owed", sizeof(char *), 32, CurrentMemoryContext);
	f->events = MemoryContextAlloc(f->cxt, sizeof(BatchEvent) * rs.size);
	f->nevents = 0;
	f->bytes = 0;

	last_read_unchecked = false;
	read_by_index(&rs, nshares, share);
	read_stream(&rs, snapshot, nshares, share);
	last_read_unchecked |= manifest_unchecked;
	publish_stream_store_horizon();

	f->results = MemoryContextAllocZero(f->cxt, sizeof(DeliveryResult) * Max(f->nevents, 1));
	last_read_full = f->nevents >= max_events || f->bytes >= max_bytes;
	return f->nevents;
}
