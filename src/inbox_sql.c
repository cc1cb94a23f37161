/*-------------------------------------------------------------------------
 *
 * inbox_sql.c
 *	  inbox_subscribe(), inbox_unsubscribe() and inbox_claim().
 *
 * They are not SECURITY DEFINER: the subscriber or claimant is the calling
 * role (current_user, which for a handler is the role the inbox worker
 * runs it as), whose identity a SECURITY DEFINER function could not see
 * (current_user would be the definer).  After checking the caller, they
 * write the extension's tables as the role that owns them.  Every
 * statement names its objects and operators schema-qualified, whatever the
 * caller's search_path.
 *
 * A handler must be the subscriber's own function (or its role's), in a
 * schema the subscriber may use: the inbox worker runs it as the
 * subscriber, so subscribing another role's SECURITY DEFINER function
 * would run that role's code on the subscriber's say-so.  The topics must
 * be allowed by outbox.inbox_allowed_topics and not be Kafka's own.
 *
 * inbox_subscription.handler holds the handler's schema-qualified
 * signature as text, not a regprocedure: pg_upgrade keeps no function's
 * OID and so refuses a table with a regprocedure column.  The inbox
 * workers resolve it again at each refresh (inbox_resolve_handler).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "catalog/pg_namespace.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "compat.h"
#include "emit.h"
#include "shmem.h"
#include "util.h"
#include "inbox_worker.h"

PG_FUNCTION_INFO_V1(inbox_subscribe);
PG_FUNCTION_INFO_V1(inbox_unsubscribe);
PG_FUNCTION_INFO_V1(inbox_claim);

/* Consumer names end up in group ids and logs: keep them reasonable. */
#define INBOX_CONSUMER_MAXLEN 200

/* outbox.inbox_allowed_topics: patterns of the topics one may subscribe to. */
char	   *inbox_allowed_topics = NULL;

/* Define the settings of subscribing. */
void
inbox_sql_init(void)
{
	DefineCustomStringVariable("outbox.inbox_allowed_topics",
							   "Topics inbox subscriptions may read: comma-separated patterns, '*' matching any run of characters.",
							   "Checked by inbox_subscribe() and again by the inbox workers; topics beginning with \"__\" are Kafka's and never allowed.",
							   &inbox_allowed_topics, "*",
							   PGC_SUSET, GUC_LIST_INPUT,
							   outbox_check_topic_patterns, NULL, NULL);
}

/* The extension's schema and owner (connected to SPI). */
static void
extension_info(Oid *nspid, Oid *owner)
{
	bool		isnull;

	if (SPI_execute("SELECT e.extnamespace, e.extowner FROM pg_catalog.pg_extension e "
					"WHERE e.extname OPERATOR(pg_catalog.=) 'outbox'", true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not look up the outbox extension");
	*nspid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	*owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
}

/* The consumer argument, checked. */
static char *
consumer_arg(FunctionCallInfo fcinfo)
{
	char	   *consumer;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("consumer must not be NULL")));
	consumer = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (consumer[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("consumer must not be empty")));
	if (strlen(consumer) > INBOX_CONSUMER_MAXLEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("consumer must be at most %d bytes", INBOX_CONSUMER_MAXLEN)));
	return consumer;
}

/* The topics argument: a non-empty array of names Kafka accepts. */
static ArrayType *
topics_arg(FunctionCallInfo fcinfo)
{
	ArrayType  *topics;
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("topics must not be NULL")));
	topics = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(topics) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("topics must be a one-dimensional array")));
	deconstruct_array(topics, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("topics must name at least one topic")));
	for (int i = 0; i < n; i++)
	{
		const char *err;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("topics must not contain NULL")));
		err = outbox_topic_error(TextDatumGetCString(elems[i]));
		if (err != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid topic \"%s\"", TextDatumGetCString(elems[i])),
					 errdetail("%s", err)));
		err = inbox_topic_problem(TextDatumGetCString(elems[i]));
		if (err != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("topic \"%s\" may not be subscribed to", TextDatumGetCString(elems[i])),
					 errdetail("%s", err),
					 errhint("A superuser can allow topics in outbox.inbox_allowed_topics.")));
	}
	return topics;
}

/*
 * Why a subscription may not read a topic (NULL if it may): Kafka's own
 * topics never, others as outbox.inbox_allowed_topics says.
 */
const char *
inbox_topic_problem(const char *topic)
{
	if (strncmp(topic, "__", 2) == 0)
		return "Topics whose names begin with \"__\", such as __consumer_offsets, belong to Kafka itself.";
	if (!outbox_topic_matches_list(topic, inbox_allowed_topics))
		return psprintf("outbox.inbox_allowed_topics is \"%s\".", inbox_allowed_topics);
	return NULL;
}

/* Why a role may not have the inbox workers run a handler, for the log. */
const char *
inbox_handler_problem_text(InboxHandlerProblem problem)
{
	switch (problem)
	{
		case HANDLER_OK:
			break;
		case HANDLER_MISSING:
			return "its handler no longer exists";
		case HANDLER_NOT_OWNER:
			return "its role does not own its handler";
		case HANDLER_NO_EXECUTE:
			return "its role may not execute its handler";
		case HANDLER_NO_SCHEMA:
			return "its role may not use the schema of its handler";
	}
	return NULL;
}

/*
 * Whether role may have the inbox workers run handler: the handler must
 * exist, be the role's own (or a function of a role it has the privileges
 * of), be executable by it and lie in a schema it may use.
 */
InboxHandlerProblem
inbox_handler_problem(Oid handler, Oid role)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(handler));
	Oid			owner,
				nspid;

	if (!HeapTupleIsValid(tup))
		return HANDLER_MISSING;
	owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
	nspid = ((Form_pg_proc) GETSTRUCT(tup))->pronamespace;
	ReleaseSysCache(tup);
	if (!has_privs_of_role(role, owner))
		return HANDLER_NOT_OWNER;
	if (outbox_aclcheck(ProcedureRelationId, handler, role, ACL_EXECUTE) != ACLCHECK_OK)
		return HANDLER_NO_EXECUTE;
	if (outbox_aclcheck(NamespaceRelationId, nspid, role, ACL_USAGE) != ACLCHECK_OK)
		return HANDLER_NO_SCHEMA;
	return HANDLER_OK;
}

/*
 * The function a stored handler signature names (inbox_subscription.handler),
 * or InvalidOid: looked up by to_regprocedure() under the caller's
 * search_path (the inbox worker's, pg_catalog and pg_temp; the signature
 * is schema-qualified).  Before PostgreSQL 16 to_regprocedure() raises an
 * error for a schema or type that does not exist rather than returning
 * NULL, hence the subtransaction; and from 16 on it takes a bare number as
 * an OID, which a signature never is (0.1.0's dropped handlers, printed as
 * regprocedure, are such numbers): only "name(types)" is looked up.
 */
Oid
inbox_resolve_handler(const char *signature)
{
	bool		failed;
	Datum		oid;

	if (strchr(signature, '(') == NULL)
		return InvalidOid;
	oid = outbox_call_catching(to_regprocedure, CStringGetTextDatum(signature), &failed);
	return failed ? InvalidOid : DatumGetObjectId(oid);
}

/* The handler: takes one inbox_message, returns void (or is a procedure). */
static Oid
handler_arg(FunctionCallInfo fcinfo, Oid nspid, Oid role)
{
	Oid			handler;
	Oid			msgtype;
	HeapTuple	tup;
	Form_pg_proc proc;
	bool		ok;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("handler must not be NULL")));
	handler = PG_GETARG_OID(2);
	msgtype = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
							  CStringGetDatum("inbox_message"), ObjectIdGetDatum(nspid));
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(handler));
	if (!HeapTupleIsValid(tup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("handler function %u does not exist", handler)));
	proc = (Form_pg_proc) GETSTRUCT(tup);
	ok = proc->pronargs == 1 && proc->proargtypes.values[0] == msgtype &&
		!proc->proretset &&
		(proc->prokind == PROKIND_PROCEDURE ||
		 (proc->prokind == PROKIND_FUNCTION && proc->prorettype == VOIDOID));
	ReleaseSysCache(tup);
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("%s cannot be an inbox handler", format_procedure(handler)),
				 errhint("A handler takes one argument of type inbox_message and returns void, or is a procedure.")));
	switch (inbox_handler_problem(handler, role))
	{
		case HANDLER_OK:
		case HANDLER_MISSING:	/* looked up above */
			return handler;
		case HANDLER_NOT_OWNER:
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("must be owner of function %s", format_procedure(handler)),
					 errdetail("The handler runs as the subscribing role, \"%s\", which must own it or be a member of its owner.",
							   GetUserNameFromId(role, false)),
					 errhint("Subscribe a function of your own: another role's code runs only when that role subscribes it.")));
			break;
		case HANDLER_NO_EXECUTE:
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied for function %s", format_procedure(handler)),
					 errdetail("The handler runs as the subscribing role, \"%s\".",
							   GetUserNameFromId(role, false))));
			break;
		case HANDLER_NO_SCHEMA:
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied for schema %s",
							get_namespace_name(get_func_namespace(handler))),
					 errdetail("The handler runs as the subscribing role, \"%s\", which must be able to use its schema.",
							   GetUserNameFromId(role, false))));
			break;
	}
	return InvalidOid;			/* not reached */
}

/*
 * Lock the consumer's subscription row; its owner, or InvalidOid if there
 * is none.  Refuses a caller who is not (a member of) the owner.
 */
static Oid
lock_subscription(const char *schema, const char *consumer, Oid role)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	bool		isnull;
	Oid			owner;

	args[0] = CStringGetTextDatum(consumer);
	if (SPI_execute_with_args(psprintf("SELECT s.owner::pg_catalog.oid FROM %s.inbox_subscription s "
									   "WHERE s.consumer OPERATOR(pg_catalog.=) $1 FOR UPDATE", schema),
							  1, argtypes, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read inbox subscriptions");
	if (SPI_processed == 0)
		return InvalidOid;
	owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (!has_privs_of_role(role, owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("consumer \"%s\" is subscribed by another role", consumer),
				 errdetail("Only the subscribing role and its members may change or remove it.")));
	return owner;
}

/*
 * Register the consumer to the subscribing role in inbox_consumer, so that
 * no other role can claim its events with inbox_claim() (which would make
 * the worker drop them as duplicates).  A consumer name registered to a
 * role the subscriber is not a member of is refused.
 */
static void
register_consumer(const char *schema, const char *consumer, Oid role)
{
	Oid			argtypes[2] = {TEXTOID, NAMEOID};
	Datum		args[2];
	Oid			registered;

	args[0] = CStringGetTextDatum(consumer);
	if (SPI_execute_with_args(psprintf("SELECT c.role FROM %s.inbox_consumer c "
									   "WHERE c.consumer OPERATOR(pg_catalog.=) $1 FOR UPDATE", schema),
							  1, argtypes, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read inbox consumers");
	if (SPI_processed == 1)
	{
		registered = get_role_oid(SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1), true);
		if (!OidIsValid(registered) || !is_member_of_role(role, registered))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("consumer \"%s\" is registered to another role", consumer),
					 errdetail("Only members of the role it is registered to in inbox_consumer may subscribe it.")));
		return;
	}
	args[1] = DirectFunctionCall1(namein, CStringGetDatum(GetUserNameFromId(role, false)));
	if (SPI_execute_with_args(psprintf("INSERT INTO %s.inbox_consumer (consumer, role) VALUES ($1, $2)", schema),
							  2, argtypes, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not register the inbox consumer");
}

/* inbox_subscribe(consumer, topics, handler): subscribe as current_user. */
Datum
inbox_subscribe(PG_FUNCTION_ARGS)
{
	Oid			role = GetUserId();
	char	   *consumer = consumer_arg(fcinfo);
	ArrayType  *topics = topics_arg(fcinfo);
	Oid			nspid,
				extowner;
	Oid			handler;
	const char *schema;
	Oid			save_userid;
	int			save_sec;
	int			nestlevel;
	Oid			argtypes[4] = {TEXTOID, TEXTARRAYOID, OIDOID, OIDOID};
	Datum		args[4];

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	extension_info(&nspid, &extowner);
	handler = handler_arg(fcinfo, nspid, role);
	if (superuser_arg(role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("a superuser cannot subscribe: handlers never run as a superuser"),
				 errhint("Subscribe as the role the handler should run as (SET ROLE).")));
	schema = quote_identifier(get_namespace_name(nspid));

	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(extowner, save_sec | SECURITY_LOCAL_USERID_CHANGE);
	(void) lock_subscription(schema, consumer, role);
	register_consumer(schema, consumer, role);
	args[0] = CStringGetTextDatum(consumer);
	args[1] = PointerGetDatum(topics);
	args[2] = ObjectIdGetDatum(handler);
	args[3] = ObjectIdGetDatum(role);

	/*
	 * The handler is stored as its regprocedure text under search_path
	 * pg_catalog, pg_temp, which qualifies every name not in pg_catalog
	 * (the function's and inbox_message's schemas), as the inbox workers
	 * resolve it and as the update from 0.1.0 converts it; on 0.1.0's
	 * objects (the library updated first) the column is the regprocedure.
	 */
	nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	if (SPI_execute_with_args(psprintf("INSERT INTO %s.inbox_subscription AS s (consumer, topics, handler, owner) "
									   "VALUES ($1, $2, $3::pg_catalog.regprocedure, $4::pg_catalog.regrole) "
									   "ON CONFLICT (consumer) DO UPDATE SET topics = excluded.topics, "
									   "handler = excluded.handler, owner = excluded.owner", schema),
							  4, argtypes, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write the inbox subscription");
	AtEOXact_GUC(true, nestlevel);
	SPI_finish();
	SetUserIdAndSecContext(save_userid, save_sec);

	ereport(LOG,
			(errmsg("outbox: role \"%s\" subscribed consumer \"%s\" with handler %s",
					GetUserNameFromId(role, false), consumer, format_procedure_qualified(handler))));
	/* Where nothing was subscribed, inbox workers start again at commit. */
	outbox_launcher_probe_at_commit();
	PG_RETURN_VOID();
}

/* inbox_unsubscribe(consumer): remove it; true if it existed. */
Datum
inbox_unsubscribe(PG_FUNCTION_ARGS)
{
	Oid			role = GetUserId();
	char	   *consumer = consumer_arg(fcinfo);
	Oid			nspid,
				extowner;
	const char *schema;
	Oid			save_userid;
	int			save_sec;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	bool		found;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	extension_info(&nspid, &extowner);
	schema = quote_identifier(get_namespace_name(nspid));

	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(extowner, save_sec | SECURITY_LOCAL_USERID_CHANGE);
	found = OidIsValid(lock_subscription(schema, consumer, role));
	if (found)
	{
		args[0] = CStringGetTextDatum(consumer);
		if (SPI_execute_with_args(psprintf("DELETE FROM %s.inbox_subscription s "
										   "WHERE s.consumer OPERATOR(pg_catalog.=) $1", schema),
								  1, argtypes, args, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not delete the inbox subscription");
	}
	SPI_finish();
	SetUserIdAndSecContext(save_userid, save_sec);

	if (found)
		ereport(LOG,
				(errmsg("outbox: role \"%s\" unsubscribed consumer \"%s\"",
						GetUserNameFromId(role, false), consumer)));
	else
		ereport(NOTICE,
				(errmsg("consumer \"%s\" is not subscribed", consumer)));
	PG_RETURN_BOOL(found);
}

/* What inbox_claim() keeps per call site: where the extension's tables are. */
typedef struct ClaimState
{
	Oid			nspid;			/* the function's schema: the extension's */
	Oid			owner;			/* its owner, who writes the tables */
} ClaimState;

/* inbox_claim()'s kept statements, for the schema they were prepared in. */
static Oid	claim_nspid = InvalidOid;
static SPIPlanPtr claim_role_plan = NULL;
static SPIPlanPtr claim_insert_plan = NULL;

/* Prepare and keep inbox_claim()'s statements for schema nspid. */
static void
prepare_claim_plans(Oid nspid)
{
	const char *schema = quote_identifier(get_namespace_name(nspid));
	Oid			one[1] = {TEXTOID};
	Oid			two[2] = {TEXTOID, TEXTOID};

	if (claim_role_plan != NULL)
		SPI_freeplan(claim_role_plan);
	if (claim_insert_plan != NULL)
		SPI_freeplan(claim_insert_plan);
	claim_role_plan = claim_insert_plan = NULL;
	claim_nspid = InvalidOid;
	claim_role_plan = outbox_keep_plan(psprintf("SELECT c.role FROM %s.inbox_consumer c "
												"WHERE c.consumer OPERATOR(pg_catalog.=) $1",
												schema), 1, one);
	claim_insert_plan = outbox_keep_plan(psprintf("INSERT INTO %s.inbox AS i (consumer, event_id) "
												  "VALUES ($1, $2) ON CONFLICT DO NOTHING",
												  schema), 2, two);
	claim_nspid = nspid;
}

/* The schema and owner of the called function (the extension's), cached. */
static ClaimState *
claim_state(FunctionCallInfo fcinfo)
{
	ClaimState *state = (ClaimState *) fcinfo->flinfo->fn_extra;

	if (state == NULL)
	{
		HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));

		if (!HeapTupleIsValid(tup))
			elog(ERROR, "cache lookup failed for function %u", fcinfo->flinfo->fn_oid);
		state = MemoryContextAlloc(fcinfo->flinfo->fn_mcxt, sizeof(ClaimState));
		state->nspid = ((Form_pg_proc) GETSTRUCT(tup))->pronamespace;
		state->owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
		ReleaseSysCache(tup);
		fcinfo->flinfo->fn_extra = state;
	}
	return state;
}

/*
 * Refuse a claim for a consumer registered (in inbox_consumer) to a role
 * the claimant is not a member of: the inbox worker would then drop that
 * consumer's event as a duplicate.  An unregistered consumer is anyone's.
 */
static void
check_claimant(Datum consumer, Oid role)
{
	Datum		args[1] = {consumer};
	bool		isnull;
	Oid			registered;

	if (SPI_execute_plan(claim_role_plan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read inbox consumers");
	if (SPI_processed == 0)
		return;
	registered = get_role_oid(NameStr(*DatumGetName(SPI_getbinval(SPI_tuptable->vals[0],
																   SPI_tuptable->tupdesc, 1,
																   &isnull))), true);
	if (!OidIsValid(registered) || !is_member_of_role(role, registered))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("inbox_claim: permission denied to claim for consumer \"%s\"",
						TextDatumGetCString(consumer)),
				 errdetail("Only members of the role it is registered to in inbox_consumer may claim for it.")));
}

/*
 * inbox_claim(consumer, event_id): true if this transaction claimed the
 * event for the consumer, false if it was already processed.  Authorised as
 * the current role: in a handler, the role the inbox worker runs it as.
 *
 * A concurrent uncommitted claim of the same pair makes this wait: false if
 * that transaction commits, true if it aborts.  Under REPEATABLE READ or
 * SERIALIZABLE a claim committed after this transaction's snapshot is a
 * serialization failure (40001): retry the transaction.
 */
Datum
inbox_claim(PG_FUNCTION_ARGS)
{
	Oid			role = GetUserId();
	ClaimState *state;
	Oid			save_userid;
	int			save_sec;
	Datum		args[2];
	bool		claimed;

	outbox_check_text_arg("inbox_claim: consumer", PG_GETARG_DATUM(0), PG_ARGISNULL(0));
	outbox_check_text_arg("inbox_claim: event_id", PG_GETARG_DATUM(1), PG_ARGISNULL(1));
	state = claim_state(fcinfo);
	args[0] = PG_GETARG_DATUM(0);
	args[1] = PG_GETARG_DATUM(1);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	/* On error the (sub)transaction's abort restores the user. */
	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(state->owner, save_sec | SECURITY_LOCAL_USERID_CHANGE);
	if (claim_nspid != state->nspid)
		prepare_claim_plans(state->nspid);
	check_claimant(args[0], role);
	if (SPI_execute_plan(claim_insert_plan, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "inbox claim failed");
	claimed = SPI_processed == 1;
	SetUserIdAndSecContext(save_userid, save_sec);
	SPI_finish();
	PG_RETURN_BOOL(claimed);
}
