# Late delivery reports are served promptly while the worker is idle.
#
# With all brokers down a batch's messages stay out; after
# outbox.delivery_timeout its aggregates show as stalled until librdkafka
# reports those messages.  When
# the brokers come back, the reports arrive while the worker idles; it must
# serve them (and publish the stalled aggregates) at once, not at its next
# poll: here outbox.poll_interval is 10 minutes and nothing else wakes it.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('late', poll_interval => '10min', delivery_timeout => '1s');
ok(defined wait_publisher($node, 1, 60), 'publisher running');

stall_aggregates($node, $mk, 'late', 20);
my $t_up = time;
$mk->cmd('all_up');
my $took = wait_published($node, 60);
ok(defined $took, 'stalled aggregates published without waiting for the poll interval');
note sprintf 'FIGURES scenario=late_reports published_s_after_brokers_up=%.2f', time - $t_up;
is(counter($node, 'polls'), '0', 'no fallback poll happened');

$node->stop;
$mk->stop;
done_testing();
