#!/usr/bin/env bash
#
# Can this system's PostgreSQL OLD be pg_upgraded to NEW at all?  A cluster
# of OLD with one plain table (no extension), pg_upgrade to NEW; prints
# "probe: pg_upgrade OLD -> NEW of a plain cluster: ok" or the error
# pg_upgrade logged, and exits non-zero on failure.  test/pg_upgrade.sh runs
# it (as root, in its chroot) before the extension's test, so that a
# distribution's own failure is told apart from the extension's.
#
# Usage (as root): test/pg_upgrade_probe.sh OLD NEW
#
set -uo pipefail
old=${1:?usage: $0 OLD NEW} new=${2:?usage: $0 OLD NEW}
dir=$(mktemp -d /tmp/pg_upgrade_probe.XXXXXX)
chown postgres: "$dir"
runuser -u postgres -- bash -c '
	set -u
	cd "$1" || exit 1
	o=/usr/lib/postgresql/$2/bin n=/usr/lib/postgresql/$3/bin
	$o/initdb -D old -A trust -k >/dev/null && $n/initdb -D new -A trust -k >/dev/null || exit 1
	$o/pg_ctl -D old -o "-k $1 -p 5917 -c listen_addresses=" -l old.log -w start >/dev/null || exit 1
	$o/psql -X -q -h "$1" -p 5917 -d postgres -c "CREATE TABLE t (a int)"
	$o/pg_ctl -D old -w stop >/dev/null
	$n/pg_upgrade -b $o -B $n -d old -D new -s "$1" -p 5917 -P 5918 >upgrade.log 2>&1
' probe "$dir" "$old" "$new"
rc=$?
if [ "$rc" = 0 ]; then
	echo "probe: pg_upgrade $old -> $new of a plain cluster: ok"
else
	echo "probe: pg_upgrade $old -> $new of a plain cluster (initdb, CREATE TABLE t (a int), pg_upgrade) fails:"
	grep -h 'ERROR: ' "$dir"/new/pg_upgrade_output.d/*/log/*.log 2>/dev/null | head -n 3 | sed 's/^/probe:   /'
	tail -n 5 "$dir/upgrade.log" | sed 's/^/probe:   /'
fi
rm -rf "$dir"
exit "$rc"
