# Fault: a fatal producer error (librdkafka's rd_kafka_test_fatal_error(),
# raised by the publisher's test hook right after it produced a batch),
# several times under load.  The worker must log "fatal Kafka producer
# error, recreating the producer", build a new producer (counter
# producer_creations), and lose or reorder nothing: a fatal error purges
# the producer's queue, the batch marks only its acknowledged prefix and
# the new producer resends the rest.
#
# The hook fires right after a batch was handed to librdkafka, when most of
# a small batch is still queued.  So every other round first commits a
# burst of 5,000 events and sets the hook in the next statement: the batch
# that takes the burst is still producing when the flag is set, and with a
# 10 ms broker round trip its first requests are in flight when the fatal
# error strikes.
#
# recover_s: from a fatal error's new producer until every event committed
# before it was published; the longest of the rounds.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $n_fatal = $ENV{OUTBOX_FAULT_FATALS} // 5;

my %conf = (fault_conf(), enable_test_hooks => 'on');
my ($node, $mk) = outbox_setup('fatal', brokers => 3, %conf);
note "kafka_properties: " . ($conf{kafka_properties} // '(default)');
quiet_statements($node);
$mk->cmd('rtt all 10');

my $t_start = time;
my $load = start_load($node, clients => 4, transactions => 1000,
	events_per_tx => 5, aggregates => 1000, rate => 300);
sleep 0.2 while max_id($node) < 2000 && time - $t_start < 120;

my $creations0 = counter($node, 'producer_creations');
my $recover = 0;
for my $i (1 .. $n_fatal)
{
	my $before = counter($node, 'producer_creations');
	my $burst = $i % 2 == 0;
	# The hook fires in the next batch that has events: arm it, then emit
	# some, so that it fires even if the load has already ended.
	my $n = $burst ? 5000 : 20;
	$node->safe_psql('postgres', qq{
		SELECT outbox_test_fatal_error();
		SELECT count(*) FROM (SELECT outbox_emit('load', 'burst-' || (i % 50), 'Burst',
			jsonb_build_object('i', i)) FROM generate_series(1, $n) i) s;
	});
	my $t0 = time;
	sleep 0.02 while counter($node, 'producer_creations') == $before && time - $t0 < 120;
	my $t_new = time;
	my $backlog = max_id($node);
	cmp_ok(counter($node, 'producer_creations'), '>', $before,
		"fatal error $i: the producer was recreated");
	my $t = wait_backlog($node, $backlog, 180);
	ok(defined $t, "fatal error $i: caught up");
	$t = time - $t_new if defined $t;
	$recover = $t if defined $t && $t > $recover;
	note sprintf "fatal error %d%s: new producer after %.2f s; backlog up to id %d published %.2f s later",
	  $i, $burst ? ' (burst)' : '', $t_new - $t0, $backlog, $t // -1;
	sleep 1;
}
is(counter($node, 'delivery_errors_fatal'), $n_fatal, 'each fatal producer error is counted');
ok(stop_load($load, 300), 'emitters finished without errors');
ok(defined wait_published($node, 180), 'nothing pending after the load');

my $log = slurp_file($node->logfile);
my $raised = () = $log =~ /outbox: test hook: raising a fatal producer error/g;
my $recreated = () = $log =~ /outbox: fatal Kafka producer error, recreating the producer/g;
is($raised, $n_fatal, 'the hook raised one fatal error per call');
is($recreated, $n_fatal, 'each fatal error was logged: "fatal Kafka producer error, recreating the producer"');
is(counter($node, 'producer_creations') - $creations0, $n_fatal,
	'producer_creations increased by one per fatal error');
my ($detail) = $log =~ /recreating the producer\n[^\n]*DETAIL:\s+([^\n]*)/;
note "first DETAIL: " . ($detail // '(none)');
unlike($log, qr/was acknowledged although version/, 'no order violation reported by the worker');

db_versions_contiguous($node, 'fatal error');
my $r = verdict($mk, $node, 'fatal_error', recover_s => $recover);
note_counters($node, $t_start);

$node->stop;
$mk->stop;
done_testing();
