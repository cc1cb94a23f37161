# Real Kafka: a rolling restart of all three brokers under load, the way an
# operator upgrades a cluster: each node in turn is stopped gracefully
# (controlled shutdown moves its leaderships away first), started again on
# its data, and the next one waits until every partition is fully in sync
# again.  The publisher must keep publishing throughout, without loss, gap
# or inversion; a graceful restart should not even need a producer
# recreation or leave a duplicate.
#
# recover_s: longest time, over the three restarts, from the beginning of
# the graceful stop until an event emitted after the stop was published.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use OutboxTest;
use RealKafka;
use RealTest;

my $topic = 'outbox.event.load';
my ($node, $rk) = outbox_setup('real_rolling', kafka => 'real', topics => ["$topic:6"]);
quiet_statements($node);

my $t_start = time;
my $load = start_real_load($node);

my $stall_max = 0;
my @firsts;			# the first event seen published after each stop
for my $id (1 .. 3)
{
	my $t0 = time;
	my $stop_s = $rk->node(stop => $id);
	my $stopped_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
	# events emitted after the stop are published by the two survivors
	my ($stall, $first);
	while (time - $t0 < 60)
	{
		$first = $node->safe_psql('postgres',
			"SELECT event_id FROM outbox_events WHERE state = 'published' AND created_at > '$stopped_at' ORDER BY id LIMIT 1");
		if ($first ne '')
		{
			$stall = time - $t0;
			push @firsts, $first;
			last;
		}
		sleep 0.1;
	}
	ok(defined $stall, "node $id stopped: publishing goes on");
	$stall_max = $stall if defined $stall && $stall > $stall_max;
	sleep 2;
	my $start_s = $rk->node(start => $id);
	my $isr = $rk->wait_isr([$topic], 3, 120);
	ok(defined $isr, "node $id restarted and back in every ISR");
	note sprintf "node %d: graceful stop took %.1f s, an event emitted after it published %.2f s after the stop began, start took %.1f s, in sync %.1f s later",
	  $id, $stop_s, $stall // -1, $start_s, $isr // -1;
}

ok(stop_load($load, 60), 'emitters stopped');
my $drain = wait_published($node, 120);
ok(defined $drain, 'nothing pending after the load');
db_versions_contiguous($node, 'rolling restart');
my %in_kafka = map { (($_->{event_id} // '') => 1) } @{ real_records($rk, topics => [$topic]) };
is(scalar(grep { !$in_kafka{$_} } @firsts), 0,
	'the events seen published while a node was down are in Kafka');

my $r = real_verdict($rk, $node, 'rolling_restart', topics => [$topic],
	recover_s => $stall_max);
if (counter($node, 'producer_creations') == 1 && counter($node, 'delivery_timeouts') == 0)
{
	is($r->{duplicates}, 0, 'no duplicates across the rolling restart');
}
else
{
	note "duplicates $r->{duplicates} after "
	  . (counter($node, 'producer_creations') - 1) . ' recreation(s) and '
	  . counter($node, 'delivery_timeouts') . ' abandoned batch(es)';
}
note_counters($node, $t_start);

$node->stop;
$rk->stop;
done_testing();
