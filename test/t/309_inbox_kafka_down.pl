# Inbox consumers with the brokers unreachable, on the mock: inbox_status
# says so (state disconnected, the condition in kafka_error), the counter
# inbox_kafka_errors moves, the server log names the condition once, in its
# own format (librdkafka's lines go through the server log, never straight
# to stderr); once the brokers are back the state is running again, the
# stale error cleared, and what was emitted meanwhile is applied.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'outbox.event.down';
my ($node, $mk) = inbox_setup('inbox_down', topics => ["$topic:1"], max_seconds => 600);
setup_consumer($node, 'billing', $topic);
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false');

sub kafka_errors
{
	return $node->safe_psql('consumer', q{SELECT value FROM outbox_counters() WHERE name = 'inbox_kafka_errors'});
}

$node->safe_psql('postgres', qq{SELECT outbox_emit('down', 'd', 'E', '{}', topic => '$topic') FROM generate_series(1, 10)});
ok(defined wait_applied($node, 10, 60), 'the first 10 events are applied');
is($node->safe_psql('consumer', q{SELECT state || ' ' || coalesce(kafka_error, 'none') FROM inbox_status}),
	'running none', 'running, no Kafka error');
my $errors = kafka_errors();
my $log_offset = -s $node->logfile;

$mk->cmd('all_down');
ok($node->poll_query_until('consumer', q{SELECT state = 'disconnected' FROM inbox_status}),
	'with the brokers down, inbox_status says disconnected')
  or diag $node->safe_psql('consumer', 'SELECT * FROM inbox_status');
is($node->safe_psql('consumer', q{SELECT kafka_error || ' ' || (kafka_error_since IS NOT NULL) FROM inbox_status}),
	'all brokers are down true', 'kafka_error names the condition and since when');
cmp_ok(kafka_errors(), '>', $errors, 'counter inbox_kafka_errors moved');
ok($node->log_contains(qr/outbox inbox worker 0: consumer "billing": Kafka: all brokers are down/, $log_offset),
	'the server log names the condition');
$node->safe_psql('postgres', qq{SELECT outbox_emit('down', 'd', 'E', '{}', topic => '$topic') FROM generate_series(1, 5)});
sleep 3;
my $log = slurp_file($node->logfile, $log_offset);
unlike($log, qr/^%\d\|\d+\.\d+\|/m, 'no librdkafka line written straight to stderr');
my @said = $log =~ /consumer "billing": Kafka: all brokers are down/g;
cmp_ok(scalar @said, '<=', 2, 'the condition is logged once (per consumer start), not at each retry');

$mk->cmd('all_up');
ok($node->poll_query_until('consumer', q{SELECT state = 'running' AND kafka_error IS NULL FROM inbox_status}),
	'brokers back: running again, the stale error cleared')
  or diag $node->safe_psql('consumer', 'SELECT * FROM inbox_status');
ok(defined wait_applied($node, 15, 120), 'the events emitted meanwhile are applied');
ok($node->log_contains(qr/consumer "billing": Kafka is reachable again/, $log_offset),
	'the server log says the condition cleared');

$node->stop;
$mk->stop;
done_testing();
