/*-------------------------------------------------------------------------
 *
 * publish_poison.c
 *	  Failures: recording a permanent error and backing its aggregate off,
 *	  the poison policy applied after outbox.max_attempts, and refusals for
 *	  size, which a broker judges per request.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"

#include "emit.h"
#include "shmem.h"
#include "util.h"
#include "publish.h"

int			outbox_max_attempts = 5;
int			outbox_poison_policy = POISON_BLOCK;

static SPIPlanPtr fail_event_plan = NULL;
static SPIPlanPtr fail_aggregate_plan = NULL;
static SPIPlanPtr policy_plan = NULL;

static const struct config_enum_entry poison_policy_options[] = {
	{"block", POISON_BLOCK, false},
	{"dead_letter", POISON_DEAD_LETTER, false},
	{"skip", POISON_SKIP, false},
	{NULL, 0, false}
};

/* Define this module's settings (from _PG_init). */
void
publish_poison_init(void)
{
	DefineCustomIntVariable("outbox.max_attempts",
							"Attempts at an event failing with a permanent error before the poison policy applies.",
							"Retriable errors (broker down, timeouts) never count.",
							&outbox_max_attempts,
							5, 1, 1000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomEnumVariable("outbox.poison_policy",
							 "What happens to an event that keeps failing with a permanent error.",
							 "block: its aggregate stops there; dead_letter: it goes to outbox.dead_letter_topic; "
							 "skip: it is recorded as skipped.  The poison_policy table overrides this per topic or aggregate type.",
							 &outbox_poison_policy,
							 POISON_BLOCK,
							 poison_policy_options,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);
}

/* Prepare this module's plans for the extension in schema s (quoted). */
void
publish_poison_prepare(const char *s)
{
	Oid			fail_event_types[3] = {INT8OID, TEXTOID, INT4OID};
	Oid			fail_aggregate_types[6] = {TEXTOID, INT4OID, TEXTOID, INT4OID, INT8OID, BOOLOID};
	Oid			policy_types[2] = {TEXTOID, TEXTOID};

	if (fail_event_plan)
	{
		SPI_freeplan(fail_event_plan);
		SPI_freeplan(fail_aggregate_plan);
		SPI_freeplan(policy_plan);
	}
	fail_event_plan = outbox_keep_plan(psprintf(
											"UPDATE %s.outbox SET attempts = attempts OPERATOR(pg_catalog.+) $3, last_error = $2 "
											"WHERE id OPERATOR(pg_catalog.=) $1 RETURNING attempts", s),
								   3, fail_event_types);

	/*
	 * A permanent error backs the aggregate off exponentially.  After
	 * max_attempts the poison policy applies: block stops the aggregate at
	 * that version until an operator acts; the others apply in the next
	 * batch, at once (and back off again if even that fails).  Either way
	 * the aggregate is read by index from now on (catch_up) until a read
	 * finds nothing pending: the stream skips a listed aggregate.
	 */
	fail_aggregate_plan = outbox_keep_plan(psprintf(
												"INSERT INTO %s.aggregate_publication AS a "
												"(aggregate_id, attempts, last_error, next_attempt_at, "
												"blocked_version, blocked_at, catch_up, updated_at) "
												"VALUES ($1, $2, $3, CASE WHEN $2 OPERATOR(pg_catalog.<>) $4 THEN pg_catalog.clock_timestamp() "
												"OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => "
												"LEAST(60, 2 OPERATOR(pg_catalog.^) ($2 OPERATOR(pg_catalog.-) 1))) END, "
												"CASE WHEN $2 OPERATOR(pg_catalog.>=) $4 AND $6 THEN $5 END, "
												"CASE WHEN $2 OPERATOR(pg_catalog.>=) $4 AND $6 THEN pg_catalog.clock_timestamp() END, "
												"true, pg_catalog.clock_timestamp()) "
												"ON CONFLICT (aggregate_id) DO UPDATE SET "
												"attempts = excluded.attempts, last_error = excluded.last_error, "
												"next_attempt_at = excluded.next_attempt_at, "
												"blocked_version = excluded.blocked_version, "
												"blocked_at = excluded.blocked_at, catch_up = true, updated_at = excluded.updated_at", s),
									   6, fail_aggregate_types);

	policy_plan = outbox_keep_plan(psprintf(
										"SELECT policy FROM %s.poison_policy "
										"WHERE topic OPERATOR(pg_catalog.=) $1 OR aggregate_type OPERATOR(pg_catalog.=) $2 "
										"ORDER BY topic IS NULL LIMIT 1", s),
							   2, policy_types);
}

/* The poison policy of an event: per topic, else aggregate type, else GUC. */
PoisonPolicy
publish_poison_policy(BatchEvent *ev)
{
	Datum		args[2] = {CStringGetTextDatum(ev->topic),
	CStringGetTextDatum(ev->aggregate_type)};
	bool		push = !ActiveSnapshotSet();
	char	   *policy = NULL;

	/* Called while producing, when the batch holds no snapshot. */
	if (push)
		PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_execute_plan(policy_plan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read the poison policy");
	if (SPI_processed > 0)
		policy = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	if (push)
		PopActiveSnapshot();

	if (policy == NULL)
		return (PoisonPolicy) outbox_poison_policy;
	if (strcmp(policy, "dead_letter") == 0)
		return POISON_DEAD_LETTER;
	if (strcmp(policy, "skip") == 0)
		return POISON_SKIP;
	return POISON_BLOCK;
}

/* Where an event goes: its topic, or the dead-letter topic. */
const char *
publish_event_destination(BatchEvent *ev)
{
	return ev->action == EV_DEAD_LETTER ? outbox_dead_letter_topic : ev->topic;
}

/*
 * Record a permanent failure of one event and back its aggregate off; after
 * max_attempts, apply the poison policy.
 */
void
publish_record_failure(BatchEvent *ev, const char *msg)
{
	Datum		ev_args[3] = {Int64GetDatum(ev->id), CStringGetTextDatum(msg),
	Int32GetDatum(1)};
	Datum		agg_args[6];
	bool		isnull;
	int32		attempts;
	PoisonPolicy policy = POISON_BLOCK;

	if (SPI_execute_plan(fail_event_plan, ev_args, NULL, false, 1) != SPI_OK_UPDATE_RETURNING ||
		SPI_processed != 1)
		elog(ERROR, "could not record the failure of event " INT64_FORMAT, ev->id);
	attempts = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 1, &isnull));
	if (attempts >= outbox_max_attempts)
		policy = publish_poison_policy(ev);

	agg_args[0] = CStringGetTextDatum(ev->aggregate_id);
	agg_args[1] = Int32GetDatum(attempts);
	agg_args[2] = CStringGetTextDatum(msg);
	agg_args[3] = Int32GetDatum(outbox_max_attempts);
	agg_args[4] = Int64GetDatum(ev->version);
	agg_args[5] = BoolGetDatum(policy == POISON_BLOCK);
	if (SPI_execute_plan(fail_aggregate_plan, agg_args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not record the failure of aggregate \"%s\"", ev->aggregate_id);
	publish_listed_changed = true;

	if (attempts < outbox_max_attempts)
		ereport(LOG,
				(errmsg("outbox: event %s (aggregate \"%s\" version " INT64_FORMAT ") failed, attempt %d of %d",
						ev->event_id, ev->aggregate_id, ev->version, attempts, outbox_max_attempts),
				 errdetail("Topic \"%s\": %s.", ev->topic, msg)));
	else if (policy == POISON_BLOCK)
		ereport(LOG,
				(errmsg("outbox: aggregate \"%s\" blocked at version " INT64_FORMAT " after %d attempts",
						ev->aggregate_id, ev->version, attempts),
				 errdetail("Event %s to topic \"%s\" failed: %s.", ev->event_id, ev->topic, msg),
				 errhint("Fix the cause, then SELECT outbox_retry('%s'), or outbox_skip() or outbox_dead_letter() the event.",
						 ev->aggregate_id)));
	else
		ereport(LOG,
				(errmsg("outbox: event %s (aggregate \"%s\" version " INT64_FORMAT ") failed %d times and will be %s",
						ev->event_id, ev->aggregate_id, ev->version, attempts,
						policy == POISON_SKIP ? "skipped" : "dead-lettered"),
				 errdetail("Topic \"%s\": %s.", ev->topic, msg)));
}

/* Is this a refusal for size, which a broker judges per request? */
bool
publish_is_size_error(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
		err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE;
}

/* Was the event's last failure a refusal for size (then it is sent alone)? */
bool
publish_last_error_is_size(BatchEvent *ev)
{
	const char *names[2];

	/* most events have no error: asked twice per event produced */
	if (ev->last_error == NULL)
		return false;
	names[0] = rd_kafka_err2name(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
	names[1] = rd_kafka_err2name(RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE);
	for (int i = 0; i < lengthof(names); i++)
	{
		size_t		len = strlen(names[i]);

		if (strncmp(ev->last_error, names[i], len) == 0 && ev->last_error[len] == ':')
			return true;
	}
	return false;
}

/*
 * An event refused for size in a request it shared: the broker judges
 * max.message.bytes per request, so the refusal may be for the others.
 * Record the error without counting an attempt or backing off; the next
 * batch sends it alone (produce_alone), and only a refusal then counts.
 */
void
publish_note_size_error(BatchEvent *ev, const char *msg)
{
	Datum		args[3] = {Int64GetDatum(ev->id), CStringGetTextDatum(msg),
	Int32GetDatum(0)};

	if (SPI_execute_plan(fail_event_plan, args, NULL, false, 1) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "could not record the failure of event " INT64_FORMAT, ev->id);
	ereport(LOG,
			(errmsg("outbox: event %s (aggregate \"%s\" version " INT64_FORMAT ") was refused for size with other messages; it is sent alone next, no attempt counted",
					ev->event_id, ev->aggregate_id, ev->version),
			 errdetail("Topic \"%s\": %s.", publish_event_destination(ev), msg)));
}

