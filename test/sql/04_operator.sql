-- Operator functions and status views (no publisher runs in this cluster:
-- publication states are set up by hand, as the publisher would leave them).
SET search_path = ob, public;
\set SHOW_CONTEXT never
TRUNCATE outbox, aggregate_publication, inbox;

-- regress.publish(agg, v), from 00_setup.sql, records progress as the publisher does.

-- Each event: pending (listed by outbox_pending) or settled, and how
-- (outbox_events' state must agree).
CREATE TEMP VIEW event_state AS
SELECT o.aggregate_id, o.aggregate_version, o.event_id, o.state, o.disposition,
       o.disposed_at IS NOT NULL AS disposed,
       o.id IN (SELECT q.id FROM ob.outbox_pending q) AS pending,
       o.attempts, o.dead_letter_requested AS dl
  FROM ob.outbox_events o;

SELECT aggregate_version FROM outbox_emit('order', 'op-1', 'A', '{}', event_id => 'op-1-a');
SELECT aggregate_version FROM outbox_emit('order', 'op-1', 'B', '{}', event_id => 'op-1-b');
SELECT aggregate_version FROM outbox_emit('order', 'op-1', 'C', '{}', event_id => 'op-1-c');
SELECT aggregate_version FROM outbox_emit('order', 'op-2', 'A', '{}', event_id => 'op-2-a');

-- As the publisher leaves it: op-1 v1 published, v2 failed 5 times, blocked.
UPDATE outbox SET attempts = 5, last_error = 'MSG_SIZE_TOO_LARGE: Broker: Message size too large'
 WHERE event_id = 'op-1-b';
INSERT INTO aggregate_publication (aggregate_id, last_published_version, attempts, last_error,
                                   blocked_version, blocked_at)
VALUES ('op-1', 1, 5, 'MSG_SIZE_TOO_LARGE: Broker: Message size too large', 2, now());
SELECT * FROM event_state ORDER BY aggregate_id, aggregate_version;

SELECT pending_events, pending_aggregates, oldest_pending_age > interval '0' AS has_age,
       blocked_aggregates, jsonb_path_query_array(blocked, '$[*].aggregate_id') AS blocked_ids,
       backing_off_aggregates, paused_aggregates, dead_lettered_events, skipped_events,
       publisher_paused, jsonb_typeof(workers) AS workers
  FROM outbox_status;
SELECT aggregate_id, last_emitted_version, last_published_version, gap, pending_events,
       pending_since IS NOT NULL AS pending_since, state, attempts, last_error, blocked_version
  FROM outbox_aggregate_status ORDER BY aggregate_id;

-- retry: unblocks, resets the event's attempts and has the publisher read
-- the aggregate by index (catch_up); a second call is a no-op.
SELECT outbox_retry('op-1');
SELECT blocked_version, attempts, next_attempt_at, catch_up FROM aggregate_publication WHERE aggregate_id = 'op-1';
SELECT event_id, attempts, last_error FROM outbox WHERE event_id = 'op-1-b';
SELECT outbox_retry('op-1');
SELECT outbox_retry('nope');
SELECT outbox_retry('');
SELECT outbox_retry(NULL);

-- skip: settles the event, unblocks, advances progress; idempotent.
UPDATE aggregate_publication SET blocked_version = 2, blocked_at = now(), catch_up = false WHERE aggregate_id = 'op-1';
SELECT outbox_skip('op-1-b', 'payload can never fit');
SELECT event_id, disposition, disposed, pending FROM event_state WHERE event_id = 'op-1-b';
SELECT last_error FROM outbox WHERE event_id = 'op-1-b';
SELECT last_published_version, blocked_version, catch_up FROM aggregate_publication WHERE aggregate_id = 'op-1';
SELECT outbox_skip('op-1-b');
SELECT outbox_skip('op-1-a');
SELECT outbox_skip('no-such-event');
SELECT outbox_skip(NULL);

-- dead_letter: queued for the dead-letter topic (still pending until the
-- publisher sent it there); idempotent.
UPDATE aggregate_publication SET catch_up = false WHERE aggregate_id = 'op-1';
SELECT outbox_dead_letter('op-1-c');
SELECT event_id, dl, disposition, pending FROM event_state WHERE event_id = 'op-1-c';
SELECT catch_up FROM aggregate_publication WHERE aggregate_id = 'op-1';
SELECT outbox_dead_letter('op-1-c');
SELECT outbox_dead_letter('op-1-a');

-- replay: settled events (published, skipped, dead-lettered) become pending
-- again; progress goes back.  First as the publisher leaves op-1 once it sent
-- v3 to the dead-letter topic.
UPDATE outbox SET disposition = 'dead_lettered', disposed_at = now(), attempts = attempts + 1
 WHERE event_id = 'op-1-c';
SELECT regress.publish('op-1', 3);
UPDATE aggregate_publication SET catch_up = false WHERE aggregate_id = 'op-1';
SELECT aggregate_version, state, disposition, disposed, pending, attempts, dl
  FROM event_state WHERE aggregate_id = 'op-1' ORDER BY 1;
SELECT outbox_replay('op-1', 2);
SELECT aggregate_version, state, disposition, disposed, pending, attempts, dl
  FROM event_state WHERE aggregate_id = 'op-1' ORDER BY 1;
SELECT last_published_version, catch_up FROM aggregate_publication WHERE aggregate_id = 'op-1';
SELECT outbox_replay('op-1', 2);
SELECT outbox_replay('op-1', 9);
SELECT outbox_replay('op-1', 0);
SELECT outbox_replay('nope', 1);
-- Rows deleted by retention cannot be replayed.
SELECT regress.publish('op-1', 3);
DELETE FROM outbox WHERE aggregate_id = 'op-1' AND aggregate_version = 1;
SELECT outbox_replay('op-1', 1);
SELECT outbox_replay('op-1', 3);

-- pause / resume, per aggregate and for everything; idempotent.
SELECT outbox_pause('op-2');
SELECT outbox_pause('op-2');
SELECT state FROM outbox_aggregate_status WHERE aggregate_id = 'op-2';
SELECT paused_aggregates FROM outbox_status;
SELECT pending FROM event_state WHERE aggregate_id = 'op-2';
UPDATE aggregate_publication SET catch_up = false WHERE aggregate_id = 'op-2';
SELECT outbox_resume('op-2');
SELECT paused, catch_up FROM aggregate_publication WHERE aggregate_id = 'op-2';
UPDATE aggregate_publication SET catch_up = false WHERE aggregate_id = 'op-2';
SELECT outbox_resume('op-2');
SELECT paused, catch_up FROM aggregate_publication WHERE aggregate_id = 'op-2';
SELECT outbox_pause('nope');
SELECT outbox_resume('nope');
SELECT outbox_pause();
SELECT outbox_pause();
SELECT publisher_paused FROM outbox_status;
SELECT outbox_resume();
SELECT outbox_resume();
SELECT publisher_paused FROM outbox_status;

-- Counters and the latency histogram exist with Prometheus-friendly names.
SELECT name FROM outbox_counters() ORDER BY name;
SELECT count(*) AS buckets, bool_and(count = 0) AS empty, max(le_ms) AS top FROM outbox_latency_histogram();
SELECT worker, pid, state FROM outbox_workers();
SELECT outbox_test_fatal_error();

-- Poison policy overrides: one key per row, known policies only.
INSERT INTO poison_policy (topic, policy) VALUES ('orders.v1', 'dead_letter');
INSERT INTO poison_policy (aggregate_type, policy) VALUES ('invoice', 'skip');
INSERT INTO poison_policy (topic, aggregate_type, policy) VALUES ('x', 'y', 'skip');
INSERT INTO poison_policy (policy) VALUES ('skip');
INSERT INTO poison_policy (topic, policy) VALUES ('z', 'ignore');
