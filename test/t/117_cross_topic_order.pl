# Per aggregate, a later version must not overtake an earlier one on
# another topic.  Idempotence orders messages within one partition only, so
# a batch sends an aggregate's events to one destination; the first event
# bound elsewhere waits for a later batch, which starts only once the
# earlier events are settled.
#
# v1 of "x" goes to cross.a (its single partition led by broker 3, where a
# permanent error, INVALID_RECORD, is injected and answered after 300 ms), v2 to cross.b (led by
# broker 1), emitted in one transaction.  With outbox.max_attempts = 1 and
# policy block, v1 fails once and blocks the aggregate: v2 must never have
# reached cross.b.  (Before the fix, v2 was produced in the same batch and
# acknowledged while v1 failed.)  After outbox_retry() both are published.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('cross', brokers => 3,
	mock_cmds => [ 'topic_create cross.a 1 3',
		'leader cross.a 0 3',
		'topic_create cross.b 1 3',
		'leader cross.b 0 1' ],
	max_attempts => 1, poison_policy => 'block');

# How many times version $v of aggregate $agg is in topic $topic.
sub copies
{
	my ($topic, $agg, $v) = @_;
	my $r = $mk->check(topics => [$topic], opts => ['--print', '--any-start']);
	return scalar(() = $r->{output} =~ /key=\Q$agg\E version=$v\b/g);
}

# Warm up: both topics known to the producer.
q1(q{SELECT outbox_emit('w', 'warm', 'E', '{}', topic => 'cross.a'),
	outbox_emit('w', 'warm', 'E', '{}', topic => 'cross.b')});
ok(defined wait_published($node, 30), 'warm-up published');
is(copies('cross.b', 'warm', 2), 1, 'the checker sees what was published');

# Same destination: both versions in one batch (the rule defers only on a
# change of destination).
q1(q{BEGIN; SELECT outbox_emit('s', 'same', 'E', '{}', topic => 'cross.b');
	SELECT outbox_emit('s', 'same', 'E', '{}', topic => 'cross.b'); COMMIT;});
ok(defined wait_published($node, 30), 'same-topic versions published');

my $violations = counter($node, 'order_violations');
$mk->cmd('broker_errors 3 0 87:300');
q1(q{BEGIN; SELECT outbox_emit('x', 'x', 'V1', '{}', topic => 'cross.a');
	SELECT outbox_emit('x', 'x', 'V2', '{}', topic => 'cross.b'); COMMIT;});
ok(poll_until($node, 'postgres', q{SELECT blocked_version = 1 FROM aggregate_publication WHERE aggregate_id = 'x'}, 't', 30),
	'v1 failed and blocked the aggregate');
sleep 1;
is(copies('cross.b', 'x', 2), 0, 'v2 on another topic did not reach Kafka before v1');
is(q1(q{SELECT string_agg(aggregate_version || ':' || attempts || ':' || (state = 'pending'), ' '
	ORDER BY aggregate_version) FROM outbox_events WHERE aggregate_id = 'x'}),
	'1:1:true 2:0:true', 'v1 counted its attempt; v2 waits, no attempt counted');
is(counter($node, 'order_violations'), $violations, 'the order guard saw no violation');

is(q1(q{SELECT outbox_retry('x')}), 't', 'outbox_retry unblocks the aggregate');
ok(poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending WHERE aggregate_id = 'x'}, 't', 30),
	'after the retry both versions are published');
is(copies('cross.a', 'x', 1) . ' ' . copies('cross.b', 'x', 2), '1 1',
	'v1 in cross.a, then v2 in cross.b, once each');
is(q1(q{SELECT last_published_version FROM aggregate_publication WHERE aggregate_id = 'x'}),
	'2', 'progress recorded');

$node->stop;
$mk->stop;
done_testing();
