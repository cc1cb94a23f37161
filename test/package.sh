#!/usr/bin/env bash
#
# The Debian package, built and installed as a user installs it: builds
# postgresql-15-outbox_*.deb from this tree with `dpkg-buildpackage -us -uc
# -b` (debian/, pg_buildext), checks it with lintian (no error), then on a
# brand-new Debian 12 (a `debootstrap --variant=minbase bookworm` chroot,
# test/chroot_lib.sh) installs it with `apt-get install ./<deb>` (apt
# fetches PostgreSQL 15 and librdkafka from the mirror the host uses),
# starts the cluster the package's postgresql-15 made, as postgres, with
# shared_preload_libraries = 'outbox', runs CREATE EXTENSION outbox, emits
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

keep=
for a in "$@"; do
	case $a in
		--keep) keep=1 ;;
		*) echo "usage: $0 [--keep]" >&2; exit 2 ;;
	esac
done
if [ "$(id -u)" != 0 ]; then
	echo "package: must run as root (apt-get, debootstrap, chroot, mount)" >&2
	exit 2
fi

src=$(cd "$(dirname "$0")/.." && pwd)
# Private mount namespace: the chroot's mounts vanish with it.
if [ -z "${OUTBOX_PACKAGE_NS:-}" ]; then
	exec env OUTBOX_PACKAGE_NS=1 OUTBOX_PACKAGE_START="$(date +%s)" \
		unshare --mount --propagation private -- "$0" "$@"
fi
start=${OUTBOX_PACKAGE_START:-$(date +%s)}
budget=${OUTBOX_PACKAGE_TIMEOUT:-1200}
# shellcheck source=test/chroot_lib.sh
. "$src/test/chroot_lib.sh"

say() { echo "== package: $*"; }
fail() { echo "package: FAIL ($*; logs in $work)"; keep=1; exit 1; }

chroot_session package

# ---------------------------------------------------------------- build
tools=(dpkg-dev debhelper postgresql-server-dev-all librdkafka-dev lintian debootstrap)
missing=()
for p in "${tools[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	say "installing the build tools: ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive bounded apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >"$work/tools.log" 2>&1 || { tail -n 20 "$work/tools.log"; fail "cannot install ${missing[*]}"; }
fi

mkdir "$work/build" "$work/build/outbox"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	(cd "$src" && git ls-files -z | tar --null -T - -cf -) | tar -C "$work/build/outbox" -xf -
else
	tar -C "$src" --exclude=.git -cf - . | tar -C "$work/build/outbox" -xf -
fi
t0=$(date +%s)
say "dpkg-buildpackage -us -uc -b"
(cd "$work/build/outbox" && bounded dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 ||
	{ tail -n 40 "$work/build.log"; fail "dpkg-buildpackage"; }
deb=$(cd "$work/build" && ls postgresql-15-outbox_*_*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || fail "no postgresql-15-outbox_*.deb built"
say "built $deb in $(($(date +%s) - t0)) s: $(dpkg-deb -f "$work/build/$deb" Depends)"
# Every package of the build (with -dbgsym), as a maintainer checks it.
(cd "$work/build" && bounded lintian --fail-on error outbox_*.changes) >"$work/lintian.log" 2>&1
rc=$?
grep -v 'running with root privileges' "$work/lintian.log"
[ "$rc" = 0 ] || fail "lintian reports an error"
say "lintian: no error"

# ---------------------------------------------------------------- install
chroot_new "$work" || fail "chroot"
chroot_mount || fail "mounts"
cp "$work/build/$deb" "$chroot_root/tmp/"
in_chroot() {	# in_chroot LOG COMMAND: as root in the chroot, output to $work/LOG.log
	bounded chroot "$chroot_root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
		DEBIAN_FRONTEND=noninteractive PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		bash -ec "$2" >"$work/$1.log" 2>&1
}
t0=$(date +%s)
say "apt-get install ./$deb in the chroot"
in_chroot install "cd /tmp && apt-get update -qq && apt-get install -y -q ./$deb" ||
	{ tail -n 30 "$work/install.log"; fail "apt-get install ./$deb"; }
say "installed in $(($(date +%s) - t0)) s: $(chroot "$chroot_root" dpkg-query -W -f='.\n' | wc -l) packages," \
	"$(chroot "$chroot_root" dpkg-query -W -f='${Version}' postgresql-15-outbox)"

# ---------------------------------------------------------------- run
# The cluster postgresql-15 created (15/main), not started by the install
# (policy-rc.d): preloading the library, on a port and socket of its own,
# no TCP (the host may run a server on 5432).
port=$((20000 + RANDOM % 20000))
in_chroot server "
	pg_conftool 15 main set shared_preload_libraries outbox
	pg_conftool 15 main set listen_addresses ''
	pg_conftool 15 main set port $port
	pg_ctlcluster 15 main start
	runuser -u postgres -- psql -X -v ON_ERROR_STOP=1 -p $port -d postgres <<-'EOF'
		CREATE EXTENSION outbox;
		SELECT extversion FROM pg_extension WHERE extname = 'outbox';
		SELECT aggregate_version FROM outbox_emit('order', 'order-1', 'OrderPaid', '{\"amount\": 10}');
		SELECT count(*) AS pending FROM outbox_pending;
		-- The package's update scripts: the oldest version it ships,
		-- updated to the default one.
		CREATE DATABASE oldest;
		\\c oldest
		SELECT version AS oldest FROM pg_available_extension_versions WHERE name = 'outbox'
		 ORDER BY string_to_array(version, '.')::int[] LIMIT 1 \\gset
		CREATE EXTENSION outbox VERSION :'oldest';
		ALTER EXTENSION outbox UPDATE;
		SELECT :'oldest' AS created, e.extversion AS updated
		  FROM pg_extension e WHERE e.extname = 'outbox';
		DO \$\$ BEGIN
			IF (SELECT e.extversion <> a.default_version FROM pg_extension e, pg_available_extensions a
				 WHERE e.extname = 'outbox' AND a.name = 'outbox') THEN
				RAISE EXCEPTION 'ALTER EXTENSION outbox UPDATE did not reach the default version';
			END IF;
		END \$\$;
	EOF
	# The launcher starts a publisher for a database that has the extension.
	for i in \$(seq 1 300); do
		n=\$(runuser -u postgres -- psql -X -Atq -p $port -d postgres -c \
			\"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox publisher'\")
		[ \"\$n\" -gt 0 ] && break
		sleep 0.2
	done
	echo \"publishers: \$n\"
	pg_ctlcluster 15 main stop
	[ \"\$n\" -gt 0 ]
"
rc=$?
cat "$work/server.log"
[ "$rc" = 0 ] || { tail -n 30 "$chroot_root/var/log/postgresql/postgresql-15-main.log" 2>/dev/null; fail "the server in the chroot"; }
echo "package: PASS ($deb built, lintian clean, installed with apt on Debian 12 minbase, CREATE EXTENSION outbox with the library preloaded, the oldest version shipped updated to the default; $(($(date +%s) - start)) s)"
exit 0
}
