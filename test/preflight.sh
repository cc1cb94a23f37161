#!/usr/bin/env bash
#
# Checks that everything the given test suites need is there, before any of
# them starts, and names what is missing (with the Debian package that
# brings it) instead of letting a suite fail half-way.  Used by
# test/run_tests.sh and by `make installcheck` / `make prove_installcheck`.
#
# Usage: [PG_CONFIG=...] [PROVE_TESTS=...] test/preflight.sh [--not-root] suite...
#        suites: regress isolation pgtap tools tap
#        --not-root: fail as root (PostgreSQL refuses to run as root)
#        PROVE_TESTS: the TAP files chosen (default: all of test/t); Java and
#        Maven are needed only if one of them runs a real Kafka cluster
# Exit status 0 when all is there, 2 otherwise.
#
set -uo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
not_root=
if [ "${1:-}" = --not-root ]; then
	not_root=1
	shift
fi

missing=()
miss() {	# miss SUITE WHAT
	if [ "$1" = all ]; then missing+=("$2"); else missing+=("suite $1: $2"); fi
}
need_cmd() {	# need_cmd SUITE COMMAND PACKAGE
	command -v "$2" >/dev/null 2>&1 || miss "$1" "command '$2' not found (package $3)"
}
need_file() {	# need_file SUITE PATH WHAT
	[ -e "$2" ] || miss "$1" "$3 ($2 not found)"
}
need_perl() {	# need_perl SUITE MODULE PACKAGE
	command -v perl >/dev/null 2>&1 || return 0	# reported by need_cmd
	perl -M"$2" -e 1 >/dev/null 2>&1 ||
		miss "$1" "Perl module $2 not found (package $3)"
}
need_tools() {	# need_tools SUITE: the test tools (make builds them)
	local t
	for t in mock_kafka order_check gen_events; do
		[ -x "$src/test/tools/$t" ] ||
			miss "$1" "test/tools/$t is not built (run make, which builds test/tools)"
	done
}

pg_config=${PG_CONFIG:-pg_config}
if ! command -v "$pg_config" >/dev/null 2>&1; then
	echo "preflight: $pg_config not found (package postgresql-server-dev-NN; or put the" >&2
	echo "preflight: server's bin directory on PATH); install with: bash .ci/install-deps" >&2
	exit 2
fi
bindir=$("$pg_config" --bindir)
pgxs=$(dirname "$(dirname "$(dirname "$("$pg_config" --pgxs)")")")
sharedir=$("$pg_config" --sharedir)
pkglibdir=$("$pg_config" --pkglibdir)
# The Debian packages are named after the server's major version.
v=$("$pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')

# True if a chosen TAP file runs a real Kafka cluster (test/perl/RealKafka.pm,
# which builds it with Maven); every file when none is chosen.
real_kafka_chosen() {
	local t f
	for t in ${PROVE_TESTS:-$src/test/t/*.pl}; do
		case $t in */*) f=$t ;; *) f=$src/test/t/$t ;; esac
		case $f in /*) ;; *) f=$src/$f ;; esac
		for f in $f; do	# a glob (test/t/2*.pl) matches here
			[ -f "$f" ] && grep -q '^use RealKafka\b' "$f" && return 0
		done
	done
	return 1
}

if [ $# -gt 0 ]; then
	for b in initdb pg_ctl postgres psql; do
		need_file all "$bindir/$b" "PostgreSQL server program $b (package postgresql-$v)"
	done
	need_file all "$pkglibdir/outbox.so" "the extension is not installed (make && make install)"
	need_file all "$sharedir/extension/outbox.control" "the extension is not installed (make && make install)"
fi
for suite in "$@"; do
	case $suite in
		regress)
			need_cmd "$suite" make make
			need_file "$suite" "$pgxs/src/test/regress/pg_regress" "pg_regress (package postgresql-client-$v)"
			;;
		isolation)
			need_cmd "$suite" make make
			need_file "$suite" "$pgxs/src/test/isolation/pg_isolation_regress" \
				"pg_isolation_regress (package postgresql-client-$v)"
			;;
		pgtap)
			need_cmd "$suite" pg_prove libtap-parser-sourcehandler-pgtap-perl
			need_file "$suite" "$sharedir/extension/pgtap.control" "pgTAP (package postgresql-$v-pgtap)"
			need_file "$suite" "$bindir/createdb" "createdb (package postgresql-client-$v)"
			;;
		tools)
			need_cmd "$suite" kcat kcat
			need_cmd "$suite" perl perl
			need_perl "$suite" IPC::Run libipc-run-perl
			need_perl "$suite" Test::More perl
			need_tools "$suite"
			;;
		tap)
			need_cmd "$suite" make make
			need_cmd "$suite" prove perl
			need_cmd "$suite" perl perl
			need_cmd "$suite" kcat kcat
			need_perl "$suite" IPC::Run libipc-run-perl
			need_perl "$suite" Test::More perl
			need_perl "$suite" JSON::PP perl
			need_perl "$suite" Time::HiRes perl
			# Only looked for: loading it creates tmp_check/ in the current directory.
			need_file "$suite" "$pgxs/src/test/perl/PostgreSQL/Test/Cluster.pm" \
				"Perl module PostgreSQL::Test::Cluster (package postgresql-client-$v)"
			need_file "$suite" "$pgxs/src/test/regress/pg_regress" "pg_regress (package postgresql-client-$v)"
			for b in pgbench pg_dump pg_restore; do
				need_file "$suite" "$bindir/$b" "$b (package postgresql-$v)"
			done
			need_tools "$suite"
			# The tests against a real Kafka broker (test/kafka) build it with Maven.
			if [ -f "$src/test/kafka/pom.xml" ] && real_kafka_chosen; then
				need_cmd "$suite" java default-jre-headless
				need_cmd "$suite" mvn maven
			fi
			;;
		*)
			miss "$suite" "unknown suite (suites: regress isolation pgtap tools tap)"
			;;
	esac
done

if [ -n "$not_root" ] && [ "$(id -u)" = 0 ]; then
	missing+=("PostgreSQL refuses to run as root: run this as an ordinary user that owns
  the tree (e.g. chown -R postgres: . && runuser -u postgres -- make installcheck),
  or run make test, which copies the tree and runs every suite as postgres")
fi

if [ "${#missing[@]}" -gt 0 ]; then
	# One line per problem, each once.
	printf '%s\n' "${missing[@]}" | awk '!seen[$0]++ { print "preflight: " $0 }' >&2
	printf '%s\n' "${missing[@]}" | grep -q package &&
		echo "preflight: the packages come with: bash .ci/install-deps" >&2
	echo "preflight: nothing was run" >&2
	exit 2
fi
exit 0
