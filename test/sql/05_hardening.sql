-- What an emitter or consumer role may not do, and errors that say no more
-- than the caller may know: reserved headers, refused topics, record size
-- against librdkafka's message.max.bytes, version overflow, inbox_claim's
-- limits and consumer registration, replay of an aggregate with a gap.
SET search_path = ob, public;
\set SHOW_CONTEXT never
TRUNCATE outbox, aggregate_publication, inbox;
\pset format unaligned
\pset tuples_only on

-- regress.try(stmt), from 00_setup.sql: 'ok', or the error's SQLSTATE,
-- message, detail and hint.

-- Reserved headers: the publisher's names in any case, with blanks around
-- them, and every dead_letter_* name.
SELECT h, regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, headers => jsonb_build_object(%L, %L))',
                             'order', 'hdr', 't', '{}', h, 'forged'))
  FROM unnest(ARRAY['Event_Id', 'EVENT_TYPE', 'aggregate_version ', E' aggregate_id\t', 'Aggregate_Type',
                    'dead_letter_original_topic', 'Dead_Letter_Error', 'dead_letter_attempts',
                    'dead_letter_', 'DEAD_LETTER_anything']) h;
-- Names that only resemble them are the caller's.
SELECT h, regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, headers => jsonb_build_object(%L, %L))',
                             'order', 'hdr', 't', '{}', h, 'mine'))
  FROM unnest(ARRAY['event-id', 'event_ids', 'my_event_id', 'dead_letter', 'deadletter_x', 'trace_id',
                    ' ', E'\t']) h;
-- A long reserved name is cut in the message.
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, headers => jsonb_build_object(%L, %L))',
                          'order', 'hdr', 't', '{}', 'dead_letter_' || repeat('x', 2000), 'v'));

-- Topics: Kafka's internal ones and the dead-letter topic are refused,
-- whatever their origin; the rest by outbox.allowed_topics.
SELECT t, regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, topic => %L)', 'order', 'tp', 't', '{}', t))
  FROM unnest(ARRAY['__consumer_offsets', '__transaction_state', '__anything', 'outbox.dead_letter',
                    'outbox_dead_letter', 'outbox.dead.letter', '_single', 'orders', 'outbox.dead_letters']) t;
SET outbox.default_topic = '__{aggregate_type}';
SELECT regress.try($$SELECT outbox_emit('consumer_offsets', 'tp', 't', '{}')$$);
RESET outbox.default_topic;
SHOW outbox.allowed_topics;
SET outbox.allowed_topics = 'orders.*, payments, *.audit';
SELECT t, regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, topic => %L)', 'order', 'tp', 't', '{}', t))
  FROM unnest(ARRAY['orders.v1', 'orders.', 'orders', 'payments', 'payments.v2', 'x.audit', 'audit', 'other']) t;
-- The default topic is checked too.
SELECT regress.try($$SELECT outbox_emit('order', 'tp', 't', '{}')$$);
SET outbox.allowed_topics = '';
SELECT regress.try($$SELECT outbox_emit('order', 'tp', 't', '{}', topic => 'orders.v1')$$);
-- Patterns are checked when set.
SET outbox.allowed_topics = 'orders.*, ';
SET outbox.allowed_topics = 'orders/*';
SET outbox.allowed_topics = 'a**b,c';
SELECT t, regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, topic => %L)', 'order', 'tp', 't', '{}', t))
  FROM unnest(ARRAY['ab', 'axxb', 'c', 'cc']) t;
RESET outbox.allowed_topics;
-- Only superusers set it.
CREATE ROLE outbox_regress_app;
GRANT USAGE ON SCHEMA ob TO outbox_regress_app;
GRANT EXECUTE ON FUNCTION outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint),
      inbox_claim(text, text) TO outbox_regress_app;
SET ROLE outbox_regress_app;
SET outbox.allowed_topics = '*';
SELECT regress.try($$SELECT outbox_emit('order', 'tp', 't', '{}', topic => '__consumer_offsets')$$);
RESET ROLE;

-- Errors say nothing of another aggregate, and cut long values.
SELECT aggregate_version FROM outbox_emit('order', 'secret-aggregate', 't', '{}', event_id => 'reused');
SELECT regress.try($$SELECT outbox_emit('order', 'mine', 't', '{}', event_id => 'reused')$$);
SELECT length(regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, topic => %L)',
                                 'order', 'tp', 't', '{}', repeat('x', 10 * 1024 * 1024)))) AS message_length;
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, topic => %L)',
                          'order', 'tp', 't', '{}', repeat('é', 300)));

-- Version overflow: never wraps, under any isolation level.
SELECT aggregate_version FROM outbox_emit('order', 'max', 't', '{}', aggregate_version => 9223372036854775807);
SELECT regress.try($$SELECT outbox_emit('order', 'max', 't', '{}')$$);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT regress.try($$SELECT outbox_emit('order', 'max', 't', '{}')$$);
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT regress.try($$SELECT outbox_emit('order', 'max', 't', '{}')$$);
COMMIT;
SELECT regress.try($$SELECT outbox_emit('order', 'max', 't', '{}', aggregate_version => 9223372036854775807)$$);
SELECT aggregate_version FROM outbox WHERE aggregate_id = 'max';
-- One below the largest: the next one is the largest.
SELECT aggregate_version FROM outbox_emit('order', 'max-1', 't', '{}', aggregate_version => 9223372036854775806);
SELECT aggregate_version FROM outbox_emit('order', 'max-1', 't', '{}');

-- Record size: key, value, headers and overhead against message.max.bytes
-- (librdkafka's default 1000000, or outbox.kafka_properties), as well as
-- outbox.max_payload_bytes for the payload alone.
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, to_jsonb(%L::text))', 'order', 'big', 't',
                          repeat('x', 1040000)));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, to_jsonb(%L::text))', 'order', 'big', 't',
                          repeat('x', 999000)));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, to_jsonb(%L::text))', 'order', 'big', 't',
                          repeat('x', 998000)));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, headers => jsonb_build_object(%L, %L))',
                          'order', 'big', 't', '{}', 'h', repeat('y', 2000000)));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, to_jsonb(%L::text), headers => jsonb_build_object(%L, %L))',
                          'order', 'big', 't', repeat('x', 600000), 'h', repeat('y', 400000)));
-- inbox_claim: lengths, and who may claim for whom.
SELECT regress.try(format('SELECT inbox_claim(%L, %L)', repeat('c', 1025), 'e'));
SELECT regress.try(format('SELECT inbox_claim(%L, %L)', 'billing', repeat('e', 3 * 1024 * 1024)));
SELECT regress.try(format('SELECT inbox_claim(%L, %L)', 'billing', repeat('é', 512)));
CREATE ROLE outbox_regress_billing;
INSERT INTO inbox_consumer VALUES ('billing', 'outbox_regress_billing');
SET SESSION AUTHORIZATION outbox_regress_app;
SELECT regress.try($$SELECT inbox_claim('billing', 'e-1')$$);
SELECT regress.try($$SELECT inbox_claim('shipping', 'e-1')$$);
RESET SESSION AUTHORIZATION;
GRANT outbox_regress_billing TO outbox_regress_app;
SET SESSION AUTHORIZATION outbox_regress_app;
SELECT regress.try($$SELECT inbox_claim('billing', 'e-1')$$);
SELECT inbox_claim('billing', 'e-1');
-- The application cannot register itself.
SELECT regress.try($$INSERT INTO inbox_consumer VALUES ('payments', 'outbox_regress_app')$$);
RESET SESSION AUTHORIZATION;
-- A dropped role's consumer is claimed for by no one.
UPDATE inbox_consumer SET role = 'outbox_regress_gone' WHERE consumer = 'billing';
SELECT regress.try($$SELECT inbox_claim('billing', 'e-2')$$);
SELECT consumer, event_id FROM inbox ORDER BY 1, 2;
DELETE FROM inbox_consumer;

-- Operator functions: overlong identifiers are refused without being repeated.
SELECT regress.try(format('SELECT outbox_retry(%L)', repeat('a', 10 * 1024 * 1024)));
SELECT regress.try(format('SELECT outbox_skip(%L)', repeat('a', 1025)));
SELECT regress.try(format('SELECT outbox_skip(%L, %L)', 'reused', repeat('r', 1025)));
SELECT regress.try(format('SELECT outbox_skip(%L, %L)', 'reused', ''));

-- outbox_replay on an aggregate whose versions start at 10.
SELECT aggregate_version FROM outbox_emit('order', 'gap', 't', '{}', aggregate_version => 10);
SELECT aggregate_version FROM outbox_emit('order', 'gap', 't', '{}');
UPDATE outbox SET published_at = now(), disposition = 'published' WHERE aggregate_id = 'gap';
INSERT INTO aggregate_publication (aggregate_id, last_published_version) VALUES ('gap', 11);
SELECT regress.try($$SELECT outbox_replay('gap', 1)$$);
SELECT regress.try($$SELECT outbox_replay('gap', 9)$$);
SELECT outbox_replay('gap', 10);

DROP OWNED BY outbox_regress_app, outbox_regress_billing;
DROP ROLE outbox_regress_app, outbox_regress_billing;

-- Settings a reload changes (the postmaster has reread the file by the time
-- it accepts the next connection): the dead-letter topic, and a larger
-- message.max.bytes.
ALTER SYSTEM SET outbox.dead_letter_topic = 'orders.dlq';
ALTER SYSTEM SET outbox.kafka_properties = 'message.max.bytes=3000000';
SELECT pg_reload_conf();
\c -
SET search_path = ob, public;
\set SHOW_CONTEXT never
\pset format unaligned
\pset tuples_only on
SELECT current_setting('outbox.dead_letter_topic');
SELECT regress.try($$SELECT outbox_emit('order', 'tp', 't', '{}', topic => 'orders.dlq')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'tp', 't', '{}', topic => 'orders_dlq')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'tp', 't', '{}', topic => 'outbox.dead_letter')$$);
SET outbox.max_payload_bytes = '4MB';
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, headers => jsonb_build_object(%L, %L))',
                          'order', 'big', 't', '{}', 'h', repeat('y', 2000000)));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, to_jsonb(%L::text))', 'order', 'big', 't',
                          repeat('x', 3000000)));
RESET outbox.max_payload_bytes;
ALTER SYSTEM RESET outbox.dead_letter_topic;
ALTER SYSTEM RESET outbox.kafka_properties;
SELECT pg_reload_conf();
\pset format aligned
\pset tuples_only off
SELECT aggregate_version, octet_length(payload::text) AS payload_bytes,
       octet_length(headers::text) AS header_bytes
  FROM outbox WHERE aggregate_id = 'big' ORDER BY aggregate_version;

-- Why the README says SELECT * FROM outbox_emit(...): PostgreSQL expands
-- SELECT (outbox_emit(...)).* into one call per column, four events.
SELECT count(*) AS rows FROM (SELECT (outbox_emit('order', 'star', 't', '{}')).*) s;
SELECT count(*) AS emitted FROM outbox WHERE aggregate_id = 'star';
SELECT aggregate_version FROM outbox_emit('order', 'star', 't', '{}');
SELECT count(*) AS emitted FROM outbox WHERE aggregate_id = 'star';
