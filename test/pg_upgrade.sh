#!/usr/bin/env bash
#
# pg_upgrade of a server with the extension to a later PostgreSQL, with
# Debian's own packages of two releases side by side in a copy-on-write
# overlay of a test/matrix.sh lane's chroot (the cached chroot is left as
# it is), the older release's apt sources added:
#
#   pair   chroot  sources added                        old  new
#   15-17  trixie  bookworm, -updates, -security        15   17   (default)
#   17-18  sid     trixie, -updates, -security          17   18
#
# apt installs postgresql-OLD and postgresql-server-dev-OLD beside the
# chroot's own server; a probe runs pg_upgrade OLD -> NEW on a cluster with
# one plain table (no extension): if that fails, Debian's pair itself cannot
# be upgraded and the run stops there (exit 3, with pg_upgrade's error).
# Else the extension is built and installed for both, and TAP
# test/t/021_pg_upgrade.pl runs with OUTBOX_PG_UPGRADE_FROM=
# /usr/lib/postgresql/OLD (a cluster with the extension in every state,
# pg_upgrade --check and pg_upgrade, then every row, the objects and the
# publishing order checked on the new server).
#
# Usage (as root, after `test/matrix.sh trixie` (or sid) made its chroot):
#   test/pg_upgrade.sh [--keep] [15-17|17-18]
#   --keep  keep the work directory (overlay, logs) afterwards
# Environment: OUTBOX_MATRIX_CACHE (test/matrix.sh's cache), OUTBOX_APT_MIRROR
#   (test/apt_mirror.sh), OUTBOX_PG_UPGRADE_TIMEOUT seconds (default 900).
# The tree tested is the tracked files as they are (git ls-files), or the
# whole tree without .git.  Prints "pg_upgrade: PASS (...)" or "pg_upgrade:
# FAIL (...)"; exits 0 only on PASS.
#
set -uo pipefail
{

keep=
pair=15-17
for a in "$@"; do
	case $a in
		--keep) keep=1 ;;
		15-17 | 17-18) pair=$a ;;
		*) echo "usage: $0 [--keep] [15-17|17-18]" >&2; exit 2 ;;
	esac
done
case $pair in
	15-17) lane=trixie old_suite=bookworm ;;
	17-18) lane=sid old_suite=trixie ;;
esac
old=${pair%-*} new=${pair#*-}
src=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/chroot_lib.sh
. "$src/test/chroot_lib.sh"
require_root pg_upgrade "chroot, mount"
lower=${OUTBOX_MATRIX_CACHE:-/var/cache/outbox-matrix}/$lane
if [ ! -x "$lower/usr/lib/postgresql/$new/bin/pg_ctl" ]; then
	echo "pg_upgrade: no $lane chroot with PostgreSQL $new in $lower: run test/matrix.sh $lane first" >&2
	exit 2
fi
# Private mount namespace: the overlay and the chroot's mounts vanish with it.
enter_private_namespace OUTBOX_PG_UPGRADE "$0" "$@"
budget=${OUTBOX_PG_UPGRADE_TIMEOUT:-900}

say() { echo "== pg_upgrade: $*"; }
fail() { echo "pg_upgrade: FAIL ($1; logs in $work)"; keep=1; exit "${2:-1}"; }

chroot_session pg_upgrade
chroot_mirrors || fail "no mirror"
chroot_overlay "$lower" || fail "cannot mount an overlay of $lower"
{
	echo "deb $mirror $old_suite main"
	echo "deb $mirror $old_suite-updates main"
	[ -n "$security_mirror" ] && echo "deb $security_mirror $old_suite-security main"
} >"$chroot_root/etc/apt/sources.list.d/$old_suite.list"
mkdir "$chroot_root/root/outbox-upgrade"
copy_tree "$src" "$chroot_root/root/outbox-upgrade"

say "$lane ($lower, overlaid) with $old_suite's sources: postgresql-$old beside postgresql-$new"
bounded chroot "$chroot_root" /usr/bin/env -i HOME=/root TERM=dumb DEBIAN_FRONTEND=noninteractive \
	PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin OLD="$old" NEW="$new" bash -c '
		set -e
		cd /root/outbox-upgrade
		bash .ci/install-deps --mock-only $NEW
		# An unstable suite'\''s Release file may be past its Valid-Until on a mirror.
		apt-get -o Acquire::Check-Valid-Until=false update -qq
		apt-get install -y -q --no-install-recommends postgresql-$OLD postgresql-server-dev-$OLD >/tmp/apt-old.log ||
			{ tail -n 30 /tmp/apt-old.log; exit 1; }
		grep -E "^The following packages will be REMOVED" -A3 /tmp/apt-old.log || true
		for v in $OLD $NEW; do
			echo "server: $(/usr/lib/postgresql/$v/bin/postgres --version)"
		done
		bash test/pg_upgrade_probe.sh $OLD $NEW || exit 3
		for v in $OLD $NEW; do
			make -s clean >/dev/null
			make -s PG_CONFIG=/usr/lib/postgresql/$v/bin/pg_config
			make -s PG_CONFIG=/usr/lib/postgresql/$v/bin/pg_config install
			echo "built: $(/usr/lib/postgresql/$v/bin/pg_config --version)"
		done
		export PATH=/usr/lib/postgresql/$NEW/bin:$PATH
		OUTBOX_PG_UPGRADE_FROM=/usr/lib/postgresql/$OLD PROVE_TESTS=test/t/021_pg_upgrade.pl \
			bash test/run_tests.sh tap
	' >"$work/upgrade.log" 2>&1
rc=$?
grep -E '^(server|built|probe):|^== suite|^test/t/|^Files=' "$work/upgrade.log"
if [ "$rc" = 3 ]; then
	fail "Debian's PostgreSQL $old -> $new: pg_upgrade fails on a cluster with one plain table, no extension" 3
fi
[ "$rc" = 0 ] || { tail -n 80 "$work/upgrade.log"; fail "TAP 021 in the chroot"; }
echo "pg_upgrade: PASS (PostgreSQL $old -> $new with the extension: TAP 021," \
	"$(sed -nE 's/^Files=1, Tests=([0-9]+),.*/\1/p' "$work/upgrade.log") assertions; $(($(date +%s) - start)) s)"
exit 0
}
