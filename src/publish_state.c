/*-------------------------------------------------------------------------
 *
 * publish_state.c
 *	  The publisher's own state that its steps share: which worker this is
 *	  (its database's entry, its index among the database's workers and its
 *	  slot in shared memory), what it shows it is doing, whether a reload
 *	  was processed, its graceful stop, the flight window (outbox.batch_events,
 *	  outbox.batch_bytes) and whether the database lists new aggregates.
 *
 * Set by the loop (worker.c) when the worker starts, and by this module's
 * SIGTERM handler; read by every step (publish_*.c, retention.c).  Kept
 * apart from the loop so that the steps call down into it, never up into
 * worker.c.
 *
 * The graceful stop: the first SIGTERM asks for it (publish_sigterm); the
 * loop then reads nothing more and drains, and the waits inside a step
 * (the producer's, the standbys') bound it by outbox.shutdown_timeout
 * (publish_stop_bound) or give up.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "publish.h"

OutboxDatabase *publish_database;	/* its entry, from the launcher */
int			publish_worker_index;	/* among its database's workers */
OutboxWorkerSlot *publish_slot;

/* A reload was processed since the producer settings were last compared. */
bool		publish_reloaded = false;

/*
 * The flight window: what one publisher has read and not yet settled (the
 * read fills it, a flight's wait for its reports is judged against it).
 */
int			outbox_batch_events = 20000;
int			outbox_batch_bytes = 16 * 1024 * 1024;

/*
 * The database lists new aggregates (a failure recorded, or new plans): the
 * next read looks at them at once.  Set by the steps, consumed by the read.
 */
bool		publish_listed_changed = true;

/* Longest a SIGTERM waits for acknowledgements to settle before dying. */
static int	outbox_shutdown_timeout_ms = 5000;

/*
 * A SIGTERM asked the worker to stop, and when; whether it drains (its
 * timeout set).
 */
static volatile sig_atomic_t stop_requested = false;
static volatile TimestampTz stop_requested_at = 0;
static bool stop_draining = false;
static TimeoutId stop_timeout = MAX_TIMEOUTS;

/* Define this module's settings (from _PG_init, through the publisher's). */
void
publish_state_init(void)
{
	DefineCustomIntVariable("outbox.shutdown_timeout",
							"Longest a stopping publisher waits for Kafka to acknowledge what it sent.",
							"On SIGTERM (a fast shutdown, a restart, pg_terminate_backend) a publisher reads "
							"nothing more and settles what Kafka acknowledges of its messages out, so that "
							"they are not sent again after the restart; after this long it exits anyway. "
							"0 exits at once.",
							&outbox_shutdown_timeout_ms,
							5000, 0, 600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.batch_events",
							"Most events one publisher has read and not yet settled.",
							"Bounds the events in flight (produced, awaiting acknowledgement or marking); one batch reads at most half of it.",
							&outbox_batch_events,
							20000, 1, 1000000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.batch_bytes",
							"Most bytes of events one publisher has read and not yet settled.",
							"Counts payloads, headers and ids; a batch holds at least one event, however large.",
							&outbox_batch_bytes,
							16 * 1024 * 1024, 1024, MaxAllocSize / 2,
							PGC_SIGHUP,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}

/* Show what this worker does, in outbox_workers() and pg_stat_activity. */
void
publish_set_state(const char *state)
{
	OutboxWorkerSlot *slot = publish_slot;

	strlcpy(slot->state, state, sizeof(slot->state));
	pgstat_report_activity(STATE_RUNNING, state);
}

/* Process a pending reload; the loop compares the producer settings next. */
void
publish_process_reload(void)
{
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
		publish_reloaded = true;
	}
}

/*
 * SIGTERM: the first asks for a graceful stop (publish_stop_bound() and the
 * loop's drain; outbox.shutdown_timeout from now bounds it); a second one,
 * or any with outbox.shutdown_timeout = 0, dies at once.  But not a second
 * one from the postmaster: it sends each signal to the process and to its
 * process group, which arrive as two when the handler ran between them (a
 * fast shutdown then died with its flights out, 1 time in 10).  (SIGQUIT,
 * an immediate shutdown, keeps the default handler: it exits at once.)
 */
static void
publish_sigterm(int signo, siginfo_t *info, void *context)
{
	int			save_errno = errno;

	if (stop_requested && info != NULL && info->si_pid == PostmasterPid)
		;						/* the process group's copy */
	else if (stop_requested || outbox_shutdown_timeout_ms <= 0)
		die(SIGTERM);
	else
	{
		stop_requested_at = GetCurrentTimestamp();
		stop_requested = true;
		SetLatch(MyLatch);
	}
	errno = save_errno;
}

/* The graceful stop's time is up: die wherever the worker is. */
static void
stop_timeout_handler(void)
{
	die(SIGTERM);
}

/*
 * From now on a SIGTERM first settles what is acknowledged: handle it with
 * publish_sigterm(), which needs to know the sender, and register the
 * timeout that bounds the stop.
 */
void
publish_stop_setup(void)
{
	struct sigaction act;

	stop_timeout = RegisterTimeout(USER_TIMEOUT, stop_timeout_handler);
	memset(&act, 0, sizeof(act));
	act.sa_sigaction = publish_sigterm;
	sigemptyset(&act.sa_mask);
	act.sa_flags = SA_RESTART | SA_SIGINFO;
	if (sigaction(SIGTERM, &act, NULL) < 0)
		elog(ERROR, "could not set the SIGTERM handler: %m");
}

/* Has a SIGTERM asked the worker to stop (it reads and waits for nothing more)? */
bool
publish_stop_requested(void)
{
	return stop_requested;
}

/*
 * If a stop was asked for: bound it, once, by outbox.shutdown_timeout from
 * the signal (a timeout that dies wherever the worker is); holding (flights
 * out or acknowledgements unsettled) says so in the log.  Called between
 * steps and from the waits inside one (not from the signal handler: the
 * timeout machinery is not async-signal-safe).
 */
void
publish_stop_bound(bool holding)
{
	long		remaining;

	if (!stop_requested || stop_draining)
		return;
	stop_draining = true;
	remaining = outbox_shutdown_timeout_ms -
		TimestampDifferenceMilliseconds(stop_requested_at, GetCurrentTimestamp());
	if (remaining <= 0)
	{
		die(SIGTERM);
		CHECK_FOR_INTERRUPTS();
	}
	enable_timeout_after(stop_timeout, (int) remaining);
	if (holding)
		ereport(LOG,
				(errmsg("outbox publisher %d stopping: settling what Kafka acknowledges first (at most %d ms)",
						publish_worker_index, outbox_shutdown_timeout_ms)));
}
