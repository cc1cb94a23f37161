# Settling writes each aggregate's aggregate_publication row itself
# (publish_progress.c): it inserts the first one and locks an existing one.
# A row another transaction holds (an operator's, left open: here one
# inserting the row with outbox_catch_up(), and one holding it FOR UPDATE)
# must not stop the worker: its aggregate is left for a later settling,
# the other aggregates of the same settling are recorded meanwhile, and
# once the transaction ends the aggregate is recorded, each event sent once.
# (The statement this replaced, and the first version of the C code,
# waited, and the whole worker with it.)
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('first_row');
my $others = 20;

q1(q{SELECT outbox_emit('first', 'warm', 'E', '{}')});
ok(defined wait_published($node, 60), 'the publisher runs');

# Events of the held aggregate and of others, committed together: one read,
# and (their acknowledgements awaited together) one settling.
sub emit_with_others
{
	my ($held, $prefix) = @_;
	q1("SELECT outbox_emit('first', '$held', 'E', '{}'), "
	  . "(SELECT count(outbox_emit('first', '$prefix-' || i, 'E', '{}')) FROM generate_series(1, $others) i)");
}

sub others_recorded
{
	my ($prefix) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = $others FROM aggregate_publication WHERE aggregate_id LIKE '$prefix-%'");
}

# 1. An operator's transaction inserts the row of aggregate "new", uncommitted.
my $published = counter($node, 'events_published');
my $op = $node->background_psql('postgres');
$op->query_safe('BEGIN');
$op->query_safe(q{SELECT outbox_catch_up('new')});
emit_with_others('new', 'other');
ok(others_recorded('other'), 'the other aggregates are settled while the row of "new" is being inserted');
ok($node->wait_for_log(qr/recording the progress of aggregate "new" waits for another transaction/),
	'the wait is logged');
ok($node->poll_query_until('postgres',
	q{SELECT state = 'idle, progress of 1 aggregates waits for a row lock' FROM outbox_workers()}),
	'and shown in outbox_workers()');
is(q1(q{SELECT count(*) FROM outbox_pending WHERE aggregate_id = 'new'}), '1',
	'the event of "new" is not recorded yet');
$op->query_safe('ROLLBACK');
ok(defined wait_published($node, 60), 'after the rollback the event is settled');
is(q1(q{SELECT last_published_version FROM aggregate_publication WHERE aggregate_id = 'new'}), '1',
	"the publisher's row went in");

# 2. An existing row held FOR UPDATE by an open transaction.
my $log_at = -s $node->logfile;
$op->query_safe('BEGIN');
$op->query_safe(q{SELECT 1 FROM aggregate_publication WHERE aggregate_id = 'warm' FOR UPDATE});
emit_with_others('warm', 'more');
ok(others_recorded('more'), 'the other aggregates are settled while the row of "warm" is locked');
ok($node->wait_for_log(qr/recording the progress of aggregate "warm" waits for another transaction/, $log_at),
	'that wait is logged too');
is(q1(q{SELECT last_published_version FROM aggregate_publication WHERE aggregate_id = 'warm'}), '1',
	'"warm" stays at version 1 while its row is held');
$op->query_safe('COMMIT');
$op->quit;
ok(defined wait_published($node, 60), 'after the commit version 2 is settled');
is(q1(q{SELECT last_published_version FROM aggregate_publication WHERE aggregate_id = 'warm'}), '2',
	'"warm" recorded at version 2');
is(counter($node, 'events_published') - $published, 2 + 2 * $others,
	'each event counted once as published');

sleep 1.5;
my %expect = (new => 1, warm => 2, (map { ("other-$_" => 1, "more-$_" => 1) } 1 .. $others));
my $r = $mk->check(topics => ['outbox.event.first'], expect => \%expect);
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
