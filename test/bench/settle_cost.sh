#!/usr/bin/env bash
# Prints what settling costs per event in PostgreSQL alone (no Kafka, no extension), for the
# storage designs compared in docs/architecture.md, on a throwaway cluster:
#   (a) today's: read pending rows by the partial index, UPDATE each row published, UPDATE
#       each aggregate's last_published_version (10 batches of 10,000);
#   (b) snapshot delta (PgQ's batches) by a txid column, settled per aggregate;
#   (c) snapshot delta settled by one horizon row per bucket; and (d) retention's DELETE.
# 100,000 events over 10,000 aggregates, ~160-byte payloads.  Figures only; judges nothing.
# Usage (as root or postgres): bash test/bench/settle_cost.sh [rounds]
set -euo pipefail
ROUNDS=${1:-3}
if [ "$(id -u)" = 0 ]; then
	exec su postgres -c "bash $(readlink -f "$0") $ROUNDS"
fi
BIN=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
[ -x "$BIN/initdb" ] || BIN=/usr/lib/postgresql/15/bin
W=$(mktemp -d /tmp/outbox-settle.XXXXXX)
PORT=${PORT:-5497}
trap '"$BIN/pg_ctl" -D "$W/data" stop -m immediate >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
. "$(dirname "$(readlink -f "$0")")/lib.sh"
PATH=$BIN:$PATH pg_init "$W/data"
"$BIN/pg_ctl" -D "$W/data" -l "$W/log" -w -o "-p $PORT -k $W -c shared_buffers=512MB -c max_wal_size=4GB -c autovacuum=off -c jit=off" start >/dev/null
P() { timeout 300 "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$W" -p "$PORT" postgres "$@"; }

setup() {
	P >/dev/null 2>&1 <<'SQL'
DROP TABLE IF EXISTS ob, ap, horizon;
CREATE TABLE ob (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id text NOT NULL UNIQUE,
 aggregate_type text NOT NULL, aggregate_id text NOT NULL, aggregate_version bigint NOT NULL,
 event_type text NOT NULL, topic text NOT NULL, headers jsonb, payload jsonb, payload_bytes bytea,
 created_at timestamptz NOT NULL DEFAULT clock_timestamp(), published_at timestamptz,
 kafka_partition int, kafka_offset bigint, attempts int NOT NULL DEFAULT 0, last_error text,
 txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
 UNIQUE (aggregate_id, aggregate_version)) WITH (fillfactor = 90);
CREATE INDEX ob_pending ON ob (id) WHERE published_at IS NULL;
CREATE INDEX ob_txid ON ob (txid);
CREATE TABLE ap (aggregate_id text PRIMARY KEY, last_published_version bigint NOT NULL DEFAULT 0,
 updated_at timestamptz) WITH (fillfactor = 70);
CREATE TABLE horizon (bucket int PRIMARY KEY, snap pg_snapshot);
INSERT INTO horizon VALUES (0, pg_current_snapshot());
INSERT INTO ob (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload)
SELECT gen_random_uuid()::text, 'order', 'agg-' || (g % 10000), g / 10000 + 1, 'created', 'orders',
       jsonb_build_object('n', g, 'pad', repeat('x', 100))
FROM generate_series(0, 99999) g;
INSERT INTO ap SELECT DISTINCT aggregate_id FROM ob;
VACUUM ANALYZE ob; VACUUM ANALYZE ap; CHECKPOINT;
SQL
}

# Milliseconds a psql script takes, from psql's own \timing of each statement.
ms() { P -c '\timing on' -f - | awk '/^Time:/ { s += $2 } END { printf "%.0f", s }'; }

# The rows committed since the horizon's snapshot: PgQ's batch.
DELTA="CREATE TEMP TABLE b ON COMMIT DROP AS SELECT id, aggregate_id, aggregate_version, payload, headers FROM ob
  WHERE txid >= pg_snapshot_xmin((SELECT snap FROM horizon)) AND txid < pg_snapshot_xmax(pg_current_snapshot())
    AND pg_visible_in_snapshot(txid, pg_current_snapshot()) AND NOT pg_visible_in_snapshot(txid, (SELECT snap FROM horizon));"
# Each aggregate's last published version, from the rows just read.
PER_AGGREGATE="UPDATE ap SET last_published_version = m.v, updated_at = now()
  FROM (SELECT aggregate_id, max(aggregate_version) v FROM b GROUP BY 1) m WHERE ap.aggregate_id = m.aggregate_id;"
A=(); B=(); C=(); D=()
for r in $(seq "$ROUNDS"); do
	setup
	A+=("$(for i in $(seq 10); do echo "BEGIN;
CREATE TEMP TABLE b ON COMMIT DROP AS SELECT id, aggregate_id, aggregate_version, payload, headers FROM ob
  WHERE published_at IS NULL ORDER BY id LIMIT 10000;
UPDATE ob SET published_at = now(), kafka_partition = 1, kafka_offset = ob.id FROM b WHERE ob.id = b.id;
$PER_AGGREGATE
COMMIT;"; done | ms)")
	setup
	B+=("$(echo "BEGIN;
$DELTA
$PER_AGGREGATE
COMMIT;" | ms)")
	setup
	C+=("$(echo "BEGIN;
$DELTA
UPDATE horizon SET snap = pg_current_snapshot();
COMMIT;" | ms)")
	D+=("$(echo "DELETE FROM ob WHERE id <= 100000;" | ms)")
done
med() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
printf '%-58s %8s %10s\n' "settling 100,000 events (median of $ROUNDS)" "ms" "us/event"
for row in "a today: per-row UPDATE + per-aggregate UPDATE:A" "b snapshot delta, per-aggregate UPDATE:B" \
	"c snapshot delta, one horizon row:C" "d retention: per-row DELETE:D"; do
	label=${row%:*}; arr=${row##*:}
	eval "m=\$(med \"\${$arr[@]}\")"
	printf '%-58s %8s %10.1f\n' "($label)" "$m" "$(echo "$m * 1000 / 100000" | bc -l)"
done
