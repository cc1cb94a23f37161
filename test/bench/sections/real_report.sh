# test/bench/sections/real_report.sh -- real mode: its report, then stop.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# ------------------------------------------------ real mode: report, stop
if [ "$real" = 1 ]; then
	res machine.load_end "$(cut -d' ' -f1-3 /proc/loadavg)"
	res total_s "$(($(date +%s) - started))"
	res kafka "$("$tools/kafka_cluster" classpath 2>/dev/null | tr ':' '\n' |
		sed -n 's|.*/kafka_\([0-9.]*\)-\([0-9.]*\)\.jar$|\2 (Scala \1)|p' | head -n1)"
	say "report"
	set +u
	{
		echo "## On real Kafka (3 brokers, RF 3, acks=all)"
		echo
		echo "Produced by \`bash test/bench/run.sh real$([ "$mode" = quick ] && echo ' quick')\` (as root) on ${R[date]}; total"
		echo "run time ${R[total_s]} s.  Everything above this section comes from a different run, against the"
		echo "mock: compare ratios, not absolute figures, across the two."
		echo
		echo "| | |"
		echo "|---|---|"
		echo "| Kafka | Apache Kafka ${R[kafka]:-3.9}, \`test/tools/kafka_cluster start DIR --brokers 3\`: 3 KRaft broker+controller JVMs (heap 512 MB) on 127.0.0.1, \`min.insync.replicas=2\`; each topic \`kafka_cluster topic DIR NAME 16 3\` (16 partitions, replication factor 3) |"
		echo "| producers | extension, relay and raw producer alike: librdkafka ${R[rdkafka]}, \`enable.idempotence=true\` (hence \`acks=all\`), \`partitioner=murmur2_random\` |"
		echo "| load average | ${R[machine.load_start]} at start, ${R[load.b]} at (b), ${R[load.d]} at (d), ${R[machine.load_end]} at the end (2 CPUs, shared with other test runs and CI) |"
		echo "| extension | outbox ${R[ext]}, repository at ${R[git]}; installed outbox.so ${R[so]} |"
		echo "| PostgreSQL | ${R[pg]} |"
		echo
		echo "The three Kafka JVMs share the 2 CPUs with PostgreSQL, the publisher, pgbench and the relay,"
		echo "and an acknowledgement with \`acks=all\` waits until two followers have fetched the batch (what"
		echo "that costs here: the relay's ack per batch, below), where the mock answered at once.  Method as"
		echo "in (b) and (d) above.  Section (c) is not repeated (see the end of this section)."
		echo
		echo "### Throughput ($(fmt "$N") preloaded events)"
		echo
		echo "| aggregates | extension events/s | relay events/s | raw producer events/s | extension / relay | extension / raw | relay / raw |"
		echo "|---:|---:|---:|---:|---:|---:|---:|"
		for a in $B_AGGS; do
			echo "| $(fmt "$a") | $(fmt "${R[b.ours.$a.eps]}") | $(fmt "${R[b.relay.$a.eps]}") | $(fmt "${R[b.raw.$a.eps]}") | **$(ratio "${R[b.ours.$a.eps]}" "${R[b.relay.$a.eps]}")×** | $(ratio "${R[b.ours.$a.eps]}" "${R[b.raw.$a.eps]}") | $(ratio "${R[b.relay.$a.eps]}" "${R[b.raw.$a.eps]}") |"
		done
		echo
		if [ "$B_REPS" -gt 1 ]; then
			echo "The median of $B_REPS interleaved rounds; every round, events/s at 10,000 aggregates: extension"
			echo "${R[b.ours.10000.eps.all]}; relay ${R[b.relay.10000.eps.all]}."
			echo
		fi
		echo "| aggregates | extension: s to drain (table) | first ack after commit | relay: s to drain |"
		echo "|---:|---|---:|---:|"
		for a in $B_AGGS; do
			echo "| $(fmt "$a") | ${R[b.ours.$a.seconds]} (${R[b.ours.$a.table_seconds]}) | ${R[b.ours.$a.first_ack]} s | ${R[b.relay.$a.seconds]} |"
		done
		echo
		echo "The extension's step means (ms, from the debug1 lines of one extra, untimed profile run per"
		echo "aggregate count, as in (b)):"
		echo
		echo "| run | reads | events/read | fetch | produce | settles | aggregates/settle | settle + commit |"
		echo "|---|---:|---:|---:|---:|---:|---:|---:|"
		for k in $(printf 'b.profile.%s ' $B_AGGS); do
			echo "| $k | $(bfield "$k" 1) | $(bfield "$k" 2) | $(bfield "$k" 3) | $(bfield "$k" 4) | $(bfield "$k" 5) | $(bfield "$k" 6) | $(bfield "$k" 7) |"
		done
		echo
		echo "The relay's totals (per batch of ≤ 100 rows, ms):"
		echo
		for a in $B_AGGS; do echo "- b.relay.$a: \`${R[b.relay.$a.relay]:-}\`"; done
		echo
		report_order_check
		echo
		echo "### Latency at a steady rate"
		echo
		echo "\`pgbench -n -M prepared -c $LAT_CLIENTS -j 2 --rate R -T $LAT_S\`, publish time − \`created_at\` of every event, as in (d)."
		echo
		echo "| rate (events/s) | achieved tps (ext. / relay) | extension p50 | p99 | max | relay p50 | p99 | max | p99 relay / extension | publisher CPU % (ext. / relay) | events per extension batch |"
		echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		report_latency_rows
		echo
		report_tail_table
		echo
		echo "The emitting side: pgbench's transaction latency and schedule lag (ms; a rate it cannot keep"
		echo "shows as lag), and what its backends were doing, sampled every 0.2 s from \`pg_stat_activity\`"
		echo "(\`CPU\` = active, no wait event; a wait on the publisher would show as a Lock wait):"
		echo
		echo "| run | pgbench latency avg / lag avg | backends' samples |"
		echo "|---|---:|---|"
		for rate in $RATES; do
			for side in ours relay; do
				echo "| d.$side.$rate | $(tr ' ' '\n' <<<"${R[d.$side.$rate.pgbench_ms]:-}" | paste -sd/ | sed 's|/| / |') | ${R[d.$side.$rate.waits]:-} |"
			done
		done
		echo
		echo "### Round trip"
		echo
		echo "Not measured: a real broker's round trip cannot be set like the mock's (\`rtt all\`), and"
		echo "\`tc netem\` on the loopback would delay PostgreSQL and every other user of the shared machine's"
		echo "127.0.0.1 too.  The real cluster's own round trip (replication to two followers before each"
		echo "acknowledgement) is what the figures above include.  This mode draws no plots; the two above"
		echo "are from the mock run."
	} >"$out/benchmarks_real.md"
	say "done: $out/benchmarks_real.md"
	exit 0
fi
