/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  Module load (outbox.c): shared memory, advisory lock tags, the
 *	  settings read at server start, and a few helpers every part uses.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include "postgres.h"

#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lock.h"

#include "stats.h"

#define OUTBOX_MAX_WORKERS 16

/*
 * Advisory lock key spaces of our own: the fourth field of an advisory
 * LOCKTAG, which the SQL-level advisory lock functions set to 1 or 2 only,
 * so these can never collide with an application's advisory locks.
 * Emitters and the publisher lock the same aggregate in different spaces,
 * so a publisher never makes an emitter wait.
 */
#define OUTBOX_LOCKSPACE_EMIT		0x4f45	/* "OE" */
#define OUTBOX_LOCKSPACE_PUBLISH	0x4f50	/* "OP" */

/*
 * The publisher locks buckets of aggregates, not single aggregates, so that
 * a batch of thousands of aggregates takes at most this many locks from the
 * shared lock table.  Workers split the buckets between them, so they never
 * contend; the lock guards against everything else (operator functions,
 * a worker left over from a configuration change).
 */
#define OUTBOX_PUBLISH_BUCKETS 1024

/* Longest problem description kept for the status views. */
#define OUTBOX_PROBLEM_LEN 256

/* Per-worker state published in shared memory for the status views. */
typedef struct OutboxWorkerSlot
{
	pid_t		pid;
	Latch	   *latch;			/* set on commit of an emitting transaction */
	TimestampTz last_batch_at;
	char		state[64];
	/* What stops or hinders publishing (empty: nothing), and since when. */
	char		problem[OUTBOX_PROBLEM_LEN];
	TimestampTz problem_since;
	/* Failed connection attempts in a row (wrong database or role). */
	int			connect_failures;
} OutboxWorkerSlot;

typedef struct OutboxShared
{
	/* Bumped by each commit that emitted: lets a worker count wake-ups. */
	pg_atomic_uint64 commits_emitted;
	/* Test hook: raise a fatal producer error in the next batch. */
	pg_atomic_uint32 inject_fatal_error;
	OutboxStats stats;
	OutboxWorkerSlot workers[OUTBOX_MAX_WORKERS];
} OutboxShared;

extern OutboxShared *outbox_shared;

/* Settings read at server start (outbox.c) */
extern char *outbox_database;
extern char *outbox_role;
extern int	outbox_workers;
extern bool outbox_enable_test_hooks;

/* retention.c: the inbox workers run the inbox's where no publisher does */
extern int	outbox_inbox_retention_s;
extern int	outbox_retention_batch;

/* What happens to an event that keeps failing (publisher and inbox). */
typedef enum PoisonPolicy
{
	POISON_BLOCK,
	POISON_DEAD_LETTER,
	POISON_SKIP
} PoisonPolicy;

/* outbox.c */
extern void outbox_note_emit(void);
extern void outbox_wake_workers(void);
extern void outbox_aggregate_locktag(LOCKTAG *tag, const char *aggregate_id,
									 int len, uint16 space);
extern void outbox_publish_locktag(LOCKTAG *tag, const char *aggregate_id);
extern struct _SPI_plan *outbox_keep_plan(const char *query, int nargs,
										  Oid *argtypes);

#endif							/* OUTBOX_H */
