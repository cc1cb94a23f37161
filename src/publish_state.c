/*-------------------------------------------------------------------------
 *
 * publish_state.c
 *	  The publisher's own state that its steps share: which worker this is
 *	  (its index among its database's workers) and its slot in shared
 *	  memory, and what it shows it is doing.
 *
 * Set by the loop (worker.c) when the worker starts; read by every step
 * (publish_*.c, retention.c).  Kept apart from the loop so that the steps
 * call down into it, never up into worker.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "pgstat.h"

#include "compat.h"
#include "publish.h"

int			publish_worker_index;	/* among its database's workers */
OutboxWorkerSlot *publish_slot;

/* Show what this worker does, in outbox_workers() and pg_stat_activity. */
void
publish_set_state(const char *state)
{
	OutboxWorkerSlot *slot = publish_slot;

	strlcpy(slot->state, state, sizeof(slot->state));
	pgstat_report_activity(STATE_RUNNING, state);
}
