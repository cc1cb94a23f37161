/*-------------------------------------------------------------------------
 *
 * inbox_consumer.c
 *	  The inbox workers' Kafka consumers: their settings, group, static
 *	  membership, callbacks, and the connection state inbox_status shows.
 *
 * A subscription's consumer group is "outbox.inbox.<system identifier>.
 * <database oid>.<consumer>": the same consumer name in another database or
 * another cluster is another group, so no two of them share partitions or
 * committed offsets.  (Offsets are committed to Kafka for monitoring only:
 * a partition starts at its offset stored in inbox_offset, else at the
 * beginning of the topic, never at an offset found in the group.)
 *
 * Each worker is a static member of the group (group.instance.id: the group
 * and the worker's index, the same after a restart), so a worker that comes
 * back after a crash takes its place at once instead of waiting for the
 * killed member's session to time out.  A changed handler keeps the
 * consumer; changed topics re-subscribe it; only changed Kafka settings
 * make a new one.
 *
 * The settings follow the publisher's rules (src/kafka.c): secrets only in
 * a credentials file (outbox.inbox_kafka_credentials_file, else
 * outbox.kafka_credentials_file), no message repeats a value, librdkafka's
 * log goes to the server log through the publisher's log callback.  Broker
 * conditions (all brokers down, authentication failing, ...) are logged
 * once, counted (inbox_kafka_errors), and written to inbox_consumer_state
 * for inbox_status until a probe finds the brokers again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "kafka.h"
#include "inbox.h"
#include "inbox_worker.h"
#include "stats.h"

char	   *inbox_kafka_credentials_file = NULL;

/* While a broker condition holds, look for the brokers this often. */
#define INBOX_PROBE_MS 1000

/* Consumer properties the worker sets itself: exactly-once depends on them. */
static const char *const inbox_reserved_properties[] = {
	"group.id", "group.instance.id", "enable.auto.commit", "enable.auto.offset.store",
	"bootstrap.servers", "metadata.broker.list", "partition.assignment.strategy",
	"enable.partition.eof", "rebalance_cb", "offset_commit_cb", "log.queue",
};

/*
 * Defaults a user may override.  A session of 10 s (librdkafka's default
 * is 45 s): where the brokers do not honour static membership (the
 * librdkafka 2.0.2 mock cluster), a group waits that long for a killed
 * member before a restarted worker gets its partitions.
 */
static const char *const inbox_default_properties[][2] = {
	{"auto.offset.reset", "earliest"},
	{"session.timeout.ms", "10000"},
	{"heartbeat.interval.ms", "1000"},
	{"client.id", "postgresql-outbox-inbox"},
	{"reconnect.backoff.max.ms", "1000"},
	{"isolation.level", "read_committed"},
};

/* Where a property is applied: a configuration, and where it came from. */
typedef struct ConsumerApply
{
	rd_kafka_conf_t *conf;
	bool		from_file;
	StringInfo	fingerprint;	/* every key=value applied, or NULL */
} ConsumerApply;

/*
 * The inbox state statement, for the schema it was prepared in; NULL while
 * that schema has no table inbox_consumer_state: the extension's objects
 * are still 0.1.0's (the library is updated and the server restarted
 * before ALTER EXTENSION outbox UPDATE), and the states are not recorded
 * until the update (an absent state reads as running).
 */
static SPIPlanPtr state_plan = NULL;
static char *state_schema = NULL;
static int	state_worker;

static bool state_plan_ready(void);

/* ---------- settings ---------- */

/* The credentials file the consumers read. */
static const char *
credentials_file(void)
{
	return inbox_kafka_credentials_file != NULL && inbox_kafka_credentials_file[0]
		? inbox_kafka_credentials_file : outbox_kafka_credentials_file;
}

/* Apply one user property to a consumer configuration, refusing ours. */
static char *
set_consumer_property(const char *key, const char *value, void *arg)
{
	ConsumerApply *st = (ConsumerApply *) arg;
	char		errstr[512];
	char	   *err;

	for (int i = 0; i < lengthof(inbox_reserved_properties); i++)
		if (pg_strcasecmp(key, inbox_reserved_properties[i]) == 0)
			return psprintf("Property \"%s\" is set by the inbox worker and cannot be changed%s.",
							key,
							strstr(key, "servers") || strstr(key, "broker")
							? " (use outbox.inbox_brokers)" : "");
	err = outbox_kafka_shared_property_error(key, value, st->from_file,
											 "outbox.inbox_kafka_credentials_file");
	if (err != NULL)
		return err;
	if (rd_kafka_conf_set(st->conf, key, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
	{
		/* librdkafka quotes bad values: never repeat one (a secret?). */
		if (st->from_file || (value[0] != '\0' && strstr(errstr, value) != NULL))
			return psprintf("Property \"%s\" has an invalid value.", key);
		return psprintf("Property \"%s\": %s", key, errstr);
	}
	if (st->fingerprint)
		appendStringInfo(st->fingerprint, "%s=%s\n", key, value);
	return NULL;
}

/*
 * A consumer configuration from the settings: defaults, properties, the
 * credentials file and, if given, the brokers.  NULL with *err set if
 * anything is refused; *fingerprint, if given, identifies what was applied.
 */
static rd_kafka_conf_t *
consumer_conf(const char *properties, const char *file, const char *brokers,
			  uint32 *fingerprint, char **err)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	StringInfoData fp;
	ConsumerApply st = {conf, false, &fp};
	char		errstr[512];

	initStringInfo(&fp);
	for (int i = 0; i < lengthof(inbox_default_properties); i++)
		(void) rd_kafka_conf_set(conf, inbox_default_properties[i][0],
								 inbox_default_properties[i][1], errstr, sizeof(errstr));
	*err = outbox_for_each_property(properties, set_consumer_property, &st);
	st.from_file = true;
	if (*err == NULL)
		*err = outbox_kafka_read_credentials(file, set_consumer_property, &st);
	if (*err == NULL && brokers != NULL)
	{
		appendStringInfo(&fp, "bootstrap.servers=%s\n", brokers);
		if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, errstr,
							  sizeof(errstr)) != RD_KAFKA_CONF_OK)
			*err = psprintf("outbox.inbox_brokers: %s", errstr);
	}
	return outbox_kafka_conf_finish(conf, *err, &fp, fingerprint);
}

/* Validate consumer properties and a credentials file; NULL if fine. */
char *
inbox_consumer_properties_check(const char *properties)
{
	char	   *err;
	rd_kafka_conf_t *conf = consumer_conf(properties, NULL, NULL, NULL, &err);

	if (conf != NULL)
		rd_kafka_conf_destroy(conf);
	return err;
}

/* GUC check hook of outbox.inbox_kafka_properties. */
static bool
check_inbox_properties(char **newval, void **extra, GucSource source)
{
	char	   *err = inbox_consumer_properties_check(*newval);

	return err == NULL || outbox_kafka_check_failed("outbox.inbox_kafka_properties", err);
}

/* GUC check hook of outbox.inbox_kafka_credentials_file: readable, properties only. */
static bool
check_inbox_credentials_file(char **newval, void **extra, GucSource source)
{
	char	   *err;
	rd_kafka_conf_t *conf = consumer_conf(NULL, *newval, NULL, NULL, &err);

	if (conf != NULL)
		rd_kafka_conf_destroy(conf);
	if (err == NULL)
		return true;
	GUC_check_errhint("%s", OUTBOX_CREDENTIALS_FILE_HINT);
	return outbox_kafka_check_failed("outbox.inbox_kafka_credentials_file", err);
}

/* Define the consumers' Kafka properties and credentials file settings. */
void
inbox_consumer_settings_init(void)
{
	DefineCustomStringVariable("outbox.inbox_kafka_credentials_file",
							   "File of librdkafka properties holding the inbox consumers' secrets, one key=value per line (empty: outbox.kafka_credentials_file).",
							   "Like ssl_key_file: owned by the database user (mode 0600 or less) or root (0640 or less). "
							   "Read when the consumers are created; a relative path is relative to the data directory.",
							   &inbox_kafka_credentials_file, "",
							   PGC_SIGHUP, GUC_SUPERUSER_ONLY,
							   check_inbox_credentials_file, NULL, NULL);
	DefineCustomStringVariable("outbox.inbox_kafka_properties",
							   "librdkafka consumer properties, as key=value pairs separated by semicolons.",
							   "Secrets (sasl.password, ...) are refused here: use outbox.inbox_kafka_credentials_file. "
							   "Visible only to superusers and members of pg_read_all_settings.",
							   &inbox_kafka_properties, "",
							   PGC_SIGHUP, GUC_SUPERUSER_ONLY,
							   check_inbox_properties, NULL, NULL);
}

/* The brokers the consumers use. */
static const char *
consumer_brokers(void)
{
	return inbox_brokers[0] ? inbox_brokers : outbox_brokers;
}

/*
 * What a consumer would be built from now (brokers, properties, the
 * credentials file's content): a reload that changes it recreates the
 * consumers.  0 if the configuration cannot be built.
 */
uint32
inbox_consumer_fingerprint(void)
{
	uint32		fingerprint = 0;
	char	   *err;
	rd_kafka_conf_t *conf = consumer_conf(inbox_kafka_properties, credentials_file(),
										  consumer_brokers(), &fingerprint, &err);

	if (conf == NULL)
		return 0;
	rd_kafka_conf_destroy(conf);
	return fingerprint;
}

/* ---------- the connection state ---------- */

/* A broker condition started (logged once) or changed. */
static void
kafka_condition_set(InboxSub *sub, InboxKafkaState state, rd_kafka_resp_err_t err,
					const char *what, const char *reason)
{
	/* "All brokers down" follows a failed login: keep the cause. */
	if (sub->kafka_state == INBOX_KAFKA_ERROR && state == INBOX_KAFKA_DISCONNECTED)
		return;
	if (sub->kafka_state == state && strcmp(sub->kafka_error, what) == 0)
		return;
	sub->kafka_state = state;
	strlcpy(sub->kafka_error, what, sizeof(sub->kafka_error));
	sub->kafka_since = GetCurrentTimestamp();
	sub->kafka_state_dirty = true;
	sub->last_probe = sub->kafka_since;
	ereport(LOG,
			(errmsg("outbox inbox worker %d: consumer \"%s\": Kafka: %s",
					sub->worker, sub->consumer, what),
			 errdetail("librdkafka: %s: %s", rd_kafka_err2name(err), reason),
			 errhint("The inbox worker keeps retrying; events wait in Kafka.")));
}

/* The brokers answer again: back to running. */
static void
kafka_condition_clear(InboxSub *sub)
{
	if (sub->kafka_state == INBOX_KAFKA_RUNNING)
		return;
	ereport(LOG,
			(errmsg("outbox inbox worker %d: consumer \"%s\": Kafka is reachable again",
					sub->worker, sub->consumer),
			 errdetail("The condition \"%s\" lasted %ld s.", sub->kafka_error,
					   TimestampDifferenceMilliseconds(sub->kafka_since,
													   GetCurrentTimestamp()) / 1000)));
	sub->kafka_state = INBOX_KAFKA_RUNNING;
	sub->kafka_error[0] = '\0';
	sub->kafka_since = GetCurrentTimestamp();
	sub->kafka_state_dirty = true;
	sub->kafka_fatal = false;
}

/*
 * Whether the state must be written now; while a condition holds, first
 * ask a broker for metadata (at most once a second, 100 ms): an answer
 * clears it.  A consumer that raised a fatal error is closed here: the
 * next refresh creates it again (its state stays until that one works).
 */
bool
inbox_state_due(InboxSub *sub, TimestampTz now)
{
	const struct rd_kafka_metadata *md;

	if (sub->rk != NULL && rd_kafka_fatal_error(sub->rk, NULL, 0) != RD_KAFKA_RESP_ERR_NO_ERROR)
		inbox_consumer_destroy(sub);
	if (sub->rk != NULL && sub->kafka_state != INBOX_KAFKA_RUNNING &&
		TimestampDifferenceExceeds(sub->last_probe, now, INBOX_PROBE_MS))
	{
		sub->last_probe = now;
		if (rd_kafka_metadata(sub->rk, 0, NULL, &md, 100) == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			rd_kafka_metadata_destroy(md);
			kafka_condition_clear(sub);
		}
	}
	return sub->kafka_state_dirty && state_schema != NULL;
}

/* Write the consumer's state for inbox_status.  In a transaction, with SPI. */
void
inbox_state_save(InboxSub *sub)
{
	static const char *const names[] = {"running", "disconnected", "error"};
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	args[0] = CStringGetTextDatum(sub->consumer);
	args[1] = Int32GetDatum(sub->worker);
	args[2] = CStringGetTextDatum(names[sub->kafka_state]);
	if (sub->kafka_error[0])
		args[3] = CStringGetTextDatum(sub->kafka_error);
	else
		nulls[3] = 'n';
	args[4] = TimestampTzGetDatum(sub->kafka_since);
	if (!state_plan_ready())
	{
		sub->kafka_state_dirty = false;
		return;
	}
	if (SPI_execute_plan(state_plan, args, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not store the Kafka state of an inbox consumer");
	sub->kafka_state_dirty = false;
}

/*
 * Prepare the state statement, once the extension's schema has the table,
 * and forget the states this worker wrote before a restart, and those of
 * workers that no longer exist.  In a transaction, connected to SPI.
 */
static bool
state_plan_ready(void)
{
	static bool told = false;
	Oid			types[5] = {TEXTOID, INT4OID, TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Oid			dtypes[2] = {INT4OID, INT4OID};
	Oid			ttype[1] = {TEXTOID};
	Datum		args[2];
	bool		isnull;

	if (state_plan != NULL)
		return true;
	args[0] = CStringGetTextDatum(psprintf("%s.inbox_consumer_state", state_schema));
	if (SPI_execute_with_args("SELECT pg_catalog.to_regclass($1) IS NOT NULL",
							  1, ttype, args, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not look for the inbox's state table");
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
	{
		if (!told)
			ereport(LOG,
					(errmsg("outbox: inbox worker %d does not record its Kafka state: this database's extension objects predate the library",
							state_worker),
					 errhint("Run ALTER EXTENSION outbox UPDATE in database \"%s\".",
							 get_database_name(MyDatabaseId))));
		told = true;
		return false;
	}
	state_plan = outbox_keep_plan(psprintf(
										   "INSERT INTO %s.inbox_consumer_state AS c (consumer, worker, state, last_error, since) "
										   "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer, worker) DO UPDATE SET "
										   "state = excluded.state, last_error = excluded.last_error, since = excluded.since",
										   state_schema), 5, types);
	args[0] = Int32GetDatum(state_worker);
	args[1] = Int32GetDatum(inbox_workers);
	if (SPI_execute_with_args(psprintf("DELETE FROM %s.inbox_consumer_state c "
									   "WHERE c.worker OPERATOR(pg_catalog.=) $1 "
									   "OR c.worker OPERATOR(pg_catalog.>=) $2", state_schema),
							  2, dtypes, args, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "could not reset the Kafka states of inbox worker %d", state_worker);
	return true;
}

/*
 * The state statement is for the extension in schema s (quoted), prepared
 * now if it has the table, else when a state is first saved after the
 * update.  In a transaction, connected to SPI.
 */
void
inbox_state_prepare(const char *s, int worker)
{
	if (state_plan != NULL)
		SPI_freeplan(state_plan);
	state_plan = NULL;
	if (state_schema != NULL)
		pfree(state_schema);
	state_schema = MemoryContextStrdup(TopMemoryContext, s);
	state_worker = worker;
	(void) state_plan_ready();
}

/* ---------- callbacks ---------- */

/*
 * Runs inside rd_kafka_consumer_poll(), outside any transaction; it must not
 * ereport(ERROR).  An assignment is only recorded: the worker reads the
 * stored offsets and assigns in its loop.
 */
static void
rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
			 rd_kafka_topic_partition_list_t *parts, void *opaque)
{
	InboxSub   *sub = (InboxSub *) opaque;

	if (sub->pending_assign)
		rd_kafka_topic_partition_list_destroy(sub->pending_assign);
	sub->pending_assign = NULL;
	/* Eager rebalancing: every partition is revoked or assigned anew. */
	sub->rebalanced = true;
	if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
	{
		sub->pending_assign = rd_kafka_topic_partition_list_copy(parts);
		outbox_count(OC_INBOX_REBALANCES, 1);
		/* The group coordinator answered. */
		kafka_condition_clear(sub);
	}
	else
	{
		rd_kafka_assign(rk, NULL);
		list_free_deep(sub->paused);
		sub->paused = NIL;
	}
}

/*
 * Runs inside rd_kafka_consumer_poll() on the worker's thread; must not
 * ereport(ERROR) either: librdkafka retries.  Every report is counted;
 * conditions that stop all consuming become the consumer's state.
 */
static void
consumer_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	InboxSub   *sub = (InboxSub *) opaque;

	outbox_count(OC_INBOX_KAFKA_ERRORS, 1);
	switch (err)
	{
		case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
			kafka_condition_set(sub, INBOX_KAFKA_DISCONNECTED, err, "all brokers are down", reason);
			break;
		case RD_KAFKA_RESP_ERR__RESOLVE:
			kafka_condition_set(sub, INBOX_KAFKA_DISCONNECTED, err,
								"broker host names cannot be resolved", reason);
			break;
		case RD_KAFKA_RESP_ERR__AUTHENTICATION:
		case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
			kafka_condition_set(sub, INBOX_KAFKA_ERROR, err,
								"authentication with the brokers failed", reason);
			break;
		case RD_KAFKA_RESP_ERR__SSL:
			kafka_condition_set(sub, INBOX_KAFKA_ERROR, err,
								"SSL connection to the brokers failed", reason);
			break;
		case RD_KAFKA_RESP_ERR__FATAL:
			/* E.g. another consumer with our group.instance.id fenced us. */
			kafka_condition_set(sub, INBOX_KAFKA_ERROR, err, "fatal consumer error", reason);
			sub->kafka_fatal = true;
			break;
		default:
			break;
	}
	elog(DEBUG1, "outbox inbox: kafka: %s: %s",
		 rd_kafka_err2name((rd_kafka_resp_err_t) err), reason);
}

/* ---------- consumers ---------- */

/* An integer property of a configuration (as librdkafka has it). */
static int
conf_int(rd_kafka_conf_t *conf, const char *name)
{
	char		buf[64];
	size_t		size = sizeof(buf);

	if (rd_kafka_conf_get(conf, name, buf, &size) != RD_KAFKA_CONF_OK)
		elog(ERROR, "librdkafka has no property \"%s\"", name);
	return atoi(buf);
}

/*
 * Set what the worker owns: this cluster's and database's group, the
 * worker's static membership in it, offsets kept by the worker.
 */
static char *
set_group_properties(rd_kafka_conf_t *conf, const char *group, int worker)
{
	char		errstr[512];
	char	   *instance = psprintf("%s.%d", group, worker);
	const char *const props[][2] = {
		{"group.id", group},
		{"group.instance.id", instance},
		{"enable.auto.commit", "false"},
		{"enable.auto.offset.store", "false"},
		{"enable.partition.eof", "false"},
		{"partition.assignment.strategy", "range,roundrobin"},
	};

	for (int i = 0; i < lengthof(props); i++)
		if (rd_kafka_conf_set(conf, props[i][0], props[i][1], errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
			return pstrdup(errstr);
	return NULL;
}

/* Subscribe the consumer to an array of topics. */
static rd_kafka_resp_err_t
subscribe_topics(rd_kafka_t *rk, ArrayType *topics)
{
	rd_kafka_topic_partition_list_t *tl;
	rd_kafka_resp_err_t kerr;
	Datum	   *elems;
	int			nelems;

	deconstruct_array(topics, TEXTOID, -1, false, TYPALIGN_INT, &elems, NULL, &nelems);
	tl = rd_kafka_topic_partition_list_new(nelems);
	for (int i = 0; i < nelems; i++)
		rd_kafka_topic_partition_list_add(tl, TextDatumGetCString(elems[i]),
										  RD_KAFKA_PARTITION_UA);
	kerr = rd_kafka_subscribe(rk, tl);
	rd_kafka_topic_partition_list_destroy(tl);
	return kerr;
}

/* The consumer of a subscription, in its group, subscribed to its topics. */
void
inbox_consumer_create(InboxSub *sub, ArrayType *topics, int worker)
{
	char		errstr[512];
	char	   *err;
	char	   *group = psprintf("outbox.inbox.%llu.%u.%s",
								 (unsigned long long) GetSystemIdentifier(),
								 MyDatabaseId, sub->consumer);
	rd_kafka_conf_t *conf = consumer_conf(inbox_kafka_properties, credentials_file(),
										  consumer_brokers(), NULL, &err);
	rd_kafka_resp_err_t kerr;

	if (conf != NULL && (err = set_group_properties(conf, group, worker)) != NULL)
		rd_kafka_conf_destroy(conf);
	if (err != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox inbox: invalid Kafka consumer settings"),
				 errdetail_internal("%s", err)));
	sub->worker = worker;
	sub->max_poll_ms = conf_int(conf, "max.poll.interval.ms");
	if (inbox_batch_time_ms > sub->max_poll_ms / 3)
		ereport(LOG,
				(errmsg("outbox inbox worker %d: consumer \"%s\": outbox.inbox_batch_time cut to %d ms",
						worker, sub->consumer, Max(sub->max_poll_ms / 3, 1)),
				 errdetail("A transaction takes at most a third of max.poll.interval.ms (%d ms).",
						   sub->max_poll_ms)));
	rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
	rd_kafka_conf_set_error_cb(conf, consumer_error_cb);
	outbox_kafka_log_to_server(conf);
	rd_kafka_conf_set_opaque(conf, sub);

	sub->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
	if (sub->rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("outbox inbox: could not create a Kafka consumer: %s", errstr)));
	}
	/* Log lines and errors wait in the consumer's queue for our polls. */
	rd_kafka_poll_set_consumer(sub->rk);
	rd_kafka_set_log_queue(sub->rk, NULL);
	/*
	 * A new consumer knows of no problem: replace what an old one wrote,
	 * unless it replaces one that failed fatally (that shows until it works).
	 */
	if (!sub->kafka_fatal)
	{
		sub->kafka_state = INBOX_KAFKA_RUNNING;
		sub->kafka_error[0] = '\0';
		sub->kafka_since = GetCurrentTimestamp();
		sub->kafka_state_dirty = true;
	}

	kerr = subscribe_topics(sub->rk, topics);
	if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		/* Without a subscription the next refresh must create it again. */
		rd_kafka_destroy(sub->rk);
		sub->rk = NULL;
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("outbox inbox: could not subscribe consumer \"%s\": %s",
						sub->consumer, rd_kafka_err2str(kerr))));
	}
	ereport(LOG,
			(errmsg("outbox inbox worker %d: consumer \"%s\" joined group \"%s\"",
					worker, sub->consumer, group)));
}

/*
 * New topics for a running consumer: subscribe it again (the group
 * rebalances) rather than leave the group and join it anew.  text is the
 * array's text form, kept in the subscription to spot changes.
 */
void
inbox_consumer_resubscribe(InboxSub *sub, ArrayType *topics, const char *text)
{
	rd_kafka_resp_err_t kerr;
	MemoryContext old = MemoryContextSwitchTo(GetMemoryChunkContext(sub));

	pfree(sub->topics);
	sub->topics = pstrdup(text);
	MemoryContextSwitchTo(old);
	if (sub->rk == NULL)
		return;
	inbox_drop_messages(sub);
	kerr = subscribe_topics(sub->rk, topics);
	if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		inbox_consumer_destroy(sub);
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("outbox inbox: could not subscribe consumer \"%s\": %s",
						sub->consumer, rd_kafka_err2str(kerr))));
	}
	ereport(LOG,
			(errmsg("outbox inbox worker %d: consumer \"%s\" subscribed to %s",
					sub->worker, sub->consumer, text)));
}

/* Give the consumer's held messages back to librdkafka. */
void
inbox_drop_messages(InboxSub *sub)
{
	for (int i = 0; i < sub->nmsgs; i++)
		rd_kafka_message_destroy(sub->msgs[i]);
	sub->nmsgs = 0;
}

/*
 * Close and free the consumer.  A static member does not leave the group:
 * its partitions wait for it (a restart takes them back at once) until its
 * session times out.  Its messages go first: a consumer is not destroyed
 * while its messages live.
 */
void
inbox_consumer_destroy(InboxSub *sub)
{
	if (sub->rk == NULL)
		return;
	inbox_drop_messages(sub);
	if (sub->msgs != NULL)
		pfree(sub->msgs);
	sub->msgs = NULL;
	sub->msgs_size = 0;
	rd_kafka_consumer_close(sub->rk);
	rd_kafka_destroy(sub->rk);
	sub->rk = NULL;
	if (sub->pending_assign)
		rd_kafka_topic_partition_list_destroy(sub->pending_assign);
	sub->pending_assign = NULL;
	list_free_deep(sub->paused);
	sub->paused = NIL;
}
