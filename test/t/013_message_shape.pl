# What a record looks like to a consumer, on the mock cluster: see
# test/perl/MessageShape.pm (208 runs the same on a real Kafka cluster).
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

use MessageShape;
use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('shape', max_seconds => 600,
	mock_cmds => [ 'topic_create outbox.event.order 3 1', 'topic_create outbox.event.json 1 1',
		'topic_create outbox.event.numbers 1 1' ]);

check_message_shape($node, $mk->bootstrap);

# The publisher writes a JSON payload's text itself (src/publish_read.c):
# byte for byte what jsonb_out() gives, for every kind of value, escapes,
# nesting and raw scalars.  One aggregate on one partition: the records in
# offset order are the events in version order.
my @json = (
	'{"total": 10}', '{}', '[]', 'null', 'true', 'false', '42', '-3.140', '1e3',
	'"a raw \\"string\\" \\\\ with escapes"',
	'[1, "a", null, true, false, 1.50, -0.0001, 12345678901234567890.123, [], {}]',
	'{"s": "quote \\" backslash \\\\ slash / ctrl \\u0001\\u001f \\b\\f\\n\\r\\t é 😀 end"}',
	'{"k\\"ey\\n": 1, "": "", "a": {"b": [1, {"c": []}], "d": {}}, "e": [[], [[1]], {"f": "g"}]}',
	'{"long": "' . ('plain text ' x 50) . '\\t' . ('more ' x 50) . '"}');
$node->safe_psql('postgres', join '',
	map { "SELECT outbox_emit('json', 'j-1', 'Json', \$j\$$_\$j\$::jsonb);\n" } @json);
ok(defined wait_published($node, 60), 'JSON payloads of every kind published');
my $db = $node->safe_psql('postgres',
	q{SELECT payload::text FROM outbox WHERE aggregate_id = 'j-1' ORDER BY aggregate_version});
my ($values, $kerr) = ('', '');
IPC::Run::run([ 'kcat', '-C', '-b', $mk->bootstrap, '-t', 'outbox.event.json', '-e', '-q',
				'-f', '%s\n' ], '>', \$values, '2>', \$kerr, IPC::Run::timeout(60));
chomp $values;
is($values, $db, 'each JSON payload is sent as jsonb_out() writes it, byte for byte')
  or diag $kerr;

# Numbers, each the first event of its own aggregate in one transaction:
# read from the heap (an aggregate's later events in the same batch are
# read by index, their text written by jsonb_out() itself), so that every
# one goes through the publisher's own writing of numbers.
my @numbers = ('0', '-0', '7', '-7', '9999', '10000', '-10000', '10001', '99990000',
	'100000000', '1e8', '2E+4', '1.0', '5e-1', '0.0', '-0.5', '123456789012345678901234567890',
	'-98765432109876543210000000000000', '1000000000000000000000000000000000000000',
	'{"n": 42, "m": [-1, 10000.00, 3]}');
$node->safe_psql('postgres', 'BEGIN;'
	  . join('', map { "SELECT outbox_emit('numbers', 'n-$_', 'Number', \$j\$$numbers[$_]\$j\$::jsonb);" }
		0 .. $#numbers)
	  . 'COMMIT;');
ok(defined wait_published($node, 60), 'number payloads published');
$db = $node->safe_psql('postgres',
	q{SELECT payload::text FROM outbox WHERE aggregate_type = 'numbers' ORDER BY payload::text});
IPC::Run::run([ 'kcat', '-C', '-b', $mk->bootstrap, '-t', 'outbox.event.numbers', '-e', '-q',
				'-f', '%s\n' ], '>', \$values, '2>', \$kerr, IPC::Run::timeout(60));
is(join("\n", sort split /\n/, $values), join("\n", sort split /\n/, $db),
	'each number is sent as jsonb_out() writes it') or diag $kerr;

$node->stop;
$mk->stop;
done_testing();
