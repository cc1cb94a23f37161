# A backlog is read as a pipeline (worker.c, pipeline_step): the next read
# does not wait for the newest flight's reports, since the rest of the delta
# is of other aggregates.  Not when the rest starts with an aggregate the
# last read took only part of: that aggregate is in flight, and a read then
# would divert it and every later event of it, row by row, to be read by
# index afterwards (one aggregate's backlog: all of it, and half the drain
# speed).  Here one aggregate's 2,000 events, read 100 at a time
# (outbox.batch_events = 200): no read of the backlog may come back empty.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('one_aggregate', batch_events => 200);
# A restart, not a reload: once on PostgreSQL 18 the publisher, starting
# as the reload came, logged none of its reads at DEBUG1 afterwards;
# started with the setting, every process has it.
$node->append_conf('postgresql.conf', "log_min_messages = debug1\n");
$node->restart;

q1(q{SELECT outbox_emit('hot', 'hot', 'E', '{}')});
ok(defined wait_published($node, 60), 'the publisher runs');

q1('SELECT outbox_pause()');
q1(q{SELECT count(outbox_emit('hot', 'hot', 'E', jsonb_build_object('n', g)))
     FROM generate_series(1, 2000) g});
my $log_from = -s $node->logfile;
q1('SELECT outbox_resume()');
ok(defined wait_published($node, 120), 'the backlog is published');

my $log = slurp_file($node->logfile, $log_from);
my @fetched = $log =~ /outbox: fetched (\d+) events/g;
# The reads up to the last one that found events: the backlog's.
pop @fetched while @fetched && $fetched[-1] == 0;
my $sum = 0;
$sum += $_ for @fetched;
is($sum, 2000, 'the reads took the 2,000 events (' . scalar(@fetched) . ' reads)');
is(scalar(grep { $_ == 0 } @fetched), 0, 'no read of the backlog came back empty');

my $r = $mk->check(topics => ['outbox.event.hot'], expect => { hot => 2001 });
is($r->{exit}, 0, 'every event in Kafka, in order') or diag $r->{output};
is($r->{duplicates}, 0, 'none sent twice');

$node->stop;
$mk->stop;
done_testing();
