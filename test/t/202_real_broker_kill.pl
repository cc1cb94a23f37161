# Real Kafka: a broker SIGKILLed under load and started again.  With RF 3
# and min.insync.replicas 2 the two survivors keep accepting acks=all
# produces once the controller has fenced the dead broker (broker session
# timeout 3 s) and moved its leaderships; the publisher must carry on
# without loss, gap or inversion.  The killed broker then starts again on its
# data and catches up while the load goes on.
#
# failover_s: from the kill until an event emitted after it on a partition
# the killed broker led was published (which aggregates live on those
# partitions is read from Kafka before the kill; the event seen published is
# checked to be in Kafka there at the end).  recover_s: from the kill until every
# event committed before it was published.
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
my ($node, $rk) = outbox_setup('real_kill', kafka => 'real', topics => ["$topic:6"]);
quiet_statements($node);

my $t_start = time;
my $load = start_load($node, clients => 4, jobs => 1, transactions => 1500,
	events_per_tx => 5, aggregates => 1000, rate => 150);
sleep 0.2 while max_id($node) < 3000 && time - $t_start < 30;
cmp_ok(max_id($node), '>=', 3000, 'load under way before the kill');

# Kill the leader of partition 0 (it leads about a third of the partitions).
my $leaders = $rk->leaders($topic);
my $victim = $leaders->{0};
ok(defined $victim, "partition 0 has a leader (node @{[ $victim // '?' ]})");
my @led = grep { ($leaders->{$_} // 0) == $victim } 0 .. 5;
# The aggregates Kafka holds on those partitions (the database records no
# partition).
my $on_led = aggregates_on(real_homes($rk, topics => [$topic]), $topic, @led);
cmp_ok(scalar(@$on_led), '>', 0, 'Kafka shows aggregates on the partitions the victim leads');
my $backlog = max_id($node);
my $t_kill = time;
$rk->node(kill => $victim);
my $killed_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
note sprintf "killed node %d (leader of partitions %s, %d aggregates there) at %.1f s, %d events emitted",
  $victim, join(',', @led), scalar(@$on_led), $t_kill - $t_start, $backlog;

# Publishing on the dead broker's partitions resumes once leadership moved.
my ($failover, $first);
while (time - $t_kill < 60)
{
	$first = first_published_since($node, $on_led, $killed_at);
	if (defined $first) { $failover = time - $t_kill; last }
	sleep 0.1;
}
ok(defined $failover, 'publishing on the killed broker\'s partitions resumed');
note sprintf "failover: first event on a moved partition (%s) published %.2f s after the kill",
  $first // '-', $failover // -1;
my $recover = wait_backlog($node, $backlog, 60);
ok(defined $recover, 'everything committed before the kill was published');
$recover = time - $t_kill if defined $recover;

# Let the survivors carry the load for a while, then restart the broker.
sleep 5;
my $t_restart = time;
$rk->node(start => $victim);
my $isr = $rk->wait_isr([$topic], 3, 120);
ok(defined $isr, 'the restarted broker is back in every ISR');
note sprintf "node %d restarted after %.1f s down; in sync %.1f s later",
  $victim, $t_restart - $t_kill, $isr // -1;

ok(stop_load($load, 120), 'emitters finished without errors');
my $drain = wait_published($node, 120);
ok(defined $drain, 'nothing pending after the load');
db_versions_contiguous($node, 'broker killed');
my @where = map { "$_->{topic} [$_->{partition}]" }
  grep { defined $first && ($_->{event_id} // '') eq $first } @{ real_records($rk, topics => [$topic]) };
my %is_led = map { ("$topic [$_]" => 1) } @led;
ok(@where && !grep({ !$is_led{$_} } @where),
	'in Kafka, that first event is on a partition the killed broker led')
  or diag "event $first at: @where; led: @led";

my $r = real_verdict($rk, $node, 'broker_kill', topics => [$topic],
	recover_s => $recover, figures => { failover_s => sprintf('%.2f', $failover // -1) });
# Duplicates need a new producer id (a recreated producer: fatal error);
# retries of the same producer are deduplicated by the broker.
if (counter($node, 'producer_creations') == 1 && counter($node, 'delivery_timeouts') == 0)
{
	is($r->{duplicates}, 0, 'no duplicates: retries after the kill were deduplicated');
}
else
{
	note "duplicates $r->{duplicates}: the producer was recreated "
	  . (counter($node, 'producer_creations') - 1) . ' time(s) and '
	  . counter($node, 'delivery_timeouts') . ' batch(es) abandoned (see 203_real_leader_pause.pl)';
}
note_counters($node, $t_start);

$node->stop;
$rk->stop;
done_testing();
