#!/usr/bin/env bash
#
# test/bench/drain_instructions.sh [N [AGGREGATES]]
#
# What the publisher spends per event on a backlog drain, in CPU
# instructions counted by valgrind (callgrind): unlike time, the count does
# not depend on what else the machine runs, so two builds compare to the
# percent on a shared machine.
#
# A throwaway cluster (outbox.workers = 1) runs under valgrind
# --tool=callgrind; the mock Kafka cluster (3 brokers, one 16-partition
# topic, with the TCP_NODELAY shim nodelay.so) acknowledges.  After a
# warm-up drain of 64 events (the producer connected, the topic's metadata
# known), publishing is paused (outbox_pause()), the events are emitted in
# one transaction, publishing is resumed and the drain awaited by the
# publisher's shared-memory counter events_published (drain_wait --counter:
# no query on the outbox while it drains), then the cluster stops and
# callgrind writes the publisher's counts (every thread: the main one and
# librdkafka's).  Retention is off: it runs once a second, so under
# valgrind's slowdown it would weigh fifty times what it does in a drain.
# Two runs: N / 10 events over AGGREGATES / 10 aggregates,
# then N (default 20,000) over AGGREGATES (default 2,000), the same shape;
# per event = (count(N) - count(N / 10)) / (N - N / 10), so that start-up,
# the warm-up and the stop cancel out.  Prints that and the top 25 functions
# by inclusive count (callgrind_annotate --inclusive=yes), per event the
# same way.
#
# BEFORE_BINDIR=<bindir of another installation>: the same on that
# installation's build (e.g. the one before a change), as "before", first.
#
# Needs valgrind; as root it builds the tools it needs and re-runs itself as
# postgres.  Bounded: about a minute and a half per build with the
# defaults.  Keeps the callgrind files in the work directory it names at the
# end.
#
set -euo pipefail

N=${1:-20000}
A=${2:-2000}
BEFORE=${BEFORE_BINDIR:-}
src=$(cd "$(dirname "$0")/../.." && pwd)
bench=$src/test/bench
tools=$src/test/tools
. "$bench/lib.sh"

if [ "$(id -u)" = 0 ]; then
	[ -x "$tools/mock_kafka" ] || make -s -C "$tools" >/dev/null
	[ -x "$bench/drain_wait" ] && [ -f "$bench/nodelay.so" ] || make -s -C "$bench" drain_wait nodelay.so >/dev/null
	export BEFORE_BINDIR=$BEFORE
	RERUN_LIMIT=900 rerun_as_postgres drain-instr DRAIN_INSTR_SRC bench/drain_instructions.sh "$N" "$A"
fi
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 1; }

work=$(mktemp -d /tmp/outbox-drain-instr.XXXXXX)
export PGHOST=$work PGPORT=$((20000 + RANDOM % 20000)) PGDATABASE=postgres
T=bench.drain
TAB=$(printf '\t')
mock_pid=
pg_pid=
kill_after=mock_pid pg_stop_mode=immediate
trap cleanup EXIT
builds="after"
[ -n "$BEFORE" ] && builds="before after"

mock_preload=$bench/nodelay.so start_mock_kafka --brokers 3 --topic "$T:16" --max-seconds 900
[ -s "$work/bootstrap" ] || { echo "the mock Kafka did not start" >&2; exit 1; }

counter() { q -c "SELECT value FROM outbox_counters() WHERE name = 'events_published'"; }

# Wait until n events more than base are published (bounded by s seconds).
drained() { # base n s
	"$bench/drain_wait" --dsn "host=$work port=$PGPORT dbname=postgres" --counter \
		--base "$1" --events "$2" --interval-ms 200 --timeout-s "$3" >>"$work/drain.log"
}

# A throwaway cluster of build b in $work/data under callgrind, its
# postmaster's pid in pg_pid; prints the publisher's pid.
start_cluster() { # build log
	local bin pub
	bin=$(bindir "$1")
	"$bin/initdb" -D "$work/data" -A trust --no-sync -E UTF8 --locale=C >/dev/null
	pg_conf_local "$work/data"
	pg_conf_publisher "$work/data"
	cat >>"$work/data/postgresql.conf" <<EOF
outbox.retention = -1
outbox.inbox_retention = -1
EOF
	mkdir "$work/raw"
	valgrind --tool=callgrind --trace-children=yes --vgdb=no \
		--callgrind-out-file="$work/raw/callgrind.out.%p" \
		"$bin/postgres" -D "$work/data" >"$2" 2>&1 &
	pg_pid=$!
	for _ in $(seq 600); do pg_isready -q && break; sleep 0.2; done
	pg_isready -q || { tail -n 20 "$2" >&2; exit 1; }
	q -c "CREATE EXTENSION outbox"
	for _ in $(seq 300); do
		pub=$(q -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox publisher'")
		[ -n "$pub" ] && break
		sleep 0.2
	done
	[ -n "$pub" ] || { echo "no publisher started" >&2; exit 1; }
	echo "$pub"
}

# One run: the warm-up, the paused preload of n events over a aggregates,
# the drain, a fast stop; leaves $work/cg.<build>.<n>, the publisher's
# counts over its life.
measure() { # build n a
	local pub base
	start_cluster "$1" "$work/postgres.$1.$2.log" >"$work/pub"
	pub=$(cat "$work/pub")
	base=$(counter)
	q -o /dev/null -c "SELECT count(*) FROM generate_series(1, 64) i,
		LATERAL outbox_emit('order', 'warmup-' || i, 'Warmup', '{}', topic => '$T') e"
	drained "$base" 64 120
	q -o /dev/null -c "SELECT outbox_pause()"
	q -o /dev/null -c "BEGIN; SELECT count(*) FROM generate_series(0, $(($2 - 1))) AS i,
		LATERAL outbox_emit('order', 'order-' || (i % $3), 'OrderPaid',
			jsonb_build_object('seq', i, 'note', 'benchmark payload of about a hundred bytes',
				'amount', 10, 'currency', 'EUR'), topic => '$T') AS e; COMMIT;"
	base=$(counter)
	q -o /dev/null -c "SELECT outbox_resume()"
	drained "$base" "$2" 240
	pg_ctl -D "$work/data" -m fast -w -t 120 stop >/dev/null
	wait "$pg_pid" 2>/dev/null || true
	pg_pid=
	[ -s "$work/raw/callgrind.out.$pub" ] || { echo "no callgrind file of the publisher ($pub)" >&2; exit 1; }
	mv "$work/raw/callgrind.out.$pub" "$work/cg.$1.$2"
	rm -rf "$work/data" "$work/raw"
}

# A callgrind file's total instructions.
total() { sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$1"; }

# "function<TAB>instructions" per function, inclusive, sorted by function.
inclusive() { # file
	callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
		awk -v OFS="$TAB" '/^-+$/ { sep++; next } sep >= 3 && $1 ~ /^[0-9,]+$/ && $0 !~ /=>/ {
			ir = $1; gsub(",", "", ir); f = $0
			sub(/^ *[0-9,]+ *(\([^)]*\))? */, "", f); sub(/ \[.*\]$/, "", f)
			print f, ir }' | sort -t "$TAB" -k 1,1
}

M=$((N / 10))
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $N events over $A aggregates in one transaction, drained by one worker; less $M over $((A / 10)); $(valgrind --version)."
for b in $builds; do
	measure "$b" "$M" $((A / 10))
	measure "$b" "$N" "$A"
	echo
	echo "$b ($(bindir "$b")): **$((($(total "$work/cg.$b.$N") - $(total "$work/cg.$b.$M")) / (N - M))) instructions per event** (the publisher process, every thread; librdkafka's threads vary by a few hundred from run to run)"
	echo
	echo "| inclusive instructions per event | function |"
	echo "|---:|---|"
	# every function's count in the large run less that in the small one
	join -t "$TAB" -a 1 -e 0 -o 0,1.2,2.2 <(inclusive "$work/cg.$b.$N") <(inclusive "$work/cg.$b.$M") |
		awk -F "$TAB" -v n=$((N - M)) '$1 !~ /below main|libc_start|^\?\?\?:0x|PROGRAM TOTALS|events annotated/ {
			printf "%d\t%s\n", ($2 - $3) / n, $1 }' |
		sort -t "$TAB" -k 1,1nr | awk -F "$TAB" 'NR <= 25 { printf "| %d | %s |\n", $1, $2 }'
done
echo "work directory: $work" >&2
