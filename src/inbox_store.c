/*-------------------------------------------------------------------------
 *
 * inbox_store.c
 *	  The inbox workers' statements on the extension's tables: the kept
 *	  plans, a batch's rows of inbox_offset, inbox_aggregate and inbox
 *	  (inbox retention's statement is retention.c's).
 *
 * The plans are prepared (inbox_prepare_plans) in the transaction of a
 * subscriptions refresh, again whenever the extension's schema changes
 * (inbox_plans_nspid says for which), and kept for the worker's life.
 *
 * The rest runs in a batch's transaction (inbox_apply.c), connected to SPI.
 * A partition's row of inbox_offset is locked FOR UPDATE (created if it is
 * missing) before any of its messages is looked at, and written back at the
 * end of the batch with the counters and the retry or block state
 * (inbox_save_partition): two workers never apply a partition at once, and
 * the stored offset, the position of record, commits with the handlers'
 * effects.  The aggregates' last versions are read in one statement at the
 * start into the batch's cache (inbox_load_aggregates) and stored at the end
 * in aggregate id order, the lock order (inbox_flush_aggregates).  A claim
 * in table inbox records an event as applied or disposed of.  Retention
 * deletes old claims skipping locked rows: never waiting, it cannot
 * deadlock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "compat.h"
#include "shmem.h"
#include "util.h"
#include "inbox_worker.h"
#include "inbox.h"

/* Kept plans, for the schema they were prepared in. */
Oid			inbox_plans_nspid = InvalidOid;
static Oid	message_typid = InvalidOid;
TupleDesc	inbox_message_desc = NULL;
SPIPlanPtr	inbox_subs_plan,
			inbox_offset_read_plan,
			inbox_claim_many_plan,
			inbox_dead_letter_plan,
			inbox_retention_plan;
static SPIPlanPtr offset_lock_plan,
			offset_insert_plan,
			offset_update_plan,
			agg_read_plan,
			agg_flush_plan,
			agg_update_plan,
			claim_plan;

/* ---------- plans ---------- */

/* The row of inbox_offset of partition ($1 consumer, $2 topic, $3 partition). */
#define PARTITION_ROW \
	"WHERE o.consumer OPERATOR(pg_catalog.=) $1 AND o.topic OPERATOR(pg_catalog.=) $2 " \
	"AND o.\"partition\" OPERATOR(pg_catalog.=) $3"

/*
 * Find the extension and prepare the plans (again if it moved); false if it
 * is not installed.  Called inside a transaction, connected to SPI.
 */
bool
inbox_prepare_plans(void)
{
	Oid			nspid;
	const char *s;
	Oid			t3[] = {TEXTOID, TEXTOID, INT4OID};
	Oid			t2[] = {TEXTOID, TEXTOID};
	Oid			tarr[] = {TEXTOID, TEXTARRAYOID};
	Oid			tflush[] = {TEXTOID, TEXTARRAYOID, INT8ARRAYOID};
	Oid			tupdagg[] = {TEXTOID, TIDARRAYOID, TEXTARRAYOID, INT8ARRAYOID};
	Oid			tupd[] = {TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, INT8OID,
		INT8OID, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID, INT4OID, TEXTOID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, BOOLOID, BOOLOID};
	Oid			tdl[4];
	bool		isnull;

	if (SPI_execute("SELECT e.extnamespace, n.nspname FROM pg_catalog.pg_extension e "
					"JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace "
					"WHERE e.extname OPERATOR(pg_catalog.=) 'outbox'", true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up the outbox extension");
	if (SPI_processed == 0)
		return false;
	nspid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 1, &isnull));
	if (nspid == inbox_plans_nspid)
		return true;
	s = quote_identifier(SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2));

	message_typid = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
									CStringGetDatum("inbox_message"),
									ObjectIdGetDatum(nspid));
	if (!OidIsValid(message_typid))
		elog(ERROR, "type inbox_message of the outbox extension is missing");
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		inbox_message_desc = lookup_rowtype_tupdesc_copy(message_typid, -1);
		MemoryContextSwitchTo(old);
	}

	inbox_subs_plan = outbox_keep_plan(psprintf(
								   "SELECT s.consumer, s.topics, s.topics::pg_catalog.text, s.handler::pg_catalog.text, s.owner::pg_catalog.oid "
								   "FROM %s.inbox_subscription s ORDER BY s.consumer", s), 0, NULL);
	offset_lock_plan = outbox_keep_plan(psprintf(
										  "SELECT o.next_offset, o.attempts, o.last_error, o.next_attempt_at, "
										  "o.blocked_at, o.blocked_reason, o.accept_gap, o.skip_requested "
										  "FROM %s.inbox_offset o " PARTITION_ROW " FOR UPDATE", s), 3, t3);
	offset_insert_plan = outbox_keep_plan(psprintf(
											"INSERT INTO %s.inbox_offset (consumer, topic, \"partition\") "
											"VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", s), 3, t3);
	inbox_offset_read_plan = outbox_keep_plan(psprintf(
										  "SELECT o.next_offset, o.blocked_at IS NULL AND "
										  "(o.next_attempt_at IS NULL OR o.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()) "
										  "FROM %s.inbox_offset o " PARTITION_ROW, s), 3, t3);
	offset_update_plan = outbox_keep_plan(psprintf(
											"UPDATE %s.inbox_offset o SET next_offset = $4, high_watermark = $5, "
											"last_applied_offset = coalesce($6, o.last_applied_offset), "
											"last_applied_at = CASE WHEN $6 IS NULL THEN o.last_applied_at ELSE pg_catalog.clock_timestamp() END, "
											"applied = o.applied OPERATOR(pg_catalog.+) $7, "
											"duplicates = o.duplicates OPERATOR(pg_catalog.+) $8, "
											"gaps = o.gaps OPERATOR(pg_catalog.+) $9, "
											"errors = o.errors OPERATOR(pg_catalog.+) $10, "
											"dead_lettered = o.dead_lettered OPERATOR(pg_catalog.+) $11, "
											"skipped = o.skipped OPERATOR(pg_catalog.+) $12, attempts = $13, last_error = $14, "
											"next_attempt_at = $15, blocked_at = $16, blocked_reason = $17, "
											"accept_gap = $18, skip_requested = $19, updated_at = pg_catalog.clock_timestamp() "
											PARTITION_ROW,
											s), lengthof(tupd), tupd);

	/*
	 * Planned at every batch, for its array and the table's current size: a
	 * generic plan made while inbox_aggregate was small scanned the whole
	 * table and compared each row with every element of the array (no
	 * hashing for a parameter), 7 times the CPU of the rest of the batch
	 * once the table held 10,000 aggregates, until an ANALYZE.
	 */
	agg_read_plan = outbox_keep_plan_options(psprintf(
												"SELECT a.aggregate_id, a.last_version, a.ctid FROM %s.inbox_aggregate a "
												"WHERE a.consumer OPERATOR(pg_catalog.=) $1 "
												"AND a.aggregate_id OPERATOR(pg_catalog.=) ANY ($2)", s),
									 2, tarr, CURSOR_OPT_CUSTOM_PLAN);

	/*
	 * The rows just read, updated where they are: a nested loop of TID
	 * scans in the arrays' order (the lock order), whatever their size, so
	 * the generic plan.  A row updated meanwhile is followed to its new
	 * version, or not returned (then upserted).
	 */
	agg_update_plan = outbox_keep_plan_options(psprintf(
												  "UPDATE %s.inbox_aggregate a SET last_version = GREATEST(a.last_version, u.v), "
												  "updated_at = pg_catalog.clock_timestamp() "
												  "FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4)) AS u(t, id, v) "
												  "WHERE a.ctid OPERATOR(pg_catalog.=) u.t AND a.consumer OPERATOR(pg_catalog.=) $1 "
												  "AND a.aggregate_id OPERATOR(pg_catalog.=) u.id "
												  "RETURNING a.aggregate_id", s),
										 lengthof(tupdagg), tupdagg, CURSOR_OPT_GENERIC_PLAN);
	/*
	 * No ON CONFLICT: the version check has dropped the duplicates of
	 * published events, those within the batch are dropped before, and a
	 * plain insert descends the index once, not twice.  A claim already
	 * there is a unique violation, which sends the batch to the careful
	 * path (claim_plan, one by one).
	 */
	inbox_claim_many_plan = outbox_keep_plan(psprintf(
										 "INSERT INTO %s.inbox (consumer, event_id) "
										 "SELECT $1, u.id FROM pg_catalog.unnest($2) AS u(id)", s), 2, tarr);
	agg_flush_plan = outbox_keep_plan(psprintf(
										"INSERT INTO %s.inbox_aggregate AS a (consumer, aggregate_id, last_version) "
										"SELECT $1, u.id, u.v FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS u(id, v) "
										"ON CONFLICT (consumer, aggregate_id) DO UPDATE SET "
										"last_version = GREATEST(a.last_version, excluded.last_version), "
										"updated_at = pg_catalog.clock_timestamp()", s), 3, tflush);
	claim_plan = outbox_keep_plan(psprintf(
									"INSERT INTO %s.inbox (consumer, event_id) VALUES ($1, $2) "
									"ON CONFLICT DO NOTHING", s), 2, t2);
	tdl[0] = TEXTOID;
	tdl[1] = message_typid;
	tdl[2] = TEXTOID;
	tdl[3] = INT4OID;
	inbox_dead_letter_plan = outbox_keep_plan(psprintf(
										  "INSERT INTO %s.inbox_dead_letter (consumer, message, error, attempts) "
										  "VALUES ($1, $2, $3, $4)", s), 4, tdl);
	inbox_retention_plan = inbox_retention_prepare(s);
	inbox_state_prepare(s, inbox_worker_index);
	inbox_plans_nspid = nspid;
	return true;
}

/* ---------- a batch's rows ---------- */

/*
 * Read the last versions of every aggregate the batch's messages name, in
 * one statement, into the batch's cache.
 */
void
inbox_load_aggregates(HTAB *aggs, InboxSub *sub, MessageMeta *metas, int n)
{
	Datum	   *ids = palloc(sizeof(Datum) * Max(n, 1));
	int			k = 0;
	Datum		args[2];

	for (int i = 0; i < n; i++)
	{
		char	   *key = metas[i].aggregate_id;
		bool		found;
		InboxAggregate *a;

		if (key == NULL || metas[i].aggregate_version <= 0)
			continue;
		a = hash_search(aggs, &key, HASH_ENTER, &found);
		if (found)
			continue;
		a->aggregate_id = key;
		a->last_version = 0;
		a->stored = false;
		a->dirty = false;
		ids[k++] = CStringGetTextDatum(key);
	}
	if (k == 0)
		return;
	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = PointerGetDatum(construct_array(ids, k, TEXTOID, -1, false, TYPALIGN_INT));
	if (SPI_execute_plan(agg_read_plan, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read inbox aggregate versions");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char	   *key = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		bool		isnull;
		InboxAggregate *a = hash_search(aggs, &key, HASH_FIND, NULL);

		if (a == NULL)
			continue;
		a->last_version = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
													  SPI_tuptable->tupdesc, 2, &isnull));
		a->tid = *(ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[i],
															  SPI_tuptable->tupdesc, 3, &isnull));
		a->stored = true;
	}
}

/* The cached version state of an aggregate (loaded by inbox_load_aggregates). */
InboxAggregate *
inbox_aggregate_state(HTAB *aggs, const char *aggregate_id)
{
	char	   *key = (char *) aggregate_id;
	InboxAggregate *a = hash_search(aggs, &key, HASH_FIND, NULL);

	if (a == NULL)
		elog(ERROR, "inbox batch lost track of aggregate \"%s\"", aggregate_id);
	return a;
}

/* Record a disposed-of event as claimed, so a replay of it is a duplicate. */
void
inbox_claim_message(InboxSub *sub, const char *identity, bool *claimed)
{
	Datum		args[2];

	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = CStringGetTextDatum(identity);
	if (SPI_execute_plan(claim_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "inbox claim failed");
	if (claimed)
		*claimed = SPI_processed == 1;
}

/* Lock (creating if need be) a partition's row and load its state. */
void
inbox_lock_partition(InboxSub *sub, PartState *ps)
{
	Datum		args[3];
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = CStringGetTextDatum(ps->topic);
	args[2] = Int32GetDatum(ps->partition);
	for (int tries = 0;; tries++)
	{
		if (SPI_execute_plan(offset_lock_plan, args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not lock an inbox partition");
		if (SPI_processed == 1 || tries > 0)
			break;
		if (SPI_execute_plan(offset_insert_plan, args, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not create an inbox partition");
	}
	if (SPI_processed != 1)
		elog(ERROR, "inbox partition row vanished");
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	d = SPI_getbinval(tup, desc, 1, &isnull);
	ps->next_offset = isnull ? -1 : DatumGetInt64(d);
	ps->attempts = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
	ps->last_error = SPI_getvalue(tup, desc, 3);
	d = SPI_getbinval(tup, desc, 4, &isnull);
	ps->next_attempt_at = isnull ? 0 : DatumGetTimestampTz(d);
	d = SPI_getbinval(tup, desc, 5, &isnull);
	ps->blocked_at = isnull ? 0 : DatumGetTimestampTz(d);
	ps->blocked_reason = SPI_getvalue(tup, desc, 6);
	ps->accept_gap = DatumGetBool(SPI_getbinval(tup, desc, 7, &isnull));
	ps->skip_requested = DatumGetBool(SPI_getbinval(tup, desc, 8, &isnull));
	ps->last_applied_offset = -1;
}

/* Write a partition's new state, in the batch's transaction. */
void
inbox_save_partition(InboxSub *sub, PartState *ps)
{
	Datum		v[19];
	char		n[19];
	int64		lo,
				hi;

	memset(n, ' ', sizeof(n));
	v[0] = CStringGetTextDatum(sub->consumer);
	v[1] = CStringGetTextDatum(ps->topic);
	v[2] = Int32GetDatum(ps->partition);
	v[3] = Int64GetDatum(ps->next_offset);
	n[3] = ps->next_offset < 0 ? 'n' : ' ';
	/* Cached from fetch responses: no round trip. */
	if (rd_kafka_get_watermark_offsets(sub->rk, ps->topic, ps->partition, &lo, &hi) == RD_KAFKA_RESP_ERR_NO_ERROR && hi >= 0)
		v[4] = Int64GetDatum(hi);
	else
		n[4] = 'n';
	v[5] = Int64GetDatum(ps->last_applied_offset);
	n[5] = ps->last_applied_offset < 0 ? 'n' : ' ';
	v[6] = Int64GetDatum(ps->applied);
	v[7] = Int64GetDatum(ps->duplicates);
	v[8] = Int64GetDatum(ps->gaps);
	v[9] = Int64GetDatum(ps->errors);
	v[10] = Int64GetDatum(ps->dead_lettered);
	v[11] = Int64GetDatum(ps->skipped);
	v[12] = Int32GetDatum(ps->attempts);
	v[13] = ps->last_error ? CStringGetTextDatum(ps->last_error) : (n[13] = 'n', (Datum) 0);
	v[14] = TimestampTzGetDatum(ps->next_attempt_at);
	n[14] = ps->next_attempt_at == 0 ? 'n' : ' ';
	v[15] = TimestampTzGetDatum(ps->blocked_at);
	n[15] = ps->blocked_at == 0 ? 'n' : ' ';
	v[16] = ps->blocked_reason ? CStringGetTextDatum(ps->blocked_reason) : (n[16] = 'n', (Datum) 0);
	v[17] = BoolGetDatum(ps->accept_gap);
	v[18] = BoolGetDatum(ps->skip_requested);
	if (SPI_execute_plan(offset_update_plan, v, n, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "could not store an inbox offset");
}

/* qsort comparator of aggregate ids (the lock order of the flush). */
static int
agg_cmp(const void *a, const void *b)
{
	return strcmp((*(InboxAggregate *const *) a)->aggregate_id, (*(InboxAggregate *const *) b)->aggregate_id);
}

/*
 * The aggregates of list (k of them) that were read before (stored) or,
 * else, are still dirty, as array arguments in list order: their ctids
 * (only where tids is not NULL: they are stored), ids and versions.
 * Returns how many there are.
 */
static int
aggregate_arrays(InboxAggregate **list, int k, bool stored, Datum *tids, Datum *ids, Datum *vers)
{
	Datum	   *t = palloc(sizeof(Datum) * Max(k, 1));
	Datum	   *idv = palloc(sizeof(Datum) * Max(k, 1));
	Datum	   *v = palloc(sizeof(Datum) * Max(k, 1));
	int			m = 0;

	for (int i = 0; i < k; i++)
	{
		if (stored ? !list[i]->stored : !list[i]->dirty)
			continue;
		t[m] = PointerGetDatum(&list[i]->tid);
		idv[m] = CStringGetTextDatum(list[i]->aggregate_id);
		v[m] = Int64GetDatum(list[i]->last_version);
		m++;
	}
	if (m == 0)
		return 0;
	if (tids != NULL)
		*tids = PointerGetDatum(construct_array(t, m, TIDOID, sizeof(ItemPointerData), false, TYPALIGN_SHORT));
	*ids = PointerGetDatum(construct_array(idv, m, TEXTOID, -1, false, TYPALIGN_INT));
	*vers = PointerGetDatum(construct_array(v, m, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	return m;
}

/*
 * Update the rows of the moved aggregates that inbox_load_aggregates read (list,
 * sorted), by ctid: no index descent, no speculative insertion.  Those
 * updated are no longer dirty.
 */
static void
update_stored_aggregates(InboxSub *sub, HTAB *aggs, InboxAggregate **list, int k)
{
	Datum		args[4];

	if (aggregate_arrays(list, k, true, &args[1], &args[2], &args[3]) == 0)
		return;
	args[0] = CStringGetTextDatum(sub->consumer);
	if (SPI_execute_plan(agg_update_plan, args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "could not update inbox aggregate versions");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char	   *key = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);

		inbox_aggregate_state(aggs, key)->dirty = false;
	}
}

/*
 * Store the versions of the aggregates the batch moved: rows read before
 * are updated in place, the others (new, or moved meanwhile) upserted.
 * Both in aggregate id order, the lock order.
 */
void
inbox_flush_aggregates(InboxSub *sub, HTAB *aggs)
{
	long		n = hash_get_num_entries(aggs);
	InboxAggregate **list = palloc(sizeof(InboxAggregate *) * Max(n, 1));
	HASH_SEQ_STATUS seq;
	InboxAggregate *a;
	int			k = 0;
	Datum		args[3];

	hash_seq_init(&seq, aggs);
	while ((a = hash_seq_search(&seq)) != NULL)
		if (a->dirty)
			list[k++] = a;
	if (k == 0)
		return;
	qsort(list, k, sizeof(InboxAggregate *), agg_cmp);
	update_stored_aggregates(sub, aggs, list, k);
	if (aggregate_arrays(list, k, false, NULL, &args[1], &args[2]) == 0)
		return;
	args[0] = CStringGetTextDatum(sub->consumer);
	if (SPI_execute_plan(agg_flush_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not store inbox aggregate versions");
}

