# Real Kafka over SASL_PLAINTEXT: the publisher logs in with SCRAM-SHA-256,
# then (after a reload) with PLAIN, and publishes.  Then a wrong password:
# publishing stops, the state must be visible and logged once, and it
# resumes once the password is fixed.  No password may appear in the server
# log.  Credentials reach the publisher through RealKafka::outbox_conf (a
# file named by outbox.kafka_credentials_file), the one place that knows how.
#
# recover_s: from the reload with the right password until everything
# emitted meanwhile was published.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use OutboxTest;
use RealKafka;
use RealTest;

my $topic = 'outbox.event.load';
my $wrong = 'not-the-password-4711';
my ($node, $rk) = outbox_setup('real_sasl', kafka => 'real', sasl => 'SCRAM-SHA-256',
	topics => ["$topic:4"]);
quiet_statements($node);

# Point the publisher at the cluster with other credentials (a reload).
sub login
{
	my (%a) = @_;
	my %c = $rk->outbox_conf(%a);
	my $changes = () = slurp_file($node->logfile) =~ /Kafka settings changed, recreating the producer/g;
	$node->append_conf('postgresql.conf', "outbox.$_ = '$c{$_}'\n") for sort keys %c;
	$node->reload;
	# The worker takes the new settings when it gets to it: wait (bounded)
	# for it to say so rather than for a fixed time.
	my $t0 = time;
	sleep 0.1 while (() = slurp_file($node->logfile) =~ /Kafka settings changed, recreating the producer/g) == $changes
	  && time - $t0 < 60;
}

my $t_start = time;
emit_load($node, clients => 2, transactions => 200, aggregates => 100, events_per_tx => 2);
ok(defined wait_published($node, 60), 'SCRAM-SHA-256: published');
my $r = $rk->check(topics => [$topic], sasl => 'SCRAM-SHA-256',
	expect => expect_file($node, "$PostgreSQL::Test::Utils::tmp_check/exp_scram"));
is($r->{exit}, 0, 'SCRAM-SHA-256: order checker (reading over SASL) clean') or diag $r->{output};

login(sasl => 'PLAIN');
sleep 1;
emit_load($node, clients => 2, transactions => 200, aggregates => 100, events_per_tx => 2);
ok(defined wait_published($node, 60), 'PLAIN: published after a reload');
ok($node->log_contains('Kafka settings changed, recreating the producer'), 'the reload recreated the producer');

# A wrong password: nothing can be published.
my $log_offset = -s $node->logfile;
login(sasl => 'SCRAM-SHA-256', password => $wrong);
sleep 1;
my $published = counter($node, 'events_published');
emit_load($node, clients => 2, transactions => 100, aggregates => 50, events_per_tx => 2);
sleep 12;
is(counter($node, 'events_published'), $published, 'wrong password: nothing is published');
my $status = $node->safe_psql('postgres', q{SELECT s::text FROM outbox_status s});
note "outbox_status with a wrong password: $status";
like($status, qr/authentication with the brokers failed/, 'outbox_status names the authentication failure');
my $log = substr(slurp_file($node->logfile), $log_offset);
my $started = () = $log =~ /LOG:  outbox: Kafka: authentication with the brokers failed/g;
cmp_ok($started, '>=', 1, 'a LOG line says that authentication failed');
# librdkafka follows each failed login with _ALL_BROKERS_DOWN: that must not
# replace the cause, or the next failed login would log it again.
is($started, 1, 'one LOG line says that authentication failed');
my @rdk = grep { /outbox: librdkafka: .*SASL authentication/ } split /\n/, $log;
note "librdkafka's own lines about the failed logins: " . scalar(@rdk);

my $t_fix = time;
login(sasl => 'SCRAM-SHA-256');
my $recover = wait_published($node, 90);
ok(defined $recover, 'right password again: the backlog is published');
$recover = time - $t_fix if defined $recover;
note sprintf "published %.2f s after the reload with the right password", $recover // -1;

ok($node->log_contains('outbox: Kafka is reachable again'), 'the recovery is logged');
my $all = slurp_file($node->logfile);
for my $pw ($wrong, 'scram-secret', 'plain-secret')
{
	unlike($all, qr/\Q$pw\E/, "the password \"$pw\" appears nowhere in the server log");
}

db_versions_contiguous($node, 'sasl');
real_verdict($rk, $node, 'sasl', topics => [$topic], recover_s => $recover,
	sasl => 'PLAIN');
note_counters($node, $t_start);

$node->stop;
$rk->stop;
done_testing();
