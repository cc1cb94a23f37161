# Real Kafka: a partition leader SIGSTOPped for 15 s under load, then
# resumed, twice (the leader of partition 0 at the time: another node the
# second time, usually; never the active KRaft controller).  Requests to the frozen broker time out on the
# client (socket.timeout.ms 2 s here) after some were appended and even
# replicated: their acknowledgements are lost.  The controller fences the
# frozen broker after the 3 s session timeout and the followers take over
# its partitions; librdkafka retries there with the same producer id and
# sequence numbers, which the new leader, holding the replicated producer
# state, deduplicates.  librdkafka 2.0.2 may instead desynchronize its
# sequence numbers and raise a fatal OUT_OF_ORDER_SEQUENCE_NUMBER (fixed in
# 2.3.0): the publisher then recreates the producer and re-sends from the
# first unmarked version, which duplicates what had been appended but not
# acknowledged.  Nothing may be lost or reordered either way; the figures
# say how often the producer was recreated (fatal=) and how many
# duplicates that left.
#
# Duplicates have two sources here: a producer recreated after a fatal error
# (new producer id), and a batch that gave up waiting after
# outbox.delivery_timeout: the late acknowledgements of its messages only
# free their aggregates (stalled, see src/worker.c), they are not marked, so
# the next batch sends those events again.  Without either, retries of the
# one producer must leave no duplicate.
#
# failover_s: from the SIGSTOP until an event emitted after it on a
# partition the frozen broker led was published (longest round; which
# aggregates live there is read from Kafka before each pause, and the event
# seen published is checked to be in Kafka there at the end).  recover_s: from the SIGCONT
# until every event committed before it was published (longest round).
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
my $pause_s = $ENV{OUTBOX_REAL_PAUSE_S} // 15;
my $rounds = $ENV{OUTBOX_REAL_ROUNDS} // 2;
my $props = $ENV{OUTBOX_FAULT_KAFKA_PROPERTIES} // 'request.timeout.ms=1000;socket.timeout.ms=2000';

# outbox.delivery_timeout at its default (10 s), not the tests' 5 s
my ($node, $rk) = outbox_setup('real_pause', kafka => 'real', topics => ["$topic:6"],
	kafka_properties => $props, delivery_timeout => '10s');
quiet_statements($node);
note "kafka_properties: $props; pause ${pause_s} s x $rounds";

my $t_start = time;
my $load = start_real_load($node);
cmp_ok(max_id($node), '>=', 2000, 'load under way before the first pause');

my ($failover_max, $recover_max) = (0, 0);
my @firsts;			# [round, first event published after the SIGSTOP, partitions]
for my $round (1 .. $rounds)
{
	my $leaders = $rk->leaders($topic);
	my $victim = $leaders->{0};
	ok(defined $victim, "round $round: partition 0 has a leader");
	# Not the active controller: freezing it stalls the cluster itself (a
	# new controller, then ISR changes refused for longer than the pause, so
	# with min.insync.replicas = 2 no partition it led can take a write).
	my $controller = $rk->active_controller;
	if (defined $victim && defined $controller && $victim == $controller)
	{
		my ($other) = grep { $_ != $controller } sort { $a <=> $b } values %$leaders;
		note "round $round: node $victim leads partition 0 and is the active controller: pausing node "
		  . ($other // 'none') . ' instead';
		$victim = $other if defined $other;
	}
	my @led = grep { ($leaders->{$_} // 0) == $victim } sort keys %$leaders;
	my $list = join ',', @led;
	# the aggregates Kafka holds on those partitions (not in the database)
	my $on_led = aggregates_on(real_homes($rk, topics => [$topic]), $topic, @led);
	cmp_ok(scalar(@$on_led), '>', 0, "round $round: Kafka shows aggregates on the partitions the victim leads");
	my $t_pause = time;
	$rk->node(pause => $victim);
	my $paused_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
	note sprintf "round %d: SIGSTOP node %d (leader of partitions %s, %d aggregates there) at %.1f s",
	  $round, $victim, $list, scalar(@$on_led), $t_pause - $t_start;

	my ($failover, $first);
	while (time - $t_pause < $pause_s)
	{
		if (!defined $failover)
		{
			$first = first_published_since($node, $on_led, $paused_at);
			$failover = time - $t_pause if defined $first;
		}
		sleep 0.2;
	}
	push @firsts, [ $round, $first, \@led ] if defined $first;
	my $backlog = max_id($node);
	$rk->node(resume => $victim);
	my $t_resume = time;
	note sprintf "round %d: SIGCONT after %.1f s; first event on a moved partition published %.2f s after the SIGSTOP",
	  $round, $t_resume - $t_pause, $failover // -1;
	ok(defined $failover, "round $round: the frozen leader's partitions moved and publishing resumed on them");
	$failover_max = $failover if defined $failover && $failover > $failover_max;

	my $t = wait_backlog($node, $backlog, 90);
	ok(defined $t, "round $round: everything committed before the SIGCONT published");
	$t = time - $t_resume if defined $t;
	$recover_max = $t if defined $t && $t > $recover_max;
	note sprintf "round %d: caught up %.2f s after the SIGCONT; fatal errors so far %s",
	  $round, $t // -1, counter($node, 'delivery_errors_fatal');
	ok(defined $rk->wait_isr([$topic], 3, 120), "round $round: the resumed broker is back in every ISR");
}

ok(stop_load($load, 60), 'emitters stopped');
ok(defined wait_published($node, 120), 'nothing pending after the load');
db_versions_contiguous($node, 'leader paused');
# (Read back once everything is readable: see real_read_all.)
real_read_all($rk, topics => [$topic],
	expect => expect_file($node, "$PostgreSQL::Test::Utils::tmp_check/exp_readable"));
my %at;
$at{ $_->{event_id} // '' } .= " $_->{topic}/$_->{partition}" for @{ real_records($rk, topics => [$topic]) };
for my $f (@firsts)
{
	my ($round, $id, $led) = @$f;
	my %is_led = map { ("$topic/$_" => 1) } @$led;
	my @where = split ' ', $at{$id} // '';
	ok(@where && !grep({ !$is_led{$_} } @where),
		"round $round: in Kafka, the first event published after the SIGSTOP is on a partition the frozen broker led")
	  or diag "event $id at: @where; led: @$led";
}

my $log = slurp_file($node->logfile);
my $oos = () = $log =~ /OUT_OF_ORDER_SEQUENCE/g;
my $fatal = counter($node, 'delivery_errors_fatal');
my $recreated = counter($node, 'producer_creations') - 1;
my $timeouts = counter($node, 'delivery_timeouts');
my $r = real_verdict($rk, $node, 'leader_pause', topics => [$topic],
	recover_s => $recover_max,
	figures => { failover_s => sprintf('%.2f', $failover_max),
		recreations => $recreated, out_of_order_logged => $oos,
		delivery_timeouts => $timeouts });
is($recreated, $fatal, 'every producer recreation was due to a fatal error');
if ($recreated == 0 && $timeouts == 0)
{
	is($r->{duplicates}, 0,
		'no recreation, no abandoned batch: retries were deduplicated by the broker');
}
else
{
	note "duplicates $r->{duplicates}: $recreated producer recreation(s) (a new producer id: "
	  . "the broker cannot recognise its re-sends) and $timeouts batch(es) abandoned after "
	  . 'outbox.delivery_timeout (late acknowledgements not marked, events sent again)';
}
note "worker log: $_" for grep { /outbox: fatal|OUT_OF_ORDER|desynchron/ } split /\n/, $log;
note_counters($node, $t_start);

$node->stop;
$rk->stop;
done_testing();
