-- Privileges: applications get EXECUTE on outbox_emit and inbox_claim and
-- nothing else; a caller's objects cannot change what they do (the emit
-- functions run no SQL, the others are SECURITY DEFINER with a pinned
-- search_path); the Kafka
-- properties (credentials) are hidden from ordinary roles.
--
-- Roles are created inside the transaction, which is rolled back: nothing
-- is left in the (shared) cluster.
BEGIN;
CREATE SCHEMA ob;
CREATE EXTENSION outbox SCHEMA ob;

-- An application role that was granted nothing but USAGE on the schema (so
-- that errors are about the objects, not the schema).
CREATE ROLE outbox_tap_app NOLOGIN;
GRANT USAGE ON SCHEMA ob TO outbox_tap_app;
-- A role allowed to read all settings.
CREATE ROLE outbox_tap_reader NOLOGIN IN ROLE pg_read_all_settings;
-- A monitoring role.
CREATE ROLE outbox_tap_monitor NOLOGIN IN ROLE pg_monitor;
GRANT USAGE ON SCHEMA ob TO outbox_tap_monitor;

SELECT plan(187);

-- Catalog: what PUBLIC and the roles were granted.

SELECT table_privs_are('ob', t, 'public', ARRAY[]::text[],
                       format('PUBLIC has no privilege on %s', t))
  FROM unnest(ARRAY['outbox', 'aggregate_publication', 'inbox', 'poison_policy',
                    'publisher_control', 'publisher_horizon', 'outbox_status',
                    'outbox_aggregate_status', 'outbox_pending', 'outbox_events']) AS t;
-- Whatever tables and views are added later.
SELECT is_empty($$SELECT c.relname, a.privilege_type
                    FROM pg_class c, aclexplode(c.relacl) a
                   WHERE c.relnamespace = 'ob'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'S')
                     AND a.grantee = 0$$,
                'no table, view or sequence of the extension has an ACL entry for PUBLIC');
SELECT is_empty($$SELECT relname FROM pg_class
                   WHERE relnamespace = 'ob'::regnamespace AND relkind IN ('r', 'v', 'm')
                     AND relacl IS NULL$$,
                'every table and view has an explicit ACL (default ACLs would not apply)');
SELECT is_empty($$SELECT oid::regprocedure FROM pg_proc
                   WHERE pronamespace = 'ob'::regnamespace
                     AND has_function_privilege('public', oid, 'EXECUTE')
                     AND proname <> 'uuid_v7'$$,
                'PUBLIC can execute no function of the extension but uuid_v7');
SELECT table_privs_are('ob', t, 'outbox_tap_app', ARRAY[]::text[],
                       format('the application role has no privilege on %s', t))
  FROM unnest(ARRAY['outbox', 'aggregate_publication', 'inbox', 'poison_policy',
                    'publisher_control', 'publisher_horizon', 'outbox_pending', 'outbox_events']) AS t;
SELECT table_privs_are('ob', t, 'pg_monitor', ARRAY[]::text[],
                       format('pg_monitor has no privilege on %s', t))
  FROM unnest(ARRAY['outbox', 'aggregate_publication', 'inbox', 'poison_policy',
                    'publisher_control', 'publisher_horizon', 'outbox_pending', 'outbox_events']) AS t;
SELECT table_privs_are('ob', t, 'pg_monitor', ARRAY['SELECT'],
                       format('pg_monitor can only SELECT from %s', t))
  FROM unnest(ARRAY['outbox_status', 'outbox_aggregate_status']) AS t;

SELECT function_privs_are('ob', 'outbox_emit',
                          ARRAY['text', 'text', 'text', 'jsonb', 'text', 'jsonb', 'text', 'bigint'],
                          'public', ARRAY[]::text[], 'PUBLIC cannot execute outbox_emit');
SELECT function_privs_are('ob', 'outbox_emit_raw',
                          ARRAY['text', 'text', 'text', t, 'text', 'jsonb', 'text', 'bigint'],
                          'public', ARRAY[]::text[], format('PUBLIC cannot execute outbox_emit_raw(.., %s, ..)', t))
  FROM unnest(ARRAY['text', 'bytea']) AS t;
SELECT function_privs_are('ob', 'outbox_emit_many', ARRAY['ob.outbox_event[]'],
                          'public', ARRAY[]::text[], 'PUBLIC cannot execute outbox_emit_many');
SELECT function_privs_are('ob', 'outbox_emit_many_raw', ARRAY[format('ob.outbox_event_%s[]', t)],
                          'public', ARRAY[]::text[], format('PUBLIC cannot execute outbox_emit_many_raw(outbox_event_%s[])', t))
  FROM unnest(ARRAY['text', 'bytea']) AS t;
SELECT function_privs_are('ob', 'inbox_claim', ARRAY['text', 'text'],
                          'public', ARRAY[]::text[], 'PUBLIC cannot execute inbox_claim');
SELECT function_privs_are('ob', 'outbox_counters', ARRAY[]::text[],
                          'public', ARRAY[]::text[], 'PUBLIC cannot execute outbox_counters');
SELECT function_privs_are('ob', 'outbox_latency_histogram', ARRAY[]::text[],
                          'public', ARRAY[]::text[], 'PUBLIC cannot execute outbox_latency_histogram');
SELECT function_privs_are('ob', 'outbox_test_fatal_error', ARRAY[]::text[],
                          'public', ARRAY[]::text[], 'PUBLIC cannot execute outbox_test_fatal_error');
SELECT function_privs_are('ob', 'outbox_catch_up', ARRAY['text'],
                          'public', ARRAY[]::text[], 'PUBLIC cannot execute outbox_catch_up');
SELECT function_privs_are('ob', 'uuid_v7', ARRAY[]::text[],
                          'public', ARRAY['EXECUTE'], 'PUBLIC can execute uuid_v7');
SELECT function_privs_are('ob', 'outbox_counters', ARRAY[]::text[],
                          'pg_monitor', ARRAY['EXECUTE'], 'pg_monitor can execute outbox_counters');
SELECT function_privs_are('ob', 'outbox_latency_histogram', ARRAY[]::text[],
                          'pg_monitor', ARRAY['EXECUTE'], 'pg_monitor can execute outbox_latency_histogram');
SELECT function_privs_are('ob', 'outbox_emit',
                          ARRAY['text', 'text', 'text', 'jsonb', 'text', 'jsonb', 'text', 'bigint'],
                          'pg_monitor', ARRAY[]::text[], 'pg_monitor cannot execute outbox_emit');

-- A role without grants.

-- Each statement an application might try directly on a table.
CREATE TEMP TABLE direct (t text, op text, stmt text, kind text DEFAULT 'table');
INSERT INTO direct (t, op, stmt)
SELECT t, op, format(s, t)
  FROM unnest(ARRAY['outbox', 'aggregate_publication', 'inbox', 'poison_policy',
                    'publisher_control', 'publisher_horizon']) AS t,
       (VALUES ('SELECT', 'SELECT * FROM ob.%I'),
               ('INSERT', 'INSERT INTO ob.%I DEFAULT VALUES'),
               ('UPDATE', 'UPDATE ob.%I SET last_error = NULL'),
               ('DELETE', 'DELETE FROM ob.%I'),
               ('TRUNCATE', 'TRUNCATE ob.%I')) AS v(op, s);
UPDATE direct SET stmt = 'UPDATE ob.inbox SET processed_at = now()'
 WHERE t = 'inbox' AND op = 'UPDATE';
UPDATE direct SET stmt = 'UPDATE ob.poison_policy SET policy = ''skip'''
 WHERE t = 'poison_policy' AND op = 'UPDATE';
UPDATE direct SET stmt = 'UPDATE ob.publisher_control SET paused = true'
 WHERE t = 'publisher_control' AND op = 'UPDATE';
UPDATE direct SET stmt = 'UPDATE ob.publisher_horizon SET updated_at = now()'
 WHERE t = 'publisher_horizon' AND op = 'UPDATE';
INSERT INTO direct VALUES
	('outbox_status', 'SELECT', 'SELECT * FROM ob.outbox_status', 'view'),
	('outbox_aggregate_status', 'SELECT', 'SELECT * FROM ob.outbox_aggregate_status', 'view'),
	('outbox_pending', 'SELECT', 'SELECT * FROM ob.outbox_pending', 'view'),
	('outbox_events', 'SELECT', 'SELECT * FROM ob.outbox_events', 'view');
-- The operator functions.
CREATE TEMP TABLE operator_calls (f text, stmt text);
INSERT INTO operator_calls VALUES
	('outbox_retry', $$SELECT ob.outbox_retry('o-1')$$),
	('outbox_skip', $$SELECT ob.outbox_skip('e-1')$$),
	('outbox_dead_letter', $$SELECT ob.outbox_dead_letter('e-1')$$),
	('outbox_replay', $$SELECT ob.outbox_replay('o-1', 1)$$),
	('outbox_pause', $$SELECT ob.outbox_pause()$$),
	('outbox_resume', $$SELECT ob.outbox_resume('o-1')$$),
	('outbox_lock_aggregate', $$SELECT ob.outbox_lock_aggregate('o-1')$$),
	('outbox_wake_on_commit', $$SELECT ob.outbox_wake_on_commit()$$),
	('outbox_test_fatal_error', $$SELECT ob.outbox_test_fatal_error()$$),
	('outbox_workers', $$SELECT * FROM ob.outbox_workers()$$),
	('outbox_publisher', $$SELECT * FROM ob.outbox_publisher()$$),
	('outbox_check_publisher', $$SELECT ob.outbox_check_publisher()$$),
	('outbox_catch_up', $$SELECT ob.outbox_catch_up('o-1')$$);
GRANT SELECT ON operator_calls TO PUBLIC;
GRANT SELECT ON direct TO PUBLIC;
-- The outbox settings a superuser sees.
CREATE TEMP TABLE superuser_settings AS
	SELECT name FROM pg_settings WHERE name LIKE 'outbox.%';
GRANT SELECT ON superuser_settings TO PUBLIC;

SET ROLE outbox_tap_app;

SELECT throws_ok($$SELECT ob.outbox_emit('order', 'o-1', 'Created', '{}')$$, '42501',
                 'permission denied for function outbox_emit',
                 'without a grant, outbox_emit is refused');
SELECT throws_ok($$SELECT * FROM ob.outbox_emit_many(ARRAY[ROW('order', 'o-1', 'Created', '{}',
                     NULL, NULL, NULL, NULL)::ob.outbox_event])$$, '42501',
                 'permission denied for function outbox_emit_many',
                 'without a grant, outbox_emit_many is refused');
SELECT throws_ok($$SELECT ob.outbox_emit_raw('order', 'o-1', 'Created', 'x')$$, '42501',
                 'permission denied for function outbox_emit_raw',
                 'without a grant, outbox_emit_raw is refused');
SELECT throws_ok($$SELECT * FROM ob.outbox_emit('order', 'o-1', 'Created', '{}', topic => 't',
                     headers => '{}', event_id => 'x', aggregate_version => 1)$$, '42501',
                 'permission denied for function outbox_emit',
                 'without a grant, outbox_emit with every argument is refused');
SELECT throws_ok($$SELECT ob.inbox_claim('billing', 'evt-1')$$, '42501',
                 'permission denied for function inbox_claim',
                 'without a grant, inbox_claim is refused');
SELECT throws_ok($$SELECT * FROM ob.outbox_counters()$$, '42501',
                 'permission denied for function outbox_counters',
                 'without a grant, outbox_counters is refused');
SELECT throws_ok($$SELECT * FROM ob.outbox_latency_histogram()$$, '42501',
                 'permission denied for function outbox_latency_histogram',
                 'without a grant, outbox_latency_histogram is refused');
SELECT throws_ok(stmt, '42501', format('permission denied for %s %s', kind, t),
                 format('without a grant, %s on %s is refused', op, t))
  FROM direct ORDER BY t, op;
SELECT throws_ok(stmt, '42501', format('permission denied for function %s', f),
                 format('without a grant, %s is refused', f))
  FROM operator_calls ORDER BY f;
SELECT lives_ok($$SELECT ob.uuid_v7()$$, 'uuid_v7 needs no grant');

-- outbox.kafka_properties is GUC_SUPERUSER_ONLY: PostgreSQL refuses to show
-- it to roles that are neither superuser nor members of
-- pg_read_all_settings, and leaves it out of pg_settings for them.  The
-- refusal's words are PostgreSQL's own, and changed in 17.
SELECT CASE WHEN current_setting('server_version_num')::int >= 170000
            THEN 'permission denied to examine'
            ELSE 'must be superuser or have privileges of pg_read_all_settings to examine'
       END AS refused_to_examine \gset
SELECT throws_ok($$SHOW outbox.kafka_properties$$, '42501',
                 :'refused_to_examine' || ' "outbox.kafka_properties"',
                 'SHOW outbox.kafka_properties is refused');
SELECT throws_ok($$SELECT current_setting('outbox.kafka_properties')$$, '42501',
                 :'refused_to_examine' || ' "outbox.kafka_properties"',
                 'current_setting(outbox.kafka_properties) is refused');
SELECT throws_ok($$SELECT current_setting('outbox.kafka_properties', true)$$, '42501',
                 :'refused_to_examine' || ' "outbox.kafka_properties"',
                 'current_setting(outbox.kafka_properties, missing_ok) is refused too');
SELECT is_empty($$SELECT * FROM pg_settings WHERE name = 'outbox.kafka_properties'$$,
                'pg_settings has no row for outbox.kafka_properties');
SELECT is_empty($$SELECT * FROM pg_show_all_settings() WHERE name = 'outbox.kafka_properties'$$,
                'pg_show_all_settings() has no row for outbox.kafka_properties');
SELECT throws_ok($$SHOW outbox.kafka_credentials_file$$, '42501',
                 :'refused_to_examine' || ' "outbox.kafka_credentials_file"',
                 'SHOW outbox.kafka_credentials_file is refused');
-- The other settings are visible: the row is hidden specifically.
SELECT set_eq($$SELECT name FROM pg_settings WHERE name LIKE 'outbox.%'$$,
              $$SELECT name FROM superuser_settings
                 WHERE name NOT IN ('outbox.kafka_properties', 'outbox.kafka_credentials_file',
                                    'outbox.inbox_kafka_properties', 'outbox.inbox_kafka_credentials_file')$$,
              'every other outbox setting is visible in pg_settings');
SELECT lives_ok($$SHOW outbox.brokers$$, 'SHOW outbox.brokers is allowed');
-- The setting cannot be changed at session level either.
SELECT throws_ok($$SELECT set_config('outbox.kafka_properties', 'a=b', false)$$, '55P02', NULL,
                 'set_config(outbox.kafka_properties) is refused');

RESET ROLE;

-- Superusers see it; so do members of pg_read_all_settings (PostgreSQL's
-- rule for GUC_SUPERUSER_ONLY).
SELECT lives_ok($$SHOW outbox.kafka_properties$$, 'a superuser can SHOW outbox.kafka_properties');
SELECT is((SELECT count(*) FROM pg_settings WHERE name = 'outbox.kafka_properties'), 1::bigint,
          'a superuser sees outbox.kafka_properties in pg_settings');
SELECT is((SELECT context FROM pg_settings WHERE name = 'outbox.kafka_properties'), 'sighup',
          'outbox.kafka_properties is a sighup setting');
SET ROLE outbox_tap_reader;
SELECT lives_ok($$SHOW outbox.kafka_properties$$, 'a pg_read_all_settings member can SHOW it');
SELECT is((SELECT count(*) FROM pg_settings WHERE name = 'outbox.kafka_properties'), 1::bigint,
          'a pg_read_all_settings member sees it in pg_settings');
RESET ROLE;

-- pg_monitor can read the counters.
SET ROLE outbox_tap_monitor;
SELECT lives_ok($$SELECT * FROM ob.outbox_counters()$$, 'a pg_monitor member can read the counters');
SELECT lives_ok($$SELECT * FROM ob.outbox_latency_histogram()$$, 'a pg_monitor member can read the histogram');
SELECT lives_ok($$SELECT * FROM ob.outbox_workers()$$, 'a pg_monitor member can list the workers');
SELECT lives_ok($$SELECT * FROM ob.outbox_publisher()$$, 'a pg_monitor member can see the publisher state');
SELECT lives_ok($$SELECT * FROM ob.outbox_status$$, 'a pg_monitor member can read outbox_status');
SELECT lives_ok($$SELECT * FROM ob.outbox_aggregate_status$$,
                'a pg_monitor member can read outbox_aggregate_status');
SELECT throws_ok($$SELECT * FROM ob.outbox_pending$$, '42501', 'permission denied for view outbox_pending',
                 'a pg_monitor member cannot read outbox_pending (payloads)');
SELECT throws_ok($$SELECT * FROM ob.outbox$$, '42501', 'permission denied for table outbox',
                 'a pg_monitor member cannot read the outbox itself');
SELECT throws_ok($$SELECT * FROM ob.outbox_events$$, '42501', 'permission denied for view outbox_events',
                 'a pg_monitor member cannot read outbox_events (every payload)');
SELECT throws_ok($$SELECT * FROM ob.publisher_horizon$$, '42501', 'permission denied for table publisher_horizon',
                 'a pg_monitor member cannot read publisher_horizon');
SELECT throws_ok($$SELECT ob.outbox_catch_up('o-1')$$, '42501',
                 'permission denied for function outbox_catch_up',
                 'a pg_monitor member cannot call outbox_catch_up');
SELECT throws_ok($$SELECT ob.outbox_emit('order', 'o-1', 'Created', '{}')$$, '42501',
                 'permission denied for function outbox_emit',
                 'a pg_monitor member cannot emit');
RESET ROLE;

-- EXECUTE granted: the role can emit and claim, through the functions only.

GRANT EXECUTE ON FUNCTION ob.outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint)
	TO outbox_tap_app;
GRANT EXECUTE ON FUNCTION ob.inbox_claim(text, text) TO outbox_tap_app;

-- Traps: objects with the names outbox_emit and inbox_claim use (max over
-- bigint, = on text), in a schema the caller puts before pg_catalog.  Each
-- logs its call and returns a wrong answer: were one called, versions would
-- be wrong (max gives 1000; = matches every aggregate) or inbox_claim would
-- think its arguments empty.  Nothing has called outbox_emit in this session
-- yet, so its plans are prepared with the traps in place.
CREATE SCHEMA evil;
CREATE TABLE evil.trap_log (trap text NOT NULL);
GRANT USAGE ON SCHEMA evil TO PUBLIC;
GRANT INSERT, SELECT ON evil.trap_log TO PUBLIC;
CREATE FUNCTION evil.trap_max_step(state bigint, value bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO evil.trap_log VALUES ('max');
	RETURN 1000;
END
$$;
CREATE AGGREGATE evil.max(bigint) (SFUNC = evil.trap_max_step, STYPE = bigint);
CREATE FUNCTION evil.trap_text_eq(a text, b text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO evil.trap_log VALUES ('=');
	RETURN true;
END
$$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.trap_text_eq);

-- Everything under the trapping search_path goes into temp tables, so that
-- the assertions (pgTAP's own functions compare text with =) run with the
-- normal search_path.
CREATE TEMP TABLE control (what text, result text);
CREATE TEMP TABLE emitted (n int, aggregate_id text, version bigint, topic text);
CREATE TEMP TABLE claimed (n int, claimed boolean);
GRANT ALL ON control, emitted, claimed TO PUBLIC;

SET ROLE outbox_tap_app;
SET search_path = evil, pg_catalog, ob, public, pg_temp;
-- Control: the traps do catch unqualified names under this search_path.
INSERT INTO control
	SELECT 'max', max(v)::text FROM (VALUES (1::bigint), (2::bigint)) AS t(v);
INSERT INTO control
	SELECT 'eq', ('a'::text = 'b'::text)::text;
RESET search_path;
SELECT results_eq($$SELECT what, result FROM control ORDER BY what$$,
                  $$VALUES ('eq', 'true'), ('max', '1000')$$,
                  'control: under the trapping search_path, max(bigint) and text = text are the traps');
SELECT is((SELECT string_agg(DISTINCT trap, ' ' ORDER BY trap) FROM evil.trap_log), '= max',
          'control: both traps logged their calls');
RESET ROLE;
TRUNCATE evil.trap_log;

SET ROLE outbox_tap_app;
SET search_path = evil, pg_catalog, ob, public, pg_temp;
INSERT INTO emitted
	SELECT n, 'o-' || (n % 2), e.aggregate_version, e.topic
	  FROM generate_series(1, 6) AS n,
	       LATERAL ob.outbox_emit('order', 'o-' || (n % 2), 'E', jsonb_build_object('n', n)) AS e;
INSERT INTO claimed VALUES (1, ob.inbox_claim('billing', 'evt-1'));
INSERT INTO claimed VALUES (2, ob.inbox_claim('billing', 'evt-1'));
RESET search_path;

SELECT results_eq($$SELECT n, aggregate_id, version FROM emitted ORDER BY n$$,
                  $$VALUES (1, 'o-1', 1::bigint), (2, 'o-0', 1::bigint), (3, 'o-1', 2::bigint),
                           (4, 'o-0', 2::bigint), (5, 'o-1', 3::bigint), (6, 'o-0', 3::bigint)$$,
                  'with EXECUTE and a trapping search_path, outbox_emit assigns the right versions');
SELECT results_eq($$SELECT claimed FROM claimed ORDER BY n$$, $$VALUES (true), (false)$$,
                  'with EXECUTE and a trapping search_path, inbox_claim claims once');
SELECT is((SELECT count(*) FROM evil.trap_log), 0::bigint,
          'no trap was called by outbox_emit or inbox_claim');

-- The same role, with its own normal search_path, emits and claims too.
SELECT is((SELECT aggregate_version FROM ob.outbox_emit('order', 'o-1', 'E', '{}')), 4::bigint,
          'the granted role emits with the default search_path');
SELECT is(ob.inbox_claim('shipping', 'evt-1'), true, 'the granted role claims');

-- ... and the rows are owned by the extension's tables, which it still
-- cannot touch directly.
SELECT throws_ok(stmt, '42501', format('permission denied for %s %s', kind, t),
                 format('with EXECUTE only, %s on %s is still refused', op, t))
  FROM direct ORDER BY t, op;
SELECT throws_ok($$SELECT * FROM ob.outbox_counters()$$, '42501',
                 'permission denied for function outbox_counters',
                 'EXECUTE on outbox_emit does not give the counters');
SELECT throws_ok(stmt, '42501', format('permission denied for function %s', f),
                 format('EXECUTE on outbox_emit does not give %s', f))
  FROM operator_calls ORDER BY f;
RESET ROLE;
SELECT is((SELECT count(*) FROM ob.outbox), 7::bigint,
          'the seven events emitted by the application role are in the outbox');
SELECT is((SELECT count(*) FROM ob.inbox), 2::bigint,
          'the two claims of the application role are in the inbox');

-- outbox_emit is not SECURITY DEFINER: it switches to the outbox's owner
-- for the write only.  A trigger on the outbox (its owner's) runs as the
-- owner; the caller is itself again after the call, and after a failed one
-- caught in a subtransaction.
CREATE FUNCTION evil.note_user() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO evil.trap_log VALUES ('user ' || current_user);
	RETURN NEW;
END
$$;
CREATE TRIGGER note_user BEFORE INSERT ON ob.outbox FOR EACH ROW EXECUTE FUNCTION evil.note_user();
TRUNCATE evil.trap_log;
SET ROLE outbox_tap_app;
INSERT INTO control SELECT 'after emit', current_user || ' ' || e.aggregate_version
  FROM ob.outbox_emit('order', 'o-trigger', 'E', '{}') AS e;
DO $$
BEGIN
	PERFORM ob.outbox_emit('order', 'o-trigger', 'E', '{}', event_id => 'dup-id');
	PERFORM ob.outbox_emit('order', 'o-trigger', 'E', '{}', event_id => 'dup-id');
EXCEPTION WHEN unique_violation THEN
	INSERT INTO control VALUES ('after failed emit', current_user);
END
$$;
RESET ROLE;
DROP TRIGGER note_user ON ob.outbox;
SELECT is((SELECT string_agg(trap, ', ') FROM evil.trap_log),
          'user ' || (SELECT pg_get_userbyid(relowner)::text COLLATE "default" FROM pg_class
                       WHERE oid = 'ob.outbox'::regclass),
          'a trigger on the outbox runs as the outbox''s owner during outbox_emit');
SELECT results_eq($$SELECT what, result FROM control WHERE what LIKE 'after%' ORDER BY what$$,
                  $$VALUES ('after emit', 'outbox_tap_app 1'), ('after failed emit', 'outbox_tap_app')$$,
                  'the caller is its own role again after outbox_emit, and after a failed one');

-- Revoking the grant takes the ability away again.
REVOKE EXECUTE ON FUNCTION ob.outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint)
	FROM outbox_tap_app;
SET ROLE outbox_tap_app;
SELECT throws_ok($$SELECT ob.outbox_emit('order', 'o-1', 'Created', '{}')$$, '42501',
                 'permission denied for function outbox_emit',
                 'after REVOKE, outbox_emit is refused again');
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
