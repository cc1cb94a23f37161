# The inbox consumers' Kafka settings follow the publisher's rules: a
# secret in outbox.inbox_kafka_properties is refused (on reload and by
# ALTER SYSTEM) without being repeated, so it never reaches the server log;
# secrets come from a credentials file (outbox.inbox_kafka_credentials_file,
# else outbox.kafka_credentials_file), checked like ssl_key_file, applied to
# the consumers (a changed file recreates them) and never echoed; both
# settings are hidden from roles that may not read all settings.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'outbox.event.secrets';
my ($node, $mk) = inbox_setup('inbox_secrets', topics => ["$topic:1"], max_seconds => 600);
setup_consumer($node, 'billing', $topic);
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false');
my $creds = $node->data_dir . '/inbox_credentials';
my $pub_creds = $node->data_dir . '/kafka_credentials';
my $emitted = 0;

my $log_offset = -s $node->logfile;

# Wait (bounded) until the log since $log_offset matches.
sub wait_log
{
	my ($re, $timeout) = @_;
	my $log;

	wait_until(sub { ($log = slurp_file($node->logfile, $log_offset)) =~ $re }, $timeout // 60);
	return $log;
}

sub emit_applied
{
	my ($n, $what) = @_;
	$node->safe_psql('postgres', qq{SELECT outbox_emit('sec', 's', 'E', '{}', topic => '$topic') FROM generate_series(1, $n)});
	$emitted += $n;
	ok(defined wait_applied($node, $emitted, 60), $what);
}

sub wait_for
{
	my ($query, $what) = @_;
	ok($node->poll_query_until('consumer', $query), $what)
	  or diag $node->safe_psql('consumer', 'SELECT * FROM inbox_status');
}

# Write a working credentials file $file ($text, mode 0600) and reload: the
# consumers run again ($running) and apply ($applied).
sub fixed_by_file
{
	my ($file, $text, $running, $applied) = @_;
	write_file_mode($file, $text, 0600);
	$node->reload;
	wait_for(q{SELECT bool_and(state = 'running' AND kafka_error IS NULL) FROM inbox_status},
		$running);
	emit_applied(5, $applied);
}

emit_applied(5, 'the consumer applies events');
my $props = $node->safe_psql('consumer', 'SHOW outbox.inbox_kafka_properties');

# 1. A secret in the properties: refused, not repeated.
reload_with($node, q{outbox.inbox_kafka_properties = 'fetch.wait.max.ms=100;sasl.password=Marker1Secret'});
ok($node->poll_query_until('consumer', q{SELECT count(*) > 0 FROM pg_file_settings
	WHERE name = 'outbox.inbox_kafka_properties' AND error IS NOT NULL}), 'a secret is refused on reload');
wait_log(qr/is a secret/);
is($node->safe_psql('consumer', 'SHOW outbox.inbox_kafka_properties'), $props, 'and not applied');
my ($rc, $out, $err) = $node->psql('consumer',
	q{ALTER SYSTEM SET outbox.inbox_kafka_properties = 'sasl.password=Marker3Secret'});
like($err, qr/Property "sasl.password" is a secret: put it in the file named by outbox.inbox_kafka_credentials_file/,
	'ALTER SYSTEM: the secret is refused, naming the key and the file setting');
unlike($err, qr/Marker3/, 'the error does not repeat the value');
($rc, $out, $err) = $node->psql('consumer',
	q{ALTER SYSTEM SET outbox.inbox_kafka_properties = 'fetch.wait.max.ms=Marker4Value'});
like($err, qr/fetch.wait.max.ms/, 'a bad value: the key is named');
unlike($err, qr/Marker4/, 'the value is not repeated');
($rc, $out, $err) = $node->psql('consumer',
	q{ALTER SYSTEM SET outbox.inbox_kafka_properties = 'group.instance.id=Marker5Value'});
like($err, qr/Property "group.instance.id" is set by the inbox worker/, 'the static membership is the worker\'s');
reload_with($node, qq{outbox.inbox_kafka_properties = '$props'});
my $log = wait_log(qr/invalid value for parameter "outbox.inbox_kafka_properties"/);
like($log, qr/invalid value for parameter "outbox.inbox_kafka_properties"/, 'the reload logged the refusal');

# 2. Hidden from roles that may not read all settings.
for my $setting ('outbox.inbox_kafka_properties', 'outbox.inbox_kafka_credentials_file')
{
	($rc, $out, $err) = $node->psql('consumer', "SET ROLE app; SHOW $setting");
	like($err, qr/pg_read_all_settings/, "$setting is hidden from an application role");
}

# 3. The consumers' credentials file: checked like ssl_key_file.
write_file_mode($creds, "sasl.password=Marker6Secret\n", 0644);
reload_with($node, qq{outbox.inbox_kafka_credentials_file = '$creds'});
$log = wait_log(qr/has group or world access/);
like($log, qr/has group or world access/, 'a world-readable credentials file is refused');
is($node->safe_psql('consumer', 'SHOW outbox.inbox_kafka_credentials_file'), '', 'and not applied');

# Applied to the consumers: TLS against the plaintext mock fails, which
# inbox_status shows.
write_file_mode($creds, "# consumer secrets\nsecurity.protocol=ssl\nsasl.password=Marker7Secret\n", 0600);
$node->reload;
ok($node->poll_query_until('consumer', qq{SELECT current_setting('outbox.inbox_kafka_credentials_file') = '$creds'}),
	'a credentials file with mode 0600 is accepted');
wait_for(q{SELECT bool_and(kafka_error IS NOT NULL AND state IN ('error', 'disconnected')) FROM inbox_status},
	'the file reached the consumer: TLS to a plaintext broker fails, shown in inbox_status');
like(wait_log(qr/recreating the consumers/), qr/Kafka settings changed, recreating the consumers/,
	'a changed credentials file recreates the consumers');

fixed_by_file($creds, "sasl.password=Marker8Secret\nclient.id=inbox-creds-test\n",
	'the file fixed: running again', 'and applying');

# A key the worker owns, in the file: refused, named without its value.
write_file_mode($creds, "group.id=Marker9Value\n", 0600);
$node->reload;
like(wait_log(qr/Property "group.id" is set by the inbox worker/),
	qr/Property "group.id" is set by the inbox worker/, 'group.id in the file is refused');

# 4. Without a file of its own the inbox reads the publisher's.
write_file_mode($pub_creds, "security.protocol=ssl\nsasl.password=Marker10Secret\n", 0600);
reload_with($node, qq{outbox.inbox_kafka_credentials_file = ''\noutbox.kafka_credentials_file = '$pub_creds'});
wait_for(q{SELECT bool_and(kafka_error IS NOT NULL) FROM inbox_status},
	'the inbox applies outbox.kafka_credentials_file when it has no file of its own');
fixed_by_file($pub_creds, "sasl.password=Marker11Secret\n", 'fixed: running',
	'everything applied');

# 5. Nothing of it in the log.
$log = slurp_file($node->logfile, $log_offset);
my @leaks = grep { /Marker/ && !/STATEMENT:|statement:/ } split /\n/, $log;
is(scalar @leaks, 0, 'no secret or value in the server log outside the SQL statements themselves')
  or diag join "\n", @leaks;
unlike($log, qr/^%\d\|/m, 'no librdkafka line went to stderr');

$node->stop;
$mk->stop;
done_testing();
