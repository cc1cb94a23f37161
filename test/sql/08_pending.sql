-- outbox_pending: an event is pending until its aggregate's progress
-- (last_published_version) covers it or it is dead-lettered or skipped.
-- No publisher runs here: progress and horizons are written by hand, as the
-- publisher writes them.
SET search_path = ob, public;
\set SHOW_CONTEXT never
TRUNCATE outbox, aggregate_publication, publisher_horizon;

-- regress.publish(agg, v), from 00_setup.sql, records progress as the publisher does.

-- The pending versions of an aggregate, '-' if none.
CREATE FUNCTION pg_temp.pending(agg text) RETURNS text LANGUAGE sql AS $$
	SELECT coalesce(string_agg(q.aggregate_version::text, ',' ORDER BY q.aggregate_version), '-')
	  FROM ob.outbox_pending q WHERE q.aggregate_id = agg
$$;

-- The view has exactly the columns of outbox.
SELECT (SELECT array_agg(attname::text || ':' || atttypid::regtype ORDER BY attnum) FROM pg_attribute
         WHERE attrelid = 'outbox_pending'::regclass AND attnum > 0)
     = (SELECT array_agg(attname::text || ':' || atttypid::regtype ORDER BY attnum) FROM pg_attribute
         WHERE attrelid = 'outbox'::regclass AND attnum > 0 AND NOT attisdropped) AS same_columns;

-- Pending until the aggregate's progress covers it; progress never goes back.
SELECT aggregate_version FROM outbox_emit('order', 'p-1', 'A', '{}');
SELECT aggregate_version FROM outbox_emit('order', 'p-1', 'B', '{}');
SELECT aggregate_version FROM outbox_emit('order', 'p-1', 'C', '{}');
SELECT pg_temp.pending('p-1');
SELECT regress.publish('p-1', 2);
SELECT pg_temp.pending('p-1');
SELECT regress.publish('p-1', 1);
SELECT pg_temp.pending('p-1');
SELECT regress.publish('p-1', 3);
SELECT pg_temp.pending('p-1');

-- A dead-lettered (by the publisher) or skipped event is not pending; the
-- events after it still are, and the status views count from outbox_pending.
SELECT aggregate_version FROM outbox_emit('order', 'p-2', 'A', '{}', event_id => 'p-2-a');
SELECT aggregate_version FROM outbox_emit('order', 'p-2', 'B', '{}', event_id => 'p-2-b');
SELECT aggregate_version FROM outbox_emit('order', 'p-2', 'C', '{}', event_id => 'p-2-c');
UPDATE outbox SET disposition = 'dead_lettered', disposed_at = now(), attempts = 1
 WHERE event_id = 'p-2-a';
SELECT pg_temp.pending('p-2');
SELECT outbox_skip('p-2-b');
SELECT pg_temp.pending('p-2');
SELECT last_published_version, catch_up FROM aggregate_publication WHERE aggregate_id = 'p-2';
SELECT aggregate_id, aggregate_version, state FROM outbox_events ORDER BY 1, 2;
SELECT pending_events, pending_aggregates, dead_lettered_events, skipped_events FROM outbox_status;
SELECT aggregate_id, last_published_version, pending_events, state
  FROM outbox_aggregate_status ORDER BY 1;

-- outbox_replay(agg, v): the events from v on are pending again, whatever
-- settled them, and the publisher reads the aggregate by index (catch_up).
SELECT regress.publish('p-2', 3);
UPDATE aggregate_publication SET catch_up = false WHERE aggregate_id = 'p-2';
SELECT pg_temp.pending('p-2');
SELECT outbox_replay('p-2', 2);
SELECT pg_temp.pending('p-2');
SELECT aggregate_version, disposition, disposed_at IS NOT NULL AS disposed FROM outbox WHERE aggregate_id = 'p-2' ORDER BY 1;
SELECT last_published_version, catch_up FROM aggregate_publication WHERE aggregate_id = 'p-2';

-- outbox_resume(agg): what was emitted while paused is read by index.
SELECT outbox_pause('p-2');
UPDATE aggregate_publication SET catch_up = false WHERE aggregate_id = 'p-2';
SELECT outbox_resume('p-2');
SELECT paused, catch_up FROM aggregate_publication WHERE aggregate_id = 'p-2';

-- The publisher horizon: every event its snapshot sees is settled or of an
-- aggregate read by index.  So an event older than the oldest horizon's
-- xmin is pending only if its aggregate is listed (paused, blocked, backing
-- off or catch_up); newer ones are pending by progress alone.
TRUNCATE outbox, aggregate_publication;
SELECT aggregate_version FROM outbox_emit('order', 'h-1', 'A', '{}');
SELECT aggregate_version FROM outbox_emit('order', 'h-2', 'A', '{}', event_id => 'h-2-a');
SELECT aggregate_version FROM outbox_emit('order', 'h-2', 'B', '{}', event_id => 'h-2-b');
INSERT INTO publisher_horizon (worker, snapshot, updated_at) VALUES (1, pg_current_snapshot(), now());
SELECT aggregate_version FROM outbox_emit('order', 'h-3', 'A', '{}');
-- (The premise: h-1 and h-2 are older than the horizon, h-3 is not.)
SELECT o.aggregate_id, bool_and(o.txid < pg_snapshot_xmin(h.snapshot)) AS before_horizon
  FROM outbox o, publisher_horizon h GROUP BY 1 ORDER BY 1;
SELECT pg_temp.pending('h-1') AS h1, pg_temp.pending('h-2') AS h2, pg_temp.pending('h-3') AS h3;
-- Each way of listing h-2 makes its old events pending, progress still counts.
SELECT outbox_catch_up('h-2');
SELECT pg_temp.pending('h-2') AS catch_up;
UPDATE aggregate_publication SET catch_up = false, paused = true WHERE aggregate_id = 'h-2';
SELECT pg_temp.pending('h-2') AS paused;
UPDATE aggregate_publication SET paused = false, blocked_version = 1, blocked_at = now() WHERE aggregate_id = 'h-2';
SELECT pg_temp.pending('h-2') AS blocked;
UPDATE aggregate_publication SET blocked_version = NULL, blocked_at = NULL, next_attempt_at = now()
 WHERE aggregate_id = 'h-2';
SELECT pg_temp.pending('h-2') AS backing_off;
SELECT regress.publish('h-2', 1);
SELECT pg_temp.pending('h-2') AS progress_1;
UPDATE aggregate_publication SET next_attempt_at = NULL WHERE aggregate_id = 'h-2';
SELECT pg_temp.pending('h-2') AS not_listed;
-- A listed aggregate's disposed event is not pending either.
SELECT outbox_catch_up('h-2');
SELECT pg_temp.pending('h-2');
SELECT outbox_skip('h-2-b');
SELECT pg_temp.pending('h-2');
-- A listed aggregate's event newer than the horizon is listed once.
SELECT aggregate_version FROM outbox_emit('order', 'h-2', 'C', '{}');
SELECT pg_temp.pending('h-2');
SELECT count(*) = count(DISTINCT id) AS no_duplicates FROM outbox_pending;
-- The oldest horizon counts: one from before h-1 was emitted makes it pending.
INSERT INTO publisher_horizon (worker, snapshot, updated_at)
SELECT 2, (txid::text || ':' || txid::text || ':')::pg_snapshot, now()
  FROM outbox WHERE aggregate_id = 'h-1';
SELECT pg_temp.pending('h-1') AS h1, pg_temp.pending('h-2') AS h2, pg_temp.pending('h-3') AS h3;
DELETE FROM publisher_horizon WHERE worker = 2;
SELECT pg_temp.pending('h-1') AS h1;
-- A worker's row before its first read is NULL ("from the start"): then
-- every unsettled event is pending.
INSERT INTO publisher_horizon (worker, snapshot, updated_at) VALUES (2, NULL, now());
SELECT pg_temp.pending('h-1') AS h1, pg_temp.pending('h-2') AS h2, pg_temp.pending('h-3') AS h3;
DELETE FROM publisher_horizon WHERE worker = 2;
-- Without a horizon, every unsettled event is pending, as outbox_events says.
TRUNCATE publisher_horizon;
SELECT pg_temp.pending('h-1') AS h1, pg_temp.pending('h-2') AS h2, pg_temp.pending('h-3') AS h3;
SELECT aggregate_id, aggregate_version, state,
       id IN (SELECT id FROM outbox_pending) AS in_outbox_pending
  FROM outbox_events ORDER BY 1, 2;
