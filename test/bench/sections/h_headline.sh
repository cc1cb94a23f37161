# test/bench/sections/h_headline.sh -- headline mode: the headline
# comparison alone, its report in out/headline.md, then stop.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before (peers.sh by start.sh).
#
#   h1  N events over AGGS_MAIN aggregates preloaded in one transaction:
#       the extension with 1 worker, PgQ, logical decoding (table and
#       messages), raw librdkafka, the extension with 2 workers
#   h2  N events in 1,000 transactions preloaded while the publisher was
#       stopped: the extension (1 worker), PgQ, logical decoding
#   h3  (the mock only) h1's one-transaction runs of the extension (1
#       worker), the peers and raw librdkafka at 5 ms round trip (rtt all 5)
#
# HL_REPS rounds of each, interleaved (every publisher once, then again);
# every run read back by order_check (exit status 3 if one is not clean).
# The extension runs right after a
# restart with its worker count, then one untimed run of N / 10 events.

# A restart with w workers, then an untimed drain of N / 10 events.
headline_restart() { # workers
	restart_pg "$1"
	measure_ours "h.settle.$1" $((N / 10)) "$AGGS_MAIN" >/dev/null
}

# h1 and h2 (above), every round, then the medians and ranges.
headline_run() {
	local r p
	PEERS="ours pgq logical logmsg"
	peers_setup
	HL_PEERS=${PEERS#ours }
	res load.h "$(cut -d' ' -f1-3 /proc/loadavg)"
	say "h1. $N events over $AGGS_MAIN aggregates in one transaction: the extension (1 and 2 workers), $HL_PEERS, raw; $HL_REPS interleaved round(s)"
	for r in $(seq "$HL_REPS"); do
		headline_restart 1
		peer_throughput "h.tp.ours.r$r" ours "$N" "$AGGS_MAIN" 1
		for p in $HL_PEERS raw; do peer_throughput "h.tp.$p.r$r" "$p" "$N" "$AGGS_MAIN" 1; done
		headline_restart 2
		peer_throughput "h.tp.ours2.r$r" ours "$N" "$AGGS_MAIN" 1
	done
	say "h2. $N events in 1,000 transactions, preloaded while the publisher was stopped; $HL_REPS interleaved round(s)"
	headline_restart 1
	for r in $(seq "$HL_REPS"); do
		for p in ours $HL_PEERS; do peer_throughput "h.tx.$p.r$r" "$p" "$N" "$AGGS_MAIN" 1000; done
	done
	if [ -z "$kafka" ]; then
		say "h3. h1 at 5 ms round trip (rtt all 5), 1 worker; $HL_REPS interleaved round(s)"
		mk rtt all 5
		for r in $(seq "$HL_REPS"); do
			for p in ours $HL_PEERS raw; do peer_throughput "h.rtt5.$p.r$r" "$p" "$N" "$AGGS_MAIN" 1; done
		done
		mk rtt all 0
		for p in ours $HL_PEERS raw; do peer_rounds "h.rtt5.$p" "$HL_REPS" eps seconds; done
	fi
	for p in ours ours2 $HL_PEERS raw; do peer_rounds "h.tp.$p" "$HL_REPS" eps seconds busy_cores pids_cores; done
	for p in ours $HL_PEERS; do peer_rounds "h.tx.$p" "$HL_REPS" eps seconds; done
	res machine.load_end "$(cut -d' ' -f1-3 /proc/loadavg)"
	res total_s "$(($(date +%s) - started))"
}

# Per round: the extension / the best peer of that round ("r1 1.02, ...").
headline_round_ratios() { # prefix (h.tp | h.tx)
	local r p v best s=""
	for r in $(seq "$HL_REPS"); do
		best=
		for p in $HL_PEERS; do
			v=${R[$1.$p.r$r.eps]:-}
			[ -n "$v" ] || continue
			if [ -z "$best" ] || awk -v v="$v" -v b="$best" 'BEGIN { exit !(v > b) }'; then best=$v; fi
		done
		s="$s${s:+, }r$r $(ratio "${R[$1.ours.r$r.eps]:-}" "$best")"
	done
	echo "$s"
}

# One row of the table: every publisher's median (range), the best peer, the ratios.
headline_row() { # title prefix
	local best bn p
	read -r best bn <<<"$(best_peer "$2.%.eps" hi)"
	printf '| %s | %s |' "$1" "$(mrf "$2.ours.eps")"
	for p in $HL_PEERS; do printf ' %s |' "$(mrf "$2.$p.eps")"; done
	printf ' %s | %s | **%s** | %s |\n' "$(mrf "$2.raw.eps")" "$([ -n "$bn" ] && peer_name "$bn" || echo -)" \
		"$(ratio "${R[$2.ours.eps]:-}" "$best")" "$(ratio "${R[$2.ours.eps]:-}" "${R[$2.raw.eps]:-}")"
}

# The report: how it was measured, the table, every round, the order checks.
headline_report() {
	local p k all=""
	set +u
	echo "# Headline comparison"
	echo
	echo "Produced by \`${BENCH_COMMAND:-bash test/bench/run.sh $([ -n "$kafka" ] && echo 'real ')headline$([ "$mode" = quick ] && echo ' quick')}\` (as root) on ${R[date]}; total run time"
	echo "${R[total_s]} s; load average ${R[machine.load_start]} at start, ${R[machine.load_end]} at the end"
	echo "(${R[machine.nproc]} CPUs, ${R[machine.cpu]})."
	echo "${R[pg]}; librdkafka ${R[rdkafka]}; outbox ${R[ext]}, repository at ${R[git]}; outbox.so ${R[so]};"
	if [ -n "$kafka" ]; then
		echo "PgQ ${R[pgq.version]:-not installed}.  A real Apache Kafka 3.9 cluster (\`test/tools/kafka_cluster start DIR"
		echo "--brokers 3\`: 3 brokers on this machine, replication factor 3, \`min.insync.replicas=2\`, 16"
		echo "partitions per topic; every producer \`acks=all\`)."
	else
		echo "PgQ ${R[pgq.version]:-not installed}.  Mock Kafka (\`test/tools/mock_kafka --brokers 3\`, 16 partitions"
		echo "per topic) with the TCP_NODELAY shim (test/bench/README.md)."
	fi
	echo
	echo "$(fmt "$N") events over $(fmt "$AGGS_MAIN") aggregates preloaded in one transaction while the publisher"
	echo "runs, warm; timed from the commit until the publisher has published them all, watching only what"
	echo "it reports, every ${BENCH_DRAIN_INTERVAL_MS:-2} ms (the extension: its shared-memory counter \`events_published\`; PgQ and"
	echo "logical decoding: their status file), no debug logging.  1,000 transactions: the same events"
	echo "preloaded in 1,000 transactions while the publisher was stopped, timed from its resumption."
	[ -n "$kafka" ] || echo "5 ms round trip: the mock delays every broker response by 5 ms (\`rtt all 5\`)."
	echo "$HL_REPS interleaved rounds (every publisher once, then again); each cell is the median events/s"
	echo "and, in parentheses, the range (min–max).  The extension runs right after a restart with its"
	echo "worker count (\`outbox.workers\`) and one untimed run of $(fmt $((N / 10))) events.  Ratios are of the"
	echo "medians.  Peers, settings and method: docs/benchmarks.md, section Method."
	echo
	echo "| figure | outbox, 1 worker |$(for p in $HL_PEERS; do printf ' %s |' "$(peer_name "$p")"; done) raw librdkafka | best peer | **outbox / best peer** | outbox / raw |"
	echo "|---|---:|$(for p in $HL_PEERS; do printf -- '---:|'; done)---:|---|---:|---:|"
	headline_row "$(fmt "$N") events, 1 transaction (events/s)" h.tp
	headline_row "$(fmt "$N") events in 1,000 transactions (events/s)" h.tx
	[ -n "$kafka" ] || headline_row "$(fmt "$N") events, 1 transaction, 5 ms round trip (events/s)" h.rtt5
	echo "| 2 workers, $(fmt "$N") events, 1 transaction (events/s) | $(mrf h.tp.ours2.eps) |$(for p in $HL_PEERS; do printf ' |'; done) | | **$(ratio "${R[h.tp.ours2.eps]:-}" "$(best_peer 'h.tp.%.eps' hi | cut -d' ' -f1)")** | $(ratio "${R[h.tp.ours2.eps]:-}" "${R[h.tp.raw.eps]:-}") |"
	echo
	echo "2 workers / 1 worker: **$(ratio "${R[h.tp.ours2.eps]:-}" "${R[h.tp.ours.eps]:-}")**."
	echo "Outbox / best peer per round: 1 transaction $(headline_round_ratios h.tp); 1,000 transactions"
	echo "$(headline_round_ratios h.tx)$([ -n "$kafka" ] || echo "; 5 ms round trip $(headline_round_ratios h.rtt5)")."
	echo
	echo "Cores kept busy from the commit to the last acknowledgement of the one-transaction drains"
	echo "(drain_wait: CPU time over that time, the median of the rounds, from /proc; the machine has"
	echo "${R[machine.nproc]}): the whole machine, then the publisher's processes (all their threads; a"
	echo "peer's with its server backend or walsender):"
	echo
	echo "| publisher | machine | publisher |"
	echo "|---|---:|---:|"
	for p in ours ours2 $HL_PEERS; do
		[ -n "${R[h.tp.$p.busy_cores]:-}" ] || continue
		echo "| $([ "$p" = ours2 ] && echo "outbox, 2 workers" || peer_name "$p") | ${R[h.tp.$p.busy_cores]} | ${R[h.tp.$p.pids_cores]} |"
	done
	echo
	echo "Every round, events/s:"
	echo
	for k in h.tp h.tx h.rtt5; do
		for p in ours ours2 $HL_PEERS raw; do
			[ -n "${R[$k.$p.eps.all]:-}" ] && echo "- $k $p: ${R[$k.$p.eps.all]}"
		done
	done
	echo
	for k in h.tp h.tx h.rtt5; do
		for p in ours ours2 $HL_PEERS; do all="$all ${R[$k.$p.order_check]:-}"; done
	done
	echo "Order checks (\`test/tools/order_check\`, every run's topic read back against the expected"
	echo "versions per aggregate): **$(oc_clean "$(tr '|' '\n' <<<"$all")")**"
	echo
	for k in h.tp h.tx h.rtt5; do
		for p in ours ours2 $HL_PEERS; do
			[ -n "${R[$k.$p.order_check]:-}" ] && echo "- $k $p: \`${R[$k.$p.order_check]}\`"
		done
	done
	echo
}

headline_run
headline_report >"$out/headline.md"
say "done: $out/headline.md"
# (exit status 3: an order check was not clean; the report is written)
grep -q '^versions per aggregate): \*\*clean\*\*' "$out/headline.md" || exit 3
exit 0
