#!/usr/bin/env bash
#
# Long run: a million events through emit, publish and retention, sampled
# every 10 s, to show that emit and publish speed stay flat and the outbox
# stays small.  A benchmark, not a test: it prints figures.
#
#   test/bench/soak.sh [total_events]     (default 1000000; as root or postgres)
#   SOAK_AUTOVACUUM=tuned test/bench/soak.sh ...
#
# Set-up: one publisher, mock Kafka (3 brokers, 16 partitions),
# outbox.retention = 0 (rows deleted as soon as they are published), the
# server's default autovacuum settings (SOAK_AUTOVACUUM=tuned: naptime 5 s
# and cost limit 2000, as before the storage change), the tables' autovacuum
# thresholds as the extension sets them.  pgbench, 4 clients, each
# transaction emits 10 events on random aggregates of 10,000.  Sampled: the
# outbox's and aggregate_publication's size and dead tuples; at the end,
# every table and index of the extension with its size, dead tuples and
# autovacuum count.
set -euo pipefail

total=${1:-1000000}
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/test/bench/lib.sh"

if [ "$(id -u)" = 0 ]; then
	rerun_as_postgres soak OUTBOX_SOAK_WORK bench/soak.sh "$total"
fi

bench_cluster_env "${OUTBOX_SOAK_WORK:-}" outbox-soak.XXXXXX

mock_pid=
bench_pid=
kill_first=bench_pid kill_after=mock_pid pg_stop_mode=fast
trap cleanup EXIT

start_mock_kafka --brokers 3 --topic outbox.event.soak:16 --max-seconds 3600

pg_init "$work/data"
pg_conf_local "$work/data"
cat >>"$work/data/postgresql.conf" <<EOF
outbox.database = 'postgres'
outbox.brokers = '$(cat "$work/bootstrap")'
outbox.retention = 0
shared_buffers = 256MB
max_wal_size = 4GB
EOF
if [ "${SOAK_AUTOVACUUM:-default}" = tuned ]; then
	# vacuum every few seconds rather than every minute, and unthrottled
	printf '%s\n' "autovacuum_naptime = '5s'" "autovacuum_vacuum_cost_limit = 2000" >>"$work/data/postgresql.conf"
fi
pg_ctl -D "$work/data" -l "$work/postgres.log" -w start >/dev/null
psql -q -X -c 'CREATE EXTENSION outbox'

clients=4
per_tx=10
tx=$((total / clients / per_tx))
{
	echo '\set aid random(1, 10000)'
	echo 'BEGIN;'
	for i in $(seq $per_tx); do
		echo "SELECT outbox_emit('soak', 'agg-' || ((:aid + $i) % 10000), 'Changed', '{\"n\": $i, \"pad\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}');"
	done
	echo 'COMMIT;'
} >"$work/emit.sql"

sample() {
	psql -X -Atc "SELECT coalesce((SELECT last_value FROM outbox_id_seq), 0),
		(SELECT value FROM outbox_counters() WHERE name = 'events_published'),
		(SELECT pending_events FROM outbox_status),
		pg_total_relation_size('outbox'),
		(SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'),
		pg_total_relation_size('aggregate_publication'),
		(SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'aggregate_publication')" | tr '|' ' '
}

echo "soak: $total events, $clients clients x $per_tx events per transaction, retention 0, autovacuum ${SOAK_AUTOVACUUM:-default}"
echo
echo "| t (s) | emitted | emit/s | published | publish/s | pending | outbox size (MB) | dead tuples | aggregate_publication (MB) | dead tuples |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
start=$(date +%s)
pgbench -n -c $clients -j 2 -t $tx -f "$work/emit.sql" postgres >"$work/pgbench.log" 2>&1 &
bench_pid=$!
read -r e0 p0 _ _ _ _ _ <<<"$(sample)"
t0=$start
while :; do
	sleep 10
	now=$(date +%s)
	read -r e p pending size dead asize adead <<<"$(sample)"
	dt=$((now - t0))
	printf '| %d | %d | %d | %d | %d | %d | %.1f | %d | %.1f | %d |\n' $((now - start)) "$e" $(((e - e0) / dt)) \
		"$p" $(((p - p0) / dt)) "$pending" "$(echo "$size / 1048576" | bc -l)" "${dead:-0}" \
		"$(echo "$asize / 1048576" | bc -l)" "${adead:-0}"
	e0=$e; p0=$p; t0=$now
	if ! kill -0 "$bench_pid" 2>/dev/null && [ "$pending" = 0 ]; then
		break
	fi
	[ $((now - start)) -gt 1800 ] && { echo "soak: stopped after 30 minutes"; break; }
done
wait "$bench_pid" 2>/dev/null || true
bench_pid=
echo
grep -E "^(tps|latency average)" "$work/pgbench.log" | sed 's/^/pgbench: /'
psql -X -Atc "SELECT 'outbox rows left: ' || count(*) FROM outbox"
psql -X -Atc "SELECT 'outbox size at end: ' || pg_size_pretty(pg_total_relation_size('outbox'))"
echo
echo "At the end (sizes; dead tuples and autovacuum/autoanalyze runs from pg_stat_user_tables):"
echo
echo "| relation | kind | size | live tuples | dead tuples | autovacuums | autoanalyzes |"
echo "|---|---|---:|---:|---:|---:|---:|"
psql -X -At -F ' | ' -c "SELECT '| ' || c.relname, CASE c.relkind WHEN 'i' THEN 'index' ELSE 'table' END,
		pg_size_pretty(pg_relation_size(c.oid)), coalesce(s.n_live_tup::text, ''), coalesce(s.n_dead_tup::text, ''),
		coalesce(s.autovacuum_count::text, ''), coalesce(s.autoanalyze_count::text, '') || ' |'
	FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
	WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'i')
	ORDER BY coalesce((SELECT t.relname FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid WHERE i.indexrelid = c.oid), c.relname), c.relkind DESC, c.relname"
