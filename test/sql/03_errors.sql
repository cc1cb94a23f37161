SET search_path = ob, public;
\pset format unaligned
\pset tuples_only on

-- regress.try(stmt), from 00_setup.sql: 'ok', or the error's SQLSTATE,
-- message, detail and hint.

-- Required text arguments.
SELECT regress.try($$SELECT outbox_emit(NULL, 'a', 't', '{}')$$);
SELECT regress.try($$SELECT outbox_emit('', 'a', 't', '{}')$$);
SELECT regress.try($$SELECT outbox_emit('order', NULL, 't', '{}')$$);
SELECT regress.try($$SELECT outbox_emit('order', '', 't', '{}')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', NULL, '{}')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', '', '{}')$$);

-- Headers: an object of string values, no reserved names.
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '[1, 2]')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '"x"')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '{"n": 1}')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '{"b": true}')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '{"o": {"x": "y"}}')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '{"nil": null}')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '{"": "v"}')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '{"aggregate_version": "9"}')$$);

-- Topic names Kafka would reject.
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', topic => '')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', topic => '.')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', topic => '..')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', topic => 'has space')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', topic => 'slash/topic')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', topic => 'tëst')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', topic => repeat('x', 250))$$);
SELECT (outbox_emit('order', 'a249', 't', '{}', topic => repeat('x', 249))).aggregate_version;
-- Via the default: the aggregate type ends up in the topic name.
SELECT regress.try($$SELECT outbox_emit('bad type', 'a', 't', '{}')$$);

-- Payload over outbox.max_payload_bytes.
SET outbox.max_payload_bytes = 100;
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', jsonb_build_object('x', repeat('y', 100)))$$);
SELECT (outbox_emit('order', 'small', 't', jsonb_build_object('x', repeat('y', 80)))).aggregate_version;
RESET outbox.max_payload_bytes;
SET outbox.default_topic = '';

-- Versions.
SELECT (outbox_emit('order', 'v', 't', '{}')).aggregate_version;
SELECT regress.try($$SELECT outbox_emit('order', 'v', 't', '{}', aggregate_version => 1)$$);
SELECT regress.try($$SELECT outbox_emit('order', 'v', 't', '{}', aggregate_version => 0)$$);
SELECT regress.try($$SELECT outbox_emit('order', 'v', 't', '{}', aggregate_version => -5)$$);

-- A reused event_id is an error, never ignored.
SELECT (outbox_emit('order', 'e', 't', '{}', event_id => 'dup-1')).aggregate_version;
SELECT regress.try($$SELECT outbox_emit('order', 'e2', 't', '{}', event_id => 'dup-1')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'e2', 't', '{}', event_id => '')$$);

-- A read-only transaction cannot emit (outbox_emit writes without SQL,
-- so it checks this itself).
BEGIN READ ONLY;
SELECT regress.try($$SELECT outbox_emit('order', 'ro', 't', '{}')$$);
SELECT regress.try($$SELECT * FROM outbox_emit_many(ARRAY[ROW('order', 'ro', 't', '{}', NULL, NULL, NULL, NULL)]::outbox_event[])$$);
COMMIT;

-- Nothing of the failed calls was written.
SELECT aggregate_id, aggregate_version FROM outbox
 WHERE aggregate_id IN ('a', 'e', 'e2', 'v', 'small', 'a249', 'ro') ORDER BY 1, 2;

-- inbox_claim arguments.
SELECT regress.try($$SELECT inbox_claim(NULL, 'x')$$);
SELECT regress.try($$SELECT inbox_claim('c', NULL)$$);
SELECT regress.try($$SELECT inbox_claim('', 'x')$$);
SELECT regress.try($$SELECT inbox_claim('c', '')$$);

-- Settings reject bad values with the setting's name.
\pset format aligned
\pset tuples_only off
SET outbox.kafka_properties = 'x=y';
ALTER SYSTEM SET outbox.kafka_properties = 'no.such.property=1';
ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms';
ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms=abc';
ALTER SYSTEM SET outbox.kafka_properties = 'enable.idempotence=false';
ALTER SYSTEM SET outbox.kafka_properties = 'bootstrap.servers=x:1';
ALTER SYSTEM SET outbox.batch_events = 0;
ALTER SYSTEM SET outbox.read_commits = 0;
ALTER SYSTEM SET outbox.standby_confirmations = 11;
ALTER SYSTEM SET outbox.workers = -1;

-- Limits and odd input.
\pset format unaligned
\pset tuples_only on
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L)', 'order', repeat('a', 1025), 't', '{}'));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L)', repeat('b', 1025), 'a', 't', '{}'));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L)', 'order', 'a', repeat('c', 1025), '{}'));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, event_id => %L)', 'order', 'a', 't', '{}', repeat('d', 1025)));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L)', 'order', repeat('é', 512), 't', '{}'));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L)', 'order', repeat('é', 513), 't', '{}'));
-- Every printable ASCII character outside [A-Za-z0-9._-] is refused in a topic.
SELECT count(*) AS illegal_chars,
       count(*) FILTER (WHERE regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, topic => %L)',
                                                 'order', 'chars', 't', '{}', 'a' || chr(c) || 'b'))
                        LIKE '22023: outbox_emit: invalid topic name%') AS refused
  FROM generate_series(1, 127) c WHERE chr(c) !~ '[A-Za-z0-9._-]';
SELECT count(*) AS legal_chars,
       count(*) FILTER (WHERE regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, topic => %L)',
                                                 'order', 'chars', 't', '{}', 'a' || chr(c) || 'b')) = 'ok') AS accepted
  FROM generate_series(1, 127) c WHERE chr(c) ~ '[A-Za-z0-9._-]';
-- Deep JSON is fine as a payload; as headers it is not a flat object.
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L::jsonb)', 'order', 'deep', 't',
                          repeat('{"a":', 500) || '1' || repeat('}', 500)));
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, headers => %L::jsonb)', 'order', 'deep', 't', '{}',
                          repeat('{"a":', 50) || '"1"' || repeat('}', 50)));
-- Headers of wrong types, in every position.
SELECT regress.try(format('SELECT outbox_emit(%L, %L, %L, %L, headers => %L)', 'order', 'h', 't', '{}', h))
  FROM unnest(ARRAY['{"a": "x", "b": 2}', '{"a": [1]}', '{"a": "x", "b": {"c": "d"}}', 'null', '1', 'true']) h;
\pset format aligned
\pset tuples_only off
SELECT left(aggregate_id, 10) AS aggregate_id, count(*) FROM outbox WHERE aggregate_id IN ('chars', 'deep', 'h')
    OR length(aggregate_id) > 500 GROUP BY 1 ORDER BY 1;
