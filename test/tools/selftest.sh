#!/bin/bash
#
# selftest.sh - end-to-end self-test of the Kafka test tools:
# mock_kafka (+ every control command), mockctl, order_check, gen_events
# and the MockKafka.pm Perl module.
#
# Produces with kcat into a private mock cluster, including deliberate
# gaps, inversions, duplicates, splits and malformed messages, and checks
# order_check's counters and exit status for each.  Bounded in time (a
# watchdog kills the run after $SELFTEST_TIMEOUT seconds, default 300),
# cleans up everything it started, prints "N passed, N failed" and exits
# non-zero if anything failed.
#
# Usage: test/tools/selftest.sh [-v]     (-v: show command output on success)
# MOCK_KAFKA_BIN / ORDER_CHECK_BIN override the binaries (e.g. ASan builds).

set -u

here=$(cd "$(dirname "$0")" && pwd)
verbose=0
[ "${1:-}" = "-v" ] && verbose=1

passed=0
failed=0
mock_pids=()
work=

cleanup()
{
	local pid

	for pid in "${mock_pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null
	done
	for pid in "${mock_pids[@]}"; do
		for _ in 1 2 3 4 5 6 7 8 9 10; do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		kill -KILL "$pid" 2>/dev/null
	done
	[ -n "${watchdog:-}" ] && kill "$watchdog" 2>/dev/null
	[ -n "$work" ] && rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "selftest: interrupted or timed out"; echo "$passed passed, $((failed + 1)) failed"; exit 1' INT TERM

# The watchdog signals only this script; the TERM trap then cleans up.
# It kills its own sleep when cleanup() stops it, leaving nothing behind.
(
	trap 'kill $sleeper 2>/dev/null; wait $sleeper; exit 0' TERM
	sleep "${SELFTEST_TIMEOUT:-300}" &
	sleeper=$!
	wait $sleeper && { echo "selftest: timed out after ${SELFTEST_TIMEOUT:-300} s" >&2; kill -TERM $$; }
) &
watchdog=$!

pass()
{
	passed=$((passed + 1))
	echo "ok $((passed + failed)) - $1"
}

# fail NAME [DETAILS]
fail()
{
	failed=$((failed + 1))
	echo "not ok $((passed + failed)) - $1"
	[ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/    # /'
}

show()
{
	[ $verbose = 1 ] && printf '%s\n' "$1" | sed 's/^/    # /'
	return 0
}

if ! out=$(make -s -C "$here" 2>&1); then
	fail "build test tools" "$out"
	echo "0 passed, 1 failed"
	exit 1
fi
pass "build test tools"

for tool in kcat perl; do
	if ! command -v $tool >/dev/null; then
		fail "$tool is installed"
		echo "$passed passed, $failed failed"
		exit 1
	fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-tools-selftest.XXXXXX")
MOCK=${MOCK_KAFKA_BIN:-$here/mock_kafka}
MOCKCTL=$here/mockctl
ORDER_CHECK=${ORDER_CHECK_BIN:-$here/order_check}

# start_mock NAME ARGS... : starts a mock writing $work/NAME.{bootstrap,control}
start_mock()
{
	local name=$1 i
	shift
	"$MOCK" --bootstrap-file "$work/$name.bootstrap" \
		--control-file "$work/$name.control" "$@" \
		>"$work/$name.log" 2>&1 &
	last_pid=$!
	mock_pids+=("$last_pid")
	for i in $(seq 100); do
		[ -s "$work/$name.control" ] && [ -s "$work/$name.bootstrap" ] && return 0
		kill -0 "$last_pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# wait_exit PID SECONDS : waits for PID to exit; sets exit_status
wait_exit()
{
	local pid=$1 tenths=$(($2 * 10)) i
	for i in $(seq $tenths); do
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid"
			exit_status=$?
			return 0
		fi
		sleep 0.1
	done
	return 1
}

# expect_output NAME PATTERN...: passes NAME if every PATTERN (grep) is in
# the output of the last check.
expect_output()
{
	local name=$1 pattern
	shift
	for pattern in "$@"; do
		if ! grep -q "$pattern" <<<"$last_output"; then
			fail "$name" "$last_output"
			return
		fi
	done
	pass "$name"
}

# expect_exit_0 PID NAME: passes NAME if PID exits, with status 0, within 10 s.
expect_exit_0()
{
	if wait_exit "$1" 10 && [ "$exit_status" -eq 0 ]; then
		pass "$2"
	else
		fail "$2" "status ${exit_status:-still running}"
	fi
}

# expect_signal_exit_0 SIGNAL BROKERS WHAT: a mock of BROKERS brokers (WHAT)
# sent SIGNAL exits 0.
expect_signal_exit_0()
{
	local name=${1,,}
	if start_mock "$name" --brokers "$2"; then
		kill "-$1" "$last_pid"
		expect_exit_0 "$last_pid" "SIG$1 makes mock_kafka exit 0"
	else
		fail "start $3 mock" "$(cat "$work/$name.log")"
	fi
}

ctl()
{
	"$MOCKCTL" "$work/main.control" "$@"
}

# check_ctl NAME WANT_RC COMMAND... : runs a control command
check_ctl()
{
	local name=$1 want=$2 out rc
	shift 2
	out=$(ctl "$@" 2>&1)
	rc=$?
	if [ $rc -eq "$want" ]; then
		pass "$name"
		show "$out"
	else
		fail "$name" "mockctl $* -> rc=$rc: $out"
	fi
}

# produce TOPIC AGG VERSION [kcat args...] : one event with outbox headers
produce()
{
	local topic=$1 agg=$2 ver=$3
	shift 3
	printf '{"aggregate":"%s","version":"%s"}\n' "$agg" "$ver" |
		timeout 30 kcat -P -b "$BS" -t "$topic" -k "$agg" \
			-H "event_id=$agg-$ver" -H event_type=Tested \
			-H aggregate_type=Test -H "aggregate_id=$agg" \
			-H "aggregate_version=$ver" "$@" 2>&1
}

# produce_seq TOPIC AGG V1 V2 ... : several events, in this order
produce_seq()
{
	local topic=$1 agg=$2 v
	shift 2
	for v in "$@"; do
		produce "$topic" "$agg" "$v" >/dev/null || return 1
	done
}

# check NAME WANT_RC "k=v k=v ..." ORDER_CHECK_ARGS...
#	runs order_check and compares exit status and summary counters
check()
{
	local name=$1 want_rc=$2 want=$3 out rc summary kv bad=
	shift 3
	out=$(timeout 60 "$ORDER_CHECK" --brokers "$BS" "$@" 2>&1)
	rc=$?
	summary=$(grep '^order_check: messages=' <<<"$out")
	[ $rc -eq "$want_rc" ] || bad="exit status $rc, wanted $want_rc"
	for kv in $want; do
		case " $summary " in
			*" $kv "*) ;;
			*) bad="${bad:+$bad; }wanted $kv" ;;
		esac
	done
	if [ -z "$bad" ]; then
		pass "$name"
		show "$summary"
	else
		fail "$name" "$bad
order_check $*
$out"
	fi
	last_output=$out
}

# ---------------------------------------------------------------------
# mock_kafka startup and the control protocol
# ---------------------------------------------------------------------

if ! start_mock main --brokers 3 --max-seconds 600 --topic pre:3 --topic ctl:2; then
	fail "mock_kafka starts and writes its files" "$(cat "$work/main.log")"
	echo "$passed passed, $failed failed"
	exit 1
fi
main_pid=$last_pid
pass "mock_kafka starts and writes its files"

BS=$(cat "$work/main.bootstrap")
if [[ $BS =~ ^127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+$ ]]; then
	pass "bootstrap file lists 3 brokers on 127.0.0.1"
else
	fail "bootstrap file lists 3 brokers on 127.0.0.1" "$BS"
fi

check_ctl "ping" 0 ping
out=$(ctl bootstrap)
if [ "$out" = "ok $BS" ]; then
	pass "bootstrap command matches bootstrap file"
else
	fail "bootstrap command matches bootstrap file" "$out"
fi
check_ctl "help" 0 help
check_ctl "unknown command is an error" 1 frobnicate
check_ctl "down with bad broker id is an error" 1 down 4
check_ctl "down with junk broker id is an error" 1 down 1x
check_ctl "rtt with bad value is an error" 1 rtt all -5
check_ctl "errors with unknown code is an error" 1 errors 0 99999
check_ctl "errors without codes is an error" 1 errors 0
check_ctl "broker_errors without rtt is an error" 1 broker_errors 1 0 7
check_ctl "topic_create with bad replication is an error" 1 topic_create zz 1 4
check_ctl "topic_create with bad name is an error" 1 topic_create 'a/b' 1 1
check_ctl "leader with bad broker is an error" 1 leader ctl 0 9

# several commands on one connection, each answered by one line
port=$(cat "$work/main.control")
replies=$(
	exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
	printf 'ping\nnope\n\nbootstrap\n' >&3
	for i in 1 2 3 4; do
		IFS= read -r -t 10 line <&3 || exit 1
		echo "$line"
	done
)
expected_replies="ok
err unknown command \"nope\" (try \"help\")
err empty command
ok $BS"
if [ "$replies" = "$expected_replies" ]; then
	pass "several commands on one connection"
else
	fail "several commands on one connection" "$replies"
fi

ok_count=0
for i in $(seq 20); do
	ctl ping >/dev/null && ok_count=$((ok_count + 1))
done
if [ $ok_count -eq 20 ]; then
	pass "20 sequential connections"
else
	fail "20 sequential connections" "only $ok_count answered"
fi

# an overlong line gets an error but the connection survives
replies=$(
	exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
	{ head -c 10000 /dev/zero | tr '\0' x; printf '\nping\n'; } >&3
	for i in 1 2; do
		IFS= read -r -t 10 line <&3 || exit 1
		echo "$line"
	done
)
if [ "$replies" = "err line too long
ok" ]; then
	pass "overlong line is rejected, connection survives"
else
	fail "overlong line is rejected, connection survives" "$replies"
fi

# ---------------------------------------------------------------------
# order_check verdicts
# ---------------------------------------------------------------------

produce_seq good g1 1 2 3 && produce_seq good g2 1 2 ||
	fail "produce with kcat" "kcat failed"
check "in-order stream is accepted" 0 \
	"messages=5 aggregates=2 accepted=5 duplicates=0 gaps=0 inversions=0 lost=? split=0 malformed=0 unexpected=0" \
	--topic good

produce_seq gap gp1 1 3
check "gap is detected" 1 "messages=2 accepted=1 gaps=1 inversions=0" --topic gap

produce_seq inversion iv1 1 3 2
check "inversion is detected" 1 "messages=3 accepted=1 gaps=1 inversions=1 duplicates=0" \
	--topic inversion

produce_seq dup dp1 1 2 2 3
check "duplicate is tolerated" 0 "messages=4 accepted=3 duplicates=1 gaps=0 inversions=0" \
	--topic dup

produce_seq late lt1 5 6
check "stream not starting at 1 is a gap" 1 "accepted=1 gaps=1" --topic late
check "--any-start accepts it" 0 "accepted=2 gaps=0" --topic late --any-start

# 1 5 3 2 4 4 10 7: holes 2..4 then 6..9, filled partly out of order
produce_seq holes h1 1 5 3 2 4 4 10 7
check "mixed anomalies are counted exactly" 1 \
	"messages=8 accepted=1 gaps=2 inversions=4 duplicates=1 lost=?" --topic holes
printf 'h1\t10\n' >"$work/holes10.exp"
check "lost counts each missing version" 1 "lost=3 unexpected=0" \
	--topic holes --expect "$work/holes10.exp"
printf 'h1\t12\n' >"$work/holes12.exp"
check "lost includes versions past the highest" 1 "lost=5" \
	--topic holes --expect "$work/holes12.exp"

printf 'g1\t3\ng2\t2\n' >"$work/good.exp"
check "--expect satisfied" 0 "lost=0 unexpected=0" --topic good --expect "$work/good.exp"
printf 'g1\t5\ng2\t2\nghost\t2\n' >"$work/good-more.exp"
check "--expect with missing versions and aggregate" 1 "lost=4 unexpected=0" \
	--topic good --expect "$work/good-more.exp"
# --events: the event at each (aggregate, version) must be the database's
printf 'g1\t1\tg1-1\ng1\t2\tg1-2\ng1\t3\tg1-3\ng2\t1\tg2-1\ng2\t2\tg2-2\n' >"$work/good.ev"
check "--events all matching" 0 "lost=0 unexpected=0 mismatched=0" \
	--topic good --expect "$work/good.exp" --events "$work/good.ev"
printf 'g1\t1\tg1-1\ng1\t2\tother\ng1\t3\tg1-3\ng2\t1\tg2-1\n' >"$work/bad.ev"
check "--events: another event at a version, and a version unknown to the database" 1 \
	"accepted=5 duplicates=0 gaps=0 mismatched=2" \
	--topic good --events "$work/bad.ev"
printf '# comment\ng1\t3\n' >"$work/good-less.exp"
check "aggregate not in expect file is unexpected" 1 "lost=0 unexpected=1" \
	--topic good --expect "$work/good-less.exp"
expect_output "unexpected aggregate is printed" "unexpected: aggregate g2"

produce_seq big b1 1 5000000 2
printf 'b1\t5000000\n' >"$work/big.exp"
check "versions in the millions" 1 "accepted=1 gaps=1 inversions=1 lost=4999997" \
	--topic big --expect "$work/big.exp"

# malformed: missing header, bad version, key not the aggregate id
printf 'x\n' | timeout 30 kcat -P -b "$BS" -t malformed -k m1 \
	-H event_id=e1 -H event_type=T -H aggregate_type=T -H aggregate_id=m1 \
	>/dev/null 2>&1
produce malformed m1 abc >/dev/null
produce malformed m1 1 -k other >/dev/null
produce malformed m1 1 >/dev/null
check "malformed messages are counted" 1 "messages=4 accepted=1 malformed=3" \
	--topic malformed --verbose
expect_output "--verbose explains malformed messages" \
	"missing header aggregate_version" "key does not match"

produce pre s1 1 -p 0 >/dev/null
produce pre s1 2 -p 0 >/dev/null
produce pre s1 3 -p 1 >/dev/null
check "aggregate in two partitions is split" 1 "messages=3 split=1 gaps=0" --topic pre

check "several topics at once" 1 \
	"messages=12 aggregates=4 duplicates=1 gaps=1 inversions=1 split=0" \
	--topic good --topic dup --topic inversion

# one aggregate in two topics has no defined order either
produce_seq xa x1 1 2
produce_seq xb x1 3
check "aggregate in two topics is split" 1 "messages=3 aggregates=1 split=1" \
	--topic xa --topic xb
check "missing topic is empty, not created" 0 "messages=0" --topic does-not-exist
if kcat -L -b "$BS" 2>/dev/null | grep -q '"does-not-exist"'; then
	fail "order_check did not create the missing topic"
else
	pass "order_check did not create the missing topic"
fi

check "--print shows messages" 0 "messages=5" --topic good --print
expect_output "--print shows headers and payload" \
	"aggregate_version=3" 'payload: {"aggregate":"g1","version":"3"}'

check "--verbose lists anomalies" 1 "gaps=2" --topic holes --verbose
expect_output "--verbose anomaly lines" \
	"gap: aggregate h1 at holes \[[0-9]*\] offset 1: version 5 after 1" \
	"inversion: aggregate h1" "duplicate: aggregate h1"

# ---------------------------------------------------------------------
# control commands against a producer
# ---------------------------------------------------------------------

# Pin leaders so we know what "down 1" affects: ctl[0] on 1, ctl[1] on 2.
check_ctl "leader ctl 0 1" 0 leader ctl 0 1
check_ctl "leader ctl 1 2" 0 leader ctl 1 2
check_ctl "down 1" 0 down 1
if out=$(produce ctl c1 1 -p 1 -X message.timeout.ms=10000); then
	pass "produce to a partition led by a live broker works with broker 1 down"
else
	fail "produce to a partition led by a live broker works with broker 1 down" "$out"
fi
out=$(produce ctl c2 1 -p 0 -X message.timeout.ms=2000)
if [ $? -ne 0 ] && grep -q "Message timed out" <<<"$out"; then
	pass "produce to a partition led by the down broker stalls (no failover)"
else
	fail "produce to a partition led by the down broker stalls (no failover)" "$out"
fi
check_ctl "leader ctl 0 2 (manual failover)" 0 leader ctl 0 2
if out=$(produce ctl c2 2 -p 0 -X message.timeout.ms=10000); then
	pass "produce works after moving the leader off the down broker"
else
	fail "produce works after moving the leader off the down broker" "$out"
fi
check_ctl "up 1" 0 up 1
check_ctl "leader ctl 0 1 (back)" 0 leader ctl 0 1
if out=$(produce ctl c2 3 -p 0 -X message.timeout.ms=10000); then
	pass "produce to broker 1 works again after up 1"
else
	fail "produce to broker 1 works again after up 1" "$out"
fi

check_ctl "all_down" 0 all_down
out=$(produce ctl c3 1 -X message.timeout.ms=1500)
if [ $? -ne 0 ]; then
	pass "produce fails with all brokers down"
else
	fail "produce fails with all brokers down" "$out"
fi
check "order_check times out with all brokers down" 2 "messages=0" \
	--topic good --timeout-ms 1500
expect_output "order_check says what timed out" "timeout"
check_ctl "all_up" 0 all_up
if out=$(produce ctl c3 1 -X message.timeout.ms=10000); then
	pass "produce works after all_up"
else
	fail "produce works after all_up" "$out"
fi

check_ctl "rtt all 1000" 0 rtt all 1000
start=$(date +%s%N)
out=$(produce ctl c4 1 -p 1 -X message.timeout.ms=20000)
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
if [ $rc -eq 0 ] && [ $elapsed_ms -ge 1000 ]; then
	pass "rtt delays produce (${elapsed_ms} ms)"
else
	fail "rtt delays produce" "rc=$rc elapsed=${elapsed_ms}ms $out"
fi
check_ctl "rtt 2 0" 0 rtt 2 0
check_ctl "rtt all 0" 0 rtt all 0

# errors: non-retriable error fails the produce, nothing is written
check_ctl "topic_create errs 1 3" 0 topic_create errs 1 3
check_ctl "topic_create existing topic is an error" 1 topic_create errs 1 3
check_ctl "errors 0 10" 0 errors 0 10
out=$(produce errs e1 1 -X message.timeout.ms=10000)
if [ $? -ne 0 ] && grep -q "Message size too large" <<<"$out"; then
	pass "errors 0 10 makes the next produce fail (MSG_SIZE_TOO_LARGE)"
else
	fail "errors 0 10 makes the next produce fail (MSG_SIZE_TOO_LARGE)" "$out"
fi
# retriable errors are retried by the client; the event lands once
check_ctl "errors 0 7 19 6" 0 errors 0 7 19 6
if out=$(produce errs e1 1 -X message.timeout.ms=20000 -X retry.backoff.ms=50); then
	pass "retriable produce errors are retried"
else
	fail "retriable produce errors are retried" "$out"
fi
check_ctl "errors 0 10 (to be cleared)" 0 errors 0 10
check_ctl "clear_errors 0" 0 clear_errors 0
if out=$(produce errs e1 2 -X message.timeout.ms=10000); then
	pass "clear_errors removes pending errors"
else
	fail "clear_errors removes pending errors" "$out"
fi
check "failed and retried produces left a clean log" 0 "messages=2 accepted=2 duplicates=0" \
	--topic errs

# an ack lost after the append: the client retries, the log gets a copy
check_ctl "topic_create lostack 1 3" 0 topic_create lostack 1 3
check_ctl "leader lostack 0 3" 0 leader lostack 0 3
produce lostack l1 1 >/dev/null
check_ctl "broker_errors 3 0 0:2500" 0 broker_errors 3 0 0:2500
out=$(produce lostack l1 2 -X socket.timeout.ms=1000 -X retry.backoff.ms=50 \
	-X message.timeout.ms=20000)
check "delayed ack + client timeout duplicates the event" 0 \
	"messages=3 accepted=2 duplicates=1" --topic lostack

# fetch delayed far beyond the deadline: the read itself times out
check_ctl "broker_errors 3 1 0:8000 (Fetch)" 0 broker_errors 3 1 0:8000
check "order_check times out when a fetch never returns" 2 "" \
	--topic lostack --timeout-ms 2500
expect_output "timeout names the partition" "lostack \[0\] did not reach its high watermark 3"

check_ctl "topic_create two 2 3" 0 topic_create two 2 3
if kcat -L -b "$BS" -t two 2>/dev/null | grep -q 'topic "two" with 2 partitions'; then
	pass "topic_create makes a topic with the given partitions"
else
	fail "topic_create makes a topic with the given partitions"
fi
if kcat -L -b "$BS" -t pre 2>/dev/null | grep -q 'topic "pre" with 3 partitions'; then
	pass "--topic pre-creates topics"
else
	fail "--topic pre-creates topics"
fi

# ---------------------------------------------------------------------
# load: 200,000 events through gen_events and order_check
# ---------------------------------------------------------------------

check_ctl "topic_create load 16 3" 0 topic_create load 16 3
start=$(date +%s%N)
if out=$(timeout 120 "$here/gen_events" --brokers "$BS" --topic load \
	--aggregates 20000 --versions 10 --expect-out "$work/load.exp" 2>&1); then
	pass "gen_events produces 200000 events"
else
	fail "gen_events produces 200000 events" "$out"
fi
start=$(date +%s%N)
check "order_check reads 200000 events" 0 \
	"messages=200000 aggregates=20000 accepted=200000 lost=0" \
	--topic load --expect "$work/load.exp"
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
# A figure, not a verdict: it depends on how busy the machine is (the read
# itself is bounded by order_check's own timeout).
echo "FIGURES order_check read 200000 events in ${elapsed_ms} ms"

# ---------------------------------------------------------------------
# Perl module
# ---------------------------------------------------------------------

if out=$(timeout 120 perl "$here/../perl/mockkafka_selftest.pl" 2>&1); then
	pass "MockKafka.pm self-test"
	show "$out"
else
	fail "MockKafka.pm self-test" "$out"
fi

# ---------------------------------------------------------------------
# shutdown paths
# ---------------------------------------------------------------------

check_ctl "quit" 0 quit
expect_exit_0 "$main_pid" "quit makes mock_kafka exit 0"
if [ ! -e "$work/main.control" ] && [ ! -e "$work/main.bootstrap" ]; then
	pass "mock_kafka removes its files on exit"
else
	fail "mock_kafka removes its files on exit"
fi
out=$(ctl ping 2>&1)
if [ $? -eq 1 ]; then
	pass "mockctl fails when the mock is gone"
else
	fail "mockctl fails when the mock is gone" "$out"
fi

expect_signal_exit_0 TERM 1 single-broker
expect_signal_exit_0 INT 2 two-broker

if start_mock short --max-seconds 1; then
	if wait_exit "$last_pid" 5; then
		pass "--max-seconds makes mock_kafka exit by itself"
	else
		fail "--max-seconds makes mock_kafka exit by itself"
	fi
else
	fail "start short-lived mock" "$(cat "$work/short.log")"
fi

out=$("$MOCK" --brokers 0 2>&1)
if [ $? -ne 0 ] && grep -q "invalid --brokers" <<<"$out"; then
	pass "mock_kafka rejects bad options"
else
	fail "mock_kafka rejects bad options" "$out"
fi
out=$("$ORDER_CHECK" --topic x 2>&1)
if [ $? -eq 3 ]; then
	pass "order_check rejects missing --brokers (exit 3)"
else
	fail "order_check rejects missing --brokers (exit 3)" "$out"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
