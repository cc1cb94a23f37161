# What a record looks like to a consumer, on the mock cluster: see
# test/perl/MessageShape.pm (208 runs the same on a real Kafka cluster).
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MessageShape;
use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('shape', max_seconds => 600,
	mock_cmds => [ 'topic_create outbox.event.order 3 1' ]);

check_message_shape($node, $mk->bootstrap);

$node->stop;
$mk->stop;
done_testing();
