# pg_dump keeps the extension's data: pending events, versions (also of
# aggregates whose rows retention deleted), the inbox and poison policies.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use OutboxTest;

my $node = PostgreSQL::Test::Cluster->new('dump');
pinned_init($node);
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'outbox'\noutbox.workers = 0\n");
$node->start;
$node->safe_psql('postgres', q{
	CREATE DATABASE src;
});
$node->safe_psql('src', q{
	CREATE EXTENSION outbox;
	SELECT outbox_emit('order', 'o-1', 'E', '{"n": 1}') FROM generate_series(1, 3);
	SELECT outbox_emit('order', 'gone', 'E', '{}') FROM generate_series(1, 4);
	-- as publisher and retention would leave it: 'gone' published and deleted
	INSERT INTO aggregate_publication (aggregate_id, last_published_version) VALUES ('gone', 4);
	DELETE FROM outbox WHERE aggregate_id = 'gone';
	SELECT inbox_claim('billing', 'evt-1');
	INSERT INTO poison_policy (topic, policy) VALUES ('payments', 'skip');
});

my $dump = "$PostgreSQL::Test::Utils::tmp_check/outbox.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('src') ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE dst');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('dst'), $dump ], 'pg_restore');

is($node->safe_psql('dst', 'SELECT count(*) FROM outbox_pending'), '3',
	'pending events survive');
is($node->safe_psql('dst', q{SELECT aggregate_version FROM outbox_emit('order', 'o-1', 'E', '{}')}), '4',
	'versions continue');
is($node->safe_psql('dst', q{SELECT aggregate_version FROM outbox_emit('order', 'gone', 'E', '{}')}), '5',
	'versions continue for an aggregate whose rows were deleted');
is($node->safe_psql('dst', q{SELECT inbox_claim('billing', 'evt-1')}), 'f', 'the inbox survives');
is($node->safe_psql('dst', 'SELECT policy FROM poison_policy'), 'skip', 'poison policies survive');
cmp_ok($node->safe_psql('dst', q{SELECT (outbox_emit('order', 'new', 'E', '{}')).id}), '>', 7,
	'outbox ids continue after the restored ones');

$node->stop;
done_testing();
