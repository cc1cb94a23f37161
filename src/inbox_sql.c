/*-------------------------------------------------------------------------
 *
 * inbox_sql.c
 *	  inbox_subscribe() and inbox_unsubscribe().
 *
 * They are not SECURITY DEFINER: the subscriber is the calling role, whose
 * identity a SECURITY DEFINER function could not see (current_user would be
 * the definer).  After checking the caller, they write the subscription
 * table as the extension's owner.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "compat.h"
#include "emit.h"
#include "launcher.h"
#include "outbox.h"
#include "inbox_worker.h"

PG_FUNCTION_INFO_V1(inbox_subscribe);
PG_FUNCTION_INFO_V1(inbox_unsubscribe);

/* Consumer names end up in group ids and logs: keep them reasonable. */
#define INBOX_CONSUMER_MAXLEN 200

/* The extension's schema and owner (connected to SPI). */
static void
extension_info(Oid *nspid, Oid *owner)
{
	bool		isnull;

	if (SPI_execute("SELECT e.extnamespace, e.extowner FROM pg_catalog.pg_extension e "
					"WHERE e.extname = 'outbox'", true, 1) != SPI_OK_SELECT ||
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
	}
	return topics;
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
	if (outbox_proc_aclcheck(handler, role, ACL_EXECUTE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for function %s", format_procedure(handler)),
				 errdetail("The handler runs as the subscribing role, \"%s\".",
						   GetUserNameFromId(role, false))));
	return handler;
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
	if (SPI_execute_with_args(psprintf("SELECT s.owner::oid FROM %s.inbox_subscription s "
									   "WHERE s.consumer = $1 FOR UPDATE", schema),
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
									   "WHERE c.consumer = $1 FOR UPDATE", schema),
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
	if (SPI_execute_with_args(psprintf("INSERT INTO %s.inbox_subscription AS s (consumer, topics, handler, owner) "
									   "VALUES ($1, $2, $3::pg_catalog.regprocedure, $4::pg_catalog.regrole) "
									   "ON CONFLICT (consumer) DO UPDATE SET topics = excluded.topics, "
									   "handler = excluded.handler, owner = excluded.owner", schema),
							  4, argtypes, args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "could not write the inbox subscription");
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
		if (SPI_execute_with_args(psprintf("DELETE FROM %s.inbox_subscription s WHERE s.consumer = $1", schema),
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
