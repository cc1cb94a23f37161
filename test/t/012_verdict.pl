# The fault tests' verdict (FaultTest::judge) excuses a missing version
# only when the publisher recorded it as acknowledged without an offset
# (-1001: librdkafka's implicit acknowledgement, which the mock can grant
# for a request it never appended); a missing version with an offset is a
# loss.  A version is made "missing" deterministically by publishing it to
# another topic than the one judged.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use FaultTest;
use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
mkdir "$dir/mock";
my $mk = MockKafka->start(dir => "$dir/mock", brokers => 1, max_seconds => 120);
$mk->cmd("topic_create $_ 1 1") for qw(verdict.main verdict.aside);
my $node = outbox_node('verdict', $mk);

$node->safe_psql('postgres', q{
BEGIN;
SELECT outbox_emit('vt', 'a-1', 'Changed', '{}', 'verdict.main');
SELECT outbox_emit('vt', 'a-1', 'Changed', '{}', 'verdict.aside');
SELECT outbox_emit('vt', 'a-1', 'Changed', '{}', 'verdict.main');
SELECT outbox_emit('vt', 'a-2', 'Changed', '{}', 'verdict.main');
COMMIT;});
ok(defined wait_published($node, 120), 'all four events published');

my $v2 = q{aggregate_id = 'a-1' AND aggregate_version = 2};
my $offset = $node->safe_psql('postgres', "SELECT kafka_offset FROM outbox WHERE $v2");
like($offset, qr/^\d+$/, 'version 2 has a real offset');

# Recorded as implicitly acknowledged: excused, and the verdict passes.
$node->safe_psql('postgres', "UPDATE outbox SET kafka_offset = -1001 WHERE $v2");
my $r = judge($mk, $node, 'implicit', topics => ['verdict.main']);
is(join(' ', map { "$_=$r->{$_}" } qw(lost gaps mock_lost mock_gaps clean)),
	'lost=1 gaps=1 mock_lost=1 mock_gaps=1 clean=1',
	'a missing version acknowledged without an offset is excused');
verdict($mk, $node, 'implicit', topics => ['verdict.main']);

# With its offset, the same missing version is a loss.
$node->safe_psql('postgres', "UPDATE outbox SET kafka_offset = $offset WHERE $v2");
$r = judge($mk, $node, 'offset', topics => ['verdict.main']);
is(join(' ', map { "$_=$r->{$_}" } qw(lost gaps mock_lost mock_gaps clean)),
	'lost=1 gaps=1 mock_lost=0 mock_gaps=0 clean=',
	'a missing version acknowledged with an offset is a loss');

$node->stop;
$mk->stop;
done_testing();
