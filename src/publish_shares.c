/*-------------------------------------------------------------------------
 *
 * publish_shares.c
 *	  The publish buckets shared out between a database's workers: which
 *	  workers read, this worker's share, and the buckets the others have
 *	  busy.
 *
 * The loop (worker.c) computes the shares before each read; the steps ask
 * whether a bucket is busy elsewhere (publish_produce.c) and whether the
 * shares agree (publish_stream.c, before storing a horizon).
 *
 * A bucket that moves to another worker (the shares changed) is left by its
 * new owner while the old one has aggregates of it in flight or unsettled
 * (busy_buckets in the slot): the new owner reads them once they are
 * settled, from their new last published version, instead of sending again
 * what the old owner has out.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "port/pg_bitutils.h"

#include "publish.h"

/* The buckets the other workers had busy when the current read began. */
static uint32 peer_buckets_at_read[OUTBOX_PUBLISH_BUCKETS / 32];

/*
 * The workers (a bit per index) alive now that read the stream of extension
 * ext (their horizon row is committed there), this one included.  A
 * configured worker that never started (max_worker_processes too low), is
 * dead until its restart, or has not committed its horizon row yet is not
 * among them, so no bucket waits for it and none is skipped by all.
 */
uint32
publish_reading_workers(Oid ext)
{
	uint32		members = 0;

	for (int i = 0; i < outbox_workers; i++)
	{
		OutboxWorkerSlot *peer = &publish_database->workers[i];
		pid_t		pid = peer->pid;

		if (i == publish_worker_index ||
			(pid != 0 && pg_atomic_read_u32(&peer->reading_extension) == ext &&
			 (kill(pid, 0) == 0 || errno != ESRCH)))
			members |= (uint32) 1 << i;
	}
	return members;
}

/*
 * This worker's share of the publish buckets among members: its rank
 * among them, and their number.  While membership changes, two workers may
 * both fetch a bucket for a moment, and its try-lock decides.
 */
void
publish_bucket_share(uint32 members, int *nshares, int *share)
{
	*share = pg_popcount32(members & (((uint32) 1 << publish_worker_index) - 1));
	*nshares = pg_popcount32(members);
}

/*
 * Note the buckets the other workers have busy, before a read's snapshot
 * is taken: a bucket one of them settles after that is busy for this read
 * too, whose snapshot may not see the settling (and would send again what
 * the settling recorded).
 */
void
publish_note_peer_buckets(void)
{
	memset(peer_buckets_at_read, 0, sizeof(peer_buckets_at_read));
	for (int i = 0; i < outbox_workers; i++)
	{
		OutboxWorkerSlot *peer = &publish_database->workers[i];

		if (i == publish_worker_index || peer->pid == 0)
			continue;
		for (int b = 0; b < OUTBOX_PUBLISH_BUCKETS / 32; b++)
			peer_buckets_at_read[b] |= pg_atomic_read_u32(&peer->busy_buckets[b]);
	}
	pg_memory_barrier();
}

/*
 * Does another running worker have aggregates of this bucket in flight or
 * acknowledged but unsettled, or had it when this read began?  (Its former
 * owner, until the shares agree.)
 */
bool
publish_bucket_busy_elsewhere(int bucket)
{
	uint32		bit = (uint32) 1 << (bucket % 32);

	if ((peer_buckets_at_read[bucket / 32] & bit) != 0)
		return true;
	for (int i = 0; i < outbox_workers; i++)
	{
		OutboxWorkerSlot *peer = &publish_database->workers[i];

		if (i != publish_worker_index && peer->pid != 0 &&
			(pg_atomic_read_u32(&peer->busy_buckets[bucket / 32]) & bit) != 0)
			return true;
	}
	return false;
}

/*
 * May this worker store its horizon?  Only while every worker reading
 * reads by the same shares, each having read again from the oldest horizon
 * for them: a bucket moved from one to another is then covered by its new
 * owner from below the old owner's stored horizon, which the old owner,
 * having skipped the bucket since, must not move past before that (with
 * three or more workers, buckets move between workers that stay).
 */
bool
publish_shares_agreed(void)
{
	uint32		view = pg_atomic_read_u32(&publish_slot->shares_view);
	Oid			ext = pg_atomic_read_u32(&publish_slot->reading_extension);

	if (view == 0 || !OidIsValid(ext) || publish_reading_workers(ext) != view)
		return false;
	for (int i = 0; i < outbox_workers; i++)
		if (i != publish_worker_index && (view & ((uint32) 1 << i)) != 0 &&
			pg_atomic_read_u32(&publish_database->workers[i].shares_view) != view)
			return false;
	return true;
}
