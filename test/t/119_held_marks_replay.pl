# Held marks (what Kafka acknowledged while marking fails) must not undo an
# operator's action taken meanwhile.  Marking fails (the publisher role lost
# INSERT on aggregate_publication); the operator skips version 3 of "r" and
# replays "r" from version 3, which makes it pending again.  Once marking
# works, the held marks of "r" are dropped (a row of it changed since it was
# read) and "r" is sent again in order, so the replay happens; "s",
# untouched, is marked from its held marks and not sent again.  (Before,
# the held mark set v3 published again: the replay was lost.)
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('held');

worker_role($node);

q1('REVOKE INSERT ON aggregate_publication FROM outbox_worker');
q1(q{SELECT outbox_emit('held', a, 'E', jsonb_build_object('n', g))
	FROM generate_series(1, 3) g, (VALUES ('r'), ('s')) v(a) ORDER BY g, a});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM outbox_status, jsonb_array_elements(workers) w
	 WHERE w->>'problem' LIKE '%recording the progress of 2 aggregates failed%'}),
	'settling fails, the progress of 2 aggregates held');

is(q1(q{SELECT outbox_skip(event_id, 'test') FROM outbox WHERE aggregate_id = 'r' AND aggregate_version = 3}),
	't', 'the operator skips r v3 meanwhile');
is(q1(q{SELECT outbox_replay('r', 3)}), '1', 'and replays r from v3: pending again');

q1('GRANT INSERT ON aggregate_publication TO outbox_worker');
ok(defined wait_published($node, 60), 'all settled once the grant is back');
ok($node->log_contains(qr/recorded the progress of 1 of 2 held aggregates after settling had failed/),
	'only the untouched aggregate was marked from the held marks');
is(q1(q{SELECT string_agg(aggregate_id || aggregate_version || ':' || state, ' '
	ORDER BY aggregate_id, aggregate_version) FROM outbox_events}),
	'r1:published r2:published r3:published s1:published s2:published s3:published',
	'every event published');
is(q1(q{SELECT string_agg(aggregate_id || ':' || last_published_version, ' ' ORDER BY aggregate_id)
	FROM aggregate_publication}), 'r:3 s:3', 'progress recorded');

my $p = $mk->check(topics => ['outbox.event.held'], opts => ['--print']);
my %n;
$n{$1}++ while $p->{output} =~ /key=(\w+) version=3\b/g;
is(($n{r} // 0) . ' ' . ($n{s} // 0), '2 1',
	'in Kafka: r v3 again after the replay, s v3 once');
my $r = $mk->check(topics => ['outbox.event.held'], expect => { r => 3, s => 3 });
is($r->{inversions}, 0, 'no inversion (the replay re-sends from r v1: duplicates only)')
  or diag $r->{output};

$node->stop;
$mk->stop;
done_testing();
