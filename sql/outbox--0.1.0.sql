/* outbox--0.1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION outbox" to load this file. \quit

--
-- Events written by outbox_emit() in the caller's transaction.
--
-- The row's id orders nothing but the publisher's scan: business order is
-- (aggregate_id, aggregate_version), assigned under a per-aggregate lock and
-- guarded by a unique constraint.
--
CREATE TABLE @extschema@.outbox (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_id text NOT NULL UNIQUE CHECK (event_id <> ''),
	aggregate_type text NOT NULL CHECK (aggregate_type <> ''),
	aggregate_id text NOT NULL CHECK (aggregate_id <> ''),
	aggregate_version bigint NOT NULL CHECK (aggregate_version > 0),
	event_type text NOT NULL CHECK (event_type <> ''),
	topic text NOT NULL,
	headers jsonb,
	payload jsonb,
	created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	-- NULL while pending; set with disposition when Kafka acknowledged the
	-- event or a poison policy disposed of it.
	published_at timestamptz,
	disposition text CHECK (disposition IN ('published', 'dead_lettered', 'skipped')),
	kafka_partition integer,
	kafka_offset bigint,
	attempts integer NOT NULL DEFAULT 0,
	last_error text,
	CONSTRAINT outbox_position_unique UNIQUE (aggregate_id, aggregate_version),
	CONSTRAINT outbox_published_consistent CHECK ((published_at IS NULL) = (disposition IS NULL))
);

-- The publisher's work queue: pending rows only, in emit order.  Small,
-- because rows leave it as soon as they are published.
CREATE INDEX outbox_pending_idx ON @extschema@.outbox (id)
	WHERE published_at IS NULL;

-- For retention: published rows by age.
CREATE INDEX outbox_published_at_idx ON @extschema@.outbox (published_at)
	WHERE published_at IS NOT NULL;

-- Every row is inserted once, updated once when published and deleted by
-- retention: a steady stream of dead tuples.  Vacuum after 1% (plus 1000
-- rows) has changed rather than the default 20%, so the pending index and
-- the heap stay small on a table that is mostly churn.  Analyze often too:
-- the pending fraction swings between 0 and 100% and the publisher's plans
-- depend on it.  Inserts also trigger vacuum (PG13+) to set visibility.
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
	updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

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
	consumer text NOT NULL CHECK (consumer <> ''),
	event_id text NOT NULL CHECK (event_id <> ''),
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, event_id)
);

CREATE INDEX inbox_processed_at_idx ON @extschema@.inbox (processed_at);

-- Insert-only until retention: vacuum mainly for visibility and freezing.
ALTER TABLE @extschema@.inbox SET (
	autovacuum_vacuum_insert_scale_factor = 0.05,
	autovacuum_vacuum_scale_factor = 0.05
);

REVOKE ALL ON @extschema@.outbox, @extschema@.aggregate_publication,
	@extschema@.inbox FROM PUBLIC;

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

CREATE TYPE @extschema@.emitted_event AS (
	id bigint,
	event_id text,
	aggregate_version bigint,
	topic text
);

-- SECURITY DEFINER so that applications need EXECUTE only, never table
-- privileges; everything inside is schema-qualified and the search_path is
-- pinned, so a caller's objects cannot be substituted.
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
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint) IS
'write one event to the outbox in the current transaction';

CREATE FUNCTION @extschema@.inbox_claim(consumer text, event_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF consumer IS NULL OR event_id IS NULL THEN
		RAISE EXCEPTION 'inbox_claim: % must not be NULL',
			CASE WHEN consumer IS NULL THEN 'consumer' ELSE 'event_id' END
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF consumer = '' OR event_id = '' THEN
		RAISE EXCEPTION 'inbox_claim: % must not be empty',
			CASE WHEN consumer = '' THEN 'consumer' ELSE 'event_id' END
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- A concurrent uncommitted claim of the same pair makes this wait: false
	-- if that transaction commits, true if it aborts.
	INSERT INTO @extschema@.inbox AS i (consumer, event_id)
		VALUES (inbox_claim.consumer, inbox_claim.event_id)
		ON CONFLICT DO NOTHING;
	RETURN FOUND;
END
$$;

COMMENT ON FUNCTION @extschema@.inbox_claim(text, text) IS
'true if this transaction claimed the event for the consumer, false if it was already processed';

REVOKE ALL ON FUNCTION
	@extschema@.outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint),
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
'publisher counters since server start; export as outbox_<name>_total';

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
