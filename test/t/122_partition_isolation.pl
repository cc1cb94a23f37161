# Fault: one partition of eight has no leader for 12 s under a steady load.
# Its messages wait in librdkafka; the publisher keeps producing and
# settling the aggregates of the seven healthy partitions meanwhile, so
# their events' publish delay (from the emit until the database records the
# acknowledgement, sampled every 50 ms) stays short: the
# 99th percentile of the events emitted during the outage must be under
# 1 s.  (A publisher that waits for a whole batch's acknowledgements waits
# outbox.delivery_timeout, 5 s here, whenever a batch meets an aggregate of
# the leaderless partition.)  Afterwards every event must reach Kafka, per
# aggregate in version order.
#
# recover_s: from the leader's return until every event committed before it
# was published.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $outage_s = 12;
my $topic = 'outbox.event.load';

my %conf = fault_conf();
my ($node, $mk) = outbox_setup('isolation', brokers => 3,
	mock_cmds => [ "topic_create $topic 8 3" ],
	%conf);
note "kafka_properties: " . ($conf{kafka_properties} // '(default)');
quiet_statements($node);

# About 500 events/s (4 clients, 100 transactions/s of 5 events) for about
# 30 s: steady before, during and after the outage.
my $t_start = time;
my $sampler = start_publish_sampler($node, 120);
my $load = start_load($node, clients => 4, transactions => 750,
	events_per_tx => 5, aggregates => 1000, rate => 100);
sleep 0.2 while max_id($node) < 2000 && time - $t_start < 120;
cmp_ok(max_id($node), '>=', 2000, 'load under way before the outage');

$mk->cmd("leader $topic 0 -1");
my $t_down = $node->safe_psql('postgres', 'SELECT pg_catalog.clock_timestamp()');
sleep $outage_s;
my $t_up = $node->safe_psql('postgres', 'SELECT pg_catalog.clock_timestamp()');
my $backlog = max_id($node);
$mk->cmd("leader $topic 0 1");

my $recover = wait_backlog($node, $backlog, 180);
ok(defined $recover, 'backlog published after the partition got a leader again');
ok(stop_load($load, 300), 'emitters finished without errors');
ok(defined wait_published($node, 180), 'nothing pending after the load');

# The healthy partitions' events emitted during the outage (an aggregate's
# partition as Kafka has it).
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox o
	WHERE NOT EXISTS (SELECT 1 FROM published_seen s WHERE s.id = o.id)}),
	'the sampler saw every event published');
my %partition;
my $printed = $mk->check(topics => [$topic], opts => ['--print'])->{output};
$partition{$2} = $1 while $printed =~ /^\Q$topic\E \[(\d+)\] \@\d+ key=(\S+) /mg;
my (@healthy, $dead);
for my $e (publish_delays($node, $sampler, "o.created_at BETWEEN '$t_down' AND '$t_up'"))
{
	my $p = $partition{ $e->[0] };
	die "no partition seen for aggregate $e->[0]" unless defined $p;
	if ($p == 0) { $dead++ }
	else { push @healthy, $e->[1] }
}
@healthy = sort { $a <=> $b } @healthy;
my $n = @healthy;
my ($p50, $p99, $max) = $n ? map { $healthy[ int(($n - 1) * $_) ] } (0.5, 0.99, 1) : (0, 0, 0);
$dead //= 0;
note sprintf "FIGURES scenario=partition_isolation outage_s=%d healthy_events=%d "
  . "healthy_p50_ms=%s healthy_p99_ms=%s healthy_max_ms=%s leaderless_events=%d",
  $outage_s, $n, $p50, $p99, $max, $dead;
cmp_ok($n, '>=', 1000, 'healthy partitions got events during the outage');
cmp_ok($dead, '>=', 50, 'the leaderless partition got events during the outage');
cmp_ok($p99, '<', 1000,
	'p99 publish delay of the healthy partitions during the outage is under 1 s');

db_versions_contiguous($node, 'partition isolation');
my $r = verdict($mk, $node, 'partition_isolation', recover_s => $recover);
note_counters($node, $t_start);

$node->stop;
$mk->stop;
done_testing();
