# Real Kafka over SASL_PLAINTEXT: the publisher logs in with SCRAM-SHA-256,
# then (after a reload) with PLAIN, and publishes.  Then a wrong password:
# publishing stops, the state must be visible and logged once, and it
# resumes once the password is fixed.  No password may appear in the server
# log.  Credentials reach the publisher through RealKafka::outbox_conf, the
# one place to change when they move out of outbox.kafka_properties.
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
my $rk = real_cluster(sasl => 1, topics => ["$topic:4"]);
my $node = outbox_node('real_sasl', $rk, $rk->outbox_conf(sasl => 'SCRAM-SHA-256'));
quiet_statements($node);

# Point the publisher at the cluster with other credentials (a reload).
sub login
{
	my (%a) = @_;
	my %c = $rk->outbox_conf(%a);
	$node->append_conf('postgresql.conf', "outbox.$_ = '$c{$_}'\n") for sort keys %c;
	$node->reload;
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
login(sasl => 'SCRAM-SHA-256', password => $wrong);
sleep 1;
my $published = counter($node, 'events_published');
my $log_offset = -s $node->logfile;
emit_load($node, clients => 2, transactions => 100, aggregates => 50, events_per_tx => 2);
sleep 12;
is(counter($node, 'events_published'), $published, 'wrong password: nothing is published');
my $status = $node->safe_psql('postgres',
	q{SELECT pending_events > 0, workers FROM outbox_status});
note "outbox_status with a wrong password: $status";
my $log = substr(slurp_file($node->logfile), $log_offset);
my @auth = grep { /outbox/ && /SASL|[Aa]uthenticat/ } split /\n/, $log;
note "log lines about the authentication failure: " . scalar(@auth);
note "  $_" for @auth[ 0 .. ($#auth < 4 ? $#auth : 4) ];
TODO:
{
	local $TODO = 'publisher: a failed login shows in outbox_status only as aggregates awaiting Kafka; librdkafka logs every failed attempt';
	like($status, qr/auth/i, 'outbox_status names the authentication failure');
	is(scalar(@auth), 1, 'one LOG line about the authentication failure');
}

my $t_fix = time;
login(sasl => 'SCRAM-SHA-256');
my $recover = wait_published($node, 90);
ok(defined $recover, 'right password again: the backlog is published');
$recover = time - $t_fix if defined $recover;
note sprintf "published %.2f s after the reload with the right password", $recover // -1;

# The publisher's and librdkafka's lines never show a password; PostgreSQL
# itself logs a reloaded outbox.kafka_properties with its value (TODO until
# credentials live in a file).
my $all = slurp_file($node->logfile);
my @reload_lines = grep { /parameter "outbox.kafka_properties" changed to/ } split /\n/, $all;
my $others = join "\n", grep { !/parameter "outbox.kafka_properties" changed to/ } split /\n/, $all;
for my $pw ($wrong, 'scram-secret', 'plain-secret')
{
	unlike($others, qr/\Q$pw\E/, "the password \"$pw\" is in no line of the publisher or librdkafka");
}
TODO:
{
	local $TODO = 'credentials in outbox.kafka_properties: PostgreSQL logs the new value on reload';
	is(scalar(grep { /sasl\.password=/ } @reload_lines), 0,
		'no "parameter changed" line shows a password');
}

db_versions_contiguous($node, 'sasl');
real_verdict($rk, $node, 'sasl', topics => [$topic], recover_s => $recover,
	sasl => 'PLAIN');
note_counters($node, $t_start);

$node->stop;
$rk->stop;
done_testing();
