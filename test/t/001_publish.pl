# End to end: events emitted in PostgreSQL reach Kafka, per aggregate in
# version order, under concurrency, a broker outage, a hot aggregate and
# configuration reloads.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
my ($node, $mk) = outbox_setup('publish', brokers => 3, max_seconds => 600,
	poll_interval => '60s');
my $topic = 'outbox.event.load';

# The node is UTF8 with the C locale whatever the caller's LANG (none, in
# a container, would give SQL_ASCII): what the tests compare depends on it.
is($node->safe_psql('postgres', q{SELECT pg_encoding_to_char(encoding) || ' ' || datcollate
	FROM pg_database WHERE datname = current_database()}),
	'UTF8 C', 'the test node is UTF8 with the C locale');

# A commit wakes the publisher at once: the fallback poll comes 60 s after
# the worker's last batch, so an event published with no poll counted in
# between was published because the commit callback set the worker's
# latch.  How quickly is a figure.
$node->safe_psql('postgres', "SELECT outbox_emit('load', 'warmup', 'Created', '{}')");
my $t = wait_published($node, 120);
ok(defined $t, 'first event published after commit');
my $wakeups = counter($node, 'wakeups');
my $polls = counter($node, 'polls');
$node->safe_psql('postgres', "SELECT outbox_emit('load', 'warmup', 'Changed', '{}')");
my $t2 = wait_published($node, 120);
ok(defined $t2, 'commit wake-up: published');
cmp_ok(counter($node, 'wakeups'), '>', $wakeups, 'the worker counted a wake-up');
is(counter($node, 'polls'), $polls, 'no fallback poll happened meanwhile');
note sprintf "FIGURES scenario=wakeup first_event_s=%.2f commit_to_published_s=%.2f",
  $t // -1, $t2 // -1;

# outbox.read_commits ends the wait of outbox.read_interval early: with a
# read at most every second, four commits right after a read are read at
# once when four is the count, and only a second after that read when it
# is not (the control, so the first figure is not just a fast read).
sub read_after_commits
{
	my ($commits, $direct) = @_;
	$node->safe_psql('postgres', qq{ALTER SYSTEM SET outbox.read_commits = $commits;
		ALTER SYSTEM SET outbox.read_interval = '1s'; SELECT pg_reload_conf()});
	sleep 0.5;
	$node->safe_psql('postgres', "SELECT outbox_emit('load', 'rc-$commits', 'Created', '{}')");
	wait_published($node, 120) // return -1;
	my $t0 = time;
	# A direct INSERT by the table's owner counts as an emit (the outbox's
	# statement trigger marks its transaction, as outbox_emit() does).
	$node->safe_psql('postgres', join("\n", map {
		$direct
		  ? "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload)
		     VALUES ('direct-$_', 'load', 'rc-direct', $_, 'Changed', '$topic', '{}');"
		  : "SELECT outbox_emit('load', 'rc-$commits', 'Changed', '{}');" } 1 .. 4));
	while (time - $t0 < 60)
	{
		return time - $t0 if $node->safe_psql('postgres',
			'SELECT count(*) FROM outbox_pending') == 0;
		sleep 0.02;
	}
	return -1;
}
my $fast = read_after_commits(4);
my $slow = read_after_commits(1000000);
my $direct = read_after_commits(4, 1);
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.read_commits;
	ALTER SYSTEM RESET outbox.read_interval; SELECT pg_reload_conf()});
ok($fast >= 0 && $fast < 0.5, "outbox.read_commits = 4: four commits read at once (${fast}s)");
ok($direct >= 0 && $direct < 0.5,
	"four direct INSERTs into the outbox count as four emitting commits (${direct}s)");
cmp_ok($slow, '>', 0.5, 'outbox.read_commits unreached: they wait for outbox.read_interval');
note sprintf "FIGURES scenario=read_commits four_commits_s=%.2f interval_1s_s=%.2f", $fast, $slow;

# Without its txid index the publisher finds new commits by a sequential
# scan (the same rows, slower), rather than failing.
$node->safe_psql('postgres', 'DROP INDEX outbox_txid_idx');
$node->safe_psql('postgres', "SELECT outbox_emit('load', 'no-index', 'E', '{}') FROM generate_series(1, 3)");
ok(defined wait_published($node, 60), 'txid index dropped: new events still published');
$node->safe_psql('postgres',
	'CREATE INDEX outbox_txid_idx ON outbox (txid) INCLUDE (aggregate_version, id, aggregate_id)');

# Many concurrent emitters over many aggregates, with rollbacks.
emit_load($node, clients => 8, transactions => 300, aggregates => 200, events_per_tx => 2);
ok(defined wait_published($node, 180), 'concurrent load: everything published');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM (SELECT aggregate_id FROM outbox GROUP BY 1
	   HAVING max(aggregate_version) <> count(*) OR min(aggregate_version) <> 1) s}),
	'0', 'versions are contiguous from 1 in the database (rollbacks left no holes)');
my $r = $mk->check(topics => [$topic], expect => expect_file($node, "$dir/exp1"));
is($r->{exit}, 0, 'concurrent load: order checker clean') or diag $r->{output};
cmp_ok($r->{accepted}, '>=', 4000, 'concurrent load: thousands of events checked');

# Publishing writes nothing per event: progress is per aggregate.  (The
# publisher reports its table statistics at least every second.)
sleep 2;
is($node->safe_psql('postgres',
	q{SELECT n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE relname = 'outbox'}),
	'0', 'no outbox row was updated or deleted to publish thousands of events');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM outbox o JOIN aggregate_publication p USING (aggregate_id)
	   WHERE o.aggregate_version > p.last_published_version}),
	'0', 'every event is at or below its aggregate\'s last published version');
# last_published_at is when Kafka acknowledged that version (its delivery
# report), after the event was created and no later than the settling.
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM aggregate_publication p
	   JOIN outbox o ON o.aggregate_id = p.aggregate_id
	    AND o.aggregate_version = p.last_published_version
	  WHERE NOT (p.last_published_at BETWEEN o.created_at AND p.updated_at)}),
	'0', 'each aggregate\'s last_published_at lies between its event\'s creation and its settling');

# All brokers down: events wait, nothing is lost, order holds.
$mk->cmd('all_down');
my $before = counter($node, 'events_published');
emit_load($node, clients => 4, transactions => 100, aggregates => 50);
sleep 3;
is(counter($node, 'events_published'), $before, 'nothing is marked published while the brokers are down');
cmp_ok($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_pending'),
	'>', 0, 'events wait in the outbox');
$mk->cmd('all_up');
ok(defined wait_published($node, 180), 'outage: everything published after the brokers came back');
$r = $mk->check(topics => [$topic], expect => expect_file($node, "$dir/exp2"));
is($r->{exit}, 0, 'outage: order checker clean') or diag $r->{output};

# A hot aggregate: thousands of events on one id.
$node->safe_psql('postgres', q{
	SELECT outbox_emit('load', 'hot', 'Tick', jsonb_build_object('i', i))
	  FROM generate_series(1, 3000) i});
$node->safe_psql('postgres', q{
	SELECT outbox_emit('load', 'hot', 'Tick', jsonb_build_object('i', i))
	  FROM generate_series(3001, 5000) i});
ok(defined wait_published($node, 180), 'hot aggregate: published');
$r = $mk->check(topics => [$topic], expect => expect_file($node, "$dir/exp3"));
is($r->{exit}, 0, 'hot aggregate: order checker clean') or diag $r->{output};

# SIGHUP: a new broker list takes effect without a restart.  Point the
# publisher at a port where nothing listens, then back.
# Wait (bounded) until the worker says it took the new setting rather than
# for a fixed time; then an event waits in a batch that times out against
# the dead broker list.
my $creations = counter($node, 'producer_creations');
my $changes = () = slurp_file($node->logfile) =~ /Kafka settings changed, recreating the producer/g;
$node->append_conf('postgresql.conf', "outbox.brokers = '127.0.0.1:1'\n");
$node->reload;
my $t0 = time;
sleep 0.1 while (() = slurp_file($node->logfile) =~ /Kafka settings changed, recreating the producer/g) == $changes
  && time - $t0 < 120;
ok((() = slurp_file($node->logfile) =~ /Kafka settings changed, recreating the producer/g) > $changes,
	'the worker took the new broker list');
my $timeouts = counter($node, 'delivery_timeouts');
$node->safe_psql('postgres', "SELECT outbox_emit('load', 'reload', 'Created', '{}')");
$t0 = time;
sleep 0.1 while counter($node, 'delivery_timeouts') == $timeouts && time - $t0 < 120;
cmp_ok(counter($node, 'delivery_timeouts'), '>', $timeouts, 'the batch against the dead broker list timed out');
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_pending WHERE aggregate_id = 'reload'"),
	'1', 'after reload to a dead broker list the event stays pending');
$node->append_conf('postgresql.conf', "outbox.brokers = '@{[ $mk->bootstrap ]}'\n");
$node->reload;
# The event went out again to the dead list before the reload: the old
# producer is replaced once that flight times out (outbox.delivery_timeout,
# 5 s), not at the next poll (60 s here).
my $back = wait_published($node, 120);
ok(defined $back && $back < 30,
	sprintf('after reload back to the mock, the event is published within 30 s (%.1f s)', $back // -1));
cmp_ok(counter($node, 'producer_creations'), '>=', $creations + 2,
	'each broker list change recreated the producer');
ok($node->log_contains('Kafka settings changed, recreating the producer'),
	'the reload is logged');

cmp_ok(counter($node, 'batches'), '>', 0, 'batches are counted');
cmp_ok(counter($node, 'latency_sum_us'), '>', 0, 'the latency sum is kept');
is($node->safe_psql('postgres', q{SELECT max(count) = (SELECT value FROM outbox_counters() WHERE name = 'events_published')
	FROM outbox_latency_histogram()}), 't', 'the latency histogram counts every published event');
like($node->safe_psql('postgres', 'SELECT state FROM outbox_workers()'), qr/idle|reading|producing|awaiting|marking|retention/,
	'outbox_workers() shows what the worker does');

# With slow acknowledgements (round trips of 20, 60 and 200 ms to the three
# brokers) a steady trickle is read at the pace its flights are reported, not
# every 10 ms: fewer, larger reads (a replicated cluster on a busy machine
# acknowledges in 50-200 ms).  While the worker holds reading for a flight's
# reports, commits do not wake it (none could end the hold),
# outbox.read_commits-th ones neither.  And a flight's reports, coming tens of
# ms apart, are served and settled together: not a wake-up per report, not
# one settling per broker.
$mk->cmd("rtt $_->[0] $_->[1]") for ([1, 20], [2, 60], [3, 200]);
my ($b0, $e0, $w0, $s0, $r0) = (counter($node, 'batches'), counter($node, 'events_published'),
	counter($node, 'wakeups'), counter($node, 'settles'), counter($node, 'report_wakeups'));
$t0 = time;
while (time - $t0 < 5)
{
	$node->safe_psql('postgres',
		"SELECT outbox_emit('load', 'slow-' || (random() * 50)::int, 'Tick', '{}')");
}
ok(defined wait_published($node, 120), 'the trickle under 200 ms acknowledgements is published');
$mk->cmd('rtt all 0');
my ($reads, $events, $held_wakeups, $settles) = (counter($node, 'batches') - $b0,
	counter($node, 'events_published') - $e0, counter($node, 'wakeups') - $w0, counter($node, 'settles') - $s0);
cmp_ok($reads * 2, '<', $events,
	"under 200 ms acknowledgements reads follow them: $reads reads for $events events");
cmp_ok($held_wakeups, '<=', $reads + 5,
	"commits do not wake a worker holding reading for its flight's reports: $held_wakeups wake-ups");
# Served as they come, a flight's reports wake the worker three times (one
# per broker; 102 for 34 reads measured so).  Served together, once, or
# twice when the worker woke late for the window (on a loaded machine)
# and the next flight has none: the bound lies between.
my $report_wakeups = counter($node, 'report_wakeups') - $r0;
cmp_ok($report_wakeups, '<=', $reads * 2 + 2,
	"the early reports of a flight are served together: $report_wakeups wake-ups by reports for $reads reads");
cmp_ok($settles, '<=', $reads * 1.25 + 2,
	"a flight's reports from three brokers are settled together: $settles settlings for $reads reads");
note "FIGURES scenario=slow_acks reads=$reads events=$events wakeups=$held_wakeups settles=$settles report_wakeups=$report_wakeups";

$r = $mk->check(topics => [$topic], expect => expect_file($node, "$dir/exp4"));
is($r->{exit}, 0, 'final: order checker clean') or diag $r->{output};
note "final verdict: $r->{output}";

$node->stop;
$mk->stop;
done_testing();
