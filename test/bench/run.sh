#!/usr/bin/env bash
#
# test/bench/run.sh [quick]
# test/bench/run.sh real [quick]
#
# The outbox benchmark suite: prints figures, judges nothing.  One command
# starts a mock Kafka cluster (test/tools/mock_kafka, 3 brokers on
# 127.0.0.1) and a throwaway PostgreSQL cluster with
# shared_preload_libraries = 'outbox', and measures in the same run, so that
# ratios are meaningful:
#
#   a. emit cost: pgbench, 2 clients, a business UPDATE + outbox_emit() vs
#      the same UPDATE + a plain INSERT into relay_outbox; with the publisher
#      stopped (outbox.workers = 0) and running (workers = 1; for the plain
#      table: with the relay running, and with only an idle worker)
#   b. publish throughput: 100,000 preloaded events over 10,000 / 10 / 1
#      aggregates: the extension vs the polling relay (relay.c) vs a raw
#      librdkafka producer
#   c. (b, 10,000 aggregates) with the mock's round trip set to 1, 5, 20 ms
#   d. emit-to-acknowledgement latency at steady 500/1,000/2,000/5,000
#      events/s (pgbench --rate), per event: the relay's published_at -
#      created_at; the extension's settle time of the event's aggregate
#      (aggregate_publication.last_published_at, sampled every 20 ms by
#      settle_sampler: the extension keeps no per-event publish time)
#   e. 1, 2, 4 publisher workers on (b, 10,000 aggregates)
#   p. the peers, in the same run: PgQ and logical-decoding relays
#      (peers.c), the relay at LIMIT 100 / 1000 and raw librdkafka beside
#      the extension; throughput (0 / 5 ms RTT, a 1,000-transaction
#      backlog), CPU per event and latency at a steady rate (peers.sh)
#   f. (b, 10,000 aggregates) and (d, 2,000/s) against the mock as shipped
#      (Nagle's algorithm on its sockets; see nodelay.c)
#
# As root: builds test/tools and test/bench, re-runs itself as postgres and
# writes benchmarks.md (the run's full report) and the plots into
# /tmp/outbox-bench/ (quick mode: /tmp/outbox-bench-quick/) unless BENCH_OUT
# is set; docs/benchmarks.md is the results page, updated by hand from such
# runs, and docs/*.png are copied from a full run.  The extension must be installed
# (make && make install).  Full mode takes about 30 minutes, quick about 6.
# Every step is bounded in time; the clusters and processes it started stop
# when it exits.  The work directory (logs) is kept when a run fails.
#
# real mode: (b) at 10,000 and 1 aggregates and (d) at 500 and 2,000/s
# (quick: one rate) against a real Apache Kafka 3.9 cluster started with
# test/tools/kafka_cluster (3 brokers, replication factor 3,
# min.insync.replicas 2; every producer uses acks=all through
# enable.idempotence), topics of 16 partitions as on the mock.  (c) does not
# apply: a real broker's round trip cannot be set, and delaying 127.0.0.1
# with tc netem would delay every other user of the shared loopback too.
# It replaces the "On real Kafka" section at the end of BENCH_OUT's
# benchmarks.md, default /tmp/outbox-bench-real/ (quick: writes /tmp/outbox-bench-real-quick/benchmarks_real.md); full
# mode keeps that section.  About 5 minutes (more under load), quick about 3.
#
# Environment: BENCH_OUT (output directory), BENCH_MOCK_NAGLE=1 (run a-e
# against the mock as shipped too, i.e. without the TCP_NODELAY shim),
# BENCH_PEERS_ONLY=1 (section p alone, then (e) for its 2- and 4-worker
# figures; writes peers.md into BENCH_OUT or
# /tmp/outbox-bench-peers/).  As root, installs Debian's postgresql-15-pgq3
# for the PgQ peer if it is missing (benchmark only; not a CI dependency).
#
set -euo pipefail

mode=${1:-full}
real=0
if [ "$mode" = real ]; then
	real=1
	mode=${2:-full}
fi
case $mode in
	full | quick) ;;
	*)
		echo "usage: $0 [real] [quick]" >&2
		exit 2
		;;
esac

bench=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$bench/../.." && pwd)
tools=$src/test/tools

# PgQ for section p (benchmark only, not a dependency of the extension or its
# CI): Debian's postgresql-NN-pgq3, copied into pg_config's directories when
# those are not the system's (a private installation).
install_pgq() {
	local share lib pkg f
	share=$(pg_config --sharedir)
	lib=$(pg_config --pkglibdir)
	[ -f "$share/extension/pgq.control" ] && return 0
	pkg=postgresql-$(pg_config --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')-pgq3
	if ! dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
		echo "run.sh: installing $pkg (PgQ, for the PgQ peer of section p only)" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >/dev/null ||
			{ echo "run.sh: could not install $pkg: the PgQ peer will be skipped" >&2; return 0; }
	fi
	for f in $(dpkg -L "$pkg" | grep -E '/extension/pgq[-.]|/lib/pgq_[a-z]*\.so$'); do
		case $f in
			*/extension/*) [ -f "$share/extension/${f##*/}" ] || cp "$f" "$share/extension/" ;;
			*.so) [ -f "$lib/${f##*/}" ] || cp "$f" "$lib/" ;;
		esac
	done
}

# ---------------------------------------------------------------- as root
if [ "$(id -u)" = 0 ]; then
	export PATH="$(pg_config --bindir):$PATH"
	if [ ! -f "$(pg_config --pkglibdir)/outbox.so" ]; then
		echo "run.sh: the extension is not installed (make && make install)" >&2
		exit 1
	fi
	make -s -C "$tools" >/dev/null
	make -s -C "$bench" >/dev/null
	[ "$real" = 1 ] || install_pgq
	work=$(mktemp -d /tmp/outbox-bench.XXXXXX)
	chown postgres: "$work"
	if [ "$real" = 1 ]; then limit=1200; elif [ "$mode" = quick ]; then limit=900; else limit=3000; fi
	git_rev=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
	git_dirty=$(git -C "$src" status --porcelain -- src sql 2>/dev/null | wc -l)
	so=$(pg_config --pkglibdir)/outbox.so
	so_info="$(date -u -r "$so" '+%Y-%m-%d %H:%M UTC'), md5 $(md5sum "$so" | cut -c1-12)"
	started=$(date +%s)
	rc=0
	timeout -k 30 "$limit" runuser -u postgres -- env BENCH_WORK="$work" \
		BENCH_GIT="$git_rev (src/ and sql/: $git_dirty uncommitted changes)" \
		BENCH_SO="$so_info" BENCH_MOCK_NAGLE="${BENCH_MOCK_NAGLE:-0}" \
		BENCH_PEERS_ONLY="${BENCH_PEERS_ONLY:-0}" \
		BENCH_STARTED="$started" BENCH_LIMIT="$limit" \
		bash "$bench/run.sh" $([ "$real" = 1 ] && echo real) "$mode" || rc=$?
	if [ "$mode" = quick ]; then
		out=${BENCH_OUT:-/tmp/outbox-bench$([ "$real" = 1 ] && echo -real || true)-quick}
	else
		out=${BENCH_OUT:-/tmp/outbox-bench$([ "$real" = 1 ] && echo -real || true)}
	fi
	mkdir -p "$out"
	if [ "$rc" = 0 ] && [ "${BENCH_PEERS_ONLY:-0}" = 1 ] && [ -s "$work/out/peers.md" ]; then
		out=${BENCH_OUT:-/tmp/outbox-bench-peers}
		mkdir -p "$out"
		cp "$work/out/peers.md" "$work/out/results.tsv" "$out/"
		echo "run.sh: wrote $out/peers.md ($(($(date +%s) - started)) s)"
		rm -rf "$work"
	elif [ "$rc" = 0 ] && [ "$real" = 1 ] && [ -s "$work/out/benchmarks_real.md" ]; then
		if [ "$mode" = quick ]; then
			cp "$work/out/benchmarks_real.md" "$out/"
			echo "run.sh: wrote $out/benchmarks_real.md ($(($(date +%s) - started)) s)"
		else
			# replace the real-Kafka section, always the last one of the report
			{
				sed '/^<!-- real-kafka -->$/,$d' "$out/benchmarks.md" 2>/dev/null || true
				echo '<!-- real-kafka -->'
				cat "$work/out/benchmarks_real.md"
			} >"$work/benchmarks.md"
			cp "$work/benchmarks.md" "$out/benchmarks.md"
			echo "run.sh: wrote the real-Kafka section of $out/benchmarks.md ($(($(date +%s) - started)) s)"
		fi
		rm -rf "$work"
	elif [ "$rc" = 0 ] && [ "$real" = 0 ] && [ -s "$work/out/benchmarks.md" ]; then
		# keep the real-Kafka section of the previous report (run.sh real writes it)
		sed -n '/^<!-- real-kafka -->$/,$p' "$out/benchmarks.md" >"$work/real_section" 2>/dev/null || true
		cat "$work/real_section" >>"$work/out/benchmarks.md"
		cp "$work/out/benchmarks.md" "$work/out/"*.png "$out/"
		echo "run.sh: wrote $out/benchmarks.md, $out/throughput_vs_rtt.png, $out/latency_cdf.png ($(($(date +%s) - started)) s)"
		rm -rf "$work"
	else
		echo "run.sh: failed (status $rc); logs kept in $work" >&2
	fi
	exit "$rc"
fi

# ------------------------------------------------------ as postgres: setup
work=${BENCH_WORK:-$(mktemp -d /tmp/outbox-bench.XXXXXX)}
out=$work/out
mkdir -p "$out"
export PATH="$(pg_config --bindir):$PATH"
export PGHOST=127.0.0.1 PGDATABASE=postgres
started=${BENCH_STARTED:-$(date +%s)}

if [ "$mode" = quick ]; then
	N=10000            # events per throughput run
	EMIT_S=3           # seconds per pgbench emit run
	EMIT_ROUNDS=1
	PERF_S=2
	LAT_S=4            # seconds per latency run
	RATES="1000 2000"
	NAGLE_RELAY_N=5000
	B_REPS=1           # repetitions of (b, 10,000 aggregates)
	P_REPS=1           # repetitions of the peers' throughput runs (p)
	P_LAT_S=4          # seconds per steady-load run of (p)
	P_RATES="1000 2000"
else
	N=100000
	EMIT_S=5
	EMIT_ROUNDS=4      # 4 x 5 s per configuration, interleaved, order alternating
	PERF_S=5
	LAT_S=20
	RATES="500 1000 2000 5000"
	NAGLE_RELAY_N=20000
	B_REPS=3
	P_REPS=3
	P_LAT_S=12
	P_RATES="1000 2000 5000"
fi
B_AGGS="10000 10 1"   # aggregates of the throughput runs
if [ "$real" = 1 ]; then
	B_AGGS="10000 1"
	B_REPS=1           # a real run is ~10x slower: one repetition keeps it bounded
	if [ "$mode" = quick ]; then LAT_S=5 RATES=2000; else RATES="500 2000"; fi
fi
LAT_CLIENTS=8
if [ "$mode" = quick ]; then DRAIN_TIMEOUT=60; else DRAIN_TIMEOUT=120; fi
AGGS_MAIN=10000

mock_pid=
mock2_pid=
relay_pid=
kafka=    # the real cluster's directory (real mode)
cleanup() {
	[ -n "$relay_pid" ] && kill -CONT "$relay_pid" 2>/dev/null && kill "$relay_pid" 2>/dev/null || true
	pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
	[ -n "$kafka" ] && "$tools/kafka_cluster" down "$kafka" >/dev/null 2>&1 || true
	[ -n "$mock_pid" ] && kill "$mock_pid" 2>/dev/null || true
	[ -n "$mock2_pid" ] && kill "$mock2_pid" 2>/dev/null || true
	wait 2>/dev/null || true
}
trap cleanup EXIT

say() { printf '%s [%4ds] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - started))" "$*"; }
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }

# key=value results, in order, for the report
declare -A R
res() {
	R[$1]=$2
	printf '%s\t%s\n' "$1" "$2" >>"$out/results.tsv"
}
# value of key in a "k=v k=v" line
kv() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n1; }

start_mock() { # name preload
	local name=$1 pre=$2
	rm -f "$work/$name.bootstrap" "$work/$name.control"
	env ${pre:+LD_PRELOAD=$pre} "$tools/mock_kafka" --brokers 3 \
		--bootstrap-file "$work/$name.bootstrap" --control-file "$work/$name.control" \
		--max-seconds 2700 >"$work/$name.log" 2>&1 &
	local pid=$!
	for _ in $(seq 100); do [ -s "$work/$name.control" ] && break; sleep 0.1; done
	[ -s "$work/$name.control" ] || { echo "mock $name did not start" >&2; exit 1; }
	eval "${name}_pid=$pid"
}

if [ "$real" = 1 ]; then
	say "real Kafka (3 brokers, RF 3, min.insync.replicas 2) and PostgreSQL in $work"
	kafka=$work/kafka
	"$tools/kafka_cluster" start "$kafka" --brokers 3 --max-seconds "${BENCH_LIMIT:-1200}" \
		>"$work/kafka_start.log" 2>&1 || { cat "$work/kafka_start.log" >&2; exit 1; }
	brokers=$(cat "$kafka/bootstrap")
	say "  brokers $brokers"
else
	say "mock Kafka (3 brokers, TCP_NODELAY shim) and PostgreSQL in $work"
	if [ "${BENCH_MOCK_NAGLE:-0}" = 1 ]; then start_mock mock ""; else start_mock mock "$bench/nodelay.so"; fi
	ctl=$work/mock.control
	brokers=$(cat "$work/mock.bootstrap")
fi
mk() { "$tools/mockctl" "$ctl" "$@" >/dev/null; }

# Until every broker's metadata has the new topic: a broker that does not
# know it yet answers "unknown topic", which fails a producer started at once.
wait_topic() { # topic
	local b n
	for b in ${brokers//,/ }; do
		for _ in $(seq 100); do
			n=$(kcat -L -b "$b" -t "$1" -m 5 2>/dev/null | sed -n 's/.* with \([0-9]*\) partitions.*/\1/p')
			[ "${n:-0}" = 16 ] && break
			sleep 0.2
		done
		[ "${n:-0}" = 16 ] || { echo "topic $1 unknown to broker $b after 20 s" >&2; exit 1; }
	done
}

tn=0
new_topic() { # prefix -> $T, 16 partitions (the mock keeps ~5 MB per partition)
	tn=$((tn + 1))
	T="bench.$1.$tn"
	if [ -n "$kafka" ]; then
		"$tools/kafka_cluster" topic "$kafka" "$T" 16 3 >>"$work/kafka_topics.log" 2>&1 ||
			{ tail -n 20 "$work/kafka_topics.log" >&2; exit 1; }
		wait_topic "$T"
	else
		mk topic_create "$T" 16 3
	fi
}

initdb -D "$work/data" -A trust --no-sync -E UTF8 --locale=C >/dev/null
cat >>"$work/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$work'
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
shared_buffers = '256MB'
# the preload emits to 10,000 aggregates in one transaction: one lock each
max_locks_per_transaction = 512
max_wal_size = '8GB'
checkpoint_timeout = '30min'
log_line_prefix = '%m [%p] '
log_checkpoints = on
EOF
for _ in 1 2 3 4 5; do
	PGPORT=$((20000 + RANDOM % 20000))
	cat >"$work/data/postgresql.auto.conf" <<EOF
port = $PGPORT
outbox.brokers = '$brokers'
outbox.workers = 1
EOF
	if pg_ctl -D "$work/data" -l "$work/postgres.log" -w -t 60 start >/dev/null; then break; fi
	PGPORT=
done
[ -n "$PGPORT" ] || { echo "PostgreSQL did not start" >&2; exit 1; }
export PGPORT
dsn="host=127.0.0.1 port=$PGPORT dbname=postgres"
pglog=$work/postgres.log

q <<'EOF'
CREATE EXTENSION outbox;
-- the relay's table, and the plain outbox of the emit benchmark
CREATE TABLE relay_outbox (
	id bigserial PRIMARY KEY,
	aggregate_id text,
	aggregate_version bigint,
	topic text,
	headers jsonb,
	payload jsonb,
	created_at timestamptz DEFAULT clock_timestamp(),
	published_at timestamptz
);
CREATE INDEX relay_outbox_pending_idx ON relay_outbox (id) WHERE published_at IS NULL;
-- The extension's per-event publish times, which it does not record: every
-- 20 ms (settle_sampler), the aggregates settled since, with the time their
-- version was acknowledged (last_published_at: the delivery report's time).
-- An event's publish time is that of the first settle reaching its version.
CREATE UNLOGGED TABLE bench_settled (
	aggregate_id text NOT NULL,
	version bigint NOT NULL,
	at timestamptz NOT NULL,       -- last_published_at: when Kafka acknowledged it
	seen timestamptz NOT NULL,     -- when the sampler saw it committed
	PRIMARY KEY (aggregate_id, version)
);
CREATE PROCEDURE bench_sample_settled(interval_s float8) LANGUAGE plpgsql AS $$
DECLARE
	t timestamptz := '-infinity';
	t_next timestamptz;
BEGIN
	LOOP
		t_next := clock_timestamp();
		-- updated_at is the settling's start, before its commit: look 1 s back
		-- so that a settle committed after the previous sample is not missed
		INSERT INTO bench_settled
		SELECT aggregate_id, last_published_version, last_published_at, clock_timestamp()
		  FROM aggregate_publication
		 WHERE updated_at > t - interval '1 s' AND last_published_at IS NOT NULL
		ON CONFLICT DO NOTHING;
		COMMIT;
		t := t_next;
		PERFORM pg_sleep(interval_s);
	END LOOP;
END $$;
-- diagnostic: a plain table with every column, constraint and index of outbox
CREATE TABLE outbox_copy (LIKE outbox INCLUDING ALL);
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, total numeric NOT NULL,
	version bigint NOT NULL);
EOF

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
set_debug() { # on|off: per-batch timings of the publisher in the server log
	if [ "$1" = on ]; then
		q -c "ALTER SYSTEM SET log_min_messages = 'debug1'" -c "SELECT pg_reload_conf()" >/dev/null
	else
		q -c "ALTER SYSTEM RESET log_min_messages" -c "SELECT pg_reload_conf()" >/dev/null
	fi
	sleep 0.2
}
reset_tables() {
	# (A running publisher's read may hold aggregate_publication and wait for
	# outbox: the TRUNCATE can lose a deadlock; it only has to be retried.)
	local i
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

start_relay() { # brokers
	"$bench/relay" --dsn "$dsn" --brokers "$1" --batch 100 --poll-ms 100 \
		--max-seconds 900 >"$work/relay.out" 2>>"$work/relay.err" &
	relay_pid=$!
}
stop_relay() {
	kill -TERM "$relay_pid" 2>/dev/null || true
	wait "$relay_pid" || true
	relay_pid=
	RELAY_LINE=$(tail -n1 "$work/relay.out")
}
drain() { # table [exec-sql] -> $DRAIN_LINE
	local rc=0
	# (the extension: nothing in outbox_pending; a relay: no published_at IS NULL)
	local what=(--table "$1")
	[ "$1" = outbox ] && what=(--outbox)
	if [ $# -gt 1 ]; then
		DRAIN_LINE=$("$bench/drain_wait" --dsn "$dsn" "${what[@]}" --exec "$2" \
			--interval-ms 20 --timeout-s "$DRAIN_TIMEOUT") || rc=$?
	else
		DRAIN_LINE=$("$bench/drain_wait" --dsn "$dsn" "${what[@]}" --interval-ms 20 \
			--timeout-s "$DRAIN_TIMEOUT") || rc=$?
	fi
	[ "$rc" = 0 ] && return 0
	[ "$1" = outbox ] || exit "$rc"
	# A publisher stuck past the timeout: say where, drop its backlog (with the
	# workers stopped: their open batch holds locks), and go on with the run.
	stuck_n=$((${stuck_n:-0} + 1))
	res "stuck.$stuck_n" "$(q -c "SELECT string_agg(state || ' / ' || coalesce(wait_event_type || ':' || wait_event, 'CPU')
		|| ' / ' || left(query, 60), '; ') FROM pg_stat_activity WHERE backend_type = 'outbox publisher'")"
	say "  !! nothing settled for $DRAIN_TIMEOUT s; the publisher: ${R[stuck.$stuck_n]}; dropping the backlog"
	local w
	w=$(q -c "SHOW outbox.workers")
	restart_pg 0
	q -c "TRUNCATE outbox, aggregate_publication"
	restart_pg "$w"
	DRAIN_LINE="events=0 seconds=timeout events_per_s= table_seconds= first_ack_s= exec_s="
}
warm_ours() { # topic: every worker's producer, connections and topic metadata ready
	q -c "SELECT count(*) FROM generate_series(1, 64) i,
		LATERAL outbox_emit('order', 'warmup-' || i, 'Warmup', '{}', topic => '$1') e" >/dev/null
	drain outbox
}
warm_relay() {
	q -c "INSERT INTO relay_outbox (aggregate_id, aggregate_version, topic, headers, payload)
		VALUES ('warmup', 1, '$1', '{\"event_id\": \"warmup-$tn\", \"event_type\": \"Warmup\", \"aggregate_type\": \"order\"}', '{}')"
	drain relay_outbox
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
HZ=$(getconf CLK_TCK)
# usage: snap_start; <run>; snap_end key seconds -> key.pub_cpu (% of one CPU), key.per_batch
snap_start() { SNAP_PIDS=$(pub_pids | xargs); SNAP_CPU=$(cpu_of $SNAP_PIDS); SNAP_CTR=$(counters); }
snap_end() {
	local c1 k1
	c1=$(cpu_of $SNAP_PIDS)
	k1=$(counters)
	res "$1.pub_cpu" "$(awk -v a="$SNAP_CPU" -v b="$c1" -v hz="$HZ" -v s="$2" 'BEGIN { printf "%.0f\n", 100 * (b - a) / hz / s }')"
	res "$1.per_batch" "$(awk -v a="$SNAP_CTR" -v b="$k1" 'BEGIN { split(a, x, " "); split(b, y, " ");
		n = y[1] - x[1]; if (n > 0) printf "%.1f\n", (y[2] - x[2]) / n; else print "-" }')"
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

# One extension throughput run: key prefix, events, aggregates.
measure_ours() {
	local key=$1 n=$2 aggs=$3 pos
	new_topic "${key//./-}"
	reset_tables
	warm_ours "$T"
	pos=$(stat -c %s "$pglog")
	drain outbox "$(ours_preload "$n" "$aggs" "$T")"
	res "$key.eps" "$(kv "$DRAIN_LINE" events_per_s)"
	res "$key.seconds" "$(kv "$DRAIN_LINE" seconds)"
	res "$key.table_seconds" "$(kv "$DRAIN_LINE" table_seconds)"
	res "$key.first_ack" "$(kv "$DRAIN_LINE" first_ack_s)"
	res "$key.preload_s" "$(kv "$DRAIN_LINE" exec_s)"
	res "$key.events" "$(kv "$DRAIN_LINE" events)"
	sleep 0.3 # let the last batch's debug lines reach the log
	res "$key.batches" "$(batch_stats "$pos")"
	say "  $key: ${R[$key.eps]} events/s (${R[$key.seconds]} s; reads events/read fetch produce settles aggs/settle settle: ${R[$key.batches]})"
}
measure_relay() { # key events aggregates [brokers]
	local key=$1 n=$2 aggs=$3 br=${4:-$brokers}
	new_topic "${key//./-}"
	reset_tables
	start_relay "$br"
	warm_relay "$T"
	kill -USR1 "$relay_pid"
	drain relay_outbox "$(relay_preload "$n" "$aggs" "$T")"
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

res machine.nproc "$(nproc)"
res machine.cpu "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
res machine.mem "$(free -h | awk '/^Mem:/ {print $2 " total, " $7 " available"}')"
res machine.kernel "$(uname -sr)"
res machine.load_start "$(cut -d' ' -f1-3 /proc/loadavg)"
res date "$(date -u '+%Y-%m-%d %H:%M UTC')"
res pg "$(q -c 'SELECT version()')"
res rdkafka "$(dpkg-query -W -f '${Version}' librdkafka1 2>/dev/null || echo '?')"
res ext "$(q -c "SELECT extversion FROM pg_extension WHERE extname = 'outbox'")"
res git "${BENCH_GIT:-?}"
res so "${BENCH_SO:-?}"
res mode "$mode"
res mock_nodelay "$([ "${BENCH_MOCK_NAGLE:-0}" = 1 ] && echo no || echo yes)"

# section p (the peers: PgQ, logical decoding, ...), run after (e)
. "$bench/peers.sh"
if [ "${BENCH_PEERS_ONLY:-0}" = 1 ]; then
	# section p alone (on the mock, or with real on the Kafka cluster), its
	# report in out/peers.md
	restart_pg 1
	set +u
	peers_run
	# (e) for the report's 2- and 4-worker figures: one cold, one warm run each
	set_debug on # (as in the full run's (e): the publisher's step timings)
	say "e. workers: $N events over $AGGS_MAIN aggregates"
	for w in 1 2 4; do
		restart_pg "$w"
		measure_ours "e.ours.$w.cold" "$N" "$AGGS_MAIN"
		measure_ours "e.ours.$w" "$N" "$AGGS_MAIN"
	done
	set_debug off
	peers_report >"$out/peers.md"
	say "done: $out/peers.md"
	exit 0
fi

# ------------------------------------------------------------ a. emit cost
# (mock only: the emit cost does not depend on the broker)
if [ "$real" = 0 ]; then
	cat >"$work/emit_ours.sql" <<'EOF'
\set id random(1, 10000)
BEGIN;
UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version \gset
SELECT event_id FROM outbox_emit('order', 'order-' || :id, 'OrderPaid', '{"amount": 10, "currency": "EUR"}', topic => 'bench.emit.ours');
END;
EOF
	cat >"$work/emit_plain.sql" <<'EOF'
\set id random(1, 10000)
BEGIN;
UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version \gset
INSERT INTO relay_outbox (aggregate_id, aggregate_version, topic, headers, payload) VALUES ('order-' || :id, :version, 'bench.emit.plain', jsonb_build_object('event_id', gen_random_uuid()::text, 'event_type', 'OrderPaid', 'aggregate_type', 'order'), '{"amount": 10, "currency": "EUR"}');
END;
EOF
	cat >"$work/emit_update.sql" <<'EOF'
\set id random(1, 10000)
BEGIN;
UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version \gset
END;
EOF
	cat >"$work/emit_copy.sql" <<'EOF'
\set id random(1, 10000)
BEGIN;
UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version \gset
INSERT INTO outbox_copy (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload) VALUES (uuid_v7()::text, 'order', 'order-' || :id, :version, 'OrderPaid', 'bench.emit.ours', '{"amount": 10, "currency": "EUR"}');
END;
EOF
	mk topic_create bench.emit.ours 16 3
	mk topic_create bench.emit.plain 16 3

	reset_emit() {
		q <<'EOF'
TRUNCATE outbox, aggregate_publication, relay_outbox, outbox_copy, orders;
INSERT INTO orders SELECT g, 'new', 0, 0 FROM generate_series(1, 10000) g;
VACUUM ANALYZE orders;
CHECKPOINT;
EOF
	}
	emit_run() { # key script
		local log=$work/pgbench.$1.log tps
		reset_emit
		snap_start
		pgbench -n -M prepared -c 2 -j 2 -T "$EMIT_S" -f "$2" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
		snap_end "$1" "$EMIT_S"
		tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log")
		res "$1.tps" "$tps"
		res "$1.backlog" "$(q -c "SELECT (SELECT count(*) FROM outbox_pending) + (SELECT count(*) FROM relay_outbox WHERE published_at IS NULL)")"
		say "  $1: $tps tps"
	}
	script_of() {
		case $1 in
			update.*) echo "$work/emit_update.sql" ;;
			plain.*) echo "$work/emit_plain.sql" ;;
			copy.*) echo "$work/emit_copy.sql" ;;
			ours.*) echo "$work/emit_ours.sql" ;;
		esac
	}
	# ratio of the per-round values of two configurations, and their median
	round_ratios() { # a b
		local r v=""
		for r in $(seq "$EMIT_ROUNDS"); do
			v="$v $(awk -v a="${R[a.$1.r$r.tps]}" -v b="${R[a.$2.r$r.tps]}" 'BEGIN { printf "%.2f", a / b }')"
		done
		echo "$v" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{ x[NR] = $1 } END {
			m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2
			s = ""; for (i = 1; i <= NR; i++) s = s (i > 1 ? ", " : "") x[i]
			printf "%.2f (rounds, sorted: %s)\n", m, s }'
	}

	say "a. emit cost: pgbench -c 2 -T $EMIT_S x $EMIT_ROUNDS round(s), order alternating"
	W0="update.w0 plain.w0 copy.w0 ours.w0"
	W1="ours.w1 plain.relay plain.w1"
	for r in $(seq "$EMIT_ROUNDS"); do
		if [ $((r % 2)) = 1 ]; then o0=$W0 o1=$W1; else
			o0=$(tr ' ' '\n' <<<"$W0" | tac | xargs) o1=$(tr ' ' '\n' <<<"$W1" | tac | xargs)
		fi
		restart_pg 0
		for c in $o0; do emit_run "a.$c.r$r" "$(script_of "$c")"; done
		restart_pg 1
		warm_ours bench.emit.ours
		for c in $o1; do
			if [ "$c" = plain.relay ]; then
				start_relay "$brokers"
				emit_run "a.$c.r$r" "$work/emit_plain.sql"
				stop_relay
				res "a.$c.r$r.relay" "${RELAY_LINE#relay: }"
			else
				emit_run "a.$c.r$r" "$(script_of "$c")"
			fi
		done
	done
	for k in $W0 $W1; do
		vals=""
		for r in $(seq "$EMIT_ROUNDS"); do vals="$vals ${R[a.$k.r$r.tps]}"; done
		res "a.$k.tps" "$(awk -v v="$vals" 'BEGIN { n = split(v, x, " "); for (i = 1; i <= n; i++) s += x[i]; printf "%.0f\n", s / n }')"
	done
	res a.ratio.w0 "$(round_ratios ours.w0 plain.w0)"
	res a.ratio.w1 "$(round_ratios ours.w1 plain.relay)"
	res a.ratio.copy "$(round_ratios copy.w0 plain.w0)"

	# Where an emitting transaction's CPU goes: perf on the one backend of a
	# 1-client pgbench (publisher stopped).  Inclusive shares of its samples.
	res a.perf ""
	if command -v perf >/dev/null && perf record -q -o "$work/perf.test" -- true >/dev/null 2>&1; then
		restart_pg 0
		reset_emit
		pgbench -n -M prepared -c 1 -T $((PERF_S + 3)) -f "$work/emit_ours.sql" >"$work/pgbench.perf.log" 2>&1 &
		pb=$!
		sleep 1.5
		bpid=$(q -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench' LIMIT 1")
		if [ -n "$bpid" ] && perf record -q -g -p "$bpid" -o "$work/perf.data" -- sleep "$PERF_S" >/dev/null 2>&1; then
			perf report -i "$work/perf.data" --children --sort symbol --stdio -g none 2>/dev/null >"$work/perf.txt" || true
			shares=""
			# (Debian's postgres binary is stripped: static functions do not resolve)
			for sym in PostgresMain emit_event ExecSimpleRelationInsert ExecInsertIndexTuples last_version ExecOpenIndices standard_ExecutorStart ExecInitNode CommitTransactionCommand heap_page_prune_opt; do
				v=$(awk -v s="$sym" '$3 == "[.]" && $4 == s { print $1; exit }' "$work/perf.txt")
				[ -n "$v" ] && shares="$shares $sym=$v"
			done
			shares="$shares samples=$(sed -n 's/^# Samples: \([^ ]*\) .*/\1/p' "$work/perf.txt" | head -n1)"
			res a.perf "${shares# }"
			say "  perf: ${R[a.perf]}"
		fi
		wait "$pb" || true
		restart_pg 1
	fi
fi

# --------------------------------------------------- b. publish throughput
set_debug on
res load.b "$(cut -d' ' -f1-3 /proc/loadavg)"
say "b. publish throughput: $N preloaded events (load average ${R[load.b]})"
# copy the fields of the median repetition (by events/s) to the base key
median_of() { # base reps
	local base=$1 reps=$2 r list="" best f
	for r in $(seq "$reps"); do list="$list ${R[$base.r$r.eps]}:$r"; done
	best=$(tr ' ' '\n' <<<"$list" | sed '/^$/d' | sort -t: -k1,1n |
		awk -F: '{ x[NR] = $2 } END { print x[int((NR + 1) / 2)] }')
	for f in eps seconds table_seconds first_ack preload_s events batches relay; do
		if [ -n "${R[$base.r$best.$f]:-}" ]; then res "$base.$f" "${R[$base.r$best.$f]}"; fi
	done
	list=""
	for r in $(seq "$reps"); do list="$list${list:+, }$(printf '%.0f' "${R[$base.r$r.eps]}")"; done
	res "$base.all" "$list"
}
for aggs in $B_AGGS; do
	reps=1
	[ "$aggs" = 10000 ] && reps=$B_REPS
	for r in $(seq "$reps"); do measure_ours "b.ours.$aggs.r$r" "$N" "$aggs"; done
	[ "$aggs" = 10000 ] && order_check b.ours.10000 outbox "$T"
	median_of "b.ours.$aggs" "$reps"
	for r in $(seq "$reps"); do measure_relay "b.relay.$aggs.r$r" "$N" "$aggs"; done
	[ "$aggs" = 10000 ] && order_check b.relay.10000 relay_outbox "$T"
	median_of "b.relay.$aggs" "$reps"
	measure_raw "b.raw.$aggs" "$N" "$aggs"
done

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
	say "c. round-trip delay (mock rtt all <ms>), $N events over $AGGS_MAIN aggregates"
	for rtt in 1 5 20; do
		mk rtt all "$rtt"
		measure_ours "c.ours.$rtt" "$N" "$AGGS_MAIN"
		measure_relay "c.relay.$rtt" "$N" "$AGGS_MAIN"
		measure_raw "c.raw.$rtt" "$N" "$AGGS_MAIN"
	done
	mk rtt all 0
fi

# (real mode: keep the per-batch timings for (d) too)
[ "$real" = 1 ] || set_debug off

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
	local key=$1 side=$2 rate=$3 br=${4:-$brokers} since log pos
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
	[ "$side" = ours ] && settle_sampler_start
	snap_start
	wait_sampler "$work/$key.waits" &
	sampler=$!
	pgbench -n -M prepared -c "$LAT_CLIENTS" -j 2 --rate "$rate" -T "$LAT_S" -f "$work/lat.sql" >"$log" 2>&1 ||
		{ cat "$log" >&2; exit 1; }
	kill "$sampler" 2>/dev/null || true
	wait "$sampler" 2>/dev/null || true
	snap_end "$key" "$LAT_S"
	res "$key.tps" "$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | xargs printf '%.0f')"
	res "$key.pgbench_ms" "$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$log") $(sed -n 's/^rate limit schedule lag: avg \([0-9.]*\) .*/\1/p' "$log")"
	res "$key.waits" "$(sort "$work/$key.waits" | uniq -c | sort -rn | head -n 4 |
		awk -v n="$(wc -l <"$work/$key.waits")" '{ printf "%s%s %.0f%%", (NR > 1 ? ", " : ""), $2, 100 * $1 / n }')"
	if [ "$side" = ours ]; then
		drain outbox
		settle_sampler_stop "$key"
		sleep 0.3 # let the last batch's debug lines reach the log
		res "$key.batches" "$(batch_stats "$pos")"
		lat_stats "$key" outbox "$since"
		lat_tail "$key" outbox "$since"
	else
		drain relay_outbox
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

# ------------------------------------------------ real mode: report, stop
if [ "$real" = 1 ]; then
	res machine.load_end "$(cut -d' ' -f1-3 /proc/loadavg)"
	res total_s "$(($(date +%s) - started))"
	res kafka "$("$tools/kafka_cluster" classpath 2>/dev/null | tr ':' '\n' |
		sed -n 's|.*/kafka_\([0-9.]*\)-\([0-9.]*\)\.jar$|\2 (Scala \1)|p' | head -n1)"
	say "report"
	set +u
	{
		echo "## On real Kafka (3 brokers, RF 3, acks=all)"
		echo
		echo "Produced by \`bash test/bench/run.sh real$([ "$mode" = quick ] && echo ' quick')\` (as root) on ${R[date]}; total"
		echo "run time ${R[total_s]} s.  Everything above this section comes from a different run, against the"
		echo "mock: compare ratios, not absolute figures, across the two."
		echo
		echo "| | |"
		echo "|---|---|"
		echo "| Kafka | Apache Kafka ${R[kafka]:-3.9}, \`test/tools/kafka_cluster start DIR --brokers 3\`: 3 KRaft broker+controller JVMs (heap 512 MB) on 127.0.0.1, \`min.insync.replicas=2\`; each topic \`kafka_cluster topic DIR NAME 16 3\` (16 partitions, replication factor 3) |"
		echo "| producers | extension, relay and raw producer alike: librdkafka ${R[rdkafka]}, \`enable.idempotence=true\` (hence \`acks=all\`), \`partitioner=murmur2_random\` |"
		echo "| load average | ${R[machine.load_start]} at start, ${R[load.b]} at (b), ${R[load.d]} at (d), ${R[machine.load_end]} at the end (2 CPUs, shared with other test runs and CI) |"
		echo "| extension | outbox ${R[ext]}, repository at ${R[git]}; installed outbox.so ${R[so]} |"
		echo "| PostgreSQL | ${R[pg]} |"
		echo
		echo "The three Kafka JVMs share the 2 CPUs with PostgreSQL, the publisher, pgbench and the relay,"
		echo "and an acknowledgement with \`acks=all\` waits until two followers have fetched the batch (what"
		echo "that costs here: the relay's ack per batch, below), where the mock answered at once.  Method as"
		echo "in (b) and (d) above.  Section (c) is not repeated (see the end of this section)."
		echo
		echo "### Throughput ($(fmt "$N") preloaded events)"
		echo
		echo "| aggregates | extension events/s | relay events/s | raw producer events/s | extension / relay | extension / raw | relay / raw |"
		echo "|---:|---:|---:|---:|---:|---:|---:|"
		for a in $B_AGGS; do
			echo "| $(fmt "$a") | $(fmt "${R[b.ours.$a.eps]}") | $(fmt "${R[b.relay.$a.eps]}") | $(fmt "${R[b.raw.$a.eps]}") | **$(ratio "${R[b.ours.$a.eps]}" "${R[b.relay.$a.eps]}")×** | $(ratio "${R[b.ours.$a.eps]}" "${R[b.raw.$a.eps]}") | $(ratio "${R[b.relay.$a.eps]}" "${R[b.raw.$a.eps]}") |"
		done
		echo
		if [ "$B_REPS" -gt 1 ]; then
			echo "10,000 aggregates: the median of $B_REPS repetitions; all of them, events/s: extension"
			echo "${R[b.ours.10000.all]}; relay ${R[b.relay.10000.all]}."
			echo
		fi
		echo "| aggregates | extension: s to drain (table) | first ack after commit | relay: s to drain |"
		echo "|---:|---|---:|---:|"
		for a in $B_AGGS; do
			echo "| $(fmt "$a") | ${R[b.ours.$a.seconds]} (${R[b.ours.$a.table_seconds]}) | ${R[b.ours.$a.first_ack]} s | ${R[b.relay.$a.seconds]} |"
		done
		echo
		echo "The extension's step means (ms, from the debug1 lines, as in (b); the d rows are from the"
		echo "latency runs below):"
		echo
		echo "| run | reads | events/read | fetch | produce | settles | aggregates/settle | settle + commit |"
		echo "|---|---:|---:|---:|---:|---:|---:|---:|"
		for k in $(printf 'b.ours.%s ' $B_AGGS) $(printf 'd.ours.%s ' $RATES); do
			echo "| $k | $(bfield "$k" 1) | $(bfield "$k" 2) | $(bfield "$k" 3) | $(bfield "$k" 4) | $(bfield "$k" 5) | $(bfield "$k" 6) | $(bfield "$k" 7) |"
		done
		echo
		echo "The relay's totals (per batch of ≤ 100 rows, ms):"
		echo
		for a in $B_AGGS; do echo "- b.relay.$a: \`${R[b.relay.$a.relay]:-}\`"; done
		echo
		echo "Order check of the 10,000-aggregate runs (\`test/tools/order_check\`, every partition read back):"
		echo
		echo "- extension: \`${R[b.ours.10000.order_check]:-not run}\`"
		echo "- relay: \`${R[b.relay.10000.order_check]:-not run}\`"
		echo
		echo "### Latency at a steady rate"
		echo
		echo "\`pgbench -n -M prepared -c $LAT_CLIENTS -j 2 --rate R -T $LAT_S\`, publish time − \`created_at\` of every event, as in (d)."
		echo
		echo "| rate (events/s) | achieved tps (ext. / relay) | extension p50 | p99 | max | relay p50 | p99 | max | p99 relay / extension | publisher CPU % (ext. / relay) | events per extension batch |"
		echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		for rate in $RATES; do
			echo "| $(fmt "$rate") | $(fmt "${R[d.ours.$rate.tps]}") / $(fmt "${R[d.relay.$rate.tps]}") | $(lf d.ours.$rate 2) ms | **$(lf d.ours.$rate 3) ms** | $(lf d.ours.$rate 4) ms | $(lf d.relay.$rate 2) ms | $(lf d.relay.$rate 3) ms | $(lf d.relay.$rate 4) ms | $(ratio "$(lf d.relay.$rate 3)" "$(lf d.ours.$rate 3)") | ${R[d.ours.$rate.pub_cpu]} / ${R[d.relay.$rate.pub_cpu]} | ${R[d.ours.$rate.per_batch]} |"
		done
		echo
		echo "| rate | extension: events > 20 ms | in how many of the run's seconds | worst second | relay: events > 20 ms |"
		echo "|---:|---:|---:|---:|---:|"
		for rate in $RATES; do
			t=(${R[d.ours.$rate.tail]:-0 0 0 0}); u=(${R[d.relay.$rate.tail]:-0 0 0 0})
			echo "| $(fmt "$rate") | ${t[0]} of $(lf d.ours.$rate 1) | ${t[1]} of ${t[3]} | ${t[2]} | ${u[0]} of $(lf d.relay.$rate 1) |"
		done
		echo
		echo "The emitting side: pgbench's transaction latency and schedule lag (ms; a rate it cannot keep"
		echo "shows as lag), and what its backends were doing, sampled every 0.2 s from \`pg_stat_activity\`"
		echo "(\`CPU\` = active, no wait event; a wait on the publisher would show as a Lock wait):"
		echo
		echo "| run | pgbench latency avg / lag avg | backends' samples |"
		echo "|---|---:|---|"
		for rate in $RATES; do
			for side in ours relay; do
				echo "| d.$side.$rate | $(tr ' ' '\n' <<<"${R[d.$side.$rate.pgbench_ms]:-}" | paste -sd/ | sed 's|/| / |') | ${R[d.$side.$rate.waits]:-} |"
			done
		done
		echo
		echo "### Round trip"
		echo
		echo "Not measured: a real broker's round trip cannot be set like the mock's (\`rtt all\`), and"
		echo "\`tc netem\` on the loopback would delay PostgreSQL and every other user of the shared machine's"
		echo "127.0.0.1 too.  The real cluster's own round trip (replication to two followers before each"
		echo "acknowledgement) is what the figures above include.  This mode draws no plots; the two above"
		echo "are from the mock run."
	} >"$out/benchmarks_real.md"
	say "done: $out/benchmarks_real.md"
	exit 0
fi

# ---------------------------------------------------------------- e. scaling
set_debug on
say "e. workers: $N events over $AGGS_MAIN aggregates"
for w in 1 2 4; do
	restart_pg "$w"
	measure_ours "e.ours.$w.cold" "$N" "$AGGS_MAIN"   # first run after the restart
	measure_ours "e.ours.$w" "$N" "$AGGS_MAIN"
done
set_debug off

# ------------------------------------------------------------------ p. peers
restart_pg 1
peers_run

# ------------------------------------------- f. the mock as shipped (Nagle)
say "f. the mock without the TCP_NODELAY shim"
start_mock mock2 ""
brokers2=$(cat "$work/mock2.bootstrap")
ctl_main=$ctl
ctl=$work/mock2.control
brokers_main=$brokers
brokers=$brokers2
q -c "ALTER SYSTEM SET outbox.brokers = '$brokers2'"
restart_pg 1
set_debug on
measure_ours f.ours.10000 "$N" "$AGGS_MAIN"
measure_relay f.relay.10000 "$NAGLE_RELAY_N" "$AGGS_MAIN"
set_debug off
lat_run f.d.ours.2000 ours 2000
lat_run f.d.relay.2000 relay 2000
brokers=$brokers_main
ctl=$ctl_main

res machine.load_end "$(cut -d' ' -f1-3 /proc/loadavg)"
res total_s "$(($(date +%s) - started))"

# ------------------------------------------------------------------ plots
say "plots and report"
{
	echo "0 ${R[b.ours.10000.eps]} ${R[b.relay.10000.eps]} ${R[b.raw.10000.eps]}"
	for rtt in 1 5 20; do echo "$rtt ${R[c.ours.$rtt.eps]} ${R[c.relay.$rtt.eps]} ${R[c.raw.$rtt.eps]}"; done
} >"$work/rtt.dat"
if [ -s "$work/d.ours.2000.cdf" ] && [ -s "$work/d.relay.2000.cdf" ]; then
	cdf_ours=$work/d.ours.2000.cdf cdf_relay=$work/d.relay.2000.cdf
else
	cdf_ours=/dev/null cdf_relay=/dev/null
fi
gnuplot <<EOF
set terminal pngcairo size 960,600 font "DejaVu Sans,11" noenhanced
set output "$out/throughput_vs_rtt.png"
set title "Publish throughput vs broker round trip\n($N preloaded events over $AGGS_MAIN aggregates; mock Kafka, 3 brokers, 16 partitions)"
set xlabel "round-trip delay added by the mock broker (ms)"
set ylabel "events/s (log scale)"
set logscale y
set format y "%.0s%c"
set yrange [500:2000000]
set grid ytics mytics
set key bottom left box opaque
set xrange [-0.3:3.3]
plot "$work/rtt.dat" using 0:2:xtic(1) with linespoints lw 2 pt 7 ps 1.3 lc rgb "#0072B2" title "outbox extension (1 worker)", \
     "$work/rtt.dat" using 0:3 with linespoints lw 2 pt 5 ps 1.3 lc rgb "#D55E00" title "polling relay (100 rows/batch)", \
     "$work/rtt.dat" using 0:4 with linespoints lw 1 dt 2 pt 6 lc rgb "#666666" title "raw librdkafka producer (limit)", \
     "$work/rtt.dat" using 0:(\$1 == 5 ? 10000 : 1/0) with points pt 2 ps 2.5 lw 2 lc rgb "red" title "target: 10,000 events/s at 5 ms"

set output "$out/latency_cdf.png"
set title "Emit-to-acknowledgement latency at 2,000 events/s\n(publish time - created_at of every event; mock Kafka, 3 brokers)"
set xlabel "latency (ms, log scale)"
set ylabel "fraction of events"
unset logscale y
set format y "%g"
set format x "%g"
set logscale x
set xrange [0.2:500]
set yrange [0:1.02]
set xtics auto
set grid xtics ytics mxtics
set key bottom right box opaque
set arrow 1 from 20, graph 0 to 20, graph 1 nohead dt 3 lc rgb "red"
set label 1 "20 ms (p99 target at 1,000/s)" at 21, graph 0.5 tc rgb "red"
plot "$cdf_ours" using 1:2 with lines lw 2 lc rgb "#0072B2" title "outbox extension (1 worker)", \
     "$cdf_relay" using 1:2 with lines lw 2 lc rgb "#D55E00" title "polling relay (100 rows/batch, 100 ms idle poll)"
EOF

# ----------------------------------------------------------------- report
set +u

{
	cat <<EOF
# Benchmarks

Produced by \`test/bench/run.sh\` (${R[mode]} mode) on ${R[date]}; total run time ${R[total_s]} s.
Do not edit by hand: run the benchmark again (as root: \`bash test/bench/run.sh\`,
about 30 minutes; \`bash test/bench/run.sh quick\` checks the script in about 6 minutes
and writes to /tmp/outbox-bench-quick/).  The peers — PgQ, logical decoding, the polling
relay and raw librdkafka beside the extension, every figure as a ratio to the extension and
to the best peer — are in [section p](#p-peers-the-extension-beside-pgq-logical-decoding-the-polling-relay-and-raw-librdkafka).

| | |
|---|---|
| command | \`bash test/bench/run.sh$([ "$mode" = quick ] && echo " quick")\` (as root; re-runs itself as postgres) |
| machine | ${R[machine.nproc]} CPUs (\`nproc\`), ${R[machine.cpu]}; memory ${R[machine.mem]} (\`free -h\`); ${R[machine.kernel]} |
| load average | ${R[machine.load_start]} at start, ${R[machine.load_end]} at the end (the machine is shared with other test runs) |
| PostgreSQL | ${R[pg]} |
| librdkafka | ${R[rdkafka]} (extension, relay, raw producer and mock alike) |
| extension | outbox ${R[ext]}, repository at ${R[git]}; installed outbox.so ${R[so]} |
| Kafka | \`test/tools/mock_kafka --brokers 3\` on 127.0.0.1, topics of 16 partitions; TCP_NODELAY shim: ${R[mock_nodelay]} (see below) |

Everything runs on one machine: PostgreSQL, the publisher, the mock brokers, pgbench and
the relay share the ${R[machine.nproc]} CPUs.  All clients connect over TCP to 127.0.0.1.
PostgreSQL runs with default durability (\`fsync\` and \`synchronous_commit\` on; fsync of
this disk takes ~0.13 ms), \`shared_buffers = 256MB\`, \`max_wal_size = 8GB\`,
\`checkpoint_timeout = 30min\` (an explicit CHECKPOINT precedes every measurement) and
\`max_locks_per_transaction = 512\` (the preload emits to 10,000 aggregates in one
transaction and \`outbox_emit\` takes one lock per aggregate).  The publisher runs with
its defaults (\`batch_events = 20000\`, librdkafka \`linger.ms = 1\`).

**The baselines.** \`test/bench/relay.c\`: the classic polling relay over a plain table
\`relay_outbox(id bigserial primary key, aggregate_id, aggregate_version, topic, headers
jsonb, payload jsonb, created_at default clock_timestamp(), published_at)\` with a partial
index on unpublished rows.  Loop: \`BEGIN; SELECT ... WHERE published_at IS NULL ORDER BY
id LIMIT 100 FOR UPDATE SKIP LOCKED\`, produce every row (key = aggregate_id; headers
event_id, event_type, aggregate_type from the headers column plus aggregate_id and
aggregate_version — the extension's set), one \`rd_kafka_flush()\` for all acks (it polls
in steps of at most 10 ms, returns as soon as the last delivery report is served, and
makes \`linger.ms\` count as elapsed), \`UPDATE ... SET published_at = clock_timestamp()
WHERE id = ANY(...)\`, COMMIT; an empty fetch sleeps 100 ms.  (\`clock_timestamp()\`, not
\`now()\`: \`now()\` is the transaction's start, before the SELECT, and would understate
the relay's latency.)  One relay process.  The **raw producer** (\`relay raw\`) produces N
pre-built messages of the same shape (key, the five headers, the same ~95-byte payload)
with librdkafka alone and waits for every ack (after a warm-up message).  Producer
settings of both: librdkafka defaults plus \`enable.idempotence=true\` and
\`partitioner=murmur2_random\`, as the extension.  Section p adds the tools a user would
pick instead: a PgQ relay and two logical-decoding relays (\`test/bench/peers.c\`).

**The mock's Nagle stall.** librdkafka 2.0.2 sends one ProduceRequest per partition, and
its mock broker never sets TCP_NODELAY on the connections it accepts (a real Kafka broker
does).  A batch spanning several partitions of one broker gets several small responses
written back to back, and Nagle's algorithm holds all but the first until the client's
delayed ACK: about 40 ms per batch, even on loopback, for any batch size (measured: 1, 2
or 10,000 messages to a 1-partition topic ack in ~5 ms; 5 to 10,000 messages to a
16-partition topic in ~45-50 ms; \`socket.nagle.disable\` on the client changes nothing).
Sections a–e therefore run the mock with \`LD_PRELOAD=test/bench/nodelay.so\`, which sets
TCP_NODELAY on every accepted socket; section f repeats two measurements against the mock
as shipped.

EOF

	echo "## a. Emit cost (pgbench, 2 clients)"
	echo
	echo "Each transaction: \`UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version\`"
	echo "(10,000 rows, id random), then either \`outbox_emit('order', 'order-' || :id, 'OrderPaid', <payload>, topic => ...)\`"
	echo "or a plain \`INSERT INTO relay_outbox (...)\` (aggregate_version from the business row, headers"
	echo "\`jsonb_build_object('event_id', gen_random_uuid()::text, ...)\`); \`pgbench -n -M prepared -c 2 -j 2\`,"
	echo "$EMIT_ROUNDS round(s) of $EMIT_S s per configuration, interleaved (configurations of one publisher state"
	echo "back to back, their order reversed every other round); tables truncated and CHECKPOINT before each."
	echo "Two diagnostic rows: the UPDATE alone, and a plain INSERT into \`outbox_copy\` (\`LIKE outbox"
	echo "INCLUDING ALL\`: every column, CHECK constraint and index of the extension's table, event_id from"
	echo "\`uuid_v7()\`), to separate the cost of the table from the cost of the function."
	echo
	echo "| configuration | tps (mean) | per round | backlog at end | + µs per transaction over the UPDATE alone | publisher CPU, % of one core (per round) | events per publisher batch (per round) |"
	echo "|---|---:|---|---:|---:|---|---|"
	rounds() { local s="" r; for r in $(seq "$EMIT_ROUNDS"); do s="$s${s:+, }$(fmt "${R[a.$1.r$r.tps]}")"; done; echo "$s"; }
	backl() { local s="" r; for r in $(seq "$EMIT_ROUNDS"); do s="$s${s:+, }${R[a.$1.r$r.backlog]}"; done; echo "$s"; }
	extra() { awk -v a="${R[a.$1.tps]}" -v u="${R[a.update.w0.tps]}" 'BEGIN { if (a > 0 && u > 0) printf "%.0f\n", 2e6 / a - 2e6 / u; else print "-" }'; }
	perround() { local s="" r; for r in $(seq "$EMIT_ROUNDS"); do s="$s${s:+, }${R[a.$1.r$r.$2]}"; done; echo "$s"; }
	row() {
		local cpu="-" pb="-"
		case $1 in ours.w1 | plain.relay | plain.w1) cpu=$(perround "$1" pub_cpu) ;; esac
		[ "$1" = ours.w1 ] && pb=$(perround "$1" per_batch)
		echo "| $2 | $(fmt "${R[a.$1.tps]}") | $(rounds "$1") | $(backl "$1") | $3 | $cpu | $pb |"
	}
	R[a.update.w0.r1.backlog]="-"; R[a.copy.w0.r1.backlog]="-"
	for r in $(seq 2 "$EMIT_ROUNDS"); do R[a.update.w0.r$r.backlog]="-"; R[a.copy.w0.r$r.backlog]="-"; done
	row update.w0 "UPDATE alone (no event), workers = 0" "0"
	row plain.w0 "plain INSERT, outbox.workers = 0" "$(extra plain.w0)"
	row copy.w0 "plain INSERT into outbox_copy, workers = 0" "$(extra copy.w0)"
	row ours.w0 "outbox_emit, outbox.workers = 0" "$(extra ours.w0)"
	row plain.w1 "plain INSERT, workers = 1 (idle: nothing to publish)" "-"
	row plain.relay "plain INSERT, relay running" "-"
	row ours.w1 "outbox_emit, workers = 1 (publishing)" "-"
	echo
	echo "(µs per transaction: 2 clients × 10⁶ / tps, minus the same for the UPDATE alone: the event write's"
	echo "share of a transaction's wall time, including its extra client round trip.  Publisher CPU: user +"
	echo "system time from /proc of the extension's worker, or of the relay process plus its backend, over"
	echo "the run; events per batch from \`outbox_counters()\` (events_published / batches).)"
	echo
	echo "| ratio | of mean tps | median of per-round ratios |"
	echo "|---|---:|---|"
	echo "| outbox_emit / plain INSERT, no publisher | **$(ratio "${R[a.ours.w0.tps]}" "${R[a.plain.w0.tps]}")** | ${R[a.ratio.w0]} |"
	echo "| outbox_emit with its worker / plain INSERT with the relay running | **$(ratio "${R[a.ours.w1.tps]}" "${R[a.plain.relay.tps]}")** | ${R[a.ratio.w1]} |"
	echo "| outbox_emit with its worker / plain INSERT with an idle worker | $(ratio "${R[a.ours.w1.tps]}" "${R[a.plain.w1.tps]}") | |"
	echo "| INSERT into outbox_copy / plain INSERT, no publisher | $(ratio "${R[a.copy.w0.tps]}" "${R[a.plain.w0.tps]}") | ${R[a.ratio.copy]} |"
	echo
	echo "Target: emit transactions ≥ 0.85× plain insert — without publishers"
	echo "$(met "${R[a.ours.w0.tps]} >= 0.85 * ${R[a.plain.w0.tps]}") ($(ratio "${R[a.ours.w0.tps]}" "${R[a.plain.w0.tps]}")×); each with its publisher running"
	echo "$(met "${R[a.ours.w1.tps]} >= 0.85 * ${R[a.plain.relay.tps]}") ($(ratio "${R[a.ours.w1.tps]}" "${R[a.plain.relay.tps]}")×)."
	echo "Target: emit transactions ≥ 0.97× a plain INSERT into the same table (outbox_copy), no publisher:"
	echo "$(met "${R[a.ours.w0.tps]} >= 0.97 * ${R[a.copy.w0.tps]}") ($(ratio "${R[a.ours.w0.tps]}" "${R[a.copy.w0.tps]}")×; more rounds, backend CPU per"
	echo "transaction, from \`test/bench/emit_cost.sh\`, in docs/benchmarks.md, section Emit cost)."
	echo "Backlog = events still unpublished when pgbench ended (workers = 0: all of them)."
	echo
	if [ -n "${R[a.perf]}" ]; then
		echo "Where an emitting transaction's CPU goes: \`perf record -g\` on the backend of a 1-client run of"
		echo "the outbox_emit script (publisher stopped, $PERF_S s); inclusive share of the backend's samples"
		echo "(PostgresMain ≈ everything the backend did; emit_event = outbox_emit; ExecSimpleRelationInsert"
		echo "= its insert (heap and index tuples), last_version = its two index look-ups; the executor"
		echo "start-up is the UPDATE's and the SELECT's):"
		echo
		echo "| function | share |"
		echo "|---|---:|"
		tr ' ' '\n' <<<"${R[a.perf]}" | awk -F= '{ printf "| %s | %s |\n", $1, $2 }'
		echo
	fi

	echo "## b. Publish throughput ($(fmt "$N") preloaded events)"
	echo
	echo "Method: the publisher (extension worker, or relay process) is running and warm (one event of"
	echo "the same topic published first); one transaction emits (\`outbox_emit\` per row, from"
	echo "\`generate_series\`) or inserts all events, aggregate \`order-<i mod A>\`; the clock starts when its"
	echo "COMMIT returns; \`drain_wait\` polls \`SELECT EXISTS (SELECT 1 FROM outbox_pending)\` (the extension) or"
	echo "\`SELECT EXISTS (SELECT 1 FROM relay_outbox WHERE published_at IS NULL)\` (the relay)"
	echo "every 20 ms on one connection (= \`count(*) = 0\`, without counting 100,000 rows 50 times a second)"
	echo "and stops the clock when nothing is pending.  events/s = events / that time.  Raw: time from the"
	echo "first produce to the last ack."
	echo
	echo "| aggregates | extension events/s | relay events/s | raw producer events/s | extension / relay | extension / raw | relay / raw |"
	echo "|---:|---:|---:|---:|---:|---:|---:|"
	for a in 10000 10 1; do
		echo "| $(fmt $a) | $(fmt "${R[b.ours.$a.eps]}") | $(fmt "${R[b.relay.$a.eps]}") | $(fmt "${R[b.raw.$a.eps]}") | **$(ratio "${R[b.ours.$a.eps]}" "${R[b.relay.$a.eps]}")×** | $(ratio "${R[b.ours.$a.eps]}" "${R[b.raw.$a.eps]}") | $(ratio "${R[b.relay.$a.eps]}" "${R[b.raw.$a.eps]}") |"
	done
	echo
	echo "| aggregates | extension: s to drain (table: max(last_published_at) − commit) | first settle after commit (upper bound) | preload transaction | relay: s to drain | relay preload |"
	echo "|---:|---|---:|---:|---:|---:|"
	for a in 10000 10 1; do
		echo "| $(fmt $a) | ${R[b.ours.$a.seconds]} (${R[b.ours.$a.table_seconds]}) | ${R[b.ours.$a.first_ack]} s | ${R[b.ours.$a.preload_s]} s | ${R[b.relay.$a.seconds]} | ${R[b.relay.$a.preload_s]} s |"
	done
	echo
	if [ "$B_REPS" -gt 1 ]; then
		echo "10,000 aggregates: the median of $B_REPS repetitions (each its own preload), here and below;"
		echo "all of them, events/s: extension ${R[b.ours.10000.all]}; relay ${R[b.relay.10000.all]}."
		echo
	fi
	echo "Order check of the 10,000-aggregate runs (\`test/tools/order_check\`, every partition read back):"
	echo
	echo "- extension: \`${R[b.ours.10000.order_check]:-not run}\`"
	echo "- relay: \`${R[b.relay.10000.order_check]:-not run}\`"
	echo
	echo "Target: ≥ 25,000 events/s with one worker (100k over 10k aggregates):"
	echo "$(met "${R[b.ours.10000.eps]} >= 25000") ($(fmt "${R[b.ours.10000.eps]}")/s)$([ "$N" != 100000 ] && echo " — quick mode: $N events, not comparable")."
	echo "Target: beat the relay 10×: $(met "${R[b.ours.10000.eps]} >= 10 * ${R[b.relay.10000.eps]}") at 10,000 aggregates ($(ratio "${R[b.ours.10000.eps]}" "${R[b.relay.10000.eps]}")×),"
	echo "$(met "${R[b.ours.10.eps]} >= 10 * ${R[b.relay.10.eps]}") at 10 ($(ratio "${R[b.ours.10.eps]}" "${R[b.relay.10.eps]}")×), $(met "${R[b.ours.1.eps]} >= 10 * ${R[b.relay.1.eps]}") at 1 ($(ratio "${R[b.ours.1.eps]}" "${R[b.relay.1.eps]}")×)."
	echo
	echo "Where the extension's time goes — step means from the server log (\`log_min_messages = debug1\`:"
	echo "\"fetched ... produced\" per read, \"settled ... in\" per settle; ms, integer resolution per line;"
	echo "acknowledgements are awaited between the steps, not in one):"
	echo
	echo "| run | reads | events/read | fetch | produce | settles | aggregates/settle | settle + commit | time in steps / drain time |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
	for k in b.ours.10000 b.ours.10 b.ours.1 c.ours.1 c.ours.5 c.ours.20 e.ours.1.cold e.ours.1 e.ours.2.cold e.ours.2 e.ours.4.cold e.ours.4 f.ours.10000; do
		[ -n "${R[$k.batches]:-}" ] || continue
		b=$(bfield "$k" 1)
		busy=$(awk -v b="$b" -v f="$(bfield "$k" 3)" -v p="$(bfield "$k" 4)" -v s="$(bfield "$k" 5)" -v t="$(bfield "$k" 7)" \
			'BEGIN { print (b * (f + p) + s * t) / 1000 }')
		echo "| $k | $b | $(bfield "$k" 2) | $(bfield "$k" 3) | $(bfield "$k" 4) | $(bfield "$k" 5) | $(bfield "$k" 6) | $(bfield "$k" 7) | $(ratio "$busy" "${R[$k.seconds]}") |"
	done
	echo
	echo "(With several workers the time in steps is summed over all workers, so it can exceed 1.)"
	echo
	mk_=(${R[mark]:-})
	if [ "${#mk_[@]}" = 3 ]; then
		echo "Settling, by hand: the worker's settling statement (as prepared in src/publish_settle.c: one"
		echo "row of \`aggregate_publication\` per aggregate, nothing written per event) on 10,000 pending"
		echo "events of 10,000 aggregates, first with no progress row yet (its INSERT path), then again over"
		echo "the same aggregates (its UPDATE path, guarded by each row's xmin), and the relay's UPDATE of"
		echo "10,000 rows (\`EXPLAIN ANALYZE\` execution time, publisher stopped):"
		echo
		echo "| statement | ms per 10,000 | µs per event |"
		echo "|---|---:|---:|"
		echo "| extension: settle, \`INSERT INTO aggregate_publication ... ON CONFLICT DO NOTHING\` (first settle of each aggregate) | ${mk_[0]} | $(awk -v a="${mk_[0]}" 'BEGIN { printf "%.1f", a / 10 }') |"
		echo "| extension: settle, \`UPDATE aggregate_publication ... WHERE xmin = ...\` (HOT updates: ${R[mark.hot]}; \`outbox\` is not written, its indexes: ${R[outbox.indexes]}) | ${mk_[1]} | $(awk -v a="${mk_[1]}" 'BEGIN { printf "%.1f", a / 10 }') |"
		echo "| relay: \`UPDATE relay_outbox SET published_at = clock_timestamp() WHERE id = ANY(...)\` (pk only) | ${mk_[2]} | $(awk -v a="${mk_[2]}" 'BEGIN { printf "%.1f", a / 10 }') |"
		echo
	fi
	echo "The relay's own totals (per batch of ≤ 100 rows, ms):"
	echo
	for k in b.relay.10000 b.relay.10 b.relay.1 c.relay.1 c.relay.5 c.relay.20 f.relay.10000; do
		[ -n "${R[$k.relay]:-}" ] && echo "- $k: \`${R[$k.relay]}\`"
	done
	echo

	echo "## c. Round-trip sensitivity ($(fmt "$N") events, 10,000 aggregates)"
	echo
	echo "\`rtt all <ms>\` on the mock delays every broker response (as (b), same method)."
	echo
	echo "| round trip | extension events/s | relay events/s | raw events/s | extension / relay | extension / raw |"
	echo "|---:|---:|---:|---:|---:|---:|"
	echo "| 0 ms (b) | $(fmt "${R[b.ours.10000.eps]}") | $(fmt "${R[b.relay.10000.eps]}") | $(fmt "${R[b.raw.10000.eps]}") | $(ratio "${R[b.ours.10000.eps]}" "${R[b.relay.10000.eps]}") | $(ratio "${R[b.ours.10000.eps]}" "${R[b.raw.10000.eps]}") |"
	for rtt in 1 5 20; do
		echo "| $rtt ms | $(fmt "${R[c.ours.$rtt.eps]}") | $(fmt "${R[c.relay.$rtt.eps]}") | $(fmt "${R[c.raw.$rtt.eps]}") | **$(ratio "${R[c.ours.$rtt.eps]}" "${R[c.relay.$rtt.eps]}")×** | $(ratio "${R[c.ours.$rtt.eps]}" "${R[c.raw.$rtt.eps]}") |"
	done
	echo
	echo "Target: ≥ 10,000 events/s with 5 ms RTT: $(met "${R[c.ours.5.eps]} >= 10000") ($(fmt "${R[c.ours.5.eps]}")/s)."
	echo
	echo "![throughput vs round trip](throughput_vs_rtt.png)"
	echo

	echo "## d. Latency at a steady rate"
	echo
	echo "\`pgbench -n -M prepared -c $LAT_CLIENTS -j 2 --rate R -T $LAT_S\`, each transaction one statement:"
	echo "\`SELECT outbox_emit(...)\` (aggregate random of 10,000), or the relay's plain INSERT with the relay"
	echo "running (100 rows per batch, 100 ms sleep after an empty fetch).  Measured per event, from the"
	echo "tables after the run: publish time − \`created_at\`.  created_at is \`clock_timestamp()\` at the emit,"
	echo "which for a one-statement transaction is just before its commit (so this is commit-to-ack plus"
	echo "the statement's own run time, ~0.1-0.5 ms).  The relay's publish time is \`published_at\`"
	echo "(\`clock_timestamp()\` in its UPDATE, right after the flush).  The extension records no per-event"
	echo "publish time (an event is published once its aggregate's \`last_published_version\` reaches it):"
	echo "a sampler session (\`bench_sample_settled\`, every 20 ms) copies the aggregates settled since"
	echo "its last look, with \`last_published_at\` (when Kafka acknowledged that version: the delivery"
	echo "report's time) into \`bench_settled\`; an event's publish time is that of the first sampled"
	echo "settle reaching its version.  Exact unless one aggregate settled twice within 20 ms (then the"
	echo "earlier event gets the later time: ≤ 20 ms too late); so the settle commit is not included on"
	echo "either side.  Every event of the run counts (events whose settle was not sampled: none expected,"
	echo "counted in results.tsv as \`unsampled\`)."
	echo
	echo "| rate (events/s) | achieved tps | extension p50 | p99 | max | relay p50 | p99 | max | p99 relay / extension | publisher CPU % (ext. / relay) | events per extension batch |"
	echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	for rate in $RATES; do
		echo "| $(fmt "$rate") | $(fmt "${R[d.ours.$rate.tps]}") / $(fmt "${R[d.relay.$rate.tps]}") | $(lf d.ours.$rate 2) ms | **$(lf d.ours.$rate 3) ms** | $(lf d.ours.$rate 4) ms | $(lf d.relay.$rate 2) ms | $(lf d.relay.$rate 3) ms | $(lf d.relay.$rate 4) ms | $(ratio "$(lf d.relay.$rate 3)" "$(lf d.ours.$rate 3)") | ${R[d.ours.$rate.pub_cpu]} / ${R[d.relay.$rate.pub_cpu]} | ${R[d.ours.$rate.per_batch]} |"
	done
	echo
	if [ -n "${R[d.ours.1000.stats]:-}" ]; then
		echo "Target: p99 < 20 ms at 1,000 events/s: $(met "$(lf d.ours.1000 3) < 20") ($(lf d.ours.1000 3) ms)."
	fi
	echo
	echo "Events over 20 ms, and how they cluster in time (seconds of the run, by created_at):"
	echo
	echo "| rate | extension: events > 20 ms | in how many of the run's seconds | worst second | relay: events > 20 ms |"
	echo "|---:|---:|---:|---:|---:|"
	for rate in $RATES; do
		t=(${R[d.ours.$rate.tail]:-0 0 0 0}); u=(${R[d.relay.$rate.tail]:-0 0 0 0})
		echo "| $(fmt "$rate") | ${t[0]} of $(lf d.ours.$rate 1) | ${t[1]} of ${t[3]} | ${t[2]} | ${u[0]} of $(lf d.relay.$rate 1) |"
	done
	echo
	echo "![latency CDF at 2,000 events/s](latency_cdf.png)"
	echo
	echo "The relay at each rate: "
	echo
	for rate in $RATES; do echo "- $rate/s: \`${R[d.relay.$rate.relay]:-}\`"; done
	echo

	echo "## e. Scaling with publisher workers ($(fmt "$N") events, 10,000 aggregates)"
	echo
	echo "\`outbox.workers\` = 1, 2, 4 (restart each), as (b).  The workers split the aggregates by"
	echo "\`hashtext(aggregate_id)\` bucket."
	echo
	echo "| workers | events/s | vs 1 worker | s to drain | first run right after the restart: events/s |"
	echo "|---:|---:|---:|---:|---:|"
	for w in 1 2 4; do
		echo "| $w | $(fmt "${R[e.ours.$w.eps]}") | $(ratio "${R[e.ours.$w.eps]}" "${R[e.ours.1.eps]}") | ${R[e.ours.$w.seconds]} | $(fmt "${R[e.ours.$w.cold.eps]}") |"
	done
	echo

	echo "## f. Against the mock as shipped (no TCP_NODELAY)"
	echo
	echo "| measurement | extension | relay | extension / relay |"
	echo "|---|---:|---:|---:|"
	echo "| throughput, $(fmt "$N") events (relay: $(fmt "$NAGLE_RELAY_N")) over 10,000 aggregates | $(fmt "${R[f.ours.10000.eps]}")/s | $(fmt "${R[f.relay.10000.eps]}")/s | $(ratio "${R[f.ours.10000.eps]}" "${R[f.relay.10000.eps]}") |"
	echo "| latency at 2,000/s, p50 / p99 / max | $(lf f.d.ours.2000 2) / $(lf f.d.ours.2000 3) / $(lf f.d.ours.2000 4) ms | $(lf f.d.relay.2000 2) / $(lf f.d.relay.2000 3) / $(lf f.d.relay.2000 4) ms | |"
	echo
	echo "With the shim, for comparison: $(fmt "${R[b.ours.10000.eps]}")/s vs $(fmt "${R[b.relay.10000.eps]}")/s; at 2,000/s"
	echo "$(lf d.ours.2000 2) / $(lf d.ours.2000 3) / $(lf d.ours.2000 4) ms vs $(lf d.relay.2000 2) / $(lf d.relay.2000 3) / $(lf d.relay.2000 4) ms."
	echo

	peers_report

	if [ -n "${stuck_n:-}" ]; then
		echo "## Runs that timed out"
		echo
		echo "The extension's publisher settled nothing for $DRAIN_TIMEOUT s in $stuck_n run(s); the run went on after"
		echo "dropping that backlog (their figures show as -).  What the publisher was doing (\`pg_stat_activity\`:"
		echo "state / wait / query):"
		echo
		for i in $(seq "$stuck_n"); do echo "- \`${R[stuck.$i]}\`"; done
		echo
	fi
	echo "## Targets"
	echo
	echo "| target | result | |"
	echo "|---|---|---|"
	echo "| ≥ 25,000 events/s, one worker, 100k events over 10k aggregates | $(fmt "${R[b.ours.10000.eps]}")/s | $(met "${R[b.ours.10000.eps]} >= 25000") |"
	echo "| ≥ 10,000 events/s with 5 ms RTT | $(fmt "${R[c.ours.5.eps]}")/s | $(met "${R[c.ours.5.eps]} >= 10000") |"
	if [ -n "${R[d.ours.1000.stats]:-}" ]; then
		echo "| p99 < 20 ms at 1,000 events/s | $(lf d.ours.1000 3) ms | $(met "$(lf d.ours.1000 3) < 20") |"
	fi
	echo "| emit transactions ≥ 0.85× plain insert (no publishers / each with its publisher) | $(ratio "${R[a.ours.w0.tps]}" "${R[a.plain.w0.tps]}")× / $(ratio "${R[a.ours.w1.tps]}" "${R[a.plain.relay.tps]}")× | $(met "${R[a.ours.w0.tps]} >= 0.85 * ${R[a.plain.w0.tps]}") / $(met "${R[a.ours.w1.tps]} >= 0.85 * ${R[a.plain.relay.tps]}") |"
	echo "| beat the relay 10× (throughput, 10k / 10 / 1 aggregates) | $(ratio "${R[b.ours.10000.eps]}" "${R[b.relay.10000.eps]}")× / $(ratio "${R[b.ours.10.eps]}" "${R[b.relay.10.eps]}")× / $(ratio "${R[b.ours.1.eps]}" "${R[b.relay.1.eps]}")× | $(met "${R[b.ours.10000.eps]} >= 10 * ${R[b.relay.10000.eps]}") / $(met "${R[b.ours.10.eps]} >= 10 * ${R[b.relay.10.eps]}") / $(met "${R[b.ours.1.eps]} >= 10 * ${R[b.relay.1.eps]}") |"
	echo "| beat the relay 10× (throughput at 1 / 5 / 20 ms RTT) | $(ratio "${R[c.ours.1.eps]}" "${R[c.relay.1.eps]}")× / $(ratio "${R[c.ours.5.eps]}" "${R[c.relay.5.eps]}")× / $(ratio "${R[c.ours.20.eps]}" "${R[c.relay.20.eps]}")× | $(met "${R[c.ours.1.eps]} >= 10 * ${R[c.relay.1.eps]}") / $(met "${R[c.ours.5.eps]} >= 10 * ${R[c.relay.5.eps]}") / $(met "${R[c.ours.20.eps]} >= 10 * ${R[c.relay.20.eps]}") |"
	echo
	echo "Raw results (key, value): see the run's results.tsv; per-step logs stay in the work directory"
	echo "only when a run fails."
} >"$out/benchmarks.md"
cp "$out/results.tsv" "$work/" 2>/dev/null || true
say "done: $out/benchmarks.md"
