# Retention walks the outbox from where it stopped: pending events older
# than everything else (a paused aggregate here, many more of them than
# outbox.retention_batch) neither stop it nor are deleted, and the settled
# events after them are deleted.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('walk', max_seconds => 120,
	retention => '0', retention_batch => '10');

# The oldest 50 events belong to an aggregate paused before any went out.
q1(q{SELECT outbox_pause()});
q1(q{SELECT outbox_emit('walk', 'stuck', 'E', jsonb_build_object('g', g)) FROM generate_series(1, 50) g});
q1(q{SELECT outbox_pause('stuck')});
q1(q{SELECT outbox_resume()});
q1(q{SELECT outbox_emit('walk', 'free-' || g % 20, 'E', jsonb_build_object('g', g))
	   FROM generate_series(1, 200) g});

ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 0 FROM outbox WHERE aggregate_id <> 'stuck'}),
	'retention deleted every published event behind 50 pending ones (batch 10)');
is(q1(q{SELECT count(*) FROM outbox_pending WHERE aggregate_id = 'stuck'}), '50',
	'the pending events stay');
cmp_ok(counter($node, 'retention_deleted'), '>=', 200, 'retention counted');

# Once published they go too, and the versions continue.
q1(q{SELECT outbox_resume('stuck')});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox}),
	'after the resume they are published and deleted');
my $r = $mk->check(topics => ['outbox.event.walk'],
	expect => { stuck => 50, map { ("free-$_" => 10) } 0 .. 19 });
is($r->{exit}, 0, 'in Kafka: every event, in order') or diag $r->{output};
is(q1(q{SELECT (outbox_emit('walk', 'stuck', 'E', '{}')).aggregate_version}), '51',
	'versions continue after retention deleted every row of the aggregate');

$node->stop;
$mk->stop;
done_testing();
