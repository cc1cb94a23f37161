# Retention locks only the rows it may delete: the young rows of its window
# (all of them, under the default retention of 7 days) keep no lock of it,
# which would be a WAL record and a dirty page per row every second.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('young', max_seconds => 120, retention => '3600');

q1(q{SELECT outbox_emit('young', 'old-' || g % 5, 'E', '{}') FROM generate_series(1, 20) g});
q1(q{SELECT outbox_emit('young', 'new-' || g % 5, 'E', '{}') FROM generate_series(1, 30) g});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox_pending}),
	'all published');
is(q1(q{SELECT count(*) FROM outbox WHERE xmax::text <> '0'}), '0', 'no row locked yet');

# The first 20 become old (the UPDATE locks only them); the next run of
# retention deletes them, its window reaching the young rows after them.
my $deleted = counter($node, 'retention_deleted');
q1(q{UPDATE outbox SET created_at = now() - interval '2 hours' WHERE aggregate_id LIKE 'old-%'});
ok($node->poll_query_until('postgres',
	"SELECT value >= $deleted + 20 FROM outbox_counters() WHERE name = 'retention_deleted'"),
	'retention deleted the old rows');
is(q1(q{SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'old-%'}), '0', 'they are gone');
is(q1(q{SELECT count(*) FROM outbox WHERE aggregate_id LIKE 'new-%'}), '30', 'the young rows stay');
is(q1(q{SELECT count(*) FROM outbox WHERE xmax::text <> '0'}), '0',
	'and carry no lock of retention');

$node->stop;
$mk->stop;
done_testing();
