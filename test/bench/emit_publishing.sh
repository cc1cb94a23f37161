#!/usr/bin/env bash
#
# test/bench/emit_publishing.sh [ROUNDS [SECONDS]]
#
# What a publishing publisher costs the emitters: pgbench, 2 clients, each
# transaction the business UPDATE of an order (10,000 rows) and one
# outbox_emit(), against the mock Kafka cluster (3 brokers, TCP_NODELAY
# shim), with the publisher publishing every event as it comes and with
# publishing paused (outbox_pause()), alternating, ROUNDS (default 2) of
# SECONDS (default 8) each, the tables truncated and a CHECKPOINT before
# each.  Per run: the emitters' transactions/s, the CPU ticks of the
# publisher and of the mock (/proc), the publisher's reads (batches), the
# WAL written per transaction (pg_stat_wal), and the emitting backends'
# wait events sampled every 0.1 s from pg_stat_activity; with
# EMIT_PUBLISHING_WALDUMP=1 also pg_waldump --stats=record of the run's WAL.
#
# EMIT_PUBLISHING_CONF=<lines>: more postgresql.conf lines (e.g.
# outbox.read_interval = 100ms).
#
# Starts its own throwaway cluster with the PostgreSQL found by pg_config
# and the outbox extension installed there; as root it re-runs itself as
# postgres.  Prints Markdown; judges nothing.  Bounded: about
# 2 x ROUNDS x (SECONDS + 5) seconds plus set-up.
#
set -euo pipefail

rounds=${1:-2}
secs=${2:-8}
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/test/bench/lib.sh"

if [ "$(id -u)" = 0 ]; then
	export EMIT_PUBLISHING_CONF=${EMIT_PUBLISHING_CONF:-} EMIT_PUBLISHING_WALDUMP=${EMIT_PUBLISHING_WALDUMP:-0}
	rerun_as_postgres emit-publishing OUTBOX_EMIT_PUBLISHING_WORK bench/emit_publishing.sh "$rounds" "$secs"
fi

bench_cluster_env "${OUTBOX_EMIT_PUBLISHING_WORK:-}" outbox-emit-publishing.XXXXXX

mock_pid=
bench_pid=
kill_first=bench_pid kill_after=mock_pid
trap cleanup EXIT

mock_preload=$src/test/bench/nodelay.so
start_mock_kafka --brokers 3 --topic bench.emit:16 --max-seconds 3600
pg_init "$work/data"
pg_conf_local "$work/data"
pg_conf_publisher "$work/data"
if [ -n "${EMIT_PUBLISHING_CONF:-}" ]; then
	printf '%s\n' "$EMIT_PUBLISHING_CONF" >>"$work/data/postgresql.conf"
fi
pg_ctl -D "$work/data" -l "$work/postgres.log" -w -t 60 start >/dev/null
q -c "CREATE EXTENSION outbox"
q -c "CREATE TABLE orders (id int PRIMARY KEY, status text, total numeric, version int)"
cat >"$work/emit.sql" <<'SQL'
\set id random(1, 10000)
BEGIN;
UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version \gset
SELECT event_id FROM outbox_emit('order', 'order-' || :id, 'OrderPaid', '{"amount": 10, "currency": "EUR"}', topic => 'bench.emit');
END;
SQL

reset() {
	q -c "TRUNCATE outbox, aggregate_publication, orders" \
		-c "INSERT INTO orders SELECT g, 'new', 0, 0 FROM generate_series(1, 10000) g" \
		-c "VACUUM ANALYZE orders" -c "CHECKPOINT" >/dev/null
}
ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
wal() { q -c "SELECT wal_bytes FROM pg_stat_wal"; }
batches() { q -c "SELECT value FROM outbox_counters() WHERE name = 'batches'"; }
pub=$(q -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox publisher'")
[ -n "$pub" ] || { echo "no publisher started" >&2; exit 1; }

echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $rounds round(s) of $secs s${EMIT_PUBLISHING_CONF:+, $(echo "$EMIT_PUBLISHING_CONF" | tr '\n' ' ')}."
echo
echo "| round | publisher | emitting tps | publisher CPU ticks | mock CPU ticks | reads | WAL bytes per transaction | emitters' wait events (samples) |"
echo "|---:|---|---:|---:|---:|---:|---:|---|"
for r in $(seq "$rounds"); do
	for mode in publishing paused; do
		reset
		if [ "$mode" = paused ]; then q -c "SELECT outbox_pause()" >/dev/null; else q -c "SELECT outbox_resume()" >/dev/null; fi
		c0=$(ticks "$pub") k0=$(ticks "$mock_pid") b0=$(batches) w0=$(wal)
		l0=$(q -c "SELECT pg_current_wal_insert_lsn()")
		pgbench -n -M prepared -c 2 -j 2 -T "$secs" -f "$work/emit.sql" >"$work/pgbench.log" 2>&1 &
		bench_pid=$!
		: >"$work/waits"
		for _ in $(seq $((secs * 10 - 5))); do
			q -c "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity
				WHERE application_name = 'pgbench' AND state = 'active'" >>"$work/waits"
			sleep 0.1
		done
		wait "$bench_pid" || { cat "$work/pgbench.log" >&2; exit 1; }
		bench_pid=
		tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/pgbench.log")
		n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/pgbench.log")
		w=$(($(wal) - w0))
		l1=$(q -c "SELECT pg_current_wal_insert_lsn()")
		waits=$(sort "$work/waits" | uniq -c | sort -rn | head -n 4 | awk '{ printf "%s%s %d", (NR > 1 ? ", " : ""), $2, $1 }')
		printf '| %d | %s | %.0f | %d | %d | %d | %.0f | %s |\n' "$r" "$mode" "$tps" \
			$(($(ticks "$pub") - c0)) $(($(ticks "$mock_pid") - k0)) $(($(batches) - b0)) \
			"$(awk -v w="$w" -v n="$n" 'BEGIN { print w / n }')" "$waits"
		if [ "${EMIT_PUBLISHING_WALDUMP:-0}" = 1 ]; then
			q -c "SELECT pg_switch_wal()" >/dev/null
			echo
			pg_waldump -p "$work/data/pg_wal" -s "$l0" -e "$l1" --stats=record 2>&1 | sed 's/^/    /'
			echo
		fi
	done
done
echo "work directory: $work" >&2
