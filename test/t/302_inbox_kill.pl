# Inbox workers SIGKILLed in the middle of batches, several times, with two
# workers sharing the partitions: whatever was re-delivered is a no-op, and
# the consumer database ends with every committed event applied exactly
# once, per aggregate in version order.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'outbox.event.load';
my ($node, $mk) = inbox_setup('inbox_kill', brokers => 3, topics => ["$topic:4"], max_seconds => 900,
	inbox_workers => 2, inbox_batch_size => 200);
$node->append_conf('postgresql.conf', 'restart_after_crash = on');
$node->reload;
setup_consumer($node, 'billing', $topic);
# Slow the handler so that a batch lasts long enough to be caught.
$node->safe_psql('consumer', 'UPDATE app.knobs SET delay = 0.0005');

emit_load($node, clients => 4, transactions => 500, aggregates => 100, events_per_tx => 2);
ok(defined wait_published($node, 180), 'producer: everything published');
my $committed = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');

# Kill a worker while it applies a batch, then wait for the cluster to
# come back (a killed worker makes the postmaster restart every backend)
# and for some progress before the next kill.
my $kills = 0;
my $applied = 0;
for my $round (1 .. 5)
{
	my $pid;
	my $t0 = time;
	while (time - $t0 < 90)
	{
		# The server may still be restarting: a lost connection is retried.
		my ($rc, $out) = (1, '');
		eval {
			($rc, $out) = $node->psql('consumer',
				q{SELECT (SELECT count(*) FROM app.applied) || ' ' ||
						 coalesce((SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox inbox worker'
									AND query LIKE 'applying%' LIMIT 1), 0)});
		};
		if ($rc == 0 && $out =~ /^(\d+) (\d+)$/ && $1 > $applied && $2 > 0)
		{
			($applied, $pid) = ($1, $2);
			last;
		}
		sleep 0.02;
	}
	last unless defined $pid;
	sleep rand(0.2);
	kill 'KILL', $pid and $kills++;
	note "round $round: killed inbox worker $pid with $applied of $committed applied";
	wait_back($node, 'consumer') or die 'server did not come back';
}
cmp_ok($kills, '>=', 3, "inbox workers killed mid-batch ($kills times)");
ok($node->log_contains('terminated by signal 9'), 'the kills reached the workers');

ok(defined wait_applied($node, $committed, 240), "every committed event applied ($committed)");
sleep 2;
my @p = consumer_verdict($node);
is_deeply(\@p, [], 'exactly once, in version order, only committed events, despite the kills')
  or diag join("\n", @p);
is($node->safe_psql('consumer', q{SELECT count(*) FROM inbox_offset o
	WHERE next_offset IS DISTINCT FROM high_watermark}), '0',
	'every partition is stored at its high watermark');
# A clean stop in the middle of a batch: SIGTERM ends the worker promptly
# (it leaves its group, the held messages freed first), nothing half-done.
$node->safe_psql('consumer', 'UPDATE app.knobs SET delay = 0.002');
$node->safe_psql('postgres', q{SELECT outbox_emit('load', 'stop-' || (i % 20), 'Changed', '{}')
	FROM generate_series(1, 1000) i});
ok($node->poll_query_until('consumer',
	q{SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'outbox inbox worker'
	   AND query LIKE 'applying%'}), 'a batch is being applied');
my $t0 = time;
$node->stop('fast');
my $stop_s = time - $t0;
note "stopped in ${stop_s}s";
$node->start;
$committed = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
$node->safe_psql('consumer', 'UPDATE app.knobs SET delay = 0');
ok(defined wait_applied($node, $committed, 120), 'after the restart everything is applied');
sleep 1;
@p = consumer_verdict($node);
is_deeply(\@p, [], 'exactly once, in version order, after a stop mid-batch') or diag join("\n", @p);

my $status = $node->safe_psql('consumer',
	q{SELECT string_agg(format('p%s applied=%s dup=%s', "partition", applied, duplicates), ' ' ORDER BY "partition")
	    FROM inbox_status});
note sprintf "FIGURES inbox_kill kills=%d events=%d stop=%.1fs %s", $kills, $committed, $stop_s, $status;

$node->stop;
$mk->stop;
done_testing();
