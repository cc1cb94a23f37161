/*-------------------------------------------------------------------------
 *
 * inbox_apply.c
 *	  One batch of an inbox worker: the messages held for a subscription,
 *	  applied through its handler in one transaction, exactly once, in
 *	  order.
 *
 * A batch (inbox_apply_batch) is one transaction, which takes messages until
 * outbox.inbox_batch_time is used (the worker must poll within
 * max.poll.interval.ms to stay in its group); the rest stays in memory for
 * the next one.  It first runs without subtransactions (the fast path:
 * a chunk of messages is claimed in one statement, then their handlers are
 * called) and, if anything fails, is rolled back and run again with one
 * subtransaction per message (the careful path), no further than the failed
 * attempt got.
 *
 * The batch locks its partitions' rows of inbox_offset first, in topic and
 * partition order (inbox_store.c), and ignores messages below the stored
 * offset, so a crash, a rebalance or a re-delivery never applies a message
 * twice.  For each message: deduplicate by the aggregate's last applied
 * version (inbox_aggregate, read for the whole batch at its start and
 * written at its end) and by the inbox table (event_id header, else
 * topic/partition/offset), then call the handler as the role that
 * subscribed, in a security-restricted operation.  A failing handler stops
 * its partition at that message, which is retried with backoff
 * (outbox.inbox_retry_backoff, doubling) and, after
 * outbox.inbox_max_attempts, blocked, dead-lettered or skipped
 * (outbox.inbox_poison_policy).  A version above the next expected one is a
 * gap: applied and counted, or blocked (outbox.inbox_gap_policy).  After the
 * commit a stopped partition is paused in Kafka; the loop (inbox_worker.c)
 * resumes it at its stored offset.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/jsonapi.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "shmem.h"
#include "util.h"
#include "inbox_worker.h"
#include "inbox.h"

/* Messages of a transaction's first chunk on the fast path (at most). */
#define INBOX_FIRST_CHUNK 16

/* A message claimed and handled at the end of a batch (fast path). */
typedef struct PendingApply
{
	PartState  *ps;
	int64		offset;
	char	   *identity;
	Datum		message;
	bool		gap;
} PendingApply;

typedef struct PendingList
{
	PendingApply *items;
	int			n;
	HTAB	   *identities;		/* of every message of the batch taken */
} PendingList;

/* ---------- messages ---------- */

/* A header value as text, or NULL if it is not valid text. */
static char *
header_text(const void *value, size_t size)
{
	if (value == NULL || memchr(value, '\0', size) != NULL ||
		!pg_verifymbstr((const char *) value, (int) size, true))
		return NULL;
	return pnstrdup((const char *) value, size);
}

/* A jsonb string value (or null) of the header object being built. */
static void
push_jsonb_text(JsonbParseState **state, JsonbIteratorToken token, char *text)
{
	JsonbValue	v;

	v.type = text ? jbvString : jbvNull;
	if (text)
	{
		v.val.string.val = text;
		v.val.string.len = strlen(text);
	}
	(void) pushJsonbValue(state, token, &v);
}

/*
 * The message's headers as jsonb (built directly, not printed and parsed:
 * the same object, a repeated name keeping its last value), and the ones
 * the publisher sets.
 */
static void
parse_headers(const rd_kafka_message_t *m, MessageMeta *meta)
{
	rd_kafka_headers_t *hdrs = NULL;
	JsonbParseState *state = NULL;
	const char *name;
	const void *value;
	size_t		size;

	memset(meta, 0, sizeof(*meta));
	if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return;
	(void) pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; i++)
	{
		char	   *v = header_text(value, size);

		if (!pg_verifymbstr(name, strlen(name), true))
			continue;
		push_jsonb_text(&state, WJB_KEY, pstrdup(name));
		push_jsonb_text(&state, WJB_VALUE, v);
		if (v == NULL)
			continue;
		if (strcmp(name, "event_id") == 0 && v[0] != '\0')
			meta->event_id = v;
		else if (strcmp(name, "event_type") == 0)
			meta->event_type = v;
		else if (strcmp(name, "aggregate_type") == 0)
			meta->aggregate_type = v;
		else if (strcmp(name, "aggregate_id") == 0 && v[0] != '\0')
			meta->aggregate_id = v;
		else if (strcmp(name, "aggregate_version") == 0)
		{
			char	   *end;
			long long	ver = strtoll(v, &end, 10);

			if (*end == '\0' && ver > 0)
				meta->aggregate_version = ver;
		}
	}
	meta->headers = JsonbPGetDatum(JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL)));
}

/*
 * The payload as jsonb if it is JSON text jsonb accepts, else 0.  On the
 * fast path an object or array (what the publisher sends) is parsed once,
 * by jsonb_in: if it is not JSON after all, the error sends the batch to the
 * careful path, which checks first.
 */
static Datum
payload_jsonb(const rd_kafka_message_t *m, bool careful)
{
	char	   *text = header_text(m->payload, m->len);
	JsonLexContext *lex;
	bool		ok;
	const char *p;

	if (text == NULL || m->payload == NULL)
		return (Datum) 0;
	for (p = text; *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'; p++)
		;
	if (!careful && (*p == '{' || *p == '['))
		return DirectFunctionCall1(jsonb_in, CStringGetDatum(text));
	lex = outbox_json_lexer(text, strlen(text), GetDatabaseEncoding());
	ok = (pg_parse_json(lex, &nullSemAction) == JSON_SUCCESS);
	if (!ok)
		return (Datum) 0;
	return outbox_jsonb_or_null(text, careful);
}

/* The inbox_message composite handed to the handler. */
static Datum
message_datum(InboxSub *sub, const rd_kafka_message_t *m, MessageMeta *meta,
			  bool careful)
{
	Datum		values[14];
	bool		nulls[14];
	rd_kafka_timestamp_type_t tstype;
	int64		ts = rd_kafka_message_timestamp(m, &tstype);
	char	   *key = m->key ? header_text(m->key, m->key_len) : NULL;
	Datum		payload = payload_jsonb(m, careful);
	bytea	   *bytes = NULL;

	memset(nulls, 0, sizeof(nulls));
	values[0] = CStringGetTextDatum(sub->consumer);
	values[1] = CStringGetTextDatum(rd_kafka_topic_name(m->rkt));
	values[2] = Int32GetDatum(m->partition);
	values[3] = Int64GetDatum(m->offset);
#define TEXT_OR_NULL(i, s) ((s) ? (values[i] = CStringGetTextDatum(s)) : (nulls[i] = true, (Datum) 0))
	TEXT_OR_NULL(4, key);
	TEXT_OR_NULL(5, meta->event_id);
	TEXT_OR_NULL(6, meta->event_type);
	TEXT_OR_NULL(7, meta->aggregate_type);
	TEXT_OR_NULL(8, meta->aggregate_id);
#undef TEXT_OR_NULL
	values[9] = Int64GetDatum(meta->aggregate_version);
	nulls[9] = meta->aggregate_version == 0;
	values[10] = meta->headers;
	nulls[10] = meta->headers == (Datum) 0;
	values[11] = payload;
	nulls[11] = payload == (Datum) 0;
	if (m->payload != NULL)
	{
		bytes = palloc(VARHDRSZ + m->len);
		SET_VARSIZE(bytes, VARHDRSZ + m->len);
		memcpy(VARDATA(bytes), m->payload, m->len);
		values[12] = PointerGetDatum(bytes);
	}
	nulls[12] = bytes == NULL;
	/* Milliseconds since the Unix epoch to microseconds since 2000. */
	values[13] = TimestampTzGetDatum(ts * 1000 -
									 (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY);
	nulls[13] = ts < 0;
	/* heap_form_tuple has filled in the composite's header: no copy. */
	return HeapTupleGetDatum(heap_form_tuple(inbox_message_desc, values, nulls));
}

/* ---------- one batch ---------- */

/*
 * Release the session-level advisory locks a handler took: they would
 * outlive its call (even a failed one: a subtransaction's abort keeps them)
 * and hold other sessions out in the handler's name.  The worker takes none.
 */
static void
forget_session_locks(void)
{
	LockReleaseSession(USER_LOCKMETHOD);
}

/*
 * Call the handler the way PostgreSQL runs untrusted code as another role
 * (the apply worker's switch to a table owner): as the subscription's role,
 * in a security-restricted operation (no SET ROLE, temporary objects,
 * PREPARE, LISTEN or held cursors), at a GUC nest level of its own that is
 * rolled back afterwards, so no setting it changes, even at session level
 * (search_path above all), reaches the worker's statements or the next
 * handler; session advisory locks it took are released.  On error the
 * (sub)transaction's abort restores the user and the settings.
 */
static void
call_handler(InboxSub *sub, FmgrInfo *flinfo, Datum message)
{
	Oid			save_userid;
	int			save_sec;
	int			save_nestlevel;
	LOCAL_FCINFO(fcinfo, 1);

	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(sub->owner, save_sec | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();
	InitFunctionCallInfoData(*fcinfo, flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = message;
	fcinfo->args[0].isnull = false;
	(void) FunctionCallInvoke(fcinfo);
	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec);
	forget_session_locks();
}

/* Stop a partition at a message for the rest of the batch. */
static void
stop_partition(PartState *ps, int64 offset)
{
	ps->stopped = true;
	ps->stop_offset = offset;
}

/* The message is done with: the partition moves past it. */
static void
advance(PartState *ps, const rd_kafka_message_t *m)
{
	ps->next_offset = m->offset + 1;
}

/* A failed handler: back off, or apply the poison policy. */
static void
handler_failed(InboxSub *sub, PartState *ps, const rd_kafka_message_t *m,
			   Datum message, InboxAggregate *agg, int64 version,
			   const char *identity, const char *error)
{
	ps->errors++;
	ps->attempts++;
	ps->last_error = pstrdup(error);
	if (ps->attempts < inbox_max_attempts)
	{
		int64		wait = Min((int64) inbox_retry_backoff_ms << Min(ps->attempts - 1, 20),
							   INBOX_MAX_BACKOFF_MS);

		/* The first failure at a message is logged; the block, if any, too. */
		if (ps->attempts == 1)
			ereport(LOG,
					(errmsg("outbox inbox: consumer \"%s\": handler failed at offset %lld of partition %d of topic \"%s\"; retrying in %lld ms",
							sub->consumer, (long long) m->offset, m->partition, ps->topic,
							(long long) wait),
					 errdetail_internal("%s", error),
					 errhint("After %d attempts outbox.inbox_poison_policy (%s) applies.",
							 inbox_max_attempts, GetConfigOption("outbox.inbox_poison_policy", false, false))));
		ps->next_attempt_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait);
		stop_partition(ps, m->offset);
		return;
	}
	switch ((PoisonPolicy) inbox_poison_policy)
	{
		case POISON_BLOCK:
			ps->blocked_at = GetCurrentTimestamp();
			ps->blocked_reason = psprintf("handler failed %d times", ps->attempts);
			ps->next_attempt_at = 0;
			stop_partition(ps, m->offset);
			ereport(LOG,
					(errmsg("outbox inbox: consumer \"%s\" blocked at offset %lld of partition %d of topic \"%s\"",
							sub->consumer, (long long) m->offset, m->partition, ps->topic),
					 errdetail_internal("%s", error),
					 errhint("Fix the handler, then call inbox_retry() or inbox_skip().")));
			return;
		case POISON_DEAD_LETTER:
			{
				Datum		args[4];

				args[0] = CStringGetTextDatum(sub->consumer);
				args[1] = message;
				args[2] = CStringGetTextDatum(error);
				args[3] = Int32GetDatum(ps->attempts);
				if (SPI_execute_plan(inbox_dead_letter_plan, args, NULL, false, 0) != SPI_OK_INSERT)
					elog(ERROR, "could not insert an inbox dead letter");
				ps->dead_lettered++;
				break;
			}
		case POISON_SKIP:
			ps->skipped++;
			break;
	}
	inbox_claim_message(sub, identity, NULL);
	if (agg != NULL && version > agg->last_version)
	{
		agg->last_version = version;
		agg->dirty = true;
	}
	ps->attempts = 0;
	ps->next_attempt_at = 0;
	advance(ps, m);
}

/* What the inbox deduplicates on: event_id, else topic/partition/offset. */
static char *
message_identity(PartState *ps, const rd_kafka_message_t *m, MessageMeta *meta)
{
	if (meta->event_id)
		return meta->event_id;
	return psprintf("%s/%d/%lld", ps->topic, m->partition, (long long) m->offset);
}

/*
 * Drop the message an operator skipped (inbox_skip): claimed and its version
 * recorded like one skipped by the policy, so neither a replay nor the next
 * version of its aggregate sees a hole.
 */
static void
skip_message(InboxSub *sub, PartState *ps, HTAB *aggs, const rd_kafka_message_t *m,
			 MessageMeta *meta)
{
	inbox_claim_message(sub, message_identity(ps, m, meta), NULL);
	if (meta->aggregate_id && meta->aggregate_version > 0)
	{
		InboxAggregate *agg = inbox_aggregate_state(aggs, meta->aggregate_id);

		if (meta->aggregate_version > agg->last_version)
		{
			agg->last_version = meta->aggregate_version;
			agg->dirty = true;
		}
	}
	ps->skip_requested = false;
	ps->skipped++;
	advance(ps, m);
}

/*
 * Claim the message and, if it is new, run the handler, in a subtransaction
 * (the careful path).  Returns the error message of a failure, NULL on
 * success.
 */
static char *
claim_and_handle(InboxSub *sub, FmgrInfo *flinfo, const char *identity,
				 Datum message, bool *claimed)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	char	   *volatile error = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		inbox_claim_message(sub, identity, claimed);
		if (*claimed)
			call_handler(sub, flinfo, message);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		forget_session_locks();
		error = edata->message;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return error;
}

/*
 * Claim the pending messages (one chunk) in one statement, then run their
 * handlers in message order (so per partition in offset order).  An error
 * aborts the batch, which is then applied again carefully.
 */
static void
apply_pending(InboxSub *sub, FmgrInfo *flinfo, PendingList *pending)
{
	Datum	   *ids;
	Datum		args[2];
	TimestampTz start = GetCurrentTimestamp();

	if (pending->n == 0)
		return;
	ids = palloc(sizeof(Datum) * pending->n);
	for (int i = 0; i < pending->n; i++)
		ids[i] = CStringGetTextDatum(pending->items[i].identity);
	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = PointerGetDatum(construct_array(ids, pending->n, TEXTOID, -1, false, TYPALIGN_INT));
	if (SPI_execute_plan(inbox_claim_many_plan, args, NULL, false, 0) != SPI_OK_INSERT ||
		SPI_processed != (uint64) pending->n)
		elog(ERROR, "inbox claim failed");

	for (int i = 0; i < pending->n; i++)
	{
		PendingApply *pa = &pending->items[i];

		CHECK_FOR_INTERRUPTS();
		call_handler(sub, flinfo, pa->message);
		pa->ps->applied++;
		pa->ps->gaps += pa->gap ? 1 : 0;
		pa->ps->last_applied_offset = Max(pa->ps->last_applied_offset, pa->offset);
	}
	/* What a message costs, to size the next chunk. */
	sub->msg_cost_us = (double) (GetCurrentTimestamp() - start) / pending->n;
	pending->n = 0;
}

/*
 * Apply one message at the partition's next offset.  With a pending list
 * (fast path) the claim and the handler are deferred to apply_pending(),
 * and the message is taken as applied; an error there aborts the batch.
 */
static void
apply_message(InboxSub *sub, PartState *ps, HTAB *aggs, FmgrInfo *flinfo,
			  const rd_kafka_message_t *m, MessageMeta *meta, PendingList *pending)
{
	InboxAggregate *agg = NULL;
	char	   *identity;
	bool		gap = false;
	bool		claimed = false;
	Datum		message;
	char	   *error;

	identity = message_identity(ps, m, meta);
	if (meta->aggregate_id && meta->aggregate_version > 0)
	{
		agg = inbox_aggregate_state(aggs, meta->aggregate_id);
		if (meta->aggregate_version <= agg->last_version)
		{
			ps->duplicates++;
			advance(ps, m);
			return;
		}
		gap = meta->aggregate_version > agg->last_version + 1;
		if (gap && inbox_gap_policy == INBOX_GAP_BLOCK && !ps->accept_gap)
		{
			ps->blocked_at = GetCurrentTimestamp();
			ps->blocked_reason = psprintf("gap: aggregate \"%s\" expected version %lld, got %lld",
										  meta->aggregate_id, (long long) agg->last_version + 1,
										  (long long) meta->aggregate_version);
			stop_partition(ps, m->offset);
			return;
		}
	}
	if (pending != NULL)
	{
		bool		dup;

		/* An event twice in the batch: its first copy is the one applied. */
		(void) hash_search(pending->identities, &identity, HASH_ENTER, &dup);
		if (dup)
			ps->duplicates++;
		else
		{
			PendingApply *pa = &pending->items[pending->n++];

			pa->ps = ps;
			pa->offset = m->offset;
			pa->identity = identity;
			pa->message = message_datum(sub, m, meta, false);
			pa->gap = gap;
			ps->accept_gap &= !gap;
		}
	}
	else
	{
		message = message_datum(sub, m, meta, true);
		error = claim_and_handle(sub, flinfo, identity, message, &claimed);
		if (error != NULL)
		{
			handler_failed(sub, ps, m, message, agg, meta->aggregate_version, identity, error);
			return;
		}
		if (!claimed)
			ps->duplicates++;
		else
		{
			ps->applied++;
			ps->gaps += gap ? 1 : 0;
			ps->last_applied_offset = m->offset;
			ps->accept_gap = false;
		}
	}
	ps->attempts = 0;
	ps->next_attempt_at = 0;
	if (agg != NULL && meta->aggregate_version > agg->last_version)
	{
		agg->last_version = meta->aggregate_version;
		agg->dirty = true;
	}
	advance(ps, m);
}

/* qsort comparator: partitions by topic, then number (the lock order). */
static int
part_cmp(const void *a, const void *b)
{
	const PartState *x = a;
	const PartState *y = b;
	int			c = strcmp(x->topic, y->topic);

	return c != 0 ? c : (x->partition > y->partition) - (x->partition < y->partition);
}

/* The partition states of a batch, one per partition seen, sorted. */
static PartState *
batch_partitions(rd_kafka_message_t **msgs, int n, int *nparts)
{
	PartState  *parts = palloc0(sizeof(PartState) * n);
	int			k = 0;

	for (int i = 0; i < n; i++)
	{
		const char *topic = rd_kafka_topic_name(msgs[i]->rkt);
		int			j;

		for (j = 0; j < k; j++)
			if (parts[j].partition == msgs[i]->partition && strcmp(parts[j].topic, topic) == 0)
				break;
		if (j == k)
		{
			parts[k].topic = pstrdup(topic);
			parts[k].partition = msgs[i]->partition;
			k++;
		}
	}
	qsort(parts, k, sizeof(PartState), part_cmp);
	*nparts = k;
	return parts;
}

/* The batch's state of a message's partition. */
static PartState *
find_part(PartState *parts, int nparts, const rd_kafka_message_t *m)
{
	const char *topic = rd_kafka_topic_name(m->rkt);

	for (int j = 0; j < nparts; j++)
		if (parts[j].partition == m->partition && strcmp(parts[j].topic, topic) == 0)
			return &parts[j];
	elog(ERROR, "inbox batch lost track of a partition");
	return NULL;				/* keep compiler quiet */
}

/* Is the partition paused, waiting to be resumed at its stored offset? */
static bool
is_paused(InboxSub *sub, PartState *ps)
{
	ListCell   *lc;

	foreach(lc, sub->paused)
	{
		PausedPartition *pp = lfirst(lc);

		if (pp->partition == ps->partition && strcmp(pp->topic, ps->topic) == 0)
			return true;
	}
	return false;
}

/* Pause a stopped partition where it stopped; it resumes from the table. */
static void
pause_partition(InboxSub *sub, PartState *ps)
{
	rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(1);
	MemoryContext old = MemoryContextSwitchTo(inbox_subs_context);
	PausedPartition *pp = palloc(sizeof(PausedPartition));

	pp->topic = pstrdup(ps->topic);
	pp->partition = ps->partition;
	pp->resume_at = ps->blocked_at != 0 ? TimestampTzPlusMilliseconds(GetCurrentTimestamp(), INBOX_REFRESH_MS)
		: ps->next_attempt_at;
	sub->paused = lappend(sub->paused, pp);
	MemoryContextSwitchTo(old);
	rd_kafka_topic_partition_list_add(tl, ps->topic, ps->partition);
	rd_kafka_pause_partitions(sub->rk, tl);
	rd_kafka_topic_partition_list_destroy(tl);
}

/* Add a committed batch's outcome to the shared counters. */
static void
count_batch(PartState *parts, int nparts)
{
	int64		sums[6] = {0};

	for (int i = 0; i < nparts; i++)
	{
		sums[0] += parts[i].applied;
		sums[1] += parts[i].duplicates;
		sums[2] += parts[i].gaps;
		sums[3] += parts[i].errors;
		sums[4] += parts[i].dead_lettered;
		sums[5] += parts[i].skipped;
	}
	outbox_count(OC_INBOX_APPLIED, sums[0]);
	outbox_count(OC_INBOX_DUPLICATES, sums[1]);
	outbox_count(OC_INBOX_GAPS, sums[2]);
	outbox_count(OC_INBOX_HANDLER_ERRORS, sums[3]);
	outbox_count(OC_INBOX_DEAD_LETTERED, sums[4]);
	outbox_count(OC_INBOX_SKIPPED, sums[5]);
	outbox_count(OC_INBOX_BATCHES, 1);
}

/*
 * Messages the fast path looked at in the current transaction, including
 * those of the chunk being applied: after a failure the careful path goes
 * no further (its time budget is then spent on the messages that failed).
 */
static int	batch_reached = 0;

/* The time budget of one transaction of the subscription, in ms. */
static int
batch_time(InboxSub *sub)
{
	return Max(Min(inbox_batch_time_ms, sub->max_poll_ms / 3), 1);
}

/*
 * Messages of the next chunk of the fast path: no more than were handled
 * so far in the transaction (the first chunk is small), nor than the
 * measured cost says fit in the time left.  The budget is checked between
 * chunks, so a chunk overruns it by no more than the time already spent
 * while the handlers' cost holds.
 */
static int
chunk_size(InboxSub *sub, int handled, TimestampTz deadline)
{
	double		fit = INT_MAX;
	TimestampTz now = GetCurrentTimestamp();

	if (sub->msg_cost_us > 0)
		fit = (deadline > now ? (double) (deadline - now) : 0) / sub->msg_cost_us;
	return (int) Max(Min(Min(fit, (double) (handled > 0 ? handled : INBOX_FIRST_CHUNK)),
						 (double) INT_MAX), 1);
}

/*
 * Go through the first n held messages in order until the time budget is
 * used: checked after each handled message on the careful path, after each
 * chunk on the fast path.  Returns the number of messages looked at; adds
 * those applied or dropped as duplicates to *done.
 */
static int
apply_messages(InboxSub *sub, PartState *parts, int nparts, HTAB *aggs,
			   FmgrInfo *flinfo, MessageMeta *metas, int n, bool careful,
			   TimestampTz deadline, int *done)
{
	PendingList pending;
	int			handled = 0;
	int			chunk = chunk_size(sub, 0, deadline);
	int			i;

	pending.items = palloc(sizeof(PendingApply) * Max(n, 1));
	pending.n = 0;
	pending.identities = NULL;
	if (!careful)
		pending.identities = outbox_aggregate_table("inbox batch identities", sizeof(char *),
													Max(n, 16), CurrentMemoryContext);
	for (i = 0; i < n; i++)
	{
		rd_kafka_message_t *m = sub->msgs[i];
		PartState  *ps = find_part(parts, nparts, m);

		CHECK_FOR_INTERRUPTS();
		batch_reached = i + 1;
		if (ps->stopped)
			continue;
		/* Already applied: a re-delivery, or another worker's. */
		if (ps->next_offset >= 0 && m->offset < ps->next_offset)
			continue;
		if (ps->blocked_at != 0 ||
			(ps->next_attempt_at != 0 && ps->next_attempt_at > GetCurrentTimestamp()))
		{
			stop_partition(ps, m->offset);
			continue;
		}
		if (ps->skip_requested)
		{
			skip_message(sub, ps, aggs, m, &metas[i]);
			(*done)++;
			continue;
		}
		apply_message(sub, ps, aggs, flinfo, m, &metas[i], careful ? NULL : &pending);
		if (!ps->stopped)
			(*done)++;
		handled++;
		if (!careful && pending.n < chunk)
			continue;
		if (!careful)
		{
			apply_pending(sub, flinfo, &pending);
			chunk = chunk_size(sub, handled, deadline);
		}
		if (GetCurrentTimestamp() >= deadline)
		{
			i++;
			break;
		}
	}
	if (!careful)
		apply_pending(sub, flinfo, &pending);
	return i;
}

/*
 * After the commit, give back the messages looked at and those of the
 * partitions that stopped (paused: they come again from the stored offset
 * once resumed); keep the rest, in order, for the next transaction.
 */
static void
keep_rest(InboxSub *sub, PartState *parts, int nparts, int looked)
{
	int			k = 0;

	for (int i = 0; i < sub->nmsgs; i++)
	{
		rd_kafka_message_t *m = sub->msgs[i];

		if (i < looked || find_part(parts, nparts, m)->stopped)
			rd_kafka_message_destroy(m);
		else
			sub->msgs[k++] = m;
	}
	sub->nmsgs = k;
}

/*
 * Apply the first n held messages in one transaction, until its time
 * budget runs out at deadline.  Returns the number of messages applied or
 * dropped as duplicates; keeps those it did not look at.
 */
static int
run_batch(InboxSub *sub, int n, bool careful, TimestampTz deadline)
{
	int			nparts;
	PartState  *parts;
	HTAB	   *aggs;
	FmgrInfo	flinfo;
	rd_kafka_topic_partition_list_t *commit;
	int			done = 0;
	int			looked;
	MessageMeta *metas;

	/* Until the messages are gone through, a failure covers them all. */
	batch_reached = n;
	parts = batch_partitions(sub->msgs, sub->nmsgs, &nparts);
	aggs = outbox_aggregate_table("inbox aggregates", sizeof(InboxAggregate), 256,
								  CurrentMemoryContext);

	metas = palloc(sizeof(MessageMeta) * Max(n, 1));
	for (int i = 0; i < n; i++)
		parse_headers(sub->msgs[i], &metas[i]);
	inbox_load_aggregates(aggs, sub, metas, n);

	fmgr_info(sub->handler, &flinfo);
	for (int i = 0; i < nparts; i++)
	{
		inbox_lock_partition(sub, &parts[i]);
		/* Messages fetched before it was paused: they come again. */
		if (is_paused(sub, &parts[i]))
		{
			parts[i].stopped = true;
			parts[i].was_paused = true;
		}
	}

	looked = apply_messages(sub, parts, nparts, aggs, &flinfo, metas, n, careful,
							deadline, &done);

	inbox_flush_aggregates(sub, aggs);
	commit = rd_kafka_topic_partition_list_new(nparts);
	for (int i = 0; i < nparts; i++)
	{
		inbox_save_partition(sub, &parts[i]);
		if (parts[i].next_offset >= 0)
			rd_kafka_topic_partition_list_add(commit, parts[i].topic,
											  parts[i].partition)->offset = parts[i].next_offset;
	}
	inbox_end_step();
	count_batch(parts, nparts);
	keep_rest(sub, parts, nparts, looked);

	/* Stopped partitions wait; the rest of their messages come again. */
	for (int i = 0; i < nparts; i++)
		if (parts[i].stopped && !parts[i].was_paused)
			pause_partition(sub, &parts[i]);
	/* For lag monitoring only: the table is the position of record. */
	if (commit->cnt > 0)
		(void) rd_kafka_commit(sub->rk, commit, 1);
	rd_kafka_topic_partition_list_destroy(commit);
	return done;
}

/*
 * Apply held messages in one transaction, for at most the time budget:
 * first without subtransactions (the common case, several times faster);
 * if anything fails, roll back and apply them again one subtransaction
 * each (with a budget of its own, and no further than the failed attempt
 * got), so that a failing handler meets its retry and poison policies.
 * What the budget left is kept for the next transaction, after a poll.
 */
int
inbox_apply_batch(InboxSub *sub)
{
	volatile bool careful = false;
	int			done = 0;
	int			n = sub->nmsgs;

	for (;;)
	{
		volatile bool failed = false;
		TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														   batch_time(sub));

		/* What a handler that failed in an earlier attempt left. */
		forget_session_locks();
		PG_TRY();
		{
			inbox_begin_step();
			done = run_batch(sub, n, careful, deadline);
		}
		PG_CATCH();
		{
			if (careful)
			{
				/*
				 * The consumer has moved past messages it did not apply:
				 * assign again, from the stored offsets.
				 */
				if (sub->rk != NULL && sub->pending_assign == NULL)
					(void) rd_kafka_assignment(sub->rk, &sub->pending_assign);
				inbox_drop_messages(sub);
				PG_RE_THROW();
			}
			failed = true;
		}
		PG_END_TRY();
		if (!failed)
			break;
		HOLD_INTERRUPTS();
		elog(DEBUG1, "outbox inbox: batch of \"%s\" failed, applying it message by message",
			 sub->consumer);
		FlushErrorState();
		AbortCurrentTransaction();
		RESUME_INTERRUPTS();
		MemoryContextSwitchTo(inbox_loop_context);
		careful = true;
		n = Max(Min(batch_reached, n), 1);
		outbox_count(OC_INBOX_BATCH_FALLBACKS, 1);
	}
	return done;
}

