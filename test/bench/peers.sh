# test/bench/peers.sh -- section p of run.sh (sourced, not run): the
# extension beside the publishers a user would pick instead, in one run.
#
#   ours       the extension's worker (outbox.workers = 1; 2 and 4 from (e))
#   relay      the classic polling relay (relay.c), LIMIT 100, 10 ms idle poll
#   relay1000  the same, LIMIT 1000
#   pgq        PgQ (pgq.insert_event; peers.c pgq: ticker, next_batch,
#              get_batch_events, produce, flush, finish_batch)
#   logical    logical decoding of a plain outbox table (pgoutput streamed
#              over START_REPLICATION, LSN confirmed after the acks; peers.c)
#   logmsg     the same over pg_logical_emit_message(true, 'outbox', ...)
#   raw        a plain librdkafka producer (the limit; throughput only)
#
# Measured: throughput (N preloaded events over 10,000 aggregates in one
# transaction, at 0 and 5 ms broker round trip; and N events in 1,000
# transactions preloaded while the publisher was stopped), then steady load
# with pgbench --rate (publisher CPU per event and % of a core, latency
# commit -> ack p50/p99).  Uses run.sh's helpers (q, res, new_topic, drain,
# lat_stats, ...) and variables (N, dsn, brokers, work, bench, tools): run.sh
# defines them all before it sources this file.

# BENCH_PEERS: a subset, e.g. "ours relay1000 pgq logical" (ours first).
PEERS=${BENCH_PEERS:-ours relay relay1000 pgq logical logmsg}  # raw: throughput only
# The extension again with reads spaced out (steady load only, not a peer):
# the latency it trades for CPU, measured beside the peers.
PACED_INTERVAL=100ms
peer_pid=
PEER_BASE=
peer_name() {
	case $1 in
		ours) echo "outbox worker" ;;
		paced) echo "outbox worker, paced" ;;
		relay) echo "classic polling relay, LIMIT 100" ;;
		relay1000) echo "classic polling relay, LIMIT 1000" ;;
		pgq) echo "PgQ relay" ;;
		logical) echo "logical decoding, outbox table (pgoutput)" ;;
		logmsg) echo "logical decoding, pg_logical_emit_message" ;;
		raw) echo "raw librdkafka producer (the limit)" ;;
	esac
}

# One-time set-up: wal_level = logical (a restart), PgQ, the peers' objects.
peers_setup() {
	q -c "ALTER SYSTEM SET wal_level = logical"
	restart_pg 1
	HAVE_PGQ=$(q -c "SELECT count(*) FROM pg_available_extensions WHERE name = 'pgq'")
	if [ "$HAVE_PGQ" = 1 ]; then
		q -c "CREATE EXTENSION IF NOT EXISTS pgq"
		res pgq.version "$(q -c "SELECT extversion FROM pg_extension WHERE extname = 'pgq'")"
	else
		echo "run.sh: PgQ is not installed for this PostgreSQL: the PgQ peer is skipped" \
			"(as root, run.sh installs postgresql-15-pgq3)" >&2
		PEERS=${PEERS/pgq /}
	fi
	q <<'EOF'
-- the logical-decoding peer's outbox: a plain table, Debezium's outbox shape
CREATE TABLE peer_outbox (
	id bigserial PRIMARY KEY,
	aggregate_type text NOT NULL,
	aggregate_id text NOT NULL,
	aggregate_version bigint NOT NULL,
	event_id text NOT NULL,
	event_type text NOT NULL,
	topic text NOT NULL,
	payload jsonb,
	created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE PUBLICATION bench_peer_table FOR TABLE peer_outbox WITH (publish = 'insert');
CREATE PUBLICATION bench_peer_msgs;  -- no table: pgoutput sends the messages only
EOF
}

# SQL emitting events i in [$2, $3] (SQL expressions) for publisher $1,
# aggregate 'order-' || (i % $4), version i / $4 + 1, topic $5; one statement.
peer_body() {
	local p=$1 lo=$2 hi=$3 a=$4 t=$5
	case $p in
		ours) echo "SELECT count(*) FROM generate_series($lo, $hi) AS i,
			LATERAL outbox_emit('order', 'order-' || (i % $a), 'OrderPaid', $PAYLOAD_SQL, topic => '$t') AS e" ;;
		relay | relay1000) echo "INSERT INTO relay_outbox (aggregate_id, aggregate_version, topic, headers, payload)
			SELECT 'order-' || (i % $a), i / $a + 1, '$t',
				jsonb_build_object('event_id', gen_random_uuid()::text, 'event_type', 'OrderPaid',
					'aggregate_type', 'order'), $PAYLOAD_SQL
			FROM generate_series($lo, $hi) AS i" ;;
		pgq) echo "SELECT count(pgq.insert_event('$PGQ_QUEUE', 'OrderPaid', ($PAYLOAD_SQL)::text,
				'order-' || (i % $a), (i / $a + 1)::text, gen_random_uuid()::text,
				(extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text))
			FROM generate_series($lo, $hi) AS i" ;;
		logical) echo "INSERT INTO peer_outbox (aggregate_type, aggregate_id, aggregate_version, event_id,
				event_type, topic, payload)
			SELECT 'order', 'order-' || (i % $a), i / $a + 1, gen_random_uuid()::text, 'OrderPaid', '$t',
				$PAYLOAD_SQL
			FROM generate_series($lo, $hi) AS i" ;;
		logmsg) echo "SELECT count(pg_logical_emit_message(true, 'outbox', concat_ws(E'\\n', '$t',
				'order-' || (i % $a), i / $a + 1, gen_random_uuid(), 'OrderPaid', 'order',
				(extract(epoch FROM clock_timestamp()) * 1000000)::bigint, $PAYLOAD_SQL)))
			FROM generate_series($lo, $hi) AS i" ;;
	esac
}
# The preload: n events over a aggregates, in tx transactions.
peer_preload() { # p n a topic tx
	local per=$(($2 / $5))
	if [ "$5" = 1 ]; then
		echo "BEGIN; $(peer_body "$1" 0 "$2 - 1" "$3" "$4"); COMMIT;"
	else
		echo "DO \$\$ BEGIN FOR k IN 0..$(($5 - 1)) LOOP
			$(peer_body "$1" "k * $per" "k * $per + $per - 1" "$3" "$4" | sed '1s/^SELECT /PERFORM /');
			COMMIT; END LOOP; END \$\$;"
	fi
}
# One event of the steady load (a pgbench script line; :id = aggregate).
peer_steady_sql() { # p topic
	local v="(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
	case $1 in
		ours | paced) echo "SELECT event_id FROM outbox_emit('order', 'order-' || :id, 'OrderPaid', '{\"amount\": 10, \"currency\": \"EUR\"}', topic => '$2');" ;;
		relay | relay1000) echo "INSERT INTO relay_outbox (aggregate_id, aggregate_version, topic, headers, payload) VALUES ('order-' || :id, $v, '$2', jsonb_build_object('event_id', gen_random_uuid()::text, 'event_type', 'OrderPaid', 'aggregate_type', 'order'), '{\"amount\": 10, \"currency\": \"EUR\"}');" ;;
		pgq) echo "SELECT pgq.insert_event('$PGQ_QUEUE', 'OrderPaid', '{\"amount\": 10, \"currency\": \"EUR\"}', 'order-' || :id, $v::text, gen_random_uuid()::text, $v::text);" ;;
		logical) echo "INSERT INTO peer_outbox (aggregate_type, aggregate_id, aggregate_version, event_id, event_type, topic, payload) VALUES ('order', 'order-' || :id, $v, gen_random_uuid()::text, 'OrderPaid', '$2', '{\"amount\": 10, \"currency\": \"EUR\"}');" ;;
		logmsg) echo "SELECT pg_logical_emit_message(true, 'outbox', concat_ws(E'\\n', '$2', 'order-' || :id, $v, gen_random_uuid(), 'OrderPaid', 'order', $v, '{\"amount\": 10, \"currency\": \"EUR\"}'));" ;;
	esac
}

# Fresh state for one run of publisher p on topic $T.
peer_prep() { # p
	reset_tables
	case $1 in
		pgq)
			PGQ_QUEUE="bq$tn"
			q -o /dev/null -c "SELECT pgq.create_queue('$PGQ_QUEUE')" \
				-c "SELECT pgq.set_queue_config('$PGQ_QUEUE', 'ticker_max_lag', '0')" \
				-c "SELECT pgq.register_consumer('$PGQ_QUEUE', 'relay')" ;;
		logical | logmsg)
			PEER_SLOT="bs$tn"
			q -o /dev/null -c "TRUNCATE peer_outbox" \
				-c "SELECT pg_create_logical_replication_slot('$PEER_SLOT', 'pgoutput')" ;;
	esac
}
peer_start() { # p
	PEER_STATUS=$work/peer.status
	PEER_LAT=$work/peer.lat
	rm -f "$PEER_STATUS" "$PEER_LAT"
	case $1 in
		ours) peer_pid= ;;
		paced)
			peer_pid=
			q -o /dev/null -c "ALTER SYSTEM SET outbox.read_interval = '$PACED_INTERVAL'" \
				-c "ALTER SYSTEM SET outbox.read_commits = 1000000" -c "SELECT pg_reload_conf()"
			sleep 1 ;;
		relay | relay1000)
			"$bench/relay" --dsn "$dsn" --brokers "$brokers" --batch "$([ "$1" = relay ] && echo 100 || echo 1000)" \
				--poll-ms 10 --status-file "$PEER_STATUS" --max-seconds 900 \
				>"$work/relay.out" 2>>"$work/relay.err" &
			peer_pid=$! ;;
		pgq)
			"$bench/peers" pgq --dsn "$dsn" --brokers "$brokers" --topic "$T" --queue "$PGQ_QUEUE" \
				--poll-ms 10 --status-file "$PEER_STATUS" --latency-file "$PEER_LAT" --max-seconds 900 \
				>"$work/peer.out" 2>>"$work/peer.err" &
			peer_pid=$! ;;
		logical | logmsg)
			"$bench/peers" logical --dsn "$dsn" --brokers "$brokers" --slot "$PEER_SLOT" \
				--publication "$([ "$1" = logical ] && echo bench_peer_table || echo bench_peer_msgs)" \
				$([ "$1" = logmsg ] && echo --messages) --status-file "$PEER_STATUS" \
				--latency-file "$PEER_LAT" --max-seconds 900 >"$work/peer.out" 2>>"$work/peer.err" &
			peer_pid=$! ;;
	esac
	relay_pid=$peer_pid # (cleanup stops it if the run fails)
}
# Stop the publisher's process (after its current batch) and drop its queue/slot.
peer_stop() { # p
	if [ -n "$peer_pid" ]; then
		kill -CONT "$peer_pid" 2>/dev/null || true
		kill -TERM "$peer_pid" 2>/dev/null || true
		wait "$peer_pid" || true
	fi
	peer_pid= relay_pid=
	case $1 in
		relay | relay1000) PEER_LINE=$(tail -n1 "$work/relay.out") ;;
		pgq | logical | logmsg) PEER_LINE=$(tail -n1 "$work/peer.out") ;;
		*) PEER_LINE= ;;
	esac
	case $1 in
		pgq) q -o /dev/null -c "SELECT pgq.unregister_consumer('$PGQ_QUEUE', 'relay')" \
			-c "SELECT pgq.drop_queue('$PGQ_QUEUE')" ;;
		logical | logmsg) q -o /dev/null -c "SELECT pg_drop_replication_slot('$PEER_SLOT')" ;;
		paced) q -o /dev/null -c "ALTER SYSTEM RESET outbox.read_interval" \
			-c "ALTER SYSTEM RESET outbox.read_commits" -c "SELECT pg_reload_conf()"
			sleep 1 ;;
	esac
}
# Until the publisher has published PEER_EXPECT events past PEER_BASE (or
# past its progress just before exec-sql), watching only what it reports:
# the extension's events_published counter, the others' status file.
peer_drain() { # p [exec-sql] -> DRAIN_LINE
	DRAIN_PIDS=$(peer_pids "$1" | sed '/^$/d' | paste -sd, -)
	case $1 in
		ours | paced) drain ours "$PEER_EXPECT" "${2:-}" "$PEER_BASE" ;;
		*) drain "$PEER_STATUS" "$PEER_EXPECT" "${2:-}" "$PEER_BASE" ;;
	esac
}
# One event through the started publisher (metadata, connections, producer id).
peer_warm() { # p
	case $1 in
		ours | paced) warm_ours "$T" ;;
		*)
			PEER_EXPECT=1
			peer_drain "$1" "$(peer_body "$1" 0 0 1 "$T" | sed "s/'order-' || (i % 1)/'warmup'/")"
			[ -n "$peer_pid" ] && kill -USR1 "$peer_pid"
			;;
	esac
}
# What publisher p has published so far (the counter, or its status file).
peer_settled() { # p
	case $1 in
		ours | paced) ours_published ;;
		*) status_settled "$PEER_STATUS" ;;
	esac
}
# CPU ticks of the publisher: its process plus its server backend (or walsender).
peer_pids() { # p
	case $1 in
		ours | paced) q -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox publisher'" ;;
		*) q -c "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'outbox-bench-%'"
			echo "$peer_pid" ;;
	esac
}
peer_expect_file() { # p n a -> $work/expect
	{
		q -c "SELECT 'order-' || a || E'\t' || (($2 - 1 - a) / $3 + 1) FROM generate_series(0, least($3, $2) - 1) a"
		if [ "$1" = ours ]; then seq 1 64 | sed 's/^/warmup-/; s/$/\t1/'; else printf 'warmup\t1\n'; fi
	} >"$work/expect"
}

# One throughput run: key, publisher, events, aggregates, transactions.
peer_throughput() {
	local key=$1 p=$2 n=$3 a=$4 tx=$5 line ticker t0
	new_topic "${key//./-}"
	if [ "$p" = raw ]; then
		line=$("$bench/relay" raw --brokers "$brokers" --topic "$T" --events "$n" --aggregates "$a" 2>>"$work/relay.err")
		res "$key.eps" "$(kv "$line" events_per_s)"
		say "  $key: ${R[$key.eps]} events/s"
		return
	fi
	peer_prep "$p"
	peer_start "$p"
	peer_warm "$p"
	PEER_EXPECT=$n
	if [ "$tx" = 1 ]; then
		peer_drain "$p" "$(peer_preload "$p" "$n" "$a" "$T" 1)"
	else
		# preloaded while the publisher is stopped, then timed from its start
		# (the logical-decoding peers end their stream instead, SIGUSR2: under
		# SIGSTOP their walsender would go on decoding into the socket buffers,
		# several MB, before the clock starts)
		case $p in
			ours) q -o /dev/null -c "SELECT outbox_pause()" ;;
			logical | logmsg)
				kill -USR2 "$peer_pid"
				for _ in $(seq 200); do grep -q 'paused=1' "$PEER_STATUS" 2>/dev/null && break; sleep 0.05; done
				grep -q 'paused=1' "$PEER_STATUS" || { echo "peer $p did not pause" >&2; exit 1; } ;;
			*) kill -STOP "$peer_pid" ;;
		esac
		if [ "$p" = pgq ]; then # the ticker keeps ticking (pgqd would): every 10 ms
			PGAPPNAME=bench-ticker q -c "DO \$\$ BEGIN LOOP PERFORM pgq.ticker('$PGQ_QUEUE'); COMMIT;
				PERFORM pg_sleep(0.01); END LOOP; END \$\$" >/dev/null 2>&1 &
			ticker=$!
		fi
		t0=$(date +%s.%N)
		q -o /dev/null -c "$(peer_preload "$p" "$n" "$a" "$T" "$tx")"
		res "$key.preload_s" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f\n", b - a }')"
		if [ "$p" = pgq ]; then
			q -o /dev/null -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'bench-ticker'"
			wait "$ticker" || true
			res "$key.ticks" "$(q -c "SELECT count(*) FROM pgq.tick t JOIN pgq.queue q ON q.queue_id = t.tick_queue
				WHERE q.queue_name = '$PGQ_QUEUE'")"
		fi
		# the clock starts here, before the publisher may start: drain_wait's own
		# connection time is counted (its commit_epoch - t0)
		t0=$(date +%s.%N)
		PEER_BASE=$(peer_settled "$p") # (before the resume: a fast peer settles before drain_wait starts)
		case $p in
			ours) q -o /dev/null -c "SELECT outbox_resume()" ;;
			logical | logmsg) kill -USR2 "$peer_pid" ;;
			*) kill -CONT "$peer_pid" ;;
		esac
		peer_drain "$p"
		PEER_BASE=
		local secs
		secs=$(awk -v a="$t0" -v c="$(kv "$DRAIN_LINE" commit_epoch)" -v s="$(kv "$DRAIN_LINE" seconds)" \
			'BEGIN { printf "%.3f\n", c - a + s }')
		DRAIN_LINE="seconds=$secs events_per_s=$(awk -v n="$n" -v s="$secs" 'BEGIN { printf "%.0f\n", n / s }')"
	fi
	res "$key.eps" "$(kv "$DRAIN_LINE" events_per_s)"
	res "$key.seconds" "$(kv "$DRAIN_LINE" seconds)"
	# (the 1,000-transaction runs rebuild DRAIN_LINE: cores of one-transaction drains only)
	res "$key.busy_cores" "$(kv "$DRAIN_LINE" busy_cores)"
	res "$key.pids_cores" "$(kv "$DRAIN_LINE" pids_cores)"
	peer_stop "$p"
	res "$key.line" "${PEER_LINE#*: }"
	peer_expect_file "$p" "$n" "$a"
	line=$("$tools/order_check" --brokers "$brokers" --topic "$T" --expect "$work/expect" \
		--any-start --timeout-ms 60000 2>>"$work/order_check.err" | tail -n1) || true
	res "$key.order_check" "${line#order_check: }"
	say "  $key: ${R[$key.eps]} events/s (${R[$key.seconds]} s); ${R[$key.order_check]}"
}

# One steady-load run: pgbench --rate with publisher p alone.
peer_steady() { # key p rate
	local key=$1 p=$2 rate=$3 log pids c0 c1 c2 n base since
	log=$work/pgbench.$key.log
	new_topic "${key//./-}"
	peer_prep "$p"
	peer_start "$p"
	peer_warm "$p"
	printf '%s\n' '\set id random(1, 10000)' "$(peer_steady_sql "$p" "$T")" >"$work/steady.sql"
	base=$(peer_settled "$p")
	since=$(q -c "SELECT clock_timestamp()")
	pids=$(peer_pids "$p" | xargs)
	case $p in ours | paced) hist_start ;; esac
	c0=$(cpu_of $pids)
	pgbench -n -M prepared -c "$LAT_CLIENTS" -j 2 --rate "$rate" -T "$P_LAT_S" -f "$work/steady.sql" >"$log" 2>&1 ||
		{ cat "$log" >&2; exit 1; }
	c1=$(cpu_of $pids)
	n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$log")
	PEER_EXPECT=$n PEER_BASE=$base
	peer_drain "$p"
	PEER_BASE=
	c2=$(cpu_of $pids)
	case $p in ours | paced) hist_stop "$key" ;; esac
	res "$key.events" "$n"
	res "$key.tps" "$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log" | xargs printf '%.0f')"
	res "$key.cpu_pct" "$(awk -v a="$c0" -v b="$c1" -v hz="$HZ" -v s="$P_LAT_S" 'BEGIN { printf "%.1f\n", 100 * (b - a) / hz / s }')"
	res "$key.cpu_us" "$(awk -v a="$c0" -v b="$c2" -v hz="$HZ" -v n="$n" 'BEGIN { if (n > 0) printf "%.0f\n", 1e6 * (b - a) / hz / n; else print "-" }')"
	peer_stop "$p"
	res "$key.line" "${PEER_LINE#*: }"
	case $p in
		# The worker's own emit→ack histogram (every event, to within a
		# bucket): no sampler session beside the extension only.
		ours | paced) res "$key.stats" "${R[$key.hist]}" ;;
		relay | relay1000) lat_stats "$key" relay_outbox "$since" ;;
		*) res "$key.stats" "$(sort -n "$PEER_LAT" | awk '{ x[NR] = $1 } END {
				if (NR == 0) { print "0 - - -"; exit }
				i50 = int(0.5 * NR); if (i50 < 0.5 * NR) i50++; i99 = int(0.99 * NR); if (i99 < 0.99 * NR) i99++
				printf "%d %.1f %.1f %.1f\n", NR, x[i50], x[i99], x[NR] }')" ;;
	esac
	res "$key.p50" "$(lf "$key" 2)"
	res "$key.p99" "$(lf "$key" 3)"
	say "  $key: ${R[$key.tps]} tps; count p50 p99 max (ms): ${R[$key.stats]}; CPU ${R[$key.cpu_pct]}% = ${R[$key.cpu_us]} µs/event"
}

# ------------------------------------------------------------ the section
peers_run() {
	local rtt r p rate
	peers_setup
	res load.p "$(cut -d' ' -f1-3 /proc/loadavg)"
	say "p. peers: $(echo $PEERS raw) (load average ${R[load.p]})"
	say "p1. throughput, $N events over $AGGS_MAIN aggregates in one transaction, 0 and 5 ms round trip, $P_REPS interleaved round(s)"
	# (A real cluster's round trip is its own: 0 stands for it, 5 is not run.)
	local rtts="0 5"
	[ -n "$kafka" ] && rtts=0
	for rtt in $rtts; do
		if [ -z "$kafka" ]; then mk rtt all "$rtt"; fi
		for r in $(seq "$P_REPS"); do
			for p in $PEERS raw; do peer_throughput "p.tp$rtt.$p.r$r" "$p" "$N" "$AGGS_MAIN" 1; done
		done
		for p in $PEERS raw; do peer_rounds "p.tp$rtt.$p" "$P_REPS" eps seconds; done
	done
	if [ -z "$kafka" ]; then mk rtt all 0; fi
	say "p2. $N events in 1,000 transactions, preloaded while the publisher was stopped, $P_REPS interleaved round(s)"
	for r in $(seq "$P_REPS"); do
		for p in $PEERS; do peer_throughput "p.tx1000.$p.r$r" "$p" "$N" "$AGGS_MAIN" 1000; done
	done
	for p in $PEERS; do peer_rounds "p.tx1000.$p" "$P_REPS" eps seconds preload_s ticks; done
	say "p3. steady load: pgbench --rate, $P_LAT_S s per rate, each publisher alone, $P_ST_REPS interleaved round(s)"
	for r in $(seq "$P_ST_REPS"); do
		for rate in $P_RATES; do
			for p in $PEERS paced; do peer_steady "p.st.$rate.$p.r$r" "$p" "$rate"; done
		done
	done
	for rate in $P_RATES; do
		for p in $PEERS paced; do peer_rounds "p.st.$rate.$p" "$P_ST_REPS" tps cpu_pct cpu_us p50 p99; done
	done
}
# A publisher's rounds: medians and ranges of the fields, every round's
# order check and its own totals line.
peer_rounds() { # base reps field...
	rounds_summary "$@"
	rounds_text "$1" "$2" order_check
	rounds_text "$1" "$2" line
}

# ------------------------------------------------------------ the report
# a/b with 2 decimals; best peer of a key: max (higher is better) or min.
best_peer() { # key-pattern-with-% hi|lo -> "value name"
	local p v best="" bn=""
	for p in $PEERS; do
		[ "$p" = ours ] && continue
		v=$(eval "echo \${R[${1//%/$p}]:-}")
		[ -n "$v" ] && [ "$v" != - ] || continue
		if [ -z "$best" ] || awk -v v="$v" -v b="$best" -v d="$2" 'BEGIN { exit !(d == "hi" ? v > b : v < b) }'; then
			best=$v bn=$p
		fi
	done
	echo "$best $bn"
}
peers_report() {
	local p k rate cols best bn
	# metrics: key pattern (% = publisher), title, hi|lo
	local -a M=("p.tp0.%.eps|throughput, 0 ms RTT (events/s)|hi"
		"p.tp5.%.eps|throughput, 5 ms RTT (events/s)|hi"
		"p.tx1000.%.eps|throughput, 1,000 transactions (events/s)|hi")
	for rate in $P_RATES; do M+=("p.st.$rate.%.cpu_us|CPU µs/event at $(fmt "$rate")/s|lo"); done
	for rate in $P_RATES; do M+=("p.st.$rate.%.cpu_pct|CPU % of a core at $(fmt "$rate")/s|lo"); done
	for rate in $P_RATES; do
		[ "$rate" = 1000 ] && continue
		M+=("p.st.$rate.%.p50|p50 commit→ack at $(fmt "$rate")/s (ms)|lo" "p.st.$rate.%.p99|p99 commit→ack at $(fmt "$rate")/s (ms)|lo")
	done
	echo "## p. Peers: the extension beside PgQ, logical decoding, the polling relay and raw librdkafka"
	echo
	echo "Every figure in this section comes from the same run, on the same PostgreSQL (\`wal_level = logical\`"
	echo "for all of them: the logical-decoding peers need it) and the same mock (TCP_NODELAY shim).  The"
	echo "machine is shared and noisy: absolute figures move ±30% from one run to the next; only the ratios"
	echo "within one run mean something."
	echo
	echo "| publisher | what runs |"
	echo "|---|---|"
	echo "| outbox worker | the extension, \`outbox.workers = 1\` (defaults: \`batch_events = 20000\`, \`linger.ms = 2\`); emit = \`outbox_emit()\` |"
	echo "| classic polling relay | \`test/bench/relay\` as in (b), \`--batch 100\` or \`--batch 1000\`, \`--poll-ms 10\`; emit = plain INSERT into \`relay_outbox\` |"
	echo "| PgQ relay | \`test/bench/peers pgq\`: PgQ ${R[pgq.version]:-(not installed)} from Debian's \`postgresql-15-pgq3\`; emit = \`pgq.insert_event(queue, 'OrderPaid', payload, aggregate_id, version, event_id, created_at µs)\`; the relay is the ticker: each loop \`pgq.ticker(queue)\` (queue_ticker_max_lag = 0: a tick whenever there are new events), \`pgq.next_batch\`, \`pgq.get_batch_events\`, produce all, \`rd_kafka_flush\`, \`pgq.finish_batch\`; 10 ms sleep when there is no batch |"
	echo "| logical decoding, table | \`test/bench/peers logical\`: a \`pgoutput\` slot streamed with \`START_REPLICATION\` (protocol 1, publication on a plain \`peer_outbox\` table, INSERTs only); emit = plain INSERT; produces as it reads, confirms the flush LSN up to the end of the last transaction whose events (and all before) Kafka acknowledged, at most every 5 ms |"
	echo "| logical decoding, messages | the same over \`pg_logical_emit_message(true, 'outbox', ...)\` (no table; \`messages 'true'\`) |"
	echo "| raw librdkafka producer | \`relay raw\`: pre-built messages, produce all, wait for every ack (the limit; throughput only) |"
	echo
	echo "Producer settings of every peer: librdkafka ${R[rdkafka]} defaults plus \`enable.idempotence=true\` (hence"
	echo "\`acks=all\`) and \`partitioner=murmur2_random\`; key = aggregate_id; the same five headers and payload."
	echo
	echo "Exact commands (as run.sh runs them; \$DSN, \$BROKERS, \$T the run's):"
	echo
	echo '```'
	echo 'relay --dsn $DSN --brokers $BROKERS --batch 100 --poll-ms 10      # and --batch 1000'
	echo 'peers pgq --dsn $DSN --brokers $BROKERS --topic $T --queue $Q --poll-ms 10 --status-file F --latency-file L'
	echo 'peers logical --dsn $DSN --brokers $BROKERS --slot $S --publication bench_peer_table --status-file F --latency-file L'
	echo 'peers logical --dsn $DSN --brokers $BROKERS --slot $S --publication bench_peer_msgs --messages --status-file F --latency-file L'
	echo 'relay raw --brokers $BROKERS --topic $T --events 100000 --aggregates 10000'
	echo 'drain_wait --dsn $DSN --exec "<preload>" --counter --events 100000        # the extension (events_published)'
	echo 'drain_wait --dsn $DSN --exec "<preload>" --status-file F --events 100000  # the relays, PgQ, logical decoding'
	echo "pgbench -n -M prepared -c $LAT_CLIENTS -j 2 --rate R -T $P_LAT_S -f <one emit statement>"
	echo 'psql -c "CALL bench_sample_settled(0.02)"    # beside the extension under pgbench (run.sh creates it)'
	echo '```'
	echo
	echo "**Method.** Throughput: the publisher runs and is warm (one event published first); one"
	echo "transaction emits $(fmt "$N") events over $(fmt "$AGGS_MAIN") aggregates; timed from its commit until"
	echo "all of them are published, watching only what each publisher reports, polled every 20 ms: the"
	echo "extension's shared-memory counter \`events_published\` (\`outbox_counters()\`, counted when a"
	echo "settle commits), the others' status file (the relay: rows marked by committed batches; PgQ: the"
	echo "last batch finished; logical decoding: the slot's position confirmed past the last commit) — no"
	echo "table or view of any publisher is read while the clock runs, and no debug logging is on."
	echo "Every figure: the median of $P_REPS round(s) for throughput, $P_ST_REPS for steady load (each its own"
	echo "preload; rounds interleaved: every publisher once, then again), the range (min–max) in"
	echo "parentheses; 5 ms round trip: \`rtt all 5\` on the mock.  1,000 transactions: the same $(fmt "$N") events in 1,000 transactions of $(fmt $((N / 1000))), emitted"
	echo "while the publisher was stopped (the extension: \`outbox_pause()\`; the relay and PgQ: SIGSTOP, and"
	echo "PgQ's ticker kept ticking every 10 ms meanwhile, as pgqd would: $(mr p.tx1000.pgq.ticks) ticks; logical"
	echo "decoding: SIGUSR2, which settles, ends the stream and leaves the walsender idle), timed from just"
	echo "before \`outbox_resume()\` / SIGCONT / SIGUSR2 (START_REPLICATION again from the confirmed"
	echo "position) until all is settled.  Every throughput run's Kafka topic is read back by"
	echo "\`test/tools/order_check\` (expected versions per aggregate; gaps, inversions, duplicates, losses)."
	echo "Steady load: \`pgbench --rate\` for $P_LAT_S s, one emit per transaction, aggregate random of"
	echo "10,000, each publisher running alone.  CPU: user + system ticks (\`/proc/PID/stat\`, ${HZ} Hz) of"
	echo "the publishing processes — the extension's worker; the relay or peer process plus its server"
	echo "backend (for logical decoding: the walsender, which does the decoding) — from the start of"
	echo "pgbench until everything is settled, divided by the events; % of a core over pgbench's $P_LAT_S s."
	echo "Latency commit→ack per event, every event of the run: the relay from its table (\`published_at -"
	echo "created_at\`, published_at taken right after the flush that had all acks of the batch); PgQ and"
	echo "logical decoding from the relay's own record (delivery-report time − the event's created_at, both"
	echo "\`clock_timestamp()\`-based wall clock); the extension from its own record: the delta over the run"
	echo "of \`outbox_latency_histogram()\`, which the worker fills with delivery-report time − created_at of"
	echo "every event it settles (the same definition), percentiles interpolated linearly inside their bucket"
	echo "(buckets of 0.5 ms up to 3 ms, 1 ms up to 10 ms, then 12, 15, 20, 25, 30, 40, 50, 75, 100 ms, …;"
	echo "max is the upper bound of the highest bucket used).  Until 2026-12-04 the extension's figures came"
	echo "from a sampler session beside it (every 20 ms, the aggregates settled since with their"
	echo "\`last_published_at\`): it cost CPU on a saturated machine beside the extension only, and gave an"
	echo "event the time of a later settle of its aggregate within the same 20 ms (about 1% of events at"
	echo "5,000/s over 10,000 aggregates: its p99 there was biased upward).  Section d still uses it."
	echo
	echo "| metric | $(for p in $PEERS; do printf '%s | ' "$(peer_name "$p")"; done)raw | best peer |"
	echo "|---|$(for p in $PEERS; do printf -- '---:|'; done)---:|---|"
	for m in "${M[@]}"; do
		IFS='|' read -r k title dir <<<"$m"
		read -r best bn <<<"$(best_peer "$k" "$dir")"
		printf '| %s |' "$title"
		local f=echo
		case $k in *.eps) f=fmt ;; esac
		for p in $PEERS; do printf ' %s |' "$(mr "${k//%/$p}" "$f")"; done
		printf ' %s | %s |\n' "$(mr "${k//%/raw}" fmt)" "$([ -n "$bn" ] && peer_name "$bn" || echo -)"
	done
	echo
	echo "The same as ratios: **the value / the outbox worker's** (throughput: > 1 = faster than the"
	echo "extension; CPU and latency: > 1 = more than the extension), and the outbox worker / the best peer"
	echo "(throughput: ≥ 1 = the extension is ahead; CPU, latency: ≤ 1 = the extension is ahead)."
	echo
	echo "| metric | $(for p in $PEERS; do [ "$p" = ours ] || printf '%s / outbox | ' "$(peer_name "$p")"; done)raw / outbox | **outbox / best peer** |"
	echo "|---|$(for p in $PEERS; do [ "$p" = ours ] || printf -- '---:|'; done)---:|---:|"
	for m in "${M[@]}"; do
		IFS='|' read -r k title dir <<<"$m"
		read -r best bn <<<"$(best_peer "$k" "$dir")"
		o=$(eval "echo \${R[${k//%/ours}]:-}")
		printf '| %s |' "$title"
		for p in $PEERS; do
			[ "$p" = ours ] && continue
			printf ' %s |' "$(ratio "$(eval "echo \${R[${k//%/$p}]:-}")" "$o")"
		done
		printf ' %s | **%s** |\n' "$(ratio "$(eval "echo \${R[${k//%/raw}]:-}")" "$o")" "$(ratio "$o" "$best")"
	done
	echo
	echo "Throughput with 2 and 4 outbox workers (section e, same run, 10,000 aggregates, 0 ms, median (range) of $E_REPS round(s)): $(mrf e.ours.2.eps)/s and"
	echo "$(mrf e.ours.4.eps)/s ($(ratio "${R[e.ours.2.eps]}" "${R[e.ours.1.eps]}")× and $(ratio "${R[e.ours.4.eps]}" "${R[e.ours.1.eps]}")× one worker's $(fmt "${R[e.ours.1.eps]}")/s there; $(ratio "${R[e.ours.2.eps]}" "$(best_peer 'p.tp0.%.eps' hi | cut -d' ' -f1)")× and"
	echo "$(ratio "${R[e.ours.4.eps]}" "$(best_peer 'p.tp0.%.eps' hi | cut -d' ' -f1)")× the best peer of p1)."
	echo
	read -r best bn <<<"$(best_peer 'p.tp0.%.eps' hi)"
	local b5 bcpu bp99
	b5=$(best_peer 'p.tp5.%.eps' hi | cut -d' ' -f1)
	echo "Targets of issue 11 (this run):"
	echo
	echo "| target | result | |"
	echo "|---|---|---|"
	echo "| throughput, 1 worker, 0 ms RTT ≥ 1.1× the best peer | $(ratio "${R[p.tp0.ours.eps]}" "$best")× ($(peer_name "$bn")) | $(met "${R[p.tp0.ours.eps]:-0} >= 1.1 * ${best:-1}") |"
	echo "| throughput, 5 ms RTT ≥ 1.0× the best peer | $(ratio "${R[p.tp5.ours.eps]}" "$b5")× | $(met "${R[p.tp5.ours.eps]:-0} >= ${b5:-1}") |"
	for rate in $P_RATES; do
		bcpu=$(best_peer "p.st.$rate.%.cpu_us" lo | cut -d' ' -f1)
		echo "| CPU per event at $(fmt "$rate")/s ≤ the best peer's | ${R[p.st.$rate.ours.cpu_us]} vs ${bcpu} µs | $(met "${R[p.st.$rate.ours.cpu_us]:-999999} <= ${bcpu:-0}") |"
	done
	echo "| CPU at 1,000 events/s ≤ 15% of a core | ${R[p.st.1000.ours.cpu_pct]:-}% | $(met "${R[p.st.1000.ours.cpu_pct]:-100} <= 15") |"
	for rate in $P_RATES; do
		[ "$rate" = 1000 ] && continue
		echo "| p99 commit→ack at $(fmt "$rate")/s ≤ logical decoding's (table) | ${R[p.st.$rate.ours.p99]} vs ${R[p.st.$rate.logical.p99]} ms | $(met "${R[p.st.$rate.ours.p99]:-999999} <= ${R[p.st.$rate.logical.p99]:-0}") |"
	done
	echo
	echo "The same steady loads with the extension paced: \`outbox.read_interval = $PACED_INTERVAL\`,"
	echo "\`outbox.read_commits = 1000000\` (a read at most every $PACED_INTERVAL while events come;"
	echo "a backlog is still read at once): fewer, larger reads, settlings and ProduceRequests, for"
	echo "up to $PACED_INTERVAL more latency. Same run, same peers:"
	echo
	echo "| rate | CPU µs/event: paced / default / best peer | CPU % of a core: paced / default | p50 commit→ack (ms): paced / default | p99 (ms): paced / default / logical decoding (table) | CPU ≤ best peer's and p99 ≤ logical decoding's, paced |"
	echo "|---|---|---|---|---|---|"
	for rate in $P_RATES; do
		read -r bcpu bn <<<"$(best_peer "p.st.$rate.%.cpu_us" lo)"
		bp99=${R[p.st.$rate.logical.p99]:-}
		local ok
		ok=$(met "${R[p.st.$rate.paced.cpu_us]:-999999} <= ${bcpu:-0}")
		[ "$rate" = 1000 ] || ok="$ok / $(met "${R[p.st.$rate.paced.p99]:-999999} <= ${bp99:-0}")"
		echo "| $(fmt "$rate")/s | ${R[p.st.$rate.paced.cpu_us]:-} / ${R[p.st.$rate.ours.cpu_us]:-} / ${bcpu:-} ($(peer_name "$bn")) | ${R[p.st.$rate.paced.cpu_pct]:-} / ${R[p.st.$rate.ours.cpu_pct]:-} | ${R[p.st.$rate.paced.p50]:-} / ${R[p.st.$rate.ours.p50]:-} | ${R[p.st.$rate.paced.p99]:-} / ${R[p.st.$rate.ours.p99]:-} / ${bp99:--} | $ok |"
	done
	echo
	echo "Order check of every throughput run, every round (\`test/tools/order_check\`):"
	echo
	for k in tp0 tp5 tx1000; do
		for p in $PEERS; do
			[ -n "${R[p.$k.$p.order_check]:-}" ] || continue
			echo "- $k $(peer_name "$p") ($(oc_clean "${R[p.$k.$p.order_check]}")): \`${R[p.$k.$p.order_check]}\`"
		done
	done
	echo
	echo "Per-run totals of the relays and peers (throughput, 0 ms, first round; events include the warm-up):"
	echo
	for p in $PEERS; do
		[ "$p" = ours ] && continue
		echo "- $(peer_name "$p"): \`${R[p.tp0.$p.r1.line]:-}\`"
	done
	echo
	echo "All rounds, events/s at 0 ms: $(for p in $PEERS raw; do printf '%s %s; ' "$p" "${R[p.tp0.$p.eps.all]:-}"; done)"
	echo "at 5 ms: $(for p in $PEERS raw; do printf '%s %s; ' "$p" "${R[p.tp5.$p.eps.all]:-}"; done)"
	echo "1,000 transactions: $(for p in $PEERS; do printf '%s %s; ' "$p" "${R[p.tx1000.$p.eps.all]:-}"; done)"
	echo "Achieved pgbench rates (median): $(for rate in $P_RATES; do for p in $PEERS paced; do printf '%s@%s %s; ' "$p" "$rate" "${R[p.st.$rate.$p.tps]:-}"; done; done)"
	echo
}
