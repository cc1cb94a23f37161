#!/usr/bin/env bash
#
# The README's two commands on a brand-new Debian 12: debootstraps a
# `--variant=minbase bookworm` chroot (nothing installed but the essential
# packages), clones this repository's committed HEAD into it, and runs
# there, as root, `bash test/demo.sh` and then `bash .ci/run` (which
# install their packages with --no-install-recommends, build, install and
# run every suite).  It proves that the set-up section works on a machine
# that has nothing the developers installed by hand.  First, on the bare
# chroot, `bash test/run_tests.sh` must stop at once with a preflight
# message naming what is missing.  Not part of .ci/run.
#
# Usage (as root): test/fresh_machine.sh [--fresh] [--keep]
#   --fresh  debootstrap a new base even if a cached one exists
#   --keep   keep the chroot afterwards (default: removed)
# Environment:
#   OUTBOX_FRESH_CACHE    directory of the cached base tarball
#                         (default /var/cache/outbox-fresh; delete it or use
#                         --fresh to start from a new debootstrap)
#   OUTBOX_FRESH_MIRROR   Debian mirror (default: the one this machine's apt
#                         uses, read by test/apt_mirror.sh)
#   OUTBOX_FRESH_TIMEOUT  seconds for the whole run (default 5400); each step
#                         gets what is left, and is killed when it runs out
#   OUTBOX_FRESH_PROVE_TESTS  passed as PROVE_TESTS into the chroot, to shorten
#                         a trial run (the proof is a run without it)
#
# Only committed work is tested: the clone is of HEAD; uncommitted changes
# are listed and left out.  The mounts (/proc, /sys, /dev, /dev/pts,
# /dev/shm) are made in a private mount namespace, so they never appear
# outside it and vanish with it even if this script is killed; on exit the
# script also stops every process still running inside the chroot and
# unmounts explicitly.  Prints a final line "fresh machine: PASS" or
# "fresh machine: FAIL (...)"; exits 0 only on PASS.
#
set -uo pipefail

# The whole script is one compound command, read before it runs: editing
# the file during a run (e.g. checking out another commit) cannot break it.
{

fresh=
keep=
for a in "$@"; do
	case $a in
		--fresh) fresh=1 ;;
		--keep) keep=1 ;;
		*) echo "usage: $0 [--fresh] [--keep]" >&2; exit 2 ;;
	esac
done

if [ "$(id -u)" != 0 ]; then
	echo "fresh_machine: must run as root (debootstrap, chroot, mount)" >&2
	exit 2
fi

for c in git unshare mount chroot timeout tar; do
	command -v "$c" >/dev/null || { echo "fresh_machine: command '$c' not found on the host" >&2; exit 2; }
done

src=$(cd "$(dirname "$0")/.." && pwd)
cache=${OUTBOX_FRESH_CACHE:-/var/cache/outbox-fresh}
mirror=${OUTBOX_FRESH_MIRROR:-$("$src/test/apt_mirror.sh")} ||
	{ echo "fresh_machine: no Debian mirror in /etc/apt/sources.list*; set OUTBOX_FRESH_MIRROR" >&2; exit 2; }
security=$("$src/test/apt_mirror.sh" --security)
budget=${OUTBOX_FRESH_TIMEOUT:-5400}
base=$cache/bookworm-minbase.tar

# Private mount namespace: the chroot's mounts stay invisible to the host
# and are dropped by the kernel when the last process in it exits.
if [ -z "${OUTBOX_FRESH_NS:-}" ]; then
	exec env OUTBOX_FRESH_NS=1 OUTBOX_FRESH_START="$(date +%s)" \
		unshare --mount --propagation private -- "$0" "$@"
fi
start=${OUTBOX_FRESH_START:-$(date +%s)}

say() { echo "== fresh_machine: $*"; }
left() { echo $((budget - ($(date +%s) - start))); }

work=$(mktemp -d /var/tmp/outbox-fresh.XXXXXX)
root=$work/root
mounts=()

cleanup() {
	"$src/test/chroot_release.sh" "$root" "${mounts[@]}"
	if [ -n "$keep" ]; then
		echo "fresh_machine: chroot kept in $root"
	elif ! grep -q " $work" /proc/self/mounts; then
		rm -rf "$work"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bounded() {	# bounded CMD...: run CMD within what is left of the budget
	local t
	t=$(left)
	if [ "$t" -le 0 ]; then
		echo "fresh_machine: out of time before: $*" >&2
		return 124
	fi
	timeout --kill-after=30 "$t" "$@"
}

# ---------------------------------------------------------------- the base
if ! command -v debootstrap >/dev/null; then
	say "installing debootstrap on the host"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
		{ echo "fresh_machine: cannot install debootstrap" >&2; exit 2; }
fi
if [ -n "$fresh" ] || [ ! -s "$base" ]; then
	say "debootstrap --variant=minbase bookworm from $mirror (base cached in $base)"
	mkdir -p "$cache"
	rm -rf "$work/base"
	t0=$(date +%s)
	if ! bounded debootstrap --variant=minbase bookworm "$work/base" "$mirror" >"$work/debootstrap.log" 2>&1; then
		tail -n 30 "$work/debootstrap.log"
		echo "fresh_machine: FAIL (debootstrap)"
		exit 1
	fi
	tar -C "$work/base" --numeric-owner -cf "$base.tmp" . && mv "$base.tmp" "$base"
	rm -rf "$work/base"
	say "debootstrap took $(($(date +%s) - t0)) s"
else
	say "using the cached base $base ($(date -r "$base" '+%F %T'); --fresh for a new one)"
fi
mkdir "$root"
tar -C "$root" --numeric-owner -xf "$base" || { echo "fresh_machine: FAIL (cannot unpack $base)"; exit 1; }
say "base: $(. "$root/etc/os-release"; echo "$PRETTY_NAME"), $(chroot "$root" dpkg-query -W -f='.\n' | wc -l) packages"

# A Debian 12 as installed: main, updates and security.
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
${security:+deb $security bookworm-security main}
EOF
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The network's own trust anchors, as every machine of this network has
# them: here the registries are reached through a TLS-inspecting egress
# proxy whose CA the host trusts (/usr/local/share/ca-certificates).
# Without it Maven (Java's trust store) cannot fetch the Kafka jars; apt
# itself uses http.  A certificate, not a package: the package list of the
# chroot stays what .ci/install-deps makes it.  ca-certificates and
# ca-certificates-java pick these up when .ci/install-deps installs them.
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
	mkdir -p "$root/usr/local/share/ca-certificates"
	cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
	say "copied the host's local CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
fi
# No daemons started by package installs (the host may run its own
# PostgreSQL on the same port): the usual policy for chroots.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"

# ---------------------------------------------------------------- the repo
head=$(git -C "$src" rev-parse HEAD) || { echo "fresh_machine: $src is not a git work tree" >&2; exit 2; }
dirty=$(git -C "$src" status --porcelain --untracked-files=no)
if [ -n "$dirty" ]; then
	say "WARNING: uncommitted changes in $src are NOT tested (the clone is of HEAD):"
	sed 's/^/    /' <<<"$dirty"
fi
git clone -q --no-hardlinks "$src" "$root/root/outbox" &&
	git -C "$root/root/outbox" checkout -q --detach "$head" ||
	{ echo "fresh_machine: FAIL (git clone)"; exit 1; }
say "cloned $head ($(git -C "$src" log -1 --format=%s "$head" | cut -c1-70))"

# ---------------------------------------------------------------- mounts
mnt() {	# mnt TARGET MOUNT-ARGS...
	mount "${@:2}" "$1" || { echo "fresh_machine: FAIL (mount $1)"; exit 1; }
	mounts+=("$1")
}
mnt "$root/proc" -t proc proc
mnt "$root/sys" -t sysfs -o ro sysfs
mnt "$root/dev" --bind /dev
mnt "$root/dev/pts" --bind /dev/pts
mnt "$root/dev/shm" -t tmpfs -o mode=1777 tmpfs		# PostgreSQL's shared memory

# ---------------------------------------------------------------- the two commands
in_chroot() {	# in_chroot NAME COMMAND: run as root in the clone, log to $work/NAME.log
	local rc
	say "running \`$2\` in the chroot"
	bounded chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb \
		${OUTBOX_FRESH_PROVE_TESTS:+PROVE_TESTS="$OUTBOX_FRESH_PROVE_TESTS"} \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		bash -c "cd /root/outbox && $2" 2>&1 | tee "$work/$1.log"
	rc=${PIPESTATUS[0]}
	say "\`$2\` exited with $rc after $(($(date +%s) - start)) s in all"
	return "$rc"
}

verdict=()
why() {	# why NAME RC
	case $2 in
		124 | 137) verdict+=("$1 timed out (OUTBOX_FRESH_TIMEOUT=$budget s)") ;;
		*) verdict+=("$1 failed with exit status $2") ;;
	esac
}
# Before anything is installed, the test runner must stop at once and say
# what is missing (test/preflight.sh), not fail half-way through a suite.
in_chroot bare 'bash test/run_tests.sh'
rc=$?
if [ "$rc" = 2 ] && grep -q '^preflight: .*not found' "$work/bare.log"; then
	say "on the bare machine the runner stopped at once, naming what is missing"
else
	verdict+=("on the bare machine test/run_tests.sh did not stop with a preflight message (exit $rc)")
fi
in_chroot demo 'bash test/demo.sh' || why test/demo.sh $?
in_chroot ci 'bash .ci/run' || why .ci/run $?

[ -n "${OUTBOX_FRESH_PROVE_TESTS:-}" ] && verdict+=("trial run: PROVE_TESTS=$OUTBOX_FRESH_PROVE_TESTS")
say "packages in the chroot at the end: $(chroot "$root" dpkg-query -W -f='.\n' | wc -l)"
if [ "${#verdict[@]}" = 0 ]; then
	echo "fresh machine: PASS (Debian 12 minbase, commit ${head:0:12}: test/demo.sh and .ci/run succeeded, $(($(date +%s) - start)) s)"
	exit 0
fi
echo "fresh machine: FAIL ($(printf '%s; ' "${verdict[@]}")commit ${head:0:12}, logs in $work, kept)"
keep=1
exit 1
}
