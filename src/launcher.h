/*-------------------------------------------------------------------------
 *
 * launcher.h
 *	  The publishers' launcher: which databases are served, and their
 *	  entries in shared memory.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LAUNCHER_H
#define OUTBOX_LAUNCHER_H

#include "fmgr.h"
#include "postmaster/bgworker.h"

struct OutboxDatabase;
struct OutboxStats;

/* Settings (outbox.databases, outbox.max_workers, outbox.worker_time_slice) */
extern char *outbox_databases;
extern int	outbox_max_workers;
extern int	outbox_time_slice_s;

extern void outbox_launcher_init(void);
extern PGDLLEXPORT void outbox_launcher_main(Datum main_arg);
extern struct OutboxDatabase *outbox_database_entry(Oid dboid);
extern struct OutboxStats *outbox_database_stats(Oid dboid);
extern void outbox_bgworker_init(BackgroundWorker *worker, const char *function,
								 const char *type, int restart_time);
extern bool outbox_database_wanted(const char *name, bool istemplate,
								   bool allowconn, const char **why);
extern void outbox_launcher_probe_at_commit(void);

#endif							/* OUTBOX_LAUNCHER_H */
