/*-------------------------------------------------------------------------
 *
 * launcher.h
 *	  The launcher of the publishers and inbox workers: which databases
 *	  are served.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LAUNCHER_H
#define OUTBOX_LAUNCHER_H

#include "fmgr.h"
#include "postmaster/bgworker.h"

/* Settings (outbox.databases, outbox.max_workers, outbox.worker_time_slice) */
extern char *outbox_databases;
extern int	outbox_max_workers;
extern int	outbox_time_slice_s;

extern void outbox_launcher_init(void);
extern PGDLLEXPORT void outbox_launcher_main(Datum main_arg);
extern bool outbox_database_wanted(const char *name, bool istemplate,
								   bool allowconn, const char **why);

#endif							/* OUTBOX_LAUNCHER_H */
