#!/usr/bin/env bash
#
# Builds the Debian packages of a clean copy of this tree as the PostgreSQL
# team builds extensions: `pg_buildext updatecontrol` (debian/control from
# debian/control.in, one postgresql-NN-outbox per server version of
# debian/pgversions that this distribution's postgresql-server-dev-all
# supports), `dpkg-buildpackage -us -uc -b`, then lintian on the build's
# .changes (every package, -dbgsym too): no error allowed.
#
# Usage (as root): test/deb_build.sh DIR
#   DIR  a clean copy of the tree (the build writes in it); the .debs and the
#        .changes land in DIR/.., the logs in DIR/../build.log, lintian.log
# The build tools (dpkg-dev, debhelper, postgresql-server-dev-all,
# librdkafka-dev, lintian) are installed first if missing.  test/package.sh
# runs it on the host, test/matrix.sh in the trixie and sid lanes' chroots.
# Prints "deb: built NAME ..." per package; exits non-zero on any failure.
#
set -uo pipefail

dir=$(cd "${1:?usage: $0 DIR}" && pwd) || exit 2
out=$(dirname "$dir")
tools=(dpkg-dev debhelper postgresql-server-dev-all librdkafka-dev lintian)
missing=()
for p in "${tools[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "deb: installing the build tools: ${missing[*]}"
	# An unstable suite's Release file may be past its Valid-Until on a mirror.
	{ apt-get -o Acquire::Check-Valid-Until=false update -qq &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
	} >"$out/tools.log" 2>&1 || { tail -n 20 "$out/tools.log"; echo "deb: cannot install ${missing[*]}" >&2; exit 1; }
fi

t0=$(date +%s)
echo "deb: server versions supported here: $(cd "$dir" && pg_buildext supported-versions | xargs)"
(cd "$dir" && pg_buildext updatecontrol && dpkg-buildpackage -us -uc -b) >"$out/build.log" 2>&1 ||
	{ tail -n 40 "$out/build.log"; echo "deb: dpkg-buildpackage failed" >&2; exit 1; }
debs=$(cd "$out" && ls postgresql-*-outbox_*.deb 2>/dev/null)
[ -n "$debs" ] || { echo "deb: no postgresql-NN-outbox_*.deb built" >&2; exit 1; }
for d in $debs; do
	echo "deb: built $d in $(($(date +%s) - t0)) s: Depends: $(dpkg-deb -f "$out/$d" Depends)"
done
(cd "$out" && lintian --fail-on error outbox_*.changes) >"$out/lintian.log" 2>&1
rc=$?
grep -v 'running with root privileges' "$out/lintian.log"
[ "$rc" = 0 ] || { echo "deb: lintian reports an error" >&2; exit 1; }
echo "deb: lintian: no error"
