# Fault: emitters commit with synchronous_commit = off and the server
# crashes under load, again and again.
#
# An asynchronous commit is visible before its commit record is on disk; a
# crash takes it back, and its aggregate's version then goes to another
# event.  The publisher must publish only durable commits (it flushes the
# WAL up to what its batch can see before producing), or Kafka holds, at
# some (aggregate, version), an event the database never kept: the order
# checker's --events comparison counts each as "mismatched".
#
# The WAL writer is slowed down (10 s, 128 MB) so that asynchronous commits
# stay unflushed long enough for the publisher to see them; the crashes are
# SIGKILLs of an emitting backend (a crash restart) and pg_ctl -m immediate.
#
# recover_s: from the last restart until every event committed before it
# was published.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $kills = $ENV{OUTBOX_FAULT_KILLS} // 3;
my $restarts = $ENV{OUTBOX_FAULT_RESTARTS} // 3;

my ($node, $mk) = outbox_setup('async', brokers => 3, fault_conf());
$node->append_conf('postgresql.conf', q{
restart_after_crash = on
synchronous_commit = off
wal_writer_delay = 10s
wal_writer_flush_after = 128MB
wal_buffers = 16MB
});
$node->restart;
quiet_statements($node);

my $t_start = time;
my $load = start_load($node, clients => 4, events_per_tx => 2,
	aggregates => 200, rate => 300, resilient => 1, chunk_s => 3,
	until_id => 1000, within_s => 20);

# Emitting backends: SIGKILL one, the postmaster restarts everything.
for my $i (1 .. $kills)
{
	sleep 2;
	my $pid = $node->safe_psql('postgres',
		q{SELECT pid FROM pg_stat_activity
		   WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() LIMIT 1});
	ok($pid =~ /^\d+$/, "kill $i: an emitting backend found") or next;
	my $crashes = () = slurp_file($node->logfile) =~ /all server processes terminated; reinitializing/g;
	my $before = max_id($node);
	# Wait for the crash restart to begin, then for the publisher.  The
	# load reconnects every few seconds, so the backend found may have
	# exited before the signal: then kill another one (bounded).
	for my $try (1 .. 5)
	{
		kill 'KILL', $pid;
		my $t0 = time;
		sleep 0.05 while time - $t0 < 10
		  && (() = slurp_file($node->logfile) =~ /all server processes terminated; reinitializing/g) == $crashes;
		last if (() = slurp_file($node->logfile) =~ /all server processes terminated; reinitializing/g) > $crashes;
		$pid = $node->safe_psql('postgres',
			q{SELECT pid FROM pg_stat_activity
			   WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() LIMIT 1});
		last unless $pid =~ /^\d+$/;
	}
	ok(defined wait_publisher($node, 1, 60), "kill $i: crash restart brought the publisher back");
	note sprintf "kill %d: SIGKILL of emitter %d; ids %d before, %d after recovery",
	  $i, $pid, $before, max_id($node);
}
my $log = slurp_file($node->logfile);
my $reinit = () = $log =~ /all server processes terminated; reinitializing/g;
is($reinit, $kills, 'each SIGKILL caused a crash restart');

my $recover = immediate_restarts($node, $restarts, every_s => 2, timeout => 60);

ok(stop_load($load, 60), 'emitters stopped');
ok(defined wait_published($node, 60), 'nothing pending after the load');

db_versions_contiguous($node, 'async commit');
verdict($mk, $node, 'async_commit_crash', recover_s => $recover);
note_counters($node, $t_start);

$node->stop;
$mk->stop;
done_testing();
