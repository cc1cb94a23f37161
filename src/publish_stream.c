/*-------------------------------------------------------------------------
 *
 * publish_stream.c
 *	  Where the publisher is in the stream of commits: the deltas read (the
 *	  transactions a snapshot sees that the previous read's did not, as PgQ
 *	  batches are), what each still owes, the aggregates diverted from the
 *	  stream to be read by index, and the horizon stored per worker.
 *
 * Nothing is written per event when Kafka acknowledges it: an event is
 * published once its version is at or below its aggregate's
 * last_published_version.  The stream only says where new events are.
 *
 * An aggregate of a delta is "owed" by the delta until its events read
 * there are settled (their aggregate's progress committed), or it became
 * one the database itself lists to be read by index (aggregate_publication:
 * catch_up, backing off, blocked, paused).  An aggregate whose events
 * could not be sent from the stream (one in flight, locked by an operator,
 * over a batch's limit, refused for now) is diverted: kept here, still
 * owed, and read later by the (aggregate_id, aggregate_version) index from
 * its last published version, with the snapshot of the stream's read then.
 *
 * The horizon advances to a delta's snapshot once it and every older delta
 * owe nothing: every event of this worker's share that snapshot sees is
 * then settled or of an aggregate the database lists.  A worker that
 * starts, or whose share of the buckets changed, reads again from the
 * oldest stored horizon; what it reads that is settled already is dropped
 * by the version check, so that costs reading, not re-sending.
 *
 * The oldest stored horizon covers every bucket only if no worker skipped
 * a bucket that the worker now owning it had not yet covered.  So a
 * worker, before its first read, lowers its own row to the oldest one (or
 * NULL, "from the start", if there is none) and commits it, and only then
 * do the others count it in the shares (its slot's reading_extension,
 * worker.c): everything they skip from then on is after its row.  Without
 * that, a worker that started a moment after another began from the
 * other's horizon, past the events of its own share the other had skipped.
 * With three or more workers buckets also move between workers that stay:
 * so a worker stores its horizon only while every worker reads by the same
 * shares, each having read again from the oldest horizon for them
 * (publish_shares_agreed): the old owner of a bucket keeps its row below
 * the bucket's events until the new owner has started below them.
 *
 * All of it lives in stream_context (worker lifetime); errors in the loop
 * reset it to the horizon (publish_stream_reset), like a restart would.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "shmem.h"
#include "util.h"
#include "publish.h"

/* A delta read from the stream, and what it still owes. */
typedef struct Delta
{
	int64		seq;
	char	   *snapshot;		/* pg_snapshot text of its read */
	int			owed;			/* its aggregates not settled or listed yet */
	bool		complete;		/* every event of it has been read */
	struct Delta *next;			/* the next newer delta */
} Delta;

/* An aggregate diverted from the stream, to be read by index. */
typedef struct Diverted
{
	char	   *aggregate_id;	/* hash key: must be first */
	int64		owed;			/* the oldest delta that owes it (0: none) */
} Diverted;

static MemoryContext stream_context = NULL;

/* Oldest first; the newest is the one whose manifest is being read. */
static Delta *deltas_head = NULL;
static Delta *deltas_tail = NULL;
static int64 next_delta_seq = 1;

/* The manifest of the newest delta: its events, in the order read. */
static ManifestEntry *manifest = NULL;
static int	manifest_len = 0;
static int	manifest_pos = 0;

static HTAB *diverted = NULL;

/*
 * The snapshot the next delta starts from (the previous delta's, or the
 * horizon after a reset); NULL before the first read without a horizon:
 * then everything unsettled is read.
 */
static char *read_from = NULL;
static bool started = false;
static bool claim_uncommitted = false;	/* our row, written in this transaction */
static int	started_nshares = -1;
static int	started_share = -1;

/* The horizon reached, and the one stored. */
static char *horizon = NULL;
static char *horizon_stored = NULL;
static TimestampTz horizon_stored_at = 0;

/*
 * How often the horizon is stored while it moves.  A restart reads from the
 * stored one; what it reads again that was settled since is dropped by the
 * version check, not sent: an older horizon costs reading, not duplicates.
 * Storing it at every read wrote a row per read (a third of the reads'
 * cost at a steady 1,000 events/s).
 */
#define HORIZON_STORE_MS 1000

static void claim_row(void);

/*
 * Horizons oldest first (NULL: from the start).  Two snapshots may share
 * xmin and xmax (xmax is the latest completed xid + 1) while the later one
 * sees more: the one with more transactions in progress is the older.
 */
#define OLDEST_FIRST(h) \
	"pg_catalog.pg_snapshot_xmin(" h ".snapshot) NULLS FIRST, " \
	"pg_catalog.pg_snapshot_xmax(" h ".snapshot) NULLS FIRST, " \
	"(SELECT pg_catalog.count(*) FROM pg_catalog.pg_snapshot_xip(" h ".snapshot)) DESC"

static SPIPlanPtr load_plan = NULL;
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr store_plan = NULL;
static SPIPlanPtr forget_plan = NULL;

/* Set up this module's memory (in the worker, once). */
void
publish_stream_start(void)
{
	stream_context = AllocSetContextCreate(TopMemoryContext, "outbox stream",
										   ALLOCSET_DEFAULT_SIZES);
	diverted = outbox_aggregate_table("outbox diverted aggregates", sizeof(Diverted),
									   1024, stream_context);
}

/* Prepare this module's plans for the extension in schema s (quoted). */
void
publish_stream_prepare(const char *s)
{
	Oid			store_types[2] = {INT4OID, TEXTOID};
	Oid			load_types[1] = {INT4OID};

	if (load_plan)
	{
		SPI_freeplan(load_plan);
		SPI_freeplan(claim_plan);
		SPI_freeplan(store_plan);
		SPI_freeplan(forget_plan);
	}
	/* Another extension (dropped and created again): start from its horizon. */
	started = false;
	claim_uncommitted = false;

	/* The oldest horizon of all workers (NULL: from the start). */
	load_plan = publish_keep_plan(psprintf(
										  "SELECT h.snapshot::pg_catalog.text FROM %s.publisher_horizon h "
										  "ORDER BY " OLDEST_FIRST("h") " LIMIT 1", s),
								 0, NULL);
	/* Our row, lowered to the oldest (NULL if there is none). */
	claim_plan = publish_keep_plan(psprintf(
										   "INSERT INTO %s.publisher_horizon AS h (worker, snapshot, updated_at) "
										   "SELECT $1, (SELECT o.snapshot FROM %s.publisher_horizon o "
										   "ORDER BY " OLDEST_FIRST("o") " LIMIT 1), "
										   "pg_catalog.clock_timestamp() "
										   "ON CONFLICT (worker) DO UPDATE SET snapshot = excluded.snapshot, "
										   "updated_at = excluded.updated_at", s, s),
								  1, load_types);
	store_plan = publish_keep_plan(psprintf(
										   "INSERT INTO %s.publisher_horizon AS h (worker, snapshot, updated_at) "
										   "VALUES ($1, $2::pg_catalog.pg_snapshot, pg_catalog.clock_timestamp()) "
										   "ON CONFLICT (worker) DO UPDATE SET snapshot = excluded.snapshot, "
										   "updated_at = excluded.updated_at", s),
								  2, store_types);
	/* Horizons of workers that no longer exist (outbox.workers was lowered). */
	forget_plan = publish_keep_plan(psprintf(
											"DELETE FROM %s.publisher_horizon WHERE worker OPERATOR(pg_catalog.>=) $1", s),
								   1, load_types);
}

/* Find the delta of a sequence number, or NULL (dropped by a reset). */
static Delta *
find_delta(int64 seq)
{
	for (Delta *d = deltas_head; d != NULL; d = d->next)
		if (d->seq == seq)
			return d;
	return NULL;
}

/* Advance the horizon over the oldest deltas that owe nothing. */
static void
advance_horizon(void)
{
	while (deltas_head != NULL && deltas_head->complete && deltas_head->owed == 0)
	{
		Delta	   *d = deltas_head;

		if (horizon)
			pfree(horizon);
		horizon = d->snapshot;
		deltas_head = d->next;
		if (deltas_head == NULL)
			deltas_tail = NULL;
		pfree(d);
	}
}

/* One aggregate of delta seq is no longer owed (0: none owes it). */
static void
release_owed(int64 seq)
{
	Delta	   *d;

	if (seq == 0 || (d = find_delta(seq)) == NULL)
		return;
	Assert(d->owed > 0);
	d->owed--;
	advance_horizon();
}

/*
 * Forget the stream read since the horizon: the next read starts there.
 * Flights in flight stay; what they owed is forgotten with the deltas.
 */
void
publish_stream_reset(void)
{
	MemoryContext oldcxt;

	if (stream_context == NULL)
		return;
	/* A row written by an aborted transaction is not there: claim again. */
	if (claim_uncommitted)
	{
		started = false;
		claim_uncommitted = false;
	}
	oldcxt = MemoryContextSwitchTo(stream_context);
	while (deltas_head != NULL)
	{
		Delta	   *d = deltas_head;

		deltas_head = d->next;
		pfree(d->snapshot);
		pfree(d);
	}
	deltas_tail = NULL;
	if (manifest)
		pfree(manifest);
	manifest = NULL;
	manifest_len = manifest_pos = 0;
	{
		HASH_SEQ_STATUS seq;
		Diverted   *d;

		hash_seq_init(&seq, diverted);
		while ((d = hash_seq_search(&seq)) != NULL)
			pfree(d->aggregate_id);
	}
	hash_destroy(diverted);
	diverted = outbox_aggregate_table("outbox diverted aggregates", sizeof(Diverted),
									   1024, stream_context);
	MemoryContextSwitchTo(oldcxt);
	if (read_from)
		pfree(read_from);
	read_from = horizon ? MemoryContextStrdup(stream_context, horizon) : NULL;
}

/*
 * In the read transaction: on the first read, or when this worker's share
 * of the buckets changed, start from the oldest stored horizon (another
 * worker's events may be ours now).  On the first read, our row is first
 * lowered to it (see the header).
 */
void
publish_stream_begin(int nshares, int share)
{
	if (started && nshares == started_nshares && share == started_share)
		return;
	if (!started)
		claim_row();
	if (SPI_execute_plan(load_plan, NULL, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the publisher horizon");
	if (horizon)
		pfree(horizon);
	horizon = NULL;
	if (SPI_processed > 0)
	{
		char	   *h = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		if (h != NULL)
			horizon = MemoryContextStrdup(stream_context, h);
	}
	if (horizon_stored)
		pfree(horizon_stored);
	horizon_stored = NULL;
	publish_stream_reset();
	claim_uncommitted = !started;
	started = true;
	started_nshares = nshares;
	started_share = share;
	elog(DEBUG1, "outbox: reading the stream from %s", read_from ? read_from : "the start");
}

/*
 * Write our row as the oldest horizon, and (worker 0) fold in and delete
 * the rows of workers that no longer exist (outbox.workers was lowered,
 * which takes a restart: no such worker runs).
 */
static void
claim_row(void)
{
	Datum		arg = Int32GetDatum(publish_worker_index);

	if (SPI_execute_plan(claim_plan, &arg, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write the publisher horizon");
	if (publish_worker_index == 0)
	{
		Datum		n = Int32GetDatum(outbox_workers);

		if (SPI_execute_plan(forget_plan, &n, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not delete old publisher horizons");
	}
}

/*
 * After the read transaction committed: true once, when it committed our
 * row (the others may leave our share to us from now on).
 */
bool
publish_stream_claim_committed(void)
{
	if (!claim_uncommitted)
		return false;
	claim_uncommitted = false;
	return true;
}

/* Is the stream read by these shares, from the oldest horizon for them? */
bool
publish_stream_reading(int nshares, int share)
{
	return started && nshares == started_nshares && share == started_share;
}

/*
 * Store the horizon reached, if it moved and every worker reads by the same
 * shares (publish_shares_agreed), in a transaction, with SPI.
 */
void
publish_stream_store_horizon(void)
{
	Datum		args[2];

	if (horizon == NULL ||
		(horizon_stored != NULL && strcmp(horizon, horizon_stored) == 0) ||
		!TimestampDifferenceExceeds(horizon_stored_at, GetCurrentTimestamp(), HORIZON_STORE_MS) ||
		!publish_shares_agreed())
		return;
	args[0] = Int32GetDatum(publish_worker_index);
	args[1] = CStringGetTextDatum(horizon);
	if (SPI_execute_plan(store_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not store the publisher horizon");
	if (horizon_stored)
		pfree(horizon_stored);
	horizon_stored = MemoryContextStrdup(stream_context, horizon);
	horizon_stored_at = GetCurrentTimestamp();
}

/* The snapshot the next delta starts from, or NULL: read everything unsettled. */
const char *
publish_stream_read_from(void)
{
	return read_from;
}

/* Is the newest delta's manifest read to its end (a new delta is due)? */
bool
publish_stream_manifest_done(void)
{
	return manifest_pos >= manifest_len;
}

/*
 * Does the rest of the newest delta's manifest start with an aggregate the
 * reads before did not reach (by its hash, the manifest's first key)?
 */
bool
publish_stream_manifest_at_aggregate(void)
{
	return manifest_pos < manifest_len &&
		(manifest_pos == 0 || manifest[manifest_pos].hash != manifest[manifest_pos - 1].hash);
}

/*
 * A new delta was read at snapshot (its n events in the order to read
 * them, allocated in any context): it becomes the newest, and the next one
 * starts from its snapshot.
 */
void
publish_stream_new_delta(const char *snapshot, ManifestEntry *entries, int n)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(stream_context);
	Delta	   *d = palloc0(sizeof(Delta));

	d->seq = next_delta_seq++;
	d->snapshot = pstrdup(snapshot);
	if (deltas_tail)
		deltas_tail->next = d;
	else
		deltas_head = d;
	deltas_tail = d;
	if (manifest)
		pfree(manifest);
	manifest = palloc(sizeof(ManifestEntry) * Max(n, 1));
	memcpy(manifest, entries, sizeof(ManifestEntry) * n);
	manifest_len = n;
	manifest_pos = 0;
	if (read_from)
		pfree(read_from);
	read_from = pstrdup(snapshot);
	MemoryContextSwitchTo(oldcxt);
	d->complete = (n == 0);
	advance_horizon();
}

/*
 * The next events of the manifest to read, at most max: *entries points
 * into the manifest.  Returns their number; the newest delta is complete
 * once it returned the last.  The delta they owe is *seq.
 */
int
publish_stream_next_ids(int max, ManifestEntry **entries, int64 *seq)
{
	int			n = Min(max, manifest_len - manifest_pos);

	*entries = manifest + manifest_pos;
	*seq = deltas_tail ? deltas_tail->seq : 0;
	manifest_pos += n;
	return n;
}

/* Done with the events publish_stream_next_ids() returned: maybe complete. */
void
publish_stream_ids_done(void)
{
	if (deltas_tail != NULL && manifest_pos >= manifest_len)
	{
		deltas_tail->complete = true;
		advance_horizon();
	}
}

/* An aggregate of delta seq went into a flight: the delta owes it. */
void
publish_stream_owe(int64 seq)
{
	Delta	   *d = find_delta(seq);

	if (d != NULL)
		d->owed++;
}

/* Is the aggregate diverted (its events are read by index, not the stream)? */
bool
publish_stream_is_diverted(const char *aggregate_id)
{
	return hash_search(diverted, &aggregate_id, HASH_FIND, NULL) != NULL;
}

/*
 * Divert an aggregate owed by delta seq (0: none) from the stream: it is
 * read by index later.  Diverted already, the older debt stays.
 */
void
publish_stream_divert(const char *aggregate_id, int64 seq)
{
	Diverted   *d;
	bool		found;
	char	   *key = (char *) aggregate_id;

	d = hash_search(diverted, &key, HASH_ENTER, &found);
	if (!found)
	{
		d->aggregate_id = MemoryContextStrdup(stream_context, aggregate_id);
		d->owed = seq;
		return;
	}
	/* An older debt covers it (one forgotten by a reset covers nothing). */
	if (d->owed == 0 || find_delta(d->owed) == NULL)
		d->owed = seq;
	else
		release_owed(seq);
}

/*
 * The diverted aggregates to read now (not busy: in flight, as the caller
 * knows), at most max, as a palloc'd array in the current context.  Returns
 * their number.
 */
int
publish_stream_diverted_ready(char ***ids, int max, bool (*busy) (const char *aggregate_id))
{
	HASH_SEQ_STATUS seq;
	Diverted   *d;
	int			n = 0;

	*ids = palloc(sizeof(char *) * Max(Min(max, hash_get_num_entries(diverted)), 1));
	hash_seq_init(&seq, diverted);
	while ((d = hash_seq_search(&seq)) != NULL)
	{
		if (n >= max)
		{
			hash_seq_term(&seq);
			break;
		}
		if (!busy(d->aggregate_id))
			(*ids)[n++] = d->aggregate_id;
	}
	return n;
}

/*
 * A diverted aggregate leaves the list: it was read (its debt goes with its
 * events: returned, to be owed by the flight), or nothing of it is pending,
 * or the database lists it now (release: the debt is paid).
 */
int64
publish_stream_undivert(const char *aggregate_id, bool release)
{
	char	   *key = (char *) aggregate_id;
	Diverted   *d = hash_search(diverted, &key, HASH_FIND, NULL);
	int64		seq;

	if (d == NULL)
		return 0;
	seq = d->owed;
	key = d->aggregate_id;
	(void) hash_search(diverted, &key, HASH_REMOVE, NULL);
	pfree(key);
	if (release)
	{
		release_owed(seq);
		return 0;
	}
	return seq;
}

/*
 * An aggregate of a flight, owed by delta seq, is settled: covered (its
 * progress committed, or the database lists it) pays the debt; otherwise
 * (events not sent or not acknowledged) it is diverted, still owed.
 */
void
publish_stream_settled(const char *aggregate_id, int64 seq, bool covered)
{
	if (covered)
		release_owed(seq);
	else
		publish_stream_divert(aggregate_id, seq);
}

/* Diverted aggregates (for the worker's state). */
long
publish_stream_diverted_count(void)
{
	return diverted ? hash_get_num_entries(diverted) : 0;
}
