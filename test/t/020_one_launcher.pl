# One launcher starts the publishers and the inbox workers of every
# database: there is one launcher process; one that is terminated comes
# back and takes over the workers still running (none is started twice);
# an inbox worker that stops is started again after the same back-off as a
# publisher (5 s after its stop); and with the publishers disabled the
# launcher still runs the inbox workers of the one inbox database, waiting
# (said once in the log) until that database exists.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use InboxTest;
use MockKafka;
use OutboxTest;

my $topic = 'orders';
my ($node, $mk) = outbox_setup('one_launcher', topics => ["$topic:1"], max_seconds => 600,
	inbox_kafka_properties => 'session.timeout.ms=6000;heartbeat.interval.ms=500');
$node->append_conf('postgresql.conf', "max_worker_processes = 16\n");
$node->restart;

# Count of backends of a type, in database $db if given.
sub backends
{
	my ($type, $db) = @_;
	my $where = defined $db ? " AND datname = '$db'" : '';
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = '$type'$where");
}

# Pid of the one backend of a type in database $db, or '' if none.
sub backend_pid
{
	my ($type, $db) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(min(pid)::text, '') FROM pg_stat_activity WHERE backend_type = '$type' AND datname = '$db'");
}

# Database "shop" consumes the topic: its inbox worker runs there.
$node->safe_psql('postgres', 'CREATE ROLE app LOGIN; CREATE DATABASE shop');
subscribe_database($node, 'shop', 'shop', $topic);
ok(defined wait_until(sub {
	backends('outbox inbox worker', 'shop') == 1 && backends('outbox publisher', 'shop') == 1
	  && backends('outbox publisher', 'postgres') == 1 }, 60),
	'a publisher in each database, an inbox worker where something is subscribed');

is($node->safe_psql('postgres',
	q{SELECT string_agg(backend_type, ',') FROM pg_stat_activity WHERE backend_type LIKE 'outbox%launcher'}),
	'outbox launcher', 'one launcher serves them all');

# The launcher terminated: it is started again (5 s later) and follows the
# workers the one before it started.
my $inbox_pid = backend_pid('outbox inbox worker', 'shop');
my $publisher_pid = backend_pid('outbox publisher', 'shop');
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres',
	q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type LIKE 'outbox%launcher'});
ok(defined wait_until(sub { $node->log_contains(qr/outbox launcher started/, $log_offset) }, 60),
	'the terminated launcher is started again');
# A database created now gets its publisher: the new launcher has made
# its passes, inbox workers included.
$node->safe_psql('postgres', 'CREATE DATABASE late');
$node->safe_psql('late', 'CREATE EXTENSION outbox');
ok(defined wait_until(sub { backends('outbox publisher', 'late') == 1 }, 60),
	'the new launcher serves a database created after it started');
is(backends('outbox inbox worker', 'shop') . ' ' . backend_pid('outbox inbox worker', 'shop'),
	"1 $inbox_pid", 'the inbox worker it found running was kept, not started twice');
is(backend_pid('outbox publisher', 'shop'), $publisher_pid, 'and so was the publisher');
my $log = slurp_file($node->logfile, $log_offset);
my $starts = () = $log =~ /outbox inbox worker 0 started for database "shop"/g;
is($starts, 0, 'no inbox worker started again in shop');

# One back-off for all: an inbox worker that stops starts again 5 s after
# its stop at the soonest, as a publisher does.
my $t_stop = time;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($inbox_pid)");
ok(defined wait_until(sub { my $p = backend_pid('outbox inbox worker', 'shop'); $p ne '' && $p ne $inbox_pid }, 60),
	'the terminated inbox worker is started again');
cmp_ok(time - $t_stop, '>=', 4.5, 'after the restart back-off (5 s)');

# No publisher, and the one inbox database missing at start: the launcher
# runs for the inbox workers alone, says once that it waits, and starts
# them when the database comes.
$node->append_conf('postgresql.conf', "outbox.workers = 0\noutbox.inbox_database = 'consumer'\n");
$node->restart;
ok(defined wait_until(sub {
	$node->log_contains(qr/outbox launcher: inbox database "consumer" does not exist; waiting/) }, 60),
	'with outbox.workers = 0 the launcher waits for the inbox database');
is(backends('outbox launcher'), '1', 'one launcher runs for the inbox workers');
$node->safe_psql('postgres', 'CREATE DATABASE consumer');
$node->safe_psql('consumer', 'CREATE EXTENSION outbox');
ok(defined wait_until(sub { backends('outbox inbox worker', 'consumer') == 1 }, 60),
	'the inbox worker starts once its database exists');
is(backends('outbox publisher'), '0', 'and no publisher runs');
$log = slurp_file($node->logfile);
my $waits = () = $log =~ /inbox database "consumer" does not exist/g;
is($waits, 1, 'the missing database was logged once');

$node->stop;
$mk->stop;
done_testing();
