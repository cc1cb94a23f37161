#!/usr/bin/env bash
#
# test/bench/emit_instructions.sh [N1 [N2]]
#
# What an event costs in CPU instructions, counted by valgrind (callgrind):
# unlike time, the count does not depend on what else the machine runs, so
# two builds compare to the percent on a shared machine.  A single-user
# backend (postgres --single, no client round trips) runs:
#
# - emit_cost.sh's transactions (the UPDATE of a business row, plus a plain
#   INSERT into a copy of the outbox or an outbox_emit() call), each
#   statement a prepared one as pgbench -M prepared runs it, N1 and then N2
#   transactions: per transaction = (count(N2) - count(N1)) / (N2 - N1), so
#   that start-up and the first calls' look-ups cancel out; every aggregate
#   has an event already (version 1), as in a steady state;
# - one statement of many events (outbox_emit_many() of one aggregate and of
#   as many aggregates as events; INSERT ... SELECT outbox_emit(...) FROM
#   generate_series(...) of one aggregate; a plain INSERT ... SELECT into the
#   copy), 5 x N1 and 5 x N2 events, per event the same way.
#
# EMIT_BEFORE_BINDIR=<bindir of another installation>: the same on that
# installation's build (e.g. the one before a change), as "before".
#
# Needs valgrind; as root it re-runs itself as postgres.  Prints Markdown.
# Bounded: about 4 minutes with the defaults (N1=200, N2=1200).
#
set -euo pipefail

N1=${1:-200}
N2=${2:-1200}
BEFORE=${EMIT_BEFORE_BINDIR:-}

if [ "$(id -u)" = 0 ]; then
	work=$(mktemp -d /tmp/outbox-emit-instr.XXXXXX)
	chown postgres: "$work"
	exec timeout -k 30 1800 runuser -u postgres -- \
		env EMIT_WORK="$work" PATH="$PATH" EMIT_BEFORE_BINDIR="$BEFORE" bash "$0" "$N1" "$N2"
fi
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 1; }

work=${EMIT_WORK:-$(mktemp -d /tmp/outbox-emit-instr.XXXXXX)}
builds="after"
[ -n "$BEFORE" ] && builds="after before"
. "$(dirname "$0")/lib.sh"

# Statements end with a blank line in single-user mode (-j).
single() { # build [valgrind output]: runs stdin in a single-user backend
	local pre=()
	[ -n "${2:-}" ] && pre=(valgrind --tool=callgrind --callgrind-out-file="$2")
	"${pre[@]}" "$(bindir "$1")/postgres" --single -D "$work/data.$1" -j postgres \
		>"$work/out.$1" 2>"$work/err.$1"
	if grep -q ERROR "$work/err.$1"; then grep ERROR "$work/err.$1" >&2; exit 1; fi
}

for b in $builds; do
	"$(bindir "$b")/initdb" -D "$work/data.$b" -A trust --no-sync -E UTF8 --locale=C >/dev/null
	cat >>"$work/data.$b/postgresql.conf" <<EOF
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
outbox.workers = 0
shared_buffers = '128MB'
autovacuum = off
EOF
	single "$b" <<'EOF'
SET client_min_messages = error;

CREATE EXTENSION outbox;

CREATE TABLE outbox_copy (LIKE outbox INCLUDING ALL);

CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, total numeric NOT NULL, version bigint NOT NULL);

INSERT INTO orders SELECT g, 'new', 0, 0 FROM generate_series(1, 10000) g;

CREATE TABLE sink (event_id text);

VACUUM ANALYZE orders;

EOF
done

P='{"amount": 10, "currency": "EUR"}'
transactions() { # config n: the input of n transactions
	# Every aggregate has a version already, as in a steady state: the
	# emit's look-up finds a row (and the copy's indexes are as large).
	printf 'TRUNCATE outbox, aggregate_publication, outbox_copy;\n\n'
	printf "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload) SELECT uuid_v7()::text, 'order', 'order-' || g, 1, 'OrderPaid', 'bench.emit', '%s' FROM generate_series(1, 10000) g;\n\n" "$P"
	printf 'INSERT INTO outbox_copy OVERRIDING SYSTEM VALUE SELECT * FROM outbox;\n\n'
	printf 'PREPARE u(int) AS UPDATE orders SET total = total + 1, version = version + 1 WHERE id = $1 RETURNING version;\n\n'
	printf "PREPARE i(int, bigint) AS INSERT INTO outbox_copy (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload) VALUES (uuid_v7()::text, 'order', 'order-' || \$1, \$2, 'OrderPaid', 'bench.emit', '%s');\n\n" "$P"
	printf "PREPARE e(int) AS SELECT event_id FROM outbox_emit('order', 'order-' || \$1, 'OrderPaid', '%s', topic => 'bench.emit');\n\n" "$P"
	awk -v c="$1" -v n="$2" 'BEGIN {
		for (i = 1; i <= n; i++) {
			k = 1 + (i * 7919) % 10000
			printf "BEGIN;\n\nEXECUTE u(%d);\n\n", k
			if (c == "insert") printf "EXECUTE i(%d, %d);\n\n", k, i + 1
			if (c == "emit") printf "EXECUTE e(%d);\n\n", k
			printf "COMMIT;\n\n"
		} }'
}
batch() { # config n: one statement of n events
	printf 'TRUNCATE outbox, aggregate_publication, outbox_copy, sink;\n\n'
	case $1 in
	many_one) echo "SELECT count(*) FROM outbox_emit_many((SELECT array_agg(ROW('order', 'one', 'E', '$P'::jsonb, NULL, NULL, NULL, NULL)::outbox_event) FROM generate_series(1, $2)));" ;;
	many_distinct) echo "SELECT count(*) FROM outbox_emit_many((SELECT array_agg(ROW('order', 'o-' || i, 'E', '$P'::jsonb, NULL, NULL, NULL, NULL)::outbox_event) FROM generate_series(1, $2) i));" ;;
	select_one) echo "INSERT INTO sink SELECT (outbox_emit('order', 'one', 'E', '$P')).event_id FROM generate_series(1, $2);" ;;
	plain) echo "INSERT INTO outbox_copy (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload) SELECT uuid_v7()::text, 'order', 'one', g, 'E', 'outbox.event.order', '$P' FROM generate_series(1, $2) g;" ;;
	esac
	echo
}
count() { # build input-generator config n
	"$2" "$3" "$4" >"$work/in"
	single "$1" "$work/cg" <"$work/in"
	sed -n 's/^==[0-9]*== Collected : \([0-9]*\).*/\1/p' "$work/err.$1"
}
per() { # build input-generator config n1 n2
	local a b
	a=$(count "$1" "$2" "$3" "$4")
	b=$(count "$1" "$2" "$3" "$5")
	echo $(((b - a) / ($5 - $4)))
}

declare -A T
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), N1=$N1, N2=$N2 (batches: 5x), $(valgrind --version)."
echo
echo "| per transaction (prepared statements) | $(sed 's/ / | /g' <<<"$builds") |"
echo "|---|$(sed 's/[a-z]*/---:/g; s/ /|/g' <<<"$builds")|"
for c in update insert emit; do
	row="| $c"
	for b in $builds; do
		T[$b.$c]=$(per "$b" transactions "$c" "$N1" "$N2")
		row="$row | ${T[$b.$c]}"
	done
	echo "$row |"
done
for c in insert emit; do
	row="| $c: added to the UPDATE"
	for b in $builds; do row="$row | $((T[$b.$c] - T[$b.update]))"; done
	echo "$row |"
done
row="| emit's addition / insert's"
for b in $builds; do
	row="$row | $(awk -v e=$((T[$b.emit] - T[$b.update])) -v i=$((T[$b.insert] - T[$b.update])) 'BEGIN { printf "%.3f", e / i }')"
done
echo "$row |"
echo
echo "| per event, one statement | $(sed 's/ / | /g' <<<"$builds") |"
echo "|---|$(sed 's/[a-z]*/---:/g; s/ /|/g' <<<"$builds")|"
for c in many_one many_distinct select_one plain; do
	row="| $c"
	for b in $builds; do row="$row | $(per "$b" batch "$c" $((N1 * 5)) $((N2 * 5)))"; done
	echo "$row |"
done
echo "work directory: $work" >&2
