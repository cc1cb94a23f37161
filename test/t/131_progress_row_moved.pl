# Settling looks for each aggregate's aggregate_publication row first where
# the read found it (its ctid; publish_progress.c), and by key only if the
# version there is not the one read.  A VACUUM FULL between the read and
# the settling moves every row (same xmin, new places) and shortens the
# table: the old places hold other aggregates' rows, written by the same
# settling transaction (same xmin), or lie past the table's end.  Each
# aggregate's progress must still reach its own row, and every event be
# sent once.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('moved');
my $n = 300;
my $gone = 70;		# about a block's worth of rows

# Rows of "gone-*" first in the heap, then those of "moved-*", each set
# written by one settling or a few (one xmin each); then the gone rows are
# deleted, so that the rewrite moves every moved row a block back: the
# place each was read at then holds another aggregate's row, most often
# of the same xmin.
for my $set (['gone', $gone], ['moved', $n])
{
	my ($name, $count) = @$set;
	q1("SELECT outbox_emit('mv', '$name-' || i, 'E', '{}') FROM generate_series(1, $count) i");
	ok(defined wait_published($node, 60), "$name: first versions published");
}
cmp_ok(q1(q{SELECT count(DISTINCT xmin::text) FROM aggregate_publication WHERE aggregate_id LIKE 'moved-%'}),
	'<=', 5, 'the moved rows share a few xmins (a few settlings)');
q1(q{DELETE FROM aggregate_publication WHERE aggregate_id LIKE 'gone-%'});
my $blocks = q1(q{SELECT pg_relation_size('aggregate_publication') / current_setting('block_size')::int});

# Version 2 of every moved aggregate goes out; its acknowledgements are held
# back while the table is rewritten.
$mk->cmd('rtt all 2000');
my $batches = counter($node, 'batches');
q1("SELECT outbox_emit('mv', 'moved-' || i, 'E', '{}') FROM generate_series(1, $n) i");
ok($node->poll_query_until('postgres',
	"SELECT value > $batches FROM outbox_counters() WHERE name = 'batches'"), 'version 2 is out');
q1('VACUUM FULL aggregate_publication');
my $after = q1(q{SELECT pg_relation_size('aggregate_publication') / current_setting('block_size')::int});
cmp_ok($after, '<', $blocks, "the table was shortened ($blocks -> $after blocks)");
$mk->cmd('rtt all 0');
ok(defined wait_published($node, 60), 'version 2 settled');

is(q1(q{SELECT count(*) FROM aggregate_publication WHERE aggregate_id LIKE 'moved-%' AND last_published_version = 2}),
	$n, 'every moved aggregate recorded at version 2, in its own row');
is(q1(q{SELECT count(*) FROM aggregate_publication WHERE aggregate_id LIKE 'moved-%' AND last_published_version <> 2}),
	'0', 'none recorded at another version');
is(q1(q{SELECT count(*) FROM aggregate_publication WHERE aggregate_id LIKE 'gone-%'}),
	'0', 'no row of a gone aggregate came back');
sleep 1;
my %expect = ((map { ("moved-$_" => 2) } 1 .. $n), (map { ("gone-$_" => 1) } 1 .. $gone));
my $r = $mk->check(topics => ['outbox.event.mv'], expect => \%expect);
is($r->{exit}, 0, 'every event in Kafka, in order') or diag $r->{output};
is($r->{duplicates}, 0, 'none sent twice');

$node->stop;
$mk->stop;
done_testing();
