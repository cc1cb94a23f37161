-- Install-time hijack: a database owner who is not a superuser owns the
-- schema the extension goes into (in PG15 the owner owns public) and plants
-- functions, aggregates and operators there, each at least as good a match
-- as pg_catalog's for a call the install script makes.  A superuser then
-- runs CREATE EXTENSION and uses every table, view and function.  A trap
-- that fires records the role it ran as; none may fire.
--
-- Everything is rolled back: nothing is left in the (shared) cluster.
BEGIN;
CREATE ROLE outbox_tap_owner NOLOGIN;
CREATE SCHEMA trap AUTHORIZATION outbox_tap_owner;

SET ROLE outbox_tap_owner;
CREATE TABLE trap.fired (what text, run_as name DEFAULT current_user);
GRANT INSERT ON trap.fired TO PUBLIC;
CREATE FUNCTION trap.sprung(what text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO trap.fired (what) VALUES (what);
END
$$;

-- A trap: trap.fname(args) RETURNS result, recording label when called;
-- then then_sql, if given (the aggregate or operator that calls it).
CREATE FUNCTION pg_temp.plant_trap(fname text, args text, result text, label text,
								   then_sql text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE format('CREATE FUNCTION trap.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
				   fname, args, result,
				   format('BEGIN PERFORM trap.sprung(%L); RETURN%s; END', label,
						  CASE WHEN result = 'void' THEN '' ELSE ' NULL' END));
	IF then_sql IS NOT NULL THEN
		EXECUTE then_sql;
	END IF;
END
$$;

-- Functions: name, argument types, result type.
CREATE TEMP TABLE trap_functions (name text, args text, result text);
INSERT INTO trap_functions VALUES
	('num_nonnulls', 'text, text', 'integer'),
	('clock_timestamp', '', 'timestamptz'),
	('now', '', 'timestamptz'),
	('replace', 'text, text, text', 'text'),
	('format', 'text, text', 'text'),
	('format', 'text, bigint', 'text'),
	('format', 'text, text, text', 'text'),
	('jsonb_build_object', 'text, text, text, bigint, text, timestamptz, text, text', 'jsonb'),
	('to_jsonb', 'record', 'jsonb'),
	('pg_extension_config_dump', 'text, text', 'void'),
	('hashtext', 'text', 'integer'),
	('pg_current_xact_id', '', 'xid8'),
	('pg_snapshot_xmin', 'pg_snapshot', 'xid8'),
	('text', 'uuid', 'text');
DO $$ BEGIN PERFORM pg_temp.plant_trap(name, args, result, name) FROM trap_functions; END $$;

-- Aggregates: name, argument type, result type.
CREATE FUNCTION trap.agg_step0(state bigint) RETURNS bigint
LANGUAGE plpgsql AS $$ BEGIN PERFORM trap.sprung('count(*)'); RETURN 0; END $$;
CREATE AGGREGATE trap.count(*) (SFUNC = trap.agg_step0, STYPE = bigint);
CREATE TEMP TABLE trap_aggregates (name text, arg text, result text);
INSERT INTO trap_aggregates VALUES
	('count', 'text', 'bigint'), ('min', 'bigint', 'bigint'), ('min', 'timestamptz', 'timestamptz'),
	('max', 'bigint', 'bigint'), ('max', 'integer', 'integer'), ('array_agg', 'text', 'text[]'),
	('jsonb_agg', 'jsonb', 'jsonb');
DO $$
BEGIN
	PERFORM pg_temp.plant_trap('step_' || n, result || ', ' || arg, result, name || '(' || arg || ')',
							   format('CREATE AGGREGATE trap.%I(%s) (SFUNC = trap.step_%s, STYPE = %s)',
									  name, arg, n, result))
	  FROM (SELECT *, row_number() OVER () AS n FROM trap_aggregates) a;
END
$$;

-- Operators: name, left and right types, result type.
CREATE TEMP TABLE trap_operators (op text, l text, r text, result text);
INSERT INTO trap_operators VALUES
	('=', 'text', 'text', 'boolean'), ('<>', 'text', 'text', 'boolean'),
	('||', 'text', 'text', 'text'), ('||', 'text', 'bigint', 'text'),
	('=', 'bigint', 'bigint', 'boolean'), ('<', 'bigint', 'bigint', 'boolean'),
	('>', 'bigint', 'bigint', 'boolean'), ('<=', 'bigint', 'bigint', 'boolean'),
	('>=', 'bigint', 'bigint', 'boolean'), ('-', 'bigint', 'bigint', 'bigint'),
	('+', 'bigint', 'bigint', 'bigint'), ('-', 'bigint', 'integer', 'bigint'),
	('+', 'bigint', 'integer', 'bigint'), ('>', 'bigint', 'integer', 'boolean'),
	('<', 'bigint', 'integer', 'boolean'), ('=', 'bigint', 'integer', 'boolean'),
	('=', 'integer', 'integer', 'boolean'), ('>', 'integer', 'integer', 'boolean'),
	('>=', 'integer', 'integer', 'boolean'), ('+', 'integer', 'integer', 'integer'),
	('>', 'timestamptz', 'timestamptz', 'boolean'), ('<', 'timestamptz', 'timestamptz', 'boolean'),
	('-', 'timestamptz', 'timestamptz', 'interval'), ('=', 'boolean', 'boolean', 'boolean'),
	-- An enum compared with a literal: a better match than anyenum = anyenum.
	('=', 'anyenum', 'text', 'boolean'), ('<>', 'anyenum', 'text', 'boolean'),
	('=', 'text', 'text[]', 'boolean'), ('=', 'name', 'name', 'boolean'),
	('>=', 'xid8', 'xid8', 'boolean'), ('<', 'xid8', 'xid8', 'boolean');
DO $$
BEGIN
	PERFORM pg_temp.plant_trap('op_' || n, l || ', ' || r, result, l || ' ' || op || ' ' || r,
							   format('CREATE OPERATOR trap.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = trap.op_%s)',
									  op, l, r, n))
	  FROM (SELECT *, row_number() OVER () AS n FROM trap_operators) o;
END
$$;
RESET ROLE;

SELECT plan(12);

-- Control: the traps are better matches than pg_catalog's.  An unqualified
-- num_nonnulls in a CHECK, bound under the search_path CREATE EXTENSION
-- uses, runs the owner's function as the superuser who inserts.
SET search_path = trap;
CREATE TEMP TABLE control_check (a text, b text, CHECK (num_nonnulls(a, b) = 1));
INSERT INTO control_check VALUES ('x', NULL);
RESET search_path;
SELECT results_eq($$SELECT what, run_as::text FROM trap.fired$$,
                  $$VALUES ('num_nonnulls', current_user::text)$$,
                  'control: an unqualified num_nonnulls in a CHECK runs the planted function as the inserting superuser');
DROP TABLE control_check;
DELETE FROM trap.fired;

CREATE EXTENSION outbox SCHEMA trap;

-- Control: an enum compared with a literal would take the planted operator.
SET search_path = trap;
CREATE TEMP TABLE control_enum AS SELECT 'published'::outbox_disposition = 'skipped' AS eq;
RESET search_path;
SELECT is((SELECT string_agg(what, ',') FROM trap.fired), 'anyenum = text',
          'control: an unqualified enum = literal takes the planted operator');
DROP TABLE control_enum;
DELETE FROM trap.fired;

-- Nothing the extension created depends on a planted object.
SELECT is_empty($$
	SELECT pg_describe_object(d.classid, d.objid, d.objsubid) AS extension_object,
	       pg_describe_object(d.refclassid, d.refobjid, 0) AS planted
	  FROM pg_depend d
	  JOIN pg_proc p ON d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid
	 WHERE p.proowner = 'outbox_tap_owner'::regrole
	   AND d.classid NOT IN ('pg_proc'::regclass, 'pg_operator'::regclass)
	UNION ALL
	SELECT pg_describe_object(d.classid, d.objid, d.objsubid),
	       pg_describe_object(d.refclassid, d.refobjid, 0)
	  FROM pg_depend d
	  JOIN pg_operator o ON d.refclassid = 'pg_operator'::regclass AND o.oid = d.refobjid
	 WHERE o.oprowner = 'outbox_tap_owner'::regrole
	   AND d.classid NOT IN ('pg_proc'::regclass, 'pg_operator'::regclass)$$,
	'no constraint, default, index or view of the extension uses a planted function or operator');
SELECT is_empty($$SELECT what FROM trap.fired$$, 'CREATE EXTENSION ran no trap');

-- Use every table, view and function, as the superuser.
INSERT INTO trap.poison_policy (topic, policy) VALUES ('payments', 'dead_letter');
INSERT INTO trap.poison_policy (aggregate_type, policy) VALUES ('order', 'skip');
SELECT throws_ok($$INSERT INTO trap.poison_policy (topic, aggregate_type, policy) VALUES ('t', 'a', 'skip')$$,
                 '23514', NULL, 'poison_policy still refuses a row with both keys');
SELECT throws_ok($$INSERT INTO trap.poison_policy (topic, policy) VALUES ('t', 'ignore')$$,
                 '23514', NULL, 'poison_policy still refuses an unknown policy');
SELECT ok((SELECT count(*) FROM (
	SELECT trap.outbox_emit('order', 'o-' || (n % 2), 'E', jsonb_build_object('n', n),
	                        event_id => 'e-' || n)
	  FROM generate_series(1, 8) n) e) = 8, 'outbox_emit wrote eight events');
SELECT trap.outbox_emit('order', 'o-2', 'E', NULL, topic => 'payments', aggregate_version => 10);
SELECT trap.inbox_claim('billing', 'e-1'), trap.inbox_claim('billing', 'e-1');
INSERT INTO trap.inbox_consumer (consumer, role) VALUES ('shipping', current_user);
SELECT trap.inbox_claim('shipping', 'e-1');
INSERT INTO trap.aggregate_publication (aggregate_id, blocked_version, blocked_at)
	VALUES ('o-1', 1, clock_timestamp());
SELECT trap.outbox_retry('o-1');
SELECT trap.outbox_skip('e-1', 'hijack test');
SELECT trap.outbox_dead_letter('e-3');
SELECT trap.outbox_pause('o-0'), trap.outbox_resume('o-0');
SELECT trap.outbox_pause(), trap.outbox_resume();
-- Published as the publisher records it, under a horizon (so that both
-- parts of outbox_pending run).
INSERT INTO trap.aggregate_publication AS p (aggregate_id, last_published_version)
	VALUES ('o-0', 4)
	ON CONFLICT (aggregate_id) DO UPDATE
	SET last_published_version = GREATEST(p.last_published_version, excluded.last_published_version);
INSERT INTO trap.publisher_horizon (worker, snapshot, updated_at)
	VALUES (1, pg_current_snapshot(), clock_timestamp());
SELECT trap.outbox_replay('o-0', 1);
SELECT trap.outbox_catch_up('o-2');
SELECT * FROM trap.outbox_pending;
SELECT * FROM trap.outbox_events;
SELECT trap.outbox_replay('o-2', 1);
SELECT * FROM trap.outbox_status;
SELECT * FROM trap.outbox_aggregate_status;
SELECT count(*) FROM trap.outbox WHERE disposition IN ('skipped', 'dead_lettered');
SELECT * FROM trap.outbox_counters();
SELECT * FROM trap.outbox_latency_histogram();
SELECT * FROM trap.outbox_workers();
SELECT trap.uuid_v7();
SELECT throws_ok($$SELECT trap.outbox_test_fatal_error()$$, '55000', NULL,
                 'outbox_test_fatal_error is refused without the test hooks');
UPDATE trap.publisher_control SET paused = false;
SELECT results_eq($$SELECT aggregate_id, state FROM trap.outbox_aggregate_status ORDER BY aggregate_id$$,
                  $$VALUES ('o-0', 'pending'), ('o-1', 'pending'), ('o-2', 'pending')$$,
                  'the status view still joins both sides');

SELECT is_empty($$SELECT what, run_as FROM trap.fired$$,
                'no planted function, aggregate or operator ran');
SELECT is((SELECT count(*) FROM trap.outbox), 9::bigint, 'every event is in the outbox');
SELECT is((SELECT string_agg(event_id, ',' ORDER BY event_id) FROM trap.outbox_pending WHERE event_id LIKE 'e-%'),
          'e-2,e-3,e-4,e-5,e-6,e-7,e-8', 'outbox_pending lists all but the skipped event');

SELECT * FROM finish();
ROLLBACK;
