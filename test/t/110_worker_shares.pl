# More workers configured than can start, and a worker that dies: nothing
# may wait for a worker that is not running.
#
# outbox.workers = 16 with max_worker_processes = 8 (one goes to the
# logical replication launcher, one to the outbox launcher; the inbox
# workers are disabled so that they take none): 6 publishers start.  The
# buckets are split among the workers alive, so every event is published.
# Then one worker is terminated; it comes back only after the launcher's
# restart back-off (5 s), and meanwhile the others publish its share: every
# event emitted after its death is published before the replacement
# started.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
my ($node, $mk) = outbox_setup('shares', workers => 16);
$node->append_conf('postgresql.conf', "max_worker_processes = 8\noutbox.inbox_workers = 0\n");
$node->restart;

ok(defined wait_publisher($node, 6, 60), 'six publishers started');
sleep 1;
my @pids = publisher_pids($node);
is(scalar @pids, 6, 'no more than six publishers run');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM outbox_workers() WHERE pid IS NULL}), '10',
	'outbox_workers() shows the ten that could not start');
ok($node->log_contains('outbox launcher: no background worker slot for publisher \\d+ of database "postgres"'),
	'the launcher logs that a publisher found no slot');
ok($node->log_contains('HINT:  Raise max_worker_processes \\(now 8\\) and restart the server'),
	'and says what to raise, with its value');

# 500 aggregates cover every bucket's residue modulo 16 many times over.
$node->safe_psql('postgres',
	q{SELECT outbox_emit('share', 'a-' || g, 'E', '{}') FROM generate_series(1, 500) g});
ok(defined wait_published($node, 60), 'every event published by the workers that started');

# Terminate one worker (it exits with status 1: the launcher starts it
# again 5 s later).
my ($index, $victim) = split /\|/, $node->safe_psql('postgres',
	q{SELECT worker, pid FROM outbox_workers() WHERE pid IS NOT NULL ORDER BY worker DESC LIMIT 1});
my $t_kill = time;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($victim)");
$node->poll_query_until('postgres',
	"SELECT pid IS NULL FROM outbox_workers() WHERE worker = $index")
  or die 'the terminated worker did not leave its slot';
$node->safe_psql('postgres',
	q{SELECT outbox_emit('share', 'b-' || g, 'E', '{}') FROM generate_series(1, 500) g});
my $took = wait_published($node, 60);
ok(defined $took, 'events emitted after a worker died are published');
my $done_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
note sprintf 'published %.2f s after the worker was terminated', time - $t_kill;

# The replacement starts 5 s after the death: publication did not wait for it.
ok($node->poll_query_until('postgres',
	"SELECT pid IS NOT NULL FROM outbox_workers() WHERE worker = $index"),
	'the terminated worker was restarted');
is($node->safe_psql('postgres', qq{
	SELECT '$done_at'::timestamptz < a.backend_start
	  FROM pg_stat_activity a
	 WHERE a.pid = (SELECT pid FROM outbox_workers() WHERE worker = $index)}), 't',
	'every event was published before the dead worker came back');

my $r = $mk->check(topics => ['outbox.event.share'],
	expect => expect_file($node, "$dir/expect"));
is($r->{exit}, 0, 'order checker clean') or diag $r->{output};

$node->stop;
$mk->stop;
done_testing();
