# The publisher's statements take a batch's events as arrays.  A cached
# generic plan estimates each unnest() at 10 rows; with statistics taken
# while nothing was pending it joined 10,000 marks to 10,000 pending rows by
# a nested loop: marking one batch took about a minute, and a benchmark saw
# the publisher "marking published" for minutes.  The publisher now plans
# each of these statements with the arrays' real sizes.  Here: many small
# settlings (the plan cache's trial of custom plans), statistics of a
# table with nothing pending, then a backlog of 30,000 events over 10
# aggregates: published in about a second (the nested loop took 25-50 s a batch).
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('backlog_analyze', max_seconds => 400);

for my $i (1 .. 12)
{
	q1(qq{SELECT outbox_emit('plan', 'warm-$i', 'E', '{}')});
	ok(defined wait_published($node, 60), "small settling $i") or last;
}

q1('SELECT outbox_pause()');
q1('ANALYZE outbox');
q1(q{SELECT outbox_emit('plan', 'agg-' || (g % 10), 'E', jsonb_build_object('n', g))
     FROM generate_series(1, 30000) g});
my $t0 = time;
q1('SELECT outbox_resume()');
my $took = wait_published($node, 45);
ok(defined $took, 'a 30,000-event backlog after statistics of an empty queue is published within 45 s');
printf "FIGURES scenario=backlog_after_analyze events=30000 seconds=%.1f\n", time - $t0;

$node->stop;
$mk->stop;
done_testing();
