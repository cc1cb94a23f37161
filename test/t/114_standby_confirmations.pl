# outbox.standby_confirmations: publish only what enough streaming standbys
# have flushed, so that a failover to one of them cannot take back an event
# Kafka already has.  -1 follows synchronous_standby_names: it waits for
# the standbys a synchronous commit waits for, and for none once the
# setting is empty (as Patroni leaves it when no synchronous standby is
# left).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my ($primary, $mk) = outbox_setup('primary', standby_confirmations => 1);
$primary->append_conf('postgresql.conf', "wal_level = replica\nmax_wal_senders = 4\n");
$primary->restart;
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

$primary->safe_psql('postgres', q{SELECT outbox_emit('sb', 's-1', 'E', '{}')});
ok(defined wait_published($primary, 30), 'published while the standby confirms');

# Stop the standby, wait until its walsender is gone, and emit an event.
sub standby_away
{
	$standby->stop;
	$primary->poll_query_until('postgres', 'SELECT count(*) = 0 FROM pg_stat_replication')
	  or die 'the walsender did not go away';
	$primary->safe_psql('postgres', q{SELECT outbox_emit('sb', 's-1', 'E', '{}')});
	return;
}

standby_away();
ok($primary->poll_query_until('postgres',
	q{SELECT state = 'waiting for standbys' FROM outbox_workers() WHERE worker = 0}),
	'the publisher waits for a standby');
sleep 2;
is($primary->safe_psql('postgres', 'SELECT count(*) FROM outbox_pending'),
	'1', 'nothing published that no standby has');

$standby->start;
ok(defined wait_published($primary, 60), 'published once the standby is back');

# An operator can give up the guarantee while the standby is away.
standby_away();
ok($primary->poll_query_until('postgres',
	q{SELECT state = 'waiting for standbys' FROM outbox_workers() WHERE worker = 0}),
	'waiting again');
$primary->safe_psql('postgres', q{ALTER SYSTEM SET outbox.standby_confirmations = 0; SELECT pg_reload_conf()});
ok(defined wait_published($primary, 30), 'a reload to 0 releases the waiting batch');

# -1: as synchronous replication counts (synchronous_standby_names).
$primary->safe_psql('postgres', q{ALTER SYSTEM SET outbox.standby_confirmations = -1;
	ALTER SYSTEM SET synchronous_standby_names = '*'; SELECT pg_reload_conf()});
$primary->safe_psql('postgres', q{SET synchronous_commit = off; SELECT outbox_emit('sb', 's-1', 'E', '{}')});
ok($primary->poll_query_until('postgres',
	q{SELECT state = 'waiting for standbys' FROM outbox_workers() WHERE worker = 0}),
	'-1: waiting for the synchronous standby');
$standby->start;
ok(defined wait_published($primary, 60), '-1: published once the synchronous standby has it');
$standby->stop;
$primary->poll_query_until('postgres', 'SELECT count(*) = 0 FROM pg_stat_replication')
  or die 'the walsender did not go away';
$primary->safe_psql('postgres', q{SET synchronous_commit = off; SELECT outbox_emit('sb', 's-1', 'E', '{}')});
ok($primary->poll_query_until('postgres',
	q{SELECT state = 'waiting for standbys' FROM outbox_workers() WHERE worker = 0}),
	'-1: waiting again without the standby');
$primary->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = ''; SELECT pg_reload_conf()});
ok(defined wait_published($primary, 30), '-1: synchronous_standby_names emptied: published');

my $r = $mk->check(topics => ['outbox.event.sb'], expect => { 's-1' => 5 });
is($r->{exit}, 0, 'order checker clean') or diag $r->{output};

$primary->stop;
$mk->stop;
done_testing();
