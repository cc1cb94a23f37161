# test/bench/sections/b_throughput.sh -- sections b and c, publish throughput and round-trip sensitivity.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# --------------------------------------------------- b. publish throughput
res load.b "$(cut -d' ' -f1-3 /proc/loadavg)"
say "b. publish throughput: $N preloaded events, $B_REPS interleaved round(s) (load average ${R[load.b]})"
# Rounds interleaved (extension, relay, raw, then again): medians and ranges.
for aggs in $B_AGGS; do
	for r in $(seq "$B_REPS"); do
		measure_ours "b.ours.$aggs.r$r" "$N" "$aggs"
		[ "$aggs" = 10000 ] && order_check "b.ours.10000.r$r" outbox "$T"
		measure_relay "b.relay.$aggs.r$r" "$N" "$aggs"
		[ "$aggs" = 10000 ] && order_check "b.relay.10000.r$r" relay_outbox "$T"
		measure_raw "b.raw.$aggs.r$r" "$N" "$aggs"
	done
	rounds_summary "b.ours.$aggs" "$B_REPS" eps seconds table_seconds first_ack preload_s per_batch
	rounds_summary "b.relay.$aggs" "$B_REPS" eps seconds preload_s
	rounds_summary "b.raw.$aggs" "$B_REPS" eps seconds
	rounds_text "b.relay.$aggs" "$B_REPS" relay
	if [ "$aggs" = 10000 ]; then
		rounds_text b.ours.10000 "$B_REPS" order_check
		rounds_text b.relay.10000 "$B_REPS" order_check
	fi
done
# One profile run per aggregate count, untimed (not in any figure): the
# publisher's step timings from its debug1 lines.
set_debug on
for aggs in $B_AGGS; do measure_ours "b.profile.$aggs" "$N" "$aggs"; done
set_debug off

# (mock only: the marking by hand, and (c), which needs the mock's rtt)
if [ "$real" = 0 ]; then
	# The extension's settling statement (as prepared in src/publish_settle.c)
	# against the relay's marking UPDATE, by hand on 10,000 pending events of
	# 10,000 aggregates: EXPLAIN ANALYZE times, ms.  The extension writes one
	# row per aggregate, not per event: first settle (INSERT path), then a
	# second one over the same aggregates (UPDATE path, guarded by xmin).
	say "b'. settling 10,000 events by hand"
	restart_pg 0
	reset_tables
	q -o /dev/null -c "$(ours_preload 10000 10000 bench.mark)"
	q -o /dev/null -c "INSERT INTO relay_outbox (aggregate_id, aggregate_version, topic, headers, payload)
		SELECT 'order-' || i, 1, 'bench.mark', jsonb_build_object('event_id', gen_random_uuid()::text), '{}'
		FROM generate_series(0, 9999) i"
	q -c CHECKPOINT
	res outbox.indexes "$(q -c "SELECT string_agg(c.relname, ', ' ORDER BY c.relname) FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'outbox'::regclass")"
	cat >"$work/settle.sql" <<'EOF'
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF)
WITH u AS (SELECT * FROM unnest(:'aggs'::text[], :'vers'::bigint[], :'xs'::xid[],
		array_fill(:'r'::boolean, ARRAY[:n])) AS u(id, v, x, r)),
	ins AS (INSERT INTO aggregate_publication (aggregate_id, last_published_version, last_published_at, updated_at)
		SELECT u.id, u.v, now(), now() FROM u WHERE NOT u.r ON CONFLICT (aggregate_id) DO NOTHING RETURNING aggregate_id),
	upd AS (UPDATE aggregate_publication a SET last_published_version = GREATEST(a.last_published_version, u.v),
		last_published_at = now(), attempts = 0, last_error = NULL,
		catch_up = a.catch_up OR a.next_attempt_at IS NOT NULL, next_attempt_at = NULL, updated_at = now()
		FROM u WHERE u.r AND a.aggregate_id = u.id AND a.xmin = u.x RETURNING a.aggregate_id),
	done AS (SELECT aggregate_id FROM ins UNION ALL SELECT aggregate_id FROM upd),
	disposed AS (UPDATE outbox o SET disposition = d.action::outbox_disposition, disposed_at = now(),
		attempts = o.attempts + CASE WHEN d.action = 'skipped' THEN 0 ELSE 1 END
		FROM unnest('{}'::bigint[], '{}'::text[], '{}'::text[]) AS d(id, action, agg)
		WHERE o.id = d.id AND d.agg IN (SELECT aggregate_id FROM done))
SELECT count(*) FROM done;
EOF
	psql -X -q -v ON_ERROR_STOP=1 -v settle="$work/settle.sql" >"$work/mark.txt" 2>&1 <<'EOF' || true
BEGIN;
SELECT array_agg(aggregate_id) AS aggs, array_agg(aggregate_version) AS vers,
	array_agg('0'::xid) AS xs, count(*) AS n, false AS r FROM outbox_pending \gset
\i :settle
COMMIT;
BEGIN;
SELECT array_agg(aggregate_id) AS aggs, array_agg(last_published_version + 1) AS vers,
	array_agg(xmin) AS xs, count(*) AS n, true AS r FROM aggregate_publication \gset
\i :settle
SELECT pg_stat_get_xact_tuples_hot_updated('aggregate_publication'::regclass) AS hot,
	pg_stat_get_xact_tuples_updated('aggregate_publication'::regclass) AS upd \gset
\echo HOT :hot of :upd
COMMIT;
BEGIN;
SELECT array_agg(id) AS rids FROM relay_outbox WHERE published_at IS NULL \gset
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) UPDATE relay_outbox SET published_at = clock_timestamp()
	WHERE id = ANY(:'rids'::bigint[]);
COMMIT;
EOF
	res mark "$(sed -n 's/.*Execution Time: \([0-9.]*\) ms.*/\1/p' "$work/mark.txt" | xargs)"
	[ -n "${R[mark]}" ] || cut -c1-300 "$work/mark.txt" | head -n 20 >&2
	res mark.hot "$(sed -n 's/^HOT //p' "$work/mark.txt")"
	say "  execution ms (extension settle: insert path, update path; relay UPDATE): ${R[mark]}"
	restart_pg 1

	# ------------------------------------------------ c. round-trip sensitivity
	say "c. round-trip delay (mock rtt all <ms>), $N events over $AGGS_MAIN aggregates, $B_REPS interleaved round(s)"
	for rtt in 1 5 20; do
		mk rtt all "$rtt"
		for r in $(seq "$B_REPS"); do
			measure_ours "c.ours.$rtt.r$r" "$N" "$AGGS_MAIN"
			measure_relay "c.relay.$rtt.r$r" "$N" "$AGGS_MAIN"
			measure_raw "c.raw.$rtt.r$r" "$N" "$AGGS_MAIN"
		done
		rounds_summary "c.ours.$rtt" "$B_REPS" eps seconds per_batch
		rounds_summary "c.relay.$rtt" "$B_REPS" eps seconds
		rounds_summary "c.raw.$rtt" "$B_REPS" eps
		rounds_text "c.relay.$rtt" "$B_REPS" relay
	done
	mk rtt all 0
fi
