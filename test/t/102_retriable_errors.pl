# Fault: retriable Produce errors (NOT_LEADER_FOR_PARTITION=6,
# REQUEST_TIMED_OUT=7, NOT_ENOUGH_REPLICAS=19) injected at a steady rate
# during a load, while partition leadership moves between brokers.  The
# mock returns an injected error without appending; librdkafka retries.
# Every event must reach Kafka once at least, per aggregate in version
# order.
#
# recover_s: from the end of the injection (clear_errors) until every event
# committed before it was published.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $inject_s = $ENV{OUTBOX_FAULT_SECONDS} // 10;
my $burst_s = $ENV{OUTBOX_FAULT_BURST_SECONDS} // 4;
my $partitions = 6;
my $topic = 'outbox.event.load';

my %conf = fault_conf();
# Known partitions, so that leader moves hit every one of them.
my ($node, $mk) = outbox_setup('retriable', brokers => 3,
	mock_cmds => [ "topic_create $topic $partitions 3" ],
	%conf);
note "kafka_properties: " . ($conf{kafka_properties} // '(default)');
quiet_statements($node);

my $t_start = time;
my $load = start_load($node, clients => 4, transactions => 1400,
	events_per_tx => 5, aggregates => 1000, rate => 300);
sleep 0.2 while max_id($node) < 2000 && time - $t_start < 120;

# Phase 1 (at least $inject_s s): every 100 ms one more error for the next
# ProduceRequest, in turn 6, 7, 19; every 500 ms the leader of one
# partition moves to the next broker.  Requests fail and are retried while
# later ones are in flight, and the publisher keeps making progress: the
# phase goes on (up to $phase1_max_s s) until at least $progress_min events
# were published during it.  How many per second is a figure, not a
# verdict: it depends on how busy the machine is.
# Phase 2 ($burst_s s): three errors (6 7 19) every 100 ms.  That is more
# than the producer sends requests when it is retrying a batch, so the
# mock's error stack grows and nearly every request fails: the batch hits
# the delivery timeout, the worker waits for the producer to settle, and
# little or nothing is published until the errors are cleared.
my @codes = (6, 7, 19);
my ($pushes, $moves) = (0, 0);
my @leader = map { 1 + $_ % 3 } 0 .. $partitions - 1;
my $progress_min = 200;
my $phase1_max_s = 180;
my $t_inject = time;
my $published0 = counter($node, 'events_published');
my $published1 = $published0;
while (time - $t_inject < $inject_s
	|| ($published1 - $published0 < $progress_min && time - $t_inject < $phase1_max_s))
{
	$mk->cmd("errors 0 $codes[$pushes % 3]");
	$pushes++;
	if ($pushes % 5 == 0)
	{
		my $p = $moves % $partitions;
		$leader[$p] = 1 + $leader[$p] % 3;
		$mk->cmd("leader $topic $p $leader[$p]");
		$moves++;
	}
	$published1 = counter($node, 'events_published') if $pushes % 5 == 0;
	sleep 0.1;
}
$published1 = counter($node, 'events_published');
my $phase1_s = time - $t_inject;
note sprintf "phase 1: %d single errors and %d leader moves over %.1f s; "
  . "%d events published meanwhile, %d pending at the end",
  $pushes, $moves, $phase1_s, $published1 - $published0, pending($node);
note sprintf "FIGURES scenario=retriable_errors_phase1 seconds=%.1f published=%d per_s=%.0f",
  $phase1_s, $published1 - $published0, ($published1 - $published0) / $phase1_s;
cmp_ok($published1 - $published0, '>=', $progress_min,
	"phase 1: the publisher made progress between the errors (at least $progress_min events)");

my $bursts = 0;
my $t_burst = time;
while (time - $t_burst < $burst_s)
{
	$mk->cmd('errors 0 6 7 19');
	$bursts++;
	sleep 0.1;
}
$mk->cmd('clear_errors 0');
my $backlog = max_id($node);
note sprintf "phase 2: %d x 3 errors over %.1f s; %d events published meanwhile, %d pending at the end",
  $bursts, time - $t_burst, counter($node, 'events_published') - $published1, pending($node);

my $recover = wait_backlog($node, $backlog, 180);
ok(defined $recover, 'backlog published after the injection stopped');

ok(stop_load($load, 300), 'emitters finished without errors');
ok(defined wait_published($node, 180), 'nothing pending after the load');
cmp_ok(max_id($node), '>=', 15000, 'a substantial load was emitted');
cmp_ok($node->safe_psql('postgres',
	q{SELECT count(*) FROM outbox WHERE attempts > 1}), '==', 0,
	'no event counted a permanent failure');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM aggregate_publication WHERE blocked_version IS NOT NULL}),
	'0', 'no aggregate blocked by retriable errors');

db_versions_contiguous($node, 'retriable errors');
my $r = verdict($mk, $node, 'retriable_errors', recover_s => $recover);
note_counters($node, $t_start);

$node->stop;
$mk->stop;
done_testing();
