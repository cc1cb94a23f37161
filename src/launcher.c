/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The launcher: one background worker, connected to no database, that
 *	  runs the publishers and the inbox workers of every database with the
 *	  extension.
 *
 * Modelled on TimescaleDB's launcher, its loop on pg_cron's and
 * worker_spi's: a pass of named steps (follow the workers, scan
 * pg_database once, release the databases that left, schedule the
 * publishers, schedule the inbox workers) in a memory context reset each
 * time, then a wait on the latch.  Every worker it starts has a slot with
 * an explicit state (idle, running, back-off) and one restart back-off
 * rule for publishers and inbox workers alike (LauncherSlot).
 *
 * Connected to no database, the launcher can read pg_database but not a
 * database's pg_extension, so it learns whether a database has the
 * extension from the database's first publisher worker: it is started as
 * a probe, exits at once (status 0, never restarted) if the extension is
 * absent, and otherwise keeps publishing, upon which the launcher starts
 * the database's other workers.  An absent extension is probed again a
 * minute later, or at once when CREATE EXTENSION outbox commits anywhere;
 * a new database at once.
 *
 * Every LAUNCHER_NAP_MS (or when a worker starts or exits, or a commit
 * asks) the launcher scans pg_database, takes up the databases
 * outbox.databases wants, and frees those that left.  outbox.max_workers
 * caps the publishers of the whole cluster: when the databases ask for
 * more, they take turns of outbox.worker_time_slice, oldest turn first; a
 * worker whose turn is over exits between two batches, and an idle one
 * makes way as soon as another database waits.
 *
 * Inbox workers (outbox.inbox_workers) run in the one inbox database once
 * it exists (outbox.inbox_database, else outbox.database), or else in
 * every database the publishers serve, except where they found nothing
 * subscribed lately.  What the launcher needs of them (how one is started,
 * where they run: the inbox's own shared memory) is the inbox's, through
 * inbox_worker.h.
 *
 * DROP DATABASE, ALTER DATABASE RENAME / SET TABLESPACE and CREATE
 * DATABASE ... TEMPLATE refuse to run while other sessions are connected
 * to the database (PostgreSQL waits 5 s, then fails with "database is
 * being accessed by other users"), and background workers count.  So a
 * utility hook, in the session running such a command on a served
 * database it owns, holds the database (the launcher starts no worker
 * there), asks its workers to exit and, after a grace period, terminates
 * them and the database's inbox workers; the hold ends with the command.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "catalog/pg_tablespace.h"
#include "commands/tablespace.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "compat.h"
#include "inbox_worker.h"
#include "launcher.h"
#include "shmem.h"
#include "util.h"

/* How often the launcher looks at pg_database and its workers. */
#define LAUNCHER_NAP_MS 1000
/* A database without the extension is probed again after this long. */
#define PROBE_INTERVAL_MS (60 * 1000)
/* A worker that stopped is started again at most this often. */
#define RESTART_INTERVAL_MS 5000
/* DROP/ALTER DATABASE: how long workers get to exit between batches. */
#define HOLD_GRACE_MS 2000
/* ... and then, terminated, to be gone. */
#define HOLD_TERMINATE_MS 5000
/* A hold left behind by a session that died ends by itself. */
#define HOLD_MAX_MS (10 * 60 * 1000)

char	   *outbox_databases = NULL;
int			outbox_max_workers = 0;
int			outbox_time_slice_s = 10;

/*
 * A worker the launcher starts, publisher or inbox worker, and its state:
 * IDLE (may start), RUNNING (started, or found running when the launcher
 * itself started again), BACKOFF (stopped; may start at restart_at).  One
 * rule for all: a stopped worker starts again RESTART_INTERVAL_MS after its
 * stop at the soonest, unless it stopped reporting that it had nothing to
 * do (a probe that found no extension, an inbox worker that found nothing
 * subscribed): then what it reported says when (slot_reported).
 */
typedef enum LauncherSlotState
{
	SLOT_IDLE,
	SLOT_RUNNING,
	SLOT_BACKOFF
} LauncherSlotState;

typedef struct LauncherSlot
{
	LauncherSlotState state;
	BackgroundWorkerHandle *handle; /* NULL: not started by this launcher */
	TimestampTz restart_at;		/* BACKOFF: not before */
} LauncherSlot;

/* The launcher's own bookkeeping of an entry of outbox_shared->databases. */
typedef struct LauncherDatabase
{
	LauncherSlot publishers[OUTBOX_MAX_WORKERS];
	LauncherSlot inbox[INBOX_MAX_WORKERS];
	TimestampTz next_probe_at;
	TimestampTz turn_ended;		/* 0: never had a turn */
	uint32		probed_generation;	/* probe_generation when last started */
	int			running;		/* publishers alive */
	int			inbox_running;	/* inbox workers alive */
	bool		listed;			/* in pg_database and wanted, last scan */
	bool		yielding;		/* asked to make way */
} LauncherDatabase;

static LauncherDatabase launcher_dbs[OUTBOX_MAX_DATABASES];
static uint32 probe_generation;
static bool logged_full = false;

/* The one inbox database (NULL: per served database), its workers, whether it exists. */
static const char *inbox_one_name = NULL;
static LauncherSlot inbox_one[INBOX_MAX_WORKERS];
static bool inbox_one_exists = false;
static bool logged_inbox_missing = false;

static ProcessUtility_hook_type prev_ProcessUtility = NULL;

/* The database this session holds for a DROP/ALTER DATABASE, if any. */
static OutboxDatabase *held_database = NULL;


static void outbox_process_utility(OUTBOX_UTILITY_ARGS);

/* ---------- settings ---------- */

/* outbox.databases: '*' or a list of database names. */
static bool
check_databases(char **newval, void **extra, GucSource source)
{
	char	   *copy;
	List	   *names;
	bool		ok;

	if (strcmp(*newval, "*") == 0)
		return true;
	copy = pstrdup(*newval);
	ok = SplitIdentifierString(copy, ',', &names);
	if (ok && names == NIL)
	{
		GUC_check_errdetail("List the databases to serve, or '*' for all that have the extension.");
		ok = false;
	}
	else if (!ok)
		GUC_check_errdetail("List syntax is invalid.");
	list_free(names);
	pfree(copy);
	return ok;
}

/* More publishers than background worker processes could never start. */
static bool
check_max_workers(int *newval, void **extra, GucSource source)
{
	if (*newval >= max_worker_processes)
	{
		GUC_check_errdetail("It must be lower than max_worker_processes (%d): the launcher needs one too.",
							max_worker_processes);
		return false;
	}
	return true;
}

/*
 * Define the launcher's settings, register it, and hook utility commands
 * (after inbox_worker_init: outbox.inbox_workers is read here).
 */
void
outbox_launcher_init(void)
{
	BackgroundWorker worker;

	DefineCustomStringVariable("outbox.databases",
							   "Databases the publishers serve: '*' (all with the extension) or a list of names.",
							   "With '*', template databases and those that do not allow connections are left out; "
							   "a list serves exactly the databases named.  outbox.database, if set, overrides this.",
							   &outbox_databases,
							   "*",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   check_databases, NULL, NULL);
	DefineCustomIntVariable("outbox.max_workers",
							"Most publisher workers of all databases together (0: no cap but max_worker_processes).",
							"When the databases ask for more, they take turns of outbox.worker_time_slice.",
							&outbox_max_workers,
							0, 0, OUTBOX_MAX_DATABASES * OUTBOX_MAX_WORKERS,
							PGC_SIGHUP,
							0,
							check_max_workers, NULL, NULL);
	DefineCustomIntVariable("outbox.worker_time_slice",
							"How long a database's publishers keep their turn while other databases wait for one.",
							"Only matters when outbox.max_workers is lower than the workers the databases ask for.",
							&outbox_time_slice_s,
							10, 1, 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = outbox_process_utility;

	/* One launcher for the publishers and the inbox workers. */
	if (outbox_workers == 0 && inbox_workers == 0)
		return;
	outbox_bgworker_init(&worker, "outbox_launcher_main", "outbox launcher", 5);
	RegisterBackgroundWorker(&worker);
}

/*
 * Whether the settings want a database served; if not, *why says which
 * setting leaves it out.
 */
bool
outbox_database_wanted(const char *name, bool istemplate, bool allowconn,
					   const char **why)
{
	char	   *copy;
	List	   *names;
	ListCell   *lc;
	bool		found = false;

	if (why)
		*why = NULL;
	if (outbox_database != NULL && outbox_database[0] != '\0')
	{
		if (strcmp(name, outbox_database) == 0)
			return true;
		if (why)
			*why = psprintf("outbox.database is set to \"%s\": only that database is served", outbox_database);
		return false;
	}
	if (strcmp(outbox_databases, "*") == 0)
	{
		if (why)
			*why = istemplate ? "it is a template database, which outbox.databases = '*' leaves out"
				: "it does not allow connections, which outbox.databases = '*' leaves out";
		return !istemplate && allowconn;
	}
	copy = pstrdup(outbox_databases);
	if (SplitIdentifierString(copy, ',', &names))
	{
		foreach(lc, names)
		{
			if (strcmp((char *) lfirst(lc), name) == 0)
				found = true;
		}
	}
	list_free(names);
	pfree(copy);
	if (!found && why)
		*why = "outbox.databases does not list it";
	return found;
}

/* ---------- shared state ---------- */

/* Ask every worker of a database to exit between two batches. */
static void
request_yield(OutboxDatabase *db)
{
	for (int i = 0; i < OUTBOX_MAX_WORKERS; i++)
	{
		Latch	   *latch = db->workers[i].latch;

		db->workers[i].yield = true;
		if (latch != NULL)
			SetLatch(latch);
	}
}

/* ---------- DROP / ALTER DATABASE ---------- */

/* Is a process of this pid (0: none) alive? */
static bool
pid_alive(pid_t pid)
{
	return pid != 0 && (kill(pid, 0) == 0 || errno != ESRCH);
}

/* Is any worker of the database, publisher or inbox, alive? */
static bool
workers_alive(OutboxDatabase *db)
{
	int			e = db - outbox_shared->databases;

	for (int i = 0; i < OUTBOX_MAX_WORKERS; i++)
	{
		if (pid_alive(db->workers[i].pid))
			return true;
	}
	for (int i = 0; i < INBOX_MAX_WORKERS; i++)
	{
		if (pid_alive(inbox_worker_pid(e, i)))
			return true;
	}
	return false;
}

/* Wait up to ms for the database's workers to be gone. */
static bool
wait_workers_gone(OutboxDatabase *db, long ms)
{
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), ms);

	while (workers_alive(db))
	{
		if (GetCurrentTimestamp() >= until)
			return false;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 10, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	return true;
}

/*
 * Hold a database and stop its workers, for a command that needs it to
 * itself and is going to run (database_needed_alone() says).  The hold is in held_database as soon as it is taken, so that an error
 * while waiting still ends it.
 */
static void
hold_database(const char *name)
{
	Oid			dboid = get_database_oid(name, true);
	OutboxDatabase *db = outbox_database_entry(dboid);

	if (db == NULL)
		return;
	db->held_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), HOLD_MAX_MS);
	held_database = db;
	request_yield(db);
	if (!wait_workers_gone(db, HOLD_GRACE_MS))
	{
		/* Inbox workers too: their stored offsets make any stop safe. */
		for (int i = 0; i < OUTBOX_MAX_WORKERS; i++)
		{
			pid_t		pid = db->workers[i].pid;

			if (pid != 0)
				(void) kill(pid, SIGTERM);
		}
		for (int i = 0; i < INBOX_MAX_WORKERS; i++)
		{
			pid_t		pid = inbox_worker_pid(db - outbox_shared->databases, i);

			if (pid != 0)
				(void) kill(pid, SIGTERM);
		}
		(void) wait_workers_gone(db, HOLD_TERMINATE_MS);
	}
}

/* The value of a command's option, or NULL. */
static const char *
option_string(List *options, const char *option)
{
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *def = lfirst_node(DefElem, lc);

		if (strcmp(def->defname, option) == 0 && def->arg != NULL)
			return defGetString(def);
	}
	return NULL;
}

/* The database a utility command would need to itself, or NULL. */
static const char *
database_named(Node *stmt)
{
	switch (nodeTag(stmt))
	{
		case T_DropdbStmt:
			return ((DropdbStmt *) stmt)->dbname;
		case T_RenameStmt:
			if (((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
				return ((RenameStmt *) stmt)->subname;
			return NULL;
		case T_AlterDatabaseStmt:
			if (option_string(((AlterDatabaseStmt *) stmt)->options, "tablespace") != NULL)
				return ((AlterDatabaseStmt *) stmt)->dbname;
			return NULL;
		case T_CreatedbStmt:
			return option_string(((CreatedbStmt *) stmt)->options, "template");
		default:
			return NULL;
	}
}

/* Whether the current role may create databases (dbcommands.c's rule). */
static bool
may_create_databases(void)
{
	HeapTuple	tup;
	bool		createdb;

	if (superuser())
		return true;
	tup = SearchSysCache1(AUTHOID, ObjectIdGetDatum(GetUserId()));
	if (!HeapTupleIsValid(tup))
		return false;
	createdb = ((Form_pg_authid) GETSTRUCT(tup))->rolcreatedb;
	ReleaseSysCache(tup);
	return createdb;
}

/* The tablespace database dboid is in. */
static Oid
database_tablespace(Oid dboid)
{
	HeapTuple	tup = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(dboid));
	Oid			tablespace;

	if (!HeapTupleIsValid(tup))
		return InvalidOid;
	tablespace = ((Form_pg_database) GETSTRUCT(tup))->dattablespace;
	ReleaseSysCache(tup);
	return tablespace;
}

/*
 * Whether PostgreSQL is going to carry out a command on database dboid,
 * as far as the checks it makes before it needs the database to itself
 * tell: the role's privileges, the names, the current database.  A command
 * that is going to fail must not stop the database's workers on its way.
 */
static bool
command_will_run(Node *stmt, Oid dboid)
{
	Oid			tablespace;

	if (!outbox_ownercheck(DatabaseRelationId, dboid, GetUserId()))
		return false;
	switch (nodeTag(stmt))
	{
		case T_DropdbStmt:
			return dboid != MyDatabaseId;
		case T_RenameStmt:
			return dboid != MyDatabaseId && may_create_databases() &&
				!OidIsValid(get_database_oid(((RenameStmt *) stmt)->newname, true));
		case T_AlterDatabaseStmt:
			tablespace = get_tablespace_oid(option_string(((AlterDatabaseStmt *) stmt)->options,
														  "tablespace"), true);
			/* Moving to the tablespace it is in already needs nobody out. */
			return dboid != MyDatabaseId && OidIsValid(tablespace) &&
				tablespace != database_tablespace(dboid) &&
				outbox_aclcheck(TableSpaceRelationId, tablespace, GetUserId(),
								ACL_CREATE) == ACLCHECK_OK;
		case T_CreatedbStmt:
			return may_create_databases() &&
				!OidIsValid(get_database_oid(((CreatedbStmt *) stmt)->dbname, true));
		default:
			return false;
	}
}

/*
 * The database a utility command needs to itself, if the command is going
 * to run and the database's workers are to be stopped for it; else NULL.
 */
static const char *
database_needed_alone(Node *stmt)
{
	const char *name = database_named(stmt);
	Oid			dboid;

	if (name == NULL)
		return NULL;
	dboid = get_database_oid(name, true);
	if (!OidIsValid(dboid) || outbox_database_entry(dboid) == NULL ||
		!command_will_run(stmt, dboid))
		return NULL;
	return name;
}

/*
 * CREATE EXTENSION outbox SCHEMA s where s does not exist: PostgreSQL's
 * own error does not say that the schema must be created first (outbox is
 * not relocatable into a schema it would create), so say it here.
 */
static void
check_extension_schema(Node *stmt)
{
	CreateExtensionStmt *ces;
	const char *schema;

	if (!IsA(stmt, CreateExtensionStmt))
		return;
	ces = (CreateExtensionStmt *) stmt;
	if (strcmp(ces->extname, "outbox") != 0 ||
		(ces->if_not_exists && OidIsValid(get_extension_oid("outbox", true))))
		return;
	schema = option_string(ces->options, "schema");
	if (schema != NULL && !OidIsValid(get_namespace_oid(schema, true)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_SCHEMA),
				 errmsg("schema \"%s\" does not exist", schema),
				 errhint("Create it first: CREATE SCHEMA %s; then CREATE EXTENSION outbox SCHEMA %s;",
						 quote_identifier(schema), quote_identifier(schema))));
}

/*
 * Before DROP DATABASE and the like, stop the database's publishers; let
 * the launcher start them again when the command is over (if the database
 * is still there).
 */
static void
outbox_process_utility(OUTBOX_UTILITY_ARGS)
{
	const char *name = outbox_shared ? database_needed_alone(pstmt->utilityStmt) : NULL;

	check_extension_schema(pstmt->utilityStmt);
	PG_TRY();
	{
		if (name != NULL)
			hold_database(name);
		if (prev_ProcessUtility)
			prev_ProcessUtility(OUTBOX_UTILITY_PASS);
		else
			standard_ProcessUtility(OUTBOX_UTILITY_PASS);
	}
	PG_FINALLY();
	{
		/* Only the invocation that took the hold ends it. */
		if (name != NULL && held_database != NULL)
		{
			held_database->held_until = 0;
			held_database = NULL;
			outbox_wake_launcher();
		}
	}
	PG_END_TRY();
}

/* ---------- the launcher's slots ---------- */

/*
 * Follow a slot: is its worker alive?  pid is what the worker published in
 * shared memory (0: none), which finds one a launcher before this one
 * started.  A worker found stopped puts its slot in back-off.
 */
static bool
slot_alive(LauncherSlot *slot, pid_t pid, TimestampTz now)
{
	pid_t		bgw_pid;

	if (slot->handle != NULL)
	{
		if (GetBackgroundWorkerPid(slot->handle, &bgw_pid) != BGWH_STOPPED)
			return true;
		pfree(slot->handle);
		slot->handle = NULL;
	}
	if (pid_alive(pid))
	{
		slot->state = SLOT_RUNNING;
		return true;
	}
	if (slot->state == SLOT_RUNNING)
	{
		/* After an exit, wait a little: never a crash loop. */
		slot->state = SLOT_BACKOFF;
		slot->restart_at = TimestampTzPlusMilliseconds(now, RESTART_INTERVAL_MS);
	}
	return false;
}

/* Its worker stopped, reporting it had nothing to do: no back-off. */
static void
slot_reported(LauncherSlot *slot)
{
	if (slot->state == SLOT_BACKOFF)
		slot->state = SLOT_IDLE;
}

/* May a stopped slot's worker start now? */
static bool
slot_may_start(LauncherSlot *slot, TimestampTz now)
{
	return slot->state == SLOT_IDLE ||
		(slot->state == SLOT_BACKOFF && now >= slot->restart_at);
}

/* Start a slot's worker; false if no background worker slot is free. */
static bool
slot_start(LauncherSlot *slot, BackgroundWorker *worker)
{
	/* The handle outlives the pass (the loop's memory is reset). */
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
	bool		started;

	worker->bgw_notify_pid = MyProcPid;
	started = RegisterDynamicBackgroundWorker(worker, &slot->handle);
	MemoryContextSwitchTo(old);
	if (!started)
	{
		slot->handle = NULL;
		return false;
	}
	slot->state = SLOT_RUNNING;
	return true;
}

/*
 * Log, once until a start succeeds again, that a worker (what: "publisher
 * 0 of database \"x\"") found no background worker slot.
 */
static void
log_no_slot(bool *logged, const char *what)
{
	if (!*logged)
		ereport(LOG,
				(errmsg("outbox launcher: no background worker slot for %s", what),
				 errhint("Raise max_worker_processes (now %d) and restart the server, or lower outbox.max_workers or outbox.workers: "
						 "each database with the extension takes outbox.workers slots, plus outbox.inbox_workers where something is subscribed, "
						 "and the cluster one more for the launcher.",
						 max_worker_processes)));
	*logged = true;
}

/* ---------- the launcher's steps ---------- */

/* Start publisher i of database entry e; false if no slot is free. */
static bool
start_publisher(int e, int i)
{
	OutboxDatabase *db = &outbox_shared->databases[e];
	LauncherDatabase *ldb = &launcher_dbs[e];
	BackgroundWorker worker;

	outbox_bgworker_init(&worker, "outbox_worker_main", "outbox publisher", BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox publisher %d of %s", i, NameStr(db->name));
	worker.bgw_main_arg = UInt32GetDatum(((uint32) e << 16) | (uint32) i);
	db->workers[i].yield = false;
	ldb->probed_generation = probe_generation;
	return slot_start(&ldb->publishers[i], &worker);
}

/* Step: a CREATE EXTENSION committed somewhere: probe every database without it now. */
static void
note_probe_generation(void)
{
	uint32		generation = pg_atomic_read_u32(&outbox_shared->probe_generation);

	if (generation == probe_generation)
		return;
	probe_generation = generation;
	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
		launcher_dbs[e].next_probe_at = 0;
}

/*
 * Follow entry e's publishers: count them; note a turn that ended and a
 * probe that found no extension (probed again in a while, or at once if a
 * CREATE EXTENSION committed since it started).
 */
static void
collect_publishers(int e, TimestampTz now)
{
	OutboxDatabase *db = &outbox_shared->databases[e];
	LauncherDatabase *ldb = &launcher_dbs[e];
	int			running = 0;

	for (int i = 0; i < OUTBOX_MAX_WORKERS; i++)
	{
		if (slot_alive(&ldb->publishers[i], db->workers[i].pid, now))
			running++;
	}
	if (running == 0 && ldb->running > 0)
	{
		ldb->turn_ended = now;
		ldb->yielding = false;
		if (db->state == ODB_ABSENT)
		{
			slot_reported(&ldb->publishers[0]);
			ldb->next_probe_at = ldb->probed_generation != probe_generation ? 0 :
				TimestampTzPlusMilliseconds(now, PROBE_INTERVAL_MS);
		}
	}
	ldb->running = running;
}

/*
 * Follow the inbox workers of entry e (INBOX_ONE_DATABASE: of the one
 * inbox database); count them.  While their database is marked idle, the
 * idle mark says when they start again, not the back-off.
 */
static int
collect_inbox(LauncherSlot *slots, int e, TimestampTz now)
{
	int			running = 0;
	bool		idle = e != INBOX_ONE_DATABASE && inbox_database_idle(e, now);

	for (int i = 0; i < INBOX_MAX_WORKERS; i++)
	{
		if (slot_alive(&slots[i], inbox_worker_pid(e, i), now))
			running++;
		else if (idle)
			slot_reported(&slots[i]);
	}
	return running;
}

/* Step: follow every worker, publisher and inbox, of every database. */
static void
collect_workers(TimestampTz now)
{
	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
	{
		/* An entry freed while its inbox workers ran is followed until they stop. */
		launcher_dbs[e].inbox_running = collect_inbox(launcher_dbs[e].inbox, e, now);
		if (OidIsValid(outbox_shared->databases[e].dboid))
			collect_publishers(e, now);
	}
	if (inbox_one_name != NULL)
		(void) collect_inbox(inbox_one, INBOX_ONE_DATABASE, now);
}

/* Take up a database: an entry for it, or NULL if all are taken. */
static OutboxDatabase *
take_up_database(Oid dboid, const char *name)
{
	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
	{
		OutboxDatabase *db = &outbox_shared->databases[e];

		if (OidIsValid(db->dboid) || launcher_dbs[e].running > 0 ||
			launcher_dbs[e].inbox_running > 0)
			continue;
		outbox_worker_slots_init(db->workers);
		inbox_database_reset(e);
		outbox_stats_init(&db->stats, false);
		namestrcpy(&db->name, name);
		db->state = ODB_UNKNOWN;
		db->held_until = 0;
		db->waiting_since = 0;
		db->turn_started = 0;
		memset(&launcher_dbs[e], 0, sizeof(LauncherDatabase));
		pg_write_barrier();
		db->dboid = dboid;
		return db;
	}
	return NULL;
}

/* A database of pg_database: take it up if the settings want it served. */
static void
scan_one(Form_pg_database f, bool *full)
{
	OutboxDatabase *db;

	if (inbox_one_name != NULL && strcmp(NameStr(f->datname), inbox_one_name) == 0)
		inbox_one_exists = true;
	/* No publisher: no database is taken up (nor probed). */
	if (outbox_workers == 0 ||
		!outbox_database_wanted(NameStr(f->datname), f->datistemplate,
								f->datallowconn, NULL))
		return;
	db = outbox_database_entry(f->oid);
	if (db == NULL)
		db = take_up_database(f->oid, NameStr(f->datname));
	if (db == NULL)
	{
		*full = true;
		return;
	}
	if (strcmp(NameStr(db->name), NameStr(f->datname)) != 0)
		namestrcpy(&db->name, NameStr(f->datname));
	launcher_dbs[db - outbox_shared->databases].listed = true;
}

/*
 * Step: scan pg_database once for publishers and inbox workers: take up the
 * databases the settings want, follow renames, mark the rest, and see
 * whether the one inbox database exists.  Connected to no database, only a
 * heap scan of a shared catalog works: an index scan may need to build the
 * index's relcache entry from pg_class (a fresh cluster has no cached one),
 * which fails outside a database.
 */
static void
scan_databases(void)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	bool		full = false;
	MemoryContext loop_context = CurrentMemoryContext;

	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
		launcher_dbs[e].listed = false;
	inbox_one_exists = false;

	StartTransactionCommand();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
		scan_one((Form_pg_database) GETSTRUCT(tup), &full);
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	MemoryContextSwitchTo(loop_context);

	if (full && !logged_full)
		ereport(LOG,
				(errmsg("outbox launcher: more than %d databases to serve; some are not served",
						OUTBOX_MAX_DATABASES),
				 errhint("Restrict outbox.databases to the databases that have the extension.")));
	logged_full = full;
	/* A missing inbox database (say outbox.database is wrong): said once. */
	if (inbox_one_name != NULL && !inbox_one_exists && !logged_inbox_missing)
		ereport(LOG,
				(errmsg("outbox launcher: inbox database \"%s\" does not exist; waiting", inbox_one_name),
				 errhint("Set outbox.inbox_database (else outbox.database) to the consumers' database.")));
	logged_inbox_missing = inbox_one_name != NULL && !inbox_one_exists;
}

/* Step: stop serving databases that left pg_database or the settings; free their entries. */
static void
release_databases(void)
{
	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
	{
		OutboxDatabase *db = &outbox_shared->databases[e];
		LauncherDatabase *ldb = &launcher_dbs[e];

		if (!OidIsValid(db->dboid) || ldb->listed)
			continue;
		if (ldb->running > 0)
		{
			request_yield(db);
			continue;
		}
		db->dboid = InvalidOid;
		db->waiting_since = 0;
	}
}

/*
 * How many publishers a database asks for: outbox.workers where the
 * extension is, one probe where it is not known (or due to be probed
 * again), none while a DROP/ALTER DATABASE holds it.
 */
static int
publishers_wanted(int e, TimestampTz now)
{
	OutboxDatabase *db = &outbox_shared->databases[e];
	LauncherDatabase *ldb = &launcher_dbs[e];

	if (!OidIsValid(db->dboid) || !ldb->listed || db->held_until > now)
		return 0;
	if (db->state == ODB_SERVED)
		return outbox_workers;
	return (ldb->running > 0 || now >= ldb->next_probe_at) ? 1 : 0;
}

/*
 * Start what is missing of publishers 0..want-1 of entry e while the cap
 * allows; returns how many were started.  *total counts the cluster's.
 */
static int
start_publishers(int e, int want, int cap, int *total, TimestampTz now)
{
	static bool logged_no_slot = false;
	OutboxDatabase *db = &outbox_shared->databases[e];
	int			started = 0;

	for (int i = 0; i < want && *total < cap; i++)
	{
		LauncherSlot *slot = &launcher_dbs[e].publishers[i];

		if (slot_alive(slot, db->workers[i].pid, now))
			continue;
		/* Lower numbers first: a free slot waits for one that is to restart. */
		if (!slot_may_start(slot, now))
			break;
		if (!start_publisher(e, i))
		{
			log_no_slot(&logged_no_slot,
						psprintf("publisher %d of database \"%s\"", i, NameStr(db->name)));
			break;
		}
		logged_no_slot = false;
		started++;
		(*total)++;
	}
	return started;
}

/* Waiting databases in the order of their turns: the longest without one first. */
static int
turn_order_cmp(const void *a, const void *b)
{
	TimestampTz ta = launcher_dbs[*(const int *) a].turn_ended;
	TimestampTz tb = launcher_dbs[*(const int *) b].turn_ended;

	return (ta > tb) - (ta < tb);
}

/*
 * When a database waits for a turn and no worker can start, ask the one
 * whose turn is the oldest, and over, to make way (one at a time).  Over
 * the cap (outbox.max_workers was lowered), the oldest turn ends at once.
 */
static void
rotate_turns(TimestampTz now, bool over_cap)
{
	int			oldest = -1;

	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
	{
		OutboxDatabase *db = &outbox_shared->databases[e];

		if (!OidIsValid(db->dboid) || launcher_dbs[e].running == 0)
			continue;
		if (launcher_dbs[e].yielding)
			return;
		if ((over_cap ||
			 TimestampDifferenceExceeds(db->turn_started, now, outbox_time_slice_s * 1000)) &&
			(oldest < 0 || db->turn_started < outbox_shared->databases[oldest].turn_started))
			oldest = e;
	}
	if (oldest >= 0)
	{
		launcher_dbs[oldest].yielding = true;
		request_yield(&outbox_shared->databases[oldest]);
	}
}

/*
 * Step: give publishers to the databases: first complete those whose turn
 * goes on, then start the waiting ones, longest waiting first, within the
 * cap.
 */
static void
schedule_publishers(TimestampTz now)
{
	int			cap = outbox_max_workers > 0 ? outbox_max_workers : INT_MAX;
	int			total = 0;
	int			order[OUTBOX_MAX_DATABASES];
	int			norder = 0;
	int			waiting = 0;

	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
		total += launcher_dbs[e].running;
	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
	{
		int			want = publishers_wanted(e, now);

		if (want == 0)
			outbox_shared->databases[e].waiting_since = 0;
		else if (launcher_dbs[e].running > 0)
		{
			if (!launcher_dbs[e].yielding)
				(void) start_publishers(e, want, cap, &total, now);
		}
		else
			order[norder++] = e;
	}
	qsort(order, norder, sizeof(int), turn_order_cmp);
	for (int k = 0; k < norder; k++)
	{
		int			e = order[k];
		OutboxDatabase *db = &outbox_shared->databases[e];

		if (total >= cap)
		{
			if (db->waiting_since == 0)
				db->waiting_since = now;
			waiting++;
			continue;
		}
		if (start_publishers(e, publishers_wanted(e, now), cap, &total, now) > 0)
		{
			db->turn_started = now;
			db->waiting_since = 0;
		}
	}
	pg_atomic_write_u32(&outbox_shared->databases_waiting, waiting);
	if (waiting > 0 || total > cap)
		rotate_turns(now, total > cap);
}

/*
 * Start what is missing of outbox.inbox_workers in entry e
 * (INBOX_ONE_DATABASE: in the one inbox database); false if no background
 * worker slot is free.
 */
static bool
start_inbox_workers(LauncherSlot *slots, int e, const char *dbname, TimestampTz now)
{
	static bool logged_no_slot = false;

	for (int i = 0; i < inbox_workers; i++)
	{
		BackgroundWorker worker;

		if (slot_alive(&slots[i], inbox_worker_pid(e, i), now) ||
			!slot_may_start(&slots[i], now))
			continue;
		inbox_worker_describe(&worker, e, i, dbname);
		if (!slot_start(&slots[i], &worker))
		{
			log_no_slot(&logged_no_slot, e == INBOX_ONE_DATABASE ?
						psprintf("inbox worker %d", i) :
						psprintf("inbox worker %d of database \"%s\"", i, dbname));
			return false;
		}
		logged_no_slot = false;
	}
	return true;
}

/*
 * Step: give inbox workers to the one inbox database once it exists; with
 * none set, to every database the publishers serve (has the extension, is
 * not held by a DROP/ALTER DATABASE) unless its workers found nothing
 * subscribed there lately (inbox_database_idle).
 */
static void
schedule_inbox(TimestampTz now)
{
	if (inbox_workers == 0)
		return;
	if (inbox_one_name != NULL)
	{
		if (inbox_one_exists)
			(void) start_inbox_workers(inbox_one, INBOX_ONE_DATABASE, inbox_one_name, now);
		return;
	}
	for (int e = 0; e < OUTBOX_MAX_DATABASES; e++)
	{
		OutboxDatabase *db = &outbox_shared->databases[e];

		if (!OidIsValid(db->dboid) || db->state != ODB_SERVED || db->held_until > now ||
			inbox_database_idle(e, now))
			continue;
		if (!start_inbox_workers(launcher_dbs[e].inbox, e, NameStr(db->name), now))
			return;
	}
}

/* ---------- the launcher ---------- */

/* The launcher is gone: nobody to wake. */
static void
launcher_exit(int code, Datum arg)
{
	outbox_shared->launcher_latch = NULL;
}

/* Step: a SIGHUP asked to read the settings again. */
static void
reload_settings(void)
{
	if (!ConfigReloadPending)
		return;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
}

/*
 * One pass: follow the workers, scan pg_database, then start, stop or
 * restart publishers and inbox workers where they are missing.
 */
static void
launcher_pass(void)
{
	TimestampTz now = GetCurrentTimestamp();

	note_probe_generation();
	collect_workers(now);
	scan_databases();
	release_databases();
	schedule_publishers(now);
	schedule_inbox(now);
}

/*
 * The launcher, connected to no database: serve every database the
 * settings want with publishers and inbox workers, forever.  Every
 * LAUNCHER_NAP_MS, or when a worker starts or stops (bgw_notify_pid), a
 * commit asks, or a SIGHUP comes, it makes one pass in a memory context
 * reset at each.
 */
void
outbox_launcher_main(Datum main_arg)
{
	MemoryContext loop_context;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	outbox_reload_at_start();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	outbox_shared->launcher_latch = MyLatch;
	on_shmem_exit(launcher_exit, (Datum) 0);
	probe_generation = pg_atomic_read_u32(&outbox_shared->probe_generation);
	/* Where the inbox workers run is fixed at start (a reload keeps it). */
	if (inbox_workers > 0 && inbox_target_database() != NULL)
		inbox_one_name = MemoryContextStrdup(TopMemoryContext, inbox_target_database());
	loop_context = AllocSetContextCreate(TopMemoryContext, "outbox launcher loop",
										 ALLOCSET_DEFAULT_SIZES);
	ereport(LOG, (errmsg("outbox launcher started")));

	for (;;)
	{
		MemoryContextReset(loop_context);
		MemoryContextSwitchTo(loop_context);
		CHECK_FOR_INTERRUPTS();
		reload_settings();
		launcher_pass();

		pgstat_report_activity(STATE_IDLE, NULL);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 LAUNCHER_NAP_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
