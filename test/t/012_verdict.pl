# The fault tests' verdict (FaultTest::judge) excuses a missing version
# only when the publisher logged it as acknowledged without an offset
# (librdkafka's implicit acknowledgement, which the mock can grant
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

my ($node, $mk) = outbox_setup('verdict', max_seconds => 120,
	mock_cmds => [ map { "topic_create $_ 1 1" } qw(verdict.main verdict.aside) ]);

$node->safe_psql('postgres', q{
BEGIN;
SELECT outbox_emit('vt', 'a-1', 'Changed', '{}', 'verdict.main');
SELECT outbox_emit('vt', 'a-1', 'Changed', '{}', 'verdict.aside');
SELECT outbox_emit('vt', 'a-1', 'Changed', '{}', 'verdict.main');
SELECT outbox_emit('vt', 'a-2', 'Changed', '{}', 'verdict.main');
COMMIT;});
ok(defined wait_published($node, 120), 'all four events published');

# Acknowledged with an offset (no log line says otherwise), the missing
# version is a loss.
my $r = judge($mk, $node, 'offset', topics => ['verdict.main']);
is(join(' ', map { "$_=$r->{$_}" } qw(lost gaps mock_lost mock_gaps clean)),
	'lost=1 gaps=1 mock_lost=0 mock_gaps=0 clean=',
	'a missing version acknowledged with an offset is a loss');

# Logged as acknowledged without an offset, as the publisher logs it:
# excused, and the verdict passes.
$node->safe_psql('postgres', q{DO $$BEGIN
	RAISE LOG 'outbox: acknowledged without an offset: aggregate "a-1" versions 2..2';
END$$});
$r = judge($mk, $node, 'implicit', topics => ['verdict.main']);
is(join(' ', map { "$_=$r->{$_}" } qw(lost gaps mock_lost mock_gaps clean)),
	'lost=1 gaps=1 mock_lost=1 mock_gaps=1 clean=1',
	'a missing version acknowledged without an offset is excused');
verdict($mk, $node, 'implicit', topics => ['verdict.main']);

$node->stop;
$mk->stop;
done_testing();
