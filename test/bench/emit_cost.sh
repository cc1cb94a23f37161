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
# Starts its own throwaway cluster with the pg_ctl/pgbench found on PATH and
# the outbox extension installed there; as root it re-runs itself as
# postgres.  Prints a Markdown table; judges nothing.  Bounded: about
# 4 x ROUNDS x SECONDS seconds plus set-up.
#
set -euo pipefail

ROUNDS=${1:-6}
SECS=${2:-5}
PERF_S=${EMIT_PERF_S:-5}

if [ "$(id -u)" = 0 ]; then
	work=$(mktemp -d /tmp/outbox-emit-cost.XXXXXX)
	chown postgres: "$work"
	exec timeout -k 30 $((ROUNDS * SECS * 4 * 2 + 300)) runuser -u postgres -- \
		env EMIT_WORK="$work" PATH="$PATH" EMIT_PERF="${EMIT_PERF:-1}" EMIT_PERF_S="$PERF_S" \
		bash "$0" "$ROUNDS" "$SECS"
fi

work=${EMIT_WORK:-$(mktemp -d /tmp/outbox-emit-cost.XXXXXX)}
export PGHOST=$work PGDATABASE=postgres
stop() { pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true; }
trap stop EXIT
q() { psql -X -q -v ON_ERROR_STOP=1 -At "$@"; }

initdb -D "$work/data" -A trust --no-sync -E UTF8 --locale=C >/dev/null
cat >>"$work/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$work'
port = 5432
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
outbox.workers = 0
shared_buffers = '256MB'
max_wal_size = '8GB'
checkpoint_timeout = '30min'
# no autovacuum worker's CPU time in the backends' (see cpu_ticks)
autovacuum = off
EOF
pg_ctl -D "$work/data" -l "$work/postgres.log" -w -t 60 start >/dev/null

q <<'EOF'
CREATE EXTENSION outbox;
CREATE TABLE outbox_copy (LIKE outbox INCLUDING ALL);
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, total numeric NOT NULL,
	version bigint NOT NULL);
EOF

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

# CPU time (clock ticks) of the postmaster's exited children: each
# backend's user + system time is added when it ends.  Less sensitive to
# the other load on a shared machine than tps.
pm=$(head -n1 "$work/data/postmaster.pid")
nchildren() { pgrep -c -P "$pm" || true; }
base_children=$(nchildren)
cpu_ticks() {
	local i
	# wait (bounded) until every backend that connected has been reaped
	for i in $(seq 100); do [ "$(nchildren)" -le "$base_children" ] && break; sleep 0.05; done
	sed 's/^.*) //' "/proc/$pm/stat" | awk '{ print $14 + $15 }'
}
hz=$(getconf CLK_TCK)

declare -A TPS CPU
run() { # config round
	local t0 t1 n
	q <<'EOF'
TRUNCATE outbox, aggregate_publication, outbox_copy, orders;
INSERT INTO orders SELECT g, 'new', 0, 0 FROM generate_series(1, 10000) g;
VACUUM ANALYZE orders;
CHECKPOINT;
EOF
	t0=$(cpu_ticks)
	pgbench -n -M prepared -c 2 -j 2 -T "$SECS" -f "$work/$1.sql" >"$work/pgbench.$1.$2.log" 2>&1 ||
		{ cat "$work/pgbench.$1.$2.log" >&2; exit 1; }
	t1=$(cpu_ticks)
	TPS[$1.$2]=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/pgbench.$1.$2.log")
	n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$work/pgbench.$1.$2.log")
	CPU[$1.$2]=$(awk -v d=$((t1 - t0)) -v n="$n" -v hz="$hz" 'BEGIN { printf "%.1f", d * 1e6 / hz / n }')
	echo "round $2 $1: ${TPS[$1.$2]} tps, ${CPU[$1.$2]} µs backend CPU per transaction" >&2
}

configs="update insert emit"
for r in $(seq "$ROUNDS"); do
	order=$configs
	[ $((r % 2)) = 0 ] && order=$(tr ' ' '\n' <<<"$configs" | tac | xargs)
	for c in $order; do run "$c" "$r"; done
done

mean() { # config [CPU]
	local v="" r
	for r in $(seq "$ROUNDS"); do
		if [ -n "${2:-}" ]; then v="$v ${CPU[$1.$r]}"; else v="$v ${TPS[$1.$r]}"; fi
	done
	awk -v v="$v" 'BEGIN { n = split(v, x, " "); for (i = 1; i <= n; i++) s += x[i]; printf "%.1f", s / n }'
}
median() { # config: median of the per-round CPU µs per transaction
	local r
	for r in $(seq "$ROUNDS"); do echo "${CPU[$1.$r]}"; done | sort -n |
		awk '{ x[NR] = $1 } END { printf "%.1f", NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2 }'
}
median_ratio() { # a b
	local r v=""
	for r in $(seq "$ROUNDS"); do
		v="$v $(awk -v a="${TPS[$1.$r]}" -v b="${TPS[$2.$r]}" 'BEGIN { printf "%.3f", a / b }')"
	done
	tr ' ' '\n' <<<"$v" | sed '/^$/d' | sort -n | awk '{ x[NR] = $1 } END {
		m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2
		s = ""; for (i = 1; i <= NR; i++) s = s (i > 1 ? ", " : "") x[i]
		printf "%.3f (sorted: %s)", m, s }'
}
# µs one event adds to a transaction: 2 clients x 1e6 / tps, minus the UPDATE alone
added() { awk -v t="$(mean "$1")" -v u="$(mean update)" 'BEGIN { printf "%.0f", 2e6 / t - 2e6 / u }'; }

cpu_added() { awk -v a="$(median "$1")" -v u="$(median update)" 'BEGIN { printf "%.1f", a - u }'; }
echo "| configuration | tps (mean of $ROUNDS x ${SECS} s) | tps per round | µs wall added over the UPDATE alone | backend CPU µs per transaction (median of rounds) | CPU µs added over the UPDATE alone |"
echo "|---|---:|---|---:|---:|---:|"
for c in $configs; do
	per=""
	for r in $(seq "$ROUNDS"); do per="$per${per:+, }$(printf '%.0f' "${TPS[$c.$r]}")"; done
	echo "| $c | $(printf '%.0f' "$(mean "$c")") | $per | $(added "$c") | $(median "$c") | $(cpu_added "$c") |"
done
echo
echo "outbox_emit / plain INSERT into outbox_copy, tps: mean $(awk -v a="$(mean emit)" -v b="$(mean insert)" 'BEGIN { printf "%.3f", a / b }'), median of rounds $(median_ratio emit insert)"
echo "added cost, outbox_emit / plain INSERT: wall $(awk -v a="$(added emit)" -v b="$(added insert)" 'BEGIN { printf "%.2f", a / b }'), backend CPU $(awk -v a="$(cpu_added emit)" -v b="$(cpu_added insert)" 'BEGIN { printf "%.2f", a / b }')"

# Where an emitting transaction's CPU goes: perf on the 1-client backend.
if [ "${EMIT_PERF:-1}" = 1 ] && command -v perf >/dev/null &&
	perf record -q -o "$work/perf.test" -- true >/dev/null 2>&1; then
	q -c "TRUNCATE outbox, aggregate_publication; CHECKPOINT"
	pgbench -n -M prepared -c 1 -T $((PERF_S + 3)) -f "$work/emit.sql" >"$work/pgbench.perf.log" 2>&1 &
	pb=$!
	sleep 1.5
	bpid=$(q -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench' LIMIT 1")
	if [ -n "$bpid" ] && perf record -q -g -p "$bpid" -o "$work/perf.data" -- sleep "$PERF_S" >/dev/null 2>&1; then
		perf report -i "$work/perf.data" --children --sort symbol --stdio -g none 2>/dev/null >"$work/perf.txt" || true
		echo
		echo "perf, inclusive share of the backend's samples ($(sed -n 's/^# Samples: \([^ ]*\) .*/\1/p' "$work/perf.txt" | head -n1) samples):"
		echo
		echo "| function | share |"
		echo "|---|---:|"
		awk '$3 == "[.]" && $1 ~ /%$/ && $4 !~ /^0x/ { print "| " $4 " | " $1 " |" }' "$work/perf.txt" | head -n "${EMIT_PERF_TOP:-40}"
	fi
	wait "$pb" || true
fi
echo
echo "work directory: $work" >&2
