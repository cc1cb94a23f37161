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
#   OUTBOX_FRESH_MIRROR   Debian mirror (default: the one the host's apt uses,
#                         from /etc/apt/sources.list*)
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

src=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=test/chroot_lib.sh
. "$src/test/chroot_lib.sh"
fresh=
keep=
parse_flags "$0 [--fresh] [--keep]" --fresh --keep -- "$@"
require_root fresh_machine "debootstrap, chroot, mount"

for c in git unshare mount chroot timeout tar; do
	command -v "$c" >/dev/null || { echo "fresh_machine: command '$c' not found on the host" >&2; exit 2; }
done

budget=${OUTBOX_FRESH_TIMEOUT:-5400}

# Private mount namespace: the chroot's mounts stay invisible to the host
# and are dropped by the kernel when the last process in it exits.
enter_private_namespace OUTBOX_FRESH "$0" "$@"

say() { echo "== fresh_machine: $*"; }
chroot_session fresh
root=$work/root

# ---------------------------------------------------------------- the base
chroot_new "$work" $fresh || { echo "fresh_machine: FAIL (chroot)"; exit 1; }

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
chroot_mount || { echo "fresh_machine: FAIL (mounts)"; exit 1; }

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
