#!/usr/bin/env bash
#
# test/bench/inbox.sh [EVENTS]       (BENCH_FSYNC=off: fsync = off;
#                                     BENCH_ROUNDS=N: interleaved rounds of
#                                     the worker and the batch consumer, 3;
#                                     BENCH_PERF=FILE: perf record the worker
#                                     in the first round;
#                                     BENCH_NO_STATS=1: before each worker
#                                     round, no inbox rows, no statistics of
#                                     inbox_aggregate, no autovacuum of it,
#                                     a restarted server: a new install's
#                                     first consumer;
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
# Prints each round, then medians and ranges; judges nothing.
#
# One mock Kafka broker (test/tools/mock_kafka, with the TCP_NODELAY shim)
# and one throwaway PostgreSQL cluster: the publisher fills topic "bench"
# (16 partitions, 10,000 aggregates) from database "postgres"; each
# consumer applies it into its own table of database "consumer".  The
# extension must be installed (make && make install).  fsync is on (the
# default, as in production) unless BENCH_FSYNC=off: then commits cost no
# flush and the one-transaction-per-message consumer looks its best.
# Bounded: a few minutes at the default 100,000 events; everything started
# stops at exit.
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
		BENCH_FSYNC="${BENCH_FSYNC:-on}" BENCH_PERF="${BENCH_PERF:-}" BENCH_ROUNDS="${BENCH_ROUNDS:-3}" \
		BENCH_HAND_EVENTS="${BENCH_HAND_EVENTS:-}" BENCH_NO_STATS="${BENCH_NO_STATS:-}" \
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
GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure), inbox_unsubscribe(text),
	inbox_claim(text, text) TO bench;
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

# Rounds (BENCH_ROUNDS, default 3), interleaved: the inbox worker as a new
# consumer, then the batch consumer as a new group, each from the topic's
# beginning.  The worker's progress is read from inbox_offset (its rows per
# partition, written by each batch), not by counting the applied table.
# CPU time (user + system) from /proc: on a shared machine CPU per event
# says more than events per second.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tck=$(getconf CLK_TCK)
worker_pid() { psql -qXAt -d consumer -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox inbox worker'"; }
wpid=$(worker_pid)
applied() { psql -qXAt -d consumer -c "SELECT coalesce(sum(applied), 0) FROM inbox_offset WHERE consumer = '$1'"; }
worker_rates=() worker_cpus=() batch_rates=() batch_cpus=() ratios=()
for r in $(seq "${BENCH_ROUNDS:-3}"); do
	if [ -n "${BENCH_NO_STATS:-}" ]; then
		psql -qX -d consumer -c 'TRUNCATE inbox_aggregate, inbox, inbox_offset' \
			-c 'ALTER TABLE inbox_aggregate SET (autovacuum_enabled = false)' \
			-c "DELETE FROM pg_statistic WHERE starelid = 'inbox_aggregate'::regclass"
		pg_ctl -D "$work/data" -l "$work/postgres.log" -w -t 60 -m fast restart >/dev/null
		wpid=
		for _ in $(seq 100); do
			wpid=$(worker_pid)
			[ -n "$wpid" ] && break
			sleep 0.1
		done
	fi
	perf_pid=
	if [ -n "${BENCH_PERF:-}" ] && [ "$r" = 1 ]; then
		perf record -g -o "$BENCH_PERF" -p "$wpid" >"$work/perf.log" 2>&1 &
		perf_pid=$!
	fi
	cpu0=$(cpu_ticks "$wpid")
	t0=$(date +%s.%N)
	psql -qXAt -d consumer -c "SET ROLE bench" \
		-c "SELECT inbox_subscribe('worker$r', ARRAY['bench'], 'apply_event(inbox_message)'::regprocedure)" >/dev/null
	first= n0=0
	for _ in $(seq 12000); do
		n=$(applied "worker$r")
		if [ -z "$first" ] && [ "$n" -gt 0 ]; then first=$(date +%s.%N) n0=$n; fi
		[ "$n" -ge "$total" ] && break
		sleep 0.05
	done
	t1=$(date +%s.%N)
	cpu1=$(cpu_ticks "$wpid")
	[ -n "$perf_pid" ] && kill -INT "$perf_pid" && wait "$perf_pid" || true
	psql -qXAt -d consumer -c "SET ROLE bench" -c "SELECT inbox_unsubscribe('worker$r')" >/dev/null
	worker_rate=$(echo "($n - $n0) / ($t1 - $first)" | bc -l)
	worker_cpu=$(echo "($cpu1 - $cpu0) * 1000000 / $tck / $n" | bc -l)
	printf 'round %d: inbox worker (batch %s): %d events, %.0f events/s from the first batch (%.2f s from subscribing), %.1f us CPU per event; load average %s\n' \
		"$r" "$(psql -qXAt -d consumer -c 'SHOW outbox.inbox_batch_size')" "$n" "$worker_rate" \
		"$(echo "$t1 - $t0" | bc -l)" "$worker_cpu" "$(cut -d' ' -f1 /proc/loadavg)"

	# The hand-written batch consumer: COPY and offsets, a transaction per batch.
	out=$("$bench/inbox_batch_consumer" --dsn "dbname=consumer user=bench" --brokers "$brokers" \
		--topic bench --group "batch$r" --table batch_applied --events "$total" --max-seconds 600)
	batch_rate=$(echo "$out" | awk '{print $6}')
	batch_cpu=$(echo "$out" | awk '{print $8 + $9}')
	echo "round $r: hand-written batch consumer (COPY + offsets, batch 1000): $out (client, backend)"
	worker_rates+=("$worker_rate") worker_cpus+=("$worker_cpu")
	batch_rates+=("$batch_rate") batch_cpus+=("$batch_cpu")
	ratios+=("$(echo "$worker_rate / $batch_rate" | bc -l)")
done

# Median and range of a list of numbers, formatted with $1.
summary() {
	local fmt=$1
	shift
	printf '%s\n' "$@" | sort -g | awk -v f="$fmt" '{v[NR] = $1}
		END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
			printf "median " f " (" f " to " f ")", m, v[1], v[NR]}'
}
echo "inbox worker: $(summary %.0f "${worker_rates[@]}") events/s, $(summary %.1f "${worker_cpus[@]}") us CPU per event"
echo "batch consumer: $(summary %.0f "${batch_rates[@]}") events/s, $(summary %.1f "${batch_cpus[@]}") us CPU per event (client + backend)"
echo "ratio of the worker to the batch consumer, per round: $(summary %.2f "${ratios[@]}")"
worker_rate=$(printf '%s\n' "${worker_rates[@]}" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')

# The hand-written consumer, one message per transaction.
out=$("$bench/inbox_consumer" --dsn "dbname=consumer user=bench" --brokers "$brokers" \
	--topic bench --group hand --events "${BENCH_HAND_EVENTS:-$total}" --max-seconds 600)
hand_rate=$(echo "$out" | awk '{print $6}')
echo "hand-written consumer: $out"
printf 'ratio of the worker (median) to it: %.1fx\n' "$(echo "$worker_rate / $hand_rate" | bc -l)"
psql -qXAt -d consumer -c "SELECT 'check: worker applied ' || (SELECT count(*) FROM worker_applied) ||
	', hand-written applied ' || (SELECT count(*) FROM bench_applied) ||
	', batch consumer applied ' || (SELECT count(*) FROM batch_applied) ||
	', worker duplicates ' || (SELECT sum(duplicates) FROM inbox_status)"
