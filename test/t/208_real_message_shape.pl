# What a record looks like to a consumer, on a real Kafka 3.9 cluster
# (RF 3): see test/perl/MessageShape.pm (013 runs the same on the mock).
# A real broker keeps the producer's CreateTime and the headers as sent.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MessageShape;
use OutboxTest;
use RealKafka;
use RealTest;

my ($node, $rk) = outbox_setup('real_shape', kafka => 'real',
	topics => ['outbox.event.order:3']);

check_message_shape($node, $rk->bootstrap);

$node->stop;
$rk->stop;
done_testing();
