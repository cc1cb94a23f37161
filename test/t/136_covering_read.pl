# The publishers read a delta from the txid index alone: its entries carry
# each event's version, id and aggregate (whose hash says its bucket, so
# its worker), and each worker visits the heap only for the rows of its own share
# (src/publish_delta.c).
#
# - Two workers drain one transaction's 3,000 events over 300 aggregates:
#   the rows they read in the table (counter heap_rows_read) are about one
#   per event, not one per event per worker and again for the fetch (as
#   when every worker visited every row of the delta to learn its bucket).
# - The index holds entries of row versions a snapshot does not see, with
#   the transaction's txid: rows of rolled-back subtransactions, and the
#   old versions of rows updated before the delta was read (an updated
#   row's versions share its id).  Every event reaches Kafka once, in
#   order; none of a rolled-back subtransaction does.
# - With an index on txid alone (as 0.1.0 made it), rows are found as
#   before, each visited in the heap.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use FaultTest;
use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
my $topic = 'outbox.event.cover';
my ($node, $mk) = outbox_setup('covering_read', workers => 2);
ok(defined wait_publisher($node, 2, 60), 'two publisher workers running');

is($node->safe_psql('postgres', q{
	SELECT pg_catalog.pg_get_indexdef('outbox_txid_idx'::regclass) LIKE
		'%(txid) INCLUDE (aggregate_version, id, aggregate_id)'}), 't',
	'the txid index carries each event\'s version, id and aggregate');

# Every aggregate has its row, and both workers have read (their shares agree).
q1(q{SELECT outbox_emit('cover', 'c-' || g, 'E', '{}') FROM generate_series(0, 299) g});
ok(defined wait_published($node, 60), 'first events published');
sleep 2;

my $read0 = counter($node, 'heap_rows_read');
q1(q{SELECT outbox_emit('cover', 'c-' || (g % 300), 'E', jsonb_build_object('n', g))
     FROM generate_series(1, 3000) g});
ok(defined wait_published($node, 60), 'a delta of 3,000 events published by two workers');
my $read = counter($node, 'heap_rows_read') - $read0;
note "heap_rows_read: $read for 3,000 events";
cmp_ok($read, '>=', 3000, 'every event was read from the table');
cmp_ok($read, '<', 4500, 'each row read about once, not by every worker');

# Rows of rolled-back subtransactions, and rows updated before the read.
q1('SELECT outbox_pause()');
q1(q{DO $$
BEGIN
	FOR g IN 1 .. 2000 LOOP
		BEGIN
			PERFORM outbox_emit('cover', 'c-' || (g % 300), 'E', jsonb_build_object('g', g));
			IF g % 7 = 0 THEN
				RAISE EXCEPTION 'roll back';
			END IF;
		EXCEPTION WHEN raise_exception THEN
			NULL;
		END;
	END LOOP;
END $$});
q1(q{UPDATE outbox SET attempts = attempts WHERE payload ? 'g' AND (payload ->> 'g')::int % 3 = 0});
my $pending = q1('SELECT count(*) FROM outbox_pending');
is($pending, 2000 - int(2000 / 7), 'the rolled-back emits left no row');
q1('SELECT outbox_resume()');
ok(defined wait_published($node, 60), 'every event published after rows moved');

# An index on txid alone: each row visited in the heap, the same events.
q1('DROP INDEX outbox_txid_idx');
q1('CREATE INDEX outbox_txid_idx ON outbox (txid)');
$read0 = counter($node, 'heap_rows_read');
q1(q{SELECT outbox_emit('cover', 'c-' || (g % 300), 'E', '{}') FROM generate_series(1, 300) g});
ok(defined wait_published($node, 60), 'with an index on txid alone: published');
cmp_ok(counter($node, 'heap_rows_read') - $read0, '>=', 600,
	'with an index on txid alone: every row of the delta visited, then fetched');

order_clean($mk, $node, [$topic], "$dir/expect.tsv");

$node->stop;
$mk->stop;
done_testing();
