-- The paths that make outbox_emit cheap keep its guarantees: the version a
-- transaction assigned last is reused only while its row is there, the
-- outbox's indexes (their descriptions kept per session) get every row,
-- and a full lock table is reported as such.
SET search_path = ob, public;
\set SHOW_CONTEXT never
CREATE EXTENSION amcheck;
-- regress.try(stmt), from 00_setup.sql: 'ok', or the error's SQLSTATE,
-- message, detail and hint.
-- Every index of the outbox has exactly the rows it should.
CREATE FUNCTION pg_temp.indexes_complete() RETURNS text LANGUAGE sql AS $$
	SELECT string_agg(i.indexrelid::regclass::text, ', ' ORDER BY i.indexrelid::regclass::text)
	       || ': ' || bool_and(bt_index_check(i.indexrelid, true) IS NOT NULL)
	  FROM pg_index i WHERE i.indrelid = 'ob.outbox'::regclass
$$;

-- Many events of one aggregate in one transaction: consecutive versions,
-- over several index pages, then the next call continues.
BEGIN;
SELECT count(*), min(aggregate_version), max(aggregate_version),
       count(DISTINCT aggregate_version) AS distinct_versions
  FROM outbox_emit_many((SELECT array_agg(ROW('order', 'batch-1', 'E', jsonb_build_object('i', i),
                                              NULL, NULL, NULL, NULL)::outbox_event ORDER BY i)
                         FROM generate_series(1, 1500) i));
SELECT aggregate_version FROM outbox_emit('order', 'batch-1', 'E', '{}');
SELECT aggregate_version FROM outbox_emit('order', 'batch-1', 'E', '{}', aggregate_version => 1510);
SELECT regress.try($$SELECT outbox_emit('order', 'batch-1', 'E', '{}', aggregate_version => 1510)$$);
COMMIT;
SELECT count(*), max(aggregate_version) FROM outbox WHERE aggregate_id = 'batch-1';

-- One statement calling outbox_emit for each row, two aggregates in turn.
SELECT string_agg(e.aggregate_id || ':' || e.aggregate_version, ' ' ORDER BY g)
  FROM generate_series(1, 6) g,
       LATERAL (SELECT 'turn-' || (g % 2) AS aggregate_id,
                       (outbox_emit('order', 'turn-' || (g % 2), 'E', '{}')).aggregate_version) e;

-- The row of the last version is deleted in the same transaction (the
-- outbox's owner can): the version is looked up again, not reused.
BEGIN;
SELECT aggregate_version FROM outbox_emit('order', 'deleted-1', 'A', '{}');
SELECT aggregate_version FROM outbox_emit('order', 'deleted-1', 'B', '{}');
DELETE FROM outbox WHERE aggregate_id = 'deleted-1' AND aggregate_version = 2;
SELECT aggregate_version FROM outbox_emit('order', 'deleted-1', 'C', '{}');
COMMIT;
SELECT aggregate_version, event_type FROM outbox WHERE aggregate_id = 'deleted-1' ORDER BY 1;

-- A truncated outbox starts again at 1, in the same transaction too.
BEGIN;
SELECT aggregate_version FROM outbox_emit('order', 'truncated-1', 'A', '{}');
TRUNCATE outbox;
SELECT aggregate_version FROM outbox_emit('order', 'truncated-1', 'B', '{}');
ROLLBACK;

-- A savepoint rolled back after the aggregate's first event of the
-- transaction: the next one gets the version the rolled-back one had.
BEGIN;
SAVEPOINT s;
SELECT aggregate_version FROM outbox_emit('order', 'sp-1', 'A', '{}');
ROLLBACK TO s;
SELECT aggregate_version FROM outbox_emit('order', 'sp-1', 'B', '{}');
SELECT aggregate_version FROM outbox_emit('order', 'sp-1', 'C', '{}');
COMMIT;
SELECT aggregate_version, event_type FROM outbox WHERE aggregate_id = 'sp-1' ORDER BY 1;

-- Every index has every row, including the partial ones and indexes
-- created after this session's first emit (plain, partial, expression).
SELECT pg_temp.indexes_complete();
CREATE INDEX outbox_test_type_idx ON outbox (event_type);
CREATE INDEX outbox_test_partial_idx ON outbox (aggregate_id) WHERE event_type = 'Special';
CREATE INDEX outbox_test_expr_idx ON outbox (lower(event_type));
SELECT count(*) FROM (SELECT outbox_emit('order', 'idx-' || (g % 3), CASE WHEN g % 2 = 0 THEN 'Special' ELSE 'Plain' END, '{}')
                        FROM generate_series(1, 40) g) e;
SELECT count(*) FROM outbox_emit_many((SELECT array_agg(ROW('order', 'idx-many', 'Special', '{}'::jsonb,
                                                            NULL, NULL, NULL, NULL)::outbox_event)
                                       FROM generate_series(1, 10)));
SELECT pg_temp.indexes_complete();
SET enable_seqscan = off;
SELECT count(*) AS special FROM outbox WHERE event_type = 'Special' AND aggregate_id LIKE 'idx-%';
SELECT count(*) AS plain FROM outbox WHERE lower(event_type) = 'plain';
RESET enable_seqscan;
DROP INDEX outbox_test_type_idx, outbox_test_partial_idx, outbox_test_expr_idx;
SELECT aggregate_version FROM outbox_emit('order', 'idx-after-drop', 'E', '{}');
SELECT pg_temp.indexes_complete();

-- A trigger on the outbox that emits itself, to the same aggregate: its
-- event is the last one, and the relations its firing opened are closed
-- (no relcache reference leak warning).
CREATE FUNCTION pg_temp.echo() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.event_type = 'Echo' THEN
		PERFORM outbox_emit('order', NEW.aggregate_id, 'EchoReply', '{}');
	END IF;
	RETURN NULL;
END
$$;
CREATE TRIGGER echo AFTER INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION pg_temp.echo();
BEGIN;
SELECT aggregate_version FROM outbox_emit('order', 'echo-1', 'Echo', '{}');
SELECT aggregate_version FROM outbox_emit('order', 'echo-1', 'After', '{}');
COMMIT;
SELECT aggregate_version, event_type FROM outbox WHERE aggregate_id = 'echo-1' ORDER BY 1;
DROP TRIGGER echo ON outbox;

-- A transaction that emits to more aggregates than the lock table holds
-- (each stays locked until commit) gets an error that says so (53200),
-- and nothing is written.  On PostgreSQL 18 another lock request of the
-- statement may find the table full first: the server's own 53200 then
-- (08_emit_paths_1.out).
SELECT regexp_replace(regress.try($$
	SELECT count(*) FROM outbox_emit_many((SELECT array_agg(ROW('order', 'lockfill-' || i, 'E', '{}'::jsonb,
	                                                            NULL, NULL, NULL, NULL)::outbox_event)
	                                       FROM generate_series(1, 200000) i))$$),
	'"lockfill-[0-9]+"', '"lockfill-N"');
SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'lockfill-%';
