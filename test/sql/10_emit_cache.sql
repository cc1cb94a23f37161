-- What outbox_emit keeps from one call to the next stays current: the set-up
-- of the outbox's defaults is kept per session for the user it was made
-- for, and is made again when the table's defaults, the functions they
-- call, or the roles' rights change; the function's result type and schema
-- are kept across statements.
SET search_path = ob, public;
\set SHOW_CONTEXT never
-- regress.try(stmt), from 00_setup.sql: 'ok', or the error's SQLSTATE,
-- message, detail and hint.
CREATE ROLE outbox_regress_cache_a;
CREATE ROLE outbox_regress_cache_b;
GRANT USAGE ON SCHEMA ob, regress TO outbox_regress_cache_a, outbox_regress_cache_b;
GRANT EXECUTE ON FUNCTION outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint)
      TO outbox_regress_cache_a, outbox_regress_cache_b;

-- A changed default applies to the next emit of the session.
SELECT aggregate_version FROM outbox_emit('order', 'cache-1', 'A', '{}');
BEGIN;
ALTER TABLE outbox ALTER COLUMN attempts SET DEFAULT 7;
SELECT aggregate_version FROM outbox_emit('order', 'cache-1', 'B', '{}');
SELECT event_type, attempts FROM outbox WHERE aggregate_id = 'cache-1' ORDER BY aggregate_version;
ROLLBACK;
SELECT aggregate_version FROM outbox_emit('order', 'cache-1', 'C', '{}');
SELECT event_type, attempts FROM outbox WHERE aggregate_id = 'cache-1' ORDER BY aggregate_version;

-- A default's function the caller may no longer execute: refused as a
-- planned INSERT would refuse it, although this session's defaults were set
-- up before, for this user and for another.
SET ROLE outbox_regress_cache_a;
SELECT regress.try($$SELECT outbox_emit('order', 'cache-2', 'A', '{}')$$);
RESET ROLE;
BEGIN;
REVOKE EXECUTE ON FUNCTION pg_catalog.clock_timestamp() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pg_catalog.clock_timestamp() TO outbox_regress_cache_a;
SET ROLE outbox_regress_cache_a;
SELECT regress.try($$SELECT outbox_emit('order', 'cache-2', 'B', '{}')$$);
SET ROLE outbox_regress_cache_b;
SELECT regress.try($$SELECT outbox_emit('order', 'cache-2', 'C', '{}')$$);
-- and back: the first user again may.
SET ROLE outbox_regress_cache_a;
SELECT regress.try($$SELECT outbox_emit('order', 'cache-2', 'D', '{}')$$);
RESET ROLE;
ROLLBACK;
-- Granted again (rolled back): both may.
SET ROLE outbox_regress_cache_b;
SELECT regress.try($$SELECT outbox_emit('order', 'cache-2', 'E', '{}')$$);
RESET ROLE;
SELECT string_agg(event_type, ' ' ORDER BY aggregate_version) FROM outbox WHERE aggregate_id = 'cache-2';

-- Revoked from a role the caller is a member of: refused too.
BEGIN;
CREATE ROLE outbox_regress_cache_clock;
REVOKE EXECUTE ON FUNCTION pg_catalog.clock_timestamp() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pg_catalog.clock_timestamp() TO outbox_regress_cache_clock;
GRANT outbox_regress_cache_clock TO outbox_regress_cache_b;
SET ROLE outbox_regress_cache_b;
SELECT regress.try($$SELECT outbox_emit('order', 'cache-3', 'A', '{}')$$);
RESET ROLE;
REVOKE outbox_regress_cache_clock FROM outbox_regress_cache_b;
SET ROLE outbox_regress_cache_b;
SELECT regress.try($$SELECT outbox_emit('order', 'cache-3', 'B', '{}')$$);
RESET ROLE;
ROLLBACK;

-- The result of a prepared statement, executed again and again, and of a
-- function whose result type changed meanwhile (rolled back).
PREPARE e(text) AS SELECT aggregate_version, topic FROM outbox_emit('order', $1, 'E', '{}');
EXECUTE e('cache-4');
EXECUTE e('cache-4');
BEGIN;
ALTER TYPE emitted_event ADD ATTRIBUTE extra int;
SELECT regress.try($$SELECT outbox_emit('order', 'cache-4', 'E', '{}')$$);
ROLLBACK;
EXECUTE e('cache-4');
DEALLOCATE e;

DROP OWNED BY outbox_regress_cache_a, outbox_regress_cache_b;
DROP ROLE outbox_regress_cache_a, outbox_regress_cache_b;
