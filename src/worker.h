/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The publisher background worker's entry points.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_WORKER_H
#define OUTBOX_WORKER_H

#include "fmgr.h"

extern PGDLLEXPORT void outbox_worker_main(Datum main_arg);
extern void outbox_publisher_init(void);

#endif							/* OUTBOX_WORKER_H */
