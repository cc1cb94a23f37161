#!/usr/bin/env bash
#
# test/bench/inbox.sh [EVENTS]       (BENCH_FSYNC=off: fsync = off;
#                                     BENCH_PERF=FILE: perf record the worker;
#                                     BENCH_HAND_EVENTS=N: the hand-written
#                                     consumer's rate over its first N events)
#
# Inbox benchmark: events applied per second by one inbox worker with a
# trivial handler (insert a row) against two hand-written consumers doing
# the same, in the same run, from the same topic: inbox_consumer.c
# (librdkafka + inbox_claim, one message per transaction) and
# inbox_batch_consumer.c (librdkafka + COPY of a batch + its offsets in the
# same transaction, exactly-once by the offsets alone).  CPU per event of
# each: the worker's, the batch consumer's and its backend's (/proc).
# Prints figures, judges nothing.
#
# One mock Kafka broker (test/tools/mock_kafka, with the TCP_NODELAY shim)
# and one throwaway PostgreSQL cluster: the publisher fills topic "bench"
# (16 partitions, 10,000 aggregates) from database "postgres"; both
# consumers apply it into their own table of database "consumer".  The
# extension must be installed (make && make install).  fsync is on (the
# default, as in production) unless BENCH_FSYNC=off: then commits cost no
# flush and the one-transaction-per-message consumer looks its best.  Bounded: about two
# minutes at the default 100,000 events; everything started stops at exit.
#
set -euo pipefail

events=${1:-100000}
bench=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$bench/../.." && pwd)
tools=$src/test/tools

if [ "$(id -u)" = 0 ]; then
	make -s -C "$tools" >/dev/null
	make -s -C "$bench" inbox_consumer inbox_batch_consumer nodelay.so >/dev/null
	work=$(mktemp -d /tmp/outbox-inbox-bench.XXXXXX)
	chown postgres: "$work"
	rc=0
	timeout -k 30 900 runuser -u postgres -- env PATH="$PATH" BENCH_WORK="$work" \
		BENCH_FSYNC="${BENCH_FSYNC:-on}" BENCH_PERF="${BENCH_PERF:-}" \
		BENCH_HAND_EVENTS="${BENCH_HAND_EVENTS:-}" \
		bash "$0" "$events" || rc=$?
	[ "$rc" = 0 ] && rm -rf "$work" || echo "inbox.sh: failed ($rc); logs in $work" >&2
	exit "$rc"
fi

work=${BENCH_WORK:-$(mktemp -d /tmp/outbox-inbox-bench.XXXXXX)}
export PGHOST=$work PGPORT=$((20000 + RANDOM % 20000))
. "$bench/lib.sh"
mock_pid=
kill_after=mock_pid
trap cleanup EXIT

mock_preload=$bench/nodelay.so start_mock_kafka --brokers 1 --topic bench:16 --max-seconds 900
brokers=$(cat "$work/bootstrap")

pg_init "$work/data"
cat >>"$work/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$work'
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
outbox.inbox_database = 'consumer'
outbox.brokers = '$brokers'
outbox.inbox_workers = 1
fsync = ${BENCH_FSYNC:-on}
EOF
pg_ctl -D "$work/data" -l "$work/postgres.log" -w -t 60 start >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d postgres -c 'CREATE EXTENSION outbox' -c 'CREATE DATABASE consumer'
psql -qX -v ON_ERROR_STOP=1 -d consumer <<'EOF'
CREATE EXTENSION outbox;
CREATE ROLE bench LOGIN;
GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure), inbox_claim(text, text) TO bench;
CREATE TABLE bench_applied (aggregate_id text, version bigint, payload jsonb);
CREATE TABLE worker_applied (aggregate_id text, version bigint, payload jsonb);
CREATE TABLE batch_applied (aggregate_id text, version bigint, payload jsonb);
CREATE TABLE bench_offset (grp text, topic text, "partition" int, next_offset bigint,
	PRIMARY KEY (grp, topic, "partition"));
GRANT INSERT ON bench_applied, worker_applied, batch_applied TO bench;
GRANT SELECT, INSERT, UPDATE ON bench_offset TO bench;
CREATE FUNCTION apply_event(m inbox_message) RETURNS void LANGUAGE sql
	AS 'INSERT INTO public.worker_applied VALUES (m.aggregate_id, m.aggregate_version, m.payload)';
-- A handler runs as the role that subscribes it, which must own it.
ALTER FUNCTION apply_event(inbox_message) OWNER TO bench;
EOF

# Fill the topic through the publisher.
for _ in $(seq $((events / 10000))); do
	psql -qX -d postgres -c "SELECT count(outbox_emit('bench', 'order-' || (i % 10000), 'Changed',
		jsonb_build_object('i', i), topic => 'bench')) FROM generate_series(1, 10000) i" >/dev/null
done
for _ in $(seq 1200); do
	[ "$(psql -qXAt -d postgres -c 'SELECT count(*) FROM outbox_pending')" = 0 ] && break
	sleep 0.1
done
total=$(psql -qXAt -d postgres -c 'SELECT count(*) FROM outbox_events WHERE state = '\''published'\''')
echo "topic bench: $total events, 10000 aggregates, 16 partitions; fsync ${BENCH_FSYNC:-on}"

# The inbox worker: from subscription to the last event applied.
# The worker's CPU time (user + system, in clock ticks) from /proc: on a
# shared machine events per CPU second says more than events per second.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wpid=$(psql -qXAt -d consumer -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox inbox worker'")
cpu0=$(cpu_ticks "$wpid")
perf_pid=
if [ -n "${BENCH_PERF:-}" ]; then
	perf record -g -o "$BENCH_PERF" -p "$wpid" >"$work/perf.log" 2>&1 &
	perf_pid=$!
fi
t0=$(date +%s.%N)
psql -qXAt -d consumer -c "SET ROLE bench" \
	-c "SELECT inbox_subscribe('worker', ARRAY['bench'], 'apply_event(inbox_message)'::regprocedure)" >/dev/null
first=
for _ in $(seq 6000); do
	n=$(psql -qXAt -d consumer -c 'SELECT count(*) FROM worker_applied')
	if [ -z "$first" ] && [ "$n" -gt 0 ]; then first=$(date +%s.%N); fi
	[ "$n" -ge "$total" ] && break
	sleep 0.1
done
t1=$(date +%s.%N)
[ -n "$perf_pid" ] && kill -INT "$perf_pid" && wait "$perf_pid" || true
cpu_s=$(echo "($(cpu_ticks "$wpid") - $cpu0) / $(getconf CLK_TCK)" | bc -l)
worker_rate=$(echo "$total / ($t1 - $first)" | bc -l)
printf 'inbox worker (1, batch %s): %d events in %.2f s from the first applied (%.2f s from subscribing): %.0f events/s\n' \
	"$(psql -qXAt -d consumer -c 'SHOW outbox.inbox_batch_size')" "$n" "$(echo "$t1 - $first" | bc -l)" \
	"$(echo "$t1 - $t0" | bc -l)" "$worker_rate"
printf 'inbox worker CPU: %.2f s (user + system), %.0f events per CPU second, %.1f us per event; load average %s\n' \
	"$cpu_s" "$(echo "$n / $cpu_s" | bc -l)" "$(echo "$cpu_s * 1000000 / $n" | bc -l)" "$(cut -d' ' -f1-3 /proc/loadavg)"

# The hand-written batch consumer: COPY and offsets, a transaction per batch.
out=$("$bench/inbox_batch_consumer" --dsn "dbname=consumer user=bench" --brokers "$brokers" \
	--topic bench --group batch --table batch_applied --events "$total" --max-seconds 600)
batch_rate=$(echo "$out" | awk '{print $6}')
echo "hand-written batch consumer (COPY + offsets, batch 1000): $out (client, backend)"
printf 'ratio to the batch consumer: %.2fx\n' "$(echo "$worker_rate / $batch_rate" | bc -l)"

# The hand-written consumer, one message per transaction.
out=$("$bench/inbox_consumer" --dsn "dbname=consumer user=bench" --brokers "$brokers" \
	--topic bench --group hand --events "${BENCH_HAND_EVENTS:-$total}" --max-seconds 600)
hand_rate=$(echo "$out" | awk '{print $6}')
echo "hand-written consumer: $out"
printf 'ratio: %.1fx\n' "$(echo "$worker_rate / $hand_rate" | bc -l)"
psql -qXAt -d consumer -c "SELECT 'check: worker applied ' || (SELECT count(*) FROM worker_applied) ||
	', hand-written applied ' || (SELECT count(*) FROM bench_applied) ||
	', batch consumer applied ' || (SELECT count(*) FROM batch_applied) ||
	', worker duplicates ' || (SELECT sum(duplicates) FROM inbox_status)"
