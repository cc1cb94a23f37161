/*-------------------------------------------------------------------------
 *
 * inbox_worker.c
 *	  Inbox workers: apply the events of subscribed Kafka topics to
 *	  PostgreSQL through a handler function, exactly once, in order.
 *	  This file holds their settings, their shared memory and their loop.
 *
 * The launcher (launcher.c) starts outbox.inbox_workers dynamic workers
 * once their database exists, and again when one exits; with no single
 * inbox database set, in every database the publishers serve where
 * something is subscribed.  What it needs of the inbox is here, through
 * inbox_worker.h: how a worker is started, where the workers run (their
 * shared memory) and whether a database needs none for now.
 * Each subscription (table inbox_subscription) is a Kafka consumer group
 * of this cluster and database; every worker runs one librdkafka consumer
 * per subscription (src/inbox_consumer.c), so Kafka spreads the partitions
 * over the workers.  The position of record is the table inbox_offset,
 * written in the same transaction as the handlers' effects: on assignment
 * a worker starts each partition there (else at the topic's beginning), and a batch
 * locks the partitions' rows and ignores messages below the stored offset,
 * so a crash, a rebalance or a re-delivery never applies a message twice.
 * Offsets are committed to Kafka afterwards, for lag monitoring only.
 *
 * The loop: each pass refreshes the subscriptions when due (joining and
 * leaving groups), polls every consumer without waiting, assigns what a
 * rebalance gave at the stored offsets, resumes paused partitions whose
 * wait is over, and applies what each consumer holds as one batch
 * (src/inbox_apply.c; the statements on the inbox tables are in
 * src/inbox_store.c).  Every step is a transaction of its own
 * (inbox_begin_step/inbox_end_step), so no lock outlives a step; an error
 * aborts the step, is logged once and retried with backoff.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "shmem.h"
#include "util.h"
#include "inbox_worker.h"
#include "inbox.h"

/* Sleep while every consumer's queue is empty (a fetch sets no latch). */
#define INBOX_IDLE_WAIT_MS 20
/* First wait of the worker after an error; it doubles with each one. */
#define INBOX_ERROR_BACKOFF_MS 1000
/* Longest outbox.inbox_batch_time: an hour. */
#define INBOX_MAX_BATCH_TIME_MS (3600 * 1000)
/* How long a database where nothing is subscribed is left without inbox workers. */
#define INBOX_RECHECK_MS (60 * 1000)

static const struct config_enum_entry poison_options[] = {
	{"block", POISON_BLOCK, false},
	{"dead_letter", POISON_DEAD_LETTER, false},
	{"skip", POISON_SKIP, false},
	{NULL, 0, false}
};

static const struct config_enum_entry gap_options[] = {
	{"apply", INBOX_GAP_APPLY, false},
	{"block", INBOX_GAP_BLOCK, false},
	{NULL, 0, false}
};

static List *subs = NIL;
static uint32 consumer_fingerprint = 0;
static bool consumer_configured = false;
static TimestampTz last_refresh = 0;
static char last_logged_error[256];

/* When this worker last ran inbox retention. */
static TimestampTz last_retention = 0;

/* ---------- settings ---------- */

/* Define the outbox.inbox_* settings (the launcher starts the workers). */
void
inbox_worker_init(void)
{
	DefineCustomStringVariable("outbox.inbox_brokers",
							   "Kafka bootstrap servers of the inbox workers (empty: outbox.brokers).",
							   NULL, &inbox_brokers, "",
							   PGC_SIGHUP, 0, NULL, NULL, NULL);
	inbox_consumer_settings_init();
	DefineCustomIntVariable("outbox.inbox_batch_size",
							"Most messages one inbox transaction applies.",
							NULL, &inbox_batch_size, 1000, 1, 100000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.inbox_batch_time",
							"Longest an inbox transaction goes on taking messages.",
							"Once it is used the transaction commits what it applied and the worker polls Kafka "
							"again; at most a third of the consumer's max.poll.interval.ms is used.",
							&inbox_batch_time_ms, 1000, 1, INBOX_MAX_BATCH_TIME_MS,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.inbox_max_attempts",
							"Attempts at a message whose handler fails before the poison policy applies.",
							NULL, &inbox_max_attempts, 5, 1, 1000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.inbox_retry_backoff",
							"Wait before the first retry of a failed handler; it doubles with each attempt.",
							NULL, &inbox_retry_backoff_ms, 1000, 10, INBOX_MAX_BACKOFF_MS,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomEnumVariable("outbox.inbox_poison_policy",
							 "What happens to a message whose handler keeps failing.",
							 "block: its partition stops there; dead_letter: it goes to table inbox_dead_letter; skip: it is dropped.",
							 &inbox_poison_policy, POISON_BLOCK, poison_options,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomEnumVariable("outbox.inbox_gap_policy",
							 "What happens to an event above the next expected version of its aggregate.",
							 "apply: it is applied and counted as a gap; block: its partition stops there until inbox_retry() or inbox_skip().",
							 &inbox_gap_policy, INBOX_GAP_APPLY, gap_options,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);

	/* The workers' own settings exist only where they can run. */
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("outbox.inbox_workers",
							"Number of inbox workers.",
							"0 disables the inbox workers; they idle while nothing is subscribed.",
							&inbox_workers, 1, 0, INBOX_MAX_WORKERS,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("outbox.inbox_database",
							   "Database whose inbox subscriptions the inbox workers serve (empty: outbox.database, else every served database with subscriptions).",
							   NULL, &inbox_database, "",
							   PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

/* ---------- shared memory ---------- */

/*
 * Where inbox workers run: one place per publisher database entry
 * (outbox_shared->databases[e], place e + 1) and one, place 0, for the one
 * inbox database (outbox.inbox_database, else outbox.database).
 *
 * Locking rules: none, as for OutboxShared (shmem.h).  pids[i] is written
 * by inbox worker i only (at its start and exit), idle_* by the workers;
 * the launcher clears a place when it takes up a database (no inbox worker
 * runs there then).  The launcher and the DROP/ALTER DATABASE hook read
 * them and accept a value a moment old.
 */
typedef struct InboxPlace
{
	volatile pid_t pids[INBOX_MAX_WORKERS];
	/* Until when none need to run, since nothing was subscribed. */
	volatile TimestampTz idle_until;
	/* probe_generation when the idle worker looked (a later one voids it) */
	volatile uint32 idle_generation;
} InboxPlace;

typedef struct InboxShared
{
	InboxPlace	places[OUTBOX_MAX_DATABASES + 1];
} InboxShared;

static InboxShared *inbox_shared = NULL;

/* This worker's place in inbox_shared (set by inbox_connect). */
static InboxPlace *inbox_place = NULL;

/* Ask for the inbox's shared memory (from the shmem request hook, or _PG_init). */
void
inbox_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(InboxShared)));
}

/* Create or attach to the inbox's shared memory (from the shmem startup hook). */
void
inbox_shmem_startup(void)
{
	bool		found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	inbox_shared = ShmemInitStruct("outbox inbox", MAXALIGN(sizeof(InboxShared)), &found);
	if (!found)
		memset(inbox_shared, 0, MAXALIGN(sizeof(InboxShared)));
	LWLockRelease(AddinShmemInitLock);
}

/* The place of entry e (INBOX_ONE_DATABASE: the one inbox database). */
static InboxPlace *
place_of(int e)
{
	Assert(e >= INBOX_ONE_DATABASE && e < OUTBOX_MAX_DATABASES);
	return &inbox_shared->places[e + 1];
}

/* The pid of inbox worker i of entry e, 0 if none runs. */
pid_t
inbox_worker_pid(int e, int i)
{
	return place_of(e)->pids[i];
}

/*
 * Whether entry e's inbox workers found nothing subscribed a while ago,
 * and nothing was subscribed (nor the extension created) anywhere since.
 */
bool
inbox_database_idle(int e, TimestampTz now)
{
	InboxPlace *place = place_of(e);

	return place->idle_until > now &&
		place->idle_generation == pg_atomic_read_u32(&outbox_shared->probe_generation);
}

/* Entry e now serves another database: none of its inbox workers runs. */
void
inbox_database_reset(int e)
{
	InboxPlace *place = place_of(e);

	memset((void *) place->pids, 0, sizeof(place->pids));
	place->idle_until = 0;
	place->idle_generation = 0;
}

/*
 * The inbox workers' one database: outbox.inbox_database, else
 * outbox.database; NULL when neither is set: then they run in every
 * database the publishers serve where something is subscribed.
 */
const char *
inbox_target_database(void)
{
	if (inbox_database[0] != '\0')
		return inbox_database;
	return outbox_database[0] != '\0' ? outbox_database : NULL;
}

/*
 * How the launcher starts inbox worker i of entry e (INBOX_ONE_DATABASE:
 * of the one inbox database), connecting to database dbname; main_arg is
 * the place (e + 1) and the index.
 */
void
inbox_worker_describe(BackgroundWorker *worker, int e, int i, const char *dbname)
{
	outbox_bgworker_init(worker, "inbox_worker_main", "outbox inbox worker", BGW_NEVER_RESTART);
	if (e == INBOX_ONE_DATABASE)
		snprintf(worker->bgw_name, BGW_MAXLEN, "outbox inbox worker %d", i);
	else
		snprintf(worker->bgw_name, BGW_MAXLEN, "outbox inbox worker %d of %s", i, dbname);
	worker->bgw_main_arg = UInt32GetDatum(((uint32) (e + 1) << 16) | (uint32) i);
}

/* ---------- Kafka consumers (inbox_consumer.c) ---------- */

/* on_shmem_exit: close the consumers when stopped (static members stay in their groups). */
static void
inbox_worker_exit(int code, Datum arg)
{
	ListCell   *lc;

	foreach(lc, subs)
		inbox_consumer_destroy((InboxSub *) lfirst(lc));
}


/* ---------- subscriptions ---------- */

/*
 * Why a subscription cannot run (NULL if it can); checked at each refresh,
 * so that a role or handler changed since inbox_subscribe() (its owner, a
 * revoked privilege, a renamed or dropped function) or a topic
 * outbox.inbox_allowed_topics no longer allows stops it.  *handler is set
 * to the function the stored signature names, or InvalidOid
 * (*handler_missing: the problem is that there is none).
 */
static const char *
subscription_problem(Oid owner, const char *signature, Oid *handler,
					 ArrayType *topics, bool *handler_missing)
{
	Datum	   *elems;
	int			n;
	InboxHandlerProblem problem;

	*handler = inbox_resolve_handler(signature);
	*handler_missing = false;
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(owner)))
		return "its role no longer exists";
	if (superuser_arg(owner))
		return "its role is a superuser: handlers never run as one";
	problem = inbox_handler_problem(*handler, owner);
	*handler_missing = (problem == HANDLER_MISSING);
	if (problem != HANDLER_OK)
		return inbox_handler_problem_text(problem);
	deconstruct_array(topics, TEXTOID, -1, false, TYPALIGN_INT, &elems, NULL, &n);
	for (int i = 0; i < n; i++)
	{
		const char *topic = TextDatumGetCString(elems[i]);
		const char *why = inbox_topic_problem(topic);

		if (why != NULL)
			return psprintf("topic \"%s\" may not be subscribed to: %s", topic, why);
	}
	return NULL;
}

/*
 * Say that a subscription is not applied, and why; a handler that is not
 * found is named as stored, with what to do when it was renamed.
 */
static void
report_unusable(const char *consumer, const char *problem,
				const char *signature, bool handler_missing)
{
	if (handler_missing)
		ereport(WARNING,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox inbox: subscription \"%s\" is not applied: %s",
						consumer, problem),
				 errdetail("No function %s exists.  A subscription names its handler by schema, name and argument types: a handler renamed, moved to another schema or dropped is not found.",
						   signature),
				 errhint("Call inbox_subscribe() again with the handler's current name.")));
	else
		ereport(WARNING,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("outbox inbox: subscription \"%s\" is not applied: %s",
						consumer, problem),
				 errhint("Subscribe again as a role that owns and may execute the handler, to allowed topics.")));
}

/* This worker's state of a subscription, or NULL. */
static InboxSub *
find_sub(const char *consumer)
{
	ListCell   *lc;

	foreach(lc, subs)
	{
		InboxSub   *sub = lfirst(lc);

		if (strcmp(sub->consumer, consumer) == 0)
			return sub;
	}
	return NULL;
}

/*
 * Bring the consumers in line with inbox_subscription: join the groups of
 * new subscriptions, leave those of removed ones, subscribe to changed
 * topics (a changed handler or role needs nothing of Kafka).  In a
 * transaction; false if the extension is not installed.
 */
static bool
refresh_subscriptions(void)
{
	ListCell   *lc;
	MemoryContext old;
	SPITupleTable *rows;
	uint64		nrows;

	if (!inbox_prepare_plans())
		return false;
	if (SPI_execute_plan(inbox_subs_plan, NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read inbox subscriptions");
	/* Held: resolving a handler runs a subtransaction. */
	rows = SPI_tuptable;
	nrows = SPI_processed;

	foreach(lc, subs)
		((InboxSub *) lfirst(lc))->seen = false;
	for (uint64 i = 0; i < nrows; i++)
	{
		HeapTuple	tup = rows->vals[i];
		TupleDesc	desc = rows->tupdesc;
		bool		isnull;
		char	   *consumer = SPI_getvalue(tup, desc, 1);
		char	   *topics = SPI_getvalue(tup, desc, 3);
		char	   *signature = SPI_getvalue(tup, desc, 4);
		Oid			handler;
		bool		handler_missing;
		Oid			owner = DatumGetObjectId(SPI_getbinval(tup, desc, 5, &isnull));
		InboxSub   *sub = find_sub(consumer);
		ArrayType  *topic_array = DatumGetArrayTypeP(SPI_getbinval(tup, desc, 2, &isnull));
		const char *problem = subscription_problem(owner, signature, &handler, topic_array,
												   &handler_missing);

		if (sub != NULL)
		{
			/* A new handler or role needs no new consumer: nothing to rejoin. */
			sub->handler = handler;
			sub->owner = owner;
			if (strcmp(sub->topics, topics) != 0)
				inbox_consumer_resubscribe(sub, topic_array, topics);
		}
		if (sub == NULL)
		{
			old = MemoryContextSwitchTo(inbox_subs_context);
			sub = palloc0(sizeof(InboxSub));
			sub->consumer = pstrdup(consumer);
			sub->topics = pstrdup(topics);
			sub->handler = handler;
			sub->owner = owner;
			sub->usable = true;
			subs = lappend(subs, sub);
			MemoryContextSwitchTo(old);
		}
		sub->seen = true;
		if ((problem != NULL) == sub->usable)
		{
			if (problem)
				report_unusable(consumer, problem, signature, handler_missing);
			sub->usable = (problem == NULL);
		}
		if (!sub->usable)
			inbox_consumer_destroy(sub);
		else if (sub->rk == NULL)
			inbox_consumer_create(sub, topic_array, inbox_worker_index);
	}
	foreach(lc, subs)
	{
		InboxSub   *sub = lfirst(lc);

		if (!sub->seen)
		{
			ereport(LOG, (errmsg("outbox inbox worker %d: consumer \"%s\" unsubscribed",
								 inbox_worker_index, sub->consumer)));
			inbox_consumer_destroy(sub);
			subs = foreach_delete_current(subs, lc);
		}
	}
	return true;
}

/* Assign what the group gave us, each partition at its stored offset. */
static void
apply_assignment(InboxSub *sub)
{
	rd_kafka_topic_partition_list_t *parts = sub->pending_assign;
	rd_kafka_resp_err_t err;

	for (int i = 0; i < parts->cnt; i++)
	{
		Datum		args[3];
		bool		isnull = true;
		Datum		d = (Datum) 0;

		args[0] = CStringGetTextDatum(sub->consumer);
		args[1] = CStringGetTextDatum(parts->elems[i].topic);
		args[2] = Int32GetDatum(parts->elems[i].partition);
		if (SPI_execute_plan(inbox_offset_read_plan, args, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read stored inbox offsets");
		if (SPI_processed == 1)
			d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		/*
		 * Nothing stored: the beginning of the topic, never the offset a
		 * group member committed (the subscription's start is ours alone).
		 */
		parts->elems[i].offset = isnull ? RD_KAFKA_OFFSET_BEGINNING : DatumGetInt64(d);
	}
	sub->pending_assign = NULL;
	err = rd_kafka_assign(sub->rk, parts);
	rd_kafka_topic_partition_list_destroy(parts);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("outbox inbox: could not assign partitions of consumer \"%s\": %s",
						sub->consumer, rd_kafka_err2str(err))));
	elog(DEBUG1, "outbox inbox worker %d: consumer \"%s\" assigned %d partitions",
		 inbox_worker_index, sub->consumer, parts->cnt);
}

/* Resume paused partitions whose wait is over, at their stored offsets. */
static void
resume_partitions(InboxSub *sub, TimestampTz now)
{
	ListCell   *lc;

	foreach(lc, sub->paused)
	{
		PausedPartition *pp = lfirst(lc);
		Datum		args[3];
		bool		isnull;
		bool		ready;
		int64		offset;
		rd_kafka_topic_partition_list_t *tl;
		rd_kafka_error_t *error;

		if (pp->resume_at > now)
			continue;
		args[0] = CStringGetTextDatum(sub->consumer);
		args[1] = CStringGetTextDatum(pp->topic);
		args[2] = Int32GetDatum(pp->partition);
		if (SPI_execute_plan(inbox_offset_read_plan, args, NULL, true, 1) != SPI_OK_SELECT ||
			SPI_processed != 1)
			elog(ERROR, "could not read the stored offset of a paused partition");
		offset = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		ready = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
		if (!ready)
		{
			/* Blocked (or backing off longer): look again later. */
			pp->resume_at = TimestampTzPlusMilliseconds(now, INBOX_REFRESH_MS);
			continue;
		}
		tl = rd_kafka_topic_partition_list_new(1);
		rd_kafka_topic_partition_list_add(tl, pp->topic, pp->partition)->offset = offset;
		error = rd_kafka_seek_partitions(sub->rk, tl, 0);
		if (error != NULL)
		{
			elog(DEBUG1, "outbox inbox: seek failed: %s", rd_kafka_error_string(error));
			rd_kafka_error_destroy(error);
		}
		rd_kafka_resume_partitions(sub->rk, tl);
		rd_kafka_topic_partition_list_destroy(tl);
		pfree(pp->topic);
		pfree(pp);
		sub->paused = foreach_delete_current(sub->paused, lc);
	}
}

/* ---------- the loop ---------- */

/*
 * Take what the consumer has fetched, without waiting, up to a batch.  This
 * is also what keeps the consumer in its group (max.poll.interval.ms).
 * After a rebalance what was held is dropped: it comes again from the
 * stored offsets once the new assignment is applied.
 */
static void
poll_consumer(InboxSub *sub)
{
	rd_kafka_message_t *m;

	if (sub->msgs_size < inbox_batch_size)
	{
		MemoryContext old = MemoryContextSwitchTo(inbox_subs_context);

		sub->msgs = sub->msgs == NULL
			? palloc(sizeof(rd_kafka_message_t *) * inbox_batch_size)
			: repalloc(sub->msgs, sizeof(rd_kafka_message_t *) * inbox_batch_size);
		sub->msgs_size = inbox_batch_size;
		MemoryContextSwitchTo(old);
	}
	while (sub->nmsgs < inbox_batch_size &&
		   (m = rd_kafka_consumer_poll(sub->rk, 0)) != NULL)
	{
		if (m->err)
		{
			if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
				elog(DEBUG1, "outbox inbox: consumer \"%s\": %s", sub->consumer,
					 rd_kafka_message_errstr(m));
			rd_kafka_message_destroy(m);
			continue;
		}
		sub->msgs[sub->nmsgs++] = m;
	}
	/* The callback ran inside a poll: no message of a new assignment yet. */
	if (sub->rebalanced)
	{
		inbox_drop_messages(sub);
		sub->rebalanced = false;
	}
}

/*
 * Inbox retention (outbox.inbox_retention) of a database the publisher does
 * not serve (where it does, the publisher runs it): worker 0, once a second,
 * in transactions of outbox.retention_batch rows, for at most a tenth of a
 * second.  Old claims are deleted whether the workers or inbox_claim() made
 * them.
 */
static void
inbox_retention(void)
{
	TimestampTz start = GetCurrentTimestamp();
	uint64		deleted;

	if (inbox_worker_index != 0 || outbox_inbox_retention_s < 0 || inbox_plans_nspid == InvalidOid ||
		(outbox_workers > 0 && outbox_database_stats(MyDatabaseId) != NULL) ||
		!TimestampDifferenceExceeds(last_retention, start, 1000))
		return;
	last_retention = start;
	pgstat_report_activity(STATE_RUNNING, "inbox retention");
	do
	{
		inbox_begin_step();
		deleted = inbox_retention_delete(inbox_retention_plan);
		inbox_end_step();
		outbox_count(OC_INBOX_RETENTION_DELETED, deleted);
	} while (deleted >= (uint64) outbox_retention_batch &&
			 !TimestampDifferenceExceeds(start, GetCurrentTimestamp(), 100));
}

/*
 * One pass: refresh subscriptions when due, assign and resume partitions,
 * then take a batch from each consumer and apply it.  Returns the number of
 * messages handled; -1 if the extension is not installed.
 */
static int
inbox_step(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			total = 0;
	ListCell   *lc;

	if (TimestampDifferenceExceeds(last_refresh, now, INBOX_REFRESH_MS) || inbox_plans_nspid == InvalidOid)
	{
		bool		installed;

		pgstat_report_activity(STATE_RUNNING, "refreshing subscriptions");
		inbox_begin_step();
		installed = refresh_subscriptions();
		inbox_end_step();
		last_refresh = now;
		if (!installed)
		{
			foreach(lc, subs)
				inbox_consumer_destroy((InboxSub *) lfirst(lc));
			subs = NIL;
			inbox_plans_nspid = InvalidOid;
			return -1;
		}
	}
	inbox_retention();

	foreach(lc, subs)
	{
		InboxSub   *sub = lfirst(lc);

		if (sub->rk == NULL)
			continue;
		poll_consumer(sub);
		if (inbox_state_due(sub, now))
		{
			inbox_begin_step();
			inbox_state_save(sub);
			inbox_end_step();
		}
		if (sub->pending_assign != NULL)
		{
			/* What was fetched before is fetched again from the offsets. */
			inbox_drop_messages(sub);
			inbox_begin_step();
			apply_assignment(sub);
			inbox_end_step();
			poll_consumer(sub);
		}
		else if (sub->paused != NIL)
		{
			inbox_begin_step();
			resume_partitions(sub, now);
			inbox_end_step();
		}
		if (sub->nmsgs == 0)
			continue;
		pgstat_report_activity(STATE_RUNNING, psprintf("applying %d messages of \"%s\"",
													   sub->nmsgs, sub->consumer));
		total += inbox_apply_batch(sub);
	}
	return total;
}

/* Log a worker error once per condition. */
static void
log_inbox_error(void)
{
	ErrorData  *edata;
	MemoryContext old = MemoryContextSwitchTo(inbox_loop_context);

	edata = CopyErrorData();
	MemoryContextSwitchTo(old);
	FlushErrorState();
	if (strncmp(last_logged_error, edata->message, sizeof(last_logged_error) - 1) != 0)
	{
		ereport(LOG,
				(errmsg("outbox inbox worker %d: %s", inbox_worker_index, edata->message),
				 edata->detail ? errdetail_internal("%s", edata->detail) : 0,
				 errhint("The inbox worker retries with backoff.")));
		strlcpy(last_logged_error, edata->message, sizeof(last_logged_error));
	}
}

/*
 * Recreate the consumers when the Kafka settings change (brokers,
 * properties, the credentials file's content): they join again with them.
 */
static void
check_consumer_settings(void)
{
	ListCell   *lc;
	uint32		fingerprint = inbox_consumer_fingerprint();

	if (consumer_configured && fingerprint == consumer_fingerprint)
		return;
	if (consumer_configured)
	{
		ereport(LOG, (errmsg("outbox inbox worker %d: Kafka settings changed, recreating the consumers",
							 inbox_worker_index)));
		foreach(lc, subs)
			inbox_consumer_destroy((InboxSub *) lfirst(lc));
		list_free(subs);
		subs = NIL;
		MemoryContextReset(inbox_subs_context);
		last_refresh = 0;
	}
	consumer_fingerprint = fingerprint;
	consumer_configured = true;
}

/* The publisher database entry this worker runs in, if started per database. */
static OutboxDatabase *inbox_entry = NULL;

/* on_shmem_exit: no longer in its place's list of inbox workers. */
static void
inbox_leave_place(int code, Datum arg)
{
	inbox_place->pids[inbox_worker_index] = 0;
}

/*
 * Connect to the worker's database: one of the publishers' databases
 * (main_arg: entry + 1, index) or the one inbox database (0, index); listed
 * in its place so that the launcher follows it and a DROP DATABASE can stop
 * it.  Returns the database's name.
 */
static const char *
inbox_connect(Datum main_arg)
{
	uint32		entry = DatumGetUInt32(main_arg) >> 16;
	const char *db;

	inbox_worker_index = DatumGetUInt32(main_arg) & 0xffff;
	inbox_place = place_of((int) entry - 1);
	inbox_place->pids[inbox_worker_index] = MyProcPid;
	on_shmem_exit(inbox_leave_place, (Datum) 0);
	if (entry == 0)
	{
		db = inbox_target_database();
		BackgroundWorkerInitializeConnection(db, NULL, 0);
		return db;
	}
	inbox_entry = &outbox_shared->databases[entry - 1];
	db = pstrdup(NameStr(inbox_entry->name));
	BackgroundWorkerInitializeConnection(db, NULL, 0);
	/* The entry went to another database, or a DROP DATABASE holds it. */
	if (MyDatabaseId != inbox_entry->dboid ||
		inbox_entry->held_until > GetCurrentTimestamp())
		proc_exit(0);
	return db;
}

/* An inbox worker: apply every subscription of its database, forever. */
void
inbox_worker_main(Datum main_arg)
{
	const char *db;
	int			backoff_ms = INBOX_ERROR_BACKOFF_MS;
	bool		logged_missing = false;
	uint32		generation = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	outbox_reload_at_start();

	db = inbox_connect(main_arg);
	/* Our own statements name everything qualified. */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	/* Our statements are short: compiling them would take longer. */
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);
	/* A server-wide plan_cache_mode would override the plans' own choice. */
	SetConfigOption("plan_cache_mode", "auto", PGC_SUSET, PGC_S_OVERRIDE);

	inbox_subs_context = AllocSetContextCreate(TopMemoryContext, "inbox subscriptions",
										 ALLOCSET_DEFAULT_SIZES);
	inbox_loop_context = AllocSetContextCreate(TopMemoryContext, "inbox loop",
										 ALLOCSET_DEFAULT_SIZES);
	check_consumer_settings();
	on_shmem_exit(inbox_worker_exit, (Datum) 0);
	ereport(LOG, (errmsg("outbox inbox worker %d started for database \"%s\"",
						 inbox_worker_index, db)));

	for (;;)
	{
		int			n = 0;
		bool		failed = false;
		long		wait_ms;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			check_consumer_settings();
		}
		MemoryContextReset(inbox_loop_context);
		MemoryContextSwitchTo(inbox_loop_context);
		/* Before the subscriptions are read: one committed later bumps it. */
		generation = pg_atomic_read_u32(&outbox_shared->probe_generation);

		PG_TRY();
		{
			n = inbox_step();
		}
		PG_CATCH();
		{
			HOLD_INTERRUPTS();
			log_inbox_error();
			AbortCurrentTransaction();
			RESUME_INTERRUPTS();
			failed = true;
			outbox_count(OC_INBOX_WORKER_ERRORS, 1);
		}
		PG_END_TRY();
		MemoryContextSwitchTo(inbox_loop_context);
		(void) pgstat_report_stat(false);

		if (failed)
		{
			wait_ms = backoff_ms;
			backoff_ms = Min(backoff_ms * 2, 60 * 1000);
		}
		else
		{
			backoff_ms = INBOX_ERROR_BACKOFF_MS;
			last_logged_error[0] = '\0';
			/* One of many databases, nothing subscribed (or no extension): free the slot a while. */
			if (inbox_entry != NULL && subs == NIL && n <= 0)
			{
				inbox_place->idle_generation = generation;
				pg_write_barrier();
				inbox_place->idle_until =
					TimestampTzPlusMilliseconds(GetCurrentTimestamp(), INBOX_RECHECK_MS);
				proc_exit(0);
			}
			if (n < 0 && !logged_missing)
				ereport(LOG,
						(errmsg("outbox inbox worker %d: extension \"outbox\" is not installed in database \"%s\"; waiting",
								inbox_worker_index, db)));
			logged_missing = (n < 0);
			if (n > 0)
				continue;
			/* Idle: nothing subscribed waits for the refresh. */
			wait_ms = subs == NIL ? INBOX_REFRESH_MS : INBOX_IDLE_WAIT_MS;
		}
		pgstat_report_activity(STATE_IDLE, NULL);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 wait_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
