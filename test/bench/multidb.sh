#!/usr/bin/env bash
#
# test/bench/multidb.sh [quick]
#
# Aggregate publish throughput of one cluster serving 1, 2 and 4 busy
# databases: each busy database holds N preloaded events (over 10,000
# aggregates, its own topic) while its publisher is paused (outbox_pause()),
# all are resumed at the same moment, and the time until every one of them
# has nothing pending gives the aggregate rate.  Then the same
# with 4 databases under outbox.max_workers = 1 (they take turns).  Prints
# figures, judges nothing.  One mock Kafka cluster (test/tools/mock_kafka,
# 3 brokers, TCP_NODELAY shim as in run.sh) and one throwaway PostgreSQL
# cluster; outbox.workers = 1 per database.
#
# As root: builds test/tools and test/bench and runs itself again as
# postgres.  The extension must be installed.  Full mode: N = 50,000, about
# 4 minutes; quick: N = 10,000, about 1.  Bounded (15 min); everything it
# started stops when it exits; the work directory is kept if it fails.
#
set -euo pipefail

mode=${1:-full}
case $mode in full | quick) ;; *) echo "usage: $0 [quick]" >&2; exit 2 ;; esac
bench=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$bench/../.." && pwd)
tools=$src/test/tools

if [ "$(id -u)" = 0 ]; then
	export PATH="$(pg_config --bindir):$PATH"
	make -s -C "$tools" >/dev/null
	make -s -C "$bench" >/dev/null
	work=$(mktemp -d /tmp/outbox-multidb.XXXXXX)
	chown postgres: "$work"
	rc=0
	timeout -k 30 900 runuser -u postgres -- env BENCH_WORK="$work" PATH="$PATH" \
		bash "$bench/multidb.sh" "$mode" || rc=$?
	if [ "$rc" = 0 ]; then rm -rf "$work"; else echo "multidb.sh: failed ($rc); logs in $work" >&2; fi
	exit "$rc"
fi

work=${BENCH_WORK:-$(mktemp -d /tmp/outbox-multidb.XXXXXX)}
export PATH="$(pg_config --bindir):$PATH"
export PGHOST=127.0.0.1
if [ "$mode" = quick ]; then N=10000; else N=50000; fi
AGGS=10000

. "$bench/lib.sh"
mock_pid=
kill_after=mock_pid
trap cleanup EXIT

env LD_PRELOAD="$bench/nodelay.so" "$tools/mock_kafka" --brokers 3 --bootstrap-file "$work/mock.bootstrap" \
	--control-file "$work/mock.control" --max-seconds 900 >"$work/mock.log" 2>&1 &
mock_pid=$!
wait_file "$work/mock.control" 100 || { echo "mock did not start" >&2; exit 1; }
brokers=$(cat "$work/mock.bootstrap")

pg_init "$work/data"
PGPORT=$((20000 + RANDOM % 20000))
cat >>"$work/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$work'
shared_preload_libraries = 'outbox'
outbox.brokers = '$brokers'
outbox.workers = 1
outbox.inbox_workers = 0
# publishing only, and plans that do not change in the middle of a run:
# with statistics of a 50,000-event backlog (ANALYZE, autoanalyze), marking a
# 10,000-event batch took ~20 s instead of ~1 s (the marking UPDATE's plan;
# seen here, not investigated)
autovacuum = off
outbox.retention = -1
outbox.inbox_retention = -1
max_worker_processes = 16
shared_buffers = '256MB'
max_locks_per_transaction = 512
max_wal_size = '8GB'
EOF
export PGPORT
pg_ctl -D "$work/data" -l "$work/postgres.log" -w -t 60 start >/dev/null

DBS="db1 db2 db3 db4"
for d in $DBS; do
	q -d postgres -c "CREATE DATABASE $d"
	q -d "$d" -c "CREATE EXTENSION outbox"
	"$tools/mockctl" "$work/mock.control" topic_create "bench.$d" 16 3 >/dev/null
done
# every database's publisher up, producer and metadata warm
for d in $DBS; do
	q -d "$d" -o /dev/null -c "SELECT outbox_emit('w', 'w-' || i, 'Warmup', '{}', topic => 'bench.$d') FROM generate_series(1, 64) i"
done
for _ in $(seq 600); do
	p=0
	for d in $DBS; do p=$((p + $(q -d "$d" -c "SELECT count(*) FROM outbox_pending"))); done
	[ "$p" = 0 ] && break
	sleep 0.1
done

# run K: with the first K databases' publishers paused, preload N events
# into each; then resume them all at once (drain_wait --exec, in
# parallel).  The aggregate rate is K*N over the slowest one's drain time.
run() { # k label
	local k=$1 label=$2 i=0 pids=() d max=0 s
	for d in $DBS; do
		i=$((i + 1))
		[ "$i" -gt "$k" ] && break
		q -d "$d" -c "TRUNCATE outbox, aggregate_publication" -c "SELECT outbox_pause()" >/dev/null
		q -d "$d" -c "SELECT count(*) FROM generate_series(0, $N - 1) AS i,
			LATERAL outbox_emit('order', 'order-' || (i % $AGGS), 'OrderPaid',
				jsonb_build_object('id', i, 'total', 100), topic => 'bench.$d') AS e" >/dev/null
	done
	q -d postgres -c CHECKPOINT >/dev/null
	i=0
	for d in $DBS; do
		i=$((i + 1))
		[ "$i" -gt "$k" ] && break
		"$bench/drain_wait" --dsn "host=127.0.0.1 port=$PGPORT dbname=$d" --counter --events "$N" \
			--interval-ms 20 --timeout-s 600 --exec "SELECT outbox_resume()" >"$work/drain.$d" &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p"; done
	i=0
	for d in $DBS; do
		i=$((i + 1))
		[ "$i" -gt "$k" ] && break
		s=$(sed -n 's/.* seconds=\([0-9.]*\) .*/\1/p' "$work/drain.$d")
		max=$(awk -v a="$max" -v b="$s" 'BEGIN { print (b > a) ? b : a }')
		say "    $d: $(cat "$work/drain.$d")"
	done
	awk -v k="$k" -v n="$N" -v t="$max" -v l="$label" \
		'BEGIN { printf "RESULT %s databases=%d events=%d seconds=%.2f aggregate_events_per_s=%.0f\n", l, k, k * n, t, k * n / t }'
}

say "mock Kafka + PostgreSQL in $work; $N events per busy database, outbox.workers = 1"
for k in 1 2 4; do run "$k" "uncapped"; done
q -d postgres -c "ALTER SYSTEM SET outbox.max_workers = 1" -c "ALTER SYSTEM SET outbox.worker_time_slice = 2" \
	-c "SELECT pg_reload_conf()" >/dev/null
sleep 2
run 4 "max_workers=1,time_slice=2s"
