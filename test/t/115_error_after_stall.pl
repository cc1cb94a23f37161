# An error ends a settling while messages are still in flight.
#
# One partition has no leader, so messages of some aggregates stay in
# librdkafka (past outbox.delivery_timeout: they count as timed out), while
# the settling of the others fails (the publisher role lost INSERT on
# aggregate_publication) and its marks are held.  The flight must stay
# tracked through the error: once the leader is back and the grant
# restored, the late reports settle the rest and everything is published.
# (Before the pipeline, the tracker still pointed into a batch's memory
# that the error had reset, a use-after-free, and the aggregates stayed
# stalled for good.)
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $topic = 'outbox.event.stall';
my $dir = $PostgreSQL::Test::Utils::tmp_check;
my ($node, $mk) = outbox_setup('stall', brokers => 3,
	mock_cmds => [ "topic_create $topic 6 3" ],
	delivery_timeout => '1s', poll_interval => '10min');
worker_role($node);

# Connect the producer and learn the topic's partitions first.
$node->safe_psql('postgres',
	q{SELECT outbox_emit('stall', 'w-' || g, 'E', '{}') FROM generate_series(1, 20) g});
ok(defined wait_published($node, 30), 'warm-up events published');

$mk->cmd("leader $topic 0 -1");
$node->safe_psql('postgres', 'REVOKE INSERT ON aggregate_publication FROM outbox_worker');
$node->safe_psql('postgres',
	q{SELECT outbox_emit('stall', 's-' || g, 'E', '{}') FROM generate_series(1, 60) g});
ok($node->poll_query_until('postgres', q{
	SELECT problem LIKE 'recording the progress of % aggregates failed%' FROM outbox_workers() WHERE worker = 0}),
	'the settling of the acknowledged aggregates failed');
ok($node->poll_query_until('postgres', q{
	SELECT value >= 1 FROM outbox_counters() WHERE name = 'delivery_timeouts'}),
	'messages to the leaderless partition timed out');

$mk->cmd("leader $topic 0 1");
$node->safe_psql('postgres', 'GRANT INSERT ON aggregate_publication TO outbox_worker');
ok(defined wait_published($node, 60),
	'the abandoned batch\'s late reports freed its aggregates: everything published');

my $r = $mk->check(topics => [$topic], expect => expect_file($node, "$dir/expect"),
	events => events_file($node, "$dir/events"));
is($r->{exit}, 0, 'order checker clean') or diag $r->{output};

$node->stop;
$mk->stop;
done_testing();
