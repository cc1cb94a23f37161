# Fault: lost acknowledgements.  The mock appends a ProduceRequest at once
# but delays its response (broker_errors <broker> 0 0:<ms>) beyond the
# producer's timeout, so librdkafka times the request out, disconnects and
# sends the same messages again: the broker holds them twice.  Duplicates are
# expected; gaps, inversions and loss are not.
#
# Timeouts: the client-side timeout of an in-flight ProduceRequest is
# socket.timeout.ms here, not request.timeout.ms (that one is sent to the
# broker as its ack wait): the publisher forces message.timeout.ms=0, and
# librdkafka bounds a ProduceRequest by the first message's remaining
# timeout, i.e. never, and then by socket.timeout.ms.  librdkafka scans for
# timeouts once a second, so a request times out between socket.timeout.ms
# and socket.timeout.ms + 1 s: the delay must exceed both, hence 3 s with
# socket.timeout.ms=1000 (measured: "Timed out ProduceRequest in flight
# (after 1731ms..1902ms)").
#
# recover_s: from the last injected delay until every event committed
# before it was published (the longest of the rounds).
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $props = $ENV{OUTBOX_FAULT_KAFKA_PROPERTIES}
  // 'request.timeout.ms=500;socket.timeout.ms=1000';
my $delay = $ENV{OUTBOX_FAULT_DELAY_MS} // 3000;
my $rounds = $ENV{OUTBOX_FAULT_ROUNDS} // 5;
my $topic = 'outbox.event.load';

# Leaders on every broker, so each broker's delayed response hits a
# partition that is being written.
my ($node, $mk) = outbox_setup('lostacks', brokers => 3,
	mock_cmds => [ "topic_create $topic 6 3",
		(map { "leader $topic $_ " . (1 + $_ % 3) } 0 .. 5) ],
	kafka_properties => $props);
quiet_statements($node);
note "kafka_properties: $props; response delay ${delay} ms";

my $t_start = time;
my $load = start_load($node, clients => 4, transactions => 1100,
	events_per_tx => 5, aggregates => 1000, rate => 250);
sleep 0.2 while max_id($node) < 2000 && time - $t_start < 120;

# Each round: the next ProduceRequest of every broker is appended but
# answered $delay ms late; then let the publisher catch up.
my $recover = 0;
for my $i (1 .. $rounds)
{
	$mk->cmd("broker_errors $_ 0 0:$delay") for 1 .. 3;
	sleep(($delay + 500) / 1000);
	my $backlog = max_id($node);
	my $t = wait_backlog($node, $backlog, 180);
	ok(defined $t, "round $i: caught up after the lost acknowledgements");
	$recover = $t if defined $t && $t > $recover;
	# A lower bound: librdkafka suppresses some repeated log lines.
	note sprintf "round %d: caught up %.2f s after the delayed responses were due; %d timeouts logged so far",
	  $i, $t // -1, scalar(() = slurp_file($node->logfile) =~ /Timed out ProduceRequest in flight/g);
}

my $timeouts = () = slurp_file($node->logfile) =~ /Timed out ProduceRequest in flight/g;
cmp_ok($timeouts, '>=', $rounds, 'librdkafka timed out in-flight ProduceRequests (acks lost)');

ok(stop_load($load, 300), 'emitters finished without errors');
ok(defined wait_published($node, 180), 'nothing pending after the load');

db_versions_contiguous($node, 'lost acks');
my $r = verdict($mk, $node, 'lost_acks', recover_s => $recover);
cmp_ok($r->{duplicates}, '>', 0, 'lost acknowledgements produced duplicates, as expected');
note_counters($node, $t_start);

$node->stop;
$mk->stop;
done_testing();
