/*-------------------------------------------------------------------------
 *
 * shmem.h
 *	  The extension's shared memory (shmem.c): one struct, OutboxShared,
 *	  its per-database entries and per-worker slots, and the look-ups and
 *	  signals every part uses on it.  The bottom of the module graph, with
 *	  util.c: shmem.c calls no other module of the extension.  (The inbox
 *	  workers' own state is the inbox's shared memory, inbox_worker.c.)
 *
 * Locking rules.  OutboxShared is created by outbox_shmem_startup() under
 * AddinShmemInitLock and has no lock of its own afterwards: each field has
 * one writer, or is an atomic (pg_atomic_*), and readers accept a value
 * that is a moment old.
 *
 *	- databases[]: entries are assigned (dboid set) and freed only by the
 *	  launcher; held_until by the session running DROP/ALTER DATABASE.
 *	  (The inbox workers' state per entry is the inbox's own shared
 *	  memory: inbox_worker.c.)
 *	  Backends only look entries up (outbox_database_entry, which checks
 *	  the cached entry's dboid at every call).
 *	- databases[].workers[]: each OutboxWorkerSlot is written by its worker;
 *	  yield by the launcher; commits_unread and read_scheduled are atomics
 *	  that committing emitters also touch (outbox_xact_callback), ordered by
 *	  the barriers documented at the fields.
 *	- databases[].stats: atomics only (stats.c), initialized again by the
 *	  launcher when it takes up a database.
 *	- probe_generation, databases_waiting, async_emits_committing,
 *	  async_emit_lsn, inject_fatal_error: atomics.
 *	- launcher_latch: written by the launcher only (set at start, cleared
 *	  at exit).
 *
 * Heavyweight locks are advisory tags in key spaces of our own (util.h).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SHMEM_H
#define OUTBOX_SHMEM_H

#include "postgres.h"

#include "port/atomics.h"
#include "storage/latch.h"

#include "stats.h"

#define OUTBOX_MAX_WORKERS 16

/* Databases the launcher can keep track of at once (served or probed). */
#define OUTBOX_MAX_DATABASES 64

/*
 * The publisher locks buckets of aggregates, not single aggregates, so that
 * a batch of thousands of aggregates takes at most this many locks from the
 * shared lock table.  Workers split the buckets between them, so they never
 * contend; the lock guards against everything else (operator functions,
 * a worker left over from a configuration change).
 */
#define OUTBOX_PUBLISH_BUCKETS 1024

/*
 * The bucket of an aggregate whose id hashes (hashtext(), i.e. hash_bytes()
 * of a deterministic collation) to h: as the worker's SQL splits them.
 */
#define OUTBOX_PUBLISH_BUCKET(h) (((uint32) (h) & 0x7fffffff) % OUTBOX_PUBLISH_BUCKETS)

/* Longest problem description kept for the status views. */
#define OUTBOX_PROBLEM_LEN 256

/* OutboxWorkerSlot.read_scheduled: which commits wake the worker. */
#define OUTBOX_READ_NOT_SCHEDULED	0	/* every commit */
#define OUTBOX_READ_SCHEDULED		1	/* the outbox.read_commits-th */
#define OUTBOX_READ_HELD			2	/* none (held, or paused) */

/* Per-worker state published in shared memory for the status views. */
typedef struct OutboxWorkerSlot
{
	pid_t		pid;
	Latch	   *latch;			/* set on commit of an emitting transaction */
	/*
	 * OUTBOX_READ_SCHEDULED while the worker is sure to read soon (it waits
	 * out outbox.read_interval): only the outbox.read_commits-th commit
	 * sets its latch.  OUTBOX_READ_HELD while it holds reading for its
	 * newest flight's reports, or publishing is paused as a whole: no
	 * commit does, as none could end the hold (outbox_resume() wakes it
	 * whatever this says).
	 * Cleared (OUTBOX_READ_NOT_SCHEDULED), with a full barrier, before the
	 * read takes its snapshot.
	 */
	pg_atomic_uint32 read_scheduled;
	/*
	 * Emitting commits since the worker's last read began (each commit adds
	 * one; the read's start resets it, before its snapshot), and how many
	 * of them wake a worker that waits out outbox.read_interval
	 * (outbox.read_commits, as the worker last set it; 0: any).
	 */
	pg_atomic_uint32 commits_unread;
	volatile uint32 read_commits;
	/*
	 * The extension (OID) in whose publisher_horizon this worker's row was
	 * committed, 0 before: the others leave its share of the buckets to it
	 * only from then on, so no event is skipped by all (publish_stream.c).
	 */
	pg_atomic_uint32 reading_extension;
	/*
	 * The workers (a bit per index) whose shares it reads by, once it has
	 * read again from the oldest horizon for them; 0 before.  A worker
	 * stores its horizon only while every peer reads by the same ones.
	 */
	pg_atomic_uint32 shares_view;
	/*
	 * The publish buckets (a bit each) of the aggregates this worker has in
	 * flight or acknowledged but not settled: a worker that takes such a
	 * bucket over (the shares changed) leaves it until the bit clears, so a
	 * hand-over does not send again what the old owner is settling.
	 */
	pg_atomic_uint32 busy_buckets[OUTBOX_PUBLISH_BUCKETS / 32];
	TimestampTz last_batch_at;
	char		state[64];
	/* What stops or hinders publishing (empty: nothing), and since when. */
	char		problem[OUTBOX_PROBLEM_LEN];
	TimestampTz problem_since;
	/* Failed connection attempts in a row (wrong database or role). */
	int			connect_failures;
	/* Set by the launcher or a DROP/ALTER DATABASE: exit between batches. */
	volatile bool yield;
} OutboxWorkerSlot;

/* What the launcher knows of a database's extension. */
typedef enum OutboxDatabaseState
{
	ODB_UNKNOWN,				/* not yet probed */
	ODB_ABSENT,					/* a worker found no extension */
	ODB_SERVED					/* a worker found the extension */
} OutboxDatabaseState;

/*
 * Per-database state: its workers' slots and its counters.  The launcher
 * assigns entries (dboid != InvalidOid) to the databases it serves or
 * probes and frees them when a database leaves; backends only look them up.
 */
typedef struct OutboxDatabase
{
	Oid			dboid;
	NameData	name;			/* what the workers connect to */
	volatile OutboxDatabaseState state;
	/* A DROP/ALTER DATABASE wants no worker here until this time. */
	volatile TimestampTz held_until;
	/* Waiting for a turn under outbox.max_workers since (0: not waiting). */
	volatile TimestampTz waiting_since;
	/* When its current or last turn started, while databases take turns. */
	volatile TimestampTz turn_started;
	OutboxStats stats;
	OutboxWorkerSlot workers[OUTBOX_MAX_WORKERS];
} OutboxDatabase;

typedef struct OutboxShared
{
	/* Test hook: raise a fatal producer error in the next batch. */
	pg_atomic_uint32 inject_fatal_error;
	/* Bumped by CREATE EXTENSION outbox and inbox_subscribe(): look again. */
	pg_atomic_uint32 probe_generation;
	/* Databases waiting for a turn: idle workers make way for them. */
	pg_atomic_uint32 databases_waiting;
	/*
	 * Emitting transactions that commit asynchronously (synchronous_commit
	 * = off): how many are between their pre-commit and the end of their
	 * commit, and the highest end of their commit records.  How far a
	 * publisher's read must flush the WAL (publish_delta.c).
	 */
	pg_atomic_uint32 async_emits_committing;
	pg_atomic_uint64 async_emit_lsn;
	Latch	   *launcher_latch;
	OutboxDatabase databases[OUTBOX_MAX_DATABASES];
} OutboxShared;

extern OutboxShared *outbox_shared;

/* shmem.c */
extern void outbox_shmem_request(void);
extern bool outbox_shmem_startup(void);
extern void outbox_worker_slots_init(OutboxWorkerSlot *slots);
extern OutboxDatabase *outbox_database_entry(Oid dboid);
extern OutboxStats *outbox_database_stats(Oid dboid);
extern void outbox_wake_launcher(void);
extern void outbox_launcher_probe_at_commit(void);
extern void outbox_note_emit(void);
extern void outbox_note_control(void);
extern void outbox_wake_workers(void);

#endif							/* OUTBOX_SHMEM_H */
