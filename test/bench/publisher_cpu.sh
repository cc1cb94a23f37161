#!/usr/bin/env bash
#
# test/bench/publisher_cpu.sh [SECONDS [RATE ...]]
#
# The publisher's CPU per event at steady emit rates, against the mock Kafka
# cluster (3 brokers, one 16-partition topic; test/tools/mock_kafka as
# shipped): pgbench --rate, 2 clients, one outbox_emit per transaction on
# an aggregate random of 10,000 (each with a progress row already), for
# SECONDS (default 30) at each RATE (default 1000 2000 5000 events/s), then
# until the publisher's events_published counter has them all.  CPU: the
# user + system ticks of the worker process (/proc/PID/stat: the main
# thread and librdkafka's threads) and of its main thread alone
# (/proc/PID/task/PID/stat), per event published; also the settlings and
# events per settling (outbox_counters()), and the emit-to-acknowledgement
# latency's p50 and p99 (outbox_latency_histogram(), the upper bound of the
# bucket).  CPU time, unlike wall-clock time, hardly depends on the other
# load of a shared machine.
#
# PUBLISHER_RTT=<ms>: the mock brokers answer that much later (mockctl rtt
# all), as a replicated cluster acknowledges in tens of ms.
# PUBLISHER_KAFKA_PROPERTIES=<outbox.kafka_properties>: e.g. linger.ms=5.
# PUBLISHER_REAL=1: a real Apache Kafka 3.9 cluster instead of the mock
# (test/tools/kafka_cluster, 3 brokers, the topic with replication factor 3).
# PUBLISHER_CONF=<lines>: more postgresql.conf lines (e.g. outbox settings).
# PUBLISHER_PERF=1: perf record -g of the publisher process while pgbench
# runs (user space); prints each rate's shares per thread and the functions
# with the largest inclusive shares (PUBLISHER_PERF_TOP, default 40), and
# the call chains into each function of PUBLISHER_PERF_CALLERS.  The
# CPU figures of such a run include perf's own cost.
#
# Starts its own throwaway cluster with the PostgreSQL found by pg_config
# and the outbox extension installed there; as root it re-runs itself as
# postgres.  Prints Markdown; judges nothing.  Bounded: about
# (SECONDS + 20) seconds per rate plus set-up.
#
set -euo pipefail

secs=${1:-30}
shift || true
rates=${*:-1000 2000 5000}
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/test/bench/lib.sh"

if [ "$(id -u)" = 0 ]; then
	export PUBLISHER_RTT=${PUBLISHER_RTT:-} PUBLISHER_KAFKA_PROPERTIES=${PUBLISHER_KAFKA_PROPERTIES:-}
	export PUBLISHER_REAL=${PUBLISHER_REAL:-0} PUBLISHER_CONF=${PUBLISHER_CONF:-} PUBLISHER_PERF=${PUBLISHER_PERF:-0}
	rerun_as_postgres publisher-cpu OUTBOX_PUBLISHER_CPU_WORK bench/publisher_cpu.sh "$secs" $rates
fi

bench_cluster_env "${OUTBOX_PUBLISHER_CPU_WORK:-}" outbox-publisher-cpu.XXXXXX

mock_pid=
bench_pid=
kafka=
kill_first=bench_pid kill_after=mock_pid
trap cleanup EXIT

if [ "$PUBLISHER_REAL" = 1 ]; then
	kafka=$work/kafka
	"$tools/kafka_cluster" start "$kafka" --brokers 3 --max-seconds 3600 >"$work/kafka_start.log" 2>&1 ||
		{ cat "$work/kafka_start.log" >&2; exit 1; }
	"$tools/kafka_cluster" topic "$kafka" bench.publisher 16 3 >"$work/kafka_topic.log" 2>&1 ||
		{ cat "$work/kafka_topic.log" >&2; exit 1; }
	cp "$kafka/bootstrap" "$work/bootstrap"
else
	start_mock_kafka --brokers 3 --topic bench.publisher:16 --max-seconds 3600
	if [ -n "${PUBLISHER_RTT:-}" ]; then
		"$tools/mockctl" "$work/control" rtt all "$PUBLISHER_RTT" >/dev/null
	fi
fi

pg_init "$work/data"
pg_conf_local "$work/data"
pg_conf_publisher "$work/data"
if [ -n "${PUBLISHER_KAFKA_PROPERTIES:-}" ]; then
	echo "outbox.kafka_properties = '$PUBLISHER_KAFKA_PROPERTIES'" >>"$work/data/postgresql.conf"
fi
if [ -n "${PUBLISHER_CONF:-}" ]; then
	printf '%s\n' "$PUBLISHER_CONF" >>"$work/data/postgresql.conf"
fi
pg_ctl -D "$work/data" -l "$work/postgres.log" -w -t 60 start >/dev/null
q -c "CREATE EXTENSION outbox"

pub=
for _ in $(seq 100); do
	pub=$(q -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox publisher'")
	[ -n "$pub" ] && break
	sleep 0.1
done
[ -n "$pub" ] || { echo "no publisher started" >&2; exit 1; }

counter() { q -c "SELECT value FROM outbox_counters() WHERE name = '$1'"; }
ticks() { sed 's/.*) //' "$1" | awk '{ print $12 + $13 }'; }
histogram() { q -F ' ' -c "SELECT le_ms, count FROM outbox_latency_histogram() ORDER BY le_ms"; }
# The latency quantile q of the events between two histograms (files).
quantile() { # before after q
	paste -d ' ' "$1" "$2" | awk -v q="$3" '{ le[NR] = $1; n[NR] = $4 - $2 } END {
		for (i = 1; i <= NR; i++) if (n[i] >= q * n[NR]) { print le[i]; exit } }'
}

# Every aggregate gets its progress row, as in a steady state.
q -c "SELECT count(*) FROM generate_series(1, 10000) g,
	LATERAL outbox_emit('order', 'order-' || g, 'OrderPaid', '{\"amount\": 10}', topic => 'bench.publisher')" >/dev/null
for _ in $(seq 600); do [ "$(counter events_published)" -ge 10000 ] && break; sleep 0.1; done
printf '%s\n' '\set id random(1, 10000)' \
	"SELECT event_id FROM outbox_emit('order', 'order-' || :id, 'OrderPaid', '{\"amount\": 10, \"currency\": \"EUR\"}', topic => 'bench.publisher');" \
	>"$work/steady.sql"

hz=$(getconf CLK_TCK)
if [ "$PUBLISHER_REAL" = 1 ]; then where="the real 3-broker cluster"; else where="the mock, round trip ${PUBLISHER_RTT:-0} ms"; fi
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $secs s per rate, $where, outbox.kafka_properties '${PUBLISHER_KAFKA_PROPERTIES:-}'${PUBLISHER_CONF:+, $(echo "$PUBLISHER_CONF" | tr '\n' ' ')}."
echo
echo "| events/s | events | reads | settlings | events per settling | publisher CPU µs per event | of which the main thread | latency p50 / p99 (ms) |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
for rate in $rates; do
	e0=$(counter events_published)
	s0=$(counter settles)
	b0=$(counter batches)
	c0=$(ticks "/proc/$pub/stat")
	m0=$(ticks "/proc/$pub/task/$pub/stat")
	histogram >"$work/histogram.0"
	pgbench -n -M prepared -c 2 -j 2 --rate "$rate" -T "$secs" -f "$work/steady.sql" >"$work/pgbench.$rate.log" 2>&1 &
	bench_pid=$!
	if [ "$PUBLISHER_PERF" = 1 ]; then
		perf record -q -g -p "$pub" -o "$work/perf.$rate.data" -- sleep "$((secs > 2 ? secs - 2 : 1))" >/dev/null 2>&1 || true
	fi
	wait "$bench_pid" || { cat "$work/pgbench.$rate.log" >&2; exit 1; }
	bench_pid=
	n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/pgbench.$rate.log")
	for _ in $(seq 200); do [ "$(counter events_published)" -ge $((e0 + n)) ] && break; sleep 0.1; done
	e=$(($(counter events_published) - e0))
	s=$(($(counter settles) - s0))
	b=$(($(counter batches) - b0))
	c=$(($(ticks "/proc/$pub/stat") - c0))
	m=$(($(ticks "/proc/$pub/task/$pub/stat") - m0))
	histogram >"$work/histogram.1"
	p50=$(quantile "$work/histogram.0" "$work/histogram.1" 0.5)
	p99=$(quantile "$work/histogram.0" "$work/histogram.1" 0.99)
	awk -v r="$rate" -v e="$e" -v b="$b" -v s="$s" -v c="$c" -v m="$m" -v hz="$hz" -v p50="$p50" -v p99="$p99" 'BEGIN {
		printf "| %d | %d | %d | %d | %.0f | %.1f | %.1f | %s / %s |\n", r, e, b, s, e / (s ? s : 1), c * 1e6 / hz / e, m * 1e6 / hz / e, p50, p99 }'
done
if [ "$PUBLISHER_PERF" = 1 ]; then
	for rate in $rates; do
		[ -s "$work/perf.$rate.data" ] || continue
		echo
		echo "perf at $rate events/s, self shares per thread and object:"
		echo
		perf report -f -i "$work/perf.$rate.data" --no-children --sort comm,dso --stdio -g none 2>/dev/null |
			awk '$1 ~ /%$/ && $1 + 0 >= 0.5 { print "    " $0 }' || true
		echo
		echo "inclusive shares:"
		echo
		perf report -f -i "$work/perf.$rate.data" --children --sort symbol --stdio -g none 2>/dev/null |
			awk '$3 == "[.]" && $1 ~ /%$/ && $4 !~ /^0x/ { print "    " $1 " " $2 " " $4 }' |
			head -n "${PUBLISHER_PERF_TOP:-40}" || true
		for sym in ${PUBLISHER_PERF_CALLERS:-}; do
			echo
			echo "callers of $sym:"
			echo
			perf report -f -i "$work/perf.$rate.data" --no-children --stdio -S "$sym" -G -g caller,0.5,callee,function,percent 2>/dev/null |
				grep -v '^#' | grep -v '^$' | head -n 60 | sed 's/^/    /' || true
		done
	done
fi
echo "work directory: $work" >&2
