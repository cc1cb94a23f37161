# test/bench/lib.sh -- shell helpers shared by the benchmark scripts
# (test/bench/*.sh) and test/demo.sh, sourced, not run.
#
# The scripts keep their work directory in $work (the throwaway cluster in
# $work/data) and name the processes they start in variables; cleanup, the
# EXIT trap, stops them all:
#
#   kill_first   names of pid variables killed (after SIGCONT, in case they
#                are stopped) before the cluster stops, e.g. a load generator
#   kill_after   names of pid variables killed after it, e.g. the mock Kafka
#   pg_stop_mode pg_ctl's stop mode, default immediate
#   kafka        a real Kafka cluster's directory (test/tools/kafka_cluster)
#
# $tools must name test/tools where kafka is set; bench_cluster_env sets
# both $work and $tools for a script's throwaway cluster.

# psql for scripts: no psqlrc, quiet, stop at the first error, bare values.
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@"; }

# A progress line: the time of day, and the seconds since $started if set.
say() {
	if [ -n "${started:-}" ]; then
		printf '%s [%4ds] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - started))" "$*"
	else
		printf '%s %s\n' "$(date +%H:%M:%S)" "$*"
	fi
}

# Kill the processes whose pids the named variables hold (empty: skipped).
kill_named() { # cont(0|1) var...
	local cont=$1 v
	shift
	for v in "$@"; do
		[ -n "${!v:-}" ] || continue
		if [ "$cont" = 1 ]; then kill -CONT "${!v}" 2>/dev/null || true; fi
		kill "${!v}" 2>/dev/null || true
	done
}

# As root: copy test/ into a new /tmp/outbox-<name>.XXXXXX that postgres
# owns, run test/<script> of the copy there as postgres with the copy's path
# in environment variable <var>, remove the copy and exit with its status;
# killed after $RERUN_LIMIT seconds if that is set.
rerun_as_postgres() { # name var script [args]
	local name=$1 var=$2 script=$3 dir rc=0
	shift 3
	dir=$(mktemp -d "/tmp/outbox-$name.XXXXXX")
	cp -r "$src/test" "$dir/"
	chown -R postgres: "$dir"
	# From a directory postgres may enter (the tree may be under /root).
	(cd "$dir" && ${RERUN_LIMIT:+timeout -k 30 "$RERUN_LIMIT"} runuser -u postgres -- env "$var=$dir" bash "$dir/test/$script" "$@") || rc=$?
	rm -rf "$dir"
	exit "$rc"
}

# A script's throwaway cluster on the PostgreSQL of pg_config, in work
# directory $1 (made under /tmp from template $2 if $1 is empty): sets work,
# tools and the libpq environment (a Unix socket there, a random port).
bench_cluster_env() { # dir template
	work=${1:-$(mktemp -d "/tmp/$2")}
	tools=$src/test/tools
	export PATH="$(pg_config --bindir):$PATH"
	export PGHOST=$work PGPORT=$((20000 + RANDOM % 20000)) PGDATABASE=postgres
}

# A throwaway cluster's connection settings (Unix socket in $work, port
# $PGPORT) and the preloaded library, appended to its postgresql.conf.
pg_conf_local() { # datadir
	cat >>"$1/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$work'
port = $PGPORT
shared_preload_libraries = 'outbox'
EOF
}

# One publisher of database postgres against the brokers in $work/bootstrap
# (start_mock_kafka writes it; publisher_cpu.sh's real cluster too), with
# room for a backlog's WAL and no autovacuum worker in the way of the
# figures.
pg_conf_publisher() { # datadir
	cat >>"$1/postgresql.conf" <<EOF
outbox.database = 'postgres'
outbox.brokers = '$(cat "$work/bootstrap")'
outbox.workers = 1
shared_buffers = '256MB'
max_wal_size = '8GB'
checkpoint_timeout = '30min'
autovacuum = off
EOF
}

# Wait up to 10 s until nothing is pending (psql options: the database).
wait_nothing_pending() {
	local _
	for _ in $(seq 100); do
		[ "$(psql -X "$@" -Atc 'SELECT count(*) FROM outbox_pending')" = 0 ] && break
		sleep 0.1
	done
	return 0
}

# The EXIT trap: stop everything the script started (see the header).
cleanup() {
	kill_named 1 ${kill_first:-}
	pg_ctl -D "$work/data" -m "${pg_stop_mode:-immediate}" stop >/dev/null 2>&1 || true
	[ -n "${kafka:-}" ] && "$tools/kafka_cluster" down "$kafka" >/dev/null 2>&1 || true
	kill_named 0 ${kill_after:-}
	wait 2>/dev/null || true
}

# The bin directory of build "before" ($BEFORE) or of the one on PATH.
bindir() { if [ "$1" = before ]; then echo "$BEFORE"; else dirname "$(command -v pg_ctl)"; fi; }

# initdb for a throwaway cluster: trust, no fsync at init, UTF8 with the C
# locale whatever the caller's environment.
pg_init() { # datadir [initdb options]
	local dir=$1
	shift
	initdb -D "$dir" -A trust --no-sync -E UTF8 --locale=C "$@" >/dev/null
}

# A mock Kafka cluster (test/tools/mock_kafka with these options) in the
# background, its pid in mock_pid, files $work/bootstrap, $work/control and
# $work/mock.log, preloading $mock_preload if set; waits up to 10 s for the
# bootstrap file.  Call it directly, not in $(...): mock_pid must be set here.
start_mock_kafka() { # mock_kafka options
	env ${mock_preload:+LD_PRELOAD=$mock_preload} "$tools/mock_kafka" \
		--bootstrap-file "$work/bootstrap" --control-file "$work/control" "$@" \
		>"$work/mock.log" 2>&1 &
	mock_pid=$!
	wait_file "$work/bootstrap" 100 || true
}

# Wait until a file is non-empty, polling every 0.1 s: 0, or 1 after $2 tries.
wait_file() { # file tries
	local _
	for _ in $(seq "$2"); do
		[ -s "$1" ] && return 0
		sleep 0.1
	done
	return 1
}
