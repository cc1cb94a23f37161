# test/chroot_lib.sh: a brand-new Debian 12 for a test, sourced by
# test/fresh_machine.sh and test/package.sh, or an overlay of a
# test/matrix.sh lane's chroot (test/pg_upgrade.sh, test/bench/lane.sh).
#
# A `debootstrap --variant=minbase bookworm` base (only the essential
# packages) is made once and kept as a tarball in $OUTBOX_FRESH_CACHE
# (default /var/cache/outbox-fresh); each run unpacks it into a new
# directory.  apt in the chroot uses the mirror the host's apt uses
# (test/apt_mirror.sh reads /etc/apt/sources.list*), or $OUTBOX_FRESH_MIRROR.
#
# The caller runs as root in a private mount namespace (require_root,
# then enter_private_namespace, unshare --mount --propagation private),
# defines say MESSAGE and sets budget (seconds) and start (its start time).
# chroot_session NAME makes the work directory $work, removed on exit (kept
# if $keep is set); chroot_new $work makes the chroot $chroot_root in it, or
# chroot_overlay LOWER an overlay of LOWER; bounded COMMAND... runs within
# the budget.

chroot_root=
chroot_mounts=()
chroot_name=

# parse_flags USAGE FLAG... -- ARG...: for each ARG, one of the FLAGs
# (--keep, --fresh), sets the variable of that name (keep, fresh) to 1; any
# other ARG exits 2 with "usage: USAGE".
parse_flags() {
	local usage=$1 a
	local -a flags=()
	shift
	while [ "$1" != -- ]; do
		flags+=("$1")
		shift
	done
	shift
	for a in "$@"; do
		case " ${flags[*]} " in
			*" $a "*) printf -v "${a#--}" 1 ;;
			*) echo "usage: $usage" >&2; exit 2 ;;
		esac
	done
}

# require_root NAME WHY: exits 2 saying NAME must run as root (WHY) unless
# it does.
require_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "$1: must run as root ($2)" >&2
		exit 2
	fi
}

# enter_private_namespace PREFIX SCRIPT ARGS...: unless PREFIX_NS says this
# is the re-run, runs SCRIPT ARGS... again in a private mount namespace (the
# chroot's mounts stay invisible to the host and vanish with it), with
# PREFIX_START the time of the first run; then sets start from it.
enter_private_namespace() {
	local ns=${1}_NS at=${1}_START
	shift
	if [ -z "${!ns:-}" ]; then
		exec env "$ns=1" "$at=$(date +%s)" unshare --mount --propagation private -- "$@"
	fi
	start=${!at:-$(date +%s)}
}

# copy_tree SRC DEST: the tree tested, into DEST: the tracked files as they
# are (git ls-files), or the whole tree without .git.
copy_tree() {
	if git -C "$1" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		(cd "$1" && git ls-files -z | tar --null -T - -cf -) | tar -C "$2" -xf -
	else
		tar -C "$1" --exclude=.git -cf - . | tar -C "$2" -xf -
	fi
}

# chroot_session NAME: $work, a new /var/tmp/outbox-NAME.XXXXXX, cleaned up
# on exit.
chroot_session() {
	chroot_name=$1
	work=$(mktemp -d "/var/tmp/outbox-$1.XXXXXX")
	trap chroot_exit EXIT
	trap 'exit 130' INT TERM
}

# chroot_exit: stops and unmounts the chroot, removes $work unless $keep
# is set (or something is still mounted in it).
chroot_exit() {
	chroot_cleanup
	if [ -n "${keep:-}" ]; then
		echo "$chroot_name: kept $work"
	elif ! grep -q " $work" /proc/self/mounts; then
		rm -rf "$work"
	fi
}

# bounded COMMAND...: COMMAND within what is left of $budget seconds from
# $start, killed when it runs out.
bounded() {
	local t=$((budget - ($(date +%s) - start)))
	if [ "$t" -le 0 ]; then
		echo "$chroot_name: out of time before: $*" >&2
		return 124
	fi
	timeout --kill-after=30 "$t" "$@"
}

# chroot_mirrors: sets mirror and security_mirror, the mirrors the host's
# apt uses (test/apt_mirror.sh); false if the host has none.
chroot_mirrors() {
	local lib
	lib=$(dirname "${BASH_SOURCE[0]}")
	mirror=${OUTBOX_FRESH_MIRROR:-$("$lib/apt_mirror.sh")} || mirror=
	security_mirror=$("$lib/apt_mirror.sh" --security) || security_mirror=
	if [ -z "$mirror" ]; then
		echo "chroot: no Debian mirror in /etc/apt/sources.list*; set OUTBOX_FRESH_MIRROR" >&2
		return 1
	fi
}

# chroot_new WORK [--fresh]: unpacks the cached base (debootstrapped first
# if absent, or with --fresh) into WORK/root, with apt's sources set.
chroot_new() {
	local work=$1 fresh=${2:-} cache=${OUTBOX_FRESH_CACHE:-/var/cache/outbox-fresh}
	local base t0
	base=$cache/bookworm-minbase.tar
	chroot_mirrors || return 1
	if ! command -v debootstrap >/dev/null; then
		say "installing debootstrap on the host"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
			{ echo "chroot: cannot install debootstrap" >&2; return 1; }
	fi
	if [ -n "$fresh" ] || [ ! -s "$base" ]; then
		say "debootstrap --variant=minbase bookworm from $mirror (base cached in $base)"
		mkdir -p "$cache"
		rm -rf "$work/base"
		t0=$(date +%s)
		if ! bounded debootstrap --variant=minbase bookworm "$work/base" "$mirror" >"$work/debootstrap.log" 2>&1; then
			tail -n 30 "$work/debootstrap.log"
			echo "chroot: debootstrap failed" >&2
			return 1
		fi
		# A name of its own: another run may be writing the cache too.
		tar -C "$work/base" --numeric-owner -cf "$base.$$" . && mv "$base.$$" "$base"
		rm -rf "$work/base"
		say "debootstrap took $(($(date +%s) - t0)) s"
	else
		say "using the cached base $base ($(date -r "$base" '+%F %T'); --fresh for a new one)"
	fi
	chroot_root=$work/root
	mkdir "$chroot_root"
	tar -C "$chroot_root" --numeric-owner -xf "$base" || { echo "chroot: cannot unpack $base" >&2; return 1; }
	say "base: $(. "$chroot_root/etc/os-release"; echo "$PRETTY_NAME"), $(chroot "$chroot_root" dpkg-query -W -f='.\n' | wc -l) packages"
	chroot_configure
}

# chroot_configure: a Debian 12 as installed (main, updates, security),
# the host's DNS and local CA certificates, no daemons started by installs.
chroot_configure() {
	{
		echo "deb $mirror bookworm main"
		echo "deb $mirror bookworm-updates main"
		[ -n "$security_mirror" ] && echo "deb $security_mirror bookworm-security main"
	} >"$chroot_root/etc/apt/sources.list"
	cp /etc/resolv.conf "$chroot_root/etc/resolv.conf"
	# The network's own trust anchors, as every machine of this network has
	# them: registries may be reached through a TLS-inspecting egress proxy
	# whose CA the host trusts (/usr/local/share/ca-certificates); Maven
	# (Java's trust store) needs it.  A certificate, not a package: the
	# chroot's package list stays what the test installs.
	if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
		mkdir -p "$chroot_root/usr/local/share/ca-certificates"
		cp /usr/local/share/ca-certificates/*.crt "$chroot_root/usr/local/share/ca-certificates/"
		say "copied the host's local CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
	fi
	# No daemons started by package installs (the host may run its own
	# PostgreSQL on the same port): the usual policy for chroots.
	printf '#!/bin/sh\nexit 101\n' >"$chroot_root/usr/sbin/policy-rc.d"
	chmod +x "$chroot_root/usr/sbin/policy-rc.d"
}

# chroot_mount: /proc, /sys, /dev, /dev/pts and a /dev/shm of its own
# (PostgreSQL's shared memory), undone by chroot_cleanup.
chroot_mount() {
	local spec target
	# The root a mount point of its own, as a machine's is: a private mount
	# namespace made inside (test/package.sh and test/matrix.sh, run by
	# .ci/run in test/fresh_machine.sh's chroot) needs one.
	if ! mountpoint -q "$chroot_root"; then
		mount --bind "$chroot_root" "$chroot_root" ||
			{ echo "chroot: cannot bind-mount $chroot_root on itself" >&2; return 1; }
		chroot_mounts+=("$chroot_root")
	fi
	for spec in "proc -t proc proc" "sys -t sysfs -o ro sysfs" "dev --bind /dev" \
		"dev/pts --bind /dev/pts" "dev/shm -t tmpfs -o mode=1777 tmpfs"; do
		target=$chroot_root/${spec%% *}
		# shellcheck disable=SC2086
		mount ${spec#* } "$target" || { echo "chroot: cannot mount $target" >&2; return 1; }
		chroot_mounts+=("$target")
	done
}

# chroot_overlay LOWER: $chroot_root, $work/root, a copy-on-write overlay of
# the chroot LOWER (left as it is: writes go to $work/upper), mounted
# (chroot_mount) and with the host's DNS.
chroot_overlay() {
	chroot_root=$work/root
	mkdir "$chroot_root" "$work/upper" "$work/overlay-work" || return 1
	mount -t overlay overlay -o "lowerdir=$1,upperdir=$work/upper,workdir=$work/overlay-work" \
		"$chroot_root" || { echo "chroot: cannot mount an overlay of $1" >&2; return 1; }
	chroot_mounts=("$chroot_root")
	chroot_mount || return 1
	cp /etc/resolv.conf "$chroot_root/etc/resolv.conf"
}

# chroot_cleanup: stops every process still running inside the chroot and
# unmounts (test/chroot_release.sh); the caller removes the directory.
chroot_cleanup() {
	[ -n "$chroot_root" ] || return 0
	"$(dirname "${BASH_SOURCE[0]}")/chroot_release.sh" "$chroot_root" "${chroot_mounts[@]}"
	chroot_mounts=()
}
