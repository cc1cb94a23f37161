/* outbox--0.2.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION outbox" to load this file. \quit

-- Names bind to the search_path when an object is created, and CREATE
-- EXTENSION runs with the target schema on it: whoever may create objects
-- there (in PG15 the database owner owns public) could plant a
-- better-matching num_nonnulls(text, text) or =(text, text) that a
-- superuser's inserts would then run.  So every function, aggregate and
-- operator in constraints, defaults, index predicates and views is
-- schema-qualified, and so is every function call and operator in function
-- bodies, although bodies are bound at run time under their pinned
-- search_path (pg_catalog, pg_temp), where operators can only resolve to
-- pg_catalog's (pg_temp is never searched for functions and operators): a
-- body stays safe if its pin is ever lost.  Built-in type names need no
-- qualification: a type name matches exactly, and pg_catalog is searched
-- before the target schema (and before pg_temp when bodies run).
-- test/tools/sql_qualified.pl checks all of this (TAP 007).

--
-- Events written by outbox_emit() in the caller's transaction.
--
-- The row's id orders nothing but the publisher's scan: business order is
-- (aggregate_id, aggregate_version), assigned under a per-aggregate lock and
-- guarded by a unique constraint.
--
-- What became of an event (an enum rather than a CHECK: see below).
CREATE TYPE @extschema@.outbox_disposition AS ENUM ('published', 'dead_lettered', 'skipped');

CREATE TABLE @extschema@.outbox (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	-- outbox_emit() validates the arguments (non-empty, positive version,
	-- length limits).  Not repeated as CHECK constraints: the executor
	-- parses every check expression of a table on each single-row insert,
	-- which made them a sixth of the cost of an emit.
	event_id text NOT NULL UNIQUE,
	aggregate_type text NOT NULL,
	aggregate_id text NOT NULL,
	aggregate_version bigint NOT NULL,
	event_type text NOT NULL,
	topic text NOT NULL,
	headers jsonb,
	-- The message value: a JSON payload in payload, or the exact bytes of a
	-- text or bytea payload (outbox_emit_raw) in payload_bytes; both NULL
	-- for a tombstone.  outbox_emit() never sets both.
	payload jsonb,
	payload_bytes bytea,
	created_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
	-- The emitting top-level transaction: the publisher reads the events
	-- committed since its last read as PgQ does, by the transactions a
	-- snapshot sees that the previous one did not (docs/architecture.md).
	txid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
	-- Whether an event is published is not written per event: its
	-- aggregate's last_published_version says it (see outbox_pending).
	-- Only an event a poison policy or an operator disposed of otherwise
	-- records it here: dead_lettered or skipped, and when.
	disposition @extschema@.outbox_disposition,
	disposed_at timestamptz,
	attempts integer NOT NULL DEFAULT 0,
	last_error text,
	-- Set by outbox_dead_letter(): the publisher sends the event to the
	-- dead-letter topic instead of its own.
	dead_letter_requested boolean NOT NULL DEFAULT false,
	CONSTRAINT outbox_position_unique UNIQUE (aggregate_id, aggregate_version)
);

-- The publisher's reads: the events of the transactions committed since
-- its previous read have txid at or above that read's snapshot's xmin.
-- The entry carries all a read needs to place an event besides its row
-- (its version, its id, its aggregate, whose hash says the bucket and so
-- the worker), so that a worker reads the index alone and visits the heap
-- only for the rows of its share.  Included, not keys: an insert compares
-- the txid alone.
CREATE INDEX outbox_txid_idx ON @extschema@.outbox (txid)
	INCLUDE (aggregate_version, id, aggregate_id);

-- Every row is inserted once and deleted by retention (nothing updates a
-- published row): vacuum after 1% (plus 1000 rows) has changed rather than
-- the default 20%, and after inserts (PG13+) to set visibility.
ALTER TABLE @extschema@.outbox SET (
	autovacuum_vacuum_scale_factor = 0.01,
	autovacuum_vacuum_threshold = 1000,
	autovacuum_vacuum_insert_scale_factor = 0.01,
	autovacuum_analyze_scale_factor = 0.02,
	fillfactor = 90
);

--
-- One row per aggregate, owned by the publisher: emitters never write or
-- lock it (they only read last_published_version, without a lock, so that
-- version assignment survives retention deleting published rows).
--
CREATE TABLE @extschema@.aggregate_publication (
	aggregate_id text PRIMARY KEY,
	last_published_version bigint NOT NULL DEFAULT 0,
	last_published_at timestamptz,
	-- Poison handling: the version the aggregate is stopped at, and why.
	blocked_version bigint,
	blocked_at timestamptz,
	attempts integer NOT NULL DEFAULT 0,
	last_error text,
	next_attempt_at timestamptz,
	paused boolean NOT NULL DEFAULT false,
	-- Set when the aggregate's pending events are to be read by its index
	-- rather than from the stream of new commits (after a failure, an
	-- operator's retry, skip or replay); the publisher clears it once a read
	-- finds nothing pending.
	catch_up boolean NOT NULL DEFAULT false,
	updated_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);

-- The aggregates the publisher reads by index, not from the stream: few.
CREATE INDEX aggregate_publication_exception_idx
	ON @extschema@.aggregate_publication (aggregate_id)
	WHERE paused OR blocked_version IS NOT NULL OR next_attempt_at IS NOT NULL OR catch_up;

-- Updated once per published batch of each aggregate: leave room for HOT
-- updates (no indexed column changes) and vacuum it eagerly.
ALTER TABLE @extschema@.aggregate_publication SET (
	fillfactor = 70,
	autovacuum_vacuum_scale_factor = 0.02,
	autovacuum_vacuum_threshold = 500
);

--
-- Consumer-side deduplication: one row per (consumer, event) processed.
--
CREATE TABLE @extschema@.inbox (
	-- inbox_claim() rejects empty and overlong values (no CHECK: see outbox).
	consumer text NOT NULL,
	event_id text NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (consumer, event_id)
);

CREATE INDEX inbox_processed_at_idx ON @extschema@.inbox (processed_at);

-- Insert-only until retention: vacuum mainly for visibility and freezing.
ALTER TABLE @extschema@.inbox SET (
	autovacuum_vacuum_insert_scale_factor = 0.05,
	autovacuum_vacuum_scale_factor = 0.05
);

--
-- Poison policy overrides: by topic, else by aggregate type, else the
-- outbox.poison_policy setting.
--
CREATE TABLE @extschema@.poison_policy (
	topic text UNIQUE,
	aggregate_type text UNIQUE,
	policy text NOT NULL
		CHECK (policy OPERATOR(pg_catalog.=) ANY ('{block,dead_letter,skip}'::text[])),
	CONSTRAINT poison_policy_one_key
		CHECK (pg_catalog.num_nonnulls(topic, aggregate_type) OPERATOR(pg_catalog.=) 1)
);

COMMENT ON TABLE @extschema@.poison_policy IS
'what the publisher does with an event that keeps failing with a permanent error, per topic or aggregate type';

-- One row: publishing paused as a whole by outbox_pause().
CREATE TABLE @extschema@.publisher_control (
	singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
	paused boolean NOT NULL DEFAULT false,
	changed_at timestamptz,
	changed_by text
);
INSERT INTO @extschema@.publisher_control DEFAULT VALUES;

-- Per publisher worker: every event of its share of the buckets its
-- snapshot sees is settled (its version at or below its aggregate's
-- last_published_version, or disposed of) or belongs to an aggregate read
-- by index (catch_up, backing off, blocked, paused); NULL: nothing yet.
-- A worker that starts reads from the oldest row.  Not dumped: transaction
-- ids mean nothing in another cluster, and without a horizon the publisher
-- starts by reading every unsettled event.
CREATE TABLE @extschema@.publisher_horizon (
	worker integer PRIMARY KEY,
	snapshot pg_snapshot,
	updated_at timestamptz NOT NULL
);

REVOKE ALL ON @extschema@.outbox, @extschema@.aggregate_publication,
	@extschema@.inbox, @extschema@.poison_policy,
	@extschema@.publisher_control, @extschema@.publisher_horizon FROM PUBLIC;

-- pg_dump must keep the data: pending events, versions, the inbox.  (The
-- publisher_control row is created by this script; its state is not kept.)
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.outbox_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.aggregate_publication', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.inbox', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.poison_policy', '');

--
-- Functions
--
CREATE FUNCTION @extschema@.uuid_v7()
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_uuid_v7'
LANGUAGE C VOLATILE PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.uuid_v7() IS
'a time-ordered UUID (RFC 9562 version 7), the default event_id';

ALTER TABLE @extschema@.outbox
	ALTER COLUMN event_id SET DEFAULT @extschema@.uuid_v7()::text;

-- A statement that writes rows into the outbox itself (INSERT, COPY by its
-- owner; outbox_emit*() mark their transaction without it): if its
-- transaction commits asynchronously, publishers flush the WAL past that
-- commit before publishing the rows (invariant 1).  ALWAYS: also under
-- session_replication_role = replica (pg_restore, replication tools).
CREATE FUNCTION @extschema@.outbox_note_write()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_note_write'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION @extschema@.outbox_note_write() FROM PUBLIC;
CREATE TRIGGER outbox_note_write AFTER INSERT ON @extschema@.outbox
	FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.outbox_note_write();
ALTER TABLE @extschema@.outbox ENABLE ALWAYS TRIGGER outbox_note_write;
-- Logical replication's apply fires no statement trigger on INSERT, and
-- commits asynchronously by default: its rows mark their transaction by a
-- row trigger that fires only in replica mode (so not for ordinary emitters).
CREATE TRIGGER outbox_note_applied AFTER INSERT ON @extschema@.outbox
	FOR EACH ROW EXECUTE FUNCTION @extschema@.outbox_note_write();
ALTER TABLE @extschema@.outbox ENABLE REPLICA TRIGGER outbox_note_applied;

CREATE TYPE @extschema@.emitted_event AS (
	id bigint,
	event_id text,
	aggregate_version bigint,
	topic text
);

-- Applications need EXECUTE only, never table privileges: the function
-- writes the outbox as the table's owner itself, after its checks, without
-- running any SQL (so without name lookups a caller's objects could
-- capture).  Not SECURITY DEFINER: the switch of user and search_path
-- around every call cost more than the insert it protected.
CREATE FUNCTION @extschema@.outbox_emit(
	aggregate_type text,
	aggregate_id text,
	event_type text,
	payload jsonb,
	topic text DEFAULT NULL,
	headers jsonb DEFAULT NULL,
	event_id text DEFAULT NULL,
	aggregate_version bigint DEFAULT NULL)
RETURNS @extschema@.emitted_event
AS 'MODULE_PATHNAME', 'outbox_emit'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint) IS
'write one event to the outbox in the current transaction';

-- The same with a payload sent byte for byte: text (its bytes in the
-- database encoding) or bytea (Avro, Protobuf, signed JSON...).  Not an
-- overload of outbox_emit: an untyped literal payload would then resolve
-- to text, and outbox_emit('a', 'b', 'c', '{"x": 1}') must stay jsonb.
CREATE FUNCTION @extschema@.outbox_emit_raw(
	aggregate_type text,
	aggregate_id text,
	event_type text,
	payload bytea,
	topic text DEFAULT NULL,
	headers jsonb DEFAULT NULL,
	event_id text DEFAULT NULL,
	aggregate_version bigint DEFAULT NULL)
RETURNS @extschema@.emitted_event
AS 'MODULE_PATHNAME', 'outbox_emit_raw'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.outbox_emit_raw(text, text, text, bytea, text, jsonb, text, bigint) IS
'write one event whose payload is sent exactly as these bytes';

CREATE FUNCTION @extschema@.outbox_emit_raw(
	aggregate_type text,
	aggregate_id text,
	event_type text,
	payload text,
	topic text DEFAULT NULL,
	headers jsonb DEFAULT NULL,
	event_id text DEFAULT NULL,
	aggregate_version bigint DEFAULT NULL)
RETURNS @extschema@.emitted_event
AS 'MODULE_PATHNAME', 'outbox_emit_raw'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.outbox_emit_raw(text, text, text, text, text, jsonb, text, bigint) IS
'write one event whose payload is sent exactly as this text''s bytes';

-- One event of outbox_emit_many(): outbox_emit()'s arguments.  (Adding a
-- field needs outbox_emit_many() changed with it.)
CREATE TYPE @extschema@.outbox_event AS (
	aggregate_type text,
	aggregate_id text,
	event_type text,
	payload jsonb,
	topic text,
	headers jsonb,
	event_id text,
	aggregate_version bigint
);

-- Many events in one call, emitted in array order, each exactly as
-- outbox_emit() would; a failed event fails the call: nothing of it is
-- written.  In C rather than SQL: a SQL function body would be planned
-- again on every call.
CREATE FUNCTION @extschema@.outbox_emit_many(events @extschema@.outbox_event[])
RETURNS SETOF @extschema@.emitted_event
AS 'MODULE_PATHNAME', 'outbox_emit_many'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.outbox_emit_many(@extschema@.outbox_event[]) IS
'write many events to the outbox in the current transaction, in array order';

-- The same with payloads sent byte for byte, as outbox_emit_raw(): one
-- event type per payload type, fields as outbox_event's.
CREATE TYPE @extschema@.outbox_event_bytea AS (
	aggregate_type text,
	aggregate_id text,
	event_type text,
	payload bytea,
	topic text,
	headers jsonb,
	event_id text,
	aggregate_version bigint
);

CREATE TYPE @extschema@.outbox_event_text AS (
	aggregate_type text,
	aggregate_id text,
	event_type text,
	payload text,
	topic text,
	headers jsonb,
	event_id text,
	aggregate_version bigint
);

CREATE FUNCTION @extschema@.outbox_emit_many_raw(events @extschema@.outbox_event_bytea[])
RETURNS SETOF @extschema@.emitted_event
AS 'MODULE_PATHNAME', 'outbox_emit_many_raw'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.outbox_emit_many_raw(@extschema@.outbox_event_bytea[]) IS
'write many events whose payloads are sent exactly as these bytes, in array order';

CREATE FUNCTION @extschema@.outbox_emit_many_raw(events @extschema@.outbox_event_text[])
RETURNS SETOF @extschema@.emitted_event
AS 'MODULE_PATHNAME', 'outbox_emit_many_raw'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION @extschema@.outbox_emit_many_raw(@extschema@.outbox_event_text[]) IS
'write many events whose payloads are sent exactly as these texts'' bytes, in array order';

-- Shared argument checks of inbox_claim() and the operator functions: not
-- NULL (22004), not empty (22023), at most 1024 bytes (22001).
CREATE FUNCTION @extschema@.outbox_check_arg(name text, value text)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_check_arg'
LANGUAGE C IMMUTABLE;

-- Who may claim for a consumer: a consumer listed here only members of its
-- role (checked against current_user, as privileges are: in an inbox
-- handler, the subscribing role).  An unlisted consumer name may be claimed
-- for by any role with EXECUTE on inbox_claim().
CREATE TABLE @extschema@.inbox_consumer (
	consumer text PRIMARY KEY,
	role name NOT NULL
);

COMMENT ON TABLE @extschema@.inbox_consumer IS
'consumers whose events only members of a role may claim with inbox_claim()';

REVOKE ALL ON @extschema@.inbox_consumer FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('@extschema@.inbox_consumer', '');

-- Not SECURITY DEFINER: the claimant is the calling role (current_user; in
-- a handler, the role the inbox worker runs it as), which the C function
-- checks against inbox_consumer before it writes the inbox as the
-- function's owner.
CREATE FUNCTION @extschema@.inbox_claim(consumer text, event_id text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'inbox_claim'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.inbox_claim(text, text) IS
'true if this transaction claimed the event for the consumer, false if it was already processed';

REVOKE ALL ON FUNCTION
	@extschema@.outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint),
	@extschema@.outbox_emit_raw(text, text, text, bytea, text, jsonb, text, bigint),
	@extschema@.outbox_emit_raw(text, text, text, text, text, jsonb, text, bigint),
	@extschema@.outbox_emit_many(@extschema@.outbox_event[]),
	@extschema@.outbox_emit_many_raw(@extschema@.outbox_event_bytea[]),
	@extschema@.outbox_emit_many_raw(@extschema@.outbox_event_text[]),
	@extschema@.inbox_claim(text, text)
	FROM PUBLIC;

--
-- Publisher counters since server start (shared memory).
--
CREATE FUNCTION @extschema@.outbox_counters(OUT name text, OUT value bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_counters'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.outbox_counters() IS
'publisher and inbox worker counters since server start; export as outbox_<name>_total';

CREATE FUNCTION @extschema@.outbox_latency_histogram(OUT le_ms float8, OUT count bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_latency_histogram'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.outbox_latency_histogram() IS
'cumulative histogram of emit-to-acknowledgement latency since server start';

REVOKE ALL ON FUNCTION @extschema@.outbox_counters(),
	@extschema@.outbox_latency_histogram() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_counters(),
	@extschema@.outbox_latency_histogram() TO pg_monitor;

CREATE FUNCTION @extschema@.outbox_test_fatal_error()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_test_fatal_error'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.outbox_test_fatal_error() IS
'fault injection for tests: the publisher raises a fatal producer error (needs outbox.enable_test_hooks)';

REVOKE ALL ON FUNCTION @extschema@.outbox_test_fatal_error() FROM PUBLIC;

--
-- Operator functions.  SECURITY DEFINER with a pinned search_path; EXECUTE
-- is revoked from PUBLIC: grant them to an operator role.  Each takes the
-- publisher's lock of the aggregate's bucket before it reads or locks any
-- row, so it never races a batch in flight (it waits at most
-- outbox.delivery_timeout), and wakes the publisher when it commits.  The
-- publisher takes the same lock before it writes the aggregate's rows: one
-- lock order everywhere, so no deadlock (test/isolation/specs/operator_lock_order.spec).
--
CREATE FUNCTION @extschema@.outbox_lock_aggregate(aggregate_id text)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_lock_aggregate'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.outbox_lock_aggregate(text) IS
'internal: wait for the publisher''s lock of the aggregate, until the end of the transaction; wake the publisher at commit';

CREATE FUNCTION @extschema@.outbox_wake_on_commit()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_wake_on_commit'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.outbox_wake_on_commit() IS
'internal: wake the publisher when this transaction commits';

CREATE FUNCTION @extschema@.outbox_workers(OUT worker integer, OUT pid integer,
	OUT state text, OUT last_batch_at timestamptz,
	OUT problem text, OUT problem_since timestamptz, OUT database name)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_worker_status'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.outbox_workers() IS
'state of each publisher worker of every served database, and what hinders it (cannot connect, producer refused, brokers down, ...)';

CREATE FUNCTION @extschema@.outbox_publisher(OUT state text, OUT detail text)
RETURNS record
AS 'MODULE_PATHNAME', 'outbox_publisher'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.outbox_publisher() IS
'whether a publisher serves this database (running, failing, not running, not serving this database), and why';

CREATE FUNCTION @extschema@.outbox_check_publisher()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_check_publisher'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION @extschema@.outbox_check_publisher() IS
'internal: WARNING if no publisher will serve this database (run by CREATE EXTENSION)';

-- After an operator changed an aggregate's events or state: the publisher
-- reads its pending events by index again (from last_published_version),
-- and a settling of its messages in flight meanwhile records nothing (the
-- row changed under it), so they are sent again in order.
CREATE FUNCTION @extschema@.outbox_catch_up(aggregate_id text)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
	INSERT INTO @extschema@.aggregate_publication AS p (aggregate_id, catch_up, updated_at)
	VALUES ($1, true, pg_catalog.clock_timestamp())
	ON CONFLICT (aggregate_id) DO UPDATE SET catch_up = true, updated_at = excluded.updated_at;
$$;

CREATE FUNCTION @extschema@.outbox_retry(aggregate_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	agg text := outbox_retry.aggregate_id;
	was_blocked bigint;
	was_backing_off boolean;
BEGIN
	PERFORM @extschema@.outbox_check_arg('aggregate_id', agg);
	PERFORM @extschema@.outbox_lock_aggregate(agg);
	SELECT p.blocked_version, p.next_attempt_at IS NOT NULL
	  INTO was_blocked, was_backing_off
	  FROM @extschema@.aggregate_publication p WHERE p.aggregate_id OPERATOR(pg_catalog.=) agg FOR UPDATE;
	IF NOT FOUND AND NOT EXISTS (SELECT 1 FROM @extschema@.outbox o WHERE o.aggregate_id OPERATOR(pg_catalog.=) agg) THEN
		RAISE EXCEPTION 'aggregate "%" has no events', agg USING ERRCODE = 'no_data_found';
	END IF;
	IF was_blocked IS NULL AND NOT coalesce(was_backing_off, false) THEN
		RAISE NOTICE 'aggregate "%" is neither blocked nor backing off: nothing to retry', agg;
		RETURN false;
	END IF;
	UPDATE @extschema@.aggregate_publication p
	   SET blocked_version = NULL, blocked_at = NULL, next_attempt_at = NULL,
		   attempts = 0, catch_up = true, updated_at = pg_catalog.clock_timestamp()
	 WHERE p.aggregate_id OPERATOR(pg_catalog.=) agg;
	-- A fresh count of attempts before the poison policy applies again.
	UPDATE @extschema@.outbox o SET attempts = 0
	 WHERE o.aggregate_id OPERATOR(pg_catalog.=) agg AND o.disposition IS NULL AND o.attempts OPERATOR(pg_catalog.>) 0
	   AND o.aggregate_version OPERATOR(pg_catalog.>) coalesce((SELECT p.last_published_version
											 FROM @extschema@.aggregate_publication p
											WHERE p.aggregate_id OPERATOR(pg_catalog.=) agg), 0);
	RAISE LOG 'outbox: % retried aggregate "%"%', session_user, agg,
		coalesce(' (was blocked at version ' OPERATOR(pg_catalog.||) was_blocked OPERATOR(pg_catalog.||) ')', '');
	RETURN true;
END
$$;

COMMENT ON FUNCTION @extschema@.outbox_retry(text) IS
'unblock an aggregate (or end its backoff) so the publisher tries its next event now';

-- The event an operator acts on, locked with its aggregate.  An event that
-- already has the wanted disposition is a no-op (already = true); one
-- settled otherwise, or missing, is an error.
CREATE FUNCTION @extschema@.outbox_pending_event(event_id text,
	wanted @extschema@.outbox_disposition, OUT id bigint,
	OUT aggregate_id text, OUT aggregate_version bigint, OUT already boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	agg text;
	disposition @extschema@.outbox_disposition;
	action text := pg_catalog.replace(wanted::text, '_', '-');
BEGIN
	PERFORM @extschema@.outbox_check_arg('event_id', event_id);
	SELECT o.aggregate_id INTO agg FROM @extschema@.outbox o WHERE o.event_id OPERATOR(pg_catalog.=) outbox_pending_event.event_id;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'event "%" does not exist', event_id USING ERRCODE = 'no_data_found',
			HINT = 'It may have been deleted by retention (outbox.retention).';
	END IF;
	PERFORM @extschema@.outbox_lock_aggregate(agg);
	-- Published: at or below its aggregate's last published version.
	SELECT o.id, o.aggregate_id, o.aggregate_version,
		   CASE WHEN o.disposition IS NOT NULL THEN o.disposition
				WHEN o.aggregate_version OPERATOR(pg_catalog.<=) coalesce((SELECT p.last_published_version
														FROM @extschema@.aggregate_publication p
													   WHERE p.aggregate_id OPERATOR(pg_catalog.=) o.aggregate_id), 0)
				THEN 'published'::@extschema@.outbox_disposition END
	  INTO id, aggregate_id, aggregate_version, disposition
	  FROM @extschema@.outbox o WHERE o.event_id OPERATOR(pg_catalog.=) outbox_pending_event.event_id FOR UPDATE OF o;
	already := coalesce(disposition OPERATOR(pg_catalog.=) wanted, disposition IS NULL AND wanted IS NULL);
	IF already THEN
		RAISE NOTICE 'event "%" is already %', event_id, action;
	ELSIF disposition IS NOT NULL THEN
		RAISE EXCEPTION 'event "%" is already %', event_id, pg_catalog.replace(disposition::text, '_', '-')
			USING ERRCODE = 'object_not_in_prerequisite_state',
			HINT = pg_catalog.format('Only pending events can be %s; outbox_replay() publishes events again.', action);
	END IF;
END
$$;

-- After an event of the aggregate was settled by an operator: unblock the
-- aggregate if it was stopped there, and advance last_published_version
-- over settled events.
CREATE FUNCTION @extschema@.outbox_settled(aggregate_id text, version bigint)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
	INSERT INTO @extschema@.aggregate_publication AS p (aggregate_id, last_published_version, catch_up, updated_at)
	SELECT $1, CASE WHEN NOT EXISTS (SELECT 1 FROM @extschema@.outbox o
									  WHERE o.aggregate_id OPERATOR(pg_catalog.=) $1
									  AND o.disposition IS NULL
									  AND o.aggregate_version OPERATOR(pg_catalog.>)
										  coalesce((SELECT q.last_published_version
													  FROM @extschema@.aggregate_publication q
													 WHERE q.aggregate_id OPERATOR(pg_catalog.=) $1), 0)
									  AND o.aggregate_version OPERATOR(pg_catalog.<) $2)
					THEN $2 ELSE 0 END, true, pg_catalog.clock_timestamp()
	ON CONFLICT (aggregate_id) DO UPDATE SET
		catch_up = true,
		last_published_version = GREATEST(p.last_published_version, excluded.last_published_version),
		blocked_version = CASE WHEN p.blocked_version OPERATOR(pg_catalog.=) $2 THEN NULL ELSE p.blocked_version END,
		blocked_at = CASE WHEN p.blocked_version OPERATOR(pg_catalog.=) $2 THEN NULL ELSE p.blocked_at END,
		attempts = CASE WHEN p.blocked_version OPERATOR(pg_catalog.=) $2 THEN 0 ELSE p.attempts END,
		next_attempt_at = NULL,
		updated_at = excluded.updated_at;
$$;

CREATE FUNCTION @extschema@.outbox_skip(event_id text, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	ev record;
BEGIN
	-- The reason is logged and kept in last_error: bounded like an identifier.
	IF reason IS NOT NULL THEN
		PERFORM @extschema@.outbox_check_arg('reason', reason);
	END IF;
	SELECT * INTO ev FROM @extschema@.outbox_pending_event(event_id, 'skipped');
	IF ev.already THEN
		RETURN false;
	END IF;
	UPDATE @extschema@.outbox o
	   SET disposed_at = pg_catalog.clock_timestamp(), disposition = 'skipped',
		   last_error = coalesce('skipped by ' OPERATOR(pg_catalog.||) session_user OPERATOR(pg_catalog.||) coalesce(': ' OPERATOR(pg_catalog.||) reason, ''), o.last_error)
	 WHERE o.id OPERATOR(pg_catalog.=) ev.id;
	PERFORM @extschema@.outbox_settled(ev.aggregate_id, ev.aggregate_version);
	RAISE LOG 'outbox: % skipped event "%" (aggregate "%" version %)%', session_user,
		event_id, ev.aggregate_id, ev.aggregate_version, coalesce(': ' OPERATOR(pg_catalog.||) reason, '');
	RETURN true;
END
$$;

COMMENT ON FUNCTION @extschema@.outbox_skip(text, text) IS
'give up on a pending event: it is recorded as skipped and its aggregate continues';

CREATE FUNCTION @extschema@.outbox_dead_letter(event_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	ev record;
BEGIN
	SELECT * INTO ev FROM @extschema@.outbox_pending_event(event_id, 'dead_lettered');
	IF ev.already THEN
		RETURN false;
	END IF;
	IF (SELECT o.dead_letter_requested FROM @extschema@.outbox o WHERE o.id OPERATOR(pg_catalog.=) ev.id) THEN
		RAISE NOTICE 'event "%" is already queued for the dead-letter topic', event_id;
		RETURN false;
	END IF;
	UPDATE @extschema@.outbox o SET dead_letter_requested = true WHERE o.id OPERATOR(pg_catalog.=) ev.id;
	-- The publisher sends it to the dead-letter topic next, then goes on.
	PERFORM @extschema@.outbox_catch_up(ev.aggregate_id);
	UPDATE @extschema@.aggregate_publication p
	   SET blocked_version = NULL, blocked_at = NULL, next_attempt_at = NULL,
		   updated_at = pg_catalog.clock_timestamp()
	 WHERE p.aggregate_id OPERATOR(pg_catalog.=) ev.aggregate_id AND p.blocked_version OPERATOR(pg_catalog.=) ev.aggregate_version;
	RAISE LOG 'outbox: % sent event "%" (aggregate "%" version %) to the dead-letter topic',
		session_user, event_id, ev.aggregate_id, ev.aggregate_version;
	RETURN true;
END
$$;

COMMENT ON FUNCTION @extschema@.outbox_dead_letter(text) IS
'have the publisher send a pending event to outbox.dead_letter_topic instead of its topic';

CREATE FUNCTION @extschema@.outbox_replay(aggregate_id text, from_version bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	agg text := outbox_replay.aggregate_id;
	lo bigint;
	hi bigint;
	n bigint;
BEGIN
	PERFORM @extschema@.outbox_check_arg('aggregate_id', agg);
	IF from_version IS NULL OR from_version OPERATOR(pg_catalog.<) 1 THEN
		RAISE EXCEPTION 'from_version must be a version, 1 or more' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	PERFORM @extschema@.outbox_lock_aggregate(agg);
	SELECT pg_catalog.min(o.aggregate_version), pg_catalog.max(o.aggregate_version) INTO lo, hi
	  FROM @extschema@.outbox o WHERE o.aggregate_id OPERATOR(pg_catalog.=) agg;
	IF hi IS NULL THEN
		RAISE EXCEPTION 'aggregate "%" has no events', agg USING ERRCODE = 'no_data_found';
	ELSIF from_version OPERATOR(pg_catalog.>) hi THEN
		RAISE EXCEPTION 'aggregate "%" has no version % (its last is %)', agg, from_version, hi
			USING ERRCODE = 'invalid_parameter_value';
	ELSIF from_version OPERATOR(pg_catalog.<) lo AND EXISTS (SELECT 1 FROM @extschema@.aggregate_publication p
										 WHERE p.aggregate_id OPERATOR(pg_catalog.=) agg AND p.last_published_version OPERATOR(pg_catalog.>=) from_version) THEN
		-- Retention may have deleted them, or they never existed (explicit
		-- versions may start anywhere and leave gaps): nothing tells which.
		RAISE EXCEPTION 'aggregate "%" has no % in the outbox', agg,
			CASE WHEN from_version OPERATOR(pg_catalog.=) (lo OPERATOR(pg_catalog.-) 1) THEN 'version ' OPERATOR(pg_catalog.||) from_version
				 ELSE 'versions ' OPERATOR(pg_catalog.||) from_version OPERATOR(pg_catalog.||) ' to ' OPERATOR(pg_catalog.||) (lo OPERATOR(pg_catalog.-) 1) END
			USING ERRCODE = 'object_not_in_prerequisite_state',
			DETAIL = pg_catalog.format('Its first retained version is %s; earlier versions were deleted by retention or never emitted.', lo),
			HINT = pg_catalog.format('Replay from version %s to publish every retained version again.', lo);
	END IF;
	-- The settled events from that version on: published ones (at or below
	-- last_published_version) and disposed ones.
	SELECT pg_catalog.count(*) INTO n FROM @extschema@.outbox o
	 WHERE o.aggregate_id OPERATOR(pg_catalog.=) agg AND o.aggregate_version OPERATOR(pg_catalog.>=) from_version
	   AND (o.disposition IS NOT NULL
			OR o.aggregate_version OPERATOR(pg_catalog.<=) coalesce((SELECT p.last_published_version
												  FROM @extschema@.aggregate_publication p
												 WHERE p.aggregate_id OPERATOR(pg_catalog.=) agg), 0));
	UPDATE @extschema@.outbox o
	   SET disposition = NULL, disposed_at = NULL, attempts = 0, dead_letter_requested = false
	 WHERE o.aggregate_id OPERATOR(pg_catalog.=) agg AND o.aggregate_version OPERATOR(pg_catalog.>=) from_version
	   AND (o.disposition IS NOT NULL OR o.attempts OPERATOR(pg_catalog.<>) 0 OR o.dead_letter_requested);
	UPDATE @extschema@.aggregate_publication p
	   SET last_published_version = LEAST(p.last_published_version, from_version OPERATOR(pg_catalog.-) 1),
		   blocked_version = NULL, blocked_at = NULL, next_attempt_at = NULL, attempts = 0,
		   catch_up = true, updated_at = pg_catalog.clock_timestamp()
	 WHERE p.aggregate_id OPERATOR(pg_catalog.=) agg;
	RAISE LOG 'outbox: % replays aggregate "%" from version % (% events queued again)',
		session_user, agg, from_version, n;
	RETURN n;
END
$$;

COMMENT ON FUNCTION @extschema@.outbox_replay(text, bigint) IS
'publish an aggregate''s retained events again from a version; consumers drop what they saw';

CREATE FUNCTION @extschema@.outbox_pause(aggregate_id text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	agg text := outbox_pause.aggregate_id;
	changed boolean;
BEGIN
	IF agg IS NULL THEN
		UPDATE @extschema@.publisher_control c
		   SET paused = true, changed_at = pg_catalog.clock_timestamp(), changed_by = session_user
		 WHERE NOT c.paused;
		changed := FOUND;
		IF changed THEN
			RAISE LOG 'outbox: % paused publishing', session_user;
		END IF;
		RETURN changed;
	END IF;
	PERFORM @extschema@.outbox_check_arg('aggregate_id', agg);
	PERFORM @extschema@.outbox_lock_aggregate(agg);
	IF NOT EXISTS (SELECT 1 FROM @extschema@.outbox o WHERE o.aggregate_id OPERATOR(pg_catalog.=) agg)
	   AND NOT EXISTS (SELECT 1 FROM @extschema@.aggregate_publication p WHERE p.aggregate_id OPERATOR(pg_catalog.=) agg) THEN
		RAISE EXCEPTION 'aggregate "%" has no events', agg USING ERRCODE = 'no_data_found';
	END IF;
	INSERT INTO @extschema@.aggregate_publication AS p (aggregate_id, paused, updated_at)
	VALUES (agg, true, pg_catalog.clock_timestamp())
	ON CONFLICT ON CONSTRAINT aggregate_publication_pkey DO UPDATE
		SET paused = true, updated_at = excluded.updated_at
		WHERE NOT p.paused;
	changed := FOUND;
	IF changed THEN
		RAISE LOG 'outbox: % paused aggregate "%"', session_user, agg;
	END IF;
	RETURN changed;
END
$$;

COMMENT ON FUNCTION @extschema@.outbox_pause(text) IS
'stop publishing one aggregate, or everything (NULL); a batch in flight completes';

CREATE FUNCTION @extschema@.outbox_resume(aggregate_id text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	agg text := outbox_resume.aggregate_id;
	changed boolean;
BEGIN
	IF agg IS NULL THEN
		UPDATE @extschema@.publisher_control c
		   SET paused = false, changed_at = pg_catalog.clock_timestamp(), changed_by = session_user
		 WHERE c.paused;
		changed := FOUND;
		IF changed THEN
			PERFORM @extschema@.outbox_wake_on_commit();
			RAISE LOG 'outbox: % resumed publishing', session_user;
		END IF;
		RETURN changed;
	END IF;
	PERFORM @extschema@.outbox_check_arg('aggregate_id', agg);
	PERFORM @extschema@.outbox_lock_aggregate(agg);
	-- What it emitted while paused is read by index.
	UPDATE @extschema@.aggregate_publication p
	   SET paused = false, catch_up = true, updated_at = pg_catalog.clock_timestamp()
	 WHERE p.aggregate_id OPERATOR(pg_catalog.=) agg AND p.paused;
	changed := FOUND;
	IF changed THEN
		RAISE LOG 'outbox: % resumed aggregate "%"', session_user, agg;
	ELSIF NOT EXISTS (SELECT 1 FROM @extschema@.aggregate_publication p WHERE p.aggregate_id OPERATOR(pg_catalog.=) agg)
		  AND NOT EXISTS (SELECT 1 FROM @extschema@.outbox o WHERE o.aggregate_id OPERATOR(pg_catalog.=) agg) THEN
		RAISE EXCEPTION 'aggregate "%" has no events', agg USING ERRCODE = 'no_data_found';
	END IF;
	RETURN changed;
END
$$;

COMMENT ON FUNCTION @extschema@.outbox_resume(text) IS
'resume publishing one aggregate, or everything (NULL)';

REVOKE ALL ON FUNCTION
	@extschema@.outbox_lock_aggregate(text),
	@extschema@.outbox_wake_on_commit(),
	@extschema@.outbox_workers(),
	@extschema@.outbox_publisher(),
	@extschema@.outbox_check_publisher(),
	@extschema@.outbox_check_arg(text, text),
	@extschema@.outbox_retry(text),
	@extschema@.outbox_pending_event(text, @extschema@.outbox_disposition),
	@extschema@.outbox_settled(text, bigint),
	@extschema@.outbox_catch_up(text),
	@extschema@.outbox_skip(text, text),
	@extschema@.outbox_dead_letter(text),
	@extschema@.outbox_replay(text, bigint),
	@extschema@.outbox_pause(text),
	@extschema@.outbox_resume(text)
	FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_workers(), @extschema@.outbox_publisher() TO pg_monitor;

--
-- Observability.
--

-- Dead-lettered and skipped rows are rare: count them without a scan.
CREATE INDEX outbox_disposed_idx ON @extschema@.outbox (disposition)
	WHERE disposition OPERATOR(pg_catalog.=) ANY (ARRAY['dead_lettered'::@extschema@.outbox_disposition,
														 'skipped'::@extschema@.outbox_disposition]);

-- The events not settled yet: above their aggregate's last published
-- version and not disposed of.  Two parts, so that neither scans the whole
-- table: events of transactions after the oldest publisher horizon (by the
-- txid index), and older ones of aggregates read by index (the only ones
-- that can still be pending there; see publisher_horizon).
CREATE VIEW @extschema@.outbox_pending AS
WITH h AS (
	SELECT coalesce((SELECT pg_catalog.pg_snapshot_xmin(x.snapshot)
					   FROM @extschema@.publisher_horizon x
					  ORDER BY 1 NULLS FIRST LIMIT 1), '0'::xid8) AS xmin
)
SELECT o.*
  FROM @extschema@.outbox o
  LEFT JOIN @extschema@.aggregate_publication p ON p.aggregate_id OPERATOR(pg_catalog.=) o.aggregate_id
 WHERE o.txid OPERATOR(pg_catalog.>=) (SELECT h.xmin FROM h)
   AND o.aggregate_version OPERATOR(pg_catalog.>) coalesce(p.last_published_version, 0)
   AND o.disposition IS NULL
UNION ALL
SELECT o.*
  FROM @extschema@.aggregate_publication p
  JOIN @extschema@.outbox o ON o.aggregate_id OPERATOR(pg_catalog.=) p.aggregate_id
						   AND o.aggregate_version OPERATOR(pg_catalog.>) p.last_published_version
 WHERE (p.paused OR p.blocked_version IS NOT NULL OR p.next_attempt_at IS NOT NULL OR p.catch_up)
   AND o.txid OPERATOR(pg_catalog.<) (SELECT h.xmin FROM h)
   AND o.disposition IS NULL;

COMMENT ON VIEW @extschema@.outbox_pending IS
'the events not yet published (acknowledged by Kafka), dead-lettered or skipped';

-- Every event with what became of it: pending, published (at or below its
-- aggregate's last published version), dead_lettered or skipped.  Select
-- by aggregate_id or event_id: the whole table is large.
CREATE VIEW @extschema@.outbox_events AS
SELECT o.*,
	   CASE WHEN o.disposition IS NOT NULL THEN o.disposition::text
			WHEN o.aggregate_version OPERATOR(pg_catalog.<=) coalesce(p.last_published_version, 0)
			THEN 'published' ELSE 'pending' END AS state
  FROM @extschema@.outbox o
  LEFT JOIN @extschema@.aggregate_publication p ON p.aggregate_id OPERATOR(pg_catalog.=) o.aggregate_id;

COMMENT ON VIEW @extschema@.outbox_events IS
'every retained event and its state: pending, published, dead_lettered or skipped';

CREATE VIEW @extschema@.outbox_aggregate_status AS
SELECT coalesce(p.aggregate_id, q.aggregate_id) AS aggregate_id,
	   GREATEST(q.last_pending_version, p.last_published_version) AS last_emitted_version,
	   coalesce(p.last_published_version, 0) AS last_published_version,
	   GREATEST(q.last_pending_version, p.last_published_version)
		   OPERATOR(pg_catalog.-) coalesce(p.last_published_version, 0) AS gap,
	   coalesce(q.pending_events, 0) AS pending_events,
	   q.pending_since,
	   CASE WHEN p.paused THEN 'paused'
			WHEN p.blocked_version IS NOT NULL THEN 'blocked'
			WHEN p.next_attempt_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'backing_off'
			WHEN q.pending_events OPERATOR(pg_catalog.>) 0 THEN 'pending'
			ELSE 'published' END AS state,
	   coalesce(q.attempts, 0) AS attempts,
	   coalesce(q.last_error, p.last_error) AS last_error,
	   p.blocked_version,
	   p.blocked_at,
	   p.next_attempt_at,
	   p.last_published_at
  FROM @extschema@.aggregate_publication p
  FULL JOIN (SELECT o.aggregate_id,
					pg_catalog.count(*) AS pending_events,
					pg_catalog.min(o.created_at) AS pending_since,
					pg_catalog.max(o.aggregate_version) AS last_pending_version,
					pg_catalog.max(o.attempts) AS attempts,
					(pg_catalog.array_agg(o.last_error ORDER BY o.aggregate_version)
						FILTER (WHERE o.last_error IS NOT NULL))[1] AS last_error
			   FROM @extschema@.outbox_pending o
			  GROUP BY o.aggregate_id) q ON q.aggregate_id OPERATOR(pg_catalog.=) p.aggregate_id;

COMMENT ON VIEW @extschema@.outbox_aggregate_status IS
'per aggregate: last emitted vs last published version, pending since, state, attempts, last error';

CREATE VIEW @extschema@.outbox_status AS
SELECT (SELECT pg_catalog.count(*) FROM @extschema@.outbox_pending) AS pending_events,
	   (SELECT pg_catalog.count(DISTINCT aggregate_id) FROM @extschema@.outbox_pending) AS pending_aggregates,
	   (SELECT pg_catalog.min(created_at) FROM @extschema@.outbox_pending) AS oldest_pending_at,
	   pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) (SELECT pg_catalog.min(created_at) FROM @extschema@.outbox_pending)
		   AS oldest_pending_age,
	   (SELECT pg_catalog.count(*) FROM @extschema@.aggregate_publication WHERE blocked_version IS NOT NULL)
		   AS blocked_aggregates,
	   (SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('aggregate_id', aggregate_id, 'version', blocked_version,
											'since', blocked_at, 'error', last_error)
						 ORDER BY blocked_at)
		  FROM (SELECT * FROM @extschema@.aggregate_publication
				 WHERE blocked_version IS NOT NULL ORDER BY blocked_at LIMIT 100) b) AS blocked,
	   (SELECT pg_catalog.count(*) FROM @extschema@.aggregate_publication
		 WHERE next_attempt_at OPERATOR(pg_catalog.>) pg_catalog.now() AND blocked_version IS NULL) AS backing_off_aggregates,
	   (SELECT pg_catalog.count(*) FROM @extschema@.aggregate_publication WHERE paused) AS paused_aggregates,
	   (SELECT pg_catalog.count(*) FROM @extschema@.outbox WHERE disposition OPERATOR(pg_catalog.=) 'dead_lettered') AS dead_lettered_events,
	   (SELECT pg_catalog.count(*) FROM @extschema@.outbox WHERE disposition OPERATOR(pg_catalog.=) 'skipped') AS skipped_events,
	   (SELECT paused FROM @extschema@.publisher_control) AS publisher_paused,
	   (SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(w) ORDER BY w.worker) FROM @extschema@.outbox_workers() w
		 WHERE w.database OPERATOR(pg_catalog.=) pg_catalog.current_database()) AS workers,
	   p.state AS publisher,
	   p.detail AS publisher_detail
  FROM @extschema@.outbox_publisher() p;

COMMENT ON VIEW @extschema@.outbox_status IS
'one row: how far behind publishing is, what is stuck, whether a publisher serves this database and what each worker does';

REVOKE ALL ON @extschema@.outbox_status, @extschema@.outbox_aggregate_status,
	@extschema@.outbox_pending, @extschema@.outbox_events FROM PUBLIC;
-- Not outbox_pending: it shows payloads (the views above count them as
-- their owner).
GRANT SELECT ON @extschema@.outbox_status, @extschema@.outbox_aggregate_status TO pg_monitor;

-- Say at once if no publisher will serve this database (not preloaded,
-- outbox.workers = 0, or another outbox.database).
SELECT @extschema@.outbox_check_publisher();

--
-- ===================================================================
-- The consumer half: inbox subscriptions applied by the inbox workers
-- (src/inbox_worker.c).  Everything below belongs to it.
-- ===================================================================
--

-- What a handler receives: the Kafka record and the publisher's headers.
CREATE TYPE @extschema@.inbox_message AS (
	consumer text,
	topic text,
	"partition" integer,
	"offset" bigint,
	key text,
	event_id text,
	event_type text,
	aggregate_type text,
	aggregate_id text,
	aggregate_version bigint,
	headers jsonb,
	payload jsonb,			-- NULL for a tombstone or a value that is not JSON
	payload_bytes bytea,
	kafka_timestamp timestamptz
);

-- One row per consumer: a Kafka consumer group, 'outbox.inbox.<system
-- identifier>.<database oid>.<consumer>' (unique to this cluster and database).
-- handler is the function's signature, every name but pg_catalog's
-- schema-qualified (regprocedure's text under search_path pg_catalog),
-- which the inbox workers resolve at each refresh: not a regprocedure,
-- whose function OIDs pg_upgrade does not keep (it refuses such a table).
-- owner may be a regrole: pg_upgrade keeps role OIDs, and a dump restores
-- it by name.
CREATE TABLE @extschema@.inbox_subscription (
	consumer text PRIMARY KEY,
	topics text[] NOT NULL,
	handler text NOT NULL,
	-- The role that subscribed: the handler runs as this role.
	owner regrole NOT NULL,
	created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- Per consumer and partition: where to resume, and what happened there.
-- next_offset is written in the transaction that applied the messages
-- before it, so it is exact; Kafka's committed offset is only for lag.
CREATE TABLE @extschema@.inbox_offset (
	consumer text NOT NULL,
	topic text NOT NULL,
	"partition" integer NOT NULL,
	next_offset bigint,
	high_watermark bigint,
	last_applied_offset bigint,
	last_applied_at timestamptz,
	applied bigint NOT NULL DEFAULT 0,
	duplicates bigint NOT NULL DEFAULT 0,
	gaps bigint NOT NULL DEFAULT 0,
	errors bigint NOT NULL DEFAULT 0,
	dead_lettered bigint NOT NULL DEFAULT 0,
	skipped bigint NOT NULL DEFAULT 0,
	-- The message at next_offset failed this many times; retried after
	-- next_attempt_at, or stopped there (blocked_at) by the block policy.
	attempts integer NOT NULL DEFAULT 0,
	last_error text,
	next_attempt_at timestamptz,
	blocked_at timestamptz,
	blocked_reason text,
	-- Set by inbox_retry() on a partition blocked by a gap: apply it.
	accept_gap boolean NOT NULL DEFAULT false,
	-- Set by inbox_skip(): the worker drops the message at next_offset.
	skip_requested boolean NOT NULL DEFAULT false,
	updated_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
	PRIMARY KEY (consumer, topic, "partition")
);

-- Updated by every batch: room for HOT updates, eager vacuum.
ALTER TABLE @extschema@.inbox_offset SET (
	fillfactor = 50,
	autovacuum_vacuum_scale_factor = 0.01,
	autovacuum_vacuum_threshold = 100
);

-- Per consumer and aggregate: the last version applied (or disposed of).
CREATE TABLE @extschema@.inbox_aggregate (
	consumer text NOT NULL,
	aggregate_id text NOT NULL,
	last_version bigint NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
	PRIMARY KEY (consumer, aggregate_id)
);

ALTER TABLE @extschema@.inbox_aggregate SET (
	fillfactor = 70,
	autovacuum_vacuum_scale_factor = 0.02
);

-- Messages whose handler kept failing under the dead_letter policy.
CREATE TABLE @extschema@.inbox_dead_letter (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	consumer text NOT NULL,
	message @extschema@.inbox_message NOT NULL,
	error text,
	attempts integer NOT NULL,
	dead_lettered_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);

REVOKE ALL ON @extschema@.inbox_subscription, @extschema@.inbox_offset,
	@extschema@.inbox_aggregate, @extschema@.inbox_dead_letter FROM PUBLIC;

-- Per consumer and inbox worker: its Kafka connection (running,
-- disconnected or error), written by the worker when it changes
-- (src/inbox_consumer.c).  Unlogged: a crash restart forgets it.
CREATE UNLOGGED TABLE @extschema@.inbox_consumer_state (
	consumer text NOT NULL,
	worker integer NOT NULL,
	state text NOT NULL,
	last_error text,
	since timestamptz NOT NULL,
	PRIMARY KEY (consumer, worker)
);

REVOKE ALL ON @extschema@.inbox_consumer_state FROM PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('@extschema@.inbox_subscription', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.inbox_offset', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.inbox_aggregate', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.inbox_dead_letter', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.inbox_dead_letter_id_seq', '');

-- Not SECURITY DEFINER: the subscriber is the calling role (current_user),
-- which the C function records; it writes the table as the extension owner.
-- The pinned search_path keeps a caller's operators out of those statements.
CREATE FUNCTION @extschema@.inbox_subscribe(consumer text, topics text[],
	handler regprocedure)
RETURNS void
AS 'MODULE_PATHNAME', 'inbox_subscribe'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.inbox_subscribe(text, text[], regprocedure) IS
'have the inbox workers apply the topics'' events with handler(inbox_message), exactly once, as the calling role';

CREATE FUNCTION @extschema@.inbox_unsubscribe(consumer text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'inbox_unsubscribe'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.inbox_unsubscribe(text) IS
'stop a subscription (offsets, versions and dead letters are kept: subscribing again resumes)';

-- The partition row an operator acts on, locked.
CREATE FUNCTION @extschema@.inbox_partition(consumer text, topic text, "partition" integer)
RETURNS @extschema@.inbox_offset
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r @extschema@.inbox_offset;
BEGIN
	PERFORM @extschema@.outbox_check_arg('consumer', consumer);
	PERFORM @extschema@.outbox_check_arg('topic', topic);
	SELECT * INTO r FROM @extschema@.inbox_offset o
	 WHERE o.consumer OPERATOR(pg_catalog.=) inbox_partition.consumer
	   AND o.topic OPERATOR(pg_catalog.=) inbox_partition.topic
	   AND o."partition" OPERATOR(pg_catalog.=) inbox_partition."partition"
	   FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'consumer "%" has no partition % of topic "%"', consumer, "partition", topic
			USING ERRCODE = 'no_data_found';
	END IF;
	RETURN r;
END
$$;

CREATE FUNCTION @extschema@.inbox_retry(consumer text, topic text, "partition" integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r @extschema@.inbox_offset := @extschema@.inbox_partition(consumer, topic, "partition");
BEGIN
	IF r.blocked_at IS NULL AND r.next_attempt_at IS NULL THEN
		RAISE NOTICE 'partition % of topic "%" is neither blocked nor backing off for consumer "%"',
			"partition", topic, consumer;
		RETURN false;
	END IF;
	UPDATE @extschema@.inbox_offset o
	   SET attempts = 0, next_attempt_at = NULL, blocked_at = NULL, blocked_reason = NULL,
		   accept_gap = coalesce(r.blocked_reason OPERATOR(pg_catalog.~~) 'gap:%', false),
		   updated_at = pg_catalog.clock_timestamp()
	 WHERE (o.consumer, o.topic, o."partition") OPERATOR(pg_catalog.=) (r.consumer, r.topic, r."partition");
	RAISE LOG 'outbox: % retried partition % of topic "%" for consumer "%" at offset %',
		session_user, "partition", topic, consumer, r.next_offset;
	RETURN true;
END
$$;

COMMENT ON FUNCTION @extschema@.inbox_retry(text, text, integer) IS
'unblock a partition: the inbox worker applies its next message again (a gap is then accepted)';

CREATE FUNCTION @extschema@.inbox_skip(consumer text, topic text, "partition" integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r @extschema@.inbox_offset := @extschema@.inbox_partition(consumer, topic, "partition");
BEGIN
	IF r.blocked_at IS NULL THEN
		RAISE NOTICE 'partition % of topic "%" is not blocked for consumer "%": nothing to skip',
			"partition", topic, consumer;
		RETURN false;
	END IF;
	UPDATE @extschema@.inbox_offset o
	   SET attempts = 0, next_attempt_at = NULL, blocked_at = NULL, blocked_reason = NULL,
		   skip_requested = true, updated_at = pg_catalog.clock_timestamp()
	 WHERE (o.consumer, o.topic, o."partition") OPERATOR(pg_catalog.=) (r.consumer, r.topic, r."partition");
	RAISE LOG 'outbox: % skipped offset % of partition % of topic "%" for consumer "%"',
		session_user, r.next_offset, "partition", topic, consumer;
	RETURN true;
END
$$;

COMMENT ON FUNCTION @extschema@.inbox_skip(text, text, integer) IS
'drop the message a partition is blocked at; the inbox worker goes on with the next';

CREATE VIEW @extschema@.inbox_status AS
SELECT o.consumer, o.topic, o."partition",
	   o.high_watermark OPERATOR(pg_catalog.-) o.next_offset AS lag,
	   o.next_offset, o.high_watermark,
	   o.last_applied_offset, o.last_applied_at,
	   o.applied, o.duplicates, o.gaps, o.errors, o.dead_lettered, o.skipped,
	   CASE WHEN s.consumer IS NULL THEN 'unsubscribed'
			WHEN o.blocked_at IS NOT NULL THEN 'blocked'
			WHEN k.state IS NOT NULL THEN k.state
			WHEN o.next_attempt_at IS NOT NULL THEN 'backing_off'
			ELSE 'running' END AS state,
	   o.attempts, o.last_error, o.blocked_at, o.blocked_reason, o.next_attempt_at,
	   o.updated_at,
	   k.last_error AS kafka_error, k.since AS kafka_error_since
  FROM @extschema@.inbox_offset o
  LEFT JOIN @extschema@.inbox_subscription s ON s.consumer OPERATOR(pg_catalog.=) o.consumer
  -- The consumer's worst Kafka condition, if any worker has one.
  LEFT JOIN LATERAL (
	SELECT c.state, c.last_error, c.since FROM @extschema@.inbox_consumer_state c
	 WHERE c.consumer OPERATOR(pg_catalog.=) o.consumer
	   AND c.state OPERATOR(pg_catalog.<>) 'running'
	 ORDER BY c.state OPERATOR(pg_catalog.=) 'error' DESC, c.since
	 LIMIT 1) k ON s.consumer IS NOT NULL;

COMMENT ON VIEW @extschema@.inbox_status IS
'per consumer and partition: lag to the high watermark, last applied, duplicates, gaps, errors, state (including the consumer''s Kafka connection: disconnected, error)';

REVOKE ALL ON FUNCTION
	@extschema@.inbox_subscribe(text, text[], regprocedure),
	@extschema@.inbox_unsubscribe(text),
	@extschema@.inbox_partition(text, text, integer),
	@extschema@.inbox_retry(text, text, integer),
	@extschema@.inbox_skip(text, text, integer)
	FROM PUBLIC;
REVOKE ALL ON @extschema@.inbox_status FROM PUBLIC;
GRANT SELECT ON @extschema@.inbox_status TO pg_monitor;
