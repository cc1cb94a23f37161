# Real Kafka: lost acknowledgements without a leader change, and the
# duplicates they leave.  Each round SIGSTOPs one broker for 2 s, less than
# the 3 s broker session timeout, so it stays leader.  The producer's
# requests to it time out on the client (socket.timeout.ms 500 here) after
# some were appended: librdkafka disconnects and sends the same batches
# again, with the same producer id and sequence numbers.  The mock appended
# such retries twice (test/t/103_lost_acks.pl counts duplicates); a real
# broker remembers the last five batches per producer and partition and
# answers a retry with the original offsets.  outbox.delivery_timeout is 30 s
# so that no batch gives up waiting.  So the only duplicates allowed come
# from a recreated producer (a fatal error: new producer id), counted
# beside them.
#
# recover_s: from a resume until everything committed before it was
# published (longest round).
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
my $rounds = $ENV{OUTBOX_REAL_ROUNDS} // 6;
my $props = $ENV{OUTBOX_FAULT_KAFKA_PROPERTIES} // 'socket.timeout.ms=500';

my ($node, $rk) = outbox_setup('real_lostacks', kafka => 'real', topics => ["$topic:6"],
	kafka_properties => $props, delivery_timeout => '30s');
quiet_statements($node);
note "kafka_properties: $props; $rounds pauses of 2 s";

my $t_start = time;
my $load = start_real_load($node);

my $recover = 0;
for my $round (1 .. $rounds)
{
	my $victim = 1 + ($round - 1) % 3;
	$rk->node(pause => $victim);
	sleep 2;
	my $backlog = max_id($node);
	$rk->node(resume => $victim);
	my $t_resume = time;
	my $t = wait_backlog($node, $backlog, 60);
	ok(defined $t, "round $round: caught up after node $victim was frozen 2 s");
	$t = time - $t_resume if defined $t;
	$recover = $t if defined $t && $t > $recover;
	sleep 1;
}

ok(stop_load($load, 60), 'emitters stopped');
ok(defined wait_published($node, 120), 'nothing pending after the load');
db_versions_contiguous($node, 'lost acks');

my $log = slurp_file($node->logfile);
my $lost = () = $log =~ /Timed out ProduceRequest in flight/g;
cmp_ok($lost, '>=', 1, 'in-flight ProduceRequests timed out (acknowledgements lost)');
my $fenced = () = slurp_file("$rk->{dir}/node-1/server.log") =~ /Fencing broker/g;
my $recreated = counter($node, 'producer_creations') - 1;
my $r = real_verdict($rk, $node, 'lost_acks', topics => [$topic], recover_s => $recover,
	figures => { requests_timed_out => $lost, recreations => $recreated,
		delivery_timeouts => counter($node, 'delivery_timeouts') });
if ($recreated == 0)
{
	is($r->{duplicates}, 0, 'retries after lost acknowledgements left no duplicate');
}
else
{
	note "duplicates $r->{duplicates}: re-sends of $recreated recreated producer(s)";
}
note "fencings logged by node 1 (the paused broker should stay registered): $fenced";
note "worker log: $_" for grep { /outbox: fatal|OUT_OF_ORDER|desynchron/ } split /\n/, $log;
note_counters($node, $t_start);

$node->stop;
$rk->stop;
done_testing();
