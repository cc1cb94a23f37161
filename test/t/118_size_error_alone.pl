# A refusal for size is judged per request: Kafka checks max.message.bytes
# per record batch, and librdkafka puts the messages of one partition in one
# batch.  So a small event produced right after a too-large one (another
# aggregate, same partition) is refused with it, although Kafka would take
# it alone.  Such a refusal counts no attempt; the event is sent again alone
# (nothing else in flight), and only a refusal then counts.
#
# Topic size.t has one partition, led by broker 3, where MSG_SIZE_TOO_LARGE
# is injected (the mock enforces no size: injected errors fail a whole
# request).  linger.ms = 200 makes the two events one request.  With
# outbox.max_attempts = 1 and policy skip, an event whose refusal counted is
# skipped at once.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('size', brokers => 3,
	mock_cmds => [ 'topic_create size.t 1 3',
		'leader size.t 0 3' ],
	max_attempts => 1, poison_policy => 'skip',
	kafka_properties => 'linger.ms=200');

# Emit a big and a small event of two aggregates in one transaction.
sub emit_pair
{
	my ($big, $small) = @_;
	q1(qq{BEGIN;
		SELECT outbox_emit('s', '$big', 'E', jsonb_build_object('pad', repeat('x', 100000)), topic => 'size.t');
		SELECT outbox_emit('s', '$small', 'E', '{}', topic => 'size.t');
		COMMIT;});
}

sub outcome
{
	my ($agg) = @_;
	# A published event keeps the error noted on the way (nothing is
	# written per event once published): its attempts say it was no failure.
	return q1(qq{SELECT state || ' ' || CASE WHEN state = 'published' THEN attempts::text
		ELSE coalesce(last_error, '-') END FROM outbox_events WHERE aggregate_id = '$agg'});
}

q1(q{SELECT outbox_emit('s', 'warm', 'E', '{}', topic => 'size.t')});
ok(defined wait_published($node, 30), 'warm-up published');

# One refusal of the shared request: both are retried alone and published.
$mk->cmd('broker_errors 3 0 10:0');
emit_pair('a-big', 'a-small');
ok(defined wait_published($node, 30), 'both settled');
is(outcome('a-small'), 'published 0', 'the small event is published, not poisoned');
is(outcome('a-big'), 'published 0', 'the big one too (alone, the mock takes it)');
ok($node->log_contains(qr/aggregate "a-small" version 1\) was refused for size with other messages; it is sent alone next, no attempt counted/),
	'the shared refusal is logged without an attempt');
is(q1(q{SELECT string_agg(aggregate_id || ':' || attempts, ' ' ORDER BY id) FROM outbox
	WHERE aggregate_id LIKE 'a-%'}), 'a-big:0 a-small:0',
	'no attempt counted for either (publishing writes no attempt)');

# Refused again when alone: that counts (and here poisons the big one only).
$mk->cmd('broker_errors 3 0 10:0 10:0');
emit_pair('b-big', 'b-small');
ok(defined wait_published($node, 30), 'both settled');
like(outcome('b-big'), qr/^skipped MSG_SIZE_TOO_LARGE: /, 'the big event, refused alone, is skipped');
is(outcome('b-small'), 'published 0', 'the small event is published');
is(counter($node, 'events_skipped'), '1', 'one event skipped in all');

my $r = $mk->check(topics => ['size.t'],
	expect => { warm => 1, 'a-big' => 1, 'a-small' => 1, 'b-small' => 1 });
is($r->{exit}, 0, 'in Kafka: each published event once') or diag $r->{output};

$node->stop;
$mk->stop;
done_testing();
