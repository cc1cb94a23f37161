# test/bench/sections/report.sh -- the report, benchmarks.md.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# ----------------------------------------------------------------- report
set +u

{
	cat <<EOF
# Benchmarks

Produced by \`test/bench/run.sh\` (${R[mode]} mode) on ${R[date]}; total run time ${R[total_s]} s.
Do not edit by hand: run the benchmark again (as root: \`bash test/bench/run.sh\`,
about 40 minutes; \`bash test/bench/run.sh quick\` checks the script in
about 5 minutes and writes to /tmp/outbox-bench-quick/; \`bash test/bench/run.sh headline\`
is the headline comparison alone).  The peers — PgQ, logical decoding, the polling
relay and raw librdkafka beside the extension, every figure as a ratio to the extension and
to the best peer — are in [section p](#p-peers-the-extension-beside-pgq-logical-decoding-the-polling-relay-and-raw-librdkafka).

| | |
|---|---|
| command | \`bash test/bench/run.sh$([ "$mode" = quick ] && echo " quick")\` (as root; re-runs itself as postgres) |
| machine | ${R[machine.nproc]} CPUs (\`nproc\`), ${R[machine.cpu]}; memory ${R[machine.mem]} (\`free -h\`); ${R[machine.kernel]} |
| load average | ${R[machine.load_start]} at start, ${R[machine.load_end]} at the end (the machine is shared with other test runs) |
| PostgreSQL | ${R[pg]} |
| librdkafka | ${R[rdkafka]} (extension, relay, raw producer and mock alike) |
| extension | outbox ${R[ext]}, repository at ${R[git]}; installed outbox.so ${R[so]} |
| Kafka | \`test/tools/mock_kafka --brokers 3\` on 127.0.0.1, topics of 16 partitions; TCP_NODELAY shim: ${R[mock_nodelay]} (see below) |

Everything runs on one machine: PostgreSQL, the publisher, the mock brokers, pgbench and
the relay share the ${R[machine.nproc]} CPUs.  All clients connect over TCP to 127.0.0.1.
PostgreSQL runs with default durability (\`fsync\` and \`synchronous_commit\` on; fsync of
this disk takes ~0.13 ms), \`shared_buffers = 256MB\`, \`max_wal_size = 8GB\`,
\`checkpoint_timeout = 30min\` (an explicit CHECKPOINT precedes every measurement) and
\`max_locks_per_transaction = 512\` (the preload emits to 10,000 aggregates in one
transaction and \`outbox_emit\` takes one lock per aggregate).  The publisher runs with
its defaults (\`batch_events = 20000\`, librdkafka \`linger.ms = 2\`).

**The baselines.** \`test/bench/relay.c\`: the classic polling relay over a plain table
\`relay_outbox(id bigserial primary key, aggregate_id, aggregate_version, topic, headers
jsonb, payload jsonb, created_at default clock_timestamp(), published_at)\` with a partial
index on unpublished rows.  Loop: \`BEGIN; SELECT ... WHERE published_at IS NULL ORDER BY
id LIMIT 100 FOR UPDATE SKIP LOCKED\`, produce every row (key = aggregate_id; headers
event_id, event_type, aggregate_type from the headers column plus aggregate_id and
aggregate_version — the extension's set), one \`rd_kafka_flush()\` for all acks (it polls
in steps of at most 10 ms, returns as soon as the last delivery report is served, and
makes \`linger.ms\` count as elapsed), \`UPDATE ... SET published_at = clock_timestamp()
WHERE id = ANY(...)\`, COMMIT; an empty fetch sleeps 100 ms.  (\`clock_timestamp()\`, not
\`now()\`: \`now()\` is the transaction's start, before the SELECT, and would understate
the relay's latency.)  One relay process.  The **raw producer** (\`relay raw\`) produces N
pre-built messages of the same shape (key, the five headers, the same ~95-byte payload)
with librdkafka alone and waits for every ack (after a warm-up message).  Producer
settings of both: librdkafka defaults plus \`enable.idempotence=true\` and
\`partitioner=murmur2_random\`, as the extension.  Section p adds the tools a user would
pick instead: a PgQ relay and two logical-decoding relays (\`test/bench/peers.c\`).

**The mock's Nagle stall.** librdkafka 2.0.2 sends one ProduceRequest per partition, and
its mock broker never sets TCP_NODELAY on the connections it accepts (a real Kafka broker
does).  A batch spanning several partitions of one broker gets several small responses
written back to back, and Nagle's algorithm holds all but the first until the client's
delayed ACK: about 40 ms per batch, even on loopback, for any batch size (measured: 1, 2
or 10,000 messages to a 1-partition topic ack in ~5 ms; 5 to 10,000 messages to a
16-partition topic in ~45-50 ms; \`socket.nagle.disable\` on the client changes nothing).
Sections a–e therefore run the mock with \`LD_PRELOAD=test/bench/nodelay.so\`, which sets
TCP_NODELAY on every accepted socket; section f repeats two measurements against the mock
as shipped.

EOF

	echo "## a. Emit cost (pgbench, 2 clients)"
	echo
	echo "Each transaction: \`UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version\`"
	echo "(10,000 rows, id random), then either \`outbox_emit('order', 'order-' || :id, 'OrderPaid', <payload>, topic => ...)\`"
	echo "or a plain \`INSERT INTO relay_outbox (...)\` (aggregate_version from the business row, headers"
	echo "\`jsonb_build_object('event_id', gen_random_uuid()::text, ...)\`); \`pgbench -n -M prepared -c 2 -j 2\`,"
	echo "$EMIT_ROUNDS round(s) of $EMIT_S s per configuration, interleaved (configurations of one publisher state"
	echo "back to back, their order reversed every other round); tables truncated and CHECKPOINT before each."
	echo "Two diagnostic rows: the UPDATE alone, and a plain INSERT into \`outbox_copy\` (\`LIKE outbox"
	echo "INCLUDING ALL\`: every column, CHECK constraint and index of the extension's table, event_id from"
	echo "\`uuid_v7()\`), to separate the cost of the table from the cost of the function."
	echo
	echo "| configuration | tps (mean) | per round | backlog at end | + µs per transaction over the UPDATE alone | publisher CPU, % of one core (per round) | events per publisher batch (per round) |"
	echo "|---|---:|---|---:|---:|---|---|"
	rounds() { local s="" r; for r in $(seq "$EMIT_ROUNDS"); do s="$s${s:+, }$(fmt "${R[a.$1.r$r.tps]}")"; done; echo "$s"; }
	backl() { local s="" r; for r in $(seq "$EMIT_ROUNDS"); do s="$s${s:+, }${R[a.$1.r$r.backlog]}"; done; echo "$s"; }
	extra() { awk -v a="${R[a.$1.tps]}" -v u="${R[a.update.w0.tps]}" 'BEGIN { if (a > 0 && u > 0) printf "%.0f\n", 2e6 / a - 2e6 / u; else print "-" }'; }
	perround() { local s="" r; for r in $(seq "$EMIT_ROUNDS"); do s="$s${s:+, }${R[a.$1.r$r.$2]}"; done; echo "$s"; }
	row() {
		local cpu="-" pb="-"
		case $1 in ours.w1 | plain.relay | plain.w1) cpu=$(perround "$1" pub_cpu) ;; esac
		[ "$1" = ours.w1 ] && pb=$(perround "$1" per_batch)
		echo "| $2 | $(fmt "${R[a.$1.tps]}") | $(rounds "$1") | $(backl "$1") | $3 | $cpu | $pb |"
	}
	R[a.update.w0.r1.backlog]="-"; R[a.copy.w0.r1.backlog]="-"
	for r in $(seq 2 "$EMIT_ROUNDS"); do R[a.update.w0.r$r.backlog]="-"; R[a.copy.w0.r$r.backlog]="-"; done
	row update.w0 "UPDATE alone (no event), workers = 0" "0"
	row plain.w0 "plain INSERT, outbox.workers = 0" "$(extra plain.w0)"
	row copy.w0 "plain INSERT into outbox_copy, workers = 0" "$(extra copy.w0)"
	row ours.w0 "outbox_emit, outbox.workers = 0" "$(extra ours.w0)"
	row plain.w1 "plain INSERT, workers = 1 (idle: nothing to publish)" "-"
	row plain.relay "plain INSERT, relay running" "-"
	row ours.w1 "outbox_emit, workers = 1 (publishing)" "-"
	echo
	echo "(µs per transaction: 2 clients × 10⁶ / tps, minus the same for the UPDATE alone: the event write's"
	echo "share of a transaction's wall time, including its extra client round trip.  Publisher CPU: user +"
	echo "system time from /proc of the extension's worker, or of the relay process plus its backend, over"
	echo "the run; events per batch from \`outbox_counters()\` (events_published / batches).)"
	echo
	echo "| ratio | of mean tps | median of per-round ratios |"
	echo "|---|---:|---|"
	echo "| outbox_emit / plain INSERT, no publisher | **$(ratio "${R[a.ours.w0.tps]}" "${R[a.plain.w0.tps]}")** | ${R[a.ratio.w0]} |"
	echo "| outbox_emit with its worker / plain INSERT with the relay running | **$(ratio "${R[a.ours.w1.tps]}" "${R[a.plain.relay.tps]}")** | ${R[a.ratio.w1]} |"
	echo "| outbox_emit with its worker / plain INSERT with an idle worker | $(ratio "${R[a.ours.w1.tps]}" "${R[a.plain.w1.tps]}") | |"
	echo "| INSERT into outbox_copy / plain INSERT, no publisher | $(ratio "${R[a.copy.w0.tps]}" "${R[a.plain.w0.tps]}") | ${R[a.ratio.copy]} |"
	echo
	echo "Target: emit transactions ≥ 0.85× plain insert — without publishers"
	echo "$(met "${R[a.ours.w0.tps]} >= 0.85 * ${R[a.plain.w0.tps]}") ($(ratio "${R[a.ours.w0.tps]}" "${R[a.plain.w0.tps]}")×); each with its publisher running"
	echo "$(met "${R[a.ours.w1.tps]} >= 0.85 * ${R[a.plain.relay.tps]}") ($(ratio "${R[a.ours.w1.tps]}" "${R[a.plain.relay.tps]}")×)."
	echo "Target: emit transactions ≥ 0.97× a plain INSERT into the same table (outbox_copy), no publisher:"
	echo "$(met "${R[a.ours.w0.tps]} >= 0.97 * ${R[a.copy.w0.tps]}") ($(ratio "${R[a.ours.w0.tps]}" "${R[a.copy.w0.tps]}")×; more rounds, backend CPU per"
	echo "transaction, from \`test/bench/emit_cost.sh\`, in docs/benchmarks.md, section Emit cost)."
	echo "Backlog = events still unpublished when pgbench ended (workers = 0: all of them)."
	echo
	if [ -n "${R[a.perf]}" ]; then
		echo "Where an emitting transaction's CPU goes: \`perf record -g\` on the backend of a 1-client run of"
		echo "the outbox_emit script (publisher stopped, $PERF_S s); inclusive share of the backend's samples"
		echo "(PostgresMain ≈ everything the backend did; emit_event = outbox_emit; ExecSimpleRelationInsert"
		echo "= its insert (heap and index tuples), last_version = its two index look-ups; the executor"
		echo "start-up is the UPDATE's and the SELECT's):"
		echo
		echo "| function | share |"
		echo "|---|---:|"
		tr ' ' '\n' <<<"${R[a.perf]}" | awk -F= '{ printf "| %s | %s |\n", $1, $2 }'
		echo
	fi

	echo "## b. Publish throughput ($(fmt "$N") preloaded events)"
	echo
	echo "Method: the publisher (extension worker, or relay process) is running and warm (one event of"
	echo "the same topic published first); one transaction emits (\`outbox_emit\` per row, from"
	echo "\`generate_series\`) or inserts all events, aggregate \`order-<i mod A>\`; the clock starts when its"
	echo "COMMIT returns; \`drain_wait\` stops it when the publisher has published them all, watching only"
	echo "what the publisher reports, every ${BENCH_DRAIN_INTERVAL_MS:-2} ms: the extension's shared-memory counter \`events_published\`"
	echo "(\`outbox_counters()\`: counted when a settle commits; no table or view is read), the relay's status"
	echo "file (rows marked by its committed batches).  No debug logging during any timed run.  events/s ="
	echo "events / that time.  Raw: time from the first produce to the last ack.  $B_REPS interleaved"
	echo "round(s) (extension, relay, raw, then again; each its own preload): the median, and the range"
	echo "(min–max) in parentheses."
	echo
	echo "| aggregates | extension events/s | relay events/s | raw producer events/s | extension / relay | extension / raw | relay / raw |"
	echo "|---:|---:|---:|---:|---:|---:|---:|"
	for a in 10000 10 1; do
		echo "| $(fmt $a) | $(mrf b.ours.$a.eps) | $(mrf b.relay.$a.eps) | $(mrf b.raw.$a.eps) | **$(ratio "${R[b.ours.$a.eps]}" "${R[b.relay.$a.eps]}")×** | $(ratio "${R[b.ours.$a.eps]}" "${R[b.raw.$a.eps]}") | $(ratio "${R[b.relay.$a.eps]}" "${R[b.raw.$a.eps]}") |"
	done
	echo
	echo "Medians of the same rounds:"
	echo
	echo "| aggregates | extension: s to drain (table: max(last_published_at) − commit) | first settle after commit (upper bound) | preload transaction | relay: s to drain | relay preload |"
	echo "|---:|---|---:|---:|---:|---:|"
	for a in 10000 10 1; do
		echo "| $(fmt $a) | ${R[b.ours.$a.seconds]} (${R[b.ours.$a.table_seconds]}) | ${R[b.ours.$a.first_ack]} s | ${R[b.ours.$a.preload_s]} s | ${R[b.relay.$a.seconds]} | ${R[b.relay.$a.preload_s]} s |"
	done
	echo
	echo "Every round, events/s at 10,000 aggregates: extension ${R[b.ours.10000.eps.all]}; relay"
	echo "${R[b.relay.10000.eps.all]}; raw ${R[b.raw.10000.eps.all]}.  Events per read of the extension"
	echo "(\`outbox_counters()\`: events_published / batches over the run): $(mr b.ours.10000.per_batch)."
	echo
	report_order_check
	echo
	echo "Target: ≥ 25,000 events/s with one worker (100k over 10k aggregates):"
	echo "$(met "${R[b.ours.10000.eps]} >= 25000") ($(fmt "${R[b.ours.10000.eps]}")/s)$([ "$N" != 100000 ] && echo " — quick mode: $N events, not comparable")."
	echo "Target: beat the relay 10×: $(met "${R[b.ours.10000.eps]} >= 10 * ${R[b.relay.10000.eps]}") at 10,000 aggregates ($(ratio "${R[b.ours.10000.eps]}" "${R[b.relay.10000.eps]}")×),"
	echo "$(met "${R[b.ours.10.eps]} >= 10 * ${R[b.relay.10.eps]}") at 10 ($(ratio "${R[b.ours.10.eps]}" "${R[b.relay.10.eps]}")×), $(met "${R[b.ours.1.eps]} >= 10 * ${R[b.relay.1.eps]}") at 1 ($(ratio "${R[b.ours.1.eps]}" "${R[b.relay.1.eps]}")×)."
	echo
	echo "Where the extension's time goes — one extra run per aggregate count after the rounds, not in any"
	echo "figure above, with \`log_min_messages = debug1\` (the debug lines cost the worker some of its"
	echo "time, so no timed run has them): step means from the server log (\"fetched ... produced\" per"
	echo "read, \"settled ... in\" per settle; ms, integer resolution per line; acknowledgements are awaited"
	echo "between the steps, not in one):"
	echo
	echo "| run | reads | events/read | fetch | produce | settles | aggregates/settle | settle + commit | time in steps / drain time |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
	for k in b.profile.10000 b.profile.10 b.profile.1; do
		[ -n "${R[$k.batches]:-}" ] || continue
		b=$(bfield "$k" 1)
		busy=$(awk -v b="$b" -v f="$(bfield "$k" 3)" -v p="$(bfield "$k" 4)" -v s="$(bfield "$k" 5)" -v t="$(bfield "$k" 7)" \
			'BEGIN { print (b * (f + p) + s * t) / 1000 }')
		echo "| $k | $b | $(bfield "$k" 2) | $(bfield "$k" 3) | $(bfield "$k" 4) | $(bfield "$k" 5) | $(bfield "$k" 6) | $(bfield "$k" 7) | $(ratio "$busy" "${R[$k.seconds]}") |"
	done
	echo
	mk_=(${R[mark]:-})
	if [ "${#mk_[@]}" = 3 ]; then
		echo "Settling, by hand: the worker's settling statement (as prepared in src/publish_settle.c: one"
		echo "row of \`aggregate_publication\` per aggregate, nothing written per event) on 10,000 pending"
		echo "events of 10,000 aggregates, first with no progress row yet (its INSERT path), then again over"
		echo "the same aggregates (its UPDATE path, guarded by each row's xmin), and the relay's UPDATE of"
		echo "10,000 rows (\`EXPLAIN ANALYZE\` execution time, publisher stopped):"
		echo
		echo "| statement | ms per 10,000 | µs per event |"
		echo "|---|---:|---:|"
		echo "| extension: settle, \`INSERT INTO aggregate_publication ... ON CONFLICT DO NOTHING\` (first settle of each aggregate) | ${mk_[0]} | $(awk -v a="${mk_[0]}" 'BEGIN { printf "%.1f", a / 10 }') |"
		echo "| extension: settle, \`UPDATE aggregate_publication ... WHERE xmin = ...\` (HOT updates: ${R[mark.hot]}; \`outbox\` is not written, its indexes: ${R[outbox.indexes]}) | ${mk_[1]} | $(awk -v a="${mk_[1]}" 'BEGIN { printf "%.1f", a / 10 }') |"
		echo "| relay: \`UPDATE relay_outbox SET published_at = clock_timestamp() WHERE id = ANY(...)\` (pk only) | ${mk_[2]} | $(awk -v a="${mk_[2]}" 'BEGIN { printf "%.1f", a / 10 }') |"
		echo
	fi
	echo "The relay's own totals (per batch of ≤ 100 rows, ms):"
	echo
	for k in b.relay.10000 b.relay.10 b.relay.1 c.relay.1 c.relay.5 c.relay.20 f.relay.10000; do
		[ -n "${R[$k.relay]:-}" ] && echo "- $k: \`${R[$k.relay]}\`"
	done
	echo

	echo "## c. Round-trip sensitivity ($(fmt "$N") events, 10,000 aggregates)"
	echo
	echo "\`rtt all <ms>\` on the mock delays every broker response (as (b), same method: $B_REPS interleaved"
	echo "round(s) per round trip, median (min–max))."
	echo
	echo "| round trip | extension events/s | relay events/s | raw events/s | extension / relay | extension / raw |"
	echo "|---:|---:|---:|---:|---:|---:|"
	echo "| 0 ms (b) | $(mrf b.ours.10000.eps) | $(mrf b.relay.10000.eps) | $(mrf b.raw.10000.eps) | $(ratio "${R[b.ours.10000.eps]}" "${R[b.relay.10000.eps]}") | $(ratio "${R[b.ours.10000.eps]}" "${R[b.raw.10000.eps]}") |"
	for rtt in 1 5 20; do
		echo "| $rtt ms | $(mrf c.ours.$rtt.eps) | $(mrf c.relay.$rtt.eps) | $(mrf c.raw.$rtt.eps) | **$(ratio "${R[c.ours.$rtt.eps]}" "${R[c.relay.$rtt.eps]}")×** | $(ratio "${R[c.ours.$rtt.eps]}" "${R[c.raw.$rtt.eps]}") |"
	done
	echo
	echo "Target: ≥ 10,000 events/s with 5 ms RTT: $(met "${R[c.ours.5.eps]} >= 10000") ($(fmt "${R[c.ours.5.eps]}")/s)."
	echo
	echo "![throughput vs round trip](throughput_vs_rtt.png)"
	echo

	echo "## d. Latency at a steady rate"
	echo
	echo "\`pgbench -n -M prepared -c $LAT_CLIENTS -j 2 --rate R -T $LAT_S\`, each transaction one statement:"
	echo "\`SELECT outbox_emit(...)\` (aggregate random of 10,000), or the relay's plain INSERT with the relay"
	echo "running (100 rows per batch, 100 ms sleep after an empty fetch).  Measured per event, from the"
	echo "tables after the run: publish time − \`created_at\`.  created_at is \`clock_timestamp()\` at the emit,"
	echo "which for a one-statement transaction is just before its commit (so this is commit-to-ack plus"
	echo "the statement's own run time, ~0.1-0.5 ms).  The relay's publish time is \`published_at\`"
	echo "(\`clock_timestamp()\` in its UPDATE, right after the flush).  The extension records no per-event"
	echo "publish time (an event is published once its aggregate's \`last_published_version\` reaches it):"
	echo "a sampler session (\`bench_sample_settled\`, every 20 ms) copies the aggregates settled since"
	echo "its last look, with \`last_published_at\` (when Kafka acknowledged that version: the delivery"
	echo "report's time) into \`bench_settled\`; an event's publish time is that of the first sampled"
	echo "settle reaching its version.  Exact unless one aggregate settled twice within 20 ms (then the"
	echo "earlier event gets the later time: ≤ 20 ms too late); so the settle commit is not included on"
	echo "either side.  Every event of the run counts (events whose settle was not sampled: none expected,"
	echo "counted in results.tsv as \`unsampled\`)."
	echo
	echo "| rate (events/s) | achieved tps | extension p50 | p99 | max | relay p50 | p99 | max | p99 relay / extension | publisher CPU % (ext. / relay) | events per extension batch |"
	echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	report_latency_rows
	echo
	if [ -n "${R[d.ours.1000.stats]:-}" ]; then
		echo "Target: p99 < 20 ms at 1,000 events/s: $(met "$(lf d.ours.1000 3) < 20") ($(lf d.ours.1000 3) ms)."
	fi
	echo
	echo "Events over 20 ms, and how they cluster in time (seconds of the run, by created_at):"
	echo
	report_tail_table
	echo
	echo "![latency CDF at 2,000 events/s](latency_cdf.png)"
	echo
	echo "The relay at each rate: "
	echo
	for rate in $RATES; do echo "- $rate/s: \`${R[d.relay.$rate.relay]:-}\`"; done
	echo

	echo "## e. Scaling with publisher workers ($(fmt "$N") events, 10,000 aggregates)"
	echo
	echo "\`outbox.workers\` = 1, 2, 4 (restart each), as (b); $E_REPS interleaved round(s) (1, 2, 4 workers,"
	echo "then again), median (min–max).  The workers split the aggregates by \`hashtext(aggregate_id)\` bucket."
	echo
	echo "| workers | events/s | vs 1 worker | s to drain | first run right after the restart: events/s |"
	echo "|---:|---:|---:|---:|---:|"
	for w in 1 2 4; do
		echo "| $w | $(mrf e.ours.$w.eps) | $(ratio "${R[e.ours.$w.eps]}" "${R[e.ours.1.eps]}") | $(mr e.ours.$w.seconds) | $(mrf e.ours.$w.cold.eps) |"
	done
	echo

	echo "## f. Against the mock as shipped (no TCP_NODELAY)"
	echo
	echo "| measurement | extension | relay | extension / relay |"
	echo "|---|---:|---:|---:|"
	echo "| throughput, $(fmt "$N") events (relay: $(fmt "$NAGLE_RELAY_N")) over 10,000 aggregates | $(fmt "${R[f.ours.10000.eps]}")/s | $(fmt "${R[f.relay.10000.eps]}")/s | $(ratio "${R[f.ours.10000.eps]}" "${R[f.relay.10000.eps]}") |"
	echo "| latency at 2,000/s, p50 / p99 / max | $(lf f.d.ours.2000 2) / $(lf f.d.ours.2000 3) / $(lf f.d.ours.2000 4) ms | $(lf f.d.relay.2000 2) / $(lf f.d.relay.2000 3) / $(lf f.d.relay.2000 4) ms | |"
	echo
	echo "With the shim, for comparison: $(fmt "${R[b.ours.10000.eps]}")/s vs $(fmt "${R[b.relay.10000.eps]}")/s; at 2,000/s"
	echo "$(lf d.ours.2000 2) / $(lf d.ours.2000 3) / $(lf d.ours.2000 4) ms vs $(lf d.relay.2000 2) / $(lf d.relay.2000 3) / $(lf d.relay.2000 4) ms."
	echo

	peers_report

	if [ -n "${stuck_n:-}" ]; then
		echo "## Runs that timed out"
		echo
		echo "The extension's publisher settled nothing for $DRAIN_TIMEOUT s in $stuck_n run(s); the run went on after"
		echo "dropping that backlog (their figures show as -).  What the publisher was doing (\`pg_stat_activity\`:"
		echo "state / wait / query):"
		echo
		for i in $(seq "$stuck_n"); do echo "- \`${R[stuck.$i]}\`"; done
		echo
	fi
	echo "## Targets"
	echo
	echo "| target | result | |"
	echo "|---|---|---|"
	echo "| ≥ 25,000 events/s, one worker, 100k events over 10k aggregates | $(fmt "${R[b.ours.10000.eps]}")/s | $(met "${R[b.ours.10000.eps]} >= 25000") |"
	echo "| ≥ 10,000 events/s with 5 ms RTT | $(fmt "${R[c.ours.5.eps]}")/s | $(met "${R[c.ours.5.eps]} >= 10000") |"
	if [ -n "${R[d.ours.1000.stats]:-}" ]; then
		echo "| p99 < 20 ms at 1,000 events/s | $(lf d.ours.1000 3) ms | $(met "$(lf d.ours.1000 3) < 20") |"
	fi
	echo "| emit transactions ≥ 0.85× plain insert (no publishers / each with its publisher) | $(ratio "${R[a.ours.w0.tps]}" "${R[a.plain.w0.tps]}")× / $(ratio "${R[a.ours.w1.tps]}" "${R[a.plain.relay.tps]}")× | $(met "${R[a.ours.w0.tps]} >= 0.85 * ${R[a.plain.w0.tps]}") / $(met "${R[a.ours.w1.tps]} >= 0.85 * ${R[a.plain.relay.tps]}") |"
	echo "| beat the relay 10× (throughput, 10k / 10 / 1 aggregates) | $(ratio "${R[b.ours.10000.eps]}" "${R[b.relay.10000.eps]}")× / $(ratio "${R[b.ours.10.eps]}" "${R[b.relay.10.eps]}")× / $(ratio "${R[b.ours.1.eps]}" "${R[b.relay.1.eps]}")× | $(met "${R[b.ours.10000.eps]} >= 10 * ${R[b.relay.10000.eps]}") / $(met "${R[b.ours.10.eps]} >= 10 * ${R[b.relay.10.eps]}") / $(met "${R[b.ours.1.eps]} >= 10 * ${R[b.relay.1.eps]}") |"
	echo "| beat the relay 10× (throughput at 1 / 5 / 20 ms RTT) | $(ratio "${R[c.ours.1.eps]}" "${R[c.relay.1.eps]}")× / $(ratio "${R[c.ours.5.eps]}" "${R[c.relay.5.eps]}")× / $(ratio "${R[c.ours.20.eps]}" "${R[c.relay.20.eps]}")× | $(met "${R[c.ours.1.eps]} >= 10 * ${R[c.relay.1.eps]}") / $(met "${R[c.ours.5.eps]} >= 10 * ${R[c.relay.5.eps]}") / $(met "${R[c.ours.20.eps]} >= 10 * ${R[c.relay.20.eps]}") |"
	echo
	echo "Raw results (key, value): see the run's results.tsv; per-step logs stay in the work directory"
	echo "only when a run fails."
} >"$out/benchmarks.md"
cp "$out/results.tsv" "$work/" 2>/dev/null || true
say "done: $out/benchmarks.md"
