# On real Kafka (one Apache Kafka 3.9 node: this is about the consumer
# group, not replication), with the default consumer settings: after a
# crash restart (an inbox worker SIGKILLed, restart_after_crash = on) the
# workers rejoin their group as the same static members
# (group.instance.id), so the next events are applied within seconds
# (about 1 s here) instead of once the killed members' sessions time out
# (10 s with the inbox's default session.timeout.ms, 45 s with
# librdkafka's).  The mock cannot show this: librdkafka 2.0.2's mock
# ignores group.instance.id (test 310).
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OutboxTest;
use InboxTest;
use RealKafka;
use RealTest;

my $topic = 'outbox.event.restart';
my ($node, $rk) = inbox_setup('inbox_real_restart', kafka => 'real', brokers => 1,
	topics => ["$topic:4"],
	inbox_workers => 2, inbox_kafka_properties => '');
$node->append_conf('postgresql.conf', 'restart_after_crash = on');
$node->reload;
setup_consumer($node, 'billing', $topic);
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false');

my $emitted = 0;

# Emit n events; how long they took to be applied (undef: not within $bound s).
sub emit_and_time
{
	my ($n, $bound) = @_;
	$node->safe_psql('postgres', qq{SELECT outbox_emit('restart', 'r-' || (i % 8), 'E', '{}', topic => '$topic')
		FROM generate_series(1, $n) i});
	$emitted += $n;
	return wait_applied_across_restarts($node, $emitted, $bound);
}

ok(defined emit_and_time(40, 120), 'the first events are applied');
for my $round (1 .. 2)
{
	my ($pid) = inbox_pids($node);
	kill 'KILL', $pid or die "could not kill $pid";
	ok(wait_back($node, 'consumer'), "round $round: the server is back after the crash");
	my $t = emit_and_time(40, 5);
	ok(defined $t, "round $round: the next events are applied within 5 s of the crash restart")
	  and note sprintf 'round %d: applied in %.1f s', $round, $t;
}
my @p = consumer_verdict($node);
is_deeply(\@p, [], 'exactly once, in version order') or diag join("\n", @p);
ok($node->log_contains('terminated by signal 9'), 'the kills caused crash restarts');

$node->stop;
$rk->stop;
done_testing();
