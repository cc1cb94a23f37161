# A slow handler, on the mock: with max.poll.interval.ms at 4 s, 300
# messages of 50 ms each (15 s of handlers, fetched together) are applied in
# transactions bounded by outbox.inbox_batch_time, with a poll between
# them, so the worker stays in its group (no rebalance, librdkafka never
# reports the interval exceeded); before, the whole fetch was one
# transaction and the worker left its group during it.  The setting asks
# for 10 s: only a third of max.poll.interval.ms is used.  Then one handler
# call longer than max.poll.interval.ms: the worker leaves its group (that
# cannot be helped), its transaction still commits, the partitions go on
# from the stored offsets, and nothing is applied twice.  Then slow
# handlers with a failing one among them.  Every event is applied exactly
# once, per aggregate in version order.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'outbox.event.slow';
my ($node, $mk) = inbox_setup('inbox_slow',
	topics => ["$topic:2", 'outbox.event.unused:1'], max_seconds => 600,
	inbox_batch_time => '10s',
	inbox_kafka_properties =>
	  'session.timeout.ms=3000;heartbeat.interval.ms=500;max.poll.interval.ms=4000');

my ($rc, $out, $err) = $node->psql('consumer', q{ALTER SYSTEM SET outbox.inbox_batch_time = 0});
like($err, qr/0 ms is outside the valid range for parameter "outbox.inbox_batch_time"/,
	'outbox.inbox_batch_time is checked when set');

# The handler is made slow before the consumer reads the topic: it is
# subscribed to another topic first, then to this one.
setup_consumer($node, 'billing', 'outbox.event.unused');
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false, delay = 0.05');

# 1. 300 events, all in Kafka before the consumer joins.
$node->safe_psql('postgres', qq{SELECT outbox_emit('slow', 's-' || (i % 10), 'Changed',
	jsonb_build_object('n', i), topic => '$topic') FROM generate_series(1, 300) i});
ok(defined wait_published($node, 60), 'producer: 300 events published');
my $batches = inbox_counter($node, 'batches');
$node->safe_psql('consumer', qq{SET ROLE app;
	SELECT inbox_subscribe('billing', ARRAY['$topic'], 'app.apply(inbox_message)'::regprocedure)});
ok(defined wait_applied($node, 1, 60), 'the consumer joined and applies');
ok($node->log_contains('consumer "billing": outbox.inbox_batch_time cut to 1333 ms'),
	'the 10 s asked for are cut to a third of max.poll.interval.ms, logged');
my $rebalances = inbox_counter($node, 'rebalances');
my $t0 = time;
ok(defined wait_applied($node, 300, 180), 'all 300 applied')
  or diag $node->safe_psql('consumer', 'SELECT * FROM inbox_status');
my $took = time - $t0;
is(inbox_counter($node, 'rebalances') - $rebalances, 0,
	'no rebalance while the slow handler applies: the worker stayed in its group');
ok(!$node->log_contains('Application maximum poll interval'),
	'librdkafka never reports max.poll.interval.ms exceeded');
my $tx = inbox_counter($node, 'batches') - $batches;
cmp_ok($tx, '>=', 5, "the 15 s of handlers took several transactions ($tx)");
note sprintf 'FIGURES inbox_slow phase=many events=300 handler_ms=50 applied_s=%.1f transactions=%d',
  $took, $tx;
my @p = consumer_verdict($node);
is_deeply(\@p, [], 'exactly once, in version order') or diag join("\n", @p);

# 2. One handler call of 6 s, above max.poll.interval.ms, then 20 quick
# ones: the worker is put out of its group during the call; it still
# commits, joins again and goes on from the stored offsets.
$node->safe_psql('consumer', 'UPDATE app.knobs SET delay = 6');
$node->safe_psql('postgres', qq{SELECT outbox_emit('slow', 'one', 'Changed', '{}', topic => '$topic')});
ok(defined wait_published($node, 60), 'producer: the slow event published');
ok(defined wait_applied($node, 301, 60), 'the 6 s handler call committed');
$node->safe_psql('consumer', 'UPDATE app.knobs SET delay = 0');
$node->safe_psql('postgres', qq{SELECT outbox_emit('slow', 'one', 'Changed', jsonb_build_object('n', i),
	topic => '$topic') FROM generate_series(1, 20) i});
ok(defined wait_published($node, 60), 'producer: 20 more published');
ok(defined wait_applied($node, 321, 120), 'the 20 after it applied');
ok($node->poll_query_until('consumer',
		"SELECT value > $rebalances FROM outbox_counters() WHERE name = 'inbox_rebalances'"),
	'the handler call longer than max.poll.interval.ms cost a rebalance');
sleep 1;
is($node->safe_psql('consumer', 'SELECT count(*) FROM app.applied'), '321',
	'nothing applied twice after the rebalance');
@p = consumer_verdict($node);
is_deeply(\@p, [], 'after the long call: exactly once, in version order') or diag join("\n", @p);

# 3. Slow handlers and a failing one among them: the fast path fails, the
# careful one applies up to the failure, the failing message's partition
# stops (its messages held in memory are dropped, and fetched again when it
# resumes), the other partition goes on; once the handler accepts it the
# partition resumes from the stored offset.
$node->safe_psql('consumer', 'UPDATE app.knobs SET delay = 0.02, fail = true');
my $errors = $node->safe_psql('consumer', 'SELECT sum(errors) FROM inbox_status');
my $fallbacks = inbox_counter($node, 'batch_fallbacks');
$node->safe_psql('postgres', qq{SELECT outbox_emit('slow', 'p-' || (i % 5), 'Changed',
	jsonb_build_object('n', i, 'fail', i = 60), topic => '$topic') FROM generate_series(1, 150) i});
ok(defined wait_published($node, 60), 'producer: 150 more published, one refused by the handler');
ok($node->poll_query_until('consumer', "SELECT sum(errors) > $errors FROM inbox_status"),
	'the handler refused it');
cmp_ok(inbox_counter($node, 'batch_fallbacks'), '>', $fallbacks, 'the fast path failed, the careful one took over');
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false');
ok(defined wait_applied($node, 471, 120), 'all 150 applied once the handler accepts it')
  or diag $node->safe_psql('consumer', 'SELECT * FROM inbox_status');
sleep 1;
is($node->safe_psql('consumer', 'SELECT count(*) FROM app.applied'), '471', 'nothing applied twice');
@p = consumer_verdict($node);
is_deeply(\@p, [], 'final: exactly once, in version order') or diag join("\n", @p);

$node->stop;
$mk->stop;
done_testing();
