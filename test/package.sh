#!/usr/bin/env bash
#
# The Debian package, built and installed as a user installs it: builds
# postgresql-15-outbox_*.deb from this tree with `dpkg-buildpackage -us -uc
# -b` (debian/, pg_buildext), checks it with lintian (no error) -- both
# test/deb_build.sh --, then on a brand-new Debian 12 (a `debootstrap
# --variant=minbase bookworm` chroot, test/chroot_lib.sh) test/deb_check.sh
# installs it with `apt-get install ./<deb>` (apt fetches PostgreSQL 15 and
# librdkafka from the mirror the host uses), starts a new cluster, as
# postgres, with shared_preload_libraries = 'outbox', runs CREATE EXTENSION
# outbox, emits
# an event and sees the launcher start a publisher for the database; and
# creates the oldest version the package ships and updates it to the
# default one (ALTER EXTENSION outbox UPDATE).
#
# Usage (as root): test/package.sh [--keep]
#   --keep  keep the build directory and the chroot afterwards
# Environment: OUTBOX_FRESH_CACHE, OUTBOX_FRESH_MIRROR (test/chroot_lib.sh);
#   OUTBOX_PACKAGE_TIMEOUT  seconds for the whole run (default 1200)
#
# The build tools (debhelper, postgresql-server-dev-all, lintian,
# debootstrap) are installed on the host if missing: they build and check
# the package, the package itself needs none of them.  The tree built is the
# tracked files as they are (git ls-files), or the whole tree without .git.
# Prints "package: PASS (...)" or "package: FAIL (...)"; exits 0 only on PASS.
#
set -uo pipefail
{

src=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/chroot_lib.sh
. "$src/test/chroot_lib.sh"
keep=
parse_flags "$0 [--keep]" --keep -- "$@"
require_root package "apt-get, debootstrap, chroot, mount"
enter_private_namespace OUTBOX_PACKAGE "$0" "$@"
budget=${OUTBOX_PACKAGE_TIMEOUT:-1200}

say() { echo "== package: $*"; }
fail() { echo "package: FAIL ($*; logs in $work)"; keep=1; exit 1; }

chroot_session package

# ---------------------------------------------------------------- build
# test/deb_build.sh installs the build tools it misses; chroot_new debootstrap.

mkdir "$work/build" "$work/build/outbox"
copy_tree "$src" "$work/build/outbox"
say "dpkg-buildpackage -us -uc -b, lintian (test/deb_build.sh)"
bounded bash "$src/test/deb_build.sh" "$work/build/outbox" || fail "the build or lintian"
deb=$(cd "$work/build" && ls postgresql-15-outbox_*_*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || fail "no postgresql-15-outbox_*.deb built"

# ---------------------------------------------------------------- install
chroot_new "$work" || fail "chroot"
chroot_mount || fail "mounts"
cp "$work/build/$deb" "$chroot_root/tmp/"
cp "$src/test/deb_check.sh" "$chroot_root/tmp/"
say "apt-get install ./$deb in the chroot, CREATE EXTENSION (test/deb_check.sh)"
bounded chroot "$chroot_root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
	PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	bash /tmp/deb_check.sh "/tmp/$deb" >"$work/check.log" 2>&1
rc=$?
cat "$work/check.log"
[ "$rc" = 0 ] || fail "the package in the chroot"
echo "package: PASS ($deb built, lintian clean, installed with apt on Debian 12 minbase, CREATE EXTENSION outbox with the library preloaded, the oldest version shipped updated to the default; $(($(date +%s) - start)) s)"
exit 0
}
