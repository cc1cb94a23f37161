# test/bench/sections/setup.sh -- the work directory, the run's sizes, the mock Kafka cluster and the
# PostgreSQL cluster with the bench tables.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

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
	B_REPS=2           # interleaved rounds of (b) and (c)
	E_REPS=1           # rounds of (e)
	P_REPS=2           # rounds of the peers' throughput runs (p)
	P_ST_REPS=1        # rounds of the peers' steady-load runs (p)
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
	E_REPS=3
	P_REPS=3
	P_ST_REPS=3
	P_LAT_S=12
	P_RATES="1000 2000 5000"
fi
B_AGGS="10000 10 1"   # aggregates of the throughput runs
# headline mode: the full size, 3 rounds (quick: 2; BENCH_ROUNDS overrides)
HL_REPS=${BENCH_ROUNDS:-$([ "$mode" = quick ] && echo 2 || echo 3)}
if [ "$real" = 1 ]; then
	B_AGGS="10000 1"
	# (a real run is slower: quick mode keeps one round)
	if [ "$mode" = quick ]; then B_REPS=1; else B_REPS=3; fi
	if [ "$mode" = quick ]; then LAT_S=5 RATES=2000; else RATES="500 2000"; fi
fi
LAT_CLIENTS=8
if [ "$mode" = quick ]; then DRAIN_TIMEOUT=60; else DRAIN_TIMEOUT=120; fi
AGGS_MAIN=10000

mock_pid=
mock2_pid=
relay_pid=
kafka=    # the real cluster's directory (real mode)
kill_first=relay_pid kill_after="mock_pid mock2_pid"
trap cleanup EXIT

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

pg_init "$work/data"
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
# BENCH_OUTBOX_CONF: more postgresql.conf lines (e.g. "outbox.batch_events = 50000")
[ -z "${BENCH_OUTBOX_CONF:-}" ] || printf '%s\n' "$BENCH_OUTBOX_CONF" >>"$work/data/postgresql.conf"
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
