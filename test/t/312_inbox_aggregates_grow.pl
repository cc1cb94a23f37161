# The inbox worker reads a batch's aggregates from inbox_aggregate with the
# batch's ids as an array.  A cached generic plan made while the table was
# small scanned the whole table and compared each row with every id of the
# array: once a consumer had seen 10,000 aggregates it cost 90 µs of CPU per
# event instead of 11, until an ANALYZE.  The statement is now planned at
# every batch for the table's current size.  Here: batches of 200 events
# while the table is small (the plan cache's trial of custom plans), no
# autovacuum on the table, then 200,000 aggregates stored (version 0: none
# applied yet) and batches of events of 300 of them: the rows those batches
# read from inbox_aggregate stay in proportion to their events, not to the
# table.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'outbox.event.grow';
my ($node, $mk) = inbox_setup('inbox_aggregates_grow', topics => ["$topic:1"], max_seconds => 600);
$node->safe_psql('consumer', 'ALTER TABLE inbox_aggregate SET (autovacuum_enabled = false)');
setup_consumer($node, 'grow', $topic);
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false');

# Emit $n events of aggregates "$prefix-$from".. in one transaction and wait
# until the consumer has applied $total.
sub batch
{
	my ($prefix, $from, $n, $total) = @_;
	my $to = $from + $n - 1;

	$node->safe_psql('postgres', qq{SELECT count(outbox_emit('grow', '$prefix-' || i, 'E',
		jsonb_build_object('i', i), topic => '$topic')) FROM generate_series($from, $to) i});
	return defined wait_applied($node, $total, 120);
}

my $total = 0;
for my $round (1 .. 8)
{
	$total += 200;
	ok(batch("warm$round", 1, 200, $total), "warm-up batch $round applied") or last;
}

# What the worker wrote and read of inbox_aggregate (its statistics, flushed
# at most once a second: polled until they show $written rows inserted or
# updated).
sub reads_after
{
	my ($written) = @_;
	my $row;

	wait_until(sub {
		$row = $node->safe_psql('consumer', q{SELECT n_tup_ins OPERATOR(pg_catalog.+) n_tup_upd,
			coalesce(seq_tup_read, 0) OPERATOR(pg_catalog.+) coalesce(idx_tup_fetch, 0)
			FROM pg_catalog.pg_stat_user_tables WHERE relid OPERATOR(pg_catalog.=) 'inbox_aggregate'::regclass});
		return (split /\|/, $row)[0] >= $written;
	}, 60, 0.5);
	return split /\|/, $row;
}

$node->safe_psql('consumer', q{INSERT INTO inbox_aggregate (consumer, aggregate_id, last_version)
	SELECT 'grow', 'stored-' || i, 0 FROM generate_series(1, 200000) i});
my ($written0, $reads0) = reads_after(8 * 200 + 200000);
ok($written0 >= 8 * 200 + 200000, 'statistics show the stored aggregates');

for my $round (1 .. 3)
{
	$total += 100;
	ok(batch('stored', $round * 100 - 99, 100, $total), "batch $round after the growth applied") or last;
}
my ($written1, $reads1) = reads_after($written0 + 300);
ok($written1 >= $written0 + 300, "statistics show the batches' versions written");
note "rows of inbox_aggregate read by the 3 batches: " . ($reads1 - $reads0);
cmp_ok($reads1 - $reads0, '>=', 300, 'the batches read their 300 stored aggregates');
cmp_ok($reads1 - $reads0, '<', 20000,
	'300 events over 3 batches read a few rows of inbox_aggregate each, not the 200,000 stored');

is($node->safe_psql('consumer', q{SELECT count(*) FROM app.applied}), $total, 'every event applied once');
is($node->safe_psql('consumer', q{SELECT count(*) FROM inbox_aggregate
	WHERE consumer = 'grow' AND last_version = 1}), 8 * 200 + 300,
	'the versions of the batches\' aggregates are stored');

$node->stop;
$mk->stop;
done_testing();
