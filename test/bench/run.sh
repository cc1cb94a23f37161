#!/usr/bin/env bash
#
# test/bench/run.sh [quick]
# test/bench/run.sh real [quick]
# test/bench/run.sh headline [quick]
# test/bench/run.sh real headline [quick]
#
# The outbox benchmark suite: prints figures, judges nothing.  One command
# starts a mock Kafka cluster (test/tools/mock_kafka, 3 brokers on
# 127.0.0.1) and a throwaway PostgreSQL cluster with
# shared_preload_libraries = 'outbox', and measures in the same run, so that
# ratios are meaningful:
#
#   a. emit cost: pgbench, 2 clients, a business UPDATE + outbox_emit() vs
#      the same UPDATE + a plain INSERT into relay_outbox; with the publisher
#      stopped (outbox.workers = 0) and running (workers = 1; for the plain
#      table: with the relay running, and with only an idle worker)
#   b. publish throughput: 100,000 preloaded events over 10,000 / 10 / 1
#      aggregates: the extension vs the polling relay (relay.c) vs a raw
#      librdkafka producer
#   c. (b, 10,000 aggregates) with the mock's round trip set to 1, 5, 20 ms
#   d. emit-to-acknowledgement latency at steady 500/1,000/2,000/5,000
#      events/s (pgbench --rate), per event: the relay's published_at -
#      created_at; the extension's settle time of the event's aggregate
#      (aggregate_publication.last_published_at, sampled every 20 ms by
#      settle_sampler: the extension keeps no per-event publish time)
#   e. 1, 2, 4 publisher workers on (b, 10,000 aggregates)
#   p. the peers, in the same run: PgQ and logical-decoding relays
#      (peers.c), the relay at LIMIT 100 / 1000 and raw librdkafka beside
#      the extension; throughput (0 / 5 ms RTT, a 1,000-transaction
#      backlog), CPU per event and latency at a steady rate (peers.sh)
#   f. (b, 10,000 aggregates) and (d, 2,000/s) against the mock as shipped
#      (Nagle's algorithm on its sockets; see nodelay.c)
#
# As root: builds test/tools and test/bench, re-runs itself as postgres and
# writes benchmarks.md (the run's full report) and the plots into
# /tmp/outbox-bench/ (quick mode: /tmp/outbox-bench-quick/) unless BENCH_OUT
# is set; docs/benchmarks.md is the results page, updated by hand from such
# runs, and docs/*.png are copied from a full run.  The extension must be installed
# (make && make install).  Full mode takes about 40 minutes, quick about
# 5.  Every step is bounded in time; the clusters and
# processes it started stop when it exits.  The work directory (logs) is
# kept when a run fails.
#
# How the end of a drain is detected, in every mode: drain_wait watches what
# the publisher itself reports -- the extension's shared-memory counter
# events_published (outbox_counters()), a relay's or peer's status file --
# never the outbox tables or views; no timed run has debug logging (one
# extra, untimed profile run per aggregate count in (b) has it, for the step
# timings).  The throughput, round-trip, scaling and peers figures are
# medians of interleaved rounds (every publisher once, then again), with
# their range.
#
# headline mode: the headline comparison alone (sections/h_headline.sh):
# 100,000 events over 10,000 aggregates preloaded in one transaction, the
# extension with 1 and 2 workers, PgQ, the two logical-decoding relays and
# raw librdkafka; then 100,000 events in 1,000 transactions; 3 interleaved
# rounds (BENCH_ROUNDS), every run order-checked (exit status 3 if one is
# not clean); prints the table (medians,
# ranges, ratios to the best peer) and writes headline.md into BENCH_OUT or
# /tmp/outbox-bench-headline/.  On the mock, the one-transaction comparison
# again at 5 ms round trip (rtt all 5).  real headline: the same against
# the real 3-broker cluster (no 5 ms rows), into
# /tmp/outbox-bench-headline-real/.  About 2-3 minutes (real: 5); quick:
# 10,000 events, 2 rounds, a check that it works.
#
# real mode: (b) at 10,000 and 1 aggregates (3 interleaved rounds, quick 1)
# and (d) at 500 and 2,000/s
# (quick: one rate) against a real Apache Kafka 3.9 cluster started with
# test/tools/kafka_cluster (3 brokers, replication factor 3,
# min.insync.replicas 2; every producer uses acks=all through
# enable.idempotence), topics of 16 partitions as on the mock.  (c) does not
# apply: a real broker's round trip cannot be set, and delaying 127.0.0.1
# with tc netem would delay every other user of the shared loopback too.
# It replaces the "On real Kafka" section at the end of BENCH_OUT's
# benchmarks.md, default /tmp/outbox-bench-real/ (quick: writes /tmp/outbox-bench-real-quick/benchmarks_real.md); full
# mode keeps that section.  About 10 minutes (more under load: (b) has 3
# interleaved rounds), quick about 3.
#
# Environment: BENCH_OUT (output directory), BENCH_GIT_REV (the commit to
# report where the tree has no git, as in test/bench/lane.sh's chroot),
# BENCH_COMMAND (the command the headline report names, lane.sh's), BENCH_MOCK_NAGLE=1 (run a-e
# against the mock as shipped too, i.e. without the TCP_NODELAY shim),
# BENCH_PEERS="ours pgq ..." (the publishers of section p, ours first),
# BENCH_OUTBOX_CONF (postgresql.conf lines added for the run, e.g.
# "outbox.batch_events = 50000"),
# BENCH_PEERS_ONLY=1 (section p alone, then (e) for its 2- and 4-worker
# figures; writes peers.md into BENCH_OUT or
# /tmp/outbox-bench-peers/).  As root, installs Debian's postgresql-15-pgq3
# for the PgQ peer if it is missing (benchmark only; not a CI dependency).
#
set -euo pipefail

# Read whole before it runs: editing the file during a run cannot break it.
{
mode=full
real=0
headline=0
for arg in "$@"; do
	case $arg in
		real) real=1 ;;
		headline) headline=1 ;;
		full | quick) mode=$arg ;;
		*)
			echo "usage: $0 [real] [headline] [quick]" >&2
			exit 2
			;;
	esac
done

bench=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$bench/../.." && pwd)
tools=$src/test/tools
. "$bench/lib.sh"

# PgQ for section p (benchmark only, not a dependency of the extension or its
# CI): Debian's postgresql-NN-pgq3, copied into pg_config's directories when
# those are not the system's (a private installation).
install_pgq() {
	local share lib pkg f
	share=$(pg_config --sharedir)
	lib=$(pg_config --pkglibdir)
	[ -f "$share/extension/pgq.control" ] && return 0
	pkg=postgresql-$(pg_config --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')-pgq3
	if ! dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
		echo "run.sh: installing $pkg (PgQ, for the PgQ peer of section p only)" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" >/dev/null ||
			{ echo "run.sh: could not install $pkg: the PgQ peer will be skipped" >&2; return 0; }
	fi
	for f in $(dpkg -L "$pkg" | grep -E '/extension/pgq[-.]|/lib/pgq_[a-z]*\.so$'); do
		case $f in
			*/extension/*) [ -f "$share/extension/${f##*/}" ] || cp "$f" "$share/extension/" ;;
			*.so) [ -f "$lib/${f##*/}" ] || cp "$f" "$lib/" ;;
		esac
	done
}

# ---------------------------------------------------------------- as root
if [ "$(id -u)" = 0 ]; then
	export PATH="$(pg_config --bindir):$PATH"
	if [ ! -f "$(pg_config --pkglibdir)/outbox.so" ]; then
		echo "run.sh: the extension is not installed (make && make install)" >&2
		exit 1
	fi
	make -s -C "$tools" >/dev/null
	make -s -C "$bench" >/dev/null
	{ [ "$real" = 1 ] && [ "$headline" = 0 ]; } || install_pgq
	work=$(mktemp -d /tmp/outbox-bench.XXXXXX)
	chown postgres: "$work"
	if [ "$real" = 1 ] || [ "$headline" = 1 ]; then limit=2400
	elif [ "$mode" = quick ]; then limit=1200; else limit=7200; fi
	git_rev=${BENCH_GIT_REV:-$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)}
	git_dirty=$(git -C "$src" status --porcelain -- src sql 2>/dev/null | wc -l || true)
	so=$(pg_config --pkglibdir)/outbox.so
	so_info="$(date -u -r "$so" '+%Y-%m-%d %H:%M UTC'), md5 $(md5sum "$so" | cut -c1-12)"
	started=$(date +%s)
	rc=0
	timeout -k 30 "$limit" runuser -u postgres -- env BENCH_WORK="$work" \
		BENCH_GIT="$git_rev (src/ and sql/: $git_dirty uncommitted changes)" \
		BENCH_SO="$so_info" BENCH_MOCK_NAGLE="${BENCH_MOCK_NAGLE:-0}" \
		BENCH_PEERS_ONLY="${BENCH_PEERS_ONLY:-0}" BENCH_PEERS="${BENCH_PEERS:-}" \
		BENCH_OUTBOX_CONF="${BENCH_OUTBOX_CONF:-}" \
		BENCH_STARTED="$started" BENCH_LIMIT="$limit" \
		BENCH_ROUNDS="${BENCH_ROUNDS:-}" BENCH_COMMAND="${BENCH_COMMAND:-}" \
		bash "$bench/run.sh" $([ "$real" = 1 ] && echo real) $([ "$headline" = 1 ] && echo headline) "$mode" || rc=$?
	if [ "$headline" = 1 ]; then
		out=${BENCH_OUT:-/tmp/outbox-bench-headline$([ "$real" = 1 ] && echo -real || true)$([ "$mode" = quick ] && echo -quick || true)}
	elif [ "$mode" = quick ]; then
		out=${BENCH_OUT:-/tmp/outbox-bench$([ "$real" = 1 ] && echo -real || true)-quick}
	else
		out=${BENCH_OUT:-/tmp/outbox-bench$([ "$real" = 1 ] && echo -real || true)}
	fi
	mkdir -p "$out"
	if { [ "$rc" = 0 ] || [ "$rc" = 3 ]; } && [ "$headline" = 1 ] && [ -s "$work/out/headline.md" ]; then
		cp "$work/out/headline.md" "$work/out/results.tsv" "$out/"
		sed -n '/^| figure /,/^$/p' "$out/headline.md"
		echo "run.sh: wrote $out/headline.md ($(($(date +%s) - started)) s)"
		if [ "$rc" = 3 ]; then
			echo "run.sh: an order check is NOT clean (see $out/headline.md); logs kept in $work" >&2
		else
			rm -rf "$work"
		fi
	elif [ "$rc" = 0 ] && [ "${BENCH_PEERS_ONLY:-0}" = 1 ] && [ -s "$work/out/peers.md" ]; then
		out=${BENCH_OUT:-/tmp/outbox-bench-peers}
		mkdir -p "$out"
		cp "$work/out/peers.md" "$work/out/results.tsv" "$out/"
		echo "run.sh: wrote $out/peers.md ($(($(date +%s) - started)) s)"
		rm -rf "$work"
	elif [ "$rc" = 0 ] && [ "$real" = 1 ] && [ -s "$work/out/benchmarks_real.md" ]; then
		if [ "$mode" = quick ]; then
			cp "$work/out/benchmarks_real.md" "$out/"
			echo "run.sh: wrote $out/benchmarks_real.md ($(($(date +%s) - started)) s)"
		else
			# replace the real-Kafka section, always the last one of the report
			{
				sed '/^<!-- real-kafka -->$/,$d' "$out/benchmarks.md" 2>/dev/null || true
				echo '<!-- real-kafka -->'
				cat "$work/out/benchmarks_real.md"
			} >"$work/benchmarks.md"
			cp "$work/benchmarks.md" "$out/benchmarks.md"
			echo "run.sh: wrote the real-Kafka section of $out/benchmarks.md ($(($(date +%s) - started)) s)"
		fi
		rm -rf "$work"
	elif [ "$rc" = 0 ] && [ "$real" = 0 ] && [ -s "$work/out/benchmarks.md" ]; then
		# keep the real-Kafka section of the previous report (run.sh real writes it)
		sed -n '/^<!-- real-kafka -->$/,$p' "$out/benchmarks.md" >"$work/real_section" 2>/dev/null || true
		cat "$work/real_section" >>"$work/out/benchmarks.md"
		cp "$work/out/benchmarks.md" "$work/out/"*.png "$out/"
		echo "run.sh: wrote $out/benchmarks.md, $out/throughput_vs_rtt.png, $out/latency_cdf.png ($(($(date +%s) - started)) s)"
		rm -rf "$work"
	else
		echo "run.sh: failed (status $rc); logs kept in $work" >&2
	fi
	exit "$rc"
fi

# ------------------------------------------------------ as postgres: the run
# Section by section, in this order (test/bench/sections/*.sh, sourced).
run_parts="setup helpers start a_emit b_throughput d_latency real_report e_scaling p_peers f_nagle plots report"
[ "$headline" = 1 ] && run_parts="setup helpers start h_headline"
for run_part in $run_parts; do
	. "$bench/sections/$run_part.sh"
done
exit 0
}
