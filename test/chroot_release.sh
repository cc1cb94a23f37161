#!/usr/bin/env bash
#
# Releases a chroot that test/fresh_machine.sh or test/matrix.sh ran tests
# in: kills every process still running inside ROOT (a server of a failed
# test, say: ours, found by their root directory), then unmounts the given
# mount points, last first (lazily if one is still busy).  Run it in the
# mount namespace the mounts were made in.
#
# Usage (as root): test/chroot_release.sh ROOT [MOUNT ...]
#
set -u
root=$1
shift
for pid in $(ls /proc | grep -E '^[0-9]+$'); do
	[ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$root" ] && kill -KILL "$pid" 2>/dev/null
done
for ((i = $#; i >= 1; i--)); do
	umount "${!i}" 2>/dev/null || umount -l "${!i}" 2>/dev/null
done
exit 0
