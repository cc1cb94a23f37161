# Fault: the publisher dies abruptly under load.
#
#  - SIGKILL of the publisher worker caught inside a batch (producing,
#    awaiting acknowledgements or marking), several times; the postmaster
#    then does a crash restart (restart_after_crash = on), which also ends
#    every emitter session: the emitters reconnect and carry on.
#  - PostgreSQL stopped with -m immediate and started again, twice.
#
# Nothing is marked before Kafka acknowledged it, so a crash means re-sends
# (duplicates), never loss or reordering.  A 20 ms broker round trip keeps
# requests in flight, so that a kill lands with acknowledgements
# outstanding.
#
# recover_s: from the last restart (server accepting connections again)
# until every event committed before it was published.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $kills = $ENV{OUTBOX_FAULT_KILLS} // 5;
my $restarts = $ENV{OUTBOX_FAULT_RESTARTS} // 2;

my %conf = fault_conf();
my ($node, $mk) = outbox_setup('crash', brokers => 3, %conf);
note "kafka_properties: " . ($conf{kafka_properties} // '(default)');
$node->append_conf('postgresql.conf', "restart_after_crash = on\n");
quiet_statements($node);
install_phase_probe($node);
$mk->cmd('rtt all 20');

my $t_start = time;
my $load = start_load($node, clients => 4, events_per_tx => 5,
	aggregates => 1000, rate => 200, resilient => 1, chunk_s => 3, until_id => 2000);

# Aim the kills at each phase of a batch in turn; a phase not caught
# within 3 s falls back to any phase of a batch (within 30 s).
my @aim = (['awaiting acknowledgements'], ['marking published'], ['producing']);
my %phases;
for my $i (1 .. $kills)
{
	my ($phase, $pid) = kill_publisher_in_batch($node, 3000, $aim[($i - 1) % @aim]);
	($phase, $pid) = kill_publisher_in_batch($node, 30000) unless defined $phase;
	ok(defined $phase, "kill $i: publisher caught inside a batch and killed")
	  or next;
	$phases{$phase}++;
	my $back = wait_publisher($node, 1, 120, [$pid]);
	ok(defined $back, "kill $i: crash restart brought the publisher back");
	note sprintf "kill %d: SIGKILL of pid %d while \"%s\"; new publisher after %.2f s",
	  $i, $pid, $phase, $back // -1;
	sleep 1.5;
}
note 'phases at the kills: ' . join ', ', map { "$_ x$phases{$_}" } sort keys %phases;
my $log = slurp_file($node->logfile);
my $crashes = () = $log =~ /background worker "outbox publisher" \(PID \d+\) was terminated by signal 9/g;
is($crashes, $kills, 'each SIGKILL was seen by the postmaster');
my $reinit = () = $log =~ /all server processes terminated; reinitializing/g;
is($reinit, $kills, 'each SIGKILL caused a crash restart');

my $recover = immediate_restarts($node, $restarts, down_s => 0.5, backlog_s => 180);

# However slowly the machine goes, the emitters carry on until there is a
# substantial load (bounded).
my $t0 = time;
sleep 0.5 while max_id($node) < 10000 && time - $t0 < 180;
ok(stop_load($load, 300), 'emitters stopped');
ok(defined wait_published($node, 180), 'nothing pending after the load');
cmp_ok(max_id($node), '>=', 10000, 'a substantial load was emitted across the crashes');
my $aborted = () = slurp_file($load->{log}) =~ /pgbench exit [^0]/g;
note "emitter runs ended by a crash or restart: $aborted";

db_versions_contiguous($node, 'crash');
my $r = verdict($mk, $node, 'crash_restart', recover_s => $recover);
note sprintf "all done %.1f s after the start; counters (since the last restart): %s",
  time - $t_start,
  $node->safe_psql('postgres',
	q{SELECT string_agg(name || '=' || value, ' ') FROM outbox_counters()
	   WHERE value <> 0});

$node->stop;
$mk->stop;
done_testing();
