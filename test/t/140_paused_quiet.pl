# A publisher paused as a whole (outbox_pause()) is not woken by emitting
# commits: none could resume it; it said so before, and read at every
# outbox.read_commits-th commit.  outbox_resume() wakes it at once (the
# poll is a minute here), and nothing emitted while paused is lost.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('paused', max_seconds => 120,
	poll_interval => '60s', read_commits => 1);

q1(q{SELECT outbox_emit('paused', 'a-1', 'E', '{}')});
ok(wait_until(sub { counter($node, 'events_published') >= 1 }, 30), 'the first event is published');

q1(q{SELECT outbox_pause()});
# The next commit wakes the worker, whose read finds publishing paused.
q1(q{SELECT outbox_emit('paused', 'a-1', 'E', '{}')});
ok($node->poll_query_until('postgres',
	"SELECT bool_and(state LIKE 'paused%') FROM outbox_workers()"),
	'the worker shows it is paused');

my $wakeups = counter($node, 'wakeups');
for my $i (1 .. 200)
{
	q1(qq{SELECT outbox_emit('paused', 'a-' || ($i % 10), 'E', '{}')});
}
my $woken = counter($node, 'wakeups') - $wakeups;
cmp_ok($woken, '<=', 2, "200 emitting commits woke the paused worker $woken times");
is(counter($node, 'events_published'), '1', 'nothing published while paused');

q1(q{SELECT outbox_resume()});
ok(wait_until(sub { counter($node, 'events_published') >= 202 }, 30),
	'resumed at once: everything published (the poll is 60 s)');
ok($node->poll_query_until('postgres',
	"SELECT bool_and(state NOT LIKE 'paused%') FROM outbox_workers()"),
	'the worker no longer shows paused');

my %expect = ('a-1' => 2 + 20, map { ("a-$_" => 20) } 2 .. 9);
$expect{'a-0'} = 20;
my $r = $mk->check(topics => ['outbox.event.paused'], expect => \%expect);
is($r->{exit}, 0, 'every version in Kafka, in order') or diag $r->{output};

$node->stop;
$mk->stop;
done_testing();
