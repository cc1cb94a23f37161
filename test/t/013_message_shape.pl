# What a record looks like to a consumer, on the mock cluster: see
# test/perl/MessageShape.pm (208 runs the same on a real Kafka cluster).
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MessageShape;
use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
mkdir "$dir/mock13";
my $mk = MockKafka->start(dir => "$dir/mock13", brokers => 1, max_seconds => 600);
$mk->cmd('topic_create outbox.event.order 3 1');
my $node = outbox_node('shape', $mk);

check_message_shape($node, $mk->bootstrap);

$node->stop;
$mk->stop;
done_testing();
