/*-------------------------------------------------------------------------
 *
 * publish_read.c
 *	  Reading pending events: the extension's plans, and the fetch of the
 *	  oldest pending events of this worker's share, within the batch bounds.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "outbox.h"
#include "publish.h"

int			outbox_batch_events = 10000;
int			outbox_batch_bytes = 16 * 1024 * 1024;

static Oid	plans_nspid = InvalidOid;
static SPIPlanPtr fetch_plan = NULL;

/* Define this module's settings (from _PG_init). */
void
publish_read_init(void)
{
	DefineCustomIntVariable("outbox.batch_events",
							"Most events one publisher has read and not yet settled.",
							"Bounds the events in flight (produced, awaiting acknowledgement or marking) and one batch read.",
							&outbox_batch_events,
							10000, 1, 1000000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.batch_bytes",
							"Most bytes of events one publisher has read and not yet settled.",
							"Counts payloads, headers and ids; a batch holds at least one event, however large.",
							&outbox_batch_bytes,
							16 * 1024 * 1024, 1024, MaxAllocSize / 2,
							PGC_SIGHUP,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}

/* Schema of the extension in this database, or NULL if not installed. */
static char *
extension_schema(Oid *nspid)
{
	bool		isnull;
	int			rc;

	rc = SPI_execute("SELECT e.extnamespace, n.nspname FROM pg_catalog.pg_extension e "
					 "JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
					 "WHERE e.extname = 'outbox'", true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not look up the outbox extension");
	if (SPI_processed == 0)
		return NULL;
	*nspid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
	return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
}

/* Prepare every module's plans for the extension in schema (nspid). */
static void
prepare_plans(Oid nspid, const char *schema)
{
	const char *s = quote_identifier(schema);
	Oid			fetch_types[3] = {INT4OID, INT4OID, INT4OID};

	if (fetch_plan)
		SPI_freeplan(fetch_plan);
	fetch_plan = NULL;
	plans_nspid = InvalidOid;

	fetch_plan = outbox_keep_plan(psprintf(
									   "SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, "
									   "o.aggregate_version, o.event_type, o.topic, o.headers, "
									   "o.payload::text, o.created_at, o.attempts, o.last_error, "
									   "o.dead_letter_requested, o.xmin, o.payload_bytes "
									   "FROM %s.outbox o "
									   "WHERE o.published_at IS NULL "
									   "AND NOT coalesce((SELECT c.paused FROM %s.publisher_control c), false) "
									   "AND ($2 = 1 OR ((pg_catalog.hashtext(o.aggregate_id) & 2147483647) %% %d) %% $2 = $3) "
									   "AND NOT EXISTS (SELECT 1 FROM %s.aggregate_publication p "
									   "WHERE p.aggregate_id = o.aggregate_id "
									   "AND (p.paused OR p.blocked_version IS NOT NULL "
									   "OR p.next_attempt_at > pg_catalog.now())) "
									   "ORDER BY o.id LIMIT $1", s, s, OUTBOX_PUBLISH_BUCKETS, s),
							  3, fetch_types);
	publish_settle_prepare(s);
	publish_poison_prepare(s);
	publish_retention_prepare(s);
	plans_nspid = nspid;
}

/*
 * In a transaction with a snapshot: find the extension and (re)prepare the
 * plans if it moved.  Returns false if it is not installed.
 */
bool
publish_lookup_extension(void)
{
	Oid			nspid = InvalidOid;
	char	   *schema = extension_schema(&nspid);

	if (schema == NULL)
		return false;
	if (nspid != plans_nspid)
		prepare_plans(nspid, schema);
	return true;
}

/* Copy one fetched row into ev, in the current memory context. */
static void
copy_row(BatchEvent *ev, HeapTuple tup, TupleDesc desc)
{
	bool		isnull;
	Datum		d;

	ev->id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	ev->event_id = SPI_getvalue(tup, desc, 2);
	ev->aggregate_type = SPI_getvalue(tup, desc, 3);
	ev->aggregate_id = SPI_getvalue(tup, desc, 4);
	ev->version = DatumGetInt64(SPI_getbinval(tup, desc, 5, &isnull));
	ev->event_type = SPI_getvalue(tup, desc, 6);
	ev->topic = SPI_getvalue(tup, desc, 7);
	d = SPI_getbinval(tup, desc, 8, &isnull);
	ev->headers = isnull ? NULL : DatumGetJsonbPCopy(d);
	/* A raw payload's exact bytes, else the JSON payload's text. */
	d = SPI_getbinval(tup, desc, 15, &isnull);
	if (!isnull)
	{
		bytea	   *raw = DatumGetByteaPP(d);

		/* A chunk of its own: produce_event() frees it once sent. */
		ev->payload_len = VARSIZE_ANY_EXHDR(raw);
		ev->payload = palloc(ev->payload_len + 1);
		memcpy(ev->payload, VARDATA_ANY(raw), ev->payload_len);
		if ((Pointer) raw != DatumGetPointer(d))
			pfree(raw);
	}
	else
	{
		ev->payload = SPI_getvalue(tup, desc, 9);
		ev->payload_len = ev->payload ? strlen(ev->payload) : 0;
	}
	ev->created_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, 10, &isnull));
	ev->attempts = DatumGetInt32(SPI_getbinval(tup, desc, 11, &isnull));
	ev->last_error = SPI_getvalue(tup, desc, 12);
	ev->dead_letter_requested = DatumGetBool(SPI_getbinval(tup, desc, 13, &isnull));
	ev->xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 14, &isnull));
	ev->action = EV_PUBLISH;
	ev->produced = false;
	ev->solo = false;
	ev->retry_alone = false;
	ev->next = -1;
}

/* Bytes an event holds in memory: what outbox.batch_bytes counts. */
static int64
event_bytes(BatchEvent *ev)
{
	return sizeof(BatchEvent) + strlen(ev->event_id) + strlen(ev->aggregate_type) +
		strlen(ev->aggregate_id) + strlen(ev->event_type) + strlen(ev->topic) +
		(ev->headers ? VARSIZE(ev->headers) : 0) +
		ev->payload_len +
		(ev->last_error ? strlen(ev->last_error) : 0);
}

/*
 * Read a batch into the flight: the oldest pending events not of a busy
 * aggregate (one in flight, not settled yet: rows stay pending until then,
 * and are skipped here), at most max_events and, past the first, max_bytes
 * of them.  The query's LIMIT bounds the rows looked at, skipped ones
 * included.  A cursor, read in chunks sized by the bytes left, keeps the
 * rows in memory at once near that bound however large the events are.
 * Returns the number of events.
 */
int
publish_fetch(Datum *args, Flight *f, int max_events, int64 max_bytes)
{
	Portal		portal = SPI_cursor_open(NULL, fetch_plan, args, NULL, true);
	int			size = Min(max_events, 1024);
	BatchEvent *events = MemoryContextAlloc(f->cxt, sizeof(BatchEvent) * size);
	int			n = 0;
	int			skipped = 0;
	int64		bytes = 0;
	long		chunk = 16;

	while (n < max_events && bytes < max_bytes)
	{
		uint64		nrows;

		SPI_cursor_fetch(portal, true, chunk);
		nrows = SPI_processed;
		for (uint64 r = 0; r < nrows && n < max_events && bytes < max_bytes; r++)
		{
			HeapTuple	tup = SPI_tuptable->vals[r];
			MemoryContext oldcxt;
			bool		isnull;

			if (publish_aggregate_busy(TextDatumGetCString(SPI_getbinval(tup, SPI_tuptable->tupdesc,
																		  4, &isnull))))
			{
				skipped++;
				continue;
			}
			oldcxt = MemoryContextSwitchTo(f->cxt);
			if (n == size)
			{
				size = Min(max_events, size * 2);
				events = repalloc(events, sizeof(BatchEvent) * size);
			}
			copy_row(&events[n], tup, SPI_tuptable->tupdesc);
			MemoryContextSwitchTo(oldcxt);
			bytes += event_bytes(&events[n]);
			n++;
		}
		SPI_freetuptable(SPI_tuptable);
		if (nrows < (uint64) chunk)
			break;				/* no more pending events */
		/* As many rows as the bytes left hold, at the average size so far. */
		chunk = Max(1, Min(1000, (max_bytes - bytes) / Max(bytes / Max(n, 1), 1)));
		chunk = Min(chunk, max_events - n);
	}
	SPI_cursor_close(portal);
	f->events = events;
	f->nevents = n;
	f->bytes = bytes;
	f->results = MemoryContextAllocZero(f->cxt, sizeof(DeliveryResult) * Max(n, 1));
	elog(DEBUG1, "outbox: fetched %d events, skipped %d of busy aggregates", n, skipped);
	return n;
}
