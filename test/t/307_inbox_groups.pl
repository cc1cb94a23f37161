# One consumer name in two databases of a cluster: two consumer groups
# (outbox.inbox.<system identifier>.<database oid>.<consumer>), never one.
# A database that subscribes after the other consumed and unsubscribed
# applies the topic from its beginning (not from the offset the other one
# committed to Kafka), inbox_status's lag tells the truth, and with both
# subscribed each applies every event (not a share of them).
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my $topic = 'ledger.events';
my ($node, $mk) = outbox_setup('inbox_groups', topics => ["$topic:2"], max_seconds => 600,
	inbox_kafka_properties => 'session.timeout.ms=6000;heartbeat.interval.ms=500');
$node->append_conf('postgresql.conf', "max_worker_processes = 24\n");
$node->restart;

sub applied_in
{
	my ($db) = @_;
	return $node->safe_psql($db, 'SELECT count(*) FROM app.applied');
}

sub subscribe
{
	my ($db) = @_;
	$node->safe_psql($db, qq{SET ROLE app;
		SELECT inbox_subscribe('ledger', ARRAY['$topic'], 'app.apply(inbox_message)'::regprocedure)});
}

sub emit
{
	my ($n) = @_;
	$node->safe_psql('postgres',
		"SELECT outbox_emit('ledger', 'l-' || (g % 5), 'E', '{}', topic => '$topic') FROM generate_series(1, $n) g");
	ok(defined wait_published($node, 60), "$n events published");
}

$node->safe_psql('postgres', 'CREATE ROLE app LOGIN');
my %oid;
for my $db ('tenant_a', 'tenant_b')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, q{
CREATE EXTENSION outbox;
CREATE SCHEMA app AUTHORIZATION app;
GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure), inbox_unsubscribe(text) TO app;
SET ROLE app;
CREATE TABLE app.applied (aggregate_id text, version bigint);
CREATE FUNCTION app.apply(m inbox_message) RETURNS void LANGUAGE sql
  AS $$ INSERT INTO app.applied VALUES (m.aggregate_id, m.aggregate_version) $$;
});
	$oid{$db} = $node->safe_psql('postgres', "SELECT oid FROM pg_database WHERE datname = '$db'");
}
my $sysid = $node->safe_psql('postgres', 'SELECT system_identifier FROM pg_control_system()');

# tenant_b consumes 10 events (and commits its offsets to Kafka), then
# unsubscribes; 5 more follow.
subscribe('tenant_b');
emit(10);
ok(defined wait_until(sub { applied_in('tenant_b') == 10 }, 60), 'tenant_b applied the first 10');
ok($node->log_contains(qr/consumer "ledger" joined group "outbox\.inbox\.$sysid\.$oid{tenant_b}\.ledger"/),
	"tenant_b's group is outbox.inbox.<system identifier>.<database oid>.ledger");
sleep 2;
$node->safe_psql('tenant_b', q{SET ROLE app; SELECT inbox_unsubscribe('ledger')});
emit(5);

# tenant_a subscribes the same consumer name: all 15, from the beginning.
subscribe('tenant_a');
ok(defined wait_until(sub { applied_in('tenant_a') == 15 }, 60),
	'tenant_a applied all 15 events, from the beginning of the topic')
  or diag 'tenant_a applied ' . applied_in('tenant_a');
ok($node->log_contains(qr/consumer "ledger" joined group "outbox\.inbox\.$sysid\.$oid{tenant_a}\.ledger"/),
	"tenant_a's group is its own");
sleep 1;
is($node->safe_psql('tenant_a', q{SELECT sum(next_offset) || ' ' || sum(lag) || ' ' || sum(applied)
	FROM inbox_status WHERE consumer = 'ledger'}), '15 0 15',
	'tenant_a: inbox_status stored at offset 15 in all, lag 0, 15 applied');

# Both subscribed: each applies every event.
subscribe('tenant_b');
emit(20);
for my $db ('tenant_a', 'tenant_b')
{
	ok(defined wait_until(sub { applied_in($db) == 35 }, 60), "$db applied all 35 events")
	  or diag "$db applied " . applied_in($db);
}
sleep 2;
for my $db ('tenant_a', 'tenant_b')
{
	is(applied_in($db), '35', "$db: nothing applied twice");
	is($node->safe_psql($db, q{SELECT count(*) FROM (SELECT aggregate_id FROM app.applied GROUP BY 1
		HAVING count(*) <> max(version) OR count(DISTINCT version) <> count(*)) s}), '0',
		"$db: each version of each aggregate once");
	is($node->safe_psql($db, q{SELECT sum(lag) || ' ' || sum(applied) FROM inbox_status WHERE consumer = 'ledger'}),
		'0 35', "$db: inbox_status lag 0, 35 applied");
}

$node->stop;
$mk->stop;
done_testing();
