#!/usr/bin/env bash
#
# The embedded default: a throwaway PostgreSQL with the publisher, a mock
# Kafka cluster on 127.0.0.1, a few business transactions that emit events
# for two aggregates, and the events read back from Kafka in order with
# their headers; then (a separate part) a second database, served by the
# same publishers' launcher as soon as it has the extension; then, in a
# separate section, the consumer half: database "billing", where CREATE
# EXTENSION, a handler and inbox_subscribe give an exactly-once handler; the
# inbox worker applies every event there once, in version order, and an
# upstream replay applies nothing again.  As root on a fresh Debian 12
# machine it first installs the
# packages, builds and installs the extension.  Everything stops by itself.
#
# Usage: test/demo.sh [--real-kafka]
#   --real-kafka: a real 3-node Apache Kafka 3.9 cluster (test/tools/kafka_cluster,
#   Java; the first run downloads the jars) instead of the mock.
#
set -euo pipefail

real=
case ${1:-} in
	--real-kafka) real=1 ;;
	'') ;;
	*) echo "usage: $0 [--real-kafka]" >&2; exit 2 ;;
esac

src=$(cd "$(dirname "$0")/.." && pwd)
. "$src/test/bench/lib.sh"

if [ "$(id -u)" = 0 ]; then
	bash "$src/.ci/install-deps"
	export PATH="$(pg_config --bindir):$PATH"
	make -s -C "$src" >/dev/null
	make -s -C "$src" install >/dev/null
	rerun_as_postgres demo OUTBOX_DEMO_WORK demo.sh "$@"
fi

work=${OUTBOX_DEMO_WORK:-$(mktemp -d /tmp/outbox-demo.XXXXXX)}
tools=$src/test/tools
export PATH="$(pg_config --bindir):$PATH"
export PGHOST=$work PGPORT=$((20000 + RANDOM % 20000)) PGDATABASE=postgres

mock_pid=
kafka=${real:+$work/kafka}
kill_after=mock_pid pg_stop_mode=fast
trap cleanup EXIT

if [ -n "$real" ]; then
	echo "== real Kafka 3.9 cluster (3 KRaft nodes on 127.0.0.1, RF 3, min.insync.replicas 2)"
	brokers=$("$tools/kafka_cluster" start "$work/kafka" --max-seconds 300)
	"$tools/kafka_cluster" topic "$work/kafka" outbox.event.order 3
else
	echo "== mock Kafka cluster (3 brokers on 127.0.0.1)"
	start_mock_kafka --brokers 3 --max-seconds 300
	brokers=$(cat "$work/bootstrap")
fi
echo "   bootstrap: $brokers"

echo "== PostgreSQL with shared_preload_libraries = 'outbox'"
pg_init "$work/data"
pg_conf_local "$work/data"
cat >>"$work/data/postgresql.conf" <<EOF
outbox.brokers = '$brokers'
outbox.inbox_database = 'billing'
EOF
pg_ctl -D "$work/data" -l "$work/postgres.log" -w start >/dev/null

psql -q -X -v ON_ERROR_STOP=1 <<'EOF'
CREATE EXTENSION outbox;
CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL, total numeric NOT NULL);
EOF

echo "== business transactions, each changing an order and emitting its event"
# Two aggregates, transactions interleaved: the second pair runs
# concurrently, each session holding its transaction open for a moment.
psql -q -X -v ON_ERROR_STOP=1 -o /dev/null <<'EOF'
BEGIN;
INSERT INTO orders VALUES ('order-1', 'created', 10);
SELECT outbox_emit('order', 'order-1', 'OrderCreated', '{"total": 10}');
COMMIT;
BEGIN;
INSERT INTO orders VALUES ('order-2', 'created', 25);
SELECT outbox_emit('order', 'order-2', 'OrderCreated', '{"total": 25}',
                   headers => '{"trace_id": "demo-2"}');
COMMIT;
EOF
psql -q -X -v ON_ERROR_STOP=1 -c "BEGIN; UPDATE orders SET status = 'paid' WHERE id = 'order-1';
	SELECT outbox_emit('order', 'order-1', 'OrderPaid', '{\"amount\": 10}'); SELECT pg_sleep(0.3); COMMIT;" >/dev/null &
psql -q -X -v ON_ERROR_STOP=1 -c "BEGIN; UPDATE orders SET status = 'paid' WHERE id = 'order-2';
	SELECT outbox_emit('order', 'order-2', 'OrderPaid', '{\"amount\": 25}'); SELECT pg_sleep(0.1); COMMIT;" >/dev/null &
wait %2 %3 2>/dev/null || wait
psql -q -X -v ON_ERROR_STOP=1 -o /dev/null <<'EOF'
BEGIN;
UPDATE orders SET status = 'shipped' WHERE id = 'order-2';
SELECT outbox_emit('order', 'order-2', 'OrderShipped', '{"carrier": "DHL"}');
COMMIT;
BEGIN;
UPDATE orders SET status = 'cancelled' WHERE id = 'order-1';
SELECT outbox_emit('order', 'order-1', 'OrderCancelled', '{"reason": "demo"}');
ROLLBACK;  -- never happened: no event, no version used
BEGIN;
UPDATE orders SET status = 'shipped' WHERE id = 'order-1';
SELECT outbox_emit('order', 'order-1', 'OrderShipped', '{"carrier": "UPS"}');
COMMIT;
EOF

wait_nothing_pending

echo "== the outbox after publishing (nothing is written per event: progress is per aggregate)"
psql -X -P pager=off -c "SELECT aggregate_id, aggregate_version AS v, event_type, state, txid
	FROM outbox_events ORDER BY id"
psql -X -P pager=off -c "SELECT aggregate_id, last_published_version, last_published_at
	FROM aggregate_publication ORDER BY 1"

echo "== read back from Kafka (topic outbox.event.order)"
psql -X -Atc "SELECT aggregate_id || E'\t' || max(aggregate_version) FROM outbox GROUP BY aggregate_id" >"$work/expect"
"$tools/order_check" --brokers "$brokers" --topic outbox.event.order \
	--expect "$work/expect" --print

# ---- many databases (optional part): one cluster, two services' databases
echo "== a second database, invoicing: the launcher serves every database with the extension"
if [ -n "$real" ]; then "$tools/kafka_cluster" topic "$work/kafka" outbox.event.invoice 3; fi
psql -q -X -v ON_ERROR_STOP=1 -c "CREATE DATABASE invoicing"
psql -q -X -v ON_ERROR_STOP=1 -d invoicing -o /dev/null <<'EOF'
CREATE EXTENSION outbox;
SELECT outbox_emit('invoice', 'invoice-1', 'InvoiceIssued', '{"order": "order-1", "amount": 10}');
SELECT outbox_emit('invoice', 'invoice-1', 'InvoicePaid', '{"amount": 10}');
EOF
wait_nothing_pending -d invoicing
echo "== the cluster's publishers, by database (outbox_workers())"
psql -X -P pager=off -c "SELECT database, worker, pid IS NOT NULL AS running, state FROM outbox_workers() ORDER BY 1, 2"
psql -X -P pager=off -d invoicing -c "SELECT publisher, pending_events FROM outbox_status"
echo "== read back from Kafka (topic outbox.event.invoice)"
printf 'invoice-1\t2\n' >"$work/expect_invoicing"
"$tools/order_check" --brokers "$brokers" --topic outbox.event.invoice \
	--expect "$work/expect_invoicing" --print

# ---------------------------------------------------------------------------
# The consumer half: the inbox worker applies the topic to database
# "billing", exactly once, through a handler that the role billing_app
# subscribed (handlers never run as a superuser).
# ---------------------------------------------------------------------------
echo "== consumer database billing: CREATE EXTENSION, a handler, inbox_subscribe"
createdb billing
psql -q -X -v ON_ERROR_STOP=1 -d billing <<'EOF'
CREATE EXTENSION outbox;
CREATE ROLE billing_app;
CREATE SCHEMA billing AUTHORIZATION billing_app;
GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure) TO billing_app;
SET ROLE billing_app;
CREATE TABLE billing.invoices (order_id text PRIMARY KEY, total numeric, status text,
                               versions bigint[] NOT NULL);
EOF
echo "   as billing_app:"
cat >"$work/consumer.sql" <<'EOF'
CREATE FUNCTION billing.apply_order_event(m inbox_message) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO billing.invoices AS i (order_id, total, status, versions)
    VALUES (m.aggregate_id, (m.payload ->> 'total')::numeric, m.event_type,
            ARRAY[m.aggregate_version])
    ON CONFLICT (order_id) DO UPDATE
       SET status = excluded.status, versions = i.versions || m.aggregate_version
$$;
SELECT inbox_subscribe(consumer => 'billing', topics => ARRAY['outbox.event.order'],
                       handler  => 'billing.apply_order_event(inbox_message)'::regprocedure);
EOF
sed 's/^/   /' "$work/consumer.sql"
psql -q -X -v ON_ERROR_STOP=1 -d billing -o /dev/null -c 'SET ROLE billing_app' -f "$work/consumer.sql"

# What "postgres" committed: per order, its versions in order, each once.
expected=$(psql -X -Atc "SELECT string_agg(aggregate_id || ':' || vs, ' ' ORDER BY aggregate_id)
	FROM (SELECT aggregate_id, array_agg(aggregate_version ORDER BY aggregate_version)::text AS vs
	        FROM outbox GROUP BY 1) a")
applied() {
	psql -X -d billing -Atc "SELECT string_agg(order_id || ':' || versions::text, ' ' ORDER BY order_id)
		FROM billing.invoices"
}
for _ in $(seq 300); do [ "$(applied)" = "$expected" ] && break; sleep 0.1; done

echo "== upstream replay of order-1 (outbox_replay in postgres): dropped as duplicates in billing"
replayed=$(psql -X -Atc "SELECT outbox_replay('order-1', 1)")
for _ in $(seq 100); do
	[ "$(psql -X -d billing -Atc 'SELECT coalesce(sum(duplicates), 0) FROM inbox_status')" -ge "$replayed" ] && break
	sleep 0.1
done
psql -X -d billing -P pager=off -c "SELECT order_id, total, status, versions FROM billing.invoices ORDER BY 1"
psql -X -d billing -P pager=off -c "SELECT consumer, topic, partition, lag, applied, duplicates, state
	FROM inbox_status ORDER BY partition"
if [ "$(applied)" = "$expected" ]; then
	echo "exactly once: each committed event applied once, in version order ($expected); $replayed replayed, none applied again"
else
	echo "NOT exactly once: expected $expected, applied $(applied)" >&2
	exit 1
fi
