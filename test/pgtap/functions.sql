-- Behaviour of the functions, beyond sql/02_emit.sql and sql/03_errors.sql:
-- the returned composite, defaults, version assignment over many
-- aggregates, inbox_claim, uuid_v7's bit layout and ordering, and the
-- SQLSTATEs of the main errors.
BEGIN;
CREATE SCHEMA ob;
CREATE EXTENSION outbox SCHEMA ob;

SELECT plan(66);

-- The returned composite is the inserted row.

CREATE TEMP TABLE r1 AS
	SELECT * FROM ob.outbox_emit('order', 'c-1', 'OrderCreated', '{"total": 1}');
SELECT is((SELECT count(*) FROM r1), 1::bigint, 'outbox_emit returns one row');
SELECT results_eq(
	$$SELECT o.id, o.event_id, o.aggregate_version, o.topic
	    FROM ob.outbox o JOIN r1 USING (id)$$,
	$$SELECT id, event_id, aggregate_version, topic FROM r1$$,
	'the returned id, event_id, aggregate_version and topic are those of the inserted row');
SELECT is((SELECT aggregate_version FROM r1), 1::bigint, 'the first version of an aggregate is 1');
SELECT is((SELECT topic FROM r1), 'outbox.event.order',
          'the default topic is outbox.event.{aggregate_type}');
SELECT is((SELECT id FROM r1), (SELECT max(id) FROM ob.outbox), 'the returned id is the row''s identity');
SELECT results_eq(
	$$SELECT aggregate_type, aggregate_id, event_type, payload, headers, disposed_at,
	         disposition, attempts, last_error, txid = pg_current_xact_id()
	    FROM ob.outbox WHERE id = (SELECT id FROM r1)$$,
	$$VALUES ('order', 'c-1', 'OrderCreated', '{"total": 1}'::jsonb, NULL::jsonb,
	          NULL::timestamptz, NULL::ob.outbox_disposition, 0, NULL::text, true)$$,
	'the stored row has the given values, not disposed of, and this transaction''s txid');
SELECT results_eq($$SELECT id FROM ob.outbox_pending$$, $$SELECT id FROM r1$$,
                  'the emitted event is pending');

CREATE TEMP TABLE r2 AS
	SELECT * FROM ob.outbox_emit('order', 'c-1', 'OrderPaid', NULL, topic => 'orders.v1',
	                             event_id => 'explicit-1');
SELECT results_eq($$SELECT event_id, aggregate_version, topic FROM r2$$,
                  $$VALUES ('explicit-1', 2::bigint, 'orders.v1')$$,
                  'an explicit event_id and topic are returned as given');
SELECT cmp_ok((SELECT id FROM r2), '>', (SELECT id FROM r1), 'ids increase with emit order');
SELECT is((SELECT payload FROM ob.outbox WHERE event_id = 'explicit-1'), NULL::jsonb,
          'a NULL payload is stored as NULL');
SELECT is((SELECT aggregate_version FROM ob.outbox_emit('order', 'c-1', 'X', '{}', aggregate_version => 10)),
          10::bigint, 'an explicit version is returned as given');
SELECT is((SELECT (ob.outbox_emit('order', 'c-1', 'Y', '{}')).aggregate_version), 11::bigint,
          'the next assigned version follows the explicit one');

-- Default event ids.

CREATE TEMP TABLE ids AS
	SELECT (ob.outbox_emit('order', 'ids', 'E', '{}')).event_id FROM generate_series(1, 50);
SELECT is((SELECT count(DISTINCT event_id) FROM ids), 50::bigint,
          '50 emits without event_id get 50 distinct event ids');
SELECT is_empty($$SELECT event_id FROM ids
                   WHERE event_id !~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'$$,
                'every default event_id is a lower-case version 7 UUID');
-- The column default, for rows inserted without outbox_emit.
INSERT INTO ob.outbox (aggregate_type, aggregate_id, aggregate_version, event_type, topic)
	VALUES ('order', 'direct', 1, 'E', 't');
SELECT matches((SELECT event_id FROM ob.outbox WHERE aggregate_id = 'direct'),
               '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$',
               'the event_id column defaults to a version 7 UUID');
SELECT is((SELECT (ob.outbox_emit('order', 'direct', 'E', '{}')).aggregate_version), 2::bigint,
          'outbox_emit continues after a directly inserted version');

-- Version assignment across many aggregates: 2000 interleaved emits on 37
-- aggregates in one statement, then more in separate statements.

CREATE TEMP TABLE many AS
	SELECT i, 'm-' || (i % 37) AS aggregate_id,
	       (ob.outbox_emit('item', 'm-' || (i % 37), 'E', jsonb_build_object('i', i))).aggregate_version AS v
	  FROM generate_series(1, 2000) AS i;
SELECT is((SELECT count(*) FROM ob.outbox WHERE aggregate_id LIKE 'm-%'), 2000::bigint,
          '2000 events are stored');
SELECT is_empty($$SELECT aggregate_id FROM ob.outbox WHERE aggregate_id LIKE 'm-%'
                   GROUP BY aggregate_id
                  HAVING min(aggregate_version) <> 1
                      OR max(aggregate_version) <> count(*)
                      OR count(DISTINCT aggregate_version) <> count(*)$$,
                'every aggregate has versions 1..n without gap or duplicate');
SELECT is((SELECT count(DISTINCT aggregate_id) FROM ob.outbox WHERE aggregate_id LIKE 'm-%'),
          37::bigint, 'the events are spread over 37 aggregates');
SELECT is_empty($$SELECT 1 FROM (
	                 SELECT aggregate_version,
	                        row_number() OVER (PARTITION BY aggregate_id ORDER BY id) AS by_id,
	                        row_number() OVER (PARTITION BY aggregate_id ORDER BY (payload->>'i')::int) AS by_call
	                   FROM ob.outbox WHERE aggregate_id LIKE 'm-%') s
	               WHERE aggregate_version <> by_id OR aggregate_version <> by_call$$,
                'within an aggregate, version order is emit order and id order');
SELECT results_eq($$SELECT v FROM many ORDER BY i$$,
                  $$SELECT (i - 1) / 37 + 1::bigint FROM generate_series(1, 2000) AS i$$,
                  'each emit returned the version stored for it');
SELECT is((SELECT (ob.outbox_emit('item', 'm-0', 'E', '{}')).aggregate_version), 55::bigint,
          'the next emit on aggregate m-0 (54 events) gets version 55');
SELECT is((SELECT (ob.outbox_emit('item', 'm-36', 'E', '{}')).aggregate_version), 55::bigint,
          'the next emit on aggregate m-36 (54 events) gets version 55');
SELECT is((SELECT (ob.outbox_emit('item', 'm-1', 'E', '{}')).aggregate_version), 56::bigint,
          'the next emit on aggregate m-1 (55 events) gets version 56');
-- Aggregate ids are compared exactly: no case folding, trimming or prefix match.
SELECT results_eq(
	$$SELECT (ob.outbox_emit('item', a, 'E', '{}')).aggregate_version
	    FROM unnest(ARRAY['M-0', 'm-0 ', ' m-0', 'm-', 'm-00']) AS a$$,
	$$VALUES (1::bigint), (1), (1), (1), (1)$$,
	'similar aggregate ids are separate aggregates');
-- Aggregate ids are global: the aggregate type is not part of the position.
SELECT is((SELECT (ob.outbox_emit('other_type', 'm-0', 'E', '{}')).aggregate_version), 56::bigint,
          'versions are per aggregate_id, whatever the aggregate_type');
-- A rolled-back subtransaction leaves no hole (emits inside a plpgsql
-- exception block).
DO $$
BEGIN
	BEGIN
		PERFORM ob.outbox_emit('item', 'sub', 'E', '{}');
		PERFORM ob.outbox_emit('item', 'sub', 'E', '{}');
		RAISE EXCEPTION 'undo';
	EXCEPTION WHEN raise_exception THEN
		NULL;
	END;
END
$$;
SELECT is((SELECT (ob.outbox_emit('item', 'sub', 'E', '{}')).aggregate_version), 1::bigint,
          'emits undone by an exception block leave no hole');

-- inbox_claim.

SELECT is(ob.inbox_claim('billing', 'evt-a'), true, 'the first claim of an event is true');
SELECT is(ob.inbox_claim('billing', 'evt-a'), false, 'a second claim in the same transaction is false');
SELECT is(ob.inbox_claim('billing', 'evt-b'), true, 'another event of the consumer is claimable');
SELECT is(ob.inbox_claim('shipping', 'evt-a'), true, 'the same event is claimable by another consumer');
SELECT is(ob.inbox_claim('Billing', 'evt-a'), true, 'consumer names are case-sensitive');
SELECT results_eq($$SELECT consumer, event_id FROM ob.inbox ORDER BY consumer COLLATE "C", event_id$$,
                  $$VALUES ('Billing', 'evt-a'), ('billing', 'evt-a'), ('billing', 'evt-b'), ('shipping', 'evt-a')$$,
                  'each successful claim left exactly one inbox row');
SELECT is((SELECT count(*) FROM ob.inbox WHERE processed_at = now()), 4::bigint,
          'processed_at is the transaction time');
SAVEPOINT claim;
SELECT is(ob.inbox_claim('billing', 'evt-c'), true, 'a claim in a savepoint is true');
ROLLBACK TO SAVEPOINT claim;
SELECT is(ob.inbox_claim('billing', 'evt-c'), true, 'after ROLLBACK TO SAVEPOINT the event is claimable again');
SELECT is(ob.inbox_claim('billing', 'evt-c'), false, '... and then claimed');
-- Odd but legal text.
SELECT is(ob.inbox_claim(E'c\ton''sumer', E'ev\u00e9nt;--'), true, 'odd text is claimed');
SELECT is(ob.inbox_claim(E'c\ton''sumer', E'ev\u00e9nt;--'), false, '... once');

-- uuid_v7().

CREATE TEMP TABLE t0 AS SELECT clock_timestamp() AS t0;
CREATE TEMP TABLE u AS
	SELECT i, ob.uuid_v7() AS u, clock_timestamp() AS t FROM generate_series(1, 1000) AS i;
CREATE TEMP TABLE ub AS
	SELECT i, u, t, uuid_send(u) AS b FROM u;
SELECT is((SELECT count(DISTINCT u) FROM ub), 1000::bigint, '1000 calls give 1000 distinct UUIDs');
SELECT is_empty($$SELECT i FROM ub WHERE get_byte(b, 6) >> 4 <> 7$$,
                'the version nibble (bits 48-51) is 7');
SELECT is_empty($$SELECT i FROM ub WHERE get_byte(b, 8) >> 6 <> 2$$,
                'the variant bits (64-65) are 10 (RFC 9562)');
SELECT is_empty($$SELECT i FROM ub WHERE u::text !~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'$$,
                'the text form shows version 7 and variant 8-b');
SELECT is_empty($$SELECT i FROM (SELECT i, u, lag(u) OVER (ORDER BY i) AS prev FROM ub) s
                   WHERE prev IS NOT NULL AND u <= prev$$,
                '1000 consecutive calls are strictly increasing');
SELECT is_empty($$SELECT i FROM (SELECT i, u::text AS s, lag(u::text) OVER (ORDER BY i) AS prev FROM ub) s
                   WHERE prev IS NOT NULL AND s COLLATE "C" <= prev COLLATE "C"$$,
                '... and so are their text forms (event_id is text)');
-- The first 48 bits are the Unix time in milliseconds: not before the
-- clock was read ahead of the batch, not after it was read just after the
-- call (a few milliseconds of slack for sub-millisecond counter overflow).
SELECT is_empty($$SELECT i FROM (
	                 SELECT i, t, ('x' || lpad(encode(substring(b FROM 1 FOR 6), 'hex'), 16, '0'))::bit(64)::bigint AS ms
	                   FROM ub) s, t0
	               WHERE ms < floor(extract(epoch FROM t0) * 1000)
	                  OR ms > floor(extract(epoch FROM t) * 1000) + 5$$,
                'the timestamp field is the generation time in Unix milliseconds');
SELECT cmp_ok((SELECT count(DISTINCT substring(b FROM 9 FOR 8)) FROM ub), '=', 1000::bigint,
              'the low 64 bits are random (no repeats)');
-- Ordering holds across milliseconds too.
CREATE TEMP TABLE u2 AS
	SELECT i, ob.uuid_v7() AS u, pg_sleep(0.0015)::text AS slept FROM generate_series(1, 20) AS i;
SELECT is_empty($$SELECT i FROM (SELECT i, u, lag(u) OVER (ORDER BY i) AS prev FROM u2) s
                   WHERE prev IS NOT NULL AND u <= prev$$,
                'calls in successive milliseconds are increasing');
SELECT cmp_ok((SELECT u FROM u2 ORDER BY u LIMIT 1), '>', (SELECT u FROM ub ORDER BY u DESC LIMIT 1),
              'later UUIDs sort after earlier ones');

-- SQLSTATEs and messages of the key errors.

SELECT throws_ok($$SELECT ob.outbox_emit(NULL, 'a', 'E', '{}')$$, '22004',
                 'outbox_emit: aggregate_type must not be NULL', 'a NULL aggregate_type: 22004');
SELECT throws_ok($$SELECT ob.outbox_emit('order', '', 'E', '{}')$$, '22023',
                 'outbox_emit: aggregate_id must not be empty', 'an empty aggregate_id: 22023');
SELECT throws_ok($$SELECT ob.outbox_emit('order', 'x', 'E', '{}', event_id => 'explicit-1')$$, '23505',
                 'outbox_emit: event_id "explicit-1" was already emitted', 'a reused event_id: 23505');
SELECT throws_ok($$SELECT ob.outbox_emit('order', 'c-1', 'E', '{}', aggregate_version => 11)$$, '22023',
                 'outbox_emit: aggregate_version 11 is not above the last emitted version 11 of aggregate "c-1"',
                 'a version not above the last: 22023');
SELECT throws_ok($$SELECT ob.outbox_emit('order', 'c-1', 'E', '{}', headers => '{"event_id": "x"}')$$, '22023',
                 'outbox_emit: header "event_id" is reserved', 'a reserved header: 22023');
SELECT throws_ok($$SELECT ob.outbox_emit('order', 'c-1', 'E', '{}', topic => 'a/b')$$, '22023',
                 'outbox_emit: invalid topic name "a/b"', 'an illegal topic: 22023');
SELECT throws_ok($$SELECT ob.outbox_emit('order', repeat('x', 1025), 'E', '{}')$$, '22001',
                 'outbox_emit: aggregate_id is too long (1025 bytes)', 'an aggregate_id over 1024 bytes: 22001');
SELECT is((SELECT (ob.outbox_emit('order', repeat('x', 1024), 'E', '{}')).aggregate_version), 1::bigint,
          'an aggregate_id of 1024 bytes is accepted');
SELECT throws_ok($$SELECT ob.outbox_emit('order', 'c-1', 'E', jsonb_build_object('x', repeat('y', 2 * 1024 * 1024)))$$,
                 '54000', NULL, 'a payload over outbox.max_payload_bytes: 54000');
SELECT throws_ok($$SELECT ob.inbox_claim(NULL, 'x')$$, '22004',
                 'inbox_claim: consumer must not be NULL', 'inbox_claim with a NULL consumer: 22004');
SELECT throws_ok($$SELECT ob.inbox_claim('c', '')$$, '22023',
                 'inbox_claim: event_id must not be empty', 'inbox_claim with an empty event_id: 22023');

-- inbox_retry() of a partition backing off (no blocked_reason): unblocked,
-- no gap accepted.
INSERT INTO ob.inbox_offset (consumer, topic, "partition", next_offset, attempts, last_error, next_attempt_at)
	VALUES ('retry-me', 't', 0, 5, 2, 'boom', now() + interval '1 hour');
SELECT is(ob.inbox_retry('retry-me', 't', 0), true, 'inbox_retry of a backing-off partition is true');
SELECT is((SELECT (attempts, next_attempt_at, accept_gap)::text FROM ob.inbox_offset WHERE consumer = 'retry-me'),
          '(0,,f)', '... and retries it at once, accepting no gap');

-- Topics a subscription may not read (checked before anything else).
SELECT throws_ok($$SELECT ob.inbox_subscribe('c', ARRAY['__consumer_offsets'], 'pg_catalog.now()'::regprocedure)$$,
                 '42501', 'topic "__consumer_offsets" may not be subscribed to',
                 'Kafka''s own topics cannot be subscribed to: 42501');
SELECT throws_ok($$SELECT ob.inbox_subscribe('c', ARRAY['orders', '__transaction_state'], 'pg_catalog.now()'::regprocedure)$$,
                 '42501', 'topic "__transaction_state" may not be subscribed to',
                 '... in any place of the list');
SET LOCAL outbox.inbox_allowed_topics = 'orders.*, billing';
SELECT throws_ok($$SELECT ob.inbox_subscribe('c', ARRAY['orders.created', 'payments'], 'pg_catalog.now()'::regprocedure)$$,
                 '42501', 'topic "payments" may not be subscribed to',
                 'a topic outbox.inbox_allowed_topics does not allow: 42501');
SELECT throws_ok($$SET LOCAL outbox.inbox_allowed_topics = 'a b'$$, '22023', NULL,
                 'outbox.inbox_allowed_topics is checked when set');

SELECT * FROM finish();
ROLLBACK;
