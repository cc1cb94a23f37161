# A publisher's read finds each aggregate's progress row where it last saw
# or wrote it, not by its key (counter progress_key_lookups), and still
# finds the row by its key when an operator's write moved it; the versions
# reach Kafka in order throughout.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('places', max_seconds => 120);

# Every event of its own read: one wave of ten aggregates at a time.
sub wave
{
	my ($n) = @_;
	my $published = counter($node, 'events_published');
	q1(q{SELECT outbox_emit('places', 'p-' || g, 'E', '{}') FROM generate_series(1, 10) g});
	ok($node->poll_query_until('postgres',
		"SELECT value >= $published + 10 FROM outbox_counters() WHERE name = 'events_published'"),
		"wave $n published");
}

wave(1);
wave(2);
my $lookups = counter($node, 'progress_key_lookups');
wave(3);
wave(4);
is(counter($node, 'progress_key_lookups'), $lookups,
	'rows written by the publisher are found where it wrote them');

# An operator's write gives one row a new place: found by its key again.
q1(q{UPDATE aggregate_publication SET updated_at = now() WHERE aggregate_id = 'p-3'});
wave(5);
is(counter($node, 'progress_key_lookups'), $lookups + 1, 'the moved row is found by its key');
wave(6);
is(counter($node, 'progress_key_lookups'), $lookups + 1, 'and then where the publisher wrote it');

my $r = $mk->check(topics => ['outbox.event.places'],
	expect => { map { ("p-$_" => 6) } 1 .. 10 });
is($r->{exit}, 0, 'every version in Kafka, in order') or diag $r->{output};
is(q1(q{SELECT count(*) FROM aggregate_publication WHERE last_published_version = 6}), '10',
	'every aggregate\'s progress recorded');

$node->stop;
$mk->stop;
done_testing();
