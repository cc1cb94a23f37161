# test/bench/sections/helpers.sh -- the helpers of the measurements (clusters, relay, drains, counters,
# latency and order checks).
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

wait_workers() { # n
	for _ in $(seq 200); do
		[ "$(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox publisher'")" = "$1" ] && return 0
		sleep 0.05
	done
	echo "publisher workers did not start ($1 expected)" >&2
	exit 1
}
restart_pg() { # workers
	q -c "ALTER SYSTEM SET outbox.workers = $1"
	pg_ctl -D "$work/data" -l "$pglog" -w -t 120 -m fast restart >/dev/null
	wait_workers "$1"
}
# The publisher's per-step timings (log_min_messages = debug1) for a profile
# run only: the debug lines cost the worker, so no timed run has them.
set_debug() { # on|off
	if [ "$1" = on ]; then
		q -c "ALTER SYSTEM SET log_min_messages = 'debug1'" -c "SELECT pg_reload_conf()" >/dev/null
		PROFILING=1
	else
		q -c "ALTER SYSTEM RESET log_min_messages" -c "SELECT pg_reload_conf()" >/dev/null
		PROFILING=0
	fi
	sleep 0.2
}
PROFILING=0
# Until the extension's publishers have nothing pending, untimed, before a
# reset: a backlog left by the previous step (section a's, say) would
# otherwise still be in flight after the TRUNCATE, and its settles would
# count as the next measurement's (the drains watch events_published).
settle_backlog() {
	local i
	[ "$(q -c "SHOW outbox.workers")" = 0 ] && return 0
	for i in $(seq $((DRAIN_TIMEOUT * 10))); do
		[ "$(q -c "SELECT NOT EXISTS (SELECT 1 FROM outbox_pending)")" = t ] && return 0
		sleep 0.1
	done
	say "  !! a backlog still pending after $DRAIN_TIMEOUT s before a reset"
}
reset_tables() {
	# (A running publisher's read may hold aggregate_publication and wait for
	# outbox: the TRUNCATE can lose a deadlock; it only has to be retried.)
	local i
	settle_backlog
	for i in 1 2 3 4 5; do
		q -c "TRUNCATE outbox, aggregate_publication, relay_outbox, bench_settled" 2>/dev/null && break
		[ "$i" = 5 ] && q -c "TRUNCATE outbox, aggregate_publication, relay_outbox, bench_settled"
		sleep 0.2
	done
	q -c "CHECKPOINT"
}
# The extension's settle sampler (bench_sample_settled, every 20 ms) and its
# latency histogram before a steady run; settle_sampler_stop ends both.
settle_sampler_start() {
	PGAPPNAME=bench-settle-sampler q -c "CALL bench_sample_settled(0.02)" >/dev/null 2>&1 &
	settle_sampler_pid=$!
	hist_start
}
settle_sampler_stop() { # key: as hist_stop
	sleep 0.1 # one more sample after the last settle
	q -o /dev/null -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'bench-settle-sampler'"
	wait "$settle_sampler_pid" 2>/dev/null || true
	settle_sampler_pid=
	hist_stop "$1"
}
# The extension's latency histogram before a steady run (hist_start) and the
# delta since (hist_stop).
hist_start() {
	q -F ' ' -c "SELECT le_ms, count FROM outbox_latency_histogram()" >"$work/hist.before"
}
hist_stop() { # key: R[key.hist] = "count p50 p99 max" (ms) of the histogram's delta
	q -F ' ' -c "SELECT le_ms, count FROM outbox_latency_histogram()" >"$work/hist.after"
	# Percentiles interpolated linearly inside their bucket (as Prometheus'
	# histogram_quantile); max = the upper bound of the highest bucket used.
	res "$1.hist" "$(paste -d' ' "$work/hist.before" "$work/hist.after" | awk '
		function pct(q,   i, lo) {
			for (i = 1; i <= NR; i++)
				if (d[i] >= q * n) {
					lo = (i > 1 ? le[i - 1] : 0)
					if (le[i] == "Infinity") return lo
					return lo + (le[i] - lo) * (q * n - (i > 1 ? d[i - 1] : 0)) / (d[i] - (i > 1 ? d[i - 1] : 0))
				}
		}
		{ le[NR] = $1; d[NR] = $4 - $2 } END {
			n = d[NR]; if (n <= 0) { print "0 - - -"; exit }
			for (i = 1; i <= NR; i++) if (d[i] == n) { top = le[i]; break }
			printf "%d %.1f %.1f %s\n", n, pct(0.5), pct(0.99), top }')"
}

RELAY_STATUS=$work/relay.status
start_relay() { # brokers
	rm -f "$RELAY_STATUS"
	"$bench/relay" --dsn "$dsn" --brokers "$1" --batch 100 --poll-ms 100 \
		--status-file "$RELAY_STATUS" --max-seconds 900 >"$work/relay.out" 2>>"$work/relay.err" &
	relay_pid=$!
}
stop_relay() {
	kill -TERM "$relay_pid" 2>/dev/null || true
	wait "$relay_pid" || true
	relay_pid=
	RELAY_LINE=$(tail -n1 "$work/relay.out")
}
# The extension's events_published counter: shared memory, no table read.
ours_published() {
	q -c "SELECT coalesce(max(value), 0) FROM outbox_counters() WHERE name = 'events_published'"
}
# Settled count of a relay's or peer's status file (0 if none yet).
status_settled() { sed -n 's/^settled=\([0-9]*\) .*/\1/p' "$1" 2>/dev/null | grep . || echo 0; }
# Until a publisher has published n more events than its base (default: its
# progress just before exec-sql runs), watching only what it reports: the
# extension's events_published counter, or a relay's or peer's status file
# (drain_wait; the outbox tables are not read while the clock runs).  It
# looks every BENCH_DRAIN_INTERVAL_MS (default 2): a drain of 100,000
# events takes 0.2-0.3 s on the mock, which 20 ms steps would round by up
# to a tenth.
# DRAIN_PIDS: the publisher's processes (comma-separated), whose share of
# the cores drain_wait reports (pids_cores) beside the machine's (busy_cores).
drain() { # ours|status-file events [exec-sql [base]] -> $DRAIN_LINE
	local rc=0 what=(--counter) extra=()
	[ "$1" = ours ] || what=(--status-file "$1")
	[ -n "${3:-}" ] && extra+=(--exec "$3")
	[ -n "${4:-}" ] && extra+=(--base "$4")
	[ -n "${DRAIN_PIDS:-}" ] && extra+=(--pids "$DRAIN_PIDS")
	DRAIN_LINE=$("$bench/drain_wait" --dsn "$dsn" "${what[@]}" --events "$2" "${extra[@]}" \
		--interval-ms "${BENCH_DRAIN_INTERVAL_MS:-2}" --timeout-s "$DRAIN_TIMEOUT") || rc=$?
	[ "$rc" = 0 ] && return 0
	[ "$1" = ours ] || exit "$rc"
	# A publisher stuck past the timeout: say where, drop its backlog (with the
	# workers stopped: their open batch holds locks), and go on with the run.
	stuck_n=$((${stuck_n:-0} + 1))
	res "stuck.$stuck_n" "$(q -c "SELECT string_agg(state || ' / ' || coalesce(wait_event_type || ':' || wait_event, 'CPU')
		|| ' / ' || left(query, 60), '; ') FROM pg_stat_activity WHERE backend_type = 'outbox publisher'")"
	say "  !! not all published after $DRAIN_TIMEOUT s; the publisher: ${R[stuck.$stuck_n]}; dropping the backlog"
	local w
	w=$(q -c "SHOW outbox.workers")
	restart_pg 0
	q -c "TRUNCATE outbox, aggregate_publication"
	restart_pg "$w"
	DRAIN_LINE="events=0 seconds=timeout events_per_s= table_seconds= first_ack_s= exec_s="
}
warm_ours() { # topic: every worker's producer, connections and topic metadata ready
	drain ours 64 "SELECT count(*) FROM generate_series(1, 64) i,
		LATERAL outbox_emit('order', 'warmup-' || i, 'Warmup', '{}', topic => '$1') e"
}
warm_relay() {
	drain "$RELAY_STATUS" 1 "INSERT INTO relay_outbox (aggregate_id, aggregate_version, topic, headers, payload)
		VALUES ('warmup', 1, '$1', '{\"event_id\": \"warmup-$tn\", \"event_type\": \"Warmup\", \"aggregate_type\": \"order\"}', '{}')"
}

# CPU time (clock ticks) of the publishers: the extension's workers, or the
# relay process plus its server backend; and the extension's batch counters.
pub_pids() {
	q -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox publisher'
		OR application_name = 'outbox-bench-relay'"
	if [ -n "$relay_pid" ]; then echo "$relay_pid"; fi
}
cpu_of() {
	local t=0 p
	for p in "$@"; do
		if [ -r "/proc/$p/stat" ]; then t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{ print $12 + $13 }'))); fi
	done
	echo "$t"
}
counters() {
	q -F ' ' -c "SELECT max(value) FILTER (WHERE name = 'batches'), max(value) FILTER (WHERE name = 'events_published') FROM outbox_counters()"
}
# events per read between two counters() lines ("batches events_published")
per_batch() { # before after
	awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " ");
		n = y[1] - x[1]; if (n > 0) printf "%.1f\n", (y[2] - x[2]) / n; else print "-" }'
}
HZ=$(getconf CLK_TCK)
# usage: snap_start; <run>; snap_end key seconds -> key.pub_cpu (% of one CPU), key.per_batch
snap_start() { SNAP_PIDS=$(pub_pids | xargs); SNAP_CPU=$(cpu_of $SNAP_PIDS); SNAP_CTR=$(counters); }
snap_end() {
	local c1
	c1=$(cpu_of $SNAP_PIDS)
	res "$1.pub_cpu" "$(awk -v a="$SNAP_CPU" -v b="$c1" -v hz="$HZ" -v s="$2" 'BEGIN { printf "%.0f\n", 100 * (b - a) / hz / s }')"
	res "$1.per_batch" "$(per_batch "$SNAP_CTR" "$(counters)")"
}

# Rounds: R[base.f] = the median of R[base.rN.f] over N = 1..reps (a round
# without the figure, e.g. timed out, left out; an even count: the mean of
# the middle two), R[base.f.lo] and R[base.f.hi] its range, R[base.f.all]
# every round's, in order.
rounds_summary() { # base reps field...
	local base=$1 reps=$2 f r v vals all stats
	shift 2
	for f in "$@"; do
		vals="" all=""
		for r in $(seq "$reps"); do
			v=${R[$base.r$r.$f]:-}
			all="$all${all:+, }${v:--}"
			if [ -n "$v" ] && [ "$v" != - ]; then vals="$vals $v"; fi
		done
		[ -n "$vals" ] || continue
		stats=$(tr ' ' '\n' <<<"$vals" | sed '/^$/d' | sort -g | awk '{ x[NR] = $1 } END {
			m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2; print m, x[1], x[NR] }')
		res "$base.$f" "${stats%% *}"
		stats=${stats#* }
		res "$base.$f.lo" "${stats% *}"
		res "$base.$f.hi" "${stats#* }"
		res "$base.$f.all" "$all"
	done
}
# Text fields of rounds (order checks, the relays' totals): "r1: x | r2: y".
rounds_text() { # base reps field
	local r s=""
	for r in $(seq "$2"); do s="$s${s:+ | }r$r: ${R[$1.r$r.$3]:-not run}"; done
	res "$1.$3" "$s"
}
# "median (min–max)" of a summarised figure (mr: as is; mrf: thousands
# separated); the value alone when the rounds agree or there was one.
mr() { # key [fmt]
	local m=${R[$1]:-} lo=${R[$1.lo]:-} hi=${R[$1.hi]:-} f=${2:-echo}
	[ -n "$m" ] || { echo -; return; }
	if [ -z "$lo" ] || [ "$lo" = "$hi" ]; then $f "$m"; else echo "$($f "$m") ($($f "$lo")–$($f "$hi"))"; fi
}
mrf() { mr "$1" fmt; }
# Whether order_check results are all clean: every round's result present
# ("rN: messages=..."), every count of an anomaly 0.
oc_clean() { # text: order_check result lines, or rounds_text of them
	local bad
	bad=$(grep -oE '(duplicates|gaps|inversions|lost|split|malformed|unexpected|mismatched)=[0-9?]+' <<<"$1" | grep -cvE '=0$' || true)
	bad=$((bad + $(grep -oE 'r[0-9]+: [a-z]*' <<<"$1" | grep -cv 'messages$' || true)))
	if [ "$bad" = 0 ] && grep -q 'messages=' <<<"$1"; then echo clean; else echo "**NOT CLEAN**"; fi
}

# report helpers
ratio() { # a b -> a/b with 2 decimals, or "-"
	awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "" || b + 0 <= 0) print "-"; else printf "%.2f\n", a / b }'
}
fmt() { # 12345.6 -> 12,346
	if [ -z "${1:-}" ]; then echo -; return; fi
	printf '%.0f' "$1" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta'
}
met() { # awk condition
	if awk "BEGIN { exit !($1) }" 2>/dev/null; then echo "met"; else echo "**not met**"; fi
}
bfield() { awk -v i="$2" '{print $i}' <<<"${R[$1.batches]:-0 0 0 0 0 0 0}"; }
lf() { awk -v i="$2" '{print $i}' <<<"${R[$1.stats]:-0 0 0 0}"; }
# Per-event latency rows (created_at, ms) of a table's events since a time:
# the relay's published_at - created_at; the extension's from the settle
# sampler: the first sampled settle of the event's aggregate that reaches its
# version (ms NULL if none was sampled: counted apart, see lat_stats).
lat_rows() { # table since [at|seen]
	if [ "$1" = outbox ]; then
		echo "SELECT o.created_at, extract(epoch FROM s.${3:-at} - o.created_at) * 1000 AS ms FROM outbox o
			LEFT JOIN LATERAL (SELECT b.at, b.seen FROM bench_settled b WHERE b.aggregate_id = o.aggregate_id
				AND b.version >= o.aggregate_version ORDER BY b.version LIMIT 1) s ON true
			WHERE o.created_at >= '$2'"
	else
		echo "SELECT created_at, extract(epoch FROM published_at - created_at) * 1000 AS ms FROM $1
			WHERE created_at >= '$2'"
	fi
}
# count p50 p99 max (ms) of the per-event latency of a table's events since a
# time, into R[key.stats] (read with lf); (d) and the peers (p).  The
# extension's: also R[key.stats_seen], the same from the sampler's own clock
# (seen - created_at: the settle's commit, to within the 20 ms sampling), and
# R[key.unsampled], events whose settle the sampler missed (should be 0).
lat_stats() { # key table since
	local pct="count(ms),
		round((percentile_disc(0.5) WITHIN GROUP (ORDER BY ms))::numeric, 1),
		round((percentile_disc(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 1),
		round(max(ms)::numeric, 1)"
	res "$1.stats" "$(q -F ' ' -c "SELECT $pct FROM ($(lat_rows "$2" "$3")) s")"
	if [ "$2" = outbox ]; then
		res "$1.stats_seen" "$(q -F ' ' -c "SELECT $pct FROM ($(lat_rows "$2" "$3" seen)) s")"
		res "$1.unsampled" "$(q -c "SELECT count(*) FILTER (WHERE ms IS NULL) FROM ($(lat_rows "$2" "$3")) s")"
	fi
}

# The payload both sides store: ~95 bytes as JSON text.
PAYLOAD_SQL="jsonb_build_object('seq', i, 'note', 'benchmark payload of about a hundred bytes', 'amount', 10, 'currency', 'EUR')"
ours_preload() { # n aggregates topic
	echo "BEGIN; SELECT count(*) FROM generate_series(0, $1 - 1) AS i,
		LATERAL outbox_emit('order', 'order-' || (i % $2), 'OrderPaid', $PAYLOAD_SQL, topic => '$3') AS e;
		COMMIT;"
}
relay_preload() { # n aggregates topic
	echo "BEGIN; INSERT INTO relay_outbox (aggregate_id, aggregate_version, topic, headers, payload)
		SELECT 'order-' || (i % $2), i / $2 + 1, '$3',
			jsonb_build_object('event_id', gen_random_uuid()::text, 'event_type', 'OrderPaid',
				'aggregate_type', 'order'), $PAYLOAD_SQL
		FROM generate_series(0, $1 - 1) AS i;
		COMMIT;"
}

# The publisher's step timings from the debug1 lines logged since byte offset
# $1: "reads events/read fetch produce settles aggregates/settle settle" (ms
# per read or per settle).  A read (publish_fetch's "fetched N events in"
# and "produced ... at" lines, timed from the read's start; fetch includes
# the snapshot and the delta query, produce the WAL flush) and a settle
# ("settled N aggregates ... in") are separate steps of the pipeline: a
# settle runs whenever acknowledged aggregates are ready, between reads.
batch_stats() {
	tail -c +"$(($1 + 1))" "$pglog" | awk '
		function after(w,   i) { for (i = 1; i <= NF; i++) if ($i == w) return $(i + 1); return "" }
		/outbox: fetched [0-9]+ events in/ { p = $4; n[p] = after("fetched"); f[p] = after("in") }
		/outbox: produced [0-9]+ events of/ {
			p = $4
			if (n[p] > 0) { r++; ev += n[p]; sf += f[p]; sp += after("at") - f[p] }
			n[p] = 0
		}
		/outbox: settled [0-9]+ aggregates/ { s++; sa += after("settled"); ss += after("in") }
		END {
			printf "%d %.0f %.1f %.1f %d %.0f %.1f\n", r, r ? ev / r : 0, r ? sf / r : 0, r ? sp / r : 0,
				s, s ? sa / s : 0, s ? ss / s : 0
		}'
}

# One extension throughput run: key prefix, events, aggregates.  Events per
# read from the counters (batches, events_published); the step timings from
# the debug lines only in a profile run (set_debug on).
measure_ours() {
	local key=$1 n=$2 aggs=$3 pos c0
	new_topic "${key//./-}"
	reset_tables
	warm_ours "$T"
	pos=$(stat -c %s "$pglog")
	c0=$(counters)
	drain ours "$n" "$(ours_preload "$n" "$aggs" "$T")"
	res "$key.eps" "$(kv "$DRAIN_LINE" events_per_s)"
	res "$key.seconds" "$(kv "$DRAIN_LINE" seconds)"
	res "$key.table_seconds" "$(kv "$DRAIN_LINE" table_seconds)"
	res "$key.first_ack" "$(kv "$DRAIN_LINE" first_ack_s)"
	res "$key.preload_s" "$(kv "$DRAIN_LINE" exec_s)"
	res "$key.events" "$(kv "$DRAIN_LINE" events)"
	res "$key.per_batch" "$(per_batch "$c0" "$(counters)")"
	if [ "$PROFILING" = 1 ]; then
		sleep 0.3 # let the last batch's debug lines reach the log
		res "$key.batches" "$(batch_stats "$pos")"
	fi
	say "  $key: ${R[$key.eps]} events/s (${R[$key.seconds]} s; events per read ${R[$key.per_batch]}${R[$key.batches]:+; reads events/read fetch produce settles aggs/settle settle: ${R[$key.batches]}})"
}
measure_relay() { # key events aggregates [brokers]
	local key=$1 n=$2 aggs=$3 br=${4:-$brokers}
	new_topic "${key//./-}"
	reset_tables
	start_relay "$br"
	warm_relay "$T"
	kill -USR1 "$relay_pid"
	drain "$RELAY_STATUS" "$n" "$(relay_preload "$n" "$aggs" "$T")"
	stop_relay
	res "$key.eps" "$(kv "$DRAIN_LINE" events_per_s)"
	res "$key.seconds" "$(kv "$DRAIN_LINE" seconds)"
	res "$key.preload_s" "$(kv "$DRAIN_LINE" exec_s)"
	res "$key.events" "$(kv "$DRAIN_LINE" events)"
	res "$key.relay" "${RELAY_LINE#relay: }"
	say "  $key: ${R[$key.eps]} events/s (${R[$key.seconds]} s; ${R[$key.relay]})"
}
measure_raw() { # key events aggregates
	local key=$1 line
	new_topic "${key//./-}"
	# (once more after a failure: a real broker may still lack the new topic's metadata)
	line=$("$bench/relay" raw --brokers "$brokers" --topic "$T" --events "$2" --aggregates "$3" 2>>"$work/relay.err") ||
		{ sleep 2; line=$("$bench/relay" raw --brokers "$brokers" --topic "$T" --events "$2" --aggregates "$3" 2>>"$work/relay.err"); }
	res "$key.eps" "$(kv "$line" events_per_s)"
	res "$key.seconds" "$(kv "$line" seconds)"
	say "  $key: ${R[$key.eps]} events/s"
}
order_check() { # key table topic
	local line
	q -c "SELECT aggregate_id || E'\t' || max(aggregate_version) FROM $2 GROUP BY aggregate_id" >"$work/expect"
	line=$("$tools/order_check" --brokers "$brokers" --topic "$3" --expect "$work/expect" \
		--any-start --timeout-ms 60000 2>>"$work/order_check.err" | tail -n1) || true
	res "$1.order_check" "${line#order_check: }"
}

# The report's rows of (d), one per rate: latency, CPU and batch size.
report_latency_rows() {
	for rate in $RATES; do
		echo "| $(fmt "$rate") | $(fmt "${R[d.ours.$rate.tps]}") / $(fmt "${R[d.relay.$rate.tps]}") | $(lf d.ours.$rate 2) ms | **$(lf d.ours.$rate 3) ms** | $(lf d.ours.$rate 4) ms | $(lf d.relay.$rate 2) ms | $(lf d.relay.$rate 3) ms | $(lf d.relay.$rate 4) ms | $(ratio "$(lf d.relay.$rate 3)" "$(lf d.ours.$rate 3)") | ${R[d.ours.$rate.pub_cpu]} / ${R[d.relay.$rate.pub_cpu]} | ${R[d.ours.$rate.per_batch]} |"
	done
}

# The report's table of the events over 20 ms of (d), and how they cluster.
report_tail_table() {
	echo "| rate | extension: events > 20 ms | in how many of the run's seconds | worst second | relay: events > 20 ms |"
	echo "|---:|---:|---:|---:|---:|"
	for rate in $RATES; do
		t=(${R[d.ours.$rate.tail]:-0 0 0 0}); u=(${R[d.relay.$rate.tail]:-0 0 0 0})
		echo "| $(fmt "$rate") | ${t[0]} of $(lf d.ours.$rate 1) | ${t[1]} of ${t[3]} | ${t[2]} | ${u[0]} of $(lf d.relay.$rate 1) |"
	done
}

# The report's order checks of the 10,000-aggregate runs of (b).
report_order_check() {
	echo "Order check of the 10,000-aggregate runs, every round (\`test/tools/order_check\`, every partition read back):"
	echo
	echo "- extension ($(oc_clean "${R[b.ours.10000.order_check]:-}")): \`${R[b.ours.10000.order_check]:-not run}\`"
	echo "- relay ($(oc_clean "${R[b.relay.10000.order_check]:-}")): \`${R[b.relay.10000.order_check]:-not run}\`"
}
