# Settling inserts an aggregate's first aggregate_publication row itself
# (publish_progress.c).  If an operator's transaction is inserting that row
# meanwhile (outbox_catch_up() of an aggregate that had none), the publisher
# waits for it, as the INSERT ... ON CONFLICT DO NOTHING it replaces did: if
# that transaction rolls back, the publisher's row goes in and the event is
# settled once; leaving the row alone would leave the aggregate unrecorded
# and its acknowledged event to be sent again.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
mkdir "$dir/mock";
my $mk = MockKafka->start(dir => "$dir/mock", brokers => 1, max_seconds => 300);
my $node = outbox_node('first_row', $mk);

sub q1 { $node->safe_psql('postgres', $_[0]) }

q1(q{SELECT outbox_emit('first', 'warm', 'E', '{}')});
ok(defined wait_published($node, 60), 'the publisher runs');

# An operator's transaction inserts the row of aggregate "new", uncommitted.
my $op = $node->background_psql('postgres');
$op->query_safe('BEGIN');
$op->query_safe(q{SELECT outbox_catch_up('new')});

q1(q{SELECT outbox_emit('first', 'new', 'E', '{"n": 1}')});
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_activity
	   WHERE backend_type = 'outbox publisher' AND wait_event = 'transactionid'}),
	'the publisher settling the event waits for the transaction inserting its row');

$op->query_safe('ROLLBACK');
$op->quit;
ok(defined wait_published($node, 60), 'after the rollback the event is settled');
is(q1(q{SELECT last_published_version FROM aggregate_publication WHERE aggregate_id = 'new'}), '1',
	"the publisher's row went in");
sleep 1.5;
my $r = $mk->check(topics => ['outbox.event.first'], expect => { new => 1, warm => 1 });
is($r->{exit}, 0, 'every event in Kafka, in order') or diag $r->{output};
is($r->{duplicates}, 0, 'and sent once');

# The columns' defaults are planned once and kept, but an ALTER TABLE that
# a settling's lock waits for is seen: with the acknowledgement held back
# (2 s round trip), a default changes while the event is out, and the
# settling, blocked by the ALTER's lock, inserts the row with the new one.
# Nothing else of the worker may take that wait first (then the settling
# would find the invalidation already in): no retention (it joins
# aggregate_publication once a second), and no read while the event is out
# (outbox.batch_events = 1: no room for more).
q1(q{ALTER SYSTEM SET outbox.retention = -1; ALTER SYSTEM SET outbox.inbox_retention = -1;
	ALTER SYSTEM SET outbox.batch_events = 1; SELECT pg_reload_conf()});
sleep 1;
q1(q{SELECT outbox_emit('first', 'warm2', 'E', '{}')});
ok(defined wait_published($node, 60), 'a first row inserted (the defaults are planned)');
$mk->cmd('rtt all 2000');
my $batches = counter($node, 'batches');
q1(q{SELECT outbox_emit('first', 'altered', 'E', '{}')});
ok($node->poll_query_until('postgres',
	"SELECT value > $batches FROM outbox_counters() WHERE name = 'batches'"), 'the event is out');
my $ddl = $node->background_psql('postgres');
$ddl->query_safe('BEGIN');
$ddl->query_safe('ALTER TABLE aggregate_publication ALTER COLUMN attempts SET DEFAULT 7');
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_activity
	   WHERE backend_type = 'outbox publisher' AND wait_event_type = 'Lock' AND wait_event = 'relation'
	     AND query = 'marking published'}),
	"the settling waits for the ALTER's lock");
$ddl->query_safe('COMMIT');
$ddl->quit;
$mk->cmd('rtt all 0');
ok(defined wait_published($node, 60), 'the event is settled');
is(q1(q{SELECT attempts FROM aggregate_publication WHERE aggregate_id = 'altered'}), '7',
	'with the default the ALTER set');
q1('ALTER TABLE aggregate_publication ALTER COLUMN attempts SET DEFAULT 0');

$node->stop;
$mk->stop;
done_testing();
