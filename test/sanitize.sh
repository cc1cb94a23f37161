#!/usr/bin/env bash
#
# Runs the test suites with the extension (and the Kafka test tools) built
# with -fsanitize=address,undefined, against a private copy of the system
# PostgreSQL, so the system install (make install) is left untouched.
#
#   1. copies $(pg_config --bindir)/.. and $(pg_config --sharedir) into
#      $OUTBOX_SANITIZE_ROOT (default /tmp/outbox-asan) at the same relative
#      places: Debian's binaries find lib/ and share/ relative to themselves,
#      so the copied bin/ uses the copied lib/ and share/ only;
#   2. builds the extension in a scratch copy of this tree with the
#      sanitizer flags and installs it there (make install DESTDIR=...);
#      builds test/tools there with the same flags;
#   3. replaces the copied bin/postgres by a wrapper that starts the real
#      binary with LD_PRELOAD of the ASan and UBSan runtimes (PostgreSQL
#      itself is not instrumented; the ASan runtime must come first in the
#      library list) and with ASAN_OPTIONS/UBSAN_OPTIONS: ASan writes its
#      reports to $ROOT/logs/asan.PID; UBSan, next to ASan, ignores
#      log_path and writes to stderr, i.e. the server logs;
#   4. preflight: a canary library with a deliberate heap overflow and a
#      deliberate signed overflow, loaded into the wrapped server, must be
#      caught and logged (proves the runtime, options, log files and the
#      scan below work), and a backend must have libasan and the
#      instrumented outbox.so mapped;
#   5. runs test/run_tests.sh (unchanged) of a copy of the scratch tree as
#      the postgres user, with PATH pointing to the copied bin/ (so it uses
#      the copied pg_config, pg_regress, pgxs Perl modules and postgres
#      wrapper, and the sanitized tools), in $ROOT/run;
#   6. copies every UBSan/ASan report found in the logs under $ROOT/run to
#      $ROOT/logs, and scans $ROOT/logs: any report with a frame in
#      outbox.so, in the extension's sources or in test/tools fails the run.
#
# Leak detection is off: PostgreSQL allocates without freeing by design.
# Only code compiled with the flags is instrumented: outbox.so and the
# tools.  Memory that PostgreSQL hands out with palloc is inside malloc'ed
# blocks, so an overrun of a palloc'd chunk is seen only at a block's end;
# overruns of malloc'ed memory (librdkafka's, strdup's) and of stack and
# global objects in outbox code are seen, and so is undefined behaviour.
#
# About 90 s for every suite with the TAP tests 001-005, 4.5 min with the
# fault tests 101-108 (2 cores).
#
# Usage: test/sanitize.sh [suite ...]   (suites as for test/run_tests.sh;
#        default: regress isolation pgtap tools tap)
# Environment: OUTBOX_SANITIZE_ROOT (work directory, wiped and re-created;
#        kept afterwards for the logs), PG_CONFIG (default pg_config),
#        OUTBOX_SANITIZE_CFLAGS (more flags for the extension, e.g. -fno-wrapv).
# Prints "sanitize: N passed, N failed" and exits non-zero on any failure.
#
set -uo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
suites=${*:-regress isolation pgtap tools tap}
root=${OUTBOX_SANITIZE_ROOT:-/tmp/outbox-asan}
pg_config=${PG_CONFIG:-pg_config}
san_flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
# PostgreSQL's CFLAGS (and so PGXS's) have -fwrapv: signed overflow is
# defined there and UBSan does not check it.  OUTBOX_SANITIZE_CFLAGS=-fno-wrapv
# checks it anyway (the production build wraps).
extra_cflags=${OUTBOX_SANITIZE_CFLAGS:-}

tally=sanitize
# shellcheck source=test/private_pg.sh
. "$src/test/private_pg.sh"
refuse_root
as_pg() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

lock_root

t_start=$(date +%s)

# ---------------------------------------------------------------------
# 1. private PostgreSQL tree
# ---------------------------------------------------------------------
private_pg "$pg_config"
mkdir -p "$root/logs"

# ---------------------------------------------------------------------
# 2. sanitized build of the extension and the tools
# ---------------------------------------------------------------------
build=$root/build
mkdir -p "$build"
tar -C "$src" --exclude=.git -cf - . | tar -C "$build" -xf -
make -s -C "$build" clean >/dev/null 2>&1
rc=0
{
	# with_llvm=no: no bitcode for JIT inlining (it would be built by clang
	# without the sanitizer flags anyway).
	make -C "$build" PG_CONFIG="$pg_config" with_llvm=no \
		PG_CFLAGS="$san_flags -g $extra_cflags" PG_LDFLAGS="$san_flags" all &&
	make -C "$build" PG_CONFIG="$pg_config" with_llvm=no \
		PG_CFLAGS="$san_flags -g $extra_cflags" PG_LDFLAGS="$san_flags" install DESTDIR="$root" &&
	make -C "$build/test/tools" clean &&
	make -C "$build/test/tools" CFLAGS="-O1 -g $san_flags" LDFLAGS="$san_flags"
} >"$root/build.log" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then
	tail -n 40 "$root/build.log"
	die "sanitized build failed (log: $root/build.log)"
fi
if ! [ -f "$pkglibdir/outbox.so" ] || ! nm -D "$pkglibdir/outbox.so" | grep __asan_report >/dev/null ||
	! nm -D "$pkglibdir/outbox.so" | grep __ubsan_handle >/dev/null ||
	! [ -f "$sharedir/extension/outbox.control" ]; then
	die "the instrumented outbox.so or outbox.control is not where the copied pg_config looks"
fi
for t in mock_kafka order_check gen_events; do
	nm "$build/test/tools/$t" | grep __asan_init >/dev/null || die "test/tools/$t is not instrumented"
done
check "build (outbox.so and test tools instrumented, installed in $root)" 0

# ---------------------------------------------------------------------
# 3. postgres wrapper
# ---------------------------------------------------------------------
asan_rt=$(gcc -print-file-name=libasan.so)
asan_rt=$(readlink -f "$asan_rt")
[ -f "$asan_rt" ] || die "ASan runtime not found (gcc -print-file-name=libasan.so)"
symbolizer=$(command -v llvm-symbolizer || true)
asan_opts="detect_leaks=0:abort_on_error=1"
[ -n "$symbolizer" ] && asan_opts="$asan_opts:external_symbolizer_path=$symbolizer"
ubsan_opts="print_stacktrace=1:halt_on_error=1:abort_on_error=1"
# With the runtime preloaded (not linked into the executable), ASan
# initialises lazily, at the first malloc: in Debian's postgres that is in
# libgpg-error's constructor, inside bindtextdomain() with glibc's
# _nl_state_lock held.  ASan's start-up then looks up swift_demangle with
# dlsym(), and dlerror() formats the failure with dcgettext(), which takes
# the same lock: its state is corrupted and the process hangs later in
# PostgreSQL's own bindtextdomain() (even "postgres -V" never returns).
# A global no-op swift_demangle makes the lookup succeed, so no message is
# formatted.  It is only ever called for Swift names ("_T...", "$s...").
#
# UBSan, whose runtime is loaded next to ASan's, reads UBSAN_OPTIONS at its
# first report, from /proc/self/environ: PostgreSQL has written its process
# title over that memory by then, so the options would be lost.  The same
# library gives UBSan its options from the environment proper, through the
# runtime's __ubsan_default_options() hook.  (UBSan ignores log_path next
# to ASan: its reports go to stderr, i.e. the server log.)
cat >"$root/asan_preload_fix.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

char	   *swift_demangle(const char *name, size_t len, char *out, size_t *outlen, uint32_t flags);
const char *__ubsan_default_options(void);

char *
swift_demangle(const char *name, size_t len, char *out, size_t *outlen, uint32_t flags)
{
	return NULL;
}

const char *
__ubsan_default_options(void)
{
	const char *options = getenv("UBSAN_OPTIONS");

	return options ? options : "";
}
EOF
gcc -O2 -fPIC -shared -o "$root/asan_preload_fix.so" "$root/asan_preload_fix.c" ||
	die "cannot build $root/asan_preload_fix.so"
# UBSan's runtime is preloaded too (loaded with outbox.so in a backend it
# would start too late), after the hooks above so that they are found first.
ubsan_rt=$(readlink -f "$(gcc -print-file-name=libubsan.so)")
[ -f "$ubsan_rt" ] || die "UBSan runtime not found (gcc -print-file-name=libubsan.so)"
preload="$asan_rt:$root/asan_preload_fix.so:$ubsan_rt"
timeout 30 env LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 "$bindir/postgres" -V >/dev/null ||
	die "postgres -V with the ASan runtime preloaded fails or hangs"
mv "$bindir/postgres" "$bindir/postgres.bin"
# The wrapper passes its own path as argv[0]: postgres derives its
# my_exec_path from it and records that in postmaster.opts, which
# "pg_ctl restart" runs again (the TAP tests restart nodes).
cat >"$bindir/postgres" <<EOF
#!/bin/bash
# test/sanitize.sh: the real postgres with the sanitizer runtimes preloaded
# (the instrumented outbox.so needs them; ASan's must come first).  ASan
# reports go to \${OUTBOX_SANITIZE_LOG:-$root/logs}/asan.PID, UBSan's to
# stderr (the server log).
log=\${OUTBOX_SANITIZE_LOG:-$root/logs}
LD_PRELOAD="$preload\${LD_PRELOAD:+:\$LD_PRELOAD}"
ASAN_OPTIONS="$asan_opts:log_path=\$log/asan"
UBSAN_OPTIONS="$ubsan_opts:log_path=\$log/ubsan"
export LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS
echo "\$\$ \$*" >>"$root/postgres-starts.log"
exec -a "\$0" "$bindir/postgres.bin" "\$@"
EOF
chmod 755 "$bindir/postgres"
: >"$root/postgres-starts.log"
chmod 666 "$root/postgres-starts.log"
# The instrumented tools are started by the tests directly.
export ASAN_OPTIONS="$asan_opts:log_path=$root/logs/asan"
export UBSAN_OPTIONS="$ubsan_opts:log_path=$root/logs/ubsan"
[ "$(id -u)" = 0 ] && chown -R postgres: "$root/logs"
chmod 1777 "$root/logs"

# extract_reports OUTDIR LOGFILE...: copies each sanitizer report found in
# stderr logs to OUTDIR/stderr.N.  A UBSan report is its "runtime error:"
# line and the stack lines after it; an ASan report that went to stderr
# (it should not) is taken from its ==PID== line to ==PID==ABORTING.
extract_reports() {
	local out=$1
	shift
	awk -v out="$out" '
		function start() { n++; file = sprintf("%s/stderr.%d", out, n); inrep = 1;
			print "(from " FILENAME ")" > file }
		inrep == 1 && /^ +#[0-9]+ / { print > file; next }
		inrep == 1 && /^$/ && ubsan { next }
		inrep == 1 && ubsan { close(file); inrep = 0; ubsan = 0 }
		inrep == 2 { print > file; if (/==[0-9]+==ABORTING/) { close(file); inrep = 0 } next }
		/runtime error: / { start(); ubsan = 1; print > file; next }
		/==[0-9]+==ERROR: (Address|Undefined|Leak)Sanitizer/ { start(); inrep = 2; print > file; next }
	' "$@" 2>/dev/null
	return 0
}

# ---------------------------------------------------------------------
# 4. preflight: the set-up catches and logs errors
# ---------------------------------------------------------------------
pre=$root/preflight
mkdir -p "$pre/logs"
cat >"$pre/sanitize_canary.c" <<'EOF'
/* Deliberate errors, to prove that the sanitizers are active in the server. */
#include "postgres.h"
#include "fmgr.h"
#include <stdlib.h>

PG_MODULE_MAGIC;
PG_FUNCTION_INFO_V1(canary_heap_overflow);
PG_FUNCTION_INFO_V1(canary_int_overflow);

Datum
canary_heap_overflow(PG_FUNCTION_ARGS)
{
	int			i = PG_GETARG_INT32(0);
	char	   *volatile p = malloc(8);
	char		c = p[i];		/* i = 8: heap-buffer-overflow */

	free(p);
	PG_RETURN_INT32(c);
}

Datum
canary_int_overflow(PG_FUNCTION_ARGS)
{
	int			i = PG_GETARG_INT32(0);

	PG_RETURN_INT32(i + 2147483647);	/* i = 1: signed integer overflow */
}
EOF
rc=0
gcc -fPIC -shared -O1 -g $san_flags -I"$("$pg_config" --includedir-server)" \
	-o "$pkglibdir/sanitize_canary.so" "$pre/sanitize_canary.c" >"$pre/build.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || { cat "$pre/build.log"; die "canary build failed"; }
[ "$(id -u)" = 0 ] && chown -R postgres: "$pre"
port=$((20000 + RANDOM % 20000))
preflight_sql() {
	as_pg env PATH="$bindir:$PATH" psql -X -q -At -h "$pre" -p "$port" -d postgres "$@"
}
rc=0
(
	set -e
	as_pg env PATH="$bindir:$PATH" OUTBOX_SANITIZE_LOG="$pre/logs" \
		timeout 300 initdb -D "$pre/data" -A trust --no-sync -E UTF8 --locale=C >"$pre/initdb.log"
	cat >>"$pre/data/postgresql.conf" <<-EOF
		listen_addresses = ''
		unix_socket_directories = '$pre'
		port = $port
		shared_preload_libraries = 'outbox'
		outbox.workers = 0
		fsync = off
		restart_after_crash = on
	EOF
	as_pg env PATH="$bindir:$PATH" OUTBOX_SANITIZE_LOG="$pre/logs" \
		pg_ctl -D "$pre/data" -l "$pre/postgres.log" -w start >/dev/null
) || rc=$?
if [ "$rc" != 0 ]; then
	tail -n 30 "$pre/initdb.log" "$pre/postgres.log" 2>/dev/null
	cat "$pre"/logs/* 2>/dev/null | head -50
	die "preflight server did not start"
fi
stop_preflight() {
	as_pg env PATH="$bindir:$PATH" pg_ctl -D "$pre/data" -m immediate stop >/dev/null 2>&1
}
trap stop_preflight EXIT
preflight_sql -c "CREATE FUNCTION canary_heap_overflow(int) RETURNS int AS 'sanitize_canary' LANGUAGE C STRICT;
	CREATE FUNCTION canary_int_overflow(int) RETURNS int AS 'sanitize_canary' LANGUAGE C STRICT;
	CREATE EXTENSION outbox;"
maps=$(preflight_sql -c "SELECT pg_read_file('/proc/' || pg_backend_pid() || '/maps')")
rc=0
grep -q " $asan_rt" <<<"$maps" && grep -q " $ubsan_rt" <<<"$maps" &&
	grep -q " $pkglibdir/outbox.so" <<<"$maps" || rc=1
check "preflight: a backend has the ASan and UBSan runtimes and the instrumented outbox.so mapped" $rc

preflight_canary() {	# NAME SQL PATTERN FRAME
	local f rc=1
	preflight_sql -c "$2" >/dev/null 2>&1 && { check "preflight: $1 (query did not fail)" 1; return; }
	for _ in $(seq 100); do		# wait for the crash restart
		preflight_sql -c 'SELECT 1' >/dev/null 2>&1 && break
		sleep 0.1
	done
	extract_reports "$pre/logs" "$pre/postgres.log"
	for f in "$pre"/logs/*; do
		[ -f "$f" ] && grep -q "$3" "$f" && grep -Eq "#[0-9]+ .* in $4 " "$f" && rc=0
	done
	check "preflight: $1" $rc
}
preflight_canary "ASan reports a heap overflow in an extension, with its stack" \
	'SELECT canary_heap_overflow(8)' 'ERROR: AddressSanitizer: heap-buffer-overflow' canary_heap_overflow
preflight_canary "UBSan reports a signed overflow in an extension, with its stack" \
	'SELECT canary_int_overflow(1)' 'runtime error: signed integer overflow' canary_int_overflow
stop_preflight
trap - EXIT
rm -f "$pkglibdir/sanitize_canary.so"

# ---------------------------------------------------------------------
# 5. the suites
# ---------------------------------------------------------------------
echo "== sanitize: test/run_tests.sh $suites (PATH=$bindir:...)"
t_suites=$(date +%s)
# run_tests.sh runs as the postgres user in a work directory of ours
# (OUTBOX_TEST_WORK), which it leaves in place: the server, TAP and mock
# logs are scanned below.  Its own root branch is not used: it would work
# in /tmp/outbox-test.*, and copy the tree once more.
run=$root/run
mkdir -p "$run/src"
tar -C "$build" -cf - . | tar -C "$run/src" -xf -
[ "$(id -u)" = 0 ] && chown -R postgres: "$run"
rc=0
as_pg env PATH="$bindir:$PATH" OUTBOX_TEST_WORK="$run" \
	"$run/src/test/run_tests.sh" $suites 2>&1 | tee "$root/run_tests.log" || rc=$?
echo "== sanitize: suites took $(($(date +%s) - t_suites)) s (exit $rc)"
echo "== sanitize: $(grep -c -- ' -D ' "$root/postgres-starts.log") postmaster start(s) through the wrapper (all starts: $root/postgres-starts.log)"
for suite in $suites; do
	if grep -q "^== suite $suite: ok" "$root/run_tests.log"; then
		check "suite $suite" 0
	else
		check "suite $suite" 1
	fi
done

# ---------------------------------------------------------------------
# 6. scan the reports
# ---------------------------------------------------------------------
# Frames in project code: the extension (outbox.so; its sources, as
# $build/src/x.c in stacks and src/x.c in UBSan's first line) and the test
# tools (test/tools/x.c, or x.c in UBSan's first line).
ours='outbox\.so|(^|[ /])src/[a-z_]+\.[ch]:[0-9]|test/tools/[a-z_]+(\.c|\+0x|:)|/(mock_kafka|order_check|gen_events)\+0x|(^|[ /])(mock_kafka|order_check|gen_events)\.c:[0-9]'
if [ -d "$root/run" ]; then
	mapfile -d '' logs < <(find "$root/run" -name '*.log' -type f -print0)
	[ "${#logs[@]}" -gt 0 ] && extract_reports "$root/logs" "${logs[@]}"
	echo "== sanitize: scanned ${#logs[@]} server/test log(s) under $root/run for UBSan output"
else
	echo "== sanitize: run_tests.sh's work directory not found: UBSan output (stderr) not scanned"
	failed=$((failed + 1))
fi
reports=0
outbox_reports=0
for f in "$root"/logs/*; do
	[ -f "$f" ] || continue
	reports=$((reports + 1))
	if grep -Eq "$ours" "$f"; then
		outbox_reports=$((outbox_reports + 1))
		echo "---- $f (in outbox code):"
		cat "$f"
	else
		echo "---- $f (no frame in outbox code):"
		head -n 40 "$f"
	fi
done
echo "== sanitize: $reports sanitizer log file(s), $outbox_reports with frames in outbox code"
check "no ASan/UBSan report in outbox code" $((outbox_reports > 0))
echo "== sanitize: took $(($(date +%s) - t_start)) s in all"
finish
