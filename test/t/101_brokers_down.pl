# Fault: every broker down for 10 s in the middle of a 50,000-event load
# while the emitters keep committing, then back up.  Nothing may be marked
# published while Kafka is unreachable; afterwards every event must reach
# Kafka, per aggregate in version order (re-sends of the batch that was
# waiting when the brokers went away are expected as duplicates).
#
# recover_s: from all_up until every event committed before all_up is
# published (the emitters are still running then, so "nothing pending at
# all" is measured separately, after they finish).
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
mkdir "$dir/mock";
my $mk = MockKafka->start(dir => "$dir/mock", brokers => 3, max_seconds => 300);
my %conf = fault_conf();
my $node = outbox_node('down', $mk, %conf);
note "kafka_properties: " . ($conf{kafka_properties} // '(default)');
quiet_statements($node);

# 4 clients x 2800 transactions x 5 events, 10 % rolled back: ~50,400
# events at ~2,250 events/s, so the load runs ~22 s around the outage.
my $t_start = time;
my $load = start_load($node, clients => 4, transactions => 2800,
	events_per_tx => 5, aggregates => 2000, rate => 500);

# Let about a third of the load through, published normally.
my $t0 = time;
sleep 0.2 while max_id($node) < 15000 && time - $t0 < 30;
cmp_ok(max_id($node), '>=', 15000, 'load under way before the outage');

$mk->cmd('all_down');
my $t_down = time;
note sprintf "all_down at %.1f s, %d events emitted", $t_down - $t_start, max_id($node);
# The batch in flight at all_down waits outbox.delivery_timeout (5 s here)
# and then commits what had been acknowledged before the brokers went
# away; from then on nothing may be marked.
sleep 6;
my $published_down = counter($node, 'events_published');
my $pending_down = pending($node);
my $emitted_down = max_id($node);
sleep 4;
is(counter($node, 'events_published'), $published_down,
	'nothing is marked published while every broker is down');
my $pending_up = pending($node);
cmp_ok($pending_up, '>', $pending_down, 'events pile up in the outbox during the outage');
cmp_ok(max_id($node), '>', $emitted_down + 5000, 'emitters kept committing during the outage');

my $backlog = max_id($node);
$mk->cmd('all_up');
my $t_up = time;
note sprintf "all_up after %.1f s down, %d pending", $t_up - $t_down, $pending_up;

my $recover = wait_backlog($node, $backlog, 60);
ok(defined $recover, 'backlog published after the brokers came back');
note sprintf "recovered in %.2f s", $recover // -1;

ok(stop_load($load, 60), 'emitters finished without errors');
my $drain = wait_published($node, 60);
ok(defined $drain, 'nothing pending after the load');
cmp_ok(max_id($node), '>=', 45000, 'about 50,000 events emitted');
cmp_ok(counter($node, 'delivery_timeouts'), '>=', 1,
	'the batch waiting during the outage hit the delivery timeout');

db_versions_contiguous($node, 'brokers down');
my $r = verdict($mk, $node, 'brokers_down', recover_s => $recover);
note_counters($node, $t_start);

$node->stop;
$mk->stop;
done_testing();
