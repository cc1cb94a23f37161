# A delta records where each event's row was when it was read, and later
# reads fetch its chunks from there (publish_heap.c).  A row updated in
# between (attempts, a disposition: a new row version elsewhere) is not at
# that place any more: it must be found by id, not dropped.  Here a delta
# of 1,000 events is read 50 at a time (half of outbox.batch_events); while
# the first two batches fill the window (their acknowledgements held back by
# a 3 s round trip), every pending row is updated; the other 900 are then
# fetched by id, and every event reaches Kafka once, in order.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
my ($node, $mk) = outbox_setup('moved_rows', batch_events => 100);
$node->append_conf('postgresql.conf', "log_min_messages = debug1\n");
$node->reload;

# every aggregate has its row (the settling below updates, not inserts)
q1(q{SELECT outbox_emit('moved', 'mv-' || g, 'E', '{}') FROM generate_series(0, 9) g});
ok(defined wait_published($node, 60), 'first events published');

q1('SELECT outbox_pause()');
q1(q{SELECT outbox_emit('moved', 'mv-' || (g % 10), 'E', jsonb_build_object('n', g))
     FROM generate_series(1, 1000) g});

$mk->cmd('rtt all 3000');
my $log_from = -s $node->logfile;
my $batches = counter($node, 'batches');

q1('SELECT outbox_resume()');
ok( $node->poll_query_until('postgres',
		"SELECT value >= $batches + 2 FROM outbox_counters() WHERE name = 'batches'"),
	'the first two batches are out, filling the window');
q1(q{UPDATE outbox SET attempts = attempts WHERE aggregate_version > 1});
is(counter($node, 'batches'), $batches + 2, 'no other batch was read before the update');
$mk->cmd('rtt all 0');

ok(defined wait_published($node, 60), 'every event published after its row moved');
my $log = slurp_file($node->logfile, $log_from);
my $moved = 0;
$moved += $1 while $log =~ /outbox: \d+ of \d+ events moved since the delta was read, (\d+) found by id/g;
cmp_ok($moved, '>=', 800, "the moved rows were found by id ($moved)");

order_clean($mk, $node, ['outbox.event.moved'], "$dir/expect.tsv");

$node->stop;
$mk->stop;
done_testing();
