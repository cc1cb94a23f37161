# Fault: one partition of six has no leader for 10 s under load (leader
# <topic> 0 -1), then gets one back.  Its messages cannot be delivered;
# librdkafka retries them forever.  Every event must reach Kafka, per
# aggregate in version order, once the partition is back.
#
# The publisher does not wait for the leaderless partition: the aggregates
# whose messages are still out there stay busy, and later batches leave
# them alone until librdkafka reports them (122 bounds the healthy
# partitions' delay): the five healthy partitions keep being published
# meanwhile.
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

my $outage_s = $ENV{OUTBOX_FAULT_SECONDS} // 10;
my $topic = 'outbox.event.load';

my %conf = fault_conf();
my ($node, $mk) = outbox_setup('leaderless', brokers => 3,
	mock_cmds => [ "topic_create $topic 6 3" ],
	%conf);
note "kafka_properties: " . ($conf{kafka_properties} // '(default)');
quiet_statements($node);

my $t_start = time;
my $load = start_load($node, clients => 4, transactions => 800,
	events_per_tx => 5, aggregates => 1000, rate => 200);
sleep 0.2 while max_id($node) < 2000 && time - $t_start < 120;

# The outage lasts at least $outage_s s, and then until at least
# $progress_min events were published during it (up to $outage_max_s s):
# publishing the healthy partitions must not wait for the leaderless one.
# How many per second is a figure: it depends on the machine.
my $progress_min = 1000;
my $outage_max_s = 180;
my $published0 = counter($node, 'events_published');
$mk->cmd("leader $topic 0 -1");
my $t0 = time;
my %phases;
my $published = 0;
while (time - $t0 < $outage_s
	|| ($published < $progress_min && time - $t0 < $outage_max_s))
{
	sleep 0.5;
	$phases{ $node->safe_psql('postgres',
		"SELECT query FROM pg_stat_activity WHERE backend_type = 'outbox publisher'") }++;
	$published = counter($node, 'events_published') - $published0;
}
my $pending = pending($node);
my $backlog = max_id($node);
$mk->cmd("leader $topic 0 1");
my $t_back = time;
note sprintf "partition 0 leaderless for %.1f s: %d events published meanwhile, %d pending; worker phases sampled: %s",
  $t_back - $t0, $published, $pending,
  join(', ', map { "$_ x$phases{$_}" } sort keys %phases);
note sprintf "FIGURES scenario=leaderless_partition_outage seconds=%.1f published=%d per_s=%.0f pending=%d",
  $t_back - $t0, $published, $published / ($t_back - $t0), $pending;

cmp_ok($published, '>=', $progress_min,
	'aggregates on healthy partitions keep being published');

my $recover = wait_backlog($node, $backlog, 180);
ok(defined $recover, 'backlog published after the partition got a leader again');

ok(stop_load($load, 300), 'emitters finished without errors');
ok(defined wait_published($node, 180), 'nothing pending after the load');

db_versions_contiguous($node, 'leaderless partition');
my $r = verdict($mk, $node, 'leaderless_partition', recover_s => $recover);
note_counters($node, $t_start);

$node->stop;
$mk->stop;
done_testing();
