# Retention never waits for a row lock: it deletes settled rows FOR UPDATE
# SKIP LOCKED, so it cannot deadlock with outbox_replay(), which updates an
# aggregate's rows in its own order.  Here a session holds a lock on an old
# published row (as a replay in progress would): retention deletes the other
# old rows, and publishing (worker 0 also runs retention) goes on.  (Before,
# retention waited for the lock, and worker 0 with it.)
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('retention');

q1(q{SELECT outbox_emit('ret', 'a', 'E', jsonb_build_object('n', g)) FROM generate_series(1, 5) g});
ok(defined wait_published($node, 30), 'published');

my $s = $node->background_psql('postgres');
$s->query_safe('BEGIN');
$s->query_safe(q{SELECT id FROM outbox WHERE aggregate_version = 3 FOR UPDATE});

$node->append_conf('postgresql.conf', "outbox.retention = 0\n");
$node->reload;
ok($node->poll_query_until('postgres',
	q{SELECT string_agg(aggregate_version::text, ',') FROM outbox}, '3'),
	'retention deleted every settled row but the locked one');
q1(q{SELECT outbox_emit('ret', 'b', 'E', '{}')});
ok($node->poll_query_until('postgres',
	q{SELECT count(*) FROM outbox_pending}, '0'),
	'publishing goes on while a settled row is locked');

$s->query_safe('COMMIT');
$s->quit;
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM outbox}, '0'),
	'the row is deleted once its lock is released');

$node->stop;
$mk->stop;
done_testing();
