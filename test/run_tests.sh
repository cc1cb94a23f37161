#!/usr/bin/env bash
#
# Runs every test suite: pg_regress, isolation, pgTAP, the test tools'
# self-test and the end-to-end TAP tests, each against throwaway clusters
# that are torn down at the end.  Expects the extension to be installed
# (make install).  PostgreSQL refuses to run as root, so as root this copies
# the tree to a directory the postgres user owns and runs itself as postgres.
#
# The regression, isolation and TAP suites run through PGXS (make
# installcheck with the suite's variables, make prove_installcheck), each
# regression and isolation run on its own temporary instance; pgTAP and the
# tools' self-test run here.  Before any suite starts, test/preflight.sh
# checks that every tool the requested suites call is installed and stops
# at once naming what is missing.
#
# Usage: test/run_tests.sh [suite ...]   suites: regress isolation pgtap tools tap
#        PROVE_TESTS="001_publish.pl test/t/101_*.pl" runs only those TAP files
#        (names in test/t, or paths from the top of the tree).
#
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
suites=${*:-regress isolation pgtap tools tap}

"$src/test/preflight.sh" $suites || exit 2

if [ "$(id -u)" = 0 ]; then
	if ! id postgres >/dev/null 2>&1 || ! command -v runuser >/dev/null; then
		echo "run_tests: PostgreSQL refuses to run as root, and there is no postgres user" \
			"(package postgresql-NN) or no runuser (package util-linux) to run as" >&2
		exit 2
	fi
	work=$(mktemp -d /tmp/outbox-test.XXXXXX)
	mkdir "$work/src"
	tar -C "$src" --exclude=.git -cf - . | tar -C "$work/src" -xf -
	chown -R postgres: "$work"
	rc=0
	# From a directory postgres may enter (the tree may be under /root).
	(cd "$work" && runuser -u postgres -- env OUTBOX_TEST_WORK="$work" \
		"$work/src/test/run_tests.sh" $suites) || rc=$?
	[ "$rc" = 0 ] && [ -z "${OUTBOX_TEST_KEEP:-}" ] && rm -rf "$work"
	[ "$rc" != 0 ] && echo "test output kept in $work"
	exit "$rc"
fi

work=${OUTBOX_TEST_WORK:-$(mktemp -d /tmp/outbox-test.XXXXXX)}
bindir=$(pg_config --bindir)
export PATH="$bindir:$PATH"
export PGHOST="$work" PGPORT=$((20000 + RANDOM % 20000))

cleanup() {
	pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
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

# installcheck_suite SUITE VAR DIR GLOB SUFFIX DIFFS: `make installcheck`
# with VAR (REGRESS or ISOLATION) the tests of DIR matching GLOB (the other
# kinds empty), DIFFS shown on failure.
installcheck_suite() {
	local rc=0 tests
	local -A kinds=([REGRESS]= [ISOLATION]=)
	tests=$(list_tests "$3" "$4" "$5") || rc=$?
	if [ "$rc" = 0 ]; then
		kinds[$2]=$(echo $tests)
		make -s -C "$src" installcheck REGRESS="${kinds[REGRESS]}" \
			ISOLATION="${kinds[ISOLATION]}" TAP_TESTS= || rc=$?
	fi
	[ "$rc" != 0 ] && cat "$6" 2>/dev/null | head -200
	result "$1" $rc
}

needs_cluster() {
	[ -d "$work/data" ] && return 0
	# The pgTAP cluster, set up as make installcheck's temporary instances
	# are (test/outbox_regress.conf): no publisher runs, pgTAP must not
	# depend on one.  Publishing is tested by the TAP suite.
	initdb -D "$work/data" -A trust --no-sync -E UTF8 --locale=C >"$work/initdb.log"
	cat >>"$work/data/postgresql.conf" <<-EOF
		listen_addresses = ''
		unix_socket_directories = '$work'
		port = $PGPORT
		fsync = off
		max_connections = 50
	EOF
	cat "$src/test/outbox_regress.conf" >>"$work/data/postgresql.conf"
	pg_ctl -D "$work/data" -l "$work/postgres.log" -w start >/dev/null
}

for suite in $suites; do
	case $suite in
		regress)
			installcheck_suite regress REGRESS "$src/test/sql" '[0-9]*.sql' '\.sql' \
				"$src/regression.diffs"
			;;
		isolation)
			installcheck_suite isolation ISOLATION "$src/test/isolation/specs" '*.spec' '\.spec' \
				"$src/output_iso/regression.diffs"
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
			tests=${PROVE_TESTS:-$(list_tests "$src/test/t" '*.pl')} &&
			tests=$(for t in $tests; do case $t in */*) echo "$t" ;; *) echo "test/t/$t" ;; esac; done) &&
			make -s -C "$src" prove_installcheck PROVE_TESTS="$(echo $tests)" || rc=$?
			# The fault scenarios' figures (events, duplicates, gaps, ...).
			grep -ho 'FIGURES .*' "$src"/tmp_check/log/regress_log_* 2>/dev/null || true
			if [ "$rc" != 0 ]; then
				for f in "$src"/tmp_check/log/*; do
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
