# The Kafka settings on a running publisher: secrets never reach the server
# log or an error; the credentials file is checked like ssl_key_file and
# applied to the producer; a producer that cannot be created, and brokers
# that are down, are logged once and shown in outbox_status and
# outbox_workers(); librdkafka's own lines go through the server log.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('kafkaset');
my $creds = $node->data_dir . '/kafka_credentials';

# Poll a query until it returns 't'.
sub wait_for
{
	my ($query, $what) = @_;
	ok($node->poll_query_until('postgres', $query), $what);
}

my $log_offset = -s $node->logfile;
sub new_log
{
	my $log = slurp_file($node->logfile, $log_offset);
	return $log;
}

# Wait (bounded) until the log since $log_offset matches: a reload is
# processed when the server gets to it, not within a fixed time.
sub wait_log
{
	my ($re, $timeout) = @_;
	my $t0 = time;
	sleep 0.1 while new_log() !~ $re && time - $t0 < ($timeout // 60);
	return new_log();
}

# 1. A secret in outbox.kafka_properties is refused on reload without
# being repeated; so is a bad value.
reload_with($node, q{outbox.kafka_properties = 'linger.ms=2;sasl.password=Marker1Secret'});
wait_for(q{SELECT count(*) > 0 FROM pg_file_settings
	WHERE name = 'outbox.kafka_properties' AND error IS NOT NULL}, 'the secret is refused on reload');
reload_with($node, q{outbox.kafka_properties = 'linger.ms=Marker2Value'});
sleep 1;
my ($rc, $out, $err) = $node->psql('postgres',
	q{ALTER SYSTEM SET outbox.kafka_properties = 'sasl.password=Marker3Secret'});
like($err, qr/Property "sasl.password" is a secret/, 'ALTER SYSTEM: the secret is refused, naming the key');
unlike($err, qr/Marker3/, 'the error does not repeat the value');
($rc, $out, $err) = $node->psql('postgres',
	q{ALTER SYSTEM SET outbox.kafka_properties = 'compression.codec=Marker4Value'});
unlike($err, qr/Marker4/, 'an invalid value is not repeated in the error');
like($err, qr/compression.codec/, 'the key is named');
reload_with($node, q{outbox.kafka_properties = ''});
sleep 1;
my $log = new_log();
like($log, qr/invalid value for parameter "outbox.kafka_properties"/, 'the reload logged the refusal');
like($log, qr/is a secret/, 'saying why');
# The SQL statements themselves are logged by PostgreSQL (log_statement,
# log_min_error_statement), like any SQL: the server log must have no
# Marker but in those lines.
my @leaks = grep { /Marker/ && !/STATEMENT:|statement:/ } split /\n/, $log;
is(scalar @leaks, 0, 'no marker in the server log outside the SQL statements themselves')
  or diag join "\n", @leaks;

# 2. The credentials file: checked like ssl_key_file, never echoed.
write_file_mode($creds, "sasl.password=Marker5Secret\n", 0644);
reload_with($node, qq{outbox.kafka_credentials_file = '$creds'});
$log = wait_log(qr/has group or world access/);
like($log, qr/has group or world access/, 'a world-readable credentials file is refused');
is($node->safe_psql('postgres', 'SHOW outbox.kafka_credentials_file'), '', 'and not applied');

# Applied at producer creation: security.protocol=ssl against the plaintext
# mock stops publishing, and the reason shows.
write_file_mode($creds, "# test\nsecurity.protocol=ssl\nsasl.password=Marker6Secret\n", 0600);
$node->reload;
wait_for(qq{SELECT current_setting('outbox.kafka_credentials_file') = '$creds'},
	'a credentials file with mode 0600 is accepted');
$node->safe_psql('postgres', q{SELECT outbox_emit('order', 'c-1', 'E', '{}')});
wait_for(q{SELECT bool_and(problem IS NOT NULL) FROM outbox_workers()},
	'the file was applied: TLS to a plaintext broker fails, shown in outbox_workers()');
is($node->safe_psql('postgres', 'SELECT publisher FROM outbox_status'), 'failing',
	'outbox_status: failing');
note 'problem: ' . $node->safe_psql('postgres', 'SELECT problem FROM outbox_workers()');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox_pending}), '1',
	'the event waits');

write_file_mode($creds, "sasl.password=Marker7Secret\nclient.id=outbox-creds-test\n", 0600);
$node->reload;
ok(defined wait_published($node, 120), 'with the file fixed, the event is published');
wait_for(q{SELECT bool_and(problem IS NULL) FROM outbox_workers()}, 'and the problem clears');
$log = new_log();
like($log, qr/Kafka settings changed, recreating the producer/, 'a changed file recreates the producer');
like($log, qr/outbox: Kafka is reachable again/, 'the condition\'s end is logged');

# A file that turns bad after it was accepted: the producer cannot be
# created, which is logged once and shown.
write_file_mode($creds, "acks=Marker8Value\n", 0600);
$node->reload;
$node->safe_psql('postgres', q{SELECT outbox_emit('order', 'c-2', 'E', '{}')});
wait_for(q{SELECT bool_and(problem LIKE 'could not create Kafka producer%') FROM outbox_workers()},
	'a producer that cannot be created shows in outbox_workers()');
like($node->safe_psql('postgres', 'SELECT state FROM outbox_workers()'), qr/error/,
	'the worker state is not idle');
like($node->safe_psql('postgres', 'SELECT publisher_detail FROM outbox_status'),
	qr/Property "acks" is set by the publisher/, 'outbox_status says why');
sleep 3;
$log = new_log();
my $n = () = $log =~ /publisher error: could not create Kafka producer/g;
is($n, 1, 'the failure is logged once, not on every retry');
write_file_mode($creds, "client.id=outbox-creds-test\n", 0600);
$node->reload;
ok(defined wait_published($node, 120), 'fixed again: published');

# outbox_emit() checks records against message.max.bytes from the setting,
# never reading the file: the file may not change it.
write_file_mode($creds, "message.max.bytes=2000000\n", 0600);
$node->reload;
like(wait_log(qr/Property "message.max.bytes" belongs in outbox.kafka_properties/),
	qr/Property "message.max.bytes" belongs in outbox.kafka_properties/,
	'message.max.bytes is refused in the credentials file');

# A refused property names the file, its line and its key (never the
# value), and the hint says what the file must look like.
write_file_mode($creds, "# comment\nclient.id=outbox-creds-test\nno.such.property=Marker9Value\n", 0600);
$node->reload;
# The publisher, reloading too, may log the line's error first (with its own
# hint): wait for the configuration's record, the one with the file's hint.
$log = wait_log(qr/Line 3 of "[^"]*": Property "no\.such\.property".*\n(?:.*\n)?.*HINT:  The file holds/);
like($log, qr/DETAIL:  Line 3 of "\Q$creds\E": Property "no\.such\.property": librdkafka refuses its value/,
	'a refused line names the file, the line and the key');
like($log, qr/Line 3 of .*\n(?:.*\n)?.*HINT:  The file holds one librdkafka property per line as key=value/,
	'with a hint saying what the file must hold');
unlike($log, qr/Marker9Value/, 'never the value');
write_file_mode($creds, "client.id=outbox-creds-test\n", 0600);
$node->reload;

# 3. All brokers down: one LOG line when it starts, one when it clears;
# librdkafka's own lines never go to stderr unprefixed.
$log_offset = -s $node->logfile;
reload_with($node, q{outbox.brokers = '127.0.0.1:1'});
$node->safe_psql('postgres', q{SELECT outbox_emit('order', 'c-3', 'E', '{}')});
wait_for(q{SELECT bool_and(problem = 'all brokers are down') FROM outbox_workers()},
	'all brokers down shows in outbox_workers()');
sleep 4;
reload_with($node, qq{outbox.brokers = '@{[ $mk->bootstrap ]}'});
ok(defined wait_published($node, 120), 'brokers back: published');
wait_for(q{SELECT bool_and(problem IS NULL) FROM outbox_workers()}, 'the condition clears');
$log = new_log();
$n = () = $log =~ /LOG:  outbox: Kafka: all brokers are down/g;
is($n, 1, 'all brokers down is logged once');
$n = () = $log =~ /LOG:  outbox: Kafka is reachable again/g;
is($n, 1, 'and its end once');
unlike($log, qr/^%\d\|/m, 'no librdkafka line went to stderr');
unlike($log, qr/Marker[5-8]/, 'no credential or value from the file reached the log');

# 4. A setting changed while a message is in flight: the producer is replaced
# once that message is acknowledged and settled (not sent again), in the
# same turn, before any new read; with nothing else to read the worker goes
# on without a producer until it needs one.
my $pid = $node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox publisher'});
my $creations = counter($node, 'producer_creations');
$mk->cmd('rtt all 1500');
my $batches = counter($node, 'batches');
$node->safe_psql('postgres', q{SELECT outbox_emit('flight', 'c-4', 'E', '{}')});
wait_for("SELECT value > $batches FROM outbox_counters() WHERE name = 'batches'", 'the event is out');
reload_with($node, q{outbox.kafka_properties = 'linger.ms=3'});
my $t0 = time;
ok(defined wait_published($node, 60), 'the event in flight is settled after the reload');
cmp_ok(time - $t0, '<', 10, 'when it is acknowledged (1.5 s round trip), not after a poll or a timeout');
$mk->cmd('rtt all 0');
sleep 1;
is($node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox publisher'}),
	$pid, 'the publisher went on (no crash, no restart)');
$node->safe_psql('postgres', q{SELECT outbox_emit('flight', 'c-4', 'E', '{}')});
ok(defined wait_published($node, 60), 'the next event is published by a new producer');
cmp_ok(counter($node, 'producer_creations'), '>', $creations, 'the producer was recreated');
my $r = $mk->check(topics => ['outbox.event.flight'], expect => { 'c-4' => 2 });
is($r->{exit}, 0, 'both versions in Kafka, in order') or diag $r->{output};
is($r->{duplicates}, 0, 'the event in flight was not sent twice');

$node->stop;
$mk->stop;
done_testing();
