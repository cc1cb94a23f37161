#!/usr/bin/env bash
#
# The supported-versions matrix: for each lane, a `--variant=minbase`
# Debian chroot with that release's own PostgreSQL and librdkafka (nothing
# installed by hand), where this repository's committed HEAD is built with
# -Werror, installed, and run through the regression, isolation and pgTAP
# suites and a chosen set of TAP files against the mock Kafka cluster (no
# Java: the real-Kafka files are left to .ci/run's full run on the host).
# The trixie and sid lanes then build the Debian package postgresql-17- and
# postgresql-18-outbox in their chroot, check it with lintian, install it
# with apt and run CREATE EXTENSION outbox with it (test/deb_build.sh,
# test/deb_check.sh).
#
#   lane      Debian         PostgreSQL   librdkafka
#   bookworm  12             15           2.0
#   trixie    13             17           2.8
#   sid       unstable       18           2.14
#
# Usage (as root): test/matrix.sh [--fresh] [lane ...]   (default: all three)
#   --fresh  debootstrap and provision new chroots even if cached ones exist
# Environment:
#   OUTBOX_MATRIX_CACHE    where the lanes' chroots are kept between runs
#                          (default /var/cache/outbox-matrix): the second run
#                          of a lane reuses its chroot and its packages
#   OUTBOX_FRESH_CACHE     test/fresh_machine.sh's cache: a SUITE-minbase.tar
#                          there is used instead of a new debootstrap
#   OUTBOX_MATRIX_TESTS    the TAP files (default: publish, poison, Kafka
#                          settings and librdkafka's log lines, multiple
#                          databases, broker outage, crash, fatal producer
#                          error, leaderless partition, inbox end to end)
#   OUTBOX_MATRIX_SUITES   the suites (default: regress isolation pgtap tap)
#   OUTBOX_MATRIX_REAL_KAFKA  set: install Java and Maven in the chroot too, for
#                          the real-Kafka TAP files (test/t/2*_real_*.pl,
#                          304_inbox_real.pl, 311_inbox_real_restart.pl)
#   OUTBOX_MATRIX_PACKAGE  the lanes that also build the Debian package
#                          postgresql-MAJOR-outbox in their chroot, check it
#                          with lintian, install it with apt and run CREATE
#                          EXTENSION outbox with it (default: trixie sid;
#                          bookworm's is test/package.sh's; empty: none)
#   OUTBOX_MATRIX_PACKAGE_TIMEOUT  seconds for that step (default 900: the
#                          first run installs debhelper and lintian)
#   OUTBOX_MATRIX_KEEP     set: keep the logs of a lane that passed
#   OUTBOX_MATRIX_TIMEOUT  seconds a lane may take, packages, build and tests
#                          (default 720: three times what one takes, so that
#                          a hung lane cannot hold .ci/run for long)
#   OUTBOX_APT_MIRROR      Debian mirror (default: this machine's apt's, read
#                          by test/apt_mirror.sh)
#
# The chroot runs with an empty environment (no LANG, as containers have).
# Mounts are made in a private mount namespace and undone on exit; every
# process still running inside a lane's chroot is stopped when it ends.
# Prints one line per lane, "lane LANE (PostgreSQL x, librdkafka y): PASS|FAIL
# (...)", and exits 0 only if every lane passed.
#
set -uo pipefail

# Read whole before it runs: editing the file during a run cannot break it.
{

fresh=
lanes=()
for a in "$@"; do
	case $a in
		--fresh) fresh=1 ;;
		bookworm | trixie | sid) lanes+=("$a") ;;
		*) echo "usage: $0 [--fresh] [bookworm|trixie|sid ...]" >&2; exit 2 ;;
	esac
done
[ "${#lanes[@]}" = 0 ] && lanes=(bookworm trixie sid)

if [ "$(id -u)" != 0 ]; then
	echo "matrix: must run as root (debootstrap, chroot, mount)" >&2
	exit 2
fi
for c in unshare mount chroot timeout tar; do
	command -v "$c" >/dev/null || { echo "matrix: command '$c' not found on the host" >&2; exit 2; }
done

src=$(cd "$(dirname "$0")/.." && pwd)
cache=${OUTBOX_MATRIX_CACHE:-/var/cache/outbox-matrix}
base_cache=${OUTBOX_FRESH_CACHE:-/var/cache/outbox-fresh}
budget=${OUTBOX_MATRIX_TIMEOUT:-720}
package_lanes=${OUTBOX_MATRIX_PACKAGE-trixie sid}
package_budget=${OUTBOX_MATRIX_PACKAGE_TIMEOUT:-900}
suites=${OUTBOX_MATRIX_SUITES:-regress isolation pgtap tap}
deps_flag=--mock-only
[ -n "${OUTBOX_MATRIX_REAL_KAFKA:-}" ] && deps_flag=
tests=${OUTBOX_MATRIX_TESTS:-test/t/001_publish.pl test/t/017_reference_docs.pl test/t/002_poison.pl test/t/010_kafka_settings.pl test/t/014_multidb.pl test/t/101_brokers_down.pl test/t/104_crash.pl test/t/105_fatal_error.pl test/t/108_leaderless_partition.pl test/t/301_inbox_end_to_end.pl}
mirror=$("$src/test/apt_mirror.sh") ||
	{ echo "matrix: no Debian mirror in /etc/apt/sources.list*; set OUTBOX_APT_MIRROR" >&2; exit 2; }
security=$("$src/test/apt_mirror.sh" --security)

# A private mount namespace: the chroots' mounts stay invisible to the host
# and go with it even if this script is killed.
if [ -z "${OUTBOX_MATRIX_NS:-}" ]; then
	exec env OUTBOX_MATRIX_NS=1 unshare --mount --propagation private -- "$0" "$@"
fi

say() { echo "== matrix: $*"; }

# What is tested: the committed HEAD, cloned; or, where there is no git
# (a fresh machine's .ci/run), the tree as it is, copied.
head=
if command -v git >/dev/null && head=$(git -C "$src" rev-parse HEAD 2>/dev/null); then
	dirty=$(git -C "$src" status --porcelain --untracked-files=no)
	if [ -n "$dirty" ]; then
		say "WARNING: uncommitted changes in $src are NOT tested (the clone is of HEAD):"
		sed 's/^/    /' <<<"$dirty"
	fi
	what="commit ${head:0:12}"
else
	head=
	what="the tree $src (no git)"
fi
logs=$(mktemp -d /var/tmp/outbox-matrix.XXXXXX)
root=
mounts=()

# Stops what runs inside the current lane's chroot and undoes its mounts.
release() {
	[ -n "$root" ] || return 0
	"$src/test/chroot_release.sh" "$root" "${mounts[@]}"
	mounts=()
	root=
}
trap release EXIT
trap 'exit 130' INT TERM

# A lane's chroot, made once: debootstrap, apt sources, no daemons.
make_chroot() {	# make_chroot SUITE DIR
	local suite=$1 dir=$2 t0
	rm -rf "$dir" "$dir.new"
	mkdir -p "$cache" "$dir.new"
	t0=$(date +%s)
	if [ -z "$fresh" ] && [ -s "$base_cache/$suite-minbase.tar" ]; then
		say "unpacking test/fresh_machine.sh's cached base $base_cache/$suite-minbase.tar into $dir"
		tar -C "$dir.new" --numeric-owner -xf "$base_cache/$suite-minbase.tar" || return 1
	else
		if ! command -v debootstrap >/dev/null; then
			say "installing debootstrap on the host"
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
				{ echo "matrix: cannot install debootstrap" >&2; return 1; }
		fi
		say "debootstrap --variant=minbase $suite from $mirror into $dir"
		if ! timeout 1800 debootstrap --variant=minbase "$suite" "$dir.new" "$mirror" \
			>"$logs/$suite-debootstrap.log" 2>&1; then
			tail -n 30 "$logs/$suite-debootstrap.log"
			return 1
		fi
	fi
	{
		echo "deb $mirror $suite main"
		if [ "$suite" != sid ]; then
			echo "deb $mirror $suite-updates main"
			[ -n "$security" ] && echo "deb $security $suite-security main"
		fi
	} >"$dir.new/etc/apt/sources.list"
	# No daemon started by a package install (the host may run its own
	# PostgreSQL on the same port): the usual policy for chroots.
	printf '#!/bin/sh\nexit 101\n' >"$dir.new/usr/sbin/policy-rc.d"
	chmod +x "$dir.new/usr/sbin/policy-rc.d"
	mv "$dir.new" "$dir"
	say "base made in $(($(date +%s) - t0)) s"
}

mnt() {	# mnt TARGET MOUNT-ARGS...
	mount "${@:2}" "$1" || { echo "matrix: cannot mount $1" >&2; return 1; }
	mounts+=("$1")
}

# One lane: chroot, packages, build with -Werror, suites.  Returns the
# lane's exit status; its log is $logs/SUITE.log.
run_lane() {	# run_lane SUITE MAJOR
	local suite=$1 major=$2 dir=$cache/$1 rc
	if [ -n "$fresh" ] || [ ! -x "$dir/usr/bin/apt-get" ]; then
		make_chroot "$suite" "$dir" || return 1
	else
		say "lane $suite: reusing the chroot $dir ($(date -r "$dir/etc/apt/sources.list" '+%F %T'); --fresh for a new one)"
	fi
	cp /etc/resolv.conf "$dir/etc/resolv.conf"
	rm -rf "$dir/root/outbox"
	if [ -n "$head" ]; then
		git clone -q --no-hardlinks "$src" "$dir/root/outbox" &&
			git -C "$dir/root/outbox" checkout -q --detach "$head" || return 1
	else
		mkdir "$dir/root/outbox" &&
			tar -C "$src" --exclude=.git -cf - . | tar -C "$dir/root/outbox" -xf - || return 1
	fi
	root=$dir
	mnt "$dir/proc" -t proc proc &&
		mnt "$dir/sys" -t sysfs -o ro sysfs &&
		mnt "$dir/dev" --bind /dev &&
		mnt "$dir/dev/pts" --bind /dev/pts &&
		mnt "$dir/dev/shm" -t tmpfs -o mode=1777 tmpfs || { release; return 1; }
	say "lane $suite: PostgreSQL $major, $what, TAP: $tests"
	timeout --kill-after=30 "$budget" chroot "$dir" /usr/bin/env -i HOME=/root TERM=dumb \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		PROVE_TESTS="$tests" MAJOR="$major" SUITES="$suites" DEPS_FLAG="$deps_flag" \
		MAKEFLAGS="PROVE_FLAGS=--timer" bash -c '
			set -e
			cd /root/outbox
			bash .ci/install-deps $DEPS_FLAG "$MAJOR"
			export PATH=/usr/lib/postgresql/$MAJOR/bin:$PATH
			echo "build: $(pg_config --version), $(gcc --version | head -n 1), librdkafka $(dpkg-query -W -f="\${Version}" librdkafka1)"
			make -s clean >/dev/null
			make -s COPT=-Werror
			make -s install
			bash test/run_tests.sh $SUITES
		' >"$logs/$suite.log" 2>&1
	rc=$?
	if [ "$rc" = 0 ] && [[ " $package_lanes " == *" $suite "* ]]; then
		package_lane "$suite" "$major" "$dir"
		rc=$?
	fi
	versions="$(chroot "$dir" dpkg-query -W -f='PostgreSQL ${Version}, ' "postgresql-$major" 2>/dev/null)"
	versions+=$(chroot "$dir" dpkg-query -W -f='librdkafka ${Version}' librdkafka1 2>/dev/null)
	release
	return "$rc"
}

# The lane's Debian package: built from a clean clone by test/deb_build.sh
# (pg_buildext, dpkg-buildpackage, lintian), the lane's `make install`
# undone, then installed with apt and checked by test/deb_check.sh
# (CREATE EXTENSION with the library preloaded); purged afterwards, so the
# cached chroot keeps no package of a commit.  Log: $logs/SUITE-package.log.
package_lane() {	# package_lane SUITE MAJOR DIR
	local suite=$1 major=$2 dir=$3
	rm -rf "$dir/root/outbox-deb"
	mkdir "$dir/root/outbox-deb"
	if [ -n "$head" ]; then
		git clone -q --no-hardlinks "$src" "$dir/root/outbox-deb/outbox" &&
			git -C "$dir/root/outbox-deb/outbox" checkout -q --detach "$head" &&
			rm -rf "$dir/root/outbox-deb/outbox/.git" || return 1
	else
		mkdir "$dir/root/outbox-deb/outbox" &&
			tar -C "$src" --exclude=.git -cf - . | tar -C "$dir/root/outbox-deb/outbox" -xf - || return 1
	fi
	say "lane $suite: the Debian package (test/deb_build.sh, test/deb_check.sh)"
	timeout --kill-after=30 "$package_budget" chroot "$dir" /usr/bin/env -i HOME=/root TERM=dumb \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin MAJOR="$major" bash -c '
			set -e
			export PG_CONFIG=/usr/lib/postgresql/$MAJOR/bin/pg_config
			make -s -C /root/outbox uninstall
			make -s -C /root/outbox-deb/outbox clean >/dev/null
			unset PG_CONFIG
			bash /root/outbox/test/deb_build.sh /root/outbox-deb/outbox
			bash /root/outbox/test/deb_check.sh /root/outbox-deb/postgresql-$MAJOR-outbox_*.deb
			apt-get purge -y -qq postgresql-$MAJOR-outbox >/dev/null
		' >"$logs/$suite-package.log" 2>&1
}

verdict=0
summary=()
for lane in "${lanes[@]}"; do
	case $lane in
		bookworm) major=15 ;;
		trixie) major=17 ;;
		sid) major=18 ;;
	esac
	t0=$(date +%s)
	versions="PostgreSQL $major"
	run_lane "$lane" "$major"
	rc=$?
	took=$(($(date +%s) - t0))
	if [ "$rc" = 0 ]; then
		pkg=
		[[ " $package_lanes " == *" $lane "* ]] && pkg="; postgresql-$major-outbox built, lintian clean, installed with apt, CREATE EXTENSION"
		line="lane $lane ($versions): PASS ($took s; suites: $suites; $(wc -w <<<"$tests") TAP files$pkg)"
	else
		verdict=1
		[ -f "$logs/$lane.log" ] && tail -n 80 "$logs/$lane.log"
		[ -f "$logs/$lane-package.log" ] && tail -n 40 "$logs/$lane-package.log"
		line="lane $lane ($versions): FAIL (exit $rc after $took s; log $logs/$lane.log)"
	fi
	grep -hE '^== suite|^build:|^deb' "$logs/$lane.log" "$logs/$lane-package.log" 2>/dev/null | sed "s/^/    $lane: /"
	echo "$line"
	summary+=("$line")
done
echo
printf '%s\n' "${summary[@]}"
[ "$verdict" = 0 ] && [ -z "${OUTBOX_MATRIX_KEEP:-}" ] && rm -rf "$logs"
exit "$verdict"
}
