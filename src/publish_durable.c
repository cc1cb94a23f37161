/*-------------------------------------------------------------------------
 *
 * publish_durable.c
 *	  Publish only durable commits: flush the WAL up to what a batch's
 *	  snapshot sees, and wait for outbox.standby_confirmations standbys.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "publish.h"

/* How often a batch looks at the standbys' flush positions while waiting. */
#define STANDBY_POLL_MS 10

int			outbox_standby_confirmations = 0;

/*
 * More confirmations than walsenders could ever give would stop publishing.
 * (-1 follows synchronous_standby_names: see sync_standbys_confirmed.)
 */
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

/* Define this module's settings (from _PG_init). */
void
publish_durable_init(void)
{
	DefineCustomIntVariable("outbox.standby_confirmations",
							"Standbys that must have flushed an event's commit before it is published.",
							"0 publishes what is durable on this server.  N > 0 waits until N walsenders "
							"report the commit flushed, so that a failover to such a standby cannot take back "
							"a published event; with fewer standbys connected, publishing waits.  -1 waits "
							"for the standbys synchronous_standby_names requires (none while it is empty), "
							"as a synchronous commit would.",
							&outbox_standby_confirmations,
							0, -1, 1024,
							PGC_SIGHUP,
							0,
							check_standby_confirmations, NULL, NULL);
}

/*
 * outbox.standby_confirmations = -1: have the synchronous standbys that
 * synchronous_standby_names requires (its number, FIRST or ANY) flushed up
 * to upto?  The position synchronous commits are released at says so;
 * with the setting empty (as Patroni leaves it when no synchronous
 * standby is left) nothing is waited for, as a synchronous commit would
 * not wait either.  (Our own copy of the setting, reloaded on SIGHUP.)
 */
static bool
sync_standbys_confirmed(XLogRecPtr upto)
{
	XLogRecPtr	released;

	if (SyncRepStandbyNames == NULL || SyncRepStandbyNames[0] == '\0')
		return true;
	LWLockAcquire(SyncRepLock, LW_SHARED);
	released = WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH];
	LWLockRelease(SyncRepLock);
	return released >= upto;
}

/* Have outbox.standby_confirmations standbys flushed up to upto? */
static bool
standbys_confirmed(XLogRecPtr upto)
{
	int			confirmed = 0;

	if (outbox_standby_confirmations < 0)
		return sync_standbys_confirmed(upto);
	for (int i = 0; i < max_wal_senders && confirmed < outbox_standby_confirmations; i++)
	{
		WalSnd	   *walsnd = &WalSndCtl->walsnds[i];
		pid_t		pid;
		XLogRecPtr	flush;

		SpinLockAcquire(&walsnd->mutex);
		pid = walsnd->pid;
		flush = walsnd->flush;
		SpinLockRelease(&walsnd->mutex);
		if (pid != 0 && flush != InvalidXLogRecPtr && flush >= upto)
			confirmed++;
	}
	return confirmed >= outbox_standby_confirmations;
}

/*
 * Wait until the standbys outbox.standby_confirmations asks for report WAL
 * flushed up to upto, so that a failover cannot take back what is about to
 * be published.  Polls: walsenders do not wake us.
 */
static void
wait_for_standbys(XLogRecPtr upto)
{
	bool		waited = false;

	while (outbox_standby_confirmations != 0 && !standbys_confirmed(upto))
	{
		if (!waited)
		{
			publish_set_state("waiting for standbys");
			waited = true;
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 STANDBY_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		/* A stopping worker waits for acknowledgements, not for standbys. */
		if (publish_stop_requested())
			ereport(ERROR,
					(errcode(ERRCODE_ADMIN_SHUTDOWN),
					 errmsg("outbox publisher stopping while waiting for standbys"),
					 errdetail("The events read are published after the restart.")));
		/* Lets an operator lower the setting to get publishing going. */
		publish_process_reload();
	}
}

/*
 * The end of the WAL inserted so far, as a position XLogFlush() accepts.
 * GetXLogInsertRecPtr() gives where the next record will start: right after
 * a page header when the last record ended on a page boundary, a position
 * not yet written, so that flushing up to it fails ("flush request not
 * satisfied") until someone else writes WAL.  The header has no record
 * bytes, so the page start covers every commit before it.
 */
XLogRecPtr
publish_wal_insert_end(void)
{
	return outbox_xlog_insert_end();
}

/*
 * Publish only durable commits.  Everything the batch's snapshot sees was
 * committed before upto (a commit record is inserted before the transaction
 * becomes visible), but with synchronous_commit = off it may not be on disk
 * yet: a crash would take back an event Kafka already has, and its version
 * would go to another event.  Flush up to flush_upto (what the batch's
 * commits need, at most upto: publish_read_flush_upto; a no-op when the WAL
 * writer or the emitters got there first), then wait for the standbys if
 * configured, up to upto (a commit flushed here may not be there yet).
 */
void
publish_make_durable(XLogRecPtr flush_upto, XLogRecPtr upto)
{
	/* Walsenders send only what is flushed here: all that the standbys must have. */
	XLogRecPtr	target = outbox_standby_confirmations != 0 ? upto : flush_upto;

	if (XLogRecPtrIsInvalid(target))
		return;
	publish_set_state("flushing WAL");
	XLogFlush(target);
	elog(DEBUG1, "outbox: WAL flushed at %ld ms",
		 TimestampDifferenceMilliseconds(GetCurrentStatementStartTimestamp(), GetCurrentTimestamp()));
	wait_for_standbys(upto);
}

