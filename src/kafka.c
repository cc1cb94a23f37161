/*-------------------------------------------------------------------------
 *
 * kafka.c
 *	  Producer configuration and lifecycle, delivery report bookkeeping.
 *
 * The producer settings that ordering depends on are not configurable:
 *
 * - enable.idempotence=true: acks=all and, on retries, no reordering or
 *	 duplication within one producer session.
 * - message.timeout.ms=0: librdkafka never fails a message for taking too
 *	 long.  A timed-out message N while N+1 is still queued would let N+1
 *	 reach the log first; instead the worker stops waiting (delivery_timeout)
 *	 and librdkafka keeps retrying, so what one producer delivers is always a
 *	 prefix of what it was given, per partition.
 * - enable.gapless.guarantee=true: a failed batch that could leave a gap is
 *	 a fatal error, after which the producer is recreated.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/timestamp.h"

#include "outbox.h"
#include "kafka.h"

/* Properties the publisher sets itself; see the file header. */
static const char *const forced_properties[][2] = {
	{"enable.idempotence", "true"},
	{"message.timeout.ms", "0"},
	{"enable.gapless.guarantee", "true"},
};

/* Names (and aliases) a user may not override. */
static const char *const reserved_properties[] = {
	"enable.idempotence", "message.timeout.ms", "delivery.timeout.ms",
	"enable.gapless.guarantee", "acks", "request.required.acks",
	"bootstrap.servers", "metadata.broker.list", "dr_cb", "dr_msg_cb",
	"transactional.id",
};

/* Defaults a user may override. */
static const char *const default_properties[][2] = {
	/* Where a Java producer would put the same key. */
	{"partitioner", "murmur2_random"},
	/* Batches are large anyway; don't add 5 ms to every idle commit. */
	{"linger.ms", "1"},
	{"client.id", "postgresql-outbox"},
	/* Resume within a second of a broker coming back, not up to ten. */
	{"reconnect.backoff.max.ms", "1000"},
};

/* Set by the error callback, read by the worker after each poll. */
static bool fatal_pending = false;
static DeliveryTracker *active_tracker = NULL;

/*
 * Split "k=v;k=v" into pairs; "\;" is a literal semicolon.  Calls fn for
 * each pair and stops at the first error it returns (a palloc'd message).
 */
typedef char *(*property_fn) (const char *key, const char *value, void *arg);

static char *
for_each_property(const char *properties, property_fn fn, void *arg)
{
	StringInfoData item;
	const char *p = properties ? properties : "";

	initStringInfo(&item);
	for (;;)
	{
		if (*p == '\\' && p[1] == ';')
		{
			appendStringInfoChar(&item, ';');
			p += 2;
			continue;
		}
		if (*p != ';' && *p != '\0')
		{
			appendStringInfoChar(&item, *p++);
			continue;
		}

		/* end of one item */
		{
			char	   *s = item.data;
			char	   *eq;
			char	   *end;
			char	   *err;

			while (*s == ' ' || *s == '\t' || *s == '\n')
				s++;
			end = s + strlen(s);
			while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n'))
				*--end = '\0';
			if (*s != '\0')
			{
				eq = strchr(s, '=');
				if (eq == NULL || eq == s)
					return psprintf("\"%s\" is not of the form key=value.", s);
				*eq = '\0';
				end = eq;
				while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
					*--end = '\0';
				eq++;
				while (*eq == ' ' || *eq == '\t')
					eq++;
				err = fn(s, eq, arg);
				if (err != NULL)
					return err;
			}
		}
		if (*p == '\0')
			break;
		p++;
		resetStringInfo(&item);
	}
	pfree(item.data);
	return NULL;
}

static char *
set_property(const char *key, const char *value, void *arg)
{
	rd_kafka_conf_t *conf = (rd_kafka_conf_t *) arg;
	char		errstr[512];

	for (int i = 0; i < lengthof(reserved_properties); i++)
		if (strcmp(key, reserved_properties[i]) == 0)
			return psprintf("Property \"%s\" is set by the publisher and cannot be changed%s.",
							key,
							strstr(key, "servers") || strstr(key, "broker")
							? " (use outbox.brokers)" : "");

	if (rd_kafka_conf_set(conf, key, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
		return psprintf("Property \"%s\": %s", key, errstr);
	return NULL;
}

/*
 * Validate outbox.kafka_properties by applying it to a scratch
 * configuration: unknown properties and bad values are rejected when the
 * setting is changed, not when the worker next builds a producer.  Returns
 * NULL or a palloc'd message.
 */
char *
outbox_kafka_properties_check(const char *properties)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char	   *err = for_each_property(properties, set_property, conf);

	rd_kafka_conf_destroy(conf);
	return err;
}

void *
outbox_delivery_opaque(uint32 generation, int index)
{
	return (void *) (uintptr_t) (((uint64) generation << 32) | (uint32) index);
}

static void
delivery_report(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	DeliveryTracker *tracker = active_tracker;
	uint64		tag = (uint64) (uintptr_t) msg->_private;
	uint32		generation = (uint32) (tag >> 32);
	int			index = (int) (uint32) tag;
	DeliveryResult *r;

	if (tracker == NULL)
		return;
	if (generation != tracker->generation)
	{
		tracker->stale_reports++;
		if (tracker->stale_report)
			tracker->stale_report(generation, index);
		return;
	}
	if (index < 0 || index >= tracker->nresults)
		return;
	r = &tracker->results[index];
	if (r->done)
		return;
	r->done = true;
	r->err = msg->err;
	r->status = rd_kafka_message_status(msg);
	r->partition = msg->partition;
	r->offset = msg->offset;
	r->acked_at = GetCurrentTimestamp();
	tracker->outstanding--;
}

/*
 * Runs inside rd_kafka_poll() on the worker's own thread; it must not
 * ereport(ERROR).  Transport errors are retried by librdkafka and only
 * logged at DEBUG; a fatal error makes the worker recreate the producer.
 */
static void
error_callback(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		fatal_pending = true;
		return;
	}
	elog(DEBUG1, "outbox: kafka: %s: %s",
		 rd_kafka_err2name((rd_kafka_resp_err_t) err), reason);
}

bool
outbox_producer_fatal_pending(void)
{
	return fatal_pending;
}

rd_kafka_t *
outbox_producer_create(DeliveryTracker *tracker)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char		errstr[512];
	char	   *err;
	rd_kafka_t *rk;

	for (int i = 0; i < lengthof(default_properties); i++)
		if (rd_kafka_conf_set(conf, default_properties[i][0],
							  default_properties[i][1], errstr,
							  sizeof(errstr)) != RD_KAFKA_CONF_OK)
			elog(ERROR, "outbox: librdkafka rejected %s: %s",
				 default_properties[i][0], errstr);

	err = for_each_property(outbox_kafka_properties, set_property, conf);
	if (err != NULL)
	{
		rd_kafka_conf_destroy(conf);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid value for parameter \"outbox.kafka_properties\""),
				 errdetail_internal("%s", err)));
	}

	if (rd_kafka_conf_set(conf, "bootstrap.servers", outbox_brokers, errstr,
						  sizeof(errstr)) != RD_KAFKA_CONF_OK)
	{
		rd_kafka_conf_destroy(conf);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid value for parameter \"outbox.brokers\": %s", errstr)));
	}
	for (int i = 0; i < lengthof(forced_properties); i++)
		if (rd_kafka_conf_set(conf, forced_properties[i][0],
							  forced_properties[i][1], errstr,
							  sizeof(errstr)) != RD_KAFKA_CONF_OK)
			elog(ERROR, "outbox: librdkafka rejected %s: %s",
				 forced_properties[i][0], errstr);

	rd_kafka_conf_set_dr_msg_cb(conf, delivery_report);
	rd_kafka_conf_set_error_cb(conf, error_callback);

	/* rd_kafka_new() takes ownership of conf only on success. */
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("outbox: could not create Kafka producer: %s", errstr)));
	}
	fatal_pending = false;
	active_tracker = tracker;
	return rk;
}

/*
 * Messages still queued are abandoned: they are pending in the database
 * and will be sent again by the next producer.
 */
void
outbox_producer_destroy(rd_kafka_t *rk)
{
	if (rk == NULL)
		return;
	rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_poll(rk, 0);
	rd_kafka_destroy(rk);
	fatal_pending = false;
}

/*
 * Errors that retrying the same message cannot fix: they count towards the
 * poison policy.  Everything else (transport, leadership, timeouts, fatal
 * producer state, purges) is retried forever.
 */
bool
outbox_kafka_error_is_permanent(rd_kafka_resp_err_t err)
{
	switch (err)
	{
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_MSG:
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
		case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
		case RD_KAFKA_RESP_ERR__BAD_MSG:
		case RD_KAFKA_RESP_ERR__INVALID_ARG:
		case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
			return true;
		default:
			return false;
	}
}

/* for_each_property() callback: note message.max.bytes. */
static char *
note_message_max_bytes(const char *key, const char *value, void *arg)
{
	if (strcmp(key, "message.max.bytes") == 0)
		*(int *) arg = atoi(value);
	return NULL;
}

/*
 * The producer's message.max.bytes: librdkafka refuses a record whose key,
 * value and headers exceed it, so outbox_emit() refuses it first.  The
 * value was validated when outbox.kafka_properties was set.
 */
int
outbox_message_max_bytes(void)
{
	int			max_bytes = 1000000;	/* librdkafka's default */
	char	   *err = for_each_property(outbox_kafka_properties,
										note_message_max_bytes, &max_bytes);

	if (err != NULL)
		pfree(err);
	return max_bytes > 0 ? max_bytes : 1000000;
}
