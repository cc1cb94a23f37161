# Inbox on real Kafka (a 3-broker Apache Kafka 3.9 cluster, RF 3): producer
# database → Kafka → consumer database, with two inbox workers sharing six
# partitions.  Each phase ends with the consumer database's check: every
# committed event applied exactly once, per aggregate in version order,
# nothing of a rolled-back producer transaction.
#   1. concurrent emitters with rollbacks; the broker that coordinates the
#      consumer group stopped while the workers consume, then started again;
#   2. outbox_replay() of everything upstream: all dropped as duplicates;
#   3. rebalances: one worker terminated (a static member: its partitions
#      wait for the launcher to start it again), then one SIGKILLed mid-batch
#      (a crash restart: the workers rejoin as the same static members,
#      test/t/311 bounds how fast);
#   4. a slow handler: the messages fetched take longer than
#      max.poll.interval.ms to apply; transactions bounded by
#      outbox.inbox_batch_time, with a poll between them, keep the worker
#      in its group (test/t/306 asserts that on the mock);
#   5. a handler that fails for chosen events under each poison policy
#      (block, then inbox_retry or inbox_skip; dead_letter; skip), then
#      upstream skips (outbox_skip) under each gap policy (apply, block),
#      as test/t/303 on the mock: the dropped events are left out of the
#      check, which still wants every other one once, in version order.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OutboxTest;
use InboxTest;
use RealKafka;
use RealTest;

my $topic = 'outbox.event.load';
my ($node, $rk) = inbox_setup('inbox_real', kafka => 'real', topics => ["$topic:6"],
	inbox_workers => 2, inbox_batch_size => 200,
	inbox_kafka_properties =>
	  'session.timeout.ms=6000;heartbeat.interval.ms=500;max.poll.interval.ms=8000');
$node->append_conf('postgresql.conf', 'restart_after_crash = on');
$node->reload;
setup_consumer($node, 'billing', $topic);
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false, delay = 0.002');

# Check the consumer database; name the phase.
sub verdict_ok
{
	my ($phase) = @_;
	my @p = consumer_verdict($node);
	is_deeply(\@p, [], "$phase: exactly once, in version order, only committed events")
	  or diag join("\n", @p);
}

# Pid of an inbox worker applying a batch, or undef after $timeout s.
sub busy_worker
{
	my ($timeout) = @_;
	my $t0 = time;
	while (time - $t0 < $timeout)
	{
		my $pid = $node->safe_psql('consumer',
			q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox inbox worker'
			   AND query LIKE 'applying%' LIMIT 1});
		return $pid if $pid;
		sleep 0.02;
	}
	return undef;
}

# The group's coordinator: the leader of its __consumer_offsets partition
# (Java's String.hashCode of the group id, modulo 50), else broker 2.
sub coordinator
{
	my ($group) = @_;
	my $h = 0;
	$h = ($h * 31 + ord($_)) & 0xffffffff for split //, $group;
	my $leader = $rk->leader('__consumer_offsets', ($h & 0x7fffffff) % 50);
	return defined $leader ? ($leader, 'group coordinator') : (2, 'coordinator unknown');
}

# 1. End to end, the group coordinator stopped while consuming.
my $t_start = time;
my $load = emit_load($node, clients => 4, transactions => 600, aggregates => 100,
	events_per_tx => 2, background => 1);
ok(defined wait_applied_across_restarts($node, 300, 120), 'the workers apply while the producers emit');
# The group of consumer billing: this cluster's and database's own.
my $group = sprintf 'outbox.inbox.%s.%s.billing',
  $node->safe_psql('consumer', 'SELECT system_identifier FROM pg_control_system()'),
  $node->safe_psql('consumer', q{SELECT oid FROM pg_database WHERE datname = 'consumer'});
my ($broker, $role) = coordinator($group);
my $stop_s = $rk->node(stop => $broker);
my $applied = $node->safe_psql('consumer', 'SELECT count(*) FROM app.applied');
note sprintf 'broker %d (%s) stopped in %.1f s; %s events applied',
  $broker, $role, $stop_s, $applied;
ok(defined wait_applied_across_restarts($node, $applied + 300, 120), 'the workers go on applying while it is down');
$load->finish;
$rk->node(start => $broker);
note sprintf 'broker %d started again with %s events applied', $broker,
  $node->safe_psql('consumer', 'SELECT count(*) FROM app.applied');
ok(defined wait_published($node, 180), 'producer: everything published');
my $committed = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
my $t = wait_applied($node, $committed, 180);
ok(defined $t, "consumer: $committed committed events applied")
  or diag $node->safe_psql('consumer', 'SELECT * FROM inbox_status');
note sprintf 'FIGURES inbox_real phase=broker_restart events=%d total_s=%.1f', $committed, time - $t_start;
sleep 1;
verdict_ok('broker restart');
is($node->safe_psql('consumer', 'SELECT DISTINCT applied_by FROM app.applied'), 'app',
	'the handler ran as the subscribing role');
is($node->safe_psql('consumer', q{SELECT count(DISTINCT pid) FROM pg_stat_activity
	WHERE backend_type = 'outbox inbox worker'}), '2', 'two inbox workers');

# 2. Upstream replay: all duplicates.
my $before = $node->safe_psql('consumer', 'SELECT sum(duplicates) FROM inbox_status');
my $replayed = $node->safe_psql('postgres',
	q{SELECT sum(outbox_replay(aggregate_id, 1)) FROM (SELECT DISTINCT aggregate_id FROM outbox) a});
ok(defined wait_published($node, 180), "producer: $replayed events replayed");
ok($node->poll_query_until('consumer',
		"SELECT sum(duplicates) - $before >= $replayed FROM inbox_status"),
	'every replayed event is counted as a duplicate');
is($node->safe_psql('consumer', 'SELECT count(*) FROM app.applied'), $committed,
	'the replay applied nothing again');
verdict_ok('replay');

# 3. Rebalances: a worker terminated, then one SIGKILLed, each mid-batch.
$node->safe_psql('consumer', 'UPDATE app.knobs SET delay = 0.001');
$node->safe_psql('postgres', q{SELECT outbox_emit('load', 'agg-' || (i % 100), 'Changed',
	jsonb_build_object('n', i)) FROM generate_series(1, 3000) i});
my $pid = busy_worker(60);
ok(defined $pid, 'a worker applies a batch');
ok($node->safe_psql('consumer', "SELECT pg_terminate_backend($pid)") eq 't', 'one worker terminated');
ok($node->poll_query_until('consumer', qq{SELECT count(*) = 2 FROM pg_stat_activity
	WHERE backend_type = 'outbox inbox worker' AND pid <> $pid}), 'the launcher started it again');
$pid = busy_worker(60);
ok(defined $pid, 'a worker applies a batch again');
my $at = $node->safe_psql('consumer', 'SELECT count(*) FROM app.applied');
kill 'KILL', $pid if $pid;
note "SIGKILLed inbox worker $pid with $at applied";
ok($node->poll_query_until('postgres', 'SELECT true'), 'the server is back after the crash restart');
ok(defined wait_published($node, 180), 'producer: everything published');
$committed = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
ok(defined wait_applied_across_restarts($node, $committed, 240), "consumer: $committed events applied after the rebalances");
ok($node->log_contains('terminated by signal 9'), 'the SIGKILL reached a worker (crash restart)');
sleep 1;
verdict_ok('rebalances');

# 4. A slow handler: 200 messages of 50 ms take 10 s, above the 8 s
# max.poll.interval.ms; a transaction stops taking messages after
# outbox.inbox_batch_time (here at most 8 s / 3) and the worker polls before
# the next.  Were it put out of its group anyway (a loaded machine), its
# transaction still commits and whoever gets the partitions next starts
# from the stored offsets.
$node->safe_psql('consumer', 'UPDATE app.knobs SET delay = 0.05');
$node->safe_psql('postgres', q{SELECT outbox_emit('load', 'slow-' || (i % 10), 'Changed',
	jsonb_build_object('n', i)) FROM generate_series(1, 600) i});
ok(defined wait_published($node, 120), 'producer: the slow phase published');
$committed = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
my $t_slow = time;
$t = wait_applied_across_restarts($node, $committed, 300);
ok(defined $t, "slow handler: $committed events applied")
  or diag $node->safe_psql('consumer', 'SELECT * FROM inbox_status');
# Whether the worker left its group depends on the machine: reported, not
# asserted.
note sprintf 'FIGURES inbox_real phase=slow_handler events=600 handler_ms=50 applied_s=%.1f left_group=%s',
  time - $t_slow, $node->log_contains('Application maximum poll interval') ? 'yes' : 'no';
sleep 2;
verdict_ok('slow handler');
is($node->safe_psql('consumer', q{SELECT count(*) FROM inbox_offset
	WHERE next_offset IS DISTINCT FROM high_watermark}), '0',
	'every partition is stored at its high watermark');
my $status = $node->safe_psql('consumer',
	q{SELECT string_agg(format('p%s applied=%s dup=%s', "partition", applied, duplicates), ' ' ORDER BY "partition")
	    FROM inbox_status});
note "FIGURES inbox_real $status";

# 5. Poison and gaps.  Each aggregate psn-* emits v1 (applied, to learn its
# partition), v2 (refused by the handler, or skipped upstream), v3; the
# partition's counters are compared with their values before.
my $t_poison = time;
$node->append_conf('postgresql.conf', qq{outbox.inbox_max_attempts = 3\noutbox.inbox_retry_backoff = '100ms'\n});
$node->reload;
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = true, delay = 0');
my @dropped;    # event ids a policy dropped: not applied, left out of the check

# Emit an event of aggregate $agg; its event id.
sub emit_one
{
	my ($agg, $payload) = @_;
	return $node->safe_psql('postgres',
		"SELECT event_id FROM outbox_emit('load', '$agg', 'Changed', '$payload')");
}

# The query of $agg's applied versions, in the order applied.
sub versions_q
{
	return "SELECT string_agg(version::text, ',' ORDER BY seq) FROM app.applied WHERE aggregate_id = '$_[0]'";
}

# Emit v1 of $agg, wait until it is applied; the partition it came from.
sub start_aggregate
{
	my ($agg) = @_;
	emit_one($agg, '{}');
	poll_until($node, 'consumer', versions_q($agg), '1', 60) or return undef;
	return $node->safe_psql('consumer',
		"SELECT \"partition\" FROM app.applied WHERE aggregate_id = '$agg'");
}

# Columns of partition $p's row of inbox_status (an SQL expression).
sub pstatus
{
	my ($p, $expr) = @_;
	return $node->safe_psql('consumer',
		"SELECT $expr FROM inbox_status WHERE consumer = 'billing' AND topic = '$topic' AND \"partition\" = $p");
}

# Set outbox.$k to $v and reload the configuration.
sub set_policy
{
	my ($k, $v) = @_;
	$node->append_conf('postgresql.conf', "outbox.$k = '$v'\n");
	$node->reload;
}

# block: the partition stops at the message, other partitions go on.
my $p = start_aggregate('psn-blk');
ok(defined $p, 'block: v1 applied');
my %before = map { $_ => pstatus($p, $_) } qw(errors skipped dead_lettered gaps);
my $poison = emit_one('psn-blk', '{"fail": true}');
emit_one('psn-blk', '{}');
ok(poll_until($node, 'consumer', "SELECT state FROM inbox_status WHERE \"partition\" = $p AND consumer = 'billing'", 'blocked', 60),
	"block: partition $p is blocked");
is(pstatus($p, "attempts || ' ' || errors - $before{errors}"), '3 3',
	'block: after 3 attempts (outbox.inbox_max_attempts), each counted as an error');
like(pstatus($p, 'last_error'), qr/handler refuses \Q$poison\E/, 'block: inbox_status shows the handler\'s error');
# Behind the poison message in its partition, or in another partition.
my ($same, $other) = map { $node->safe_psql('consumer',
	"SELECT min(aggregate_id) FROM app.applied WHERE aggregate_id LIKE 'agg-%' AND \"partition\" $_ $p") } ('=', '<>');
my $same_eid = emit_one($same, '{}');
my $other_eid = emit_one($other, '{}');
ok(poll_until($node, 'consumer', "SELECT count(*) FROM app.applied WHERE event_id = '$other_eid'", '1', 60),
	'block: another partition goes on');
is($node->safe_psql('consumer', "SELECT count(*) FROM app.applied WHERE event_id = '$same_eid'"), '0',
	'block: another aggregate of the blocked partition waits');
is($node->safe_psql('consumer', versions_q('psn-blk')), '1', 'block: nothing past the poison message is applied');
is(pstatus($p, 'state'), 'blocked', 'block: still blocked');
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false');
is($node->safe_psql('consumer', "SELECT inbox_retry('billing', '$topic', $p)"), 't', 'block: inbox_retry');
ok(poll_until($node, 'consumer', versions_q('psn-blk'), '1,2,3', 60), 'block: after inbox_retry the fixed handler applies it and the next, in order');
ok(poll_until($node, 'consumer', "SELECT count(*) FROM app.applied WHERE event_id = '$same_eid'", '1', 60),
	'block: the other aggregate of the partition follows');
is(pstatus($p, "state || ' ' || attempts"), 'running 0', 'block: running again');
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = true');

# block, then inbox_skip: the message is dropped.
$p = start_aggregate('psn-bsk');
ok(defined $p, 'inbox_skip: v1 applied');
%before = map { $_ => pstatus($p, $_) } qw(errors skipped dead_lettered gaps);
push @dropped, emit_one('psn-bsk', '{"fail": true}');
emit_one('psn-bsk', '{}');
ok(poll_until($node, 'consumer', "SELECT state FROM inbox_status WHERE \"partition\" = $p AND consumer = 'billing'", 'blocked', 60),
	"inbox_skip: partition $p is blocked first");
is($node->safe_psql('consumer', "SELECT inbox_skip('billing', '$topic', $p)"), 't', 'inbox_skip');
ok(poll_until($node, 'consumer', versions_q('psn-bsk'), '1,3', 60), 'inbox_skip: the poison message is dropped, the next applied');
is(pstatus($p, "state || ' ' || skipped - $before{skipped}"), 'running 1', 'inbox_skip: counted as skipped');

# dead_letter: into inbox_dead_letter with its error, the partition goes on.
set_policy('inbox_poison_policy', 'dead_letter');
$p = start_aggregate('psn-dl');
ok(defined $p, 'dead_letter: v1 applied');
%before = map { $_ => pstatus($p, $_) } qw(errors skipped dead_lettered gaps);
$poison = emit_one('psn-dl', '{"fail": true}');
push @dropped, $poison;
emit_one('psn-dl', '{}');
ok(poll_until($node, 'consumer', versions_q('psn-dl'), '1,3', 60), 'dead_letter: the next message is applied');
is($node->safe_psql('consumer',
	qq{SELECT (message).aggregate_id || ' ' || (message).aggregate_version || ' ' || (message)."partition" || ' ' ||
			  attempts || ' ' || (error LIKE 'handler refuses%') || ' ' || ((message).payload ->> 'fail')
		 FROM inbox_dead_letter WHERE consumer = 'billing' AND (message).event_id = '$poison'}),
	"psn-dl 2 $p 3 true true", 'dead_letter: the message, its error and attempts are in inbox_dead_letter');
is(pstatus($p, "state || ' ' || dead_lettered - $before{dead_lettered} || ' ' || errors - $before{errors}"),
	'running 1 3', 'dead_letter: counted, the partition running');

# skip: dropped, counted.
set_policy('inbox_poison_policy', 'skip');
$p = start_aggregate('psn-skp');
ok(defined $p, 'skip: v1 applied');
%before = map { $_ => pstatus($p, $_) } qw(errors skipped dead_lettered gaps);
push @dropped, emit_one('psn-skp', '{"fail": true}');
emit_one('psn-skp', '{}');
ok(poll_until($node, 'consumer', versions_q('psn-skp'), '1,3', 60), 'skip: the next message is applied');
is(pstatus($p, "state || ' ' || skipped - $before{skipped} || ' ' || dead_lettered - $before{dead_lettered}"),
	'running 1 0', 'skip: counted as skipped, not dead-lettered');

# A replay of the disposed-of aggregates: duplicates, not new attempts.
my $dups = $node->safe_psql('consumer', q{SELECT sum(duplicates) FROM inbox_status WHERE consumer = 'billing'});
$node->safe_psql('postgres', q{SELECT outbox_replay('psn-dl', 1), outbox_replay('psn-skp', 1)});
ok(poll_until($node, 'consumer', q{SELECT sum(duplicates) FROM inbox_status WHERE consumer = 'billing'}, $dups + 6, 60),
	'replayed disposed-of events are duplicates');
is($node->safe_psql('consumer', q{SELECT count(*) FROM inbox_dead_letter}), '1', 'no second dead letter');
my $where = 'event_id NOT IN (' . join(', ', map { "'$_'" } @dropped) . ')';
my @problems = consumer_verdict($node, $where);
is_deeply(\@problems, [], 'poison policies: every event but the dropped applied once, in version order')
  or diag join("\n", @problems);

# Upstream skip: the publisher of psn-gap paused, v2 and v3 emitted, v2
# given up on with outbox_skip(), publishing resumed: v3 follows v1.
sub upstream_skip
{
	my ($agg) = @_;
	$node->safe_psql('postgres', "SELECT outbox_pause('$agg')");
	my $eid = emit_one($agg, '{}');
	emit_one($agg, '{}');
	$node->safe_psql('postgres', "SELECT outbox_skip('$eid', 'poison upstream')");
	$node->safe_psql('postgres', "SELECT outbox_resume('$agg')");
	push @dropped, $eid;
}
$p = start_aggregate('psn-gap');
ok(defined $p, 'gap policy apply: v1 applied');
%before = map { $_ => pstatus($p, $_) } qw(errors skipped dead_lettered gaps);
upstream_skip('psn-gap');
ok(poll_until($node, 'consumer', versions_q('psn-gap'), '1,3', 60), 'gap policy apply: the event after an upstream skip is applied');
is(pstatus($p, "state || ' ' || gaps - $before{gaps}"), 'running 1', 'gap policy apply: the gap is counted');

set_policy('inbox_gap_policy', 'block');
emit_one('psn-gap', '{}');
ok(poll_until($node, 'consumer', versions_q('psn-gap'), '1,3,4', 60), 'gap policy block: v4 applied');
upstream_skip('psn-gap');
ok(poll_until($node, 'consumer', "SELECT state FROM inbox_status WHERE \"partition\" = $p AND consumer = 'billing'", 'blocked', 60),
	"gap policy block: partition $p is blocked");
like(pstatus($p, 'blocked_reason'), qr/^gap: aggregate "psn-gap" expected version 5, got 6/,
	'gap policy block: the reason says which');
is($node->safe_psql('consumer', versions_q('psn-gap')), '1,3,4', 'gap policy block: nothing past the gap is applied');
is($node->safe_psql('consumer', "SELECT inbox_retry('billing', '$topic', $p)"), 't', 'gap policy block: inbox_retry');
ok(poll_until($node, 'consumer', versions_q('psn-gap'), '1,3,4,6', 60), 'gap policy block: inbox_retry accepts the gap');
is(pstatus($p, "state || ' ' || gaps - $before{gaps}"), 'running 2', 'gap policy block: the accepted gap is counted');
$where = 'event_id NOT IN (' . join(', ', map { "'$_'" } @dropped) . ')';
@problems = consumer_verdict($node, $where);
is_deeply(\@problems, [], 'gap policies: every event but the skipped applied once, in version order')
  or diag join("\n", @problems);
note sprintf 'FIGURES inbox_real phase=poison_gaps total_s=%.1f', time - $t_poison;

$node->stop;
$rk->stop;
done_testing();
