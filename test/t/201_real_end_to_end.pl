# Real Kafka, end to end: a 3-broker Apache Kafka 3.9 cluster (RF 3,
# min.insync.replicas 2, acks=all) instead of the mock.  A commit wakes the
# publisher; concurrent emitters with rollbacks and savepoints on hot
# aggregates run beside a plain load over many aggregates, with two
# publisher workers, and a configuration reload under load recreates the
# producer.  The order checker judges what reached Kafka, and a client that
# is not librdkafka (the Java client, test/kafka/ReadBack.java) reads the
# topics back to check the checker.
#
# recover_s: from the end of the emitters until nothing was pending.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use OutboxTest;
use RealKafka;
use RealTest;

my $hot = 8;
my @topics = ('outbox.event.load', 'outbox.event.hot');

my ($node, $rk) = outbox_setup('real_e2e', kafka => 'real',
	topics => [ 'outbox.event.load:6', 'outbox.event.hot:3' ],
	workers => 2, poll_interval => '60s');
$node->append_conf('postgresql.conf', "deadlock_timeout = '100ms'\n");
quiet_statements($node);
ok(defined wait_publisher($node, 2, 30), 'two publisher workers running');

# A commit wakes the publisher: with a 60 s fallback poll an event is only
# published quickly if the commit set the worker's latch.
$node->safe_psql('postgres', "SELECT outbox_emit('load', 'warmup', 'Created', '{}')");
my $t = wait_published($node, 30);
ok(defined $t, 'first event published') or diag "took " . ($t // 'forever');
note sprintf "first event (producer start, metadata) published in %.2f s", $t // -1;
my $wakeups = counter($node, 'wakeups');
$node->safe_psql('postgres', "SELECT outbox_emit('load', 'warmup', 'Changed', '{}')");
$t = wait_published($node, 20);
ok(defined $t && $t < 5, 'commit wake-up: published within 5 s despite a 60 s poll interval')
  or diag "took " . ($t // 'forever');
note sprintf "commit to published on real Kafka: %.3f s", $t // -1;
cmp_ok(counter($node, 'wakeups'), '>', $wakeups, 'the worker counted a wake-up');

# Hot aggregates: two per transaction (lower id first: no deadlock), with
# savepoints rolled back or released and transactions rolled back.
my $script = savepoint_script($hot);

my $t_start = time;
my $hotload = start_load($node, script => $script, clients => 6, jobs => 1,
	transactions => 400, max_tries => 1000);
my $load = start_load($node, clients => 4, jobs => 1, transactions => 600,
	events_per_tx => 5, aggregates => 1000, rate => 200);

# A reload under load: other producer properties recreate the producer.
sleep 0.2 while max_id($node) < 3000 && time - $t_start < 30;
my $creations = counter($node, 'producer_creations');
$node->append_conf('postgresql.conf', "outbox.kafka_properties = 'linger.ms=5'\n");
$node->reload;
note sprintf "reload at %.1f s, %d events emitted", time - $t_start, max_id($node);

ok(stop_load($hotload, 120), 'hot emitters finished (deadlocks retried)');
ok(stop_load($load, 120), 'plain emitters finished');
my $t_end = time;
my $drain = wait_published($node, 120);
ok(defined $drain, 'everything published');
note sprintf "emitters ran %.1f s; drained %.2f s after them", $t_end - $t_start, $drain // -1;
cmp_ok(counter($node, 'producer_creations'), '>=', $creations + 2,
	'the reload recreated the producer of both workers');
ok($node->log_contains('Kafka settings changed, recreating the producer'),
	'the reload is logged');

db_versions_contiguous($node, 'real end to end');

# Where each event went, as Kafka holds it: every event of the database
# once, and within each aggregate one partition, with offsets increasing
# with the version (the database records no partition or offset).
my %db = map { my ($g, $v, $e) = split /\t/; ("$g/$v" => $e) } split /\n/,
  $node->safe_psql('postgres',
	q{SELECT aggregate_id || E'\t' || aggregate_version || E'\t' || event_id FROM outbox});
my (%copies, %by_agg, @wrong);
for my $rec (@{ real_records($rk, topics => \@topics) })
{
	my $k = "$rec->{key}/$rec->{version}";
	push @wrong, "$rec->{topic} [$rec->{partition}] \@$rec->{offset}: $k is not the database's event"
	  unless defined $db{$k} && $db{$k} eq ($rec->{event_id} // '');
	$copies{$k}++;
	push @{ $by_agg{ $rec->{key} } }, $rec;
}
is(scalar(@wrong), 0, 'every record in Kafka is the database\'s event at its version')
  or diag join "\n", @wrong[0 .. ($#wrong < 19 ? $#wrong : 19)];
is(scalar(grep { ($copies{$_} // 0) != 1 } keys %db), 0, 'every event is in Kafka exactly once');
my @disorder;
for my $agg (sort keys %by_agg)
{
	my @r = sort { $a->{version} <=> $b->{version} } @{ $by_agg{$agg} };
	for my $i (1 .. $#r)
	{
		push @disorder, "$agg v$r[$i]{version} at $r[$i]{topic} [$r[$i]{partition}] \@$r[$i]{offset}"
		  . " after v$r[$i-1]{version} at $r[$i-1]{topic} [$r[$i-1]{partition}] \@$r[$i-1]{offset}"
		  if $r[$i]{topic} ne $r[$i-1]{topic} || $r[$i]{partition} != $r[$i-1]{partition}
		  || $r[$i]{offset} <= $r[$i-1]{offset};
	}
}
is(scalar(@disorder), 0, 'Kafka offsets increase with the version within each aggregate, on one partition')
  or diag join "\n", @disorder[0 .. ($#disorder < 19 ? $#disorder : 19)];
cmp_ok(max_id($node), '>=', 5000, 'thousands of events emitted');

my $r = real_verdict($rk, $node, 'end_to_end', topics => \@topics, recover_s => $drain);
is($r->{duplicates}, 0, 'no duplicates without faults');
real_readback($rk, $node, 'end_to_end', $r, topics => \@topics);
note_counters($node, $t_start);

$node->stop;
$rk->stop;
done_testing();
