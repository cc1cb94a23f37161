-- The extension's schema: tables, columns, keys, constraints, indexes and
-- function signatures.  Everything happens in one transaction that is
-- rolled back: the database is shared with the other pgTAP files.
BEGIN;
CREATE SCHEMA ob;
CREATE EXTENSION outbox SCHEMA ob;

SELECT plan(194);

-- Extension

SELECT has_extension('ob', 'outbox', 'outbox is installed in schema ob');
SELECT is((SELECT extversion FROM pg_extension WHERE extname = 'outbox'), '0.2.0',
          'the installed version is 0.2.0');
SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'outbox'), false,
          'the extension is not relocatable');
SELECT is((SELECT superuser FROM pg_available_extension_versions
            WHERE name = 'outbox' AND version = '0.2.0'), true,
          'installing the extension requires a superuser');
SELECT throws_ok('ALTER EXTENSION outbox SET SCHEMA public', '0A000',
                 'extension "outbox" does not support SET SCHEMA',
                 'ALTER EXTENSION SET SCHEMA is refused');

-- Tables

SELECT tables_are('ob', ARRAY['outbox', 'aggregate_publication', 'inbox', 'inbox_consumer',
                              'poison_policy', 'publisher_control', 'publisher_horizon', 'inbox_subscription',
                              'inbox_offset', 'inbox_aggregate', 'inbox_dead_letter', 'inbox_consumer_state'],
                  'the extension creates exactly these tables');
SELECT views_are('ob', ARRAY['outbox_status', 'outbox_aggregate_status', 'outbox_pending',
                             'outbox_events', 'inbox_status'],
                 'the extension creates exactly these views');

SELECT columns_are('ob', 'outbox', ARRAY[
	'id', 'event_id', 'aggregate_type', 'aggregate_id', 'aggregate_version',
	'event_type', 'topic', 'headers', 'payload', 'payload_bytes', 'created_at', 'txid',
	'disposition', 'disposed_at', 'attempts', 'last_error', 'dead_letter_requested'],
	'outbox has the expected columns (nothing per published event)');
SELECT columns_are('ob', 'aggregate_publication', ARRAY[
	'aggregate_id', 'last_published_version', 'last_published_at',
	'blocked_version', 'blocked_at', 'attempts', 'last_error',
	'next_attempt_at', 'paused', 'catch_up', 'updated_at'],
	'aggregate_publication has the expected columns');
SELECT columns_are('ob', 'inbox', ARRAY['consumer', 'event_id', 'processed_at'],
	'inbox has the expected columns');
SELECT columns_are('ob', 'poison_policy', ARRAY['topic', 'aggregate_type', 'policy'],
	'poison_policy has the expected columns');
SELECT columns_are('ob', 'publisher_control', ARRAY['singleton', 'paused', 'changed_at', 'changed_by'],
	'publisher_control has the expected columns');
SELECT columns_are('ob', 'publisher_horizon', ARRAY['worker', 'snapshot', 'updated_at'],
	'publisher_horizon has the expected columns');
-- outbox_pending lists outbox rows: the same columns, in the same order.
SELECT is((SELECT array_agg(attname::text || ' ' || format_type(atttypid, atttypmod) ORDER BY attnum)
             FROM pg_attribute WHERE attrelid = 'ob.outbox_pending'::regclass AND attnum > 0),
          (SELECT array_agg(attname::text || ' ' || format_type(atttypid, atttypmod) ORDER BY attnum)
             FROM pg_attribute WHERE attrelid = 'ob.outbox'::regclass AND attnum > 0 AND NOT attisdropped),
          'outbox_pending has the columns of outbox, in order');
SELECT is((SELECT array_agg(attname::text || ' ' || format_type(atttypid, atttypmod) ORDER BY attnum)
             FROM pg_attribute WHERE attrelid = 'ob.outbox_events'::regclass AND attnum > 0),
          (SELECT array_agg(attname::text || ' ' || format_type(atttypid, atttypmod) ORDER BY attnum)
             FROM pg_attribute WHERE attrelid = 'ob.outbox'::regclass AND attnum > 0 AND NOT attisdropped)
          || ARRAY['state text'],
          'outbox_events has the columns of outbox, then state');

-- Column types and nullability: one test per column and property.
SELECT col_type_is('ob', t, c, ty, format('%s.%s is %s', t, c, ty))
  FROM (VALUES
	('outbox', 'id', 'bigint'),
	('outbox', 'event_id', 'text'),
	('outbox', 'aggregate_type', 'text'),
	('outbox', 'aggregate_id', 'text'),
	('outbox', 'aggregate_version', 'bigint'),
	('outbox', 'event_type', 'text'),
	('outbox', 'topic', 'text'),
	('outbox', 'headers', 'jsonb'),
	('outbox', 'payload', 'jsonb'),
	('outbox', 'payload_bytes', 'bytea'),
	('outbox', 'created_at', 'timestamp with time zone'),
	('outbox', 'txid', 'xid8'),
	('outbox', 'disposition', 'ob.outbox_disposition'),
	('outbox', 'disposed_at', 'timestamp with time zone'),
	('outbox', 'attempts', 'integer'),
	('outbox', 'last_error', 'text'),
	('outbox', 'dead_letter_requested', 'boolean'),
	('poison_policy', 'topic', 'text'),
	('poison_policy', 'aggregate_type', 'text'),
	('poison_policy', 'policy', 'text'),
	('publisher_control', 'singleton', 'boolean'),
	('publisher_control', 'paused', 'boolean'),
	('publisher_control', 'changed_at', 'timestamp with time zone'),
	('publisher_control', 'changed_by', 'text'),
	('aggregate_publication', 'aggregate_id', 'text'),
	('aggregate_publication', 'last_published_version', 'bigint'),
	('aggregate_publication', 'last_published_at', 'timestamp with time zone'),
	('aggregate_publication', 'blocked_version', 'bigint'),
	('aggregate_publication', 'blocked_at', 'timestamp with time zone'),
	('aggregate_publication', 'attempts', 'integer'),
	('aggregate_publication', 'last_error', 'text'),
	('aggregate_publication', 'next_attempt_at', 'timestamp with time zone'),
	('aggregate_publication', 'paused', 'boolean'),
	('aggregate_publication', 'catch_up', 'boolean'),
	('aggregate_publication', 'updated_at', 'timestamp with time zone'),
	('publisher_horizon', 'worker', 'integer'),
	('publisher_horizon', 'snapshot', 'pg_snapshot'),
	('publisher_horizon', 'updated_at', 'timestamp with time zone'),
	('inbox', 'consumer', 'text'),
	('inbox', 'event_id', 'text'),
	('inbox', 'processed_at', 'timestamp with time zone')) AS v(t, c, ty)
 ORDER BY t, c;

SELECT CASE WHEN nn THEN col_not_null('ob', t, c, format('%s.%s is NOT NULL', t, c))
            ELSE col_is_null('ob', t, c, format('%s.%s is nullable', t, c)) END
  FROM (VALUES
	('outbox', 'id', true),
	('outbox', 'event_id', true),
	('outbox', 'aggregate_type', true),
	('outbox', 'aggregate_id', true),
	('outbox', 'aggregate_version', true),
	('outbox', 'event_type', true),
	('outbox', 'topic', true),
	('outbox', 'headers', false),
	('outbox', 'payload', false),
	('outbox', 'payload_bytes', false),
	('outbox', 'created_at', true),
	('outbox', 'txid', true),
	('outbox', 'disposition', false),
	('outbox', 'disposed_at', false),
	('outbox', 'attempts', true),
	('outbox', 'last_error', false),
	('outbox', 'dead_letter_requested', true),
	('poison_policy', 'topic', false),
	('poison_policy', 'aggregate_type', false),
	('poison_policy', 'policy', true),
	('publisher_control', 'singleton', true),
	('publisher_control', 'paused', true),
	('aggregate_publication', 'aggregate_id', true),
	('aggregate_publication', 'last_published_version', true),
	('aggregate_publication', 'blocked_version', false),
	('aggregate_publication', 'attempts', true),
	('aggregate_publication', 'paused', true),
	('aggregate_publication', 'catch_up', true),
	('aggregate_publication', 'updated_at', true),
	('publisher_horizon', 'worker', true),
	('publisher_horizon', 'snapshot', false),
	('publisher_horizon', 'updated_at', true),
	('inbox', 'consumer', true),
	('inbox', 'event_id', true),
	('inbox', 'processed_at', true)) AS v(t, c, nn)
 ORDER BY t, c;

-- Defaults.
SELECT is((SELECT attidentity FROM pg_attribute
            WHERE attrelid = 'ob.outbox'::regclass AND attname = 'id'), 'a'::"char",
          'outbox.id is GENERATED ALWAYS AS IDENTITY');
SELECT col_default_is('ob', 'outbox', 'event_id', '(ob.uuid_v7())::text',
                      'outbox.event_id defaults to uuid_v7(), schema-qualified');
SELECT col_default_is('ob', 'outbox', 'created_at', 'clock_timestamp()',
                      'outbox.created_at defaults to clock_timestamp(), not now()');
SELECT col_default_is('ob', 'outbox', 'attempts', '0', 'outbox.attempts defaults to 0');
SELECT col_default_is('ob', 'outbox', 'dead_letter_requested', 'false',
                      'outbox.dead_letter_requested defaults to false');
SELECT col_default_is('ob', 'outbox', 'txid', 'pg_current_xact_id()',
                      'outbox.txid defaults to the emitting top-level transaction');
SELECT col_hasnt_default('ob', 'outbox', 'disposed_at', 'outbox.disposed_at has no default');
SELECT col_hasnt_default('ob', 'outbox', 'aggregate_version', 'outbox.aggregate_version has no default');
SELECT col_default_is('ob', 'aggregate_publication', 'last_published_version', '0',
                      'aggregate_publication.last_published_version defaults to 0');
SELECT col_default_is('ob', 'aggregate_publication', 'paused', 'false',
                      'aggregate_publication.paused defaults to false');
SELECT col_default_is('ob', 'aggregate_publication', 'catch_up', 'false',
                      'aggregate_publication.catch_up defaults to false');
SELECT col_default_is('ob', 'inbox', 'processed_at', 'now()',
                      'inbox.processed_at defaults to now()');

-- Keys and unique constraints.
SELECT col_is_pk('ob', 'outbox', 'id', 'outbox primary key is id');
SELECT col_is_pk('ob', 'aggregate_publication', 'aggregate_id',
                 'aggregate_publication primary key is aggregate_id');
SELECT col_is_pk('ob', 'inbox', ARRAY['consumer', 'event_id'],
                 'inbox primary key is (consumer, event_id)');
SELECT col_is_pk('ob', 'publisher_control', 'singleton', 'publisher_control primary key is singleton');
SELECT col_is_pk('ob', 'publisher_horizon', 'worker', 'publisher_horizon primary key is worker');
SELECT col_is_unique('ob', 'outbox', 'event_id', 'outbox.event_id is unique');
SELECT col_is_unique('ob', 'poison_policy', 'topic', 'poison_policy.topic is unique');
SELECT col_is_unique('ob', 'poison_policy', 'aggregate_type', 'poison_policy.aggregate_type is unique');
SELECT col_is_unique('ob', 'outbox', ARRAY['aggregate_id', 'aggregate_version'],
                     '(aggregate_id, aggregate_version) is unique');
SELECT is((SELECT pg_get_constraintdef(oid) FROM pg_constraint
            WHERE conrelid = 'ob.outbox'::regclass AND conname = 'outbox_position_unique'),
          'UNIQUE (aggregate_id, aggregate_version)',
          'the position constraint is named outbox_position_unique');
SELECT is((SELECT string_agg(conname || ':' || contype::text, ', ' ORDER BY conname)
             FROM pg_constraint
            WHERE conrelid = 'ob.outbox'::regclass AND contype IN ('p', 'u')),
          'outbox_event_id_key:u, outbox_pkey:p, outbox_position_unique:u',
          'outbox has exactly these primary key and unique constraints');

-- No check constraints on the hot tables: outbox_emit() and inbox_claim()
-- validate their arguments, and the executor would parse every check
-- expression on each single-row insert.  disposition is an enum instead.
SELECT is((SELECT count(*) FROM pg_constraint
            WHERE conrelid IN ('ob.outbox'::regclass, 'ob.inbox'::regclass) AND contype = 'c'),
          0::bigint, 'outbox and inbox carry no check constraints');
SELECT enum_has_labels('ob', 'outbox_disposition', ARRAY['published', 'dead_lettered', 'skipped'],
                       'outbox_disposition has exactly the three outcomes');

-- A valid row to vary: (column list, values) of an insert that succeeds.
CREATE FUNCTION pg_temp.ins(cols text, vals text) RETURNS text LANGUAGE sql AS $$
	SELECT format('INSERT INTO ob.outbox (event_id, aggregate_type, aggregate_id, '
	              'aggregate_version, event_type, topic%s) VALUES (%s)',
	              CASE WHEN cols = '' THEN '' ELSE ', ' || cols END, vals)
$$;
SELECT lives_ok(pg_temp.ins('', $$'e-ok', 't', 'a', 1, 'E', 'x'$$),
                'a direct insert of a valid pending row works');
SELECT is((SELECT txid FROM ob.outbox WHERE event_id = 'e-ok'), pg_current_xact_id(),
          'its txid is the inserting transaction''s');
SELECT throws_ok(pg_temp.ins('disposed_at, disposition', $$'e-1', 't', 'a', 2, 'E', 'x', now(), 'sent'$$),
                 '22P02', 'invalid input value for enum ob.outbox_disposition: "sent"',
                 'an unknown disposition is rejected');
SELECT lives_ok(pg_temp.ins('disposed_at, disposition', format($$'e-%s', 't', 'a', %s, 'E', 'x', now(), %L$$, i + 1, i + 1, d)),
                format('disposition %s with disposed_at is accepted', d))
  FROM unnest(ARRAY['dead_lettered', 'skipped']) WITH ORDINALITY AS u(d, i);
SELECT throws_ok(pg_temp.ins('txid', $$'e-null-txid', 't', 'a', 9, 'E', 'x', NULL$$), '23502', NULL,
                 'outbox.txid cannot be NULL');
SELECT throws_ok(pg_temp.ins('', $$'e-ok', 't', 'b', 1, 'E', 'x'$$), '23505',
                 'duplicate key value violates unique constraint "outbox_event_id_key"',
                 'a duplicate event_id is rejected by the table');
SELECT throws_ok(pg_temp.ins('', $$'e-other', 't', 'a', 1, 'E', 'x'$$), '23505',
                 'duplicate key value violates unique constraint "outbox_position_unique"',
                 'a duplicate (aggregate_id, aggregate_version) is rejected by the table');
SELECT throws_ok($$INSERT INTO ob.outbox (id, event_id, aggregate_type, aggregate_id,
                   aggregate_version, event_type, topic) VALUES (1, 'e-id', 't', 'z', 1, 'E', 'x')$$,
                 '428C9', NULL, 'outbox.id cannot be supplied');
SELECT throws_ok($$INSERT INTO ob.poison_policy (topic, aggregate_type, policy) VALUES ('t', 'a', 'skip')$$,
                 '23514', 'new row for relation "poison_policy" violates check constraint "poison_policy_one_key"',
                 'a poison policy is for a topic or an aggregate type, not both');
SELECT throws_ok($$INSERT INTO ob.poison_policy (policy) VALUES ('skip')$$,
                 '23514', 'new row for relation "poison_policy" violates check constraint "poison_policy_one_key"',
                 'a poison policy needs a topic or an aggregate type');
SELECT throws_ok($$INSERT INTO ob.poison_policy (topic, policy) VALUES ('t', 'retry')$$,
                 '23514', 'new row for relation "poison_policy" violates check constraint "poison_policy_policy_check"',
                 'an unknown poison policy is rejected');
SELECT lives_ok($$INSERT INTO ob.poison_policy (topic, policy)
                  VALUES ('t1', 'block'), ('t2', 'dead_letter'), ('t3', 'skip')$$,
                'the three poison policies are accepted');
SELECT is((SELECT count(*) FROM ob.publisher_control WHERE NOT paused), 1::bigint,
          'publisher_control has its one row, not paused');
SELECT throws_ok($$INSERT INTO ob.publisher_control DEFAULT VALUES$$, '23505', NULL,
                 'publisher_control cannot have a second row');
SELECT throws_ok($$INSERT INTO ob.publisher_control (singleton) VALUES (false)$$, '23514', NULL,
                 'publisher_control.singleton must be true');

-- Indexes.
SELECT indexes_are('ob', 'outbox', ARRAY['outbox_pkey', 'outbox_event_id_key',
                   'outbox_position_unique', 'outbox_txid_idx', 'outbox_disposed_idx'],
                   'outbox has exactly the expected indexes');
SELECT has_index('ob', 'outbox', 'outbox_txid_idx', ARRAY['txid', 'aggregate_version', 'id', 'aggregate_id'],
                 'the stream index is on txid and carries each event''s version, id and aggregate');
SELECT is((SELECT indnkeyatts FROM pg_index WHERE indexrelid = 'ob.outbox_txid_idx'::regclass),
          1::int2, 'the stream index''s key is txid alone (the rest is included)');
SELECT index_is_type('ob', 'outbox', 'outbox_txid_idx', 'btree', 'the stream index is a btree');
SELECT is((SELECT indpred IS NULL FROM pg_index WHERE indexrelid = 'ob.outbox_txid_idx'::regclass),
          true, 'the stream index holds every row (no predicate)');
SELECT isnt((SELECT indisunique FROM pg_index WHERE indexrelid = 'ob.outbox_txid_idx'::regclass),
            true, 'the stream index is not unique (a transaction emits many events)');
SELECT indexes_are('ob', 'aggregate_publication', ARRAY['aggregate_publication_pkey',
                   'aggregate_publication_exception_idx'],
                   'aggregate_publication has exactly the expected indexes');
SELECT has_index('ob', 'aggregate_publication', 'aggregate_publication_exception_idx', 'aggregate_id',
                 'the exception index is on aggregate_id');
SELECT is((SELECT pg_get_expr(indpred, indrelid) FROM pg_index
            WHERE indexrelid = 'ob.aggregate_publication_exception_idx'::regclass),
          '(paused OR (blocked_version IS NOT NULL) OR (next_attempt_at IS NOT NULL) OR catch_up)',
          'the exception index holds the aggregates read by index only');
SELECT is((SELECT pg_get_expr(indpred, indrelid) FROM pg_index
            WHERE indexrelid = 'ob.outbox_disposed_idx'::regclass),
          '(disposition = ANY (ARRAY[''dead_lettered''::ob.outbox_disposition, ''skipped''::ob.outbox_disposition]))',
          'the disposed index holds dead-lettered and skipped rows only');
SELECT has_index('ob', 'inbox', 'inbox_processed_at_idx', 'processed_at',
                 'the inbox has an index for retention by processed_at');

-- Types.
SELECT has_composite('ob', 'emitted_event', 'the emitted_event composite type exists');
SELECT is((SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
             FROM pg_attribute
            WHERE attrelid = 'ob.emitted_event'::regclass AND attnum > 0 AND NOT attisdropped),
          'id bigint, event_id text, aggregate_version bigint, topic text',
          'emitted_event is (id bigint, event_id text, aggregate_version bigint, topic text)');

-- Functions.
SELECT functions_are('ob', ARRAY['uuid_v7', 'outbox_emit', 'outbox_emit_raw', 'outbox_emit_many',
                     'outbox_emit_many_raw', 'inbox_claim',
                     'outbox_counters', 'outbox_latency_histogram', 'outbox_test_fatal_error',
                     'outbox_lock_aggregate', 'outbox_note_write', 'outbox_wake_on_commit', 'outbox_workers',
                     'outbox_publisher', 'outbox_check_publisher',
                     'outbox_check_arg', 'outbox_retry', 'outbox_pending_event', 'outbox_settled',
                     'outbox_catch_up',
                     'outbox_skip', 'outbox_dead_letter', 'outbox_replay', 'outbox_pause',
                     'outbox_resume', 'inbox_subscribe', 'inbox_unsubscribe', 'inbox_partition',
                     'inbox_retry', 'inbox_skip'],
                     'the extension creates exactly these functions');
SELECT has_function('ob', 'outbox_emit',
                    ARRAY['text', 'text', 'text', 'jsonb', 'text', 'jsonb', 'text', 'bigint'],
                    'outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint) exists');
SELECT is(pg_get_function_arguments('ob.outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint)'::regprocedure),
          'aggregate_type text, aggregate_id text, event_type text, payload jsonb, '
          'topic text DEFAULT NULL::text, headers jsonb DEFAULT NULL::jsonb, '
          'event_id text DEFAULT NULL::text, aggregate_version bigint DEFAULT NULL::bigint',
          'outbox_emit has named arguments, the last four defaulting to NULL');
SELECT function_returns('ob', 'outbox_emit',
                        ARRAY['text', 'text', 'text', 'jsonb', 'text', 'jsonb', 'text', 'bigint'],
                        'ob.emitted_event', 'outbox_emit returns emitted_event');
SELECT function_lang_is('ob', 'outbox_emit',
                        ARRAY['text', 'text', 'text', 'jsonb', 'text', 'jsonb', 'text', 'bigint'],
                        'c', 'outbox_emit is written in C');
SELECT volatility_is('ob', 'outbox_emit',
                     ARRAY['text', 'text', 'text', 'jsonb', 'text', 'jsonb', 'text', 'bigint'],
                     'volatile', 'outbox_emit is volatile');
SELECT isnt_strict('ob', 'outbox_emit',
                   ARRAY['text', 'text', 'text', 'jsonb', 'text', 'jsonb', 'text', 'bigint'],
                   'outbox_emit is not strict (a NULL payload is a tombstone)');

-- outbox_emit_raw: the same arguments, a text or bytea payload.
SELECT is(pg_get_function_arguments(format('ob.outbox_emit_raw(text, text, text, %s, text, jsonb, text, bigint)', t)::regprocedure),
          format('aggregate_type text, aggregate_id text, event_type text, payload %s, '
                 'topic text DEFAULT NULL::text, headers jsonb DEFAULT NULL::jsonb, '
                 'event_id text DEFAULT NULL::text, aggregate_version bigint DEFAULT NULL::bigint', t),
          format('outbox_emit_raw(.., payload %s, ..) has outbox_emit''s named arguments', t))
  FROM unnest(ARRAY['text', 'bytea']) AS t;
SELECT isnt_strict('ob', 'outbox_emit_raw', ARRAY['text', 'text', 'text', t, 'text', 'jsonb', 'text', 'bigint'],
                   format('outbox_emit_raw(.., %s, ..) is not strict', t))
  FROM unnest(ARRAY['text', 'bytea']) AS t;
SELECT is(pg_get_function_arguments('ob.outbox_emit_many(ob.outbox_event[])'::regprocedure),
          'events ob.outbox_event[]', 'outbox_emit_many takes an array of outbox_event');
SELECT function_lang_is('ob', 'outbox_emit_many', ARRAY['ob.outbox_event[]'], 'c',
                        'outbox_emit_many is written in C (a SQL body would be planned on every call)');
SELECT is((SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
             FROM pg_attribute
            WHERE attrelid = 'ob.outbox_event'::regclass AND attnum > 0 AND NOT attisdropped),
          'aggregate_type text, aggregate_id text, event_type text, payload jsonb, topic text, '
          'headers jsonb, event_id text, aggregate_version bigint',
          'outbox_event has outbox_emit''s arguments');
SELECT is(pg_get_function_arguments(format('ob.outbox_emit_many_raw(ob.outbox_event_%s[])', t)::regprocedure),
          format('events ob.outbox_event_%s[]', t),
          format('outbox_emit_many_raw takes an array of outbox_event_%s', t))
  FROM unnest(ARRAY['text', 'bytea']) AS t;
SELECT is((SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
             FROM pg_attribute
            WHERE attrelid = format('ob.outbox_event_%s', t)::regclass AND attnum > 0 AND NOT attisdropped),
          format('aggregate_type text, aggregate_id text, event_type text, payload %s, topic text, '
                 'headers jsonb, event_id text, aggregate_version bigint', t),
          format('outbox_event_%s has outbox_emit_raw''s arguments', t))
  FROM unnest(ARRAY['text', 'bytea']) AS t;

SELECT has_function('ob', 'inbox_claim', ARRAY['text', 'text'], 'inbox_claim(text, text) exists');
SELECT is(pg_get_function_arguments('ob.inbox_claim(text, text)'::regprocedure),
          'consumer text, event_id text', 'inbox_claim has named arguments');
SELECT function_returns('ob', 'inbox_claim', ARRAY['text', 'text'], 'boolean',
                        'inbox_claim returns boolean');
SELECT function_lang_is('ob', 'inbox_claim', ARRAY['text', 'text'], 'c',
                        'inbox_claim is written in C (it sees the calling role)');
SELECT volatility_is('ob', 'inbox_claim', ARRAY['text', 'text'], 'volatile',
                     'inbox_claim is volatile');

SELECT has_function('ob', 'uuid_v7', ARRAY[]::text[], 'uuid_v7() exists');
SELECT function_returns('ob', 'uuid_v7', ARRAY[]::text[], 'uuid', 'uuid_v7 returns uuid');
SELECT volatility_is('ob', 'uuid_v7', ARRAY[]::text[], 'volatile', 'uuid_v7 is volatile');
SELECT isnt_definer('ob', 'uuid_v7', ARRAY[]::text[], 'uuid_v7 is not SECURITY DEFINER');

SELECT function_returns('ob', 'outbox_counters', ARRAY[]::text[], 'setof record',
                        'outbox_counters returns a set of records');
SELECT is(pg_get_function_arguments('ob.outbox_counters()'::regprocedure),
          'OUT name text, OUT value bigint', 'outbox_counters returns (name text, value bigint)');
SELECT function_returns('ob', 'outbox_latency_histogram', ARRAY[]::text[], 'setof record',
                        'outbox_latency_histogram returns a set of records');
SELECT is(pg_get_function_arguments('ob.outbox_latency_histogram()'::regprocedure),
          'OUT le_ms double precision, OUT count bigint',
          'outbox_latency_histogram returns (le_ms float8, count bigint)');
SELECT isnt_definer('ob', 'outbox_counters', ARRAY[]::text[], 'outbox_counters is not SECURITY DEFINER');

-- The emit functions write the outbox as its owner themselves (no SQL, no
-- name lookup): neither SECURITY DEFINER nor a SET clause to pay for.
SELECT is((SELECT string_agg(oid::regprocedure::text, ' ' ORDER BY oid::regprocedure::text) FROM pg_proc
            WHERE pronamespace = 'ob'::regnamespace AND proname LIKE 'outbox\_emit%'
              AND (prosecdef OR proconfig IS NOT NULL)),
          NULL, 'no emit function is SECURITY DEFINER or has a SET clause');
SELECT is((SELECT count(*)::int FROM pg_proc
            WHERE pronamespace = 'ob'::regnamespace AND proname LIKE 'outbox\_emit%'),
          6, 'the emit functions checked above are all six');
-- SECURITY DEFINER with a pinned search_path.
SELECT isnt_definer('ob', 'inbox_claim', ARRAY['text', 'text'],
                    'inbox_claim is not SECURITY DEFINER: it authorises the calling role');
SELECT is((SELECT proconfig FROM pg_proc WHERE oid = 'ob.inbox_claim(text, text)'::regprocedure),
          ARRAY['search_path=pg_catalog, pg_temp'],
          'inbox_claim pins search_path to pg_catalog, pg_temp');
SELECT is((SELECT string_agg(proname, ' ' ORDER BY proname) FROM pg_proc
            WHERE pronamespace = 'ob'::regnamespace AND prosecdef),
          'inbox_retry inbox_skip outbox_dead_letter outbox_pause '
          'outbox_replay outbox_resume outbox_retry outbox_skip',
          'the SECURITY DEFINER functions are the operator functions');
-- outbox_catch_up is internal: called by the SECURITY DEFINER operator
-- functions, not one itself, with a pinned search_path.
SELECT function_returns('ob', 'outbox_catch_up', ARRAY['text'], 'void', 'outbox_catch_up returns void');
SELECT isnt_definer('ob', 'outbox_catch_up', ARRAY['text'], 'outbox_catch_up is not SECURITY DEFINER');
SELECT is((SELECT proconfig FROM pg_proc WHERE oid = 'ob.outbox_catch_up(text)'::regprocedure),
          ARRAY['search_path=pg_catalog, pg_temp'], 'outbox_catch_up pins search_path');
-- Every SECURITY DEFINER function of the extension pins search_path.
SELECT is_empty($$SELECT oid::regprocedure FROM pg_proc
                   WHERE pronamespace = 'ob'::regnamespace AND prosecdef
                     AND NOT coalesce(proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)$$,
                'every SECURITY DEFINER function pins its search_path');

-- The tables belong to the extension (DROP EXTENSION removes them).
SELECT is_empty($$SELECT c.oid::regclass FROM pg_class c
                   WHERE c.relnamespace = 'ob'::regnamespace AND c.relkind = 'r'
                     AND NOT EXISTS (SELECT 1 FROM pg_depend d
                                      WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                                        AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e')$$,
                'every table of the schema is a member of the extension');

-- pg_dump does not dump the tables of an extension, nor their rows, unless
-- the extension marks them with pg_extension_config_dump(): without it a
-- dump and restore loses every pending event, the inbox (consumers then
-- process events again), last_published_version (versions are assigned
-- again from 1 once retention deleted the published rows) and the poison
-- policies.  publisher_control's one row is made by the install script, so
-- dumping it would collide on restore; publisher_horizon's snapshots mean
-- nothing in another cluster (without a row the publisher reads every
-- unsettled event), nor do inbox_consumer_state's live connection states.
SELECT is((SELECT array_agg(c::regclass::text ORDER BY c::regclass::text)
             FROM pg_extension e, unnest(e.extconfig) AS c WHERE e.extname = 'outbox'),
          ARRAY['ob.aggregate_publication', 'ob.inbox', 'ob.inbox_aggregate', 'ob.inbox_consumer',
                'ob.inbox_dead_letter', 'ob.inbox_dead_letter_id_seq', 'ob.inbox_offset',
                'ob.inbox_subscription', 'ob.outbox', 'ob.outbox_id_seq', 'ob.poison_policy'],
          'pg_dump dumps the rows of every table of the extension but publisher_control, publisher_horizon and inbox_consumer_state');
SELECT ok(coalesce((SELECT pg_get_serial_sequence('ob.outbox', 'id')::regclass = ANY (e.extconfig)
                      FROM pg_extension e WHERE e.extname = 'outbox'), false),
          'pg_dump dumps the outbox id sequence (else restored ids restart at 1)');

-- Writes into the outbox that bypass outbox_emit*() mark their transaction
-- for the publishers' flush (asynchronous commits), replication role or not.
SELECT has_trigger('ob', 'outbox', 'outbox_note_write', 'the outbox has its statement trigger');
SELECT is((SELECT tgenabled FROM pg_trigger WHERE tgrelid = 'ob.outbox'::regclass
            AND tgname = 'outbox_note_write'), 'A', 'the trigger fires always (ENABLE ALWAYS)');
SELECT has_trigger('ob', 'outbox', 'outbox_note_applied', 'the outbox has its row trigger for replication apply');
SELECT is((SELECT tgenabled::text || ' ' || (tgtype & 1)::text FROM pg_trigger WHERE tgrelid = 'ob.outbox'::regclass
            AND tgname = 'outbox_note_applied'), 'R 1',
          'the row trigger fires per row only in replica mode (ENABLE REPLICA): never for emitters');
SELECT throws_ok($$SELECT ob.outbox_note_write()$$, '39P01', NULL,
                 'outbox_note_write() is refused outside a trigger');

SELECT * FROM finish();
ROLLBACK;
