/*-------------------------------------------------------------------------
 *
 * init.c
 *	  Module load: _PG_init, and nothing else.
 *
 * Like TimescaleDB's loader, this file only calls, in a list: each module
 * defines its own settings (X_init), and the modules with shared memory
 * ask for it and attach to it themselves (X_shmem_request,
 * X_shmem_startup).  Nothing else calls into this file, so it is the top
 * of the module graph (docs/architecture.md).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/guc.h"

#include "compat.h"
#include "emit.h"
#include "inbox_worker.h"
#include "kafka.h"
#include "launcher.h"
#include "shmem.h"
#include "util.h"
#include "worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

#if OUTBOX_HAVE_SHMEM_REQUEST_HOOK
static shmem_request_hook_type prev_shmem_request_hook = NULL;
#endif
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

#if OUTBOX_HAVE_SHMEM_REQUEST_HOOK
/* Every module's shared memory request (PostgreSQL 15 and later). */
static void
init_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	outbox_shmem_request();
	inbox_shmem_request();
}
#endif

/* Every module's shared memory: created, or attached to. */
static void
init_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	found = outbox_shmem_startup();
	outbox_stats_shmem_startup(found);
	inbox_shmem_startup();
}

/* Module load: settings, and with the preload, shared memory and the workers. */
void
_PG_init(void)
{
	inbox_worker_init();
	inbox_sql_init();

	/*
	 * Loaded otherwise (CREATE EXTENSION, LOAD, a function call,
	 * session_preload_libraries), the SQL functions work and no publisher
	 * runs: outbox_status says so.  The prefix is not reserved then, which
	 * would remove the start-up settings' placeholders with a WARNING each.
	 */
	outbox_kafka_init();
	outbox_define_emit_settings();
	outbox_publisher_init();
	if (!process_shared_preload_libraries_in_progress)
		return;
	outbox_postmaster_settings_init();
	outbox_launcher_init();
	MarkGUCPrefixReserved("outbox");

#if OUTBOX_HAVE_SHMEM_REQUEST_HOOK
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = init_shmem_request;
#else
	outbox_shmem_request();
	inbox_shmem_request();
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = init_shmem_startup;
}
