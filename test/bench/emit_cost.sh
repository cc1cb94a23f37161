#!/usr/bin/env bash
#
# test/bench/emit_cost.sh [ROUNDS [SECONDS]]
#
# What outbox_emit() costs a business transaction, against a plain INSERT
# into a table with every column, default and index of the outbox
# (outbox_copy: LIKE outbox INCLUDING ALL).  pgbench -n -M prepared -c 2
# -j 2; each transaction is the UPDATE of a business row (10,000 rows, id
# random) plus the event; configurations interleaved, their order reversed
# every other round; tables truncated and CHECKPOINT before each run.  No
# publisher runs (outbox.workers = 0).  Then perf on the backend of a
# 1-client run of the outbox_emit script, if perf works (EMIT_PERF=0: skip).
#
# EMIT_BEFORE_BINDIR=<bindir of another installation>: also runs the
# outbox_emit script on a second cluster of that installation (another
# build of the extension, e.g. the one before a change), interleaved with
# the others, as configuration "emit_before".
#
# Starts its own throwaway clusters with the initdb/pg_ctl/pgbench found on
# PATH and the outbox extension installed there; as root it re-runs itself
# as postgres.  Prints Markdown; judges nothing.  Bounded: about
# 4 x ROUNDS x (SECONDS + 2) seconds plus set-up.
#
set -euo pipefail

ROUNDS=${1:-6}
SECS=${2:-5}
PERF_S=${EMIT_PERF_S:-5}
BEFORE=${EMIT_BEFORE_BINDIR:-}

if [ "$(id -u)" = 0 ]; then
	work=$(mktemp -d /tmp/outbox-emit-cost.XXXXXX)
	chown postgres: "$work"
	exec timeout -k 30 $((ROUNDS * (SECS + 5) * 4 + 300)) runuser -u postgres -- \
		env EMIT_WORK="$work" PATH="$PATH" EMIT_PERF="${EMIT_PERF:-1}" EMIT_PERF_S="$PERF_S" \
		EMIT_BEFORE_BINDIR="$BEFORE" bash "$0" "$ROUNDS" "$SECS"
fi

work=${EMIT_WORK:-$(mktemp -d /tmp/outbox-emit-cost.XXXXXX)}
export PGHOST=$work PGDATABASE=postgres
. "$(dirname "$0")/lib.sh"

clusters="after"
[ -n "$BEFORE" ] && clusters="after before"
port() { if [ "$1" = before ]; then echo 5433; else echo 5432; fi; }
stop() {
	local c
	for c in $clusters; do
		"$(bindir "$c")/pg_ctl" -D "$work/data.$c" -m immediate stop >/dev/null 2>&1 || true
	done
}
trap stop EXIT

declare -A PM BASE
for c in $clusters; do
	"$(bindir "$c")/initdb" -D "$work/data.$c" -A trust --no-sync -E UTF8 --locale=C >/dev/null
	cat >>"$work/data.$c/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$work'
port = $(port "$c")
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
outbox.workers = 0
shared_buffers = '256MB'
max_wal_size = '8GB'
checkpoint_timeout = '30min'
# no autovacuum worker's CPU time in the backends' (see cpu_ticks)
autovacuum = off
EOF
	"$(bindir "$c")/pg_ctl" -D "$work/data.$c" -l "$work/postgres.$c.log" -w -t 60 start >/dev/null
	q -p "$(port "$c")" <<'EOF'
SET client_min_messages = error;
CREATE EXTENSION outbox;
CREATE TABLE outbox_copy (LIKE outbox INCLUDING ALL);
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, total numeric NOT NULL,
	version bigint NOT NULL);
EOF
	PM[$c]=$(head -n1 "$work/data.$c/postmaster.pid")
done

head='\set id random(1, 10000)
BEGIN;
UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version \gset'
printf '%s\nEND;\n' "$head" >"$work/update.sql"
printf '%s\n%s\nEND;\n' "$head" \
	"INSERT INTO outbox_copy (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload) VALUES (uuid_v7()::text, 'order', 'order-' || :id, :version, 'OrderPaid', 'bench.emit', '{\"amount\": 10, \"currency\": \"EUR\"}');" \
	>"$work/insert.sql"
printf '%s\n%s\nEND;\n' "$head" \
	"SELECT event_id FROM outbox_emit('order', 'order-' || :id, 'OrderPaid', '{\"amount\": 10, \"currency\": \"EUR\"}', topic => 'bench.emit');" \
	>"$work/emit.sql"
cp "$work/emit.sql" "$work/emit_before.sql"

# CPU time (clock ticks) of a postmaster's exited children: each backend's
# user + system time is added when it ends.  Less sensitive to the other
# load on a shared machine than tps.
nchildren() { pgrep -c -P "${PM[$1]}" || true; }
for c in $clusters; do BASE[$c]=$(nchildren "$c"); done
cpu_ticks() { # cluster
	local i
	# wait (bounded) until every backend that connected has been reaped
	for i in $(seq 100); do [ "$(nchildren "$1")" -le "${BASE[$1]}" ] && break; sleep 0.05; done
	sed 's/^.*) //' "/proc/${PM[$1]}/stat" | awk '{ print $14 + $15 }'
}
hz=$(getconf CLK_TCK)

declare -A TPS CPU
run() { # config round
	local t0 t1 n c=after p
	[ "$1" = emit_before ] && c=before
	p=$(port "$c")
	q -p "$p" <<'EOF'
TRUNCATE outbox, aggregate_publication, outbox_copy, orders;
INSERT INTO orders SELECT g, 'new', 0, 0 FROM generate_series(1, 10000) g;
VACUUM ANALYZE orders;
CHECKPOINT;
EOF
	t0=$(cpu_ticks "$c")
	pgbench -p "$p" -n -M prepared -c 2 -j 2 -T "$SECS" -f "$work/$1.sql" >"$work/pgbench.$1.$2.log" 2>&1 ||
		{ cat "$work/pgbench.$1.$2.log" >&2; exit 1; }
	t1=$(cpu_ticks "$c")
	TPS[$1.$2]=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/pgbench.$1.$2.log")
	n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/pgbench.$1.$2.log")
	CPU[$1.$2]=$(awk -v d=$((t1 - t0)) -v n="$n" -v hz="$hz" 'BEGIN { printf "%.1f", d * 1e6 / hz / n }')
	echo "round $2 $1: ${TPS[$1.$2]} tps, ${CPU[$1.$2]} µs backend CPU per transaction" >&2
}

configs="update insert emit"
[ -n "$BEFORE" ] && configs="$configs emit_before"
start=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
	order=$configs
	[ $((r % 2)) = 0 ] && order=$(tr ' ' '\n' <<<"$configs" | tac | xargs)
	for c in $order; do run "$c" "$r"; done
done

mean() { # config
	local v="" r
	for r in $(seq "$ROUNDS"); do v="$v ${TPS[$1.$r]}"; done
	awk -v v="$v" 'BEGIN { n = split(v, x, " "); for (i = 1; i <= n; i++) s += x[i]; printf "%.1f", s / n }'
}
median() { # config: median of the per-round CPU µs per transaction
	local r
	for r in $(seq "$ROUNDS"); do echo "${CPU[$1.$r]}"; done | sort -n |
		awk '{ x[NR] = $1 } END { printf "%.1f", NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2 }'
}
median_ratio() { # a b: of the per-round tps
	local r v=""
	for r in $(seq "$ROUNDS"); do
		v="$v $(awk -v a="${TPS[$1.$r]}" -v b="${TPS[$2.$r]}" 'BEGIN { printf "%.2f", a / b }')"
	done
	tr ' ' '\n' <<<"$v" | sed '/^$/d' | sort -n | awk '{ x[NR] = $1 } END {
		m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2
		s = ""; for (i = 1; i <= NR; i++) s = s (i > 1 ? ", " : "") x[i]
		printf "%.2f (rounds, sorted: %s)", m, s }'
}
# µs one event adds to a transaction: wall (2 clients x 1e6 / tps) and
# backend CPU, minus the same for the UPDATE alone
added() { awk -v t="$(mean "$1")" -v u="$(mean update)" 'BEGIN { printf "%.0f", 2e6 / t - 2e6 / u }'; }
cpu_added() { awk -v a="$(median "$1")" -v u="$(median update)" 'BEGIN { printf "%.0f", a - u }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "$start, $ROUNDS rounds of $SECS s, load average $load0 at start, $(cut -d' ' -f1-3 /proc/loadavg) at the end."
echo
echo "| configuration | tps (mean) | tps per round | µs wall added over the UPDATE alone | backend CPU µs per transaction (median of rounds) | CPU µs added over the UPDATE alone |"
echo "|---|---:|---|---:|---:|---:|"
for c in $configs; do
	per=""
	for r in $(seq "$ROUNDS"); do per="$per${per:+, }$(printf '%.0f' "${TPS[$c.$r]}")"; done
	echo "| $c | $(printf '%.0f' "$(mean "$c")") | $per | $(added "$c") | $(median "$c") | $(cpu_added "$c") |"
done
echo
echo "| ratio | of mean tps | median of per-round tps ratios | of CPU µs added |"
echo "|---|---:|---|---:|"
for e in $configs; do
	case $e in emit*) ;; *) continue ;; esac
	echo "| $e / insert | $(ratio "$(mean "$e")" "$(mean insert)") | $(median_ratio "$e" insert) | $(ratio "$(cpu_added "$e")" "$(cpu_added insert)") |"
done

# Where an emitting transaction's CPU goes: perf on the 1-client backend.
if [ "${EMIT_PERF:-1}" = 1 ] && command -v perf >/dev/null &&
	perf record -q -o "$work/perf.test" -- true >/dev/null 2>&1; then
	q -p 5432 -c "TRUNCATE outbox, aggregate_publication; CHECKPOINT"
	pgbench -p 5432 -n -M prepared -c 1 -T $((PERF_S + 3)) -f "$work/emit.sql" >"$work/pgbench.perf.log" 2>&1 &
	pb=$!
	sleep 1.5
	bpid=$(q -p 5432 -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench' LIMIT 1")
	if [ -n "$bpid" ] && perf record -q -g -p "$bpid" -o "$work/perf.data" -- sleep "$PERF_S" >/dev/null 2>&1; then
		perf report -f -i "$work/perf.data" --children --sort symbol --stdio -g none 2>/dev/null >"$work/perf.txt" || true
		perf report -f -i "$work/perf.data" --children --sort symbol --stdio -g none -p '^emit_event$' -x \
			2>/dev/null >"$work/perf.emit.txt" || true
		echo
		echo "perf (user-space samples of the backend, $(sed -n 's/^# Samples: \([^ ]*\) .*/\1/p' "$work/perf.txt" | head -n1)), inclusive shares; the first table over the whole backend, the second within emit_event:"
		echo
		echo "| function | share |"
		echo "|---|---:|"
		# (|| true: head closing the pipe is no failure)
		awk '$3 == "[.]" && $1 ~ /%$/ && $4 !~ /^0x/ { print "| " $4 " | " $1 " |" }' "$work/perf.txt" |
			head -n "${EMIT_PERF_TOP:-30}" || true
		echo
		echo "| within emit_event | share of the backend |"
		echo "|---|---:|"
		awk '$3 == "[.]" && $1 ~ /%$/ && $4 !~ /^0x/ { print "| " $4 " | " $1 " |" }' "$work/perf.emit.txt" |
			grep -v -E '\| (ExecMakeTableFunctionResult|ExecScan|PortalRun|PostgresMain|PostmasterMain|__libc_start_call_main|main|standard_ExecutorRun) \|' |
			head -n "${EMIT_PERF_TOP:-30}" || true
	fi
	wait "$pb" || true
fi
echo "work directory: $work" >&2
