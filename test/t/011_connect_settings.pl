# A database named in the settings that does not exist is simply not served
# (no worker fails), and is served once created.  A wrong outbox.role: the
# FATAL names the setting, is logged once rather than every 5 s, the worker
# retries ever more slowly, and outbox_workers() shows why no publisher runs.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('connect', database => 'nosuchdb');

# The launcher looks every second: give it a few.
sleep 3;
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox publisher'}), '0',
	'no publisher runs for a database that does not exist');
is($node->safe_psql('postgres', 'SELECT publisher FROM outbox_status'), 'not serving this database',
	'outbox_status in another database: not served');
like($node->safe_psql('postgres', 'SELECT publisher_detail FROM outbox_status'),
	qr/outbox\.database is set to "nosuchdb"/, 'naming the setting');
ok(!$node->log_contains('FATAL'), 'nothing fails meanwhile');

# Creating the database is enough, without a restart.
$node->safe_psql('postgres', 'CREATE DATABASE nosuchdb');
$node->safe_psql('nosuchdb', 'CREATE EXTENSION outbox');
ok($node->poll_query_until('nosuchdb', q{SELECT publisher = 'running' FROM outbox_status}, 't'),
	'once the database exists the publisher connects');
is($node->safe_psql('nosuchdb', 'SELECT count(*) FROM outbox_workers() WHERE problem IS NOT NULL'), '0',
	'and no problem shows');

# A wrong role.
$node->append_conf('postgresql.conf', "outbox.database = 'postgres'\noutbox.role = 'nosuchrole'\n");
my $t0 = time;
$node->restart;
ok($node->poll_query_until('postgres',
	q{SELECT bool_and(problem LIKE 'cannot connect (outbox.role): %role "nosuchrole" does not exist') FROM outbox_workers()}),
	'a wrong role shows in outbox_workers()');
is($node->safe_psql('postgres', 'SELECT state FROM outbox_workers()'), 'not running', 'not running');
like($node->safe_psql('postgres', 'SELECT publisher_detail FROM outbox_status'),
	qr/No publisher worker is running: cannot connect/, 'and in outbox_status');
ok($node->log_contains(qr/CONTEXT:  outbox publisher connecting to database "postgres" as role "nosuchrole" \(outbox.role\)/),
	'the FATAL names outbox.role');

# The launcher starts it again; it waits longer each time.  Exits are
# counted from the first failure on (the restart's shutdown exits too).
my $exits = sub {
	my $log = slurp_file($node->logfile);
	$log = substr($log, index($log, 'FATAL:  role "nosuchrole" does not exist'));
	my $n = () = $log =~ /background worker "outbox publisher" \(PID \d+\) exited with exit code 1/g;
	return $n;
};
my $deadline = time + 90;
sleep 1 while $exits->() < 2 && time < $deadline;
my $attempts = $exits->();
cmp_ok($attempts, ">=", 2, 'the worker keeps retrying');
my $log = slurp_file($node->logfile);
my $fatals = () = $log =~ /FATAL:  role "nosuchrole" does not exist/g;
is($fatals, 1, 'the same failure is logged once');
note sprintf 'FIGURES connect retries: %d attempts in %.0f s since start (a restart every 5 s would make %d)',
  $attempts, time - $t0, int((time - $t0) / 5) + 1;

$node->stop;
$mk->stop;
done_testing();
