/*-------------------------------------------------------------------------
 *
 * publish_extension.c
 *	  The extension as the publisher sees it: its OID, looked up again only
 *	  when its tables had a relcache invalidation, and every step's plans
 *	  and column positions, (re)prepared through the hooks the loop
 *	  registers when the extension (re)appears.
 *
 * The loop (worker.c) registers the steps' hooks once, in order; any step
 * that starts a transaction of its own (reading, settling, retention) looks
 * the extension up first, and so finds its plans ready.  The hooks are how
 * this module, below every step, prepares their plans without calling up
 * into them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/inval.h"

#include "publish.h"

/* The steps' hooks, in the order they run. */
static const PublishExtensionHook *hooks = NULL;
static int	nhooks = 0;

static Oid	plans_extoid = InvalidOid;	/* the extension the plans are for */
static bool extension_stale = true; /* look it up before trusting plans_extoid */

/* Register the steps' hooks (once, before the first look-up). */
void
publish_extension_hooks(const PublishExtensionHook *h, int n)
{
	hooks = h;
	nhooks = n;
}

/* Schema of the extension in this database, or NULL if not installed. */
static char *
extension_schema(void)
{
	int			rc;

	rc = SPI_execute("SELECT n.nspname FROM pg_catalog.pg_extension e "
					 "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace "
					 "WHERE e.extname OPERATOR(pg_catalog.=) 'outbox'", true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "could not look up the outbox extension");
	if (SPI_processed == 0)
		return NULL;
	return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
}

/* Prepare every step's plans for the extension in schema. */
static void
prepare_plans(const char *schema)
{
	const char *s = quote_identifier(schema);

	plans_extoid = InvalidOid;
	for (int i = 0; i < nhooks; i++)
		if (hooks[i].plans != NULL)
			hooks[i].plans(s);
}

/* A relcache invalidation of a step's table or of everything: look up again. */
static void
extension_relcache_callback(Datum arg, Oid relid)
{
	if (!OidIsValid(relid))
		extension_stale = true;
	for (int i = 0; i < nhooks && !extension_stale; i++)
		if (hooks[i].relid != NULL && relid == hooks[i].relid())
			extension_stale = true;
}

/*
 * In a transaction with a snapshot: find the extension and (re)prepare the
 * plans if it moved.  Returns its OID, or InvalidOid if it is not
 * installed.  Looked up in the catalog only after the outbox table had a
 * relcache invalidation (DROP EXTENSION drops it): a catalog scan per read
 * was 3.5% of the worker's CPU under a steady load.
 */
Oid
publish_lookup_extension(void)
{
	static bool callback_registered = false;
	static bool columns_found = false;	/* by the last look-up, completely */
	Oid			extoid;
	Oid			nsp;
	char	   *schema;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(extension_relcache_callback, (Datum) 0);
		callback_registered = true;
	}
	if (!extension_stale && columns_found && OidIsValid(plans_extoid))
		return plans_extoid;
	/* Cleared first: an invalidation during the look-up marks it again. */
	extension_stale = false;
	columns_found = false;
	extoid = get_extension_oid("outbox", true);
	if (!OidIsValid(extoid))
		return InvalidOid;
	schema = extension_schema();
	if (schema == NULL)
		return InvalidOid;
	/* Not relocatable: the same extension keeps its schema and plans. */
	if (extoid != plans_extoid)
		prepare_plans(schema);
	plans_extoid = extoid;
	/* Its tables' columns again (cheap): an ALTER EXTENSION UPDATE may move them. */
	nsp = get_namespace_oid(schema, false);
	for (int i = 0; i < nhooks; i++)
		if (hooks[i].columns != NULL)
			hooks[i].columns(nsp);
	columns_found = true;
	return extoid;
}
