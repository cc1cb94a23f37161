/*-------------------------------------------------------------------------
 *
 * inbox_state.c
 *	  The inbox workers' settings (defined by inbox_worker_init and
 *	  inbox_consumer_settings_init) and the state of one worker that its
 *	  parts share: its index, its memory contexts, and the start and end
 *	  of a step's transaction.
 *
 * Set by the loop (inbox_worker.c); read by the consumers, the batch and
 * the statements (inbox_consumer.c, inbox_apply.c, inbox_store.c).  Kept
 * apart from the loop so that those call down into it, never up into
 * inbox_worker.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "shmem.h"
#include "util.h"
#include "inbox_worker.h"
#include "inbox.h"

int			inbox_workers = 1;
char	   *inbox_database = NULL;
char	   *inbox_brokers = NULL;
char	   *inbox_kafka_properties = NULL;
int			inbox_batch_size = 1000;
int			inbox_batch_time_ms = 1000;
int			inbox_max_attempts = 5;
int			inbox_retry_backoff_ms = 1000;
int			inbox_poison_policy = POISON_BLOCK;
int			inbox_gap_policy = INBOX_GAP_APPLY;

int			inbox_worker_index;
MemoryContext inbox_subs_context = NULL;	/* the subscriptions, their messages */
MemoryContext inbox_loop_context = NULL;	/* reset at each pass of the loop */

/*
 * Begin a transaction with SPI and a snapshot, for one step.  What the step
 * allocates goes to the loop's context, not SPI's (freed at SPI_finish).
 */
void
inbox_begin_step(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	MemoryContextSwitchTo(inbox_loop_context);
}

/* Commit the step; back in the loop's context (commit leaves us in Top). */
void
inbox_end_step(void)
{
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	MemoryContextSwitchTo(inbox_loop_context);
}
