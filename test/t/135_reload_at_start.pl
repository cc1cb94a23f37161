# A reload that reaches a publisher as it starts is applied.  PostgreSQL
# ignores SIGHUP from a background worker's fork to its entry point
# (BackgroundWorkerMain() sets it to SIG_IGN), discarding a reload signalled
# meanwhile; a worker forked before the postmaster reloaded then ran with
# the older settings until the next reload (seen on PostgreSQL 18: a
# publisher starting as log_min_messages = debug1 was reloaded never logged
# at DEBUG1).  Each worker now reads the configuration files once when its
# handler is in place.  Here the window is widened by a test hook
# (outbox.test_start_delay: the publisher's start delayed 10 s with SIGHUP
# ignored): the publisher starts with a broker address where nothing
# listens, the right one is reloaded while it waits, and the events must
# reach the mock Kafka without another reload.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

# (the publisher starts pointed at no broker: outbox.brokers set last)
my ($node, $mk) = outbox_setup('reload_at_start',
	enable_test_hooks => 'on', test_start_delay => '10s',
	server_conf => "outbox.brokers = '127.0.0.1:9'\n");

my $delayed = qr/outbox: test hook: outbox publisher start delayed by 10000 ms/;
ok(defined wait_until(sub { slurp_file($node->logfile) =~ $delayed }, 60),
	'the publisher is starting, reloads ignored');
my $log_from = -s $node->logfile;
$node->append_conf('postgresql.conf', "outbox.brokers = '@{[ $mk->bootstrap ]}'\n");
$node->reload;
ok(defined wait_until(sub { slurp_file($node->logfile) =~ /outbox publisher \d+ started/ }, 60),
	'the publisher started');
# The reload landed in the window: before the publisher's start-up ended.
like(slurp_file($node->logfile, $log_from),
	qr/received SIGHUP, reloading configuration files.*outbox publisher \d+ started/s,
	'the reload came while the publisher was starting');

q1(q{SELECT count(outbox_emit('order', 'o-1', 'E', jsonb_build_object('n', g))) FROM generate_series(1, 20) g});
ok(defined wait_published($node, 60), 'published to the reloaded brokers, with no further reload');
my $r = $mk->check(topics => ['outbox.event.order'], expect => { 'o-1' => 20 });
is($r->{exit}, 0, 'every event in Kafka, in order') or diag $r->{output};

$node->stop;
$mk->stop;
done_testing();
