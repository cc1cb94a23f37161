SET search_path = ob, public;

-- Versions are assigned per aggregate, from 1.
SELECT aggregate_version, topic FROM outbox_emit('order', 'o-1', 'OrderCreated', '{"total": 10}');
SELECT aggregate_version, topic FROM outbox_emit('order', 'o-1', 'OrderPaid', '{"total": 10}');
SELECT aggregate_version, topic FROM outbox_emit('order', 'o-2', 'OrderCreated', '{}');

-- The returned event_id is a version 7 UUID, stored as given.
SELECT e.event_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' AS is_uuid_v7,
       o.event_id = e.event_id AS stored
  FROM outbox_emit('order', 'o-2', 'OrderPaid', '{}') e
  JOIN outbox o ON o.id = e.id;

-- v7 UUIDs sort by creation time.
SELECT bool_and(a < b) AS increasing
  FROM (SELECT uuid_v7() AS a, pg_sleep(0.002), uuid_v7() AS b FROM generate_series(1, 5)) s;

-- Explicit topic, headers, event_id; NULL payload (a tombstone).
SELECT * FROM outbox_emit('order', 'o-3', 'OrderDeleted', NULL,
                          topic => 'orders.v1',
                          headers => '{"trace_id": "abc", "tenant": "t1"}',
                          event_id => 'evt-explicit-1');
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic,
       headers, payload, disposition, disposed_at, attempts,
       event_id IN (SELECT event_id FROM outbox_pending) AS pending
  FROM outbox WHERE event_id = 'evt-explicit-1';

-- txid is the emitting top-level transaction, also from a subtransaction.
BEGIN;
SELECT aggregate_version FROM outbox_emit('order', 'o-txid', 'A', '{}');
SAVEPOINT s;
SELECT aggregate_version FROM outbox_emit('order', 'o-txid', 'B', '{}');
RELEASE s;
SELECT aggregate_version, txid = pg_current_xact_id() AS own_txid
  FROM outbox WHERE aggregate_id = 'o-txid' ORDER BY 1;
COMMIT;

-- An explicit version must be above the last; gaps are allowed.
SELECT aggregate_version FROM outbox_emit('order', 'o-3', 'OrderRestored', '{}', aggregate_version => 5);
SELECT aggregate_version FROM outbox_emit('order', 'o-3', 'OrderTouched', '{}');

-- The default topic follows outbox.default_topic.
SET outbox.default_topic = 'app.{aggregate_type}.events';
SELECT topic FROM outbox_emit('invoice', 'i-1', 'InvoiceIssued', '{}');
SET outbox.default_topic = 'all-events';
SELECT topic FROM outbox_emit('invoice', 'i-1', 'InvoiceIssued', '{}');
RESET outbox.default_topic;

-- A rollback leaves nothing and no hole.
BEGIN;
SELECT aggregate_version FROM outbox_emit('order', 'o-4', 'OrderCreated', '{}');
ROLLBACK;
SELECT count(*) FROM outbox WHERE aggregate_id = 'o-4';
SELECT aggregate_version FROM outbox_emit('order', 'o-4', 'OrderCreated', '{}');

-- So does a rolled-back savepoint.
BEGIN;
SELECT aggregate_version FROM outbox_emit('order', 'o-4', 'A', '{}');
SAVEPOINT s;
SELECT aggregate_version FROM outbox_emit('order', 'o-4', 'B', '{}');
ROLLBACK TO s;
SELECT aggregate_version FROM outbox_emit('order', 'o-4', 'C', '{}');
COMMIT;
SELECT aggregate_version, event_type FROM outbox WHERE aggregate_id = 'o-4' ORDER BY 1;

-- created_at is the emit time, not the transaction start.
BEGIN;
SELECT pg_sleep(0.05);
SELECT aggregate_version FROM outbox_emit('order', 'o-5', 'X', '{}');
SELECT created_at - now() >= interval '50 ms' AS emit_time FROM outbox WHERE aggregate_id = 'o-5';
COMMIT;

-- Version assignment survives retention deleting every published row.
SELECT aggregate_version FROM outbox_emit('order', 'o-6', 'A', '{}');
SELECT aggregate_version FROM outbox_emit('order', 'o-6', 'B', '{}');
-- Published as the publisher records it: the aggregate's progress.
INSERT INTO aggregate_publication AS p (aggregate_id, last_published_version) VALUES ('o-6', 2)
ON CONFLICT (aggregate_id) DO UPDATE
   SET last_published_version = GREATEST(p.last_published_version, excluded.last_published_version);
SELECT count(*) AS pending FROM outbox_pending WHERE aggregate_id = 'o-6';
DELETE FROM outbox WHERE aggregate_id = 'o-6';
SELECT aggregate_version FROM outbox_emit('order', 'o-6', 'C', '{}');
SELECT aggregate_version FROM outbox_emit('order', 'o-6', 'D', '{}', aggregate_version => 3);

-- Odd but legal text round-trips unchanged.
SELECT aggregate_version FROM outbox_emit('weird', E'agg ''quoted''; DROP TABLE x; --',
                   E'Type\twith "tab"', '{"s": "ü€𝄞"}', headers => '{"q": "it''s \"quoted\""}');
SELECT aggregate_id, event_type, headers->>'q' AS q, payload->>'s' AS s
  FROM outbox WHERE aggregate_type = 'weird';

-- inbox_claim: first claim true, second false.
SELECT inbox_claim('billing', 'evt-1') AS first, inbox_claim('billing', 'evt-1') AS second,
       inbox_claim('shipping', 'evt-1') AS other_consumer;
SELECT consumer, event_id FROM inbox ORDER BY 1, 2;
-- A rolled-back claim leaves the event claimable.
BEGIN;
SELECT inbox_claim('billing', 'evt-2');
ROLLBACK;
SELECT inbox_claim('billing', 'evt-2');
