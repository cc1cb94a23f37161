/* outbox--0.1.0--0.2.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION outbox UPDATE TO '0.2.0'" to load this file. \quit

-- Carries a database from 0.1.0 to 0.2.0 (CHANGELOG.md): its objects
-- become those sql/outbox--0.2.0.sql creates, and every row is kept.  New:
-- table inbox_consumer_state, and inbox_status's columns kafka_error and
-- kafka_error_since (added at the end: the view is replaced in place).
-- inbox_subscription.handler becomes text, the handler's schema-qualified
-- signature, which pg_upgrade accepts (it refuses a regprocedure column).
-- The other tables are unchanged (0.2.0 writes their defaults as
-- pg_catalog.now() and pg_catalog.clock_timestamp(), the functions 0.1.0's
-- now() and clock_timestamp() already resolved to).  Changed functions are
-- replaced in place, keeping their grants and comments; inbox_claim()
-- becomes a C function authorising the calling role.  The outbox's txid
-- index is built again with the entries a publisher reads alone (version,
-- id and aggregate of each event), from the rows there are.

DROP INDEX @extschema@.outbox_txid_idx;
CREATE INDEX outbox_txid_idx ON @extschema@.outbox (txid)
	INCLUDE (aggregate_version, id, aggregate_id);

CREATE OR REPLACE FUNCTION @extschema@.inbox_claim(consumer text, event_id text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'inbox_claim'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION @extschema@.outbox_retry(aggregate_id text)
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

CREATE OR REPLACE FUNCTION @extschema@.outbox_pending_event(event_id text,
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

CREATE OR REPLACE FUNCTION @extschema@.outbox_skip(event_id text, reason text DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION @extschema@.outbox_dead_letter(event_id text)
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

CREATE OR REPLACE FUNCTION @extschema@.outbox_replay(aggregate_id text, from_version bigint)
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

CREATE OR REPLACE FUNCTION @extschema@.outbox_pause(aggregate_id text DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION @extschema@.outbox_resume(aggregate_id text DEFAULT NULL)
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

CREATE UNLOGGED TABLE @extschema@.inbox_consumer_state (
	consumer text NOT NULL,
	worker integer NOT NULL,
	state text NOT NULL,
	last_error text,
	since timestamptz NOT NULL,
	PRIMARY KEY (consumer, worker)
);

REVOKE ALL ON @extschema@.inbox_consumer_state FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.inbox_partition(consumer text, topic text, "partition" integer)
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

CREATE OR REPLACE FUNCTION @extschema@.inbox_retry(consumer text, topic text, "partition" integer)
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

CREATE OR REPLACE FUNCTION @extschema@.inbox_skip(consumer text, topic text, "partition" integer)
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

CREATE OR REPLACE VIEW @extschema@.inbox_status AS
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

-- Last, so that every statement above runs under the search_path the
-- script began with.  Each handler becomes what inbox_subscribe() now
-- stores: its regprocedure text with every schema but pg_catalog named
-- (app.apply(public.inbox_message)).  A handler already dropped prints as
-- its OID, which the inbox workers never take for a function (they warn,
-- as they did, that it no longer exists).
SET LOCAL search_path = pg_catalog, pg_temp;
ALTER TABLE @extschema@.inbox_subscription
	ALTER COLUMN handler TYPE pg_catalog.text USING handler::pg_catalog.text;
