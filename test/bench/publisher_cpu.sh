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
# events per settling (outbox_counters()).  CPU time, unlike wall-clock
# time, hardly depends on the other load of a shared machine.
#
# PUBLISHER_RTT=<ms>: the mock brokers answer that much later (mockctl rtt
# all), as a replicated cluster acknowledges in tens of ms.
# PUBLISHER_KAFKA_PROPERTIES=<outbox.kafka_properties>: e.g. linger.ms=5.
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
	rerun_as_postgres publisher-cpu OUTBOX_PUBLISHER_CPU_WORK bench/publisher_cpu.sh "$secs" $rates
fi

work=${OUTBOX_PUBLISHER_CPU_WORK:-$(mktemp -d /tmp/outbox-publisher-cpu.XXXXXX)}
tools=$src/test/tools
export PATH="$(pg_config --bindir):$PATH"
export PGHOST=$work PGPORT=$((20000 + RANDOM % 20000)) PGDATABASE=postgres

mock_pid=
bench_pid=
kill_first=bench_pid kill_after=mock_pid
trap cleanup EXIT

start_mock_kafka --brokers 3 --topic bench.publisher:16 --max-seconds 3600
if [ -n "${PUBLISHER_RTT:-}" ]; then
	"$tools/mockctl" "$work/control" rtt all "$PUBLISHER_RTT" >/dev/null
fi

pg_init "$work/data"
pg_conf_local "$work/data"
pg_conf_publisher "$work/data"
if [ -n "${PUBLISHER_KAFKA_PROPERTIES:-}" ]; then
	echo "outbox.kafka_properties = '$PUBLISHER_KAFKA_PROPERTIES'" >>"$work/data/postgresql.conf"
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

# Every aggregate gets its progress row, as in a steady state.
q -c "SELECT count(*) FROM generate_series(1, 10000) g,
	LATERAL outbox_emit('order', 'order-' || g, 'OrderPaid', '{\"amount\": 10}', topic => 'bench.publisher')" >/dev/null
for _ in $(seq 600); do [ "$(counter events_published)" -ge 10000 ] && break; sleep 0.1; done
printf '%s\n' '\set id random(1, 10000)' \
	"SELECT event_id FROM outbox_emit('order', 'order-' || :id, 'OrderPaid', '{\"amount\": 10, \"currency\": \"EUR\"}', topic => 'bench.publisher');" \
	>"$work/steady.sql"

hz=$(getconf CLK_TCK)
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $secs s per rate, mock round trip ${PUBLISHER_RTT:-0} ms, outbox.kafka_properties '${PUBLISHER_KAFKA_PROPERTIES:-}'."
echo
echo "| events/s | events | settlings | events per settling | publisher CPU µs per event | of which the main thread |"
echo "|---:|---:|---:|---:|---:|---:|"
for rate in $rates; do
	e0=$(counter events_published)
	s0=$(counter settles)
	c0=$(ticks "/proc/$pub/stat")
	m0=$(ticks "/proc/$pub/task/$pub/stat")
	pgbench -n -M prepared -c 2 -j 2 --rate "$rate" -T "$secs" -f "$work/steady.sql" >"$work/pgbench.$rate.log" 2>&1 &
	bench_pid=$!
	wait "$bench_pid" || { cat "$work/pgbench.$rate.log" >&2; exit 1; }
	bench_pid=
	n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/pgbench.$rate.log")
	for _ in $(seq 200); do [ "$(counter events_published)" -ge $((e0 + n)) ] && break; sleep 0.1; done
	e=$(($(counter events_published) - e0))
	s=$(($(counter settles) - s0))
	c=$(($(ticks "/proc/$pub/stat") - c0))
	m=$(($(ticks "/proc/$pub/task/$pub/stat") - m0))
	awk -v r="$rate" -v e="$e" -v s="$s" -v c="$c" -v m="$m" -v hz="$hz" 'BEGIN {
		printf "| %d | %d | %d | %.0f | %.1f | %.1f |\n", r, e, s, e / (s ? s : 1), c * 1e6 / hz / e, m * 1e6 / hz / e }'
done
echo "work directory: $work" >&2
