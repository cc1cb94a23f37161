#!/usr/bin/env bash
#
# Once-off memcheck run of the publisher: a throwaway cluster whose whole
# postmaster runs under valgrind (background workers are forked, never
# exec'd, so the worker cannot be wrapped alone; every backend is under
# valgrind too), a mock Kafka cluster, a few thousand events, an outage, a
# poison event, a reload and a retention pass; then the server is stopped
# and valgrind's per-process logs are scanned for memcheck errors and
# definite leaks with a frame in outbox.so.
#
# The extension is built from this tree (normal flags: PostgreSQL's -g -O2)
# into a private copy of PostgreSQL in $OUTBOX_VALGRIND_ROOT (default
# /tmp/outbox-valgrind), as test/sanitize.sh does, so the system install is
# not touched and what is tested is this tree.  Only initdb runs without
# valgrind.
#
# PostgreSQL is not built with USE_VALGRIND: memcheck sees malloc'ed blocks
# (librdkafka's, and PostgreSQL's memory-context blocks as a whole), not
# individual palloc chunks.
#
# The logs stay in $ROOT/vglogs (vg.PID.log, one per process), the errors
# found in outbox code in $ROOT/outbox-errors.txt.
#
# Result (2 cores, Debian 12, PostgreSQL 15.20, librdkafka 2.0.2, valgrind
# 3.19; commits 1e70c32 and 1b1f2f6 plus work in progress): 3000 events
# (2700 committed) + 200 in an outage + 1 poison + 500 after a reload, all
# published, order_check clean; about 70 s under valgrind, 80 s in all.  No
# memcheck error and no definite leak in outbox code.  Each process reports
# 4 definite leaks of PostgreSQL's own (strdup'ed settings and ps display
# arguments in the postmaster, inherited); without the suppressions below
# the publisher also reports WAL padding written at commit (XLogFlush,
# reached from run_batch), which is PostgreSQL's known, harmless report.
#
# Usage: test/valgrind.sh            (as root: runs the cluster as postgres)
# Environment: OUTBOX_VALGRIND_EVENTS (default 3000), OUTBOX_VALGRIND_ROOT.
# Prints "valgrind: N passed, N failed"; exits non-zero on a memcheck error
# or definite leak in outbox code, or when the events were not published.
#
set -uo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
root=${OUTBOX_VALGRIND_ROOT:-/tmp/outbox-valgrind}
pg_config=${PG_CONFIG:-pg_config}
events=${OUTBOX_VALGRIND_EVENTS:-3000}

tally=valgrind
# shellcheck source=test/private_pg.sh
. "$src/test/private_pg.sh"
refuse_root

# ---------------------------------------------------------------------
# As root (or any user): private PostgreSQL tree and build, then the run
# itself as the postgres user (stage "run").
# ---------------------------------------------------------------------
if [ "${OUTBOX_VALGRIND_STAGE:-}" != run ]; then
	command -v valgrind >/dev/null || die "valgrind is not installed (apt-get install valgrind)"
	lock_root
	t0=$(date +%s)
	private_pg "$pg_config"
	mkdir -p "$root/build"
	tar -C "$src" --exclude=.git -cf - . | tar -C "$root/build" -xf -
	rc=0
	{
		make -C "$root/build" clean &&
		make -C "$root/build" PG_CONFIG="$pg_config" with_llvm=no all &&
		make -C "$root/build" PG_CONFIG="$pg_config" with_llvm=no install DESTDIR="$root"
	} >"$root/build.log" 2>&1 || rc=$?
	[ "$rc" = 0 ] && [ -f "$pkglibdir/outbox.so" ] ||
		{ tail -n 30 "$root/build.log"; die "build failed (log: $root/build.log)"; }
	# A canary with a deliberate invalid read and a jump on uninitialised
	# memory: proves that memcheck runs in the backends and that the scan
	# below finds errors in a library's frames.
	cat >"$root/valgrind_canary.c" <<-'EOF'
		#include "postgres.h"
		#include "fmgr.h"
		#include <stdlib.h>
		PG_MODULE_MAGIC;
		PG_FUNCTION_INFO_V1(canary_invalid_read);
		PG_FUNCTION_INFO_V1(canary_uninit_jump);
		Datum
		canary_invalid_read(PG_FUNCTION_ARGS)
		{
			char	   *volatile p = malloc(8);
			int			c = p[PG_GETARG_INT32(0)];	/* 8: one past the block */
			free(p);
			PG_RETURN_INT32(c);
		}
		Datum
		canary_uninit_jump(PG_FUNCTION_ARGS)
		{
			char	   *volatile p = malloc(8);
			int			r = p[PG_GETARG_INT32(0)] ? 1 : 0;	/* never written */
			free(p);
			PG_RETURN_INT32(r);
		}
	EOF
	gcc -g -O0 -fPIC -shared -I"$("$pg_config" --includedir-server)" \
		-o "$pkglibdir/valgrind_canary.so" "$root/valgrind_canary.c" >>"$root/build.log" 2>&1 ||
		die "canary build failed (log: $root/build.log)"
	check "build (installed in $root)" 0
	rc=0
	if [ "$(id -u)" = 0 ]; then
		chown -R postgres: "$root"
		runuser -u postgres -- env OUTBOX_VALGRIND_STAGE=run OUTBOX_VALGRIND_BINDIR="$bindir" \
			OUTBOX_VALGRIND_ROOT="$root" OUTBOX_VALGRIND_EVENTS="$events" \
			bash "$root/build/test/$(basename "$0")" || rc=$?
	else
		OUTBOX_VALGRIND_STAGE=run OUTBOX_VALGRIND_BINDIR="$bindir" OUTBOX_VALGRIND_ROOT="$root" \
			bash "$root/build/test/$(basename "$0")" || rc=$?
	fi
	echo "== valgrind: took $(($(date +%s) - t0)) s in all"
	exit "$rc"
fi

# ---------------------------------------------------------------------
# Stage "run", as the postgres user.
# ---------------------------------------------------------------------
bindir=$OUTBOX_VALGRIND_BINDIR
tools=$src/test/tools
work=$root/run
vglogs=$root/vglogs
mkdir -p "$work" "$vglogs"
export PATH="$bindir:$PATH"
export PGHOST=$work PGPORT=$((20000 + RANDOM % 20000)) PGDATABASE=postgres

mock_pid=
cleanup() {
	pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
	[ -n "$mock_pid" ] && kill "$mock_pid" 2>/dev/null || true
}
trap cleanup EXIT

sql() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }
wait_published() {	# wait_published TIMEOUT_S
	local t0=$SECONDS
	while [ $((SECONDS - t0)) -lt "$1" ]; do
		[ "$(sql -c 'SELECT count(*) FROM outbox_pending' 2>/dev/null)" = 0 ] && return 0
		sleep 1
	done
	echo "   still pending: $(sql -c 'SELECT count(*) FROM outbox_pending')"
	return 1
}

echo "== mock Kafka cluster (3 brokers on 127.0.0.1)"
"$tools/mock_kafka" --brokers 3 --bootstrap-file "$work/bootstrap" \
	--control-file "$work/control" --max-seconds 3000 >"$work/mock.log" 2>&1 &
mock_pid=$!
for _ in $(seq 100); do [ -s "$work/control" ] && [ -s "$work/bootstrap" ] && break; sleep 0.1; done
brokers=$(cat "$work/bootstrap") || die "mock_kafka did not start"
mockctl() { "$tools/mockctl" "$work/control" "$@" >/dev/null; }

# Suppressions for PostgreSQL's own known, harmless reports: uninitialised
# padding bytes of WAL and relcache-init-file records written out (as in
# PostgreSQL's src/tools/valgrind.supp, which Debian does not ship; the
# functions named there are static, so here the nearest exported caller is
# named).  WAL is flushed at commit, so the first one also hides such bytes
# coming from a tuple that outbox code built: that is the price.
cat >"$root/postgres.supp" <<'EOF'
{
	pg_padding_wal_flush
	Memcheck:Param
	pwrite64(buf)
	...
	fun:XLogFlush
}
{
	pg_padding_wal_background_flush
	Memcheck:Param
	pwrite64(buf)
	...
	fun:XLogBackgroundFlush
}
{
	pg_padding_wal_insert
	Memcheck:Param
	pwrite64(buf)
	...
	fun:XLogInsertRecord
}
{
	pg_padding_relcache_init_file
	Memcheck:Param
	write(buf)
	...
	fun:fwrite
	...
	fun:RelationCacheInitializePhase3
}
{
	pg_padding_stats_file
	Memcheck:Param
	write(buf)
	...
	fun:fwrite
	...
	fun:pgstat_before_server_shutdown
}
EOF

cat >"$root/postgres-under-valgrind" <<EOF
#!/bin/sh
# The postmaster (and so every process it forks) under memcheck.
exec valgrind --tool=memcheck --trace-children=yes --vgdb=no \\
	--num-callers=40 --error-limit=no --track-origins=yes --fullpath-after= \\
	--leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \\
	--suppressions=$root/postgres.supp \\
	--log-file=$vglogs/vg.%p.log \\
	$bindir/postgres "\$@"
EOF
chmod 755 "$root/postgres-under-valgrind"

echo "== initdb (not under valgrind)"
initdb -D "$work/data" -A trust --no-sync -E UTF8 --locale=C >"$work/initdb.log" || die "initdb failed"
cat >>"$work/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$work'
port = $PGPORT
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
outbox.brokers = '$brokers'
outbox.poll_interval = '500ms'
outbox.delivery_timeout = '10s'
outbox.max_attempts = 2
outbox.poison_policy = 'dead_letter'
fsync = off
max_connections = 20
autovacuum = off
log_min_messages = info
EOF

echo "== postmaster under valgrind"
t_start=$SECONDS
pg_ctl -D "$work/data" -l "$work/postgres.log" -p "$root/postgres-under-valgrind" -t 600 -w start >/dev/null ||
	{ tail -n 30 "$work/postgres.log"; die "the server did not start under valgrind"; }
echo "   started in $((SECONDS - t_start)) s"
sql -c 'CREATE EXTENSION outbox' || die "CREATE EXTENSION failed"
sql -c "CREATE FUNCTION canary_invalid_read(int) RETURNS int AS 'valgrind_canary' LANGUAGE C STRICT;
	CREATE FUNCTION canary_uninit_jump(int) RETURNS int AS 'valgrind_canary' LANGUAGE C STRICT;
	SELECT canary_invalid_read(8), canary_uninit_jump(1)" >/dev/null || die "the canary failed"
for _ in $(seq 120); do
	[ "$(sql -c 'SELECT count(*) FROM outbox_workers() WHERE pid IS NOT NULL' 2>/dev/null)" -ge 1 ] 2>/dev/null && break
	sleep 1
done
worker_pids=$(sql -c 'SELECT string_agg(pid::text, $$ $$) FROM outbox_workers() WHERE pid IS NOT NULL')
echo "   publisher pid(s): ${worker_pids:-none}"

# 1. a few thousand events, 100 aggregates, 50 events a transaction, one
# transaction in ten rolled back; headers and explicit event ids on some.
echo "== phase 1: $events events"
t_phase=$SECONDS
sql <<EOF
DO \$\$
DECLARE
	i int;
BEGIN
	FOR i IN 1..$events LOOP
		IF i % 7 = 0 THEN
			PERFORM outbox_emit('vg', 'agg-' || (i % 100), 'Changed', jsonb_build_object('n', i),
								headers => jsonb_build_object('trace_id', 't-' || i));
		ELSE
			PERFORM outbox_emit('vg', 'agg-' || (i % 100), 'Changed', jsonb_build_object('n', i));
		END IF;
		IF i % 50 = 0 THEN
			IF i % 500 = 250 THEN ROLLBACK; ELSE COMMIT; END IF;
		END IF;
	END LOOP;
	COMMIT;
END
\$\$;
EOF
[ $? = 0 ] || die "emitting failed"
rc=0; wait_published 900 || rc=1
check "phase 1: $(sql -c "SELECT count(*) FROM outbox WHERE aggregate_type = 'vg'") events published ($((SECONDS - t_phase)) s)" $rc

# 2. all brokers down with a batch in flight, then back
echo "== phase 2: outage"
t_phase=$SECONDS
mockctl all_down
sql -c "SELECT count(outbox_emit('vg', 'agg-' || (i % 10), 'DuringOutage', jsonb_build_object('n', i)))
	FROM generate_series(1, 200) i" >/dev/null
sleep 15
mockctl all_up
rc=0; wait_published 600 || rc=1
check "phase 2: events emitted during an outage published after it ($((SECONDS - t_phase)) s)" $rc

# 3. a permanent Produce error (MSG_SIZE_TOO_LARGE): after max_attempts the
# event goes to the dead letter topic.
echo "== phase 3: poison event"
t_phase=$SECONDS
mockctl errors 0 10 10
sql -c "SELECT outbox_emit('poison', 'p-1', 'Bad', '{}')" >/dev/null
rc=0; wait_published 600 || rc=1
mockctl clear_errors 0
check "phase 3: poison event handled ($(sql -c "SELECT coalesce(disposition::text, 'none') FROM outbox WHERE aggregate_type = 'poison'"), $((SECONDS - t_phase)) s)" $rc

# 4. reload with new settings (the publisher re-reads them, recreating its
# producer when Kafka settings change), then more events
echo "== phase 4: reload"
t_phase=$SECONDS
cat >>"$work/data/postgresql.conf" <<EOF
outbox.batch_events = 50
outbox.kafka_properties = 'linger.ms=5'
EOF
pg_ctl -D "$work/data" reload >/dev/null
sleep 5
sql -c "SELECT count(outbox_emit('vg', 'agg-' || (i % 100), 'AfterReload', jsonb_build_object('n', i)))
	FROM generate_series(1, 500) i" >/dev/null
rc=0; wait_published 600 || rc=1
check "phase 4: events after a reload published ($((SECONDS - t_phase)) s)" $rc

# The operator views and functions, in a backend (also under valgrind).
sql -c "SELECT count(*) FROM outbox_counters(); SELECT count(*) FROM outbox_latency_histogram();
	SELECT count(*) FROM outbox_workers(); SELECT count(*) FROM outbox_status;
	SELECT count(*) FROM outbox_aggregate_status" >/dev/null
check "operator functions and views answer" $?

# Everything of type vg reached Kafka, complete and in order.
sql -c "SELECT aggregate_id || E'\t' || max(aggregate_version) FROM outbox
	WHERE aggregate_type = 'vg' GROUP BY aggregate_id" >"$work/expect"
out=$("$tools/order_check" --brokers "$brokers" --topic outbox.event.vg --expect "$work/expect" 2>&1)
rc=$?
echo "   $(grep '^order_check: messages=' <<<"$out")"
check "order_check: outbox.event.vg complete and in order" $rc

# 5. retention: published events older than 1 s are deleted by the worker
echo "== phase 5: retention"
t_phase=$SECONDS
echo "outbox.retention = '1s'" >>"$work/data/postgresql.conf"
pg_ctl -D "$work/data" reload >/dev/null
rc=1
for _ in $(seq 300); do
	[ "$(sql -c 'SELECT count(*) FROM outbox')" = 0 ] && { rc=0; break; }
	sleep 1
done
check "phase 5: retention emptied the outbox ($((SECONDS - t_phase)) s)" $rc

echo "== stopping (fast: the publisher exits normally, valgrind checks its leaks)"
t_phase=$SECONDS
pg_ctl -D "$work/data" -m fast -t 600 -w stop >/dev/null
check "server stopped ($((SECONDS - t_phase)) s)" $?
echo "   under valgrind for $((SECONDS - t_start)) s"
kill "$mock_pid" 2>/dev/null
mock_pid=

# ---------------------------------------------------------------------
# The logs, one per process.  An error (or definite leak) is a block from
# "==PID== <what>" to the next "==PID== " line; a block is outbox code's if
# a frame is in outbox.so or in this tree's src/ (valgrind prints full
# source paths with --fullpath-after=).
# ---------------------------------------------------------------------
blocks() {	# blocks REGEX: every block with a line matching REGEX, per file
	local f
	for f in "$vglogs"/vg.*.log; do
		[ -f "$f" ] || continue
		re=$1 awk -v file="$f" '
			/^==[0-9]+== [^ ]/ && !inblock && !/== (Memcheck, a memory|Copyright|Using Valgrind|Command:|Parent PID:|HEAP SUMMARY:|LEAK SUMMARY:|ERROR SUMMARY:|For lists of|For counts of|Reachable blocks|To see them|All heap blocks|Rerun with|Warning:)/ {
				inblock = 1; block = ""; hit = 0
			}
			inblock { block = block $0 "\n"; if ($0 ~ ENVIRON["re"]) hit = 1 }
			inblock && /^==[0-9]+== *$/ {
				if (hit) printf "---- %s\n%s", file, block
				inblock = 0
			}
		' "$f"
	done
}
total_errors=0
for f in "$vglogs"/vg.*.log; do
	n=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$f" | tail -n 1)
	total_errors=$((total_errors + ${n:-0}))
done
blocks 'valgrind_canary' >"$root/canary-errors.txt"
rc=0
grep -q 'Invalid read of size 1' "$root/canary-errors.txt" &&
	grep -q 'Conditional jump or move depends on uninitialised value' "$root/canary-errors.txt" || rc=1
check "the canary's invalid read and uninitialised jump are reported and found" $rc
blocks "outbox\\.so|$root/build/src/[A-Za-z_]+\\.[ch]:" >"$root/outbox-errors.txt"
outbox_blocks=$(grep -c '^---- ' "$root/outbox-errors.txt")
for p in $worker_pids; do
	[ -f "$vglogs/vg.$p.log" ] && echo "   publisher $p: $(grep 'ERROR SUMMARY' "$vglogs/vg.$p.log" | tail -n 1 | sed 's/^==[0-9]*== //')"
done
echo "== valgrind: $(ls "$vglogs" | wc -l) process log(s), $total_errors memcheck error(s) and definite leak(s) in all after suppressions (the canary's included), $outbox_blocks in outbox code"
[ "$outbox_blocks" -gt 0 ] && cat "$root/outbox-errors.txt"
check "no memcheck error or definite leak in outbox code" $((outbox_blocks > 0))
finish
