/*-------------------------------------------------------------------------
 *
 * util.h
 *	  Small helpers every part uses (util.c): the settings read across
 *	  modules, advisory lock tags, kept plans, column defaults, background
 *	  worker entries.  Bottom of the module graph, with shmem.h and stats.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_UTIL_H
#define OUTBOX_UTIL_H

#include "postgres.h"

#include "fmgr.h"
#include "postmaster/bgworker.h"
#include "storage/lock.h"
#include "utils/hsearch.h"

/*
 * Advisory lock key spaces of our own: the fourth field of an advisory
 * LOCKTAG, which the SQL-level advisory lock functions set to 1 or 2 only,
 * so these can never collide with an application's advisory locks.
 * Emitters and the publisher lock the same aggregate in different spaces,
 * so a publisher never makes an emitter wait.
 */
#define OUTBOX_LOCKSPACE_EMIT		0x4f45	/* "OE" */
#define OUTBOX_LOCKSPACE_PUBLISH	0x4f50	/* "OP" */

/* Settings of the preloaded publisher (util.c) */
extern char *outbox_database;
extern char *outbox_role;
extern int	outbox_workers;
extern bool outbox_enable_test_hooks;

/* What happens to an event that keeps failing (publisher and inbox). */
typedef enum PoisonPolicy
{
	POISON_BLOCK,
	POISON_DEAD_LETTER,
	POISON_SKIP
} PoisonPolicy;

/* A column an insert leaves to its default, and that default (planned). */
typedef struct OutboxColumnDefault
{
	AttrNumber	attnum;
	struct Expr *expr;
} OutboxColumnDefault;

/* util.c */
extern void outbox_postmaster_settings_init(void);
extern struct EState *outbox_simple_estate(struct RelationData *rel, LOCKMODE mode);
extern int	outbox_column_defaults(struct RelationData *rel, const AttrNumber *set, int nset,
								   OutboxColumnDefault *defaults);
extern void outbox_aggregate_locktag(LOCKTAG *tag, const char *aggregate_id,
									 int len, uint16 space);
extern void outbox_publish_locktag(LOCKTAG *tag, const char *aggregate_id);
extern struct _SPI_plan *outbox_keep_plan(const char *query, int nargs,
										  Oid *argtypes);
extern struct _SPI_plan *outbox_keep_plan_options(const char *query, int nargs,
												  Oid *argtypes, int cursor_options);
extern void outbox_bgworker_init(BackgroundWorker *worker, const char *function,
								 const char *type, int restart_time);
extern void outbox_test_start_delay(void);
extern void outbox_reload_at_start(void);

extern Datum outbox_call_catching(PGFunction fn, Datum arg, bool *failed);

extern HTAB *outbox_aggregate_table(const char *name, Size entrysize, long nelem,
									 MemoryContext cxt);

#endif							/* OUTBOX_UTIL_H */
