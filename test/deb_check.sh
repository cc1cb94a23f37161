#!/usr/bin/env bash
#
# Installs a postgresql-NN-outbox .deb with apt and checks it as a user
# would, on the Debian system it runs on (a chroot of test/package.sh or of
# a test/matrix.sh lane): `apt-get install ./DEB`, then a new cluster
# (pg_createcluster, on a port and socket of its own, no TCP) with
# shared_preload_libraries = 'outbox' runs CREATE EXTENSION outbox, emits an
# event and sees the launcher start a publisher for the database; and the
# oldest version the package ships is created and updated to the default
# one (ALTER EXTENSION outbox UPDATE).  The cluster is dropped afterwards.
#
# Usage (as root, no server of the package's version running on the port):
#   test/deb_check.sh DEB
# Exits non-zero on any failure, with the cluster's log.
#
set -uo pipefail
export DEBIAN_FRONTEND=noninteractive
deb=$(realpath "${1:?usage: $0 DEB}") || exit 2
major=$(dpkg-deb -f "$deb" Package | sed -nE 's/^postgresql-([0-9]+)-outbox$/\1/p')
[ -n "$major" ] || { echo "deb_check: $deb is not a postgresql-NN-outbox package" >&2; exit 2; }

# An unstable suite's Release file may be past its Valid-Until on a mirror.
apt-get -o Acquire::Check-Valid-Until=false update -qq &&
	apt-get install -y -q "$deb" >/tmp/deb_check-install.log 2>&1 ||
	{ tail -n 30 /tmp/deb_check-install.log; echo "deb_check: apt-get install $deb failed" >&2; exit 1; }
echo "deb_check: installed $(dpkg-query -W -f='${Package} ${Version}' "postgresql-$major-outbox")" \
	"($(dpkg-query -W -f='.\n' | wc -l) packages on the system)"

cluster=outbox_check
port=$((20000 + RANDOM % 20000))
pg_dropcluster --stop "$major" "$cluster" 2>/dev/null
pg_createcluster "$major" "$cluster" -p "$port" >/dev/null || { echo "deb_check: pg_createcluster failed" >&2; exit 1; }
pg_conftool "$major" "$cluster" set shared_preload_libraries outbox
pg_conftool "$major" "$cluster" set listen_addresses ''
pg_ctlcluster "$major" "$cluster" start || { echo "deb_check: the server did not start" >&2; exit 1; }
psql_() { runuser -u postgres -- psql -X -p "$port" "$@"; }

psql_ -v ON_ERROR_STOP=1 -d postgres <<-'EOF_SQL'
	CREATE EXTENSION outbox;
	SELECT extversion FROM pg_extension WHERE extname = 'outbox';
	SELECT aggregate_version FROM outbox_emit('order', 'order-1', 'OrderPaid', '{"amount": 10}');
	SELECT count(*) AS pending FROM outbox_pending;
	-- The package's update scripts: the oldest version it ships, updated
	-- to the default one.
	CREATE DATABASE oldest;
	\c oldest
	SELECT version AS oldest FROM pg_available_extension_versions WHERE name = 'outbox'
	 ORDER BY string_to_array(version, '.')::int[] LIMIT 1 \gset
	CREATE EXTENSION outbox VERSION :'oldest';
	ALTER EXTENSION outbox UPDATE;
	SELECT :'oldest' AS created, e.extversion AS updated
	  FROM pg_extension e WHERE e.extname = 'outbox';
	DO $$ BEGIN
		IF (SELECT e.extversion <> a.default_version FROM pg_extension e, pg_available_extensions a
			 WHERE e.extname = 'outbox' AND a.name = 'outbox') THEN
			RAISE EXCEPTION 'ALTER EXTENSION outbox UPDATE did not reach the default version';
		END IF;
	END $$;
EOF_SQL
rc=$?
# The launcher starts a publisher for a database that has the extension.
n=0
for _ in $(seq 1 300); do
	[ "$rc" = 0 ] || break
	n=$(psql_ -Atq -d postgres -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox publisher'")
	[ "${n:-0}" -gt 0 ] && break
	sleep 0.2
done
echo "deb_check: publishers: $n"
[ "$rc" = 0 ] && [ "${n:-0}" -gt 0 ] || rc=1
[ "$rc" = 0 ] || tail -n 30 "/var/log/postgresql/postgresql-$major-$cluster.log"
pg_dropcluster --stop "$major" "$cluster"
exit "$rc"
