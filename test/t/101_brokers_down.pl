# Fault: every broker down for 10 s in the middle of a 50,000-event load
# while the emitters keep committing, then back up.  Nothing may be marked
# published while Kafka is unreachable; afterwards every event must reach
# Kafka, per aggregate in version order, and under 1 % of them twice (the
# messages librdkafka held are delivered once the brokers are back, and
# those late acknowledgements count).
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

my %conf = fault_conf();
my ($node, $mk) = outbox_setup('down', brokers => 3, %conf);
note "kafka_properties: " . ($conf{kafka_properties} // '(default)');
quiet_statements($node);

# 4 clients x 2800 transactions x 5 events, 10 % rolled back: ~50,400
# events at ~2,250 events/s, so the load runs ~22 s around the outage.
my $t_start = time;
my $load = start_load($node, clients => 4, transactions => 2800,
	events_per_tx => 5, aggregates => 2000, rate => 500);

# Let about a third of the load through, published normally.
my $t0 = time;
sleep 0.2 while max_id($node) < 15000 && time - $t0 < 180;
cmp_ok(max_id($node), '>=', 15000, 'load under way before the outage');

my $timeouts0 = counter($node, 'delivery_timeouts');
$mk->cmd('all_down');
my $t_down = time;
# Events with a higher id commit after the brokers went down: none of them
# can be acknowledged until they are back.
my $id_down = max_id($node);
note sprintf "all_down at %.1f s, %d events emitted", $t_down - $t_start, $id_down;

# The messages out at all_down stay out; after outbox.delivery_timeout (5 s
# here) they count as timed out.  Wait for that (however long it takes)
# instead of guessing: a delivery timeout, and then another batch read (the
# batches counter moved) or the worker waiting (idle, or reading or
# producing).
$t0 = time;
sleep 0.1 while counter($node, 'delivery_timeouts') == $timeouts0 && time - $t0 < 120;
cmp_ok(counter($node, 'delivery_timeouts'), '>', $timeouts0,
	'a batch hit the delivery timeout with the brokers down');
my $batches = counter($node, 'batches');
$t0 = time;
sleep 0.1 while counter($node, 'batches') == $batches && time - $t0 < 120
  && $node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type = 'outbox publisher'
	  AND (query LIKE 'idle%' OR query IN ('reading pending events', 'producing', 'retention'))}) == 0;
note sprintf "the batch waiting at all_down was done %.1f s after all_down", time - $t_down;

# From here on nothing may be marked, for as long as the brokers are down:
# watched over one more delivery timeout, while the emitters go on (they
# never wait for Kafka; how fast they go is a figure).
my $published_down = counter($node, 'events_published');
my $pending_down = pending($node);
sleep 6;
$t0 = time;
sleep 0.2 while max_id($node) < $id_down + 1000 && time - $t0 < 120;
is(counter($node, 'events_published'), $published_down,
	'nothing is marked published while every broker is down');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM outbox WHERE id > $id_down AND id NOT IN (SELECT id FROM outbox_pending)"),
	'0', 'no event committed after all_down was published during the outage');
my $emitted_during = $node->safe_psql('postgres', "SELECT count(*) FROM outbox WHERE id > $id_down");
cmp_ok($emitted_during, '>=', 1000, 'emitters kept committing during the outage');
my $pending_up = pending($node);
cmp_ok($pending_up, '>=', $pending_down > $emitted_during ? $pending_down : $emitted_during,
	'events pile up in the outbox during the outage');
note sprintf "FIGURES scenario=brokers_down_outage down_s=%.1f emitted_during=%d emitted_per_s=%.0f",
  time - $t_down, $emitted_during, $emitted_during / (time - $t_down);

my $backlog = max_id($node);
$mk->cmd('all_up');
my $t_up = time;
note sprintf "all_up after %.1f s down, %d pending", $t_up - $t_down, $pending_up;

my $recover = wait_backlog($node, $backlog, 180);
ok(defined $recover, 'backlog published after the brokers came back');
note sprintf "recovered in %.2f s", $recover // -1;

ok(stop_load($load, 300), 'emitters finished without errors');
my $drain = wait_published($node, 180);
ok(defined $drain, 'nothing pending after the load');
cmp_ok(max_id($node), '>=', 45000, 'about 50,000 events emitted');
cmp_ok(counter($node, 'delivery_timeouts'), '>=', 1,
	'the batch waiting during the outage hit the delivery timeout');

db_versions_contiguous($node, 'brokers down');
my $r = verdict($mk, $node, 'brokers_down', recover_s => $recover);

# What librdkafka held while the brokers were down is delivered when they
# are back, and those late acknowledgements are recorded: nothing is sent
# twice but what was on the wire when they went away.
note sprintf "FIGURES scenario=brokers_down_resends duplicates=%s events=%d resent_pct=%.2f",
  $r->{duplicates} // '?', $r->{events}, 100 * ($r->{duplicates} // 0) / $r->{events};
cmp_ok($r->{duplicates} // 0, '<', 0.01 * $r->{events}, 'under 1 % of the events re-sent');
note_counters($node, $t_start);

$node->stop;
$mk->stop;
done_testing();
