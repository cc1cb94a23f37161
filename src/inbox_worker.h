/*-------------------------------------------------------------------------
 *
 * inbox_worker.h
 *	  The consumer half: inbox workers applying Kafka events to PostgreSQL.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_INBOX_WORKER_H
#define OUTBOX_INBOX_WORKER_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "postmaster/bgworker.h"

/*
 * Inbox workers per database: the maximum of outbox.inbox_workers, and the
 * slots the inbox's shared memory and the launcher keep for them.
 */
#define INBOX_MAX_WORKERS 16

/* What a partition does with a message above the aggregate's next version. */
typedef enum InboxGapPolicy
{
	INBOX_GAP_APPLY,
	INBOX_GAP_BLOCK
} InboxGapPolicy;

/* Whether a role may have the workers run a handler (inbox_handler_problem). */
typedef enum InboxHandlerProblem
{
	HANDLER_OK,
	HANDLER_MISSING,
	HANDLER_NOT_OWNER,
	HANDLER_NO_EXECUTE,
	HANDLER_NO_SCHEMA
} InboxHandlerProblem;

/* Settings (outbox.inbox_*), in inbox_state.c */
extern int	inbox_workers;
extern char *inbox_database;
extern char *inbox_brokers;
extern char *inbox_kafka_properties;
extern int	inbox_batch_size;
extern int	inbox_batch_time_ms;
extern int	inbox_max_attempts;
extern int	inbox_retry_backoff_ms;
extern int	inbox_poison_policy;
extern int	inbox_gap_policy;
extern char *inbox_allowed_topics;

/* inbox_worker.c */
extern void inbox_worker_init(void);
extern PGDLLEXPORT void inbox_worker_main(Datum main_arg);

/*
 * inbox_worker.c, for the launcher: the inbox's shared memory says where
 * inbox workers run, per publisher database entry e (an index of
 * outbox_shared->databases) or INBOX_ONE_DATABASE, the one inbox database
 * (outbox.inbox_database, else outbox.database) when one is set.
 */
#define INBOX_ONE_DATABASE (-1)
extern void inbox_shmem_request(void);
extern void inbox_shmem_startup(void);
extern const char *inbox_target_database(void);
extern void inbox_worker_describe(BackgroundWorker *worker, int e, int i,
								  const char *dbname);
extern pid_t inbox_worker_pid(int e, int i);
extern bool inbox_database_idle(int e, TimestampTz now);
extern void inbox_database_reset(int e);
extern char *inbox_consumer_properties_check(const char *properties);

/* retention.c: the inbox's retention, run by publisher 0 or an inbox worker */
extern int	outbox_retention_s;
extern int	outbox_inbox_retention_s;
extern int	outbox_retention_batch;
extern struct _SPI_plan *inbox_retention_prepare(const char *schema);
extern uint64 inbox_retention_delete(struct _SPI_plan *plan);

/* inbox_sql.c */
extern void inbox_sql_init(void);
extern const char *inbox_topic_problem(const char *topic);
extern InboxHandlerProblem inbox_handler_problem(Oid handler, Oid role);
extern const char *inbox_handler_problem_text(InboxHandlerProblem problem);
extern Oid	inbox_resolve_handler(const char *signature);

#endif							/* OUTBOX_INBOX_WORKER_H */
