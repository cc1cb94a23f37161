# test/bench/sections/d_latency.sh -- section d, latency at a steady rate.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# ---------------------------------------------------------------- d. latency
cdf() { # table since file: thinned CDF of the per-event latency in ms
	q -c "SELECT round(ms::numeric, 3) FROM ($(lat_rows "$1" "$2")) s WHERE ms IS NOT NULL ORDER BY 1" >"$work/lat.raw"
	awk -v n="$(wc -l <"$work/lat.raw")" 'BEGIN { step = int(n / 1500) + 1 }
		{ i++; if (i % step == 0 || i == n || i == 1) print $1, i / n }' "$work/lat.raw" >"$3"
}
lat_tail() { # key table since: are the > 20 ms events spread out, or a few bad seconds?
	res "$1.tail" "$(q -F ' ' -c "WITH l AS (SELECT date_trunc('second', created_at) AS s, ms
			FROM ($(lat_rows "$2" "$3")) r),
		per AS (SELECT s, count(*) FILTER (WHERE ms > 20) AS n FROM l GROUP BY s)
		SELECT sum(n), count(*) FILTER (WHERE n > 0), coalesce(max(n), 0), count(*) FROM per")"
}
# What pgbench's backends are doing, every 0.2 s (one line per active backend:
# its wait event, or "CPU"), until killed or the script ends.
wait_sampler() { # file
	: >"$1"
	while kill -0 $$ 2>/dev/null && sleep 0.2; do
		q -c "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity
			WHERE application_name = 'pgbench' AND state = 'active'" >>"$1" 2>/dev/null || true
	done
}
lat_run() { # key side(ours|relay) rate [brokers]
	local key=$1 side=$2 rate=$3 br=${4:-$brokers} since log pos base n
	log=$work/pgbench.$key.log
	new_topic "${key//./-}"
	reset_tables
	if [ "$side" = ours ]; then
		warm_ours "$T"
		printf '%s\n' '\set id random(1, 10000)' \
			"SELECT event_id FROM outbox_emit('order', 'order-' || :id, 'OrderPaid', '{\"amount\": 10, \"currency\": \"EUR\"}', topic => '$T');" \
			>"$work/lat.sql"
	else
		start_relay "$br"
		warm_relay "$T"
		kill -USR1 "$relay_pid"
		printf '%s\n' '\set id random(1, 10000)' \
			"INSERT INTO relay_outbox (aggregate_id, aggregate_version, topic, headers, payload) VALUES ('order-' || :id, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, '$T', jsonb_build_object('event_id', gen_random_uuid()::text, 'event_type', 'OrderPaid', 'aggregate_type', 'order'), '{\"amount\": 10, \"currency\": \"EUR\"}');" \
			>"$work/lat.sql"
	fi
	since=$(q -c "SELECT clock_timestamp()")
	pos=$(stat -c %s "$pglog")
	if [ "$side" = ours ]; then base=$(ours_published); else base=$(status_settled "$RELAY_STATUS"); fi
	[ "$side" = ours ] && settle_sampler_start
	snap_start
	wait_sampler "$work/$key.waits" &
	sampler=$!
	pgbench -n -M prepared -c "$LAT_CLIENTS" -j 2 --rate "$rate" -T "$LAT_S" -f "$work/lat.sql" >"$log" 2>&1 ||
		{ cat "$log" >&2; exit 1; }
	kill "$sampler" 2>/dev/null || true
	wait "$sampler" 2>/dev/null || true
	snap_end "$key" "$LAT_S"
	n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log")
	res "$key.tps" "$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | xargs printf '%.0f')"
	res "$key.pgbench_ms" "$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$log") $(sed -n 's/^rate limit schedule lag: avg \([0-9.]*\) .*/\1/p' "$log")"
	res "$key.waits" "$(sort "$work/$key.waits" | uniq -c | sort -rn | head -n 4 |
		awk -v n="$(wc -l <"$work/$key.waits")" '{ printf "%s%s %.0f%%", (NR > 1 ? ", " : ""), $2, 100 * $1 / n }')"
	if [ "$side" = ours ]; then
		drain ours "$n" "" "$base"
		settle_sampler_stop "$key"
		if [ "$PROFILING" = 1 ]; then
			sleep 0.3 # let the last batch's debug lines reach the log
			res "$key.batches" "$(batch_stats "$pos")"
		fi
		lat_stats "$key" outbox "$since"
		lat_tail "$key" outbox "$since"
	else
		drain "$RELAY_STATUS" "$n" "" "$base"
		stop_relay
		res "$key.relay" "${RELAY_LINE#relay: }"
		lat_stats "$key" relay_outbox "$since"
		lat_tail "$key" relay_outbox "$since"
	fi
	[ "$rate" = 2000 ] && cdf "$([ "$side" = ours ] && echo outbox || echo relay_outbox)" "$since" "$work/$key.cdf"
	say "  $key: ${R[$key.tps]} tps; count p50 p99 max (ms): ${R[$key.stats]}"
}
res load.d "$(cut -d' ' -f1-3 /proc/loadavg)"
say "d. latency: pgbench --rate, $LAT_CLIENTS clients, $LAT_S s per rate (load average ${R[load.d]})"
for rate in $RATES; do
	lat_run "d.ours.$rate" ours "$rate"
	lat_run "d.relay.$rate" relay "$rate"
done
