# An idle worker with stalled aggregates does not grow its memory.
#
# While aggregates await Kafka, every idle wake-up shows their count in the
# worker's state; that string used to be psprintf'ed in TopMemoryContext on
# each wake-up, never freed.  Here brokers are down, so a batch stalls, and
# the worker wakes every 10 ms (outbox.poll_interval) for 10 s: the used
# bytes of its TopMemoryContext (pg_log_backend_memory_contexts) must not
# grow with the wake-ups (before: ~140 bytes each, 117 kB for 812).
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('idlemem', poll_interval => '10ms', delivery_timeout => '1s');
ok(defined wait_publisher($node, 1, 60), 'publisher running');
my ($pid) = publisher_pids($node);

# The TopMemoryContext bytes in use of the worker, as it logs them.
my $seq = 0;
sub top_used
{
	my $offset = -s $node->logfile;
	$node->safe_psql('postgres', "SELECT pg_log_backend_memory_contexts($pid)");
	my $t0 = time;
	while (time - $t0 < 30)
	{
		my $log = slurp_file($node->logfile, $offset);
		# The top context's level is 0 before PostgreSQL 18, 1 from 18.
		return $1 if $log =~ /\[$pid\] LOG:\s+level: [01]; TopMemoryContext: \d+ total in \d+ blocks; \d+ free \(\d+ chunks\); (\d+) used/;
		sleep 0.1;
	}
	die 'the worker did not log its memory contexts';
}

stall_aggregates($node, $mk, 'mem', 20);
sleep 1;
my $before = top_used();
my $polls0 = counter($node, 'polls');
sleep 10;
my $after = top_used();
my $polls = counter($node, 'polls') - $polls0;
note sprintf 'TopMemoryContext used: %d bytes, then %d after %d idle wake-ups', $before, $after, $polls;
cmp_ok($polls, '>=', 20, 'the worker woke up many times');
cmp_ok(($after - $before) / ($polls || 1), '<', 16,
	'its TopMemoryContext did not grow with them (bytes per wake-up)');

$mk->cmd('all_up');
ok(defined wait_published($node, 60), 'published once the brokers are back');

$node->stop;
$mk->stop;
done_testing();
