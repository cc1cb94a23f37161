# The failover runbook of docs/failover.md, end to end: a primary and its
# standby under emit load (emitters commit with synchronous_commit = off),
# the primary killed, the standby promoted, the old primary rewound with
# pg_rewind and attached as the new standby.  Kafka is judged against the
# promoted server: no event it lacks (phantom), none of its events lost,
# no gap, no inversion.  The inbox half on the same servers (database
# "consumer", its workers applying the topic): on the promoted server every
# committed event is applied exactly once, in version order (offsets and
# effects commit together, so what the failover took back is applied
# again).  No publisher or inbox worker ever runs on a standby.
#
# outbox.standby_confirmations = -1 follows synchronous_standby_names (here
# '*': the one standby): the publisher waits for what a synchronous commit
# would wait for, so the promoted standby has every event Kafka has; the
# promoted server's publisher publishes once the rewound old primary
# streams from it, with no setting changed by hand.  A Patroni cluster in
# synchronous mode sets synchronous_standby_names itself.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use File::Copy qw(copy);
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use InboxTest;
use OutboxTest;

# (OUTBOX_FAILOVER_CONFIRMATIONS=0 shows what the setting prevents.)
my $confirmations = $ENV{OUTBOX_FAILOVER_CONFIRMATIONS} // -1;
my $dir = $PostgreSQL::Test::Utils::tmp_check;
my ($old, $mk) = inbox_setup('old_primary', brokers => 3, max_seconds => 600,
	fault_conf(), standby_confirmations => $confirmations);
$old->append_conf('postgresql.conf', q{
wal_level = replica
max_wal_senders = 4
wal_log_hints = on
wal_keep_size = 256MB
synchronous_standby_names = '*'
synchronous_commit = off
wal_writer_delay = 1s
});
$old->restart;
quiet_statements($old);
setup_consumer($old, 'billing', 'outbox.event.load');
$old->safe_psql('consumer', 'UPDATE app.knobs SET fail = false, delay = 0');
$old->backup('b');
my $new = PostgreSQL::Test::Cluster->new('new_primary');
$new->init_from_backup($old, 'b', has_streaming => 1);
$new->start;
$old->wait_for_catchup($new);

# Publishers on each node, sampled while the test runs: none on a standby.
my %standby_publishers;
sub look_at_standby
{
	my ($node) = @_;
	my ($rc, $out) = $node->psql('postgres',
		q{SELECT pg_is_in_recovery(),
				 (SELECT count(*) FROM pg_stat_activity
				   WHERE backend_type IN ('outbox publisher', 'outbox inbox worker'))});
	return unless $rc == 0 && $out =~ /^t\|(\d+)$/;
	$standby_publishers{ $node->name } += $1;
}

my $t_start = time;
my $load = start_load($old, clients => 4, events_per_tx => 2,
	aggregates => 200, rate => 300, resilient => 1, chunk_s => 3);
sleep 0.2 while max_id($old) < 2000 && time - $t_start < 60;
for (1 .. 10)
{
	look_at_standby($new);
	sleep 0.2;
}
cmp_ok($old->safe_psql('postgres', 'SELECT count(*) FROM outbox WHERE NOT EXISTS
	(SELECT 1 FROM outbox_pending p WHERE p.id = outbox.id)'), '>', 0,
	'the primary publishes while its standby confirms');
ok($old->poll_query_until('consumer', 'SELECT count(*) > 0 FROM app.applied'),
	'the inbox applies them on the primary');

# The standby falls behind (its WAL receiver stopped for 2 s), then the
# primary dies under load: what it had not sent to the standby is lost with
# it (asynchronous commits), so it must not be in Kafka either.  (With
# outbox.standby_confirmations = 0 its publisher sent some of it: events
# Kafka holds at versions the promoted server gave to other events.)
my $walreceiver = $new->safe_psql('postgres', 'SELECT pid FROM pg_stat_wal_receiver');
ok($walreceiver =~ /^\d+$/, 'the standby streams');
kill 'STOP', $walreceiver;
my $behind_from = max_id($old);
my $t_behind = time;
sleep 0.2 while max_id($old) < $behind_from + 500 && time - $t_behind < 60;
sleep 1;
$old->stop('immediate');
kill 'CONT', $walreceiver;
stop_load($load, 60);
$new->promote;
$new->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'the standby was not promoted';
ok(defined wait_publisher($new, 1, 60), 'the promoted server runs a publisher');
cmp_ok($new->safe_psql('consumer', 'SELECT count(*) FROM app.applied'), '>', 0,
	'effects applied before the failover are on the promoted server');
quiet_statements($new);

# Emitters go on against the promoted server; with no standby yet, what
# it commits waits for one (as a synchronous commit would).
$load = start_load($new, clients => 4, events_per_tx => 2,
	aggregates => 200, rate => 300, resilient => 1, chunk_s => 3);
ok($new->poll_query_until('postgres',
	q{SELECT bool_or(state = 'waiting for standbys') FROM outbox_workers()}),
	'the promoted server waits for a standby before publishing')
  if $confirmations != 0;

# The old primary, rewound, follows the promoted server.  (pg_rewind reads
# the promoted server's timeline from its control file, which the first
# checkpoint after the promotion writes.)
# It copies the configuration files from there too: the old primary's own
# are put back.
$new->safe_psql('postgres', 'CHECKPOINT');
my $conf = $old->data_dir . '/postgresql.conf';
copy($conf, "$dir/old_primary.conf") or die "cannot copy $conf: $!";
ok(run_log(['pg_rewind', '--target-pgdata', $old->data_dir,
	'--source-server', $new->connstr('postgres')]), 'pg_rewind of the old primary')
  or die 'pg_rewind failed';
copy("$dir/old_primary.conf", $conf) or die "cannot restore $conf: $!";
$old->enable_streaming($new);
$old->start;
for (1 .. 10)
{
	look_at_standby($old);
	sleep 0.2;
}
$new->poll_query_until('postgres',
	q{SELECT count(*) > 0 FROM pg_stat_replication WHERE sync_state = 'sync'})
  or die 'the old primary does not stream';
ok($new->poll_query_until('postgres',
	q{SELECT NOT bool_or(state = 'waiting for standbys') FROM outbox_workers()}),
	'the promoted server publishes once the old primary streams from it');
sleep 2;
look_at_standby($old);

ok(stop_load($load, 60), 'emitters stopped');
ok(defined wait_published($new, 120), 'nothing pending on the promoted server');
is(join(',', map { "$_=$standby_publishers{$_}" } sort keys %standby_publishers),
	'new_primary=0,old_primary=0', 'no publisher or inbox worker ran on a standby');
is($old->safe_psql('postgres',
	q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox publisher'}),
	'0', 'none runs on the rewound old primary');

db_versions_contiguous($new, 'promoted server');
my $r = verdict($mk, $new, 'failover', topics => ['outbox.event.load']);
is($r->{unexpected}, 0, 'no aggregate in Kafka that the promoted server lacks');

my $events = $new->safe_psql('postgres', 'SELECT count(*) FROM outbox');
ok(defined wait_applied($new, $events, 120), "the promoted server's inbox applied the $events events");
my @p = consumer_verdict($new);
is_deeply(\@p, [], 'inbox: every committed event applied exactly once, in version order')
  or diag join("\n", @p);
note_counters($new, $t_start);

$old->stop;
$new->stop;
$mk->stop;
done_testing();
