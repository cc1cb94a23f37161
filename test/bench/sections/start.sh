# test/bench/sections/start.sh -- the machine's facts for the report; peers.sh; BENCH_PEERS_ONLY.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

res machine.nproc "$(nproc)"
res machine.cpu "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
res machine.mem "$(free -h | awk '/^Mem:/ {print $2 " total, " $7 " available"}')"
res machine.kernel "$(uname -sr)"
res machine.load_start "$(cut -d' ' -f1-3 /proc/loadavg)"
res date "$(date -u '+%Y-%m-%d %H:%M UTC')"
res pg "$(q -c 'SELECT version()')"
res rdkafka "$(dpkg-query -W -f '${Version}' librdkafka1 2>/dev/null || echo '?')"
res ext "$(q -c "SELECT extversion FROM pg_extension WHERE extname = 'outbox'")"
res git "${BENCH_GIT:-?}"
res so "${BENCH_SO:-?}"
res mode "$mode"
res mock_nodelay "$([ "${BENCH_MOCK_NAGLE:-0}" = 1 ] && echo no || echo yes)"

# section p (the peers: PgQ, logical decoding, ...), run after (e)
. "$bench/peers.sh"
if [ "${BENCH_PEERS_ONLY:-0}" = 1 ]; then
	# section p alone (on the mock, or with real on the Kafka cluster), its
	# report in out/peers.md
	restart_pg 1
	set +u
	peers_run
	# (e) for the report's 2- and 4-worker figures
	. "$bench/sections/e_scaling.sh"
	peers_report >"$out/peers.md"
	say "done: $out/peers.md"
	exit 0
fi
