/*-------------------------------------------------------------------------
 *
 * kafka.c
 *	  Producer configuration, its validation and lifecycle, delivery report
 *	  bookkeeping, and the broker-level conditions the worker reports.
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
 * The Kafka settings are validated in full when they are set, secrets are
 * accepted only from outbox.kafka_credentials_file, and no message about a
 * property repeats its value.  librdkafka's log and errors reach the server
 * log only through rd_kafka_poll(), on the worker's own thread.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/xact.h"
#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "shmem.h"
#include "util.h"
#include "kafka.h"

/* Properties the publisher sets itself; see the file header. */
static const char *const forced_properties[][2] = {
	{"enable.idempotence", "true"},
	{"message.timeout.ms", "0"},
	{"enable.gapless.guarantee", "true"},
	/* librdkafka's log goes through rd_kafka_poll(), on our thread. */
	{"log.queue", "true"},
};

/*
 * Names a user may not set, with or without librdkafka's "topic." prefix:
 * what ordering and delivery depend on, and what the publisher owns.
 */
static const char *const reserved_properties[] = {
	"enable.idempotence", "message.timeout.ms", "delivery.timeout.ms",
	"enable.gapless.guarantee", "acks", "request.required.acks",
	"retries", "message.send.max.retries", "queuing.strategy",
	"bootstrap.servers", "metadata.broker.list", "transactional.id",
	"log.queue", "dr_cb", "dr_msg_cb", "partitioner_cb", "msg_order_cmp",
};

/*
 * Secrets: accepted only in outbox.kafka_credentials_file, because
 * PostgreSQL logs a changed setting's value and shows it in pg_settings.
 * librdkafka 2.0.2's sensitive properties, plus the OIDC client secret.
 */
static const char *const secret_properties[] = {
	"sasl.username", "sasl.password", "sasl.oauthbearer.config",
	"sasl.oauthbearer.client.secret", "ssl.key.location", "ssl.key.password",
	"ssl.key.pem", "ssl.keystore.password", "ssl.ca.pem",
};

/* Paths librdkafka opens only when it connects: checked when set. */
static const char *const path_properties[] = {
	"ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
	"ssl.keystore.location", "ssl.crl.location",
};

/* Partitioners that always map one key to one partition. */
static const char *const keyed_partitioners[] = {
	"consistent", "consistent_random", "murmur2", "murmur2_random",
	"fnv1a", "fnv1a_random",
};

/* Defaults a user may override. */
static const char *const default_properties[][2] = {
	/* Where a Java producer would put the same key. */
	{"partitioner", "murmur2_random"},
	/*
	 * Not librdkafka's 5 ms, added to every idle commit.  Not 1 ms either:
	 * with requests waiting on a replicated cluster's acknowledgements,
	 * librdkafka's threads spin through 1 ms waits, and 2 ms halves the
	 * publisher's CPU per event (docs/benchmarks.md).
	 */
	{"linger.ms", "2"},
	{"client.id", "postgresql-outbox"},
	/* Resume within a second of a broker coming back, not up to ten. */
	{"reconnect.backoff.max.ms", "1000"},
};

/* Set by the error callback, read by the worker after each poll. */
static bool fatal_pending = false;
static DeliveryTracker *active_tracker = NULL;

/* The worker's thread (producer or inbox consumers): the only one that may elog. */
static pthread_t producer_thread;

/*
 * A broker-level condition (all brokers down, authentication failing, ...):
 * logged once when it starts and once when it clears, shown in the status.
 */
static rd_kafka_resp_err_t condition_err = RD_KAFKA_RESP_ERR_NO_ERROR;
static char condition_text[OUTBOX_PROBLEM_LEN];
static TimestampTz condition_since = 0;

/* Fingerprint of the last configuration librdkafka accepted in full. */
static uint32 checked_fingerprint = 0;
static bool checked_any = false;

/* Where a property comes from, for the checks and their messages. */
typedef enum PropertySource
{
	PROP_SETTING,				/* outbox.kafka_properties */
	PROP_FILE					/* outbox.kafka_credentials_file */
} PropertySource;

typedef struct ApplyState
{
	rd_kafka_conf_t *conf;
	PropertySource source;
	StringInfo	fingerprint;	/* every key=value applied, or NULL */
} ApplyState;

/*
 * Called for each key=value pair; returns NULL or a palloc'd message
 * (which must never contain the value).
 */
typedef char *(*property_fn) (const char *key, const char *value, void *arg);

/* Trim blanks at both ends, in place. */
static char *
trim(char *s)
{
	char	   *end;

	while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
		s++;
	end = s + strlen(s);
	while (end > s && (end[-1] == ' ' || end[-1] == '\t' ||
					   end[-1] == '\n' || end[-1] == '\r'))
		*--end = '\0';
	return s;
}

/* Split one "key=value" item and pass it on; "what" names it in errors. */
static char *
apply_item(char *item, const char *what, property_fn fn, void *arg)
{
	char	   *s = trim(item);
	char	   *eq;

	if (*s == '\0')
		return NULL;
	eq = strchr(s, '=');
	if (eq == NULL || eq == s)
		return psprintf("%s is not of the form key=value.", what);
	*eq = '\0';
	return fn(trim(s), trim(eq + 1), arg);
}

/*
 * Split "k=v;k=v" into pairs; "\;" is a literal semicolon.  Calls fn for
 * each pair and stops at the first error it returns.
 */
static char *
for_each_property(const char *properties, property_fn fn, void *arg)
{
	StringInfoData item;
	const char *p = properties ? properties : "";
	int			n = 1;

	initStringInfo(&item);
	for (;;)
	{
		char	   *err;

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
		err = apply_item(item.data, psprintf("Item %d", n), fn, arg);
		if (err != NULL)
			return err;
		if (*p == '\0')
			break;
		p++;
		n++;
		resetStringInfo(&item);
	}
	pfree(item.data);
	return NULL;
}

/* Case-insensitive membership test of a name in a list. */
static bool
name_in(const char *name, const char *const *list, int n)
{
	for (int i = 0; i < n; i++)
		if (pg_strcasecmp(name, list[i]) == 0)
			return true;
	return false;
}

/*
 * librdkafka's message with every whole-word occurrence of the value cut
 * out: messages about a property must never repeat its value.
 */
static char *
redact(const char *errstr, const char *value)
{
	StringInfoData buf;
	size_t		vlen = strlen(value);
	const char *p = errstr;

	initStringInfo(&buf);
	while (*p)
	{
		bool		before = (p == errstr || strchr(" \"':,=", p[-1]) != NULL);

		if (vlen > 0 && before && strncmp(p, value, vlen) == 0 &&
			(p[vlen] == '\0' || strchr(" \"':,\n", p[vlen]) != NULL))
		{
			appendStringInfoString(&buf, "(value)");
			p += vlen;
			continue;
		}
		appendStringInfoChar(&buf, *p++);
	}
	while (buf.len > 0 && (buf.data[buf.len - 1] == '\n' || buf.data[buf.len - 1] == '.'))
		buf.data[--buf.len] = '\0';
	return buf.data;
}

/* Refuse what breaks ordering, leaks a secret or names a missing file. */
static char *
property_policy_error(const char *key, const char *value, PropertySource source)
{
	/* librdkafka applies "topic.x" as the topic property "x". */
	const char *bare = pg_strncasecmp(key, "topic.", 6) == 0 ? key + 6 : key;

	if (name_in(bare, reserved_properties, lengthof(reserved_properties)))
		return psprintf("Property \"%s\" is set by the publisher and cannot be changed%s.",
						key,
						strstr(bare, "servers") || strstr(bare, "broker")
						? " (use outbox.brokers)" : "");
	/* outbox_emit() reads it from the setting: the file is not read there. */
	if (source == PROP_FILE && pg_strcasecmp(bare, "message.max.bytes") == 0)
		return psprintf("Property \"%s\" belongs in outbox.kafka_properties.", key);
	if (pg_strcasecmp(bare, "partitioner") == 0 &&
		!name_in(value, keyed_partitioners, lengthof(keyed_partitioners)))
		return psprintf("Property \"%s\" must keep each key on one partition: "
						"consistent, consistent_random, murmur2, murmur2_random, fnv1a or fnv1a_random.",
						key);
	return outbox_kafka_shared_property_error(key, value, source == PROP_FILE,
											  "outbox.kafka_credentials_file");
}

/*
 * The rules the publisher and the inbox consumers share: a secret only
 * from a credentials file (file_setting names it), a path that exists.
 * NULL or a palloc'd message without the value.
 */
char *
outbox_kafka_shared_property_error(const char *key, const char *value,
								   bool from_file, const char *file_setting)
{
	const char *bare = pg_strncasecmp(key, "topic.", 6) == 0 ? key + 6 : key;
	struct stat st;

	if (!from_file && name_in(bare, secret_properties, lengthof(secret_properties)))
		return psprintf("Property \"%s\" is a secret: put it in the file named by %s.",
						key, file_setting);
	if (name_in(bare, path_properties, lengthof(path_properties)) &&
		!(pg_strcasecmp(bare, "ssl.ca.location") == 0 && strcmp(value, "probe") == 0) &&
		stat(value, &st) != 0)
		return psprintf("Property \"%s\" names a file that cannot be found: %s.",
						key, strerror(errno));
	return NULL;
}

/* property_fn: check one pair and apply it to a configuration. */
static char *
apply_property(const char *key, const char *value, void *arg)
{
	ApplyState *st = (ApplyState *) arg;
	char		errstr[512];
	char	   *err = property_policy_error(key, value, st->source);

	if (err != NULL)
		return err;
	if (rd_kafka_conf_set(st->conf, key, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
		return psprintf("Property \"%s\": %s.", key,
						st->source == PROP_FILE ? "librdkafka refuses its value"
						: redact(errstr, value));
	if (st->fingerprint)
		appendStringInfo(st->fingerprint, "%s=%s\n", key, value);
	return NULL;
}

/*
 * Open the credentials file with the checks PostgreSQL makes of
 * ssl_key_file: a regular file, owned by the server's user (then no group
 * or world access) or by root (then at most group read).  Returns the open
 * file or NULL with *err set.
 */
static FILE *
open_credentials(const char *path, char **err)
{
	FILE	   *f = fopen(path, "r");
	struct stat st;

	if (f == NULL)
	{
		*err = psprintf("Could not open \"%s\": %s.", path, strerror(errno));
		return NULL;
	}
	if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
		*err = psprintf("\"%s\" is not a regular file.", path);
	else if (st.st_uid != geteuid() && st.st_uid != 0)
		*err = psprintf("\"%s\" must be owned by the database user or root.", path);
	else if ((st.st_uid == geteuid() && (st.st_mode & (S_IRWXG | S_IRWXO))) ||
			 (st.st_uid == 0 && (st.st_mode & (S_IWGRP | S_IXGRP | S_IRWXO))))
		*err = psprintf("\"%s\" has group or world access: permissions must be u=rw (0600) or less "
						"if owned by the database user, or u=rw,g=r (0640) or less if owned by root.",
						path);
	else
		return f;
	fclose(f);
	return NULL;
}

/*
 * Read a credentials file: one key=value per line, blank lines and lines
 * starting with # ignored; fn is called for each pair.  Errors name the
 * file, the line and the key, never the value.  The publisher's and the
 * inbox consumers' files.
 */
char *
outbox_kafka_read_credentials(const char *path, outbox_property_fn fn, void *arg)
{
	FILE	   *f;
	char	   *err = NULL;
	char		line[8192];
	char	   *where;
	int			lineno = 0;

	if (path == NULL || path[0] == '\0')
		return NULL;
	f = open_credentials(path, &err);
	if (f == NULL)
		return err;
	while (err == NULL && fgets(line, sizeof(line), f) != NULL)
	{
		char	   *s = line;

		lineno++;
		if (strchr(line, '\n') == NULL && !feof(f))
		{
			err = psprintf("Line %d of \"%s\" is too long.", lineno, path);
			break;
		}
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s == '#')
			continue;
		where = psprintf("Line %d of \"%s\"", lineno, path);
		err = apply_item(s, where, fn, arg);
		/* A property's own error names the key: add the file and line. */
		if (err != NULL && strncmp(err, where, strlen(where)) != 0)
			err = psprintf("%s: %s", where, err);
	}
	if (err == NULL && ferror(f))
		err = psprintf("Could not read \"%s\": %s.", path, strerror(errno));
	explicit_bzero(line, sizeof(line));
	fclose(f);
	return err;
}

/* Apply the publisher's credentials file (see outbox_kafka_read_credentials). */
static char *
apply_credentials(const char *path, ApplyState *st)
{
	char	   *err;

	st->source = PROP_FILE;
	err = outbox_kafka_read_credentials(path, apply_property, st);
	st->source = PROP_SETTING;
	return err;
}

/* Whether a librdkafka message is about a property the publisher forces. */
static bool
mentions_forced_property(const char *msg)
{
	for (int i = 0; i < lengthof(forced_properties); i++)
		if (strstr(msg, forced_properties[i][0]) != NULL)
			return true;
	return false;
}

/* A librdkafka log line; runs only inside rd_kafka_poll() (log.queue). */
static void
log_callback(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	/* Never elog from one of librdkafka's threads. */
	if (!pthread_equal(pthread_self(), producer_thread))
		return;

	/*
	 * What librdkafka prints by default (up to LOG_INFO, e.g. timed-out
	 * requests) goes to the server log, except connection failures, which
	 * arrive through the error callback too (it logs each condition once),
	 * and warnings about the properties we force, which are known.
	 */
	if (level > 6)
		elog(DEBUG2, "outbox: librdkafka: %s: %s", fac, buf);
	else if (strcmp(fac, "FAIL") == 0 || strcmp(fac, "ERROR") == 0 ||
			 (strcmp(fac, "CONFWARN") == 0 && mentions_forced_property(buf)))
		elog(DEBUG1, "outbox: librdkafka: %s: %s", fac, buf);
	else
		ereport(LOG, (errmsg("outbox: librdkafka: %s: %s", fac, buf)));
}

/*
 * Route a client's log lines to the server log (log_callback), served by
 * its polls on this thread: call before rd_kafka_new(), then
 * rd_kafka_set_log_queue(rk, NULL).  The inbox consumers use it too.
 */
void
outbox_kafka_log_to_server(rd_kafka_conf_t *conf)
{
	char		errstr[512];

	if (rd_kafka_conf_set(conf, "log.queue", "true", errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
		elog(ERROR, "outbox: librdkafka rejected log.queue: %s", errstr);
	rd_kafka_conf_set_log_cb(conf, log_callback);
	producer_thread = pthread_self();
}

/* A configuration's log callback for a scratch instance: silence. */
static void
silent_log_callback(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
}

/*
 * The full producer configuration: defaults, outbox.kafka_properties, the
 * credentials file, the brokers (if given) and the forced properties.
 * Returns NULL with *err set if anything is refused.  *fingerprint, if
 * given, identifies what was applied.
 */
static rd_kafka_conf_t *
build_conf(const char *properties, const char *credentials_file,
		   const char *brokers, uint32 *fingerprint, char **err)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char		errstr[512];
	StringInfoData fp;
	ApplyState	st = {conf, PROP_SETTING, &fp};

	initStringInfo(&fp);
	*err = NULL;
	for (int i = 0; i < lengthof(default_properties); i++)
		if (rd_kafka_conf_set(conf, default_properties[i][0], default_properties[i][1],
							  errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
			elog(ERROR, "outbox: librdkafka rejected %s: %s",
				 default_properties[i][0], errstr);

	*err = for_each_property(properties, apply_property, &st);
	if (*err == NULL)
		*err = apply_credentials(credentials_file, &st);
	if (*err == NULL && brokers != NULL &&
		rd_kafka_conf_set(conf, "bootstrap.servers", brokers, errstr,
						  sizeof(errstr)) != RD_KAFKA_CONF_OK)
		*err = psprintf("outbox.brokers: %s", errstr);
	for (int i = 0; *err == NULL && i < lengthof(forced_properties); i++)
		if (rd_kafka_conf_set(conf, forced_properties[i][0], forced_properties[i][1],
							  errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
			elog(ERROR, "outbox: librdkafka rejected %s: %s",
				 forced_properties[i][0], errstr);
	return outbox_kafka_conf_finish(conf, *err, &fp, fingerprint);
}

/*
 * End a configuration built with a record of its properties (fp): NULL,
 * the configuration destroyed, if err is set; else the configuration, with
 * *fingerprint (if given) identifying what was applied.  The record, which
 * holds secrets, is wiped either way.  The producer's and the consumers'.
 */
rd_kafka_conf_t *
outbox_kafka_conf_finish(rd_kafka_conf_t *conf, const char *err, StringInfo fp,
						 uint32 *fingerprint)
{
	if (err != NULL)
	{
		rd_kafka_conf_destroy(conf);
		conf = NULL;
	}
	else if (fingerprint)
		*fingerprint = hash_bytes((const unsigned char *) fp->data, fp->len);
	explicit_bzero(fp->data, fp->len);
	pfree(fp->data);
	return conf;
}

/*
 * Whether to create a scratch producer: for a statement (SET, ALTER SYSTEM,
 * loading the library) and in background workers (a publisher rejecting a
 * reloaded value keeps its working configuration), not in every backend
 * re-reading the configuration file, nor in the postmaster, which must stay
 * single-threaded.  The built-in configuration needs no check.
 */
static bool
deep_check_wanted(const char *properties, const char *credentials_file)
{
	if ((properties == NULL || properties[0] == '\0') &&
		(credentials_file == NULL || credentials_file[0] == '\0'))
		return false;
	return IsUnderPostmaster &&
		(IsTransactionState() || MyBackendType == B_BG_WORKER);
}

/*
 * Validate the Kafka settings when they are set: every property must be
 * accepted by librdkafka and by our ordering and secrecy rules, and the
 * whole configuration must make a producer (librdkafka checks combinations
 * such as idempotence with max.in.flight only then).  Creating one without
 * brokers starts no connection and costs a few milliseconds (~30 with
 * SSL); see deep_check_wanted() for where, and it is skipped for a
 * configuration already checked.  Returns NULL or a palloc'd
 * message that never contains a property value.
 */
char *
outbox_kafka_config_check(const char *properties, const char *credentials_file)
{
	uint32		fingerprint;
	char	   *err;
	char		errstr[512];
	rd_kafka_conf_t *conf = build_conf(properties, credentials_file, NULL,
									   &fingerprint, &err);
	rd_kafka_t *rk;

	if (conf == NULL)
		return err;
	if (!deep_check_wanted(properties, credentials_file) ||
		(checked_any && fingerprint == checked_fingerprint))
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	rd_kafka_conf_set_log_cb(conf, silent_log_callback);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		return psprintf("librdkafka refuses the configuration: %s.", errstr);
	}
	rd_kafka_destroy(rk);
	checked_fingerprint = fingerprint;
	checked_any = true;
	return NULL;
}

/*
 * Validate outbox.brokers: a comma-separated list of host[:port], each
 * optionally prefixed with a protocol ("SSL://host:port"), as librdkafka
 * reads it; librdkafka itself accepts anything and then fails quietly.
 */
char *
outbox_brokers_check(const char *brokers)
{
	char	   *list = pstrdup(brokers ? brokers : "");
	char	   *save = NULL;
	int			n = 0;

	for (char *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save))
	{
		char	   *s = trim(item);
		char	   *host;
		char	   *port = NULL;
		char	   *proto = strstr(s, "://");

		if (*s == '\0')
			continue;
		n++;
		host = proto ? proto + 3 : s;
		if (proto)
			for (char *c = s; c < proto; c++)
				if (!isalpha((unsigned char) *c) && *c != '_')
					return psprintf("\"%s\" has an invalid protocol prefix.", s);
		if (*host == '[')
		{
			char	   *close = strchr(host, ']');

			if (close == NULL || close == host + 1 ||
				strspn(host + 1, "0123456789abcdefABCDEF:.") != (size_t) (close - host - 1))
				return psprintf("\"%s\" is not host:port (bad IPv6 address).", s);
			if (close[1] == ':')
				port = close + 2;
			else if (close[1] != '\0')
				return psprintf("\"%s\" is not host:port.", s);
		}
		else
		{
			char	   *colon = strchr(host, ':');
			size_t		hostlen = colon ? (size_t) (colon - host) : strlen(host);

			if (hostlen == 0 ||
				strspn(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") != hostlen)
				return psprintf("\"%s\" is not host:port (bad host name).", s);
			if (colon)
				port = colon + 1;
		}
		if (port != NULL)
		{
			char	   *end;
			long		p = strtol(port, &end, 10);

			if (*port == '\0' || *end != '\0' || p < 1 || p > 65535)
				return psprintf("\"%s\" is not host:port (the port must be 1 to 65535).", s);
		}
	}
	if (n == 0)
		return pstrdup("At least one broker is needed.");
	return NULL;
}

/*
 * Fingerprint of the configuration a producer would be built from now, so
 * that a reload can tell whether the credentials file changed.  0 if it
 * cannot be built (the producer creation reports why).
 */
uint32
outbox_kafka_config_fingerprint(void)
{
	uint32		fingerprint = 0;
	char	   *err;
	rd_kafka_conf_t *conf = build_conf(outbox_kafka_properties,
									   outbox_kafka_credentials_file,
									   outbox_brokers, &fingerprint, &err);

	if (conf == NULL)
		return 0;
	rd_kafka_conf_destroy(conf);
	return hash_combine(fingerprint, hash_bytes((const unsigned char *) outbox_brokers,
												strlen(outbox_brokers)));
}

void *
outbox_delivery_opaque(uint32 generation, int index)
{
	return (void *) (uintptr_t) (((uint64) generation << 32) | (uint32) index);
}

/* A condition cleared (a delivery or a metadata request succeeded). */
static void
condition_clear(void)
{
	if (condition_err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return;
	ereport(LOG,
			(errmsg("outbox: Kafka is reachable again"),
			 errdetail("The condition \"%s\" lasted %ld s.", condition_text,
					   TimestampDifferenceMilliseconds(condition_since,
													   GetCurrentTimestamp()) / 1000)));
	condition_err = RD_KAFKA_RESP_ERR_NO_ERROR;
	condition_text[0] = '\0';
	condition_since = 0;
}

/*
 * A condition started; logged once, unless it is the one already known.
 * "All brokers down" follows every failed login (or TLS handshake, or name
 * lookup): it must not replace the cause it is a symptom of, or the cause
 * would be logged again at the next attempt.
 */
static void
condition_set(rd_kafka_resp_err_t err, const char *what, const char *reason)
{
	if (err == condition_err)
		return;
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN &&
		condition_err != RD_KAFKA_RESP_ERR_NO_ERROR)
		return;
	condition_err = err;
	snprintf(condition_text, sizeof(condition_text), "%s", what);
	condition_since = GetCurrentTimestamp();
	ereport(LOG,
			(errmsg("outbox: Kafka: %s", what),
			 errdetail("librdkafka: %s: %s", rd_kafka_err2name(err), reason),
			 errhint("The publisher keeps retrying; events wait in the outbox.")));
}

/* A message's delivery report: fill in its slot, if it is still tracked. */
static void
delivery_report(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	DeliveryTracker *tracker = active_tracker;
	uint64		tag = (uint64) (uintptr_t) msg->_private;
	uint32		generation = (uint32) (tag >> 32);
	int			index = (int) (uint32) tag;
	DeliveryResult *r;

	if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		condition_clear();
	if (tracker == NULL)
		return;
	r = tracker->result_slot(generation, index);
	if (r == NULL)
	{
		tracker->stale_reports++;
		return;
	}
	if (r->done)
		return;
	r->done = true;
	r->err = msg->err;
	r->status = rd_kafka_message_status(msg);
	r->partition = msg->partition;
	r->offset = msg->offset;
	r->acked_at = GetCurrentTimestamp();
	tracker->delivered(generation, index);
}

/*
 * Runs inside rd_kafka_poll() on the worker's own thread; it must not
 * ereport(ERROR).  Conditions that stop all publishing are logged once when
 * they start (and once when they clear); single connection failures, which
 * librdkafka retries, only at DEBUG1.  A fatal error makes the worker
 * recreate the producer.
 */
static void
error_callback(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	switch (err)
	{
		case RD_KAFKA_RESP_ERR__FATAL:
			fatal_pending = true;
			return;
		case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
			condition_set(err, "all brokers are down", reason);
			break;
		case RD_KAFKA_RESP_ERR__AUTHENTICATION:
		case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
			condition_set(RD_KAFKA_RESP_ERR__AUTHENTICATION,
						  "authentication with the brokers failed", reason);
			break;
		case RD_KAFKA_RESP_ERR__SSL:
			condition_set(err, "SSL connection to the brokers failed", reason);
			break;
		case RD_KAFKA_RESP_ERR__RESOLVE:
			condition_set(err, "broker host names cannot be resolved", reason);
			break;
		default:
			break;
	}
	elog(DEBUG1, "outbox: kafka: %s: %s",
		 rd_kafka_err2name((rd_kafka_resp_err_t) err), reason);
}

bool
outbox_producer_fatal_pending(void)
{
	return fatal_pending;
}

/* The current broker-level condition, or NULL; *since when it started. */
const char *
outbox_kafka_condition(TimestampTz *since)
{
	if (condition_err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return NULL;
	*since = condition_since;
	return condition_text;
}

/*
 * While a condition holds and nothing is being delivered, ask a broker for
 * metadata: an answer means the condition cleared.  Waits at most 200 ms.
 */
void
outbox_producer_probe(rd_kafka_t *rk)
{
	const struct rd_kafka_metadata *md;

	if (rk == NULL || condition_err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return;
	if (rd_kafka_metadata(rk, 0, NULL, &md, 200) == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		rd_kafka_metadata_destroy(md);
		condition_clear();
	}
}

/*
 * A producer from the current settings.  An error says what is wrong
 * without repeating any property value.
 */
rd_kafka_t *
outbox_producer_create(DeliveryTracker *tracker)
{
	char		errstr[512];
	char	   *err;
	rd_kafka_t *rk;
	rd_kafka_conf_t *conf = build_conf(outbox_kafka_properties,
									   outbox_kafka_credentials_file,
									   outbox_brokers, NULL, &err);

	if (conf == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("could not create Kafka producer"),
				 errdetail_internal("%s", err)));

	rd_kafka_conf_set_dr_msg_cb(conf, delivery_report);
	rd_kafka_conf_set_error_cb(conf, error_callback);
	outbox_kafka_log_to_server(conf);

	/* rd_kafka_new() takes ownership of conf only on success. */
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("could not create Kafka producer"),
				 errdetail("librdkafka refuses the configuration: %s.", errstr)));
	}
	/* Log lines wait in the main queue for rd_kafka_poll(). */
	rd_kafka_set_log_queue(rk, NULL);
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

/* librdkafka's default message.max.bytes, until the setting is assigned. */
int			outbox_kafka_message_max_bytes = 1000000;

/*
 * The message.max.bytes a property string gives the producer: librdkafka
 * refuses a record whose key, value and headers exceed it, so outbox_emit()
 * refuses it first.  The string was validated by the caller.
 */
int
outbox_properties_message_max_bytes(const char *properties)
{
	int			max_bytes = 1000000;	/* librdkafka's default */
	char	   *err = for_each_property(properties, note_message_max_bytes, &max_bytes);

	if (err != NULL)
		pfree(err);
	return max_bytes > 0 ? max_bytes : 1000000;
}

/* The property splitter, for the inbox workers' consumer properties. */
char *
outbox_for_each_property(const char *properties, outbox_property_fn fn, void *arg)
{
	return for_each_property(properties, fn, arg);
}

char	   *outbox_brokers = NULL;
char	   *outbox_kafka_properties = NULL;
char	   *outbox_kafka_credentials_file = NULL;

/*
 * The Kafka settings' check hooks.  GUC_check_errmsg replaces PostgreSQL's
 * "invalid value for parameter: <value>", which would repeat the whole
 * string in the error and the server log.
 */
bool
outbox_kafka_check_failed(const char *name, char *err)
{
	GUC_check_errmsg("invalid value for parameter \"%s\"", name);
	GUC_check_errdetail("%s", err);
	pfree(err);
	return false;
}

/*
 * Also works out the producer's message.max.bytes once per value, for
 * outbox_emit()'s record size check (the assign hook keeps it), rather
 * than parsing the properties on every emit.
 */
static bool
check_kafka_properties(char **newval, void **extra, GucSource source)
{
	char	   *err = outbox_kafka_config_check(*newval, outbox_kafka_credentials_file);
	int		   *max_bytes;

	if (err != NULL)
		return outbox_kafka_check_failed("outbox.kafka_properties", err);
	/* The GUC machinery free()s extra; guc_malloc() is exported from 16. */
	max_bytes = outbox_guc_malloc(sizeof(int));
	if (max_bytes == NULL)
		return false;
	*max_bytes = outbox_properties_message_max_bytes(*newval);
	*extra = max_bytes;
	return true;
}

/* Keep the message.max.bytes the check hook found. */
static void
assign_kafka_properties(const char *newval, void *extra)
{
	outbox_kafka_message_max_bytes = *(int *) extra;
}

/* The credentials file must be readable and hold only properties. */
static bool
check_kafka_credentials_file(char **newval, void **extra, GucSource source)
{
	char	   *err = outbox_kafka_config_check(outbox_kafka_properties, *newval);

	if (err == NULL)
		return true;
	GUC_check_errhint("%s", OUTBOX_CREDENTIALS_FILE_HINT);
	return outbox_kafka_check_failed("outbox.kafka_credentials_file", err);
}

/* Brokers must be a list of host:port. */
static bool
check_brokers(char **newval, void **extra, GucSource source)
{
	char	   *err = outbox_brokers_check(*newval);

	return err == NULL || outbox_kafka_check_failed("outbox.brokers", err);
}

/* Define the Kafka settings (from _PG_init). */
void
outbox_kafka_init(void)
{
	DefineCustomStringVariable("outbox.brokers",
							   "Kafka bootstrap servers (host:port, comma-separated).",
							   NULL,
							   &outbox_brokers,
							   "localhost:9092",
							   PGC_SIGHUP,
							   0,
							   check_brokers, NULL, NULL);

	/* Before kafka_properties: its check reads this one. */
	DefineCustomStringVariable("outbox.kafka_credentials_file",
							   "File of librdkafka properties holding secrets, one key=value per line.",
							   "Like ssl_key_file: owned by the database user (mode 0600 or less) or root (0640 or less). "
							   "Read when the producer is created; a relative path is relative to the data directory.",
							   &outbox_kafka_credentials_file,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   check_kafka_credentials_file, NULL, NULL);

	DefineCustomStringVariable("outbox.kafka_properties",
							   "librdkafka producer properties, as key=value pairs separated by semicolons.",
							   "For example security.protocol=SASL_SSL;sasl.mechanism=SCRAM-SHA-256. "
							   "Secrets (sasl.password, ...) are refused here: use outbox.kafka_credentials_file.",
							   &outbox_kafka_properties,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY,
							   check_kafka_properties, assign_kafka_properties, NULL);
}
