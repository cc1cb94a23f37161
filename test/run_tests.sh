#!/usr/bin/env bash
#
# Runs every test suite: pg_regress, isolation, pgTAP, the test tools'
# self-test and the end-to-end TAP tests, each against throwaway clusters
# that are torn down at the end.  Expects the extension to be installed
# (make install).  PostgreSQL refuses to run as root, so as root this copies
# the tree to a directory the postgres user owns and runs itself as postgres.
#
# Usage: test/run_tests.sh [suite ...]   suites: regress isolation pgtap tools tap
#        PROVE_TESTS="001_publish.pl 101_brokers_down.pl" runs only those TAP files.
#
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
suites=${*:-regress isolation pgtap tools tap}

if [ "$(id -u)" = 0 ]; then
	work=$(mktemp -d /tmp/outbox-test.XXXXXX)
	mkdir "$work/src"
	tar -C "$src" --exclude=.git -cf - . | tar -C "$work/src" -xf -
	chown -R postgres: "$work"
	rc=0
	runuser -u postgres -- env OUTBOX_TEST_WORK="$work" \
		"$work/src/test/run_tests.sh" $suites || rc=$?
	[ "$rc" = 0 ] && [ -z "${OUTBOX_TEST_KEEP:-}" ] && rm -rf "$work"
	[ "$rc" != 0 ] && echo "test output kept in $work"
	exit "$rc"
fi

work=${OUTBOX_TEST_WORK:-$(mktemp -d /tmp/outbox-test.XXXXXX)}
bindir=$(pg_config --bindir)
pgxs=$(dirname "$(dirname "$(dirname "$(pg_config --pgxs)")")")
export PATH="$bindir:$PATH"
export PGHOST="$work" PGPORT=$((20000 + RANDOM % 20000))

mock_pid=
cleanup() {
	pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
	[ -n "$mock_pid" ] && kill "$mock_pid" 2>/dev/null || true
}
trap cleanup EXIT

passed=0
failed=0
# Every suite must find its tests: an empty suite is a failure, not a pass.
list_tests() {
	local found
	found=$(cd "$1" 2>/dev/null && ls $2 2>/dev/null | sed "s/${3:-}\$//")
	if [ -z "$found" ]; then
		echo "no tests found in $1/$2" >&2
		return 1
	fi
	echo "$found"
}

result() {
	if [ "$2" = 0 ]; then
		passed=$((passed + 1)); echo "== suite $1: ok"
	else
		failed=$((failed + 1)); echo "== suite $1: FAILED"
	fi
}

needs_cluster() {
	[ -d "$work/data" ] && return 0
	# A mock broker so that settings pointing at it are realistic; the
	# shared cluster runs no publisher (outbox.workers = 0): the SQL suites
	# must not depend on one.  Publishing is tested by the TAP suite.
	"$src/test/tools/mock_kafka" --brokers 1 --bootstrap-file "$work/bootstrap" \
		--control-file "$work/control" --max-seconds 3600 >"$work/mock.log" 2>&1 &
	mock_pid=$!
	initdb -D "$work/data" -A trust --no-sync -E UTF8 --locale=C >"$work/initdb.log"
	cat >>"$work/data/postgresql.conf" <<-EOF
		listen_addresses = ''
		unix_socket_directories = '$work'
		port = $PGPORT
		shared_preload_libraries = 'outbox'
		outbox.workers = 0
		fsync = off
		max_connections = 50
		max_prepared_transactions = 10
	EOF
	pg_ctl -D "$work/data" -l "$work/postgres.log" -w start >/dev/null
}

for suite in $suites; do
	case $suite in
		regress)
			needs_cluster
			rc=0
			tests=$(list_tests "$src/test/sql" '[0-9]*.sql' '\.sql') &&
			"$pgxs/src/test/regress/pg_regress" --inputdir="$src/test" \
				--outputdir="$work/regress" --bindir="$bindir" \
				--dbname=contrib_regression $tests || rc=$?
			[ "$rc" != 0 ] && cat "$work/regress/regression.diffs" 2>/dev/null | head -200
			result regress $rc
			;;
		isolation)
			needs_cluster
			rc=0
			tests=$(list_tests "$src/test/isolation/specs" '*.spec' '\.spec') &&
			"$pgxs/src/test/isolation/pg_isolation_regress" \
				--inputdir="$src/test/isolation" --outputdir="$work/isolation" \
				--bindir="$bindir" --dbname=isolation_regression $tests || rc=$?
			[ "$rc" != 0 ] && cat "$work/isolation/regression.diffs" 2>/dev/null | head -200
			result isolation $rc
			;;
		pgtap)
			needs_cluster
			rc=0
			dropdb --if-exists outbox_pgtap >/dev/null
			createdb outbox_pgtap
			psql -q -X -d outbox_pgtap -c 'CREATE EXTENSION pgtap' >/dev/null
			tests=$(list_tests "$src/test/pgtap" '*.sql') &&
			(cd "$src/test/pgtap" && pg_prove -d outbox_pgtap $tests) || rc=$?
			result pgtap $rc
			;;
		tools)
			rc=0
			bash "$src/test/tools/selftest.sh" || rc=$?
			result tools $rc
			;;
		tap)
			rc=0
			mkdir -p "$work/tap"
			tests=${PROVE_TESTS:-$(list_tests "$src/test/t" '*.pl')} &&
			(cd "$work/tap" && TESTDIR="$work/tap" PG_REGRESS="$pgxs/src/test/regress/pg_regress" \
				OUTBOX_SRC="$src" \
				prove -I "$pgxs/src/test/perl" -I "$src/test/perl" \
				$(for t in $tests; do echo "$src/test/t/$t"; done)) || rc=$?
			# The fault scenarios' figures (events, duplicates, gaps, ...).
			grep -ho 'FIGURES .*' "$work"/tap/tmp_check/log/regress_log_* 2>/dev/null || true
			if [ "$rc" != 0 ]; then
				for f in "$work"/tap/tmp_check/log/*; do
					echo "---- $f"; tail -n 60 "$f"
				done
			fi
			result tap $rc
			;;
		*)
			echo "unknown suite $suite" >&2; exit 2 ;;
	esac
done

echo "suites: $passed passed, $failed failed"
[ "$failed" = 0 ]
