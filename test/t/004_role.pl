# The publisher runs as an ordinary role with only the privileges the README
# lists, and an application role needs nothing but EXECUTE.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('role', retention => '0');

worker_role($node, q{
	CREATE ROLE app LOGIN;
	GRANT EXECUTE ON FUNCTION outbox_emit(text, text, text, jsonb, text, jsonb, text, bigint),
		inbox_claim(text, text) TO app;
});

is($node->safe_psql('postgres', q{SELECT rolsuper FROM pg_roles r JOIN pg_stat_activity a ON a.usesysid = r.oid
	WHERE a.backend_type = 'outbox publisher'}), 'f', 'the publisher is not a superuser');

$node->safe_psql('postgres', q{SET ROLE app;
	SELECT outbox_emit('order', 'r-' || i % 5, 'E', '{}') FROM generate_series(1, 50) i;
	SELECT inbox_claim('c', 'x');});
my ($rc, $out, $err) = $node->psql('postgres', 'SET ROLE app; SELECT count(*) FROM outbox');
like($err, qr/permission denied/, 'the application role cannot read the outbox directly');

ok(defined wait_published($node, 120), 'the unprivileged publisher published everything');
my $r = $mk->check(topics => ['outbox.event.order'], expect => { map { ("r-$_" => 10) } 0 .. 4 });
is($r->{exit}, 0, 'in order') or diag $r->{output};
$node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM outbox')
  or diag 'retention did not run';
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox'), '0',
	'retention runs with the same privileges');
ok(!$node->log_contains('publisher error'), 'the publisher logged no error');

$node->stop;
$mk->stop;
done_testing();
