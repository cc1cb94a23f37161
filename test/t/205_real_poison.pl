# Real Kafka: poison events that the broker itself refuses, under each
# policy (block, dead_letter, skip, chosen per aggregate type through the
# poison_policy table), while a load on other aggregates goes on:
#   - too large: a 30 kB event on a topic with max.message.bytes=5000 (the
#     broker answers MESSAGE_TOO_LARGE; librdkafka only checks its own
#     message.max.bytes, 1 MB);
#   - missing topic: auto.create.topics.enable=false, the event names a
#     topic that does not exist (librdkafka fails it with
#     Local: Unknown topic once topic.metadata.propagation.max.ms is over,
#     lowered to 3 s here from 30 s to keep the test short).
# Each aggregate emits v1 (ok), v2 (poison), v3 (ok).  block: blocked at v2
# with the broker's error text, v3 waits; dead_letter: v2 goes to the
# dead-letter topic with the error in a header, v3 follows; skip: v2 is
# recorded as skipped, v3 follows.  The load's aggregates are unaffected.
#
# recover_s: from the first poison emit until the dead_letter and skip
# aggregates had all their versions settled (longest).
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use OutboxTest;
use RealKafka;
use RealTest;

my $load_topic = 'outbox.event.load';
my $small = 'real.small';
my $ok_topic = 'real.ok';
my $dlq = 'outbox.dead_letter';
my $props = $ENV{OUTBOX_FAULT_KAFKA_PROPERTIES} // 'topic.metadata.propagation.max.ms=3000';

my ($node, $rk) = outbox_setup('real_poison', kafka => 'real',
	topics => [ "$load_topic:4", "$ok_topic:2", "$dlq:2" ],
	kafka_properties => $props, max_attempts => 2, poison_policy => 'block');
$rk->topic($small, 1, configs => { 'max.message.bytes' => 5000 });
quiet_statements($node);

my %type = (block => 'blk', dead_letter => 'dl', skip => 'skp');
q1(qq{INSERT INTO poison_policy (aggregate_type, policy) VALUES ('$type{$_}', '$_')})
  for sort keys %type;

# v1 first (published), then v2 the poison; v3 only once v2 is settled
# (blocked, dead-lettered or skipped).  Emitting them together would be
# judged by the two known bugs shown at the end instead.
sub settled
{
	my ($agg, $v) = @_;
	return qq{SELECT (SELECT state <> 'pending' FROM outbox_events WHERE aggregate_id = '$agg'
		AND aggregate_version = $v) OR EXISTS (SELECT FROM aggregate_publication
		WHERE aggregate_id = '$agg' AND blocked_version = $v)};
}

sub emit_poison
{
	my ($at, $agg, $poison_topic, $payload, $ok) = @_;
	q1(qq{SELECT outbox_emit('$at', '$agg', 'V1', '{}', topic => '$ok')});
	poll_until($node, 'postgres', settled($agg, 1), 't', 60) or return undef;
	q1(qq{SELECT outbox_emit('$at', '$agg', 'V2', $payload, topic => '$poison_topic')});
	my $t = poll_until($node, 'postgres', settled($agg, 2), 't', 90);
	q1(qq{SELECT outbox_emit('$at', '$agg', 'V3', '{}', topic => '$ok')});
	return $t;
}

my $t_start = time;
my $load = start_load($node, clients => 2, jobs => 1, resilient => 1,
	events_per_tx => 5, aggregates => 500, rate => 60, max_s => 240);
sleep 0.2 while max_id($node) < 500 && time - $t_start < 30;

my $big = q{jsonb_build_object('blob', repeat('x', 30000))};
my %settle;
for my $p (sort keys %type)
{
	$settle{"big-$p"} = emit_poison($type{$p}, "big-$p", $small, $big, $small);
	$settle{"missing-$p"} = emit_poison($type{$p}, "missing-$p", "real.missing.$p", q{'{}'}, $ok_topic);
	ok(defined $settle{"big-$p"}, "$p: the too-large v2 was settled by the policy");
	ok(defined $settle{"missing-$p"}, "$p: the missing-topic v2 was settled by the policy");
}
note "seconds from emitting a poison v2 until the policy settled it: "
  . join ' ', map { sprintf "%s=%.1f", $_, $settle{$_} // -1 } sort keys %settle;

# block: both stay at v2 with the broker's / client's error text
for my $kind (qw(big missing))
{
	my $agg = "$kind-block";
	my $row = q1(qq{SELECT blocked_version || '|' || attempts || '|' || last_error
		FROM aggregate_publication WHERE aggregate_id = '$agg'});
	note "block: $agg: $row";
	like($row, $kind eq 'big' ? qr/^2\|2\|MSG_SIZE_TOO_LARGE: Broker: Message size too large$/
		: qr/^2\|2\|_UNKNOWN_TOPIC: Local: Unknown topic$/,
		"block: $agg blocked at v2 after 2 attempts with the real error");
	sleep 1;
	is(q1(qq{SELECT string_agg(aggregate_version::text, ',' ORDER BY aggregate_version)
		FROM outbox_pending WHERE aggregate_id = '$agg'}),
		'2,3', "block: $agg v3 waits behind v2");
}
like(q1(q{SELECT blocked_aggregates || ' ' || (SELECT string_agg(b->>'aggregate_id', ',' ORDER BY b->>'aggregate_id')
	FROM jsonb_array_elements(blocked) b) FROM outbox_status}),
	qr/^2 big-block,missing-block$/, 'block: both visible in outbox_status');

# dead_letter and skip: the aggregate goes on
my $recover = 0;
for my $p (qw(dead_letter skip))
{
	for my $kind (qw(big missing))
	{
		my $agg = "$kind-$p";
		ok(defined poll_until($node, 'postgres', qq{SELECT NOT EXISTS (SELECT FROM outbox_pending
			WHERE aggregate_id = '$agg')}, 't', 60), "$p: $agg settled");
		$recover = $settle{$agg} if ($settle{$agg} // 0) > $recover;
		my $disp = $p eq 'skip' ? 'skipped' : 'dead_lettered';
		is(q1(qq{SELECT string_agg(aggregate_version || ':' || state, ',' ORDER BY aggregate_version)
			FROM outbox_events WHERE aggregate_id = '$agg'}),
			"1:published,2:$disp,3:published", "$p: $agg recorded");
		like(q1(qq{SELECT last_error FROM outbox WHERE aggregate_id = '$agg' AND aggregate_version = 2}),
			$kind eq 'big' ? qr/^MSG_SIZE_TOO_LARGE: Broker: Message size too large$/
			: qr/^_UNKNOWN_TOPIC: Local: Unknown topic$/, "$p: $agg v2 keeps the real error");
	}
}

# The dead-letter topic holds both v2s, with the real error in a header.
my $d = $rk->check(topics => [$dlq], opts => ['--print', '--any-start']);
like($d->{output}, qr/key=big-dead_letter version=2/, 'dead_letter: the large event is in the dead-letter topic')
  or diag $d->{output};
like($d->{output}, qr/dead_letter_error=MSG_SIZE_TOO_LARGE/, 'dead_letter: header names MSG_SIZE_TOO_LARGE');
like($d->{output}, qr/key=missing-dead_letter version=2/, 'dead_letter: the missing-topic event too');
like($d->{output}, qr/dead_letter_original_topic=real.missing.dead_letter/, 'dead_letter: header names the missing topic');

# Other aggregates were not held up
ok(stop_load($load, 60), 'emitters stopped');
ok(defined poll_until($node, 'postgres', q{SELECT NOT EXISTS (SELECT FROM outbox_pending
	WHERE aggregate_type = 'load')}, 't', 90), 'the load was published in full');
cmp_ok(counter($node, 'delivery_errors_permanent'), '>=', 8, 'permanent errors counted');
note "fatal producer errors so far: " . counter($node, 'delivery_errors_fatal')
  . ' (enable.gapless.guarantee turns a permanent failure with later messages in flight into one)';
is(counter($node, 'events_dead_lettered'), '2', 'two events dead-lettered');
is(counter($node, 'events_skipped'), '2', 'two events skipped');

# Unblock: once the cause is gone (the topic now exists) the aggregate goes on.
$rk->topic('real.missing.block', 1);
is(q1(q{SELECT outbox_retry('missing-block')}), 't', 'outbox_retry after creating the topic');
ok(defined poll_until($node, 'postgres', q{SELECT NOT EXISTS (SELECT FROM outbox_pending
	WHERE aggregate_id = 'missing-block')}, 't', 60), 'the unblocked aggregate is published');
q1(q{SELECT outbox_skip(event_id, 'too large for real.small') FROM outbox
	WHERE aggregate_id = 'big-block' AND aggregate_version = 2});
ok(defined poll_until($node, 'postgres', q{SELECT NOT EXISTS (SELECT FROM outbox_pending
	WHERE aggregate_id = 'big-block')}, 't', 60), 'after outbox_skip the blocked aggregate goes on');

# Order: the load, and every poison aggregate's published versions
my $fatal = counter($node, 'delivery_errors_fatal');
my $r = real_verdict($rk, $node, 'poison', topics => [$load_topic],
	recover_s => $recover, where => q{aggregate_type = 'load'});
# (one topic at a time: an aggregate spread over topics has no order across them)
for my $t ($small, $ok_topic, 'real.missing.block')
{
	my $c = $rk->check(topics => [$t], opts => ['--any-start']);
	is($c->{inversions} . '/' . $c->{duplicates}, '0/0',
		"poison aggregates: no inversion, no duplicate in $t") or diag $c->{output};
}

# Two publisher bugs that only a real broker showed (fixed; 117 and 118
# test the same on the mock).
{
	# The broker judges max.message.bytes per record batch, and librdkafka
	# puts messages of one partition in one batch: a small event of another
	# aggregate produced right after a too-large one fails with it.  That
	# counts no attempt: it is sent again alone and published (it used to
	# count, and here, policy skip, 2 attempts, to be skipped).
	q1(qq{BEGIN; SELECT outbox_emit('skp', 'x-big', 'V1', $big, topic => '$small');
		SELECT outbox_emit('skp', 'x-innocent', 'V1', '{}', topic => '$small'); COMMIT;});
	poll_until($node, 'postgres', q{SELECT NOT EXISTS (SELECT FROM outbox_pending
		WHERE aggregate_id IN ('x-big', 'x-innocent'))}, 't', 60);
	# (publishing no longer writes the event's row: a published event keeps
	# the last_error of the refusal it shared, but no attempt)
	my $row = q1(q{SELECT state || '|' || attempts || coalesce('|' || last_error, '')
		FROM outbox_events WHERE aggregate_id = 'x-innocent'});
	note "x-innocent (small, same partition as a too-large event): $row";
	like($row, qr/^published\|/, 'a small event batched with a too-large one is still published');
	like($row, qr/^[^|]*\|0(\||$)/, 'its refusal with the too-large one counted no attempt');
}
{
	# v1 goes to a missing topic, v2 of the same aggregate to an existing
	# one, in one batch: v2 must wait for v1 (it used to be acknowledged
	# while v1 failed, so a consumer of real.ok saw v2 before v1 existed).
	my $violations = counter($node, 'order_violations');
	q1(qq{BEGIN; SELECT outbox_emit('blk', 'x-cross', 'V1', '{}', topic => 'real.missing.cross');
		SELECT outbox_emit('blk', 'x-cross', 'V2', '{}', topic => '$ok_topic'); COMMIT;});
	poll_until($node, 'postgres', q{SELECT blocked_version IS NOT NULL FROM aggregate_publication
		WHERE aggregate_id = 'x-cross'}, 't', 60);
	sleep 1;
	my $p = $rk->check(topics => [$ok_topic], opts => ['--print', '--any-start']);
	my $ahead = () = $p->{output} =~ /key=x-cross version=2/g;
	note "x-cross: v2 in $ok_topic $ahead time(s) while v1 is blocked; order_violations "
	  . counter($node, 'order_violations') . " (was $violations)";
	is($ahead, 0, 'v2 on another topic waits for the blocked v1');
	is(counter($node, 'order_violations'), $violations, 'the order guard saw no violation');
}

note_counters($node, $t_start);
note "worker log: $_" for grep { /outbox: / } split /\n/, slurp_file($node->logfile);

$node->stop;
$rk->stop;
done_testing();
