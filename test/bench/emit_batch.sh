#!/usr/bin/env bash
#
# Emit throughput by transaction size, and the cost of an event against a
# plain INSERT: a throwaway cluster (outbox.workers = 0: no publisher),
# pgbench -M prepared, 2 clients, interleaved rounds.  Prints figures only.
#
#   bash test/bench/emit_batch.sh          # as root or postgres; ~4 min
#   ROUNDS=2 SECS=3 bash test/bench/emit_batch.sh
#
# For 1, 10 and 100 events per transaction: N outbox_emit() calls, one
# outbox_emit_many() call with N events, N outbox_emit_raw() calls, and N
# plain INSERTs into a table like the outbox (the baseline).  Then section
# a's transaction of docs/benchmarks.md: a business UPDATE plus one event,
# by outbox_emit() or by a plain INSERT.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-4}

if [ "$(id -u)" = 0 ]; then
	work=$(mktemp -d /tmp/outbox-emit-batch.XXXXXX)
	cp "$0" "$(dirname "$0")/lib.sh" "$work/"
	chown -R postgres: "$work"
	exec timeout 900 runuser -u postgres -- env WORK="$work" ROUNDS="$ROUNDS" SECS="$SECS" \
		PATH="$PATH" bash "$work/emit_batch.sh"
fi

work=${WORK:-$(mktemp -d /tmp/outbox-emit-batch.XXXXXX)}
export PGHOST=$work PGPORT=$((20000 + RANDOM % 20000)) PGDATABASE=postgres
. "$(dirname "$0")/lib.sh"
trap cleanup EXIT

pg_init "$work/data" -U postgres
cat >>"$work/data/postgresql.conf" <<EOF
shared_preload_libraries = 'outbox'
outbox.workers = 0
listen_addresses = ''
unix_socket_directories = '$work'
port = $PGPORT
max_connections = 20
shared_buffers = 256MB
synchronous_commit = on
EOF
pg_ctl -D "$work/data" -l "$work/postgres.log" -w start >/dev/null
q <<'EOF'
CREATE EXTENSION outbox;
-- The baseline: a plain table with the outbox's shape.
CREATE TABLE plain_outbox (LIKE outbox INCLUDING ALL);
CREATE TABLE orders (id int PRIMARY KEY, total bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 0);
INSERT INTO orders (id) SELECT generate_series(1, 10000);
EOF

P="'{\"amount\": 10, \"currency\": \"EUR\"}'"
# One pgbench script per configuration and size.
for n in 1 10 100; do
	{
		echo '\set id random(1, 10000)'
		echo 'BEGIN;'
		for i in $(seq "$n"); do
			echo "SELECT event_id FROM outbox_emit('order', 'order-' || ((:id + $i) % 10000), 'OrderPaid', $P);"
		done
		echo 'COMMIT;'
	} >"$work/emit.$n.sql"
	{
		echo '\set id random(1, 10000)'
		echo 'BEGIN;'
		for i in $(seq "$n"); do
			echo "SELECT event_id FROM outbox_emit_raw('order', 'order-' || ((:id + $i) % 10000), 'OrderPaid', $P::text);"
		done
		echo 'COMMIT;'
	} >"$work/raw.$n.sql"
	{
		echo '\set id random(1, 10000)'
		echo 'BEGIN;'
		echo "SELECT count(*) FROM outbox_emit_many((SELECT array_agg(ROW('order', 'order-' || ((:id + i) % 10000), 'OrderPaid', $P::jsonb, NULL, NULL, NULL, NULL)::outbox_event ORDER BY i) FROM generate_series(1, $n) i));"
		echo 'COMMIT;'
	} >"$work/many.$n.sql"
	{
		echo '\set id random(1, 10000)'
		echo 'BEGIN;'
		for i in $(seq "$n"); do
			echo "INSERT INTO plain_outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload) VALUES (gen_random_uuid()::text, 'order', 'order-' || ((:id + $i) % 10000), nextval('outbox_id_seq'), 'OrderPaid', 'outbox.event.order', $P);"
		done
		echo 'COMMIT;'
	} >"$work/plain.$n.sql"
done
cat >"$work/tx.emit.sql" <<EOF
\set id random(1, 10000)
BEGIN;
UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version;
SELECT event_id FROM outbox_emit('order', 'order-' || :id, 'OrderPaid', $P);
COMMIT;
EOF
cat >"$work/tx.plain.sql" <<EOF
\set id random(1, 10000)
BEGIN;
UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version \gset
INSERT INTO plain_outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload) VALUES (gen_random_uuid()::text, 'order', 'order-' || :id, :version, 'OrderPaid', 'outbox.event.order', $P);
COMMIT;
EOF

# tps of one script; tables emptied and checkpointed before each run.
run() {
	q -c "TRUNCATE outbox, aggregate_publication, plain_outbox" -c "CHECKPOINT" >/dev/null
	pgbench -n -M prepared -c 2 -j 2 -T "$SECS" -f "$1" 2>&1 |
		sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}

declare -A tps
configs="plain emit many raw"
for r in $(seq "$ROUNDS"); do
	for n in 1 10 100; do
		# Alternate the order every round: no configuration always runs first.
		order=$configs
		[ $((r % 2)) = 0 ] && order=$(echo "$configs" | tr ' ' '\n' | tac | tr '\n' ' ')
		for c in $order; do
			tps[$c.$n]="${tps[$c.$n]:-} $(run "$work/$c.$n.sql")"
		done
	done
	for c in plain emit; do
		[ $((r % 2)) = 0 ] && c=$([ "$c" = plain ] && echo emit || echo plain)
		tps[tx.$c]="${tps[tx.$c]:-} $(run "$work/tx.$c.sql")"
	done
	echo "round $r done" >&2
done

mean() { echo "$@" | tr ' ' '\n' | awk 'NF { s += $1; n++ } END { printf "%.0f", s / n }'; }
# Median of the per-round ratios a/b: rounds are paired, so a load that
# changes between rounds cancels out better than in the ratio of means.
mratio() {
	paste <(echo $1 | tr ' ' '\n') <(echo $2 | tr ' ' '\n') |
		awk '{ print $1 / $2 }' | sort -g |
		awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f", m }'
}
echo
echo "Events per second (mean tps x events per transaction), $ROUNDS rounds of $SECS s, 2 clients;"
echo "ratios: median of the per-round ratios of tps."
echo
echo "| events per transaction | plain INSERT | outbox_emit | outbox_emit_many | outbox_emit_raw | emit / plain | many / plain | many / emit |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in 1 10 100; do
	p=$(mean ${tps[plain.$n]}); e=$(mean ${tps[emit.$n]}); m=$(mean ${tps[many.$n]}); w=$(mean ${tps[raw.$n]})
	printf "| %d | %d | %d | %d | %d | %s | %s | %s |\n" "$n" $((p * n)) $((e * n)) $((m * n)) $((w * n)) \
		"$(mratio "${tps[emit.$n]}" "${tps[plain.$n]}")" "$(mratio "${tps[many.$n]}" "${tps[plain.$n]}")" \
		"$(mratio "${tps[many.$n]}" "${tps[emit.$n]}")"
done
echo
echo "tps per round:"
for k in "${!tps[@]}"; do echo "  $k:${tps[$k]}"; done | sort
echo
p=$(mean ${tps[tx.plain]}); e=$(mean ${tps[tx.emit]})
printf "Business UPDATE + one event: plain INSERT %d tps, outbox_emit %d tps: ratio %s (median of rounds)\n" \
	"$p" "$e" "$(mratio "${tps[tx.emit]}" "${tps[tx.plain]}")"
