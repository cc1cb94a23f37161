/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  Module load: settings, shared memory, worker registration, and the
 *	  commit callback that wakes the publisher.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "replication/walsender.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "compat.h"
#include "outbox.h"
#include "kafka.h"
#include "inbox_worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

OutboxShared *outbox_shared = NULL;

char	   *outbox_database = NULL;
char	   *outbox_role = NULL;
char	   *outbox_brokers = NULL;
char	   *outbox_kafka_properties = NULL;
char	   *outbox_kafka_credentials_file = NULL;
char	   *outbox_default_topic = NULL;
int			outbox_workers = 1;
int			outbox_max_payload_bytes = 1024 * 1024;
int			outbox_batch_events = 10000;
int			outbox_batch_aggregates = 10000;
int			outbox_batch_bytes = 16 * 1024 * 1024;
int			outbox_standby_confirmations = 0;
int			outbox_poll_interval_ms = 1000;
int			outbox_delivery_timeout_ms = 10000;
int			outbox_max_attempts = 5;
bool		outbox_enable_test_hooks = false;
int			outbox_poison_policy = POISON_BLOCK;
char	   *outbox_dead_letter_topic = NULL;
int			outbox_retention_s = 7 * 24 * 3600;
int			outbox_inbox_retention_s = 30 * 24 * 3600;
int			outbox_retention_batch = 1000;

static const struct config_enum_entry poison_policy_options[] = {
	{"block", POISON_BLOCK, false},
	{"dead_letter", POISON_DEAD_LETTER, false},
	{"skip", POISON_SKIP, false},
	{NULL, 0, false}
};

static bool emitted_in_xact = false;
static bool xact_callback_registered = false;

#if PG_VERSION_NUM >= 150000
static shmem_request_hook_type prev_shmem_request_hook = NULL;
#endif
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size
outbox_shmem_size(void)
{
	return MAXALIGN(sizeof(OutboxShared));
}

#if PG_VERSION_NUM >= 150000
static void
outbox_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(outbox_shmem_size());
}
#endif

static void
outbox_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_shared = ShmemInitStruct("outbox", outbox_shmem_size(), &found);
	if (!found)
	{
		memset(outbox_shared, 0, outbox_shmem_size());
		pg_atomic_init_u64(&outbox_shared->commits_emitted, 0);
		pg_atomic_init_u32(&outbox_shared->inject_fatal_error, 0);
		outbox_stats_init(&outbox_shared->stats);
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Wake every publisher when a transaction that emitted commits: the event is
 * visible from this moment, and waiting for the fallback poll would add its
 * whole interval to the latency.
 */
static void
outbox_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (emitted_in_xact && outbox_shared != NULL)
			{
				pg_atomic_fetch_add_u64(&outbox_shared->commits_emitted, 1);
				outbox_wake_workers();
			}
			emitted_in_xact = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* A prepared emit is found by the fallback poll once committed. */
			emitted_in_xact = false;
			break;
		default:
			break;
	}
}

void
outbox_wake_workers(void)
{
	for (int i = 0; i < OUTBOX_MAX_WORKERS; i++)
	{
		Latch	   *latch = outbox_shared->workers[i].latch;

		if (latch != NULL)
			SetLatch(latch);
	}
}

void
outbox_note_emit(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(outbox_xact_callback, NULL);
		xact_callback_registered = true;
	}
	emitted_in_xact = true;
}

/*
 * The lock tag of an aggregate in one of our advisory key spaces.  Two
 * aggregates whose 64-bit hashes collide share a lock: that costs
 * parallelism, never correctness.
 */
void
outbox_aggregate_locktag(LOCKTAG *tag, const char *aggregate_id, int len,
						 uint16 space)
{
	uint64		h = hash_bytes_extended((const unsigned char *) aggregate_id,
										len, 0);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32),
						 (uint32) h, space);
}

/*
 * The publisher's lock of the bucket holding an aggregate.  The bucket is
 * hashtext(aggregate_id) modulo OUTBOX_PUBLISH_BUCKETS, the same expression
 * the worker's query uses to split buckets between workers.
 */
void
outbox_publish_locktag(LOCKTAG *tag, const char *aggregate_id)
{
	uint32		h = hash_bytes((const unsigned char *) aggregate_id,
							   strlen(aggregate_id));

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, 0,
						 (h & 0x7fffffff) % OUTBOX_PUBLISH_BUCKETS,
						 OUTBOX_LOCKSPACE_PUBLISH);
}

/*
 * The Kafka settings' check hooks.  GUC_check_errmsg replaces PostgreSQL's
 * "invalid value for parameter: <value>", which would repeat the whole
 * string in the error and the server log.
 */
static bool
kafka_check_failed(const char *name, char *err)
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
		return kafka_check_failed("outbox.kafka_properties", err);
	/* The GUC machinery free()s extra; guc_malloc() is exported from 16. */
#if PG_VERSION_NUM >= 160000
	max_bytes = guc_malloc(LOG, sizeof(int));
#else
	max_bytes = malloc(sizeof(int));
#endif
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

static bool
check_kafka_credentials_file(char **newval, void **extra, GucSource source)
{
	char	   *err = outbox_kafka_config_check(outbox_kafka_properties, *newval);

	return err == NULL || kafka_check_failed("outbox.kafka_credentials_file", err);
}

static bool
check_brokers(char **newval, void **extra, GucSource source)
{
	char	   *err = outbox_brokers_check(*newval);

	return err == NULL || kafka_check_failed("outbox.brokers", err);
}

static bool
check_default_topic(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
	{
		GUC_check_errdetail("The default topic must not be empty.");
		return false;
	}
	return true;
}

static bool
check_dead_letter_topic(char **newval, void **extra, GucSource source)
{
	const char *err = outbox_topic_error(*newval);

	if (err != NULL)
	{
		GUC_check_errdetail("%s", err);
		return false;
	}
	return true;
}

/* More confirmations than walsenders could ever give would stop publishing. */
static bool
check_standby_confirmations(int *newval, void **extra, GucSource source)
{
	if (*newval > max_wal_senders)
	{
		GUC_check_errdetail("It must not exceed max_wal_senders (%d).", max_wal_senders);
		return false;
	}
	return true;
}

/*
 * Settings read only at server start.  PostgreSQL allows defining them only
 * while shared_preload_libraries is processed (FATAL otherwise), and only
 * then do they mean anything: without the preload there is no publisher.
 */
static void
define_postmaster_settings(void)
{
	DefineCustomStringVariable("outbox.database",
							   "Database whose outbox the publisher serves.",
							   NULL,
							   &outbox_database,
							   "postgres",
							   PGC_POSTMASTER,
							   0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.role",
							   "Role the publisher connects as (empty: the bootstrap superuser).",
							   "The role needs SELECT and UPDATE on outbox and INSERT, SELECT and UPDATE on aggregate_publication.",
							   &outbox_role,
							   "",
							   PGC_POSTMASTER,
							   0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.workers",
							"Number of publisher workers.",
							"0 disables publishing.",
							&outbox_workers,
							1, 0, OUTBOX_MAX_WORKERS,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("outbox.enable_test_hooks",
							 "Allows outbox_test_fatal_error() (for fault-injection tests only).",
							 NULL,
							 &outbox_enable_test_hooks,
							 false,
							 PGC_POSTMASTER,
							 GUC_NOT_IN_SAMPLE,
							 NULL, NULL, NULL);
}

/* Settings that can change at run time; defined wherever we are loaded. */
static void
define_settings(void)
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

	DefineCustomStringVariable("outbox.default_topic",
							   "Topic of events emitted without one; {aggregate_type} is replaced.",
							   "The default routes like Debezium's outbox event router.",
							   &outbox_default_topic,
							   "outbox.event.{aggregate_type}",
							   PGC_SUSET,
							   0,
							   check_default_topic, NULL, NULL);

	DefineCustomIntVariable("outbox.max_payload_bytes",
							"Largest payload outbox_emit() accepts, as JSON text.",
							NULL,
							&outbox_max_payload_bytes,
							1024 * 1024, 1, MaxAllocSize / 2,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.batch_events",
							"Most events one publisher transaction sends.",
							NULL,
							&outbox_batch_events,
							10000, 1, 1000000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.batch_aggregates",
							"Most aggregates one publisher transaction takes.",
							NULL,
							&outbox_batch_aggregates,
							10000, 1, 100000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.batch_bytes",
							"Most bytes of events one publisher transaction reads.",
							"Counts payloads, headers and ids; a batch holds at least one event, however large.",
							&outbox_batch_bytes,
							16 * 1024 * 1024, 1024, MaxAllocSize / 2,
							PGC_SIGHUP,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.standby_confirmations",
							"Standbys that must have flushed an event's commit before it is published.",
							"0 publishes what is durable on this server.  N > 0 waits until N walsenders "
							"report the commit flushed, so that a failover to such a standby cannot take back "
							"a published event; with fewer standbys connected, publishing waits.",
							&outbox_standby_confirmations,
							0, 0, 1024,
							PGC_SIGHUP,
							0,
							check_standby_confirmations, NULL, NULL);

	DefineCustomIntVariable("outbox.poll_interval",
							"Fallback poll interval of an idle publisher.",
							"Commits of emitting transactions wake the publisher at once; "
							"the poll catches events committed while it was not running.",
							&outbox_poll_interval_ms,
							1000, 10, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.delivery_timeout",
							"How long a publisher transaction waits for Kafka's acknowledgements.",
							"Unacknowledged events stay pending and are sent again later; "
							"librdkafka itself never gives up on a message.",
							&outbox_delivery_timeout_ms,
							10000, 100, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

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

	DefineCustomStringVariable("outbox.dead_letter_topic",
							   "Topic poison events are sent to under the dead_letter policy.",
							   NULL,
							   &outbox_dead_letter_topic,
							   "outbox.dead_letter",
							   PGC_SIGHUP,
							   0,
							   check_dead_letter_topic, NULL, NULL);

	DefineCustomIntVariable("outbox.retention",
							"How long published, dead-lettered and skipped events are kept.",
							"-1 keeps them forever.",
							&outbox_retention_s,
							7 * 24 * 3600, -1, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.inbox_retention",
							"How long inbox entries are kept.",
							"Must exceed the Kafka topics' retention plus the longest replay window, "
							"or a redelivered event passes the deduplication.  -1 keeps them forever.",
							&outbox_inbox_retention_s,
							30 * 24 * 3600, -1, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retention_batch",
							"Rows retention deletes per transaction.",
							NULL,
							&outbox_retention_batch,
							1000, 1, 100000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	outbox_define_emit_settings();
}

void
_PG_init(void)
{
	BackgroundWorker worker;

	inbox_worker_init();

	/*
	 * Loaded otherwise (CREATE EXTENSION, LOAD, a function call,
	 * session_preload_libraries), the SQL functions work and no publisher
	 * runs: outbox_status says so.  The prefix is not reserved then, which
	 * would remove the start-up settings' placeholders with a WARNING each.
	 */
	define_settings();
	if (!process_shared_preload_libraries_in_progress)
		return;
	define_postmaster_settings();
	MarkGUCPrefixReserved("outbox");

#if PG_VERSION_NUM >= 150000
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_shmem_request;
#else
	RequestAddinShmemSpace(outbox_shmem_size());
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_shmem_startup;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	/* After an unexpected exit, wait a little: never crash-loop. */
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "outbox_worker_main");
	snprintf(worker.bgw_type, BGW_MAXLEN, "outbox publisher");

	for (int i = 0; i < outbox_workers; i++)
	{
		snprintf(worker.bgw_name, BGW_MAXLEN, "outbox publisher %d", i);
		worker.bgw_main_arg = Int32GetDatum(i);
		RegisterBackgroundWorker(&worker);
	}
}
