# A wrong outbox.database or outbox.role: the FATAL names the setting, is
# logged once rather than every 5 s, the worker retries ever more slowly,
# and outbox_workers() shows why no publisher runs.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
mkdir "$dir/mock11";
my $mk = MockKafka->start(dir => "$dir/mock11", brokers => 1, max_seconds => 300);
my $t0 = time;
my $node = outbox_node('connect', $mk, database => 'nosuchdb');

ok($node->poll_query_until('postgres',
	q{SELECT bool_and(problem LIKE 'cannot connect (outbox.database, outbox.role): database "nosuchdb" does not exist')
	    FROM outbox_workers()}), 'outbox_workers() says the publisher cannot connect, and why');
is($node->safe_psql('postgres', 'SELECT state FROM outbox_workers()'), 'not running', 'not running');
ok($node->log_contains(qr/FATAL:  database "nosuchdb" does not exist\n.*CONTEXT:  outbox publisher connecting to database "nosuchdb" \(outbox.database\)/),
	'the FATAL names outbox.database');

# Let PostgreSQL restart the worker.
my $exits = sub {
	my $log = slurp_file($node->logfile);
	my $n = () = $log =~ /background worker "outbox publisher" \(PID \d+\) exited with exit code 1/g;
	return $n;
};
my $deadline = time + 90;
sleep 1 while $exits->() < 2 && time < $deadline;
my $attempts = $exits->();
cmp_ok($attempts, ">=", 2, 'the worker keeps retrying');
my $log = slurp_file($node->logfile);
my $fatals = () = $log =~ /FATAL:  database "nosuchdb" does not exist/g;
is($fatals, 1, 'the same failure is logged once');
note sprintf 'FIGURES connect retries: %d attempts in %.0f s since start (a restart every 5 s would make %d)',
  $attempts, time - $t0, int((time - $t0) / 5) + 1;

# Creating the database lets the next attempt in, without a restart.
$node->safe_psql('postgres', 'CREATE DATABASE nosuchdb');
$node->safe_psql('nosuchdb', 'CREATE EXTENSION outbox');
ok($node->poll_query_until('nosuchdb', q{SELECT publisher = 'running' FROM outbox_status}, 't'),
	'once the database exists the publisher connects');
is($node->safe_psql('nosuchdb', 'SELECT count(*) FROM outbox_workers() WHERE problem IS NOT NULL'), '0',
	'and the problem is gone');

# A wrong role.
$node->append_conf('postgresql.conf', "outbox.database = 'postgres'\noutbox.role = 'nosuchrole'\n");
$node->restart;
ok($node->poll_query_until('postgres',
	q{SELECT bool_and(problem LIKE '%role "nosuchrole" does not exist') FROM outbox_workers()}),
	'a wrong role shows in outbox_workers()');
like($node->safe_psql('postgres', 'SELECT publisher_detail FROM outbox_status'),
	qr/No publisher worker is running: cannot connect/, 'and in outbox_status');
ok($node->log_contains(qr/CONTEXT:  outbox publisher connecting to database "postgres" \(outbox.database\) as role "nosuchrole" \(outbox.role\)/),
	'the FATAL names outbox.role');

$node->stop;
$mk->stop;
done_testing();
