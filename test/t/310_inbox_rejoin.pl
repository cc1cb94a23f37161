# How fast an inbox consumer resumes, on the mock, with the default
# consumer settings (the inbox's session.timeout.ms is 10 s): a subscription given a new
# handler keeps its consumer and applies the next events at once (it used
# to leave the group and wait ~45 s to join it again); after a crash
# restart (a backend SIGKILLed, restart_after_crash = on) the workers come
# back as the same static members of their groups (group.instance.id) and
# resume at once on real Kafka (test 311); the mock of librdkafka 2.0.2
# ignores group.instance.id and waits for the killed members' sessions to
# time out, which the inbox's default session timeout (10 s, not
# librdkafka's 45 s: 87 s measured before) bounds: within four session
# timeouts here (see the crash rounds for how the mock spends them).  A
# topic added to a subscription re-subscribes the same consumers.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'outbox.event.rejoin';
my $topic2 = 'outbox.event.rejoin2';
# The default consumer properties: no short session timeout.
my ($node, $mk) = inbox_setup('inbox_rejoin', topics => ["$topic:2", "$topic2:1"], max_seconds => 600,
	inbox_workers => 2, inbox_kafka_properties => '');
$node->append_conf('postgresql.conf', 'restart_after_crash = on');
# A round trip on the mock's broker, as on a network: a group leader's
# SyncGroup waits for one more answer (metadata) than a follower's.
my $rtt_ms = 200;
$mk->cmd("rtt all $rtt_ms");
$node->reload;
setup_consumer($node, 'billing', $topic);
$node->safe_psql('consumer', q{UPDATE app.knobs SET fail = false;
SET ROLE app;
CREATE FUNCTION app.apply2(m inbox_message) RETURNS void LANGUAGE sql
  AS $$ SELECT app.apply(m) $$;});

my $emitted = 0;

# Emit n events and return how long they took to be applied (undef: not
# within the bound), counted from $t0 if given (a time()), else from now.
sub emit_and_time
{
	my ($n, $bound, $t0) = @_;
	$t0 //= time;
	$node->safe_psql('postgres', qq{SELECT outbox_emit('rejoin', 'r-' || (i % 5), 'E', '{}', topic => '$topic')
		FROM generate_series(1, $n) i});
	$emitted += $n;
	my $left = $bound - (time - $t0);
	return undef if $left <= 0;
	return defined wait_applied($node, $emitted, $left) ? time - $t0 : undef;
}

ok(defined emit_and_time(20, 120), 'the first events are applied');

# A new handler, twice (back and forth): the next events within 10 s.
for my $handler ('app.apply2', 'app.apply')
{
	$node->safe_psql('consumer', qq{SET ROLE app;
		SELECT inbox_subscribe('billing', ARRAY['$topic'], '$handler(inbox_message)'::regprocedure)});
	# Once every worker has read the subscription again.
	sleep 2;
	my $t = emit_and_time(10, 10);
	ok(defined $t, "after the handler changed to $handler, the next events are applied within 10 s")
	  and note sprintf 'applied in %.1f s', $t;
}

# New topics: the same consumers subscribe again (one rebalance).
$node->safe_psql('consumer', qq{SET ROLE app;
	SELECT inbox_subscribe('billing', ARRAY['$topic', '$topic2'], 'app.apply(inbox_message)'::regprocedure)});
$node->safe_psql('postgres', qq{SELECT outbox_emit('rejoin', 'n-1', 'E', '{}', topic => '$topic2')
	FROM generate_series(1, 5)});
$emitted += 5;
ok(defined wait_applied($node, $emitted, 60), 'a topic added to the subscription is applied');
ok($node->log_contains(qr/consumer "billing" subscribed to \{outbox.event.rejoin,outbox.event.rejoin2\}/),
	'by the same consumers, subscribed again');
ok(defined emit_and_time(10, 30), 'and the first topic still is');

# A crash restart: a backend killed, every process restarted.  The mock
# ignores static membership, and its group coordinator (rdkafka_mock_cgrp.c
# of librdkafka 2.0.2), with S the session timeout (the inbox's default,
# 10 s; librdkafka's is 45 s):
# - the restarted workers join beside the killed members; the group waits
#   S - 1 s for every member to join again;
# - the killed members' sessions expire S s after their last heartbeat
#   (every second; the mock looks every second): at most S + 2 s after the
#   kill.  If they expire first, the partitions are assigned when the wait
#   ends (11 s after the kill measured); else the group elects its first
#   member, a killed one, leader and waits for it to sync until they
#   expire, then waits S - 1 s again: assigned at most 2S + 1 s after the
#   kill (20 s measured);
# - a follower whose SyncGroup reaches the mock after the leader's is
#   refused (the leader's completes the sync, the assignments are dropped)
#   and joins again: another S - 1 s.  The leader's waits for a metadata
#   answer first, so the mock's round trip ($rtt_ms ms) makes that rare.
# The bound, from the kill: 2S + 1 s, one such extra round, and S s for
# applying on a busy machine: 4S.  With S = 45 s the first wait alone
# takes 44 s: with session.timeout.ms=45000 both rounds fail.
my $session_s = 10;
my $crash_bound = 4 * $session_s;
for my $round (1 .. 2)
{
	my ($bpid) = inbox_pids($node);
	my $t0 = time;
	kill 'KILL', $bpid or die "could not kill $bpid";
	ok(wait_back($node, 'consumer'), "round $round: the server is back after the crash");
	my $t = emit_and_time(10, $crash_bound, $t0);
	ok(defined $t,
		"round $round: after the crash restart the next events are applied within $crash_bound s of the kill")
	  and note sprintf 'applied %.1f s after the kill', $t;
	# Whatever the time, everything is applied before the next round.
	wait_applied($node, $emitted, 120);
}
my @p = consumer_verdict($node);
is_deeply(\@p, [], 'exactly once, in version order') or diag join("\n", @p);
ok($node->log_contains('terminated by signal 9'), 'the kills caused crash restarts');

$node->stop;
$mk->stop;
done_testing();
