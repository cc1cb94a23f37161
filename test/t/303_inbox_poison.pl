# Inbox poison and gap handling: a failing handler is retried with backoff,
# then blocked (inbox_retry / inbox_skip), dead-lettered or skipped as
# outbox.inbox_poison_policy says; an upstream gap is applied and counted,
# or blocks the partition (outbox.inbox_gap_policy).  Also: who may
# subscribe, and with what handler; a renamed handler is no longer found.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'poison';
my ($node, $mk) = inbox_setup('inbox_poison', topics => ["$topic:1"], max_seconds => 600,
	inbox_max_attempts => 3,
	inbox_retry_backoff => '100ms');
setup_consumer($node, 'billing', $topic);

sub emit
{
	my ($agg, $payload, $version) = @_;
	my $v = defined $version ? ", aggregate_version => $version" : '';
	$node->safe_psql('postgres',
		"SELECT outbox_emit('t', '$agg', 'E', '$payload', topic => '$topic'$v)");
}

sub set_conf
{
	my ($k, $v) = @_;
	$node->append_conf('postgresql.conf', "outbox.$k = '$v'\n");
	$node->reload;
	sleep 0.5;
}

sub applied { $node->safe_psql('consumer',
	"SELECT string_agg(version::text, ',' ORDER BY seq) FROM app.applied WHERE aggregate_id = '$_[0]'") }

my $status = q{SELECT state || ' ' || attempts || ' ' || errors FROM inbox_status WHERE consumer = 'billing'};

# --- block: retried, then the partition stops at the message. ---
emit('blk', '{}');
emit('blk', '{"fail": true}');
emit('blk', '{}');
ok(poll_until($node, 'consumer', q{SELECT state FROM inbox_status}, 'blocked', 60), 'block: the partition is blocked');
is($node->safe_psql('consumer', $status), 'blocked 3 3', 'block: after 3 attempts (outbox.inbox_max_attempts)');
like($node->safe_psql('consumer', 'SELECT last_error FROM inbox_status'), qr/handler refuses/,
	'block: the handler\'s error is shown');
is(applied('blk'), '1', 'block: only the version before the poison message is applied');
ok($node->log_contains(qr/consumer "billing": handler failed at offset 1 of partition 0 of topic "\Q$topic\E"; retrying in \d+ ms\n.*DETAIL:  handler refuses/),
	'block: the first failure is logged with the error, before the partition blocks');
sleep 1;
is(applied('blk'), '1', 'block: the partition stays stopped');
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false');
is($node->safe_psql('consumer', "SELECT inbox_retry('billing', '$topic', 0)"), 't', 'inbox_retry');
ok(poll_until($node, 'consumer', q{SELECT string_agg(version::text, ',' ORDER BY seq) FROM app.applied WHERE aggregate_id = 'blk'}, '1,2,3', 60),
	'block: after inbox_retry the message and the next are applied, in order');
is($node->safe_psql('consumer', $status), 'running 0 3', 'block: running again');
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = true');

# --- block, then inbox_skip. ---
emit('bsk', '{"fail": true}');
emit('bsk', '{}');
ok(poll_until($node, 'consumer', q{SELECT state FROM inbox_status}, 'blocked', 60), 'skip by operator: blocked first');
is($node->safe_psql('consumer', "SELECT inbox_skip('billing', '$topic', 0)"), 't', 'inbox_skip');
ok(poll_until($node, 'consumer', q{SELECT string_agg(version::text, ',') FROM app.applied WHERE aggregate_id = 'bsk'}, '2', 60),
	'inbox_skip: the poison message is dropped, the next applied');
is($node->safe_psql('consumer', 'SELECT skipped FROM inbox_status'), '1', 'inbox_skip: counted as skipped');

# --- dead_letter: into the table, the partition goes on. ---
set_conf('inbox_poison_policy', 'dead_letter');
emit('dl', '{"fail": true}');
emit('dl', '{}');
ok(poll_until($node, 'consumer', q{SELECT string_agg(version::text, ',') FROM app.applied WHERE aggregate_id = 'dl'}, '2', 60),
	'dead_letter: the next message is applied');
is($node->safe_psql('consumer',
	q{SELECT (message).aggregate_id || ' ' || (message).aggregate_version || ' ' || attempts || ' ' ||
			 (error LIKE 'handler refuses%') || ' ' || ((message).payload ->> 'fail')
		FROM inbox_dead_letter}),
	'dl 1 3 true true', 'dead_letter: the message, its error and attempts are in inbox_dead_letter');
is($node->safe_psql('consumer', q{SELECT dead_lettered || ' ' || state FROM inbox_status}), '1 running',
	'dead_letter: counted, partition running');

# --- skip: dropped, counted. ---
set_conf('inbox_poison_policy', 'skip');
emit('sk', '{"fail": true}');
emit('sk', '{}');
ok(poll_until($node, 'consumer', q{SELECT string_agg(version::text, ',') FROM app.applied WHERE aggregate_id = 'sk'}, '2', 60),
	'skip: the next message is applied');
is($node->safe_psql('consumer', 'SELECT skipped FROM inbox_status'), '2', 'skip: counted as skipped');

# A replay of the disposed-of events is a duplicate, not a new attempt.
my $dups = $node->safe_psql('consumer', 'SELECT duplicates FROM inbox_status');
$node->safe_psql('postgres', "SELECT outbox_replay('sk', 1), outbox_replay('dl', 1)");
ok(poll_until($node, 'consumer', 'SELECT duplicates FROM inbox_status', $dups + 4, 60), 'replayed disposed-of events are duplicates');
is($node->safe_psql('consumer', q{SELECT count(*) FROM inbox_dead_letter}), '1', 'no second dead letter');

# --- gaps ---
emit('gap', '{}', 1);
emit('gap', '{}', 3);
ok(poll_until($node, 'consumer', q{SELECT string_agg(version::text, ',' ORDER BY seq) FROM app.applied WHERE aggregate_id = 'gap'}, '1,3', 60),
	'gap policy apply: the event after the gap is applied');
is($node->safe_psql('consumer', 'SELECT gaps FROM inbox_status'), '1', 'gap policy apply: the gap is counted');

set_conf('inbox_gap_policy', 'block');
emit('gap', '{}', 6);
emit('gap', '{}', 7);
ok(poll_until($node, 'consumer', q{SELECT state FROM inbox_status}, 'blocked', 60), 'gap policy block: the partition is blocked');
like($node->safe_psql('consumer', 'SELECT blocked_reason FROM inbox_status'),
	qr/^gap: aggregate "gap" expected version 4, got 6/, 'gap policy block: the reason says which');
is(applied('gap'), '1,3', 'gap policy block: nothing past the gap is applied');
$node->safe_psql('consumer', "SELECT inbox_retry('billing', '$topic', 0)");
ok(poll_until($node, 'consumer', q{SELECT string_agg(version::text, ',' ORDER BY seq) FROM app.applied WHERE aggregate_id = 'gap'}, '1,3,6,7', 60),
	'gap policy block: inbox_retry accepts the gap');
is($node->safe_psql('consumer', 'SELECT gaps FROM inbox_status'), '2', 'the accepted gap is counted');

# --- who may subscribe, with what ---
my ($rc, $out, $err) = $node->psql('consumer',
	q{SELECT inbox_subscribe('su', ARRAY['x'], 'app.apply(inbox_message)'::regprocedure)});
like($err, qr/a superuser cannot subscribe/, 'a superuser cannot subscribe');
$node->safe_psql('consumer', q{CREATE ROLE other LOGIN; GRANT EXECUTE ON FUNCTION
	inbox_subscribe(text, text[], regprocedure), inbox_unsubscribe(text) TO other;
	REVOKE EXECUTE ON FUNCTION app.apply(inbox_message) FROM PUBLIC;
	CREATE FUNCTION public.wrong(m inbox_message) RETURNS int LANGUAGE sql AS 'SELECT 1'});
my $apply_oid = $node->safe_psql('consumer', q{SELECT 'app.apply(inbox_message)'::regprocedure::oid});
($rc, $out, $err) = $node->psql('consumer',
	qq{SET ROLE other; SELECT inbox_subscribe('o', ARRAY['x'], ${apply_oid}::regprocedure)});
like($err, qr/must be owner of function app.apply/, 'a role must own its handler (it runs as that role)');
($rc, $out, $err) = $node->psql('consumer',
	q{SET ROLE other; SELECT inbox_subscribe('o', ARRAY['x'], 'public.wrong(inbox_message)'::regprocedure)});
like($err, qr/cannot be an inbox handler/, 'a handler must return void');
($rc, $out, $err) = $node->psql('consumer',
	q{SET ROLE other; SELECT inbox_unsubscribe('billing')});
like($err, qr/consumer "billing" is subscribed by another role/, 'another role cannot unsubscribe a consumer');
is($node->safe_psql('consumer', q{SELECT role FROM inbox_consumer WHERE consumer = 'billing'}), 'app',
	'subscribing registers the consumer to the subscribing role');
$node->safe_psql('consumer', q{GRANT EXECUTE ON FUNCTION inbox_claim(text, text) TO other});
($rc, $out, $err) = $node->psql('consumer', q{SELECT inbox_claim('billing', 'forged')}, extra_params => ['-U', 'other']);
like($err, qr/permission denied to claim for consumer "billing"/,
	'another role cannot claim events of a subscribed consumer (which the worker would then drop)');
$node->safe_psql('consumer', q{INSERT INTO inbox_consumer VALUES ('taken', 'other')});
($rc, $out, $err) = $node->psql('consumer',
	q{SET ROLE app; SELECT inbox_subscribe('taken', ARRAY['x'], 'app.apply(inbox_message)'::regprocedure)});
like($err, qr/consumer "taken" is registered to another role/, 'a consumer registered to another role cannot be subscribed');
($rc, $out, $err) = $node->psql('consumer',
	q{SET ROLE app; SELECT inbox_subscribe('b2', ARRAY['bad topic'], 'app.apply(inbox_message)'::regprocedure)});
like($err, qr/invalid topic "bad topic"/, 'topic names are checked');
($rc, $out, $err) = $node->psql('consumer',
	q{SET ROLE app; SELECT inbox_subscribe('', ARRAY['x'], 'app.apply(inbox_message)'::regprocedure)});
like($err, qr/consumer must not be empty/, 'an empty consumer name is refused');

# A caller's operators are not used by inbox_subscribe's own statements
# (which run as the extension owner): its search_path is pinned.
$node->safe_psql('consumer', q{GRANT CREATE ON DATABASE consumer TO app});
$node->safe_psql('consumer', q{SET ROLE app; CREATE SCHEMA evil;
	CREATE FUNCTION evil.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
		$$BEGIN RAISE EXCEPTION 'hijacked as %', current_user; END$$;
	CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eq)});
($rc, $out, $err) = $node->psql('consumer', q{SET ROLE app; SET search_path = evil, pg_catalog, public;
	SELECT public.inbox_subscribe('hijack', ARRAY['x'], 'app.apply(public.inbox_message)'::regprocedure)});
unlike($err, qr/hijacked/, 'a caller\'s operator is not run by inbox_subscribe');
is($rc, 0, 'and the subscription is made') or diag $err;
# The handler is stored by its signature, every schema named whatever the
# caller's search_path.
$node->safe_psql('consumer', q{SET ROLE app; SET search_path = app, public;
	SELECT inbox_subscribe('hijack', ARRAY['x'], 'apply(inbox_message)'::regprocedure)});
is($node->safe_psql('consumer', q{SELECT handler FROM inbox_subscription WHERE consumer = 'hijack'}),
	'app.apply(public.inbox_message)', 'the handler is stored schema-qualified');
$node->safe_psql('consumer', q{SET ROLE app; SELECT inbox_unsubscribe('hijack')});

# The consumer properties are checked when set.
($rc, $out, $err) = $node->psql('consumer', q{ALTER SYSTEM SET outbox.inbox_kafka_properties = 'enable.auto.commit=true'});
like($err, qr/Property "enable.auto.commit" is set by the inbox worker/, 'reserved consumer properties are refused');
($rc, $out, $err) = $node->psql('consumer', q{ALTER SYSTEM SET outbox.inbox_kafka_properties = 'no.such.thing=1'});
like($err, qr/invalid value for parameter "outbox.inbox_kafka_properties"/, 'unknown consumer properties are refused');

# The handler renamed: the subscription names it by its signature, so it
# is no longer found; the worker says so and what to do, and runs it again
# once subscribed with its new name.
my $log_pos = -s $node->logfile;
$node->safe_psql('consumer', 'SET ROLE app; ALTER FUNCTION app.apply(inbox_message) RENAME TO apply_v2');
ok($node->wait_for_log(qr/subscription "billing" is not applied: its handler no longer exists\n.*DETAIL:  No function app\.apply\(public\.inbox_message\) exists\..*renamed.*\n.*HINT:  Call inbox_subscribe\(\) again with the handler's current name\./,
	$log_pos), 'a renamed handler is not found: the worker says so, with what to do');
emit('renamed', '{}');
sleep 2;
is($node->safe_psql('consumer', q{SELECT count(*) FROM app.applied WHERE aggregate_id = 'renamed'}), '0',
	'nothing is applied meanwhile');
$node->safe_psql('consumer', qq{SET ROLE app;
	SELECT inbox_subscribe('billing', ARRAY['$topic'], 'app.apply_v2(inbox_message)'::regprocedure)});
ok(poll_until($node, 'consumer', q{SELECT count(*) FROM app.applied WHERE aggregate_id = 'renamed'}, '1', 60),
	'subscribed again with the new name, the handler runs');
# Back to its name, subscribed again, and running before what follows.
$node->safe_psql('consumer', qq{SET ROLE app; BEGIN;
	ALTER FUNCTION app.apply_v2(inbox_message) RENAME TO apply;
	SELECT inbox_subscribe('billing', ARRAY['$topic'], 'app.apply(inbox_message)'::regprocedure);
	COMMIT});
emit('renamed', '{}');
ok(poll_until($node, 'consumer', q{SELECT count(*) FROM app.applied WHERE aggregate_id = 'renamed'}, '2', 60),
	'and again under its old name');

# A handler that became unusable is not run: its role lost EXECUTE.
$node->safe_psql('consumer', 'REVOKE ALL ON SCHEMA app FROM app');
$node->safe_psql('consumer', 'REVOKE EXECUTE ON FUNCTION app.apply(inbox_message) FROM app, PUBLIC');
emit('late', '{}');
ok(poll_until($node, 'consumer', q{SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'outbox inbox worker'}, 't', 60),
	'the worker runs');
sleep 3;
is($node->safe_psql('consumer', q{SELECT count(*) FROM app.applied WHERE aggregate_id = 'late'}), '0',
	'a handler its role may no longer execute is not run');
ok($node->log_contains('subscription "billing" is not applied: its role may not execute its handler'),
	'and the reason is logged');

$node->stop;
$mk->stop;
done_testing();
