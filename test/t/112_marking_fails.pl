# Marking fails: the publisher role lost INSERT on aggregate_publication.
#
# What Kafka acknowledged is kept in the worker and only the marking is
# retried (the marks of the settling that failed; aggregates acknowledged
# later wait, settled once that marking succeeds), so each event reaches
# Kafka once however long marking fails (before, the batch was produced
# again after every backoff), and the
# failure shows in outbox_status.workers[].problem.  Once the grant is
# back, everything is marked.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
my ($node, $mk) = outbox_setup('marking');

worker_role($node);

# Revoke a privilege, emit events from..to over 20 aggregates, and wait
# until outbox_status shows the settling failing for want of it.
sub revoke_emit_and_see_failure
{
	my ($privilege, $from, $to, $name) = @_;

	$node->safe_psql('postgres', "REVOKE $privilege ON aggregate_publication FROM outbox_worker");
	$node->safe_psql('postgres',
		qq{SELECT outbox_emit('mark', 'm-' || g % 20, 'E', jsonb_build_object('n', g))
		    FROM generate_series($from, $to) g});
	ok($node->poll_query_until('postgres', q{
		SELECT count(*) > 0 FROM outbox_status, jsonb_array_elements(workers) w
		 WHERE w->>'problem' ~ 'recording the progress of [0-9]+ aggregates failed.*permission denied'}),
		$name);
}

revoke_emit_and_see_failure('INSERT', 1, 200, 'outbox_status shows the marking failure');
note $node->safe_psql('postgres', 'SELECT workers FROM outbox_status');

# Several backoff periods (1 s, 2 s, 4 s): each used to re-send the batch.
sleep 8;
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_pending'),
	'200', 'nothing marked while the grant is missing');
my $r = $mk->check(topics => ['outbox.event.mark'], expect => expect_file($node, "$dir/expect1"));
is($r->{exit}, 0, 'all in Kafka, in order') or diag $r->{output};
is($r->{messages}, 200, 'each acknowledged event was produced once while marking failed');
is($r->{duplicates}, 0, 'no duplicate');

$node->safe_psql('postgres', 'GRANT INSERT ON aggregate_publication TO outbox_worker');
ok(defined wait_published($node, 60), 'all marked once the grant is back');
ok($node->poll_query_until('postgres', q{
	SELECT bool_and(w->>'problem' IS NULL) FROM outbox_status, jsonb_array_elements(workers) w}),
	'the error is cleared');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM aggregate_publication WHERE last_published_version = 10}), '20',
	'every aggregate\'s progress recorded');
$r = $mk->check(topics => ['outbox.event.mark'], expect => expect_file($node, "$dir/expect2"));
is($r->{messages}, 200, 'still each event once in Kafka');
ok($node->log_contains(qr/recorded the progress of \d+ of \d+ held aggregates after settling had failed/),
	'the retry is logged');

# The same without UPDATE: every aggregate has its row now, so the settling
# updates the rows directly (publish_progress.c), without a statement; it
# must check the grant the UPDATE statement did.
revoke_emit_and_see_failure('UPDATE', 201, 300,
	'without UPDATE on aggregate_publication, the direct settling fails too');
sleep 3;
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM aggregate_publication WHERE last_published_version > 10}), '0',
	'nothing recorded while UPDATE is missing');
$node->safe_psql('postgres', 'GRANT UPDATE ON aggregate_publication TO outbox_worker');
ok(defined wait_published($node, 60), 'all marked once UPDATE is back');
$r = $mk->check(topics => ['outbox.event.mark'], expect => expect_file($node, "$dir/expect3"));
is($r->{exit}, 0, 'all 300 in Kafka, in order') or diag $r->{output};
is($r->{duplicates}, 0, 'no duplicate');

$node->stop;
$mk->stop;
done_testing();
