# Poison events under each policy, operator functions end to end, and
# retention.  Permanent Produce errors (INVALID_RECORD; not a size error,
# which is first retried alone: see 118_size_error_alone.pl) are injected
# on broker 3 only, which leads the one partition of topic "poison"; everything else is led by brokers 1 and 2.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my @cmds = ('topic_create poison 1 3', 'leader poison 0 3');
for my $t ('good', 'outbox.dead_letter')
{
	push @cmds, "topic_create $t 4 3";
	push @cmds, "leader $t $_ " . (1 + $_ % 2) for 0 .. 3;
}
my ($node, $mk) = outbox_setup('poison', brokers => 3, max_seconds => 600,
	mock_cmds => \@cmds, max_attempts => 2, poison_policy => 'block');

sub emit
{
	my ($agg, $topic, $n) = @_;
	q1("SELECT count(outbox_emit('order', '$agg', 'E', jsonb_build_object('i', i), topic => '$topic'))
		  FROM generate_series(1, $n) i");
}

sub inject_permanent { $mk->cmd('broker_errors 3 0 ' . join(' ', ('87:0') x shift)) }

# --- block (the default) -------------------------------------------------
inject_permanent(2);
emit('poison-1', 'poison', 3);
emit('good-1', 'good', 5);
ok(poll_until($node, 'postgres', q{SELECT blocked_version = 1 FROM aggregate_publication WHERE aggregate_id = 'poison-1'}, 't', 120),
	'block: the aggregate is blocked at version 1 after max_attempts');
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending WHERE aggregate_id = 'good-1'}, 't', 120),
	'block: other aggregates go on');
is(q1(q{SELECT attempts || ' ' || (last_error LIKE 'INVALID_RECORD%') FROM outbox
		  WHERE aggregate_id = 'poison-1' AND aggregate_version = 1}),
	'2 true', 'block: attempts and error recorded on the event');
is(q1(q{SELECT count(*) FROM outbox WHERE aggregate_id = 'poison-1' AND id NOT IN (SELECT id FROM outbox_pending)}),
	'0', 'block: later versions wait behind the poison event');
is(q1(q{SELECT blocked_aggregates || ' ' || (blocked->0->>'aggregate_id') || ' ' || (blocked->0->>'version')
		  FROM outbox_status}),
	'1 poison-1 1', 'block: visible in outbox_status');
is(q1(q{SELECT state || ' ' || gap || ' ' || attempts FROM outbox_aggregate_status WHERE aggregate_id = 'poison-1'}),
	'blocked 3 2', 'block: visible in outbox_aggregate_status');
cmp_ok(counter($node, 'delivery_errors_permanent'), '>=', 2, 'block: permanent errors counted');
cmp_ok(counter($node, 'order_guard_stops'), '>=', 2, 'block: order protection fired');
sleep 2;
is(q1(q{SELECT count(*) FROM outbox WHERE aggregate_id = 'poison-1' AND id NOT IN (SELECT id FROM outbox_pending)}),
	'0', 'block: stays blocked without an operator');

# The operator retries once the cause is gone: everything goes out in order.
cmp_ok(counter($node, 'polls'), '>', 0, 'fallback polls are counted (poll interval 500 ms)');
is(q1(q{SELECT outbox_retry('poison-1')}), 't', 'outbox_retry unblocks');
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending WHERE aggregate_id = 'poison-1'}, 't', 120),
	'after retry the aggregate is published');
my $r = $mk->check(topics => ['poison'], expect => { 'poison-1' => 3 });
is($r->{exit}, 0, 'block + retry: versions 1..3 in order') or diag $r->{output};
ok($node->log_contains('aggregate "poison-1" blocked at version 1 after 2 attempts'),
	'the block is logged with its cause');
ok($node->log_contains('retried aggregate "poison-1"'), 'the retry is logged');

# --- dead_letter -----------------------------------------------------------
$node->append_conf('postgresql.conf', "outbox.poison_policy = 'dead_letter'\n");
$node->reload;
# Once a new session sees it, the postmaster has signalled the worker too,
# which reloads before its next batch.
ok(poll_until($node, 'postgres', q{SELECT current_setting('outbox.poison_policy') = 'dead_letter'}, 't', 120),
	'dead_letter: the setting is reloaded');
inject_permanent(2);
emit('poison-2', 'poison', 3);
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending WHERE aggregate_id = 'poison-2'}, 't', 120),
	'dead_letter: the aggregate continues');
is(q1(q{SELECT string_agg(aggregate_version || ':' || state, ',' ORDER BY aggregate_version)
		  FROM outbox_events WHERE aggregate_id = 'poison-2'}),
	'1:dead_lettered,2:published,3:published', 'dead_letter: the row records it');
$r = $mk->check(topics => ['outbox.dead_letter'], opts => ['--print', '--any-start']);
like($r->{output}, qr/key=poison-2 version=1/, 'dead_letter: the event is in the dead-letter topic');
like($r->{output}, qr/dead_letter_original_topic=poison/, 'dead_letter: header names the original topic');
like($r->{output}, qr/dead_letter_error=INVALID_RECORD/, 'dead_letter: header names the error');
like($r->{output}, qr/dead_letter_attempts=2/, 'dead_letter: header counts the attempts');
is(counter($node, 'events_dead_lettered'), '1', 'dead_letter: counted');
is(q1('SELECT dead_lettered_events FROM outbox_status'), '1', 'dead_letter: in outbox_status');

# An operator can dead-letter a pending event explicitly.
q1(q{SELECT outbox_pause()});
emit('poison-3', 'poison', 2);
my $ev = q1(q{SELECT event_id FROM outbox WHERE aggregate_id = 'poison-3' AND aggregate_version = 1});
is(q1("SELECT outbox_dead_letter('$ev')"), 't', 'outbox_dead_letter queues a pending event');
sleep 1;
is(q1(q{SELECT count(*) FROM outbox WHERE aggregate_id = 'poison-3' AND id NOT IN (SELECT id FROM outbox_pending)}),
	'0', 'pause: nothing is published while publishing is paused');
q1(q{SELECT outbox_resume()});
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending WHERE aggregate_id = 'poison-3'}, 't', 120),
	'resume: publishing continues');
is(q1(q{SELECT string_agg(state, ',' ORDER BY aggregate_version) FROM outbox_events WHERE aggregate_id = 'poison-3'}),
	'dead_lettered,published', 'the operator-dead-lettered event went to the dead-letter topic');

# --- skip, chosen per aggregate type ---------------------------------------
q1(q{INSERT INTO poison_policy (aggregate_type, policy) VALUES ('skippy', 'skip')});
inject_permanent(2);
q1(q{SELECT count(outbox_emit('skippy', 'poison-4', 'E', jsonb_build_object('i', i), topic => 'poison'))
	   FROM generate_series(1, 3) i});
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending WHERE aggregate_id = 'poison-4'}, 't', 120),
	'skip: the aggregate continues');
is(q1(q{SELECT string_agg(aggregate_version || ':' || state, ',' ORDER BY aggregate_version)
		  FROM outbox_events WHERE aggregate_id = 'poison-4'}),
	'1:skipped,2:published,3:published', 'skip: the row records it (policy from poison_policy)');
is(counter($node, 'events_skipped'), '1', 'skip: counted');
$r = $mk->check(topics => ['poison'], opts => ['--any-start', '--verbose']);
is($r->{inversions}, 0, 'skip/dead_letter: no inversion in the main topic') or diag $r->{output};

# --- paused aggregate, replay ----------------------------------------------
q1(q{SELECT outbox_pause('good-1')});
emit('good-1', 'good', 2);
sleep 1;
is(q1(q{SELECT count(*) FROM outbox_pending WHERE aggregate_id = 'good-1'}),
	'2', 'a paused aggregate waits');
q1(q{SELECT outbox_resume('good-1')});
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending WHERE aggregate_id = 'good-1'}, 't', 120),
	'a resumed aggregate is published');
is(q1(q{SELECT outbox_replay('good-1', 3)}), '5', 'replay queues versions 3..7 again');
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending WHERE aggregate_id = 'good-1'}, 't', 120),
	'replayed events are published');
$r = $mk->check(topics => ['good'], expect => { 'good-1' => 7 });
is($r->{exit}, 0, 'replay: consumers see 1..7 once after dropping re-deliveries') or diag $r->{output};
cmp_ok($r->{duplicates}, '>=', 5, 'replay: the replayed events are re-deliveries');

# --- retention ---------------------------------------------------------------
$node->append_conf('postgresql.conf', "outbox.retention = 0\noutbox.inbox_retention = 0\n");
$node->reload;
q1(q{SELECT inbox_claim('c', 'e1'), inbox_claim('c', 'e2')});
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox WHERE aggregate_id = 'good-1'}, 't', 120),
	'retention deletes published rows');
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM inbox}, 't', 120), 'inbox retention deletes old entries');
cmp_ok(counter($node, 'retention_deleted'), '>', 0, 'retention counted');
cmp_ok(counter($node, 'inbox_retention_deleted'), '>=', 2, 'inbox retention counted');
is(q1(q{SELECT aggregate_version FROM outbox_emit('order', 'good-1', 'E', '{}', topic => 'good')}),
	'8', 'versions continue after retention deleted every row of the aggregate');
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending}, 't', 120), 'and it is published');
$r = $mk->check(topics => ['good'], expect => { 'good-1' => 8 });
is($r->{exit}, 0, 'retention: order checker clean') or diag $r->{output};

$node->stop;
$mk->stop;
done_testing();
