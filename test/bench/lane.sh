#!/usr/bin/env bash
#
# test/bench/lane.sh LANE [run.sh arguments]
#
# The benchmark on another PostgreSQL major version: run.sh (with the given
# arguments, e.g. "headline") inside test/matrix.sh's cached chroot of LANE,
# with that Debian release's own PostgreSQL and librdkafka:
#
#   lane      PostgreSQL   librdkafka
#   bookworm  15           2.0
#   trixie    17           2.8
#   sid       18           2.14
#
# The chroot (OUTBOX_MATRIX_CACHE, default /var/cache/outbox-matrix/LANE)
# must exist: `test/matrix.sh LANE` makes it.  It is not changed: the run
# works in an overlay over it (packages, the build, the install and the
# clusters all go to the overlay's upper layer, removed at the end), so a
# matrix run and this one do not disturb each other's files, only each
# other's CPU.  In the overlay: the build dependencies (.ci/install-deps
# --mock-only MAJOR), gnuplot and procps, this repository's committed HEAD
# cloned into /opt/outbox, built with that release's pg_config and
# installed; then run.sh as root there (it installs PgQ for the peers, as
# on the host).  The report goes to BENCH_OUT, default
# /tmp/outbox-bench-LANE[-headline][-quick]/.
#
# Usage (as root):
#   bash test/bench/lane.sh trixie headline    # PostgreSQL 17, the headline comparison
#   bash test/bench/lane.sh sid headline       # PostgreSQL 18
#   bash test/bench/lane.sh sid headline quick # a short check that it works
# Environment: BENCH_OUT, BENCH_ROUNDS (as run.sh), OUTBOX_MATRIX_CACHE,
# OUTBOX_BENCH_TIMEOUT (seconds for packages, build and run; default 9000),
# OUTBOX_BENCH_KEEP (set: keep the overlay's work directory).
#
set -euo pipefail

lane=${1:-}
shift || true
case $lane in
	bookworm) major=15 ;;
	trixie) major=17 ;;
	sid) major=18 ;;
	*)
		echo "usage: $0 bookworm|trixie|sid [run.sh arguments]" >&2
		exit 2
		;;
esac
src=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=test/chroot_lib.sh
. "$src/test/chroot_lib.sh"
require_root lane.sh "mount, chroot"
base=${OUTBOX_MATRIX_CACHE:-/var/cache/outbox-matrix}/$lane
if [ ! -x "$base/usr/bin/apt-get" ]; then
	echo "lane.sh: no chroot in $base: make it with test/matrix.sh $lane" >&2
	exit 2
fi
# A private mount namespace: the mounts go with this process.
enter_private_namespace OUTBOX_BENCH "$0" "$lane" "$@"

say() { echo "== lane.sh $lane: $*"; }
suffix=
for a in "$@"; do case $a in headline | quick | real) suffix="$suffix-$a" ;; esac; done
out=${BENCH_OUT:-/tmp/outbox-bench-$lane$suffix}
keep=${OUTBOX_BENCH_KEEP:-}
# $work, /var/tmp/outbox-bench-LANE.XXXXXX: what runs in the overlay is
# stopped, the overlay unmounted (last) and removed on exit.
chroot_session "bench-$lane"
chroot_overlay "$base"
root=$chroot_root
rev=$(git -C "$src" rev-parse --short HEAD)
git clone -q --no-hardlinks "$src" "$root/opt/outbox"
git -C "$root/opt/outbox" checkout -q --detach "$rev"
chmod -R a+rX "$root/opt/outbox"
say "PostgreSQL $major, commit $rev, run.sh $*"

rc=0
timeout --kill-after=30 "${OUTBOX_BENCH_TIMEOUT:-9000}" chroot "$root" /usr/bin/env -i \
	HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	MAJOR="$major" BENCH_GIT_REV="$rev" BENCH_OUT=/opt/bench-out \
	BENCH_ROUNDS="${BENCH_ROUNDS:-}" BENCH_COMMAND="bash test/bench/lane.sh $lane $*" bash -c '
		set -e
		cd /opt/outbox
		bash .ci/install-deps --mock-only "$MAJOR" >/opt/install-deps.log 2>&1 ||
			{ tail -n 30 /opt/install-deps.log; exit 1; }
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			gnuplot-nox procps >>/opt/install-deps.log 2>&1
		export PATH=/usr/lib/postgresql/$MAJOR/bin:$PATH
		echo "build: $(pg_config --version), librdkafka $(dpkg-query -W -f="\${Version}" librdkafka1)"
		make -s clean >/dev/null
		make -s
		make -s install
		bash test/bench/run.sh "$@"
	' lane "$@" || rc=$?
mkdir -p "$out"
cp -r "$root/opt/bench-out/." "$out/" 2>/dev/null || true
if [ "$rc" = 0 ]; then
	say "wrote $out ($(cd "$out" && echo *))"
else
	say "failed (status $rc); whatever the run wrote is in $out"
fi
exit "$rc"
