# Fault: a permanent Produce error (MSG_SIZE_TOO_LARGE = 10, injected with
# "errors 0 10") on one aggregate.  The publisher records the failure on
# the event (outbox.attempts, last_error) and on the aggregate
# (aggregate_publication.attempts, last_error, next_attempt_at), backs the
# aggregate off and retries it; nothing after the failed version is
# published (no reordering); with outbox.max_attempts = 2 the second
# failure blocks the aggregate (blocked_version) while other aggregates keep
# publishing.  After outbox_retry() the aggregate is published in order.
# (test/t/002_poison.pl covers the policies and operator functions; this
# file is the fault-test view: counts, order, others unaffected.)
#
# Emitters keep loading other aggregates (topic outbox.event.load, led by
# brokers 1 and 2) throughout.  The failing aggregate has a topic of its
# own whose single partition broker 3 leads, and the errors are injected on
# broker 3 only (broker_errors 3 0 10:0 10:2000: two attempts fail, the
# second answer comes 2 s late).
#
# The failing version is the aggregate's only pending event while errors
# are armed; later versions come once it is blocked.  The mock cannot model
# a failure with later versions of the same partition in the same batch:
# librdkafka 2.0.2 may already have built the next ProduceRequest (v3..)
# when v2's error arrives and sends it right after raising the gap-less
# fatal error -- even with max.in.flight.requests.per.connection=1 -- and
# the mock, which checks no sequence numbers, appends it (a real broker
# refuses it: OUT_OF_ORDER_SEQUENCE_NUMBER).  The worker then logs
# "version 3 of aggregate ... was acknowledged although version 2 failed"
# and the checker sees a gap and an inversion.
#
# recover_s: from unblocking until the blocked aggregate was published.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $topic = 'perm.poison';
my $load_topic = 'outbox.event.load';

my %conf = (fault_conf(), max_attempts => 2, poison_policy => 'block');
my ($node, $mk) = outbox_setup('perm', brokers => 3,
	mock_cmds => [ "topic_create $topic 1 3",
		"leader $topic 0 3",
		"topic_create $load_topic 4 3",
		(map { "leader $load_topic $_ " . (1 + $_ % 2) } 0 .. 3) ],
	%conf);
note "kafka_properties: " . ($conf{kafka_properties} // '(default)');
quiet_statements($node);

sub emit
{
	my ($agg, $n) = @_;
	q1(qq{SELECT count(*) FROM (SELECT outbox_emit('perm', '$agg', 'Changed',
		jsonb_build_object('i', i), topic => '$topic') FROM generate_series(1, $n) i) s});
}

# Warm up: the topic exists, the producer knows its partitions.
emit('poison', 1);
emit("other-$_", 1) for 1 .. 5;
ok(defined wait_published($node, 120), 'warm-up published');

my $t_start = time;
my $load = start_load($node, clients => 2, transactions => 1500,
	events_per_tx => 5, aggregates => 200, rate => 150);
sleep 0.2 while max_id($node) < 1000 && time - $t_start < 120;

# First failure: v2 of "poison", alone, refused as too large.  (Later
# versions are emitted only once it is blocked: see the header.)  Both
# failures are armed at once; the second answer comes 2 s late, so the
# state between the two attempts (1 s backoff + 2 s) can be looked at
# without racing the retry.
$mk->cmd('broker_errors 3 0 10:0 10:2000');
emit('poison', 1);
my ($row, $agg);
my $t_first = time;
while (time - $t_first < 60)
{
	# One snapshot of the event and its aggregate, once the failure is recorded.
	my $state = q1(q{SELECT o.attempts, o.last_error, o.id IN (SELECT id FROM outbox_pending),
		'|', a.attempts, a.last_error IS NOT NULL,
		a.next_attempt_at >= a.updated_at + interval '900 ms', a.blocked_version IS NULL
		FROM outbox o JOIN aggregate_publication a USING (aggregate_id)
		WHERE o.aggregate_id = 'poison' AND o.aggregate_version = 2 AND o.attempts >= 1});
	if ($state ne '')
	{
		($row, $agg) = split /\|\|\|/, $state;
		last;
	}
	sleep 0.05;
}
ok(defined $row, 'first failure recorded on the event');
$row //= '';
$agg //= '';
note "event poison/2 after the first failure: $row";
like($row, qr/^1\|MSG_SIZE_TOO_LARGE: .*\|t$/, 'event: attempts = 1, last_error names MSG_SIZE_TOO_LARGE, still pending');
is($agg, '1|t|t|t', 'aggregate: attempts = 1, error recorded, backing off, not blocked');
is(q1(q{SELECT count(*) FROM outbox WHERE aggregate_id = 'poison' AND id NOT IN (SELECT id FROM outbox_pending)}),
	'1', 'nothing after the failed version was published');

# Second failure: max_attempts = 2 blocks the aggregate at version 2.
my $t_block = poll_until($node, 'postgres', q{SELECT blocked_version IS NOT NULL FROM aggregate_publication
	WHERE aggregate_id = 'poison'}, 't', 120);
ok(defined $t_block, 'the second failure blocked the aggregate');
note sprintf "blocked %.2f s after the second error was armed", $t_block // -1;
is(q1(q{SELECT blocked_version, attempts, last_error LIKE 'MSG_SIZE_TOO_LARGE%', blocked_at IS NOT NULL
	FROM aggregate_publication WHERE aggregate_id = 'poison'}),
	'2|2|t|t', 'aggregate_publication: blocked_version = 2 after 2 attempts');
ok($node->log_contains(qr/outbox: aggregate "poison" blocked at version 2 after 2 attempts/),
	'the block is logged');
cmp_ok(counter($node, 'delivery_errors_permanent'), '>=', 2, 'two permanent delivery errors counted');
cmp_ok(counter($node, 'retries'), '>=', 1, 'the failed event was retried');

# Other aggregates keep publishing (some on the blocked aggregate's own
# partition); the blocked one stays put, later versions wait behind v2.
emit('poison', 2);
emit("other-$_", 20) for 1 .. 5;
emit('poison', 2);
my $backlog = max_id($node);
ok(defined poll_until($node, 'postgres', qq{SELECT count(*) = 0 FROM outbox_pending
	WHERE aggregate_id <> 'poison' AND id <= $backlog}, 't', 120),
	'other aggregates published while "poison" is blocked');
sleep 1;
is(q1(q{SELECT string_agg(aggregate_version || ':' || attempts || ':' || (last_error IS NOT NULL), ' '
	ORDER BY aggregate_version) FROM outbox_pending WHERE aggregate_id = 'poison'}),
	'2:2:true 3:0:false 4:0:false 5:0:false 6:0:false',
	'only the failing event counts attempts; later versions wait');
ok(stop_load($load, 300), 'emitters finished without errors');
ok(defined poll_until($node, 'postgres', q{SELECT count(*) = 0 FROM outbox_pending WHERE aggregate_type = 'load'}, 't', 120),
	'the whole load was published while "poison" is blocked');
cmp_ok(q1(q{SELECT count(*) FROM outbox WHERE aggregate_type = 'load' AND id NOT IN (SELECT id FROM outbox_pending)}),
	'>', 5000, 'the load kept being published throughout');
is(q1(q{SELECT count(*) FROM outbox_pending WHERE aggregate_id = 'poison'}),
	'5', 'the blocked aggregate is not published (v2..v6 pending)');
my $r = $mk->check(topics => [$topic],
	expect => { poison => 1, map { ("other-$_" => 21) } 1 .. 5 });
is($r->{exit}, 0, 'in Kafka: poison v1 only, the others complete, in order') or diag $r->{output};
is($r->{inversions}, 0, 'no inversion while blocked');

# The operator unblocks it (the injected errors are used up: the cause is
# gone).  outbox_retry() also resets the events' attempts.
my $t_unblock = time;
is(q1(q{SELECT outbox_retry('poison')}), 't', 'outbox_retry unblocks the aggregate');
my $recover = wait_published($node, 120);
ok(defined $recover, 'unblocked: the aggregate is published');
$recover = time - $t_unblock if defined $recover;
is(q1(q{SELECT attempts, state FROM outbox_events
	WHERE aggregate_id = 'poison' AND aggregate_version = 2}),
	'0|published', 'published event: no failed attempt since the retry');
is(q1(q{SELECT attempts, last_error IS NULL, catch_up FROM aggregate_publication
	WHERE aggregate_id = 'poison'}),
	'0|t|f', 'the aggregate: attempts and error cleared, back on the stream');
ok($node->log_contains(qr/outbox: \S+ retried aggregate "poison" \(was blocked at version 2\)/),
	'the retry is logged');
db_versions_contiguous($node, 'permanent error');
$r = verdict($mk, $node, 'permanent_error', topics => [$topic, $load_topic],
	recover_s => $recover);
note sprintf "counters: %s",
  $node->safe_psql('postgres',
	q{SELECT string_agg(name || '=' || value, ' ') FROM outbox_counters()
	   WHERE value <> 0});
note "worker log: $_" for grep { /outbox:|%[0-3]\|/ } split /\n/, slurp_file($node->logfile);

$node->stop;
$mk->stop;
done_testing();
