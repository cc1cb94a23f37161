# Inbox end to end: events emitted in the producer database reach the
# consumer database through Kafka, each applied exactly once, per aggregate
# in version order, nothing of a rolled-back transaction; the handler runs as
# the subscribing role; an upstream replay is dropped as duplicates.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'outbox.event.load';
my ($node, $mk) = inbox_setup('inbox_e2e', brokers => 3, topics => ["$topic:4"], max_seconds => 600);
setup_consumer($node, 'billing', $topic);

is($node->safe_psql('consumer', 'SELECT consumer, topics, handler, owner FROM inbox_subscription'),
	"billing|{outbox.event.load}|app.apply(public.inbox_message)|app",
	'the subscription records the subscribing role, and the handler schema-qualified');

# Concurrent emitters with rollbacks.
emit_load($node, clients => 4, transactions => 300, aggregates => 50, events_per_tx => 2);
ok(defined wait_published($node, 120), 'producer: everything published');
my $committed = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
my $t = wait_applied($node, $committed, 120);
ok(defined $t, "consumer: $committed events applied") or diag $node->safe_psql('consumer', 'SELECT * FROM inbox_status');
sleep 1;
my @p = consumer_verdict($node);
is_deeply(\@p, [], 'exactly once, in version order, only committed events') or diag join("\n", @p);
is($node->safe_psql('consumer', "SELECT DISTINCT applied_by FROM app.applied"), 'app',
	'the handler ran as the subscribing role');
is($node->safe_psql('consumer', q{SELECT sum(applied) FROM inbox_status WHERE consumer = 'billing'}),
	$committed, 'inbox_status counts the applied events');
is($node->safe_psql('consumer', q{SELECT count(*) FROM inbox_offset o
	WHERE next_offset IS DISTINCT FROM high_watermark}), '0',
	'every partition is stored at its high watermark');
is($node->safe_psql('consumer', q{SELECT count(*) FROM inbox WHERE consumer = 'billing'}),
	$committed, 'every event is claimed in the inbox');

# Upstream replay: every event published again, every one a duplicate.
my $before = $node->safe_psql('consumer', q{SELECT sum(duplicates) FROM inbox_status});
my $replayed = $node->safe_psql('postgres',
	q{SELECT sum(outbox_replay(aggregate_id, 1)) FROM (SELECT DISTINCT aggregate_id FROM outbox) a});
ok(defined wait_published($node, 120), "producer: $replayed events replayed");
my $ok = 0;
for (1 .. 600)
{
	my $d = $node->safe_psql('consumer', q{SELECT sum(duplicates) FROM inbox_status});
	if ($d - $before >= $replayed) { $ok = 1; last; }
	sleep 0.2;
}
ok($ok, 'the replayed events are all counted as duplicates');
is($node->safe_psql('consumer', 'SELECT count(*) FROM app.applied'), $committed,
	'replay applied nothing again');

# Unsubscribe stops applying; subscribing again resumes where it was.
$node->safe_psql('consumer', "SET ROLE app; SELECT inbox_unsubscribe('billing')");
sleep 2;
$node->safe_psql('postgres', "SELECT outbox_emit('load', 'late', 'Created', '{}')");
ok(defined wait_published($node, 30), 'an event published while unsubscribed');
sleep 2;
is($node->safe_psql('consumer', q{SELECT count(*) FROM app.applied WHERE aggregate_id = 'late'}), '0',
	'nothing is applied while unsubscribed');
$node->safe_psql('consumer', qq{SET ROLE app;
	SELECT inbox_subscribe('billing', ARRAY['$topic'], 'app.apply(inbox_message)'::regprocedure)});
ok(defined wait_applied($node, $committed + 1, 60), 'subscribing again applies what was missed');
@p = consumer_verdict($node);
is_deeply(\@p, [], 'final: exactly once, in version order') or diag join("\n", @p);

ok(!$node->log_contains('outbox launcher.* exited with exit code')
	   && !$node->log_contains('cannot read pg_class'),
	'the launcher ran without failing (it reads pg_database by a heap scan)');

$node->stop;
$mk->stop;
done_testing();
