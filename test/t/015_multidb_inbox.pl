# Inbox workers in many databases: with neither outbox.inbox_database nor
# outbox.database set, they run in every database the publishers serve
# where something is subscribed, each applying its own subscriptions; a
# database with nothing subscribed keeps no inbox worker; DROP DATABASE
# stops them too.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use InboxTest;
use MockKafka;
use OutboxTest;

my $topic = 'orders';
my ($node, $mk) = outbox_setup('multidb_inbox', topics => ["$topic:2"], max_seconds => 600,
	inbox_kafka_properties => 'session.timeout.ms=6000;heartbeat.interval.ms=500');
$node->append_conf('postgresql.conf', "max_worker_processes = 24\n");
$node->restart;

sub inbox_workers_in
{
	my ($db) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox inbox worker' AND datname = '$db'");
}

# Two consumer databases, each subscribing its own consumer group to the
# topic the producer database ("postgres") emits to.  Handlers never run as
# a superuser: role app subscribes.
$node->safe_psql('postgres', 'CREATE ROLE app LOGIN');
for my $db ('shop', 'billing')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	subscribe_database($node, $db, "$db-consumer", $topic);
}

ok(defined wait_until(sub { inbox_workers_in('shop') == 1 && inbox_workers_in('billing') == 1 }, 60),
	'an inbox worker runs in each database with a subscription');
$node->safe_psql('postgres',
	"SELECT outbox_emit('order', 'o-' || (g % 10), 'E', '{}', topic => '$topic') FROM generate_series(1, 200) g");
for my $db ('shop', 'billing')
{
	ok(defined wait_until(sub { $node->safe_psql($db, 'SELECT count(*) FROM app.applied') == 200 }, 120),
		"$db applied every event");
	is($node->safe_psql($db, q{SELECT count(*) FROM (SELECT aggregate_id FROM app.applied GROUP BY 1
		HAVING count(*) <> max(version) OR count(DISTINCT version) <> count(*)) s}), '0',
		"$db: each version once");
}
sleep 2;
is(inbox_workers_in('postgres'), '0', 'no inbox worker stays where nothing is subscribed');

# DROP DATABASE of a database whose inbox worker runs.
my ($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE billing');
is($rc, 0, 'plain DROP DATABASE with an inbox worker connected succeeds') or diag $err;
$node->safe_psql('postgres',
	"SELECT outbox_emit('order', 'o-' || (g % 10), 'E', '{}', topic => '$topic') FROM generate_series(1, 50) g");
ok(defined wait_until(sub { $node->safe_psql('shop', 'SELECT count(*) FROM app.applied') == 250 }, 120),
	'the other database goes on applying');

$node->stop;
$mk->stop;
done_testing();
