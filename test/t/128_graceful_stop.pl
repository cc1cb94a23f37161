# A SIGTERM (pg_terminate_backend, a fast shutdown) that finds a publisher
# waiting for acknowledgements stops it gracefully: it reads nothing more,
# settles what Kafka acknowledges of its flights, then exits, so nothing
# acknowledged is sent again after the restart.  Bounded: with no
# acknowledgement coming (all brokers down) it still exits
# outbox.shutdown_timeout (2 s here) after the signal, and a second SIGTERM
# exits at once.
#
# The first phase fails without the graceful stop: the worker died with
# 3,000 acknowledged events unsettled, and its successor sent them again.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OutboxTest;

my $topic = 'outbox.event.stop';
my $dir = $PostgreSQL::Test::Utils::tmp_check;
my ($node, $mk) = outbox_setup('stop', brokers => 3, shutdown_timeout => '2s');

# The running publisher's pid (waits for one other than $not, if given).
sub worker_pid
{
	my ($not) = @_;
	my $t0 = time;
	while (time - $t0 < 60)
	{
		my $pid = $node->safe_psql('postgres',
			q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox publisher'});
		return $pid if $pid ne '' && (!defined $not || $pid ne $not);
		sleep 0.1;
	}
	return '';
}

# Seconds until process $pid is gone (-1 after $timeout s).
sub exit_time
{
	my ($pid, $t0, $timeout) = @_;
	while (time - $t0 < $timeout)
	{
		return time - $t0 unless kill 0, $pid;
		sleep 0.02;
	}
	return -1;
}

$node->safe_psql('postgres', "SELECT outbox_emit('stop', 'warmup', 'E', '{}')");
ok(defined wait_published($node, 60), 'warm-up event published');

# 1. Acknowledgements take 400 ms; the worker is terminated while 3,000
# produced events await them.
my $pid = worker_pid();
$mk->cmd('rtt all 400');
$node->safe_psql('postgres', q{
	SELECT outbox_pause();
	SELECT count(*) FROM (SELECT outbox_emit('stop', 'agg-' || (g % 300), 'E', '{}')
	  FROM generate_series(1, 3000) g) s;
	SELECT outbox_resume();});
sleep 0.15;
# (The signal drains when it finds the worker waiting between steps, as it
# does while messages are out; inside a step it dies at once.)
$node->poll_query_until('postgres', qq{SELECT wait_event_type = 'Extension'
	FROM pg_stat_activity WHERE pid = $pid});
my $log_offset = -s $node->logfile;
my $t0 = time;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
my $took = exit_time($pid, $t0, 10);
ok($took >= 0 && $took < 3, "the worker exited after settling (${took}s)");
like(slurp_file($node->logfile, $log_offset),
	qr/stopping: settling what Kafka acknowledges first/, 'it said it was settling before stopping');
$mk->cmd('rtt all 0');
ok(worker_pid($pid) ne '', 'a new worker started');
ok(defined wait_published($node, 60), 'everything published');
my $r = $mk->check(topics => [$topic], expect => expect_file($node, "$dir/exp1"));
is($r->{exit}, 0, 'order checker clean') or diag $r->{output};
is($r->{duplicates}, 0, 'nothing acknowledged was sent again after the stop');
note sprintf "FIGURES scenario=graceful_stop events=3000 exit_s=%.2f duplicates=%d",
  $took, $r->{duplicates} // -1;

# 2. No acknowledgement comes: the stop is bounded.
$mk->cmd('all_down');
$node->safe_psql('postgres',
	"SELECT outbox_emit('stop', 'down-' || (g % 10), 'E', '{}') FROM generate_series(1, 100) g");
sleep 1;
$pid = worker_pid();
$t0 = time;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
my $bounded = exit_time($pid, $t0, 20);
ok($bounded >= 0 && $bounded < 5, "brokers down: the stop is bounded (${bounded}s)");
cmp_ok($bounded, '>=', 1.5, 'it waited for acknowledgements until outbox.shutdown_timeout');

# 3. A second SIGTERM does not wait.
$pid = worker_pid($pid);
sleep 1;
$t0 = time;
kill 'TERM', $pid;
sleep 0.05;
kill 'TERM', $pid;
my $second = exit_time($pid, $t0, 20);
ok($second >= 0 && $second < 1, "a second SIGTERM exits at once (${second}s)");
note sprintf "FIGURES scenario=stop_without_acks bounded_s=%.2f second_sigterm_s=%.2f",
  $bounded, $second;

$mk->cmd('all_up');
ok(defined wait_published($node, 120), 'brokers back: everything published');
$r = $mk->check(topics => [$topic], expect => expect_file($node, "$dir/exp2"));
is($r->{exit}, 0, 'order checker clean at the end') or diag $r->{output};

$node->stop;
$mk->stop;
done_testing();
