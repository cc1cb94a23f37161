-- Raw payloads (outbox_emit_raw), many events in one call
-- (outbox_emit_many), the reserved header id, and trace context.
SET search_path = ob, public;
\set SHOW_CONTEXT never
\pset format unaligned
\pset tuples_only on
-- regress.try(stmt), from 00_setup.sql: 'ok', or the error's SQLSTATE,
-- message, detail and hint.

-- An untyped literal payload still means jsonb for outbox_emit (it is not
-- overloaded), and text for outbox_emit_raw; a bytea value picks bytea.
SELECT aggregate_version FROM outbox_emit('order', 'raw-1', 'J', '{"b": 1,   "a": 1.50}');
SELECT aggregate_version FROM outbox_emit_raw('order', 'raw-1', 'T', '{"b": 1,   "a": 1.50}');
SELECT aggregate_version FROM outbox_emit_raw('order', 'raw-1', 'B', '\x00ff80c328'::bytea);
SELECT aggregate_version FROM outbox_emit_raw('order', 'raw-1', 'N', NULL);
SELECT aggregate_version FROM outbox_emit_raw(aggregate_type => 'order', aggregate_id => 'raw-1',
                                              event_type => 'Named', payload => 'plain text',
                                              headers => '{"h": "v"}', aggregate_version => 9);
SELECT aggregate_version FROM outbox_emit_raw('order', 'raw-1', 'Empty', ''::bytea);
-- JSON payloads stay in payload (normalised); raw ones in payload_bytes, exact.
SELECT aggregate_version, event_type, payload, payload_bytes, headers
  FROM outbox WHERE aggregate_id = 'raw-1' ORDER BY aggregate_version;

-- Raw payloads are validated like JSON ones: size, identifiers, headers.
SELECT regress.try($$SELECT outbox_emit_raw('order', '', 't', 'x')$$);
SELECT regress.try($$SELECT outbox_emit_raw('order', 'a', 't', 'x'::bytea, headers => '{"ID": "1"}')$$);
SET outbox.max_payload_bytes = 10;
SELECT regress.try($$SELECT outbox_emit_raw('order', 'a', 't', '0123456789')$$);
SELECT regress.try($$SELECT outbox_emit_raw('order', 'a', 't', '0123456789a')$$);
-- A raw payload counts its bytes, not characters: 6 characters, 12 bytes.
SELECT regress.try($$SELECT outbox_emit_raw('order', 'a', 't', 'éééééé')$$);
SELECT regress.try($$SELECT outbox_emit_raw('order', 'a', 't', '\x000102030405060708090a'::bytea)$$);
RESET outbox.max_payload_bytes;
-- The record size check counts a raw payload's bytes exactly: 999,000
-- bytes fit librdkafka's 1,000,000 with the key and headers, 999,900 do not.
SELECT regress.try(format('SELECT outbox_emit_raw(%L, %L, %L, %L::text)', 'order', 'big-raw', 't',
                          repeat('x', 999000)));
SELECT regress.try(format('SELECT outbox_emit_raw(%L, %L, %L, %L::text)', 'order', 'big-raw', 't',
                          repeat('x', 999900)));
SELECT regress.try(format('SELECT outbox_emit_raw(%L, %L, %L, pg_catalog.convert_to(%L, %L))', 'order', 'big-raw', 't',
                          repeat('x', 999900), 'UTF8'));
SELECT count(*), max(octet_length(payload_bytes)) FROM outbox WHERE aggregate_id = 'big-raw';

-- "id" is where Debezium puts the event id: reserved like event_id.
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '{"id": "x"}')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '{" Id ": "x"}')$$);
SELECT regress.try($$SELECT outbox_emit('order', 'a', 't', '{}', headers => '{"idx": "x", "trace_id": "y"}')$$);

-- Trace context: validated when set, by any role.
SELECT regress.try($$SET outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'$$);
SELECT regress.try($$SET outbox.traceparent = '00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01'$$);
SELECT regress.try($$SET outbox.traceparent = '00-00000000000000000000000000000000-00f067aa0ba902b7-01'$$);
SELECT regress.try($$SET outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01'$$);
SELECT regress.try($$SET outbox.traceparent = 'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'$$);
SELECT regress.try($$SET outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx'$$);
SELECT regress.try($$SET outbox.traceparent = '01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx'$$);
SELECT regress.try($$SET outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7'$$);
SELECT regress.try($$SET outbox.tracestate = 'rojo=00f067aa0ba902b7, congo=t61rcWkgMzE'$$);
SELECT regress.try($$SET outbox.tracestate = 'a@b=1,,c/d=x y'$$);
SELECT regress.try($$SET outbox.tracestate = 'Rojo=1'$$);
SELECT regress.try($$SET outbox.tracestate = 'rojo'$$);
SELECT regress.try($$SET outbox.tracestate = 'rojo=a,b'$$);
SELECT regress.try(format('SET outbox.tracestate = %L', repeat('k=v,', 33) || 'k=v'));
RESET outbox.traceparent;
RESET outbox.tracestate;

-- Captured at emit into the event's headers; SET LOCAL scopes it to the
-- transaction; a caller's own traceparent header wins.
SELECT aggregate_version FROM outbox_emit('order', 'tr', 't', '{}');
BEGIN;
SET LOCAL outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET LOCAL outbox.tracestate = 'rojo=00f067aa0ba902b7';
SELECT aggregate_version FROM outbox_emit('order', 'tr', 't', '{}');
SELECT aggregate_version FROM outbox_emit_raw('order', 'tr', 't', 'x', headers => '{"tenant": "t1"}');
SELECT aggregate_version FROM outbox_emit('order', 'tr', 't', '{}',
                                headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}');
-- Trace header names match in any letter case, blanks around ignored: a
-- caller's TraceParent or TRACESTATE is its trace context, never mixed
-- with the session's.
SELECT aggregate_version FROM outbox_emit('order', 'tr', 't', '{}',
                                headers => '{"TraceParent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}');
SELECT aggregate_version FROM outbox_emit('order', 'tr', 't', '{}', headers => '{" TRACESTATE": "congo=1"}');
COMMIT;
SELECT aggregate_version FROM outbox_emit('order', 'tr', 't', '{}');
-- A tracestate without a traceparent is not sent (W3C Trace Context).
SET outbox.tracestate = 'rojo=1';
SELECT aggregate_version FROM outbox_emit('order', 'tr', 't', '{}');
RESET outbox.tracestate;
SELECT aggregate_version, headers FROM outbox WHERE aggregate_id = 'tr' ORDER BY aggregate_version;
-- The trace headers count in the record size check: 999,352 bytes fit
-- exactly without them, not with them.
SELECT regress.try(format('SELECT outbox_emit_raw(%L, %L, %L, %L::text)', 'order', 'big-raw', 't',
                          repeat('x', 999352)));
SET outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT regress.try(format('SELECT outbox_emit_raw(%L, %L, %L, %L::text)', 'order', 'big-raw', 't',
                          repeat('x', 999352)));
RESET outbox.traceparent;

-- Many events in one call, in array order; one bad event writes nothing.
\pset format aligned
\pset tuples_only off
SELECT aggregate_version, topic
  FROM outbox_emit_many(ARRAY[
	ROW('order', 'many-1', 'A', '{"n": 1}', NULL, NULL, NULL, NULL),
	ROW('order', 'many-2', 'A', '{"n": 2}', 'orders.v2', '{"h": "1"}', 'many-evt-2', NULL),
	ROW('order', 'many-1', 'B', NULL, NULL, NULL, NULL, 7)]::outbox_event[]);
SELECT aggregate_id, aggregate_version, event_type, payload, topic, headers
  FROM outbox WHERE aggregate_id LIKE 'many-%' ORDER BY id;
SELECT count(*) FROM outbox_emit_many(ARRAY[]::outbox_event[]);
SELECT count(*) FROM outbox_emit_many(NULL);
\pset format unaligned
\pset tuples_only on
SELECT regress.try($$SELECT * FROM outbox_emit_many(ARRAY[
	ROW('order', 'many-3', 'A', '{}', NULL, NULL, NULL, NULL),
	ROW('order', 'many-3', 'A', '{}', NULL, '{"event_id": "x"}', NULL, NULL)]::outbox_event[])$$);
SELECT regress.try($$SELECT * FROM outbox_emit_many(ARRAY[NULL]::outbox_event[])$$);
SELECT regress.try($$SELECT * FROM outbox_emit_many(ARRAY[ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)]::outbox_event[])$$);
-- Which event failed is in the error's context.
\set SHOW_CONTEXT errors
SELECT * FROM outbox_emit_many(ARRAY[
	ROW('order', 'many-3', 'A', '{}', NULL, NULL, NULL, NULL),
	ROW('order', 'many-3', 'A', '{}', 'a/b', NULL, NULL, NULL)]::outbox_event[]);
\set SHOW_CONTEXT never
SELECT count(*) FROM outbox WHERE aggregate_id = 'many-3';

-- Raw payloads in one call (outbox_emit_many_raw): text and bytea events,
-- stored byte for byte, validated as outbox_emit_raw validates them.
SELECT aggregate_version, topic
  FROM outbox_emit_many_raw(ARRAY[
	ROW('order', 'many-raw', 'T', '{"b": 1,   "a": 1.50}', NULL, NULL, NULL, NULL),
	ROW('order', 'many-raw', 'N', NULL, 'orders.raw', '{"h": "1"}', 'many-raw-evt', NULL)]::outbox_event_text[]);
SELECT aggregate_version, topic
  FROM outbox_emit_many_raw(ARRAY[
	ROW('order', 'many-raw', 'B', '\x00ff80c328'::bytea, NULL, NULL, NULL, NULL),
	ROW('order', 'many-raw', 'E', ''::bytea, NULL, NULL, NULL, 9)]::outbox_event_bytea[]);
SELECT aggregate_version, event_type, event_id = 'many-raw-evt' AS given_id, payload, payload_bytes, headers
  FROM outbox WHERE aggregate_id = 'many-raw' ORDER BY aggregate_version;
SET outbox.max_payload_bytes = 10;
SELECT regress.try($$SELECT * FROM outbox_emit_many_raw(ARRAY[
	ROW('order', 'many-raw', 'T', 'éééééé', NULL, NULL, NULL, NULL)]::outbox_event_text[])$$);
SELECT regress.try($$SELECT * FROM outbox_emit_many_raw(ARRAY[
	ROW('order', 'many-raw', 'B', '\x00010203040506070809'::bytea, NULL, NULL, NULL, NULL),
	ROW('order', 'many-raw', 'B', '\x000102030405060708090a'::bytea, NULL, NULL, NULL, NULL)]::outbox_event_bytea[])$$);
RESET outbox.max_payload_bytes;
SELECT regress.try($$SELECT * FROM outbox_emit_many_raw(ARRAY[
	ROW('order', 'many-raw', 'T', 'x', NULL, '{"ID": "1"}', NULL, NULL)]::outbox_event_text[])$$);
SELECT count(*) FROM outbox WHERE aggregate_id = 'many-raw';

-- outbox_emit keeps the outbox's defaults per session, and forgets them when
-- the table changes: the second event gets the new default.
SELECT aggregate_version FROM outbox_emit('order', 'inval', 't', '{}');
ALTER TABLE outbox ALTER COLUMN last_error SET DEFAULT 'changed';
SELECT aggregate_version FROM outbox_emit('order', 'inval', 't', '{}');
ALTER TABLE outbox ALTER COLUMN last_error DROP DEFAULT;
SELECT aggregate_version FROM outbox_emit('order', 'inval', 't', '{}');
SELECT aggregate_version, last_error FROM outbox WHERE aggregate_id = 'inval' ORDER BY 1;

-- A JSON payload's size is its text's, computed without writing it: each
-- of these fits a limit of exactly its octet_length(payload::text) and
-- not one byte less (escapes, control characters, multibyte UTF-8,
-- numbers as numeric writes them, nesting, empty containers, scalars).
CREATE FUNCTION pg_temp.fits(j jsonb, n int) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('outbox.max_payload_bytes', n::text, true);
	PERFORM outbox_emit('order', 'size', 't', j);
	RAISE EXCEPTION USING ERRCODE = 'P0001';	-- undo the emit
EXCEPTION
	WHEN SQLSTATE 'P0001' THEN RETURN 'fits';
	WHEN program_limit_exceeded THEN RETURN 'too large';
END
$$;
SELECT octet_length(j::text) AS bytes, pg_temp.fits(j, octet_length(j::text)),
       pg_temp.fits(j, octet_length(j::text) - 1)
  FROM (VALUES ('{"b": 1,   "a": 1.5e300}'::jsonb), ('{"a\"b\\c": "x\ny\tz\u0001\u001f\b\f\r/"}'),
               ('["é", "€", "𝄞", -0.0, 1e-10, 123456789012345678901234567890.000]'),
               ('{"a": {"b": [[], {}, [1, [2, {"c": null}]], true, false]}}'), ('[]'), ('{}'),
               ('"just a string"'), ('12345'), ('true'), ('null'), ('[null]'),
               ('{"": "", "k": ["", {"": {}}]}')) AS v(j);
-- The same over every row of pg_settings and pg_proc as JSON: no mismatch.
SELECT count(*) > 500 AS many_checked,
       count(*) FILTER (WHERE pg_temp.fits(j, octet_length(j::text)) <> 'fits'
                           OR pg_temp.fits(j, octet_length(j::text) - 1) <> 'too large') AS mismatched
  FROM (SELECT to_jsonb(s) AS j FROM pg_settings s
        UNION ALL SELECT to_jsonb(p) FROM (SELECT proname, proargnames, prosrc, proconfig, procost FROM pg_proc LIMIT 500) p) AS t;
SELECT count(*) FROM outbox WHERE aggregate_id = 'size';
