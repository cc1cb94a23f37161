# Without shared_preload_libraries the library can still be loaded anywhere
# (CREATE EXTENSION, LOAD, a function call, session_preload_libraries,
# pg_restore) without FATAL: everything but publishing works, and
# outbox_status says plainly that no publisher runs and why.  Then a
# database with the extension that is not outbox.database.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my $node = PostgreSQL::Test::Cluster->new('nopreload');
pinned_init($node);
# Start-up settings in the file, as an administrator would leave them.
$node->append_conf('postgresql.conf', qq{
outbox.database = 'postgres'
outbox.workers = 2
outbox.brokers = '127.0.0.1:9'
log_min_messages = info
});
$node->start;

# CREATE EXTENSION: a WARNING with a hint, and the session lives on.
my ($rc, $out, $err) = $node->psql('postgres', q{CREATE EXTENSION outbox; SELECT 'alive'});
is($rc, 0, 'CREATE EXTENSION succeeds without the preload');
is($out, 'alive', 'the session survives CREATE EXTENSION');
like($err, qr/WARNING:  outbox is not in shared_preload_libraries/, 'CREATE EXTENSION warns');
like($err, qr/HINT:  Add outbox to shared_preload_libraries/, 'with a hint');
unlike($err, qr/FATAL/, 'no FATAL');

# LOAD and a C function in fresh sessions.
($rc, $out, $err) = $node->psql('postgres', q{LOAD 'outbox'; SELECT 'alive'});
is($out, 'alive', 'LOAD works') or diag $err;
($rc, $out, $err) = $node->psql('postgres', q{SELECT uuid_v7() IS NOT NULL});
is($out, 't', 'a C function works in a fresh session') or diag $err;
is($node->safe_psql('postgres', 'SHOW outbox.database'), 'postgres',
	'start-up settings stay readable as placeholders');

# Everything but publishing works.
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM (SELECT outbox_emit('order', 'o-' || i % 3, 'E', '{}')
	                        FROM generate_series(1, 6) i) e}), '6', 'outbox_emit works');
is($node->safe_psql('postgres', q{SELECT inbox_claim('c', 'e-1'), inbox_claim('c', 'e-1')}), 't|f',
	'inbox_claim works');
is($node->safe_psql('postgres', q{SELECT outbox_pause('o-1'), outbox_resume('o-1'), outbox_retry('o-2')}),
	't|t|f', 'operator functions work');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_aggregate_status'), '3',
	'outbox_aggregate_status works');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_workers()'), '0', 'no workers');
is($node->safe_psql('postgres', q{SELECT pending_events, publisher FROM outbox_status}),
	'6|not running', 'outbox_status: events wait, no publisher');
like($node->safe_psql('postgres', 'SELECT publisher_detail FROM outbox_status'),
	qr/not in shared_preload_libraries/, 'outbox_status says why');
($rc, $out, $err) = $node->psql('postgres', q{SELECT count(*) FROM outbox_counters()});
like($err, qr/ERROR:  outbox must be loaded via shared_preload_libraries/,
	'the counters (kept in shared memory) say why they are missing');
like($err, qr/HINT:  Add outbox to shared_preload_libraries in postgresql.conf and restart the server/,
	'and what to do');

# session_preload_libraries: every new connection loads it, superuser or not.
$node->safe_psql('postgres', q{ALTER SYSTEM SET session_preload_libraries = 'outbox'; SELECT pg_reload_conf()});
$node->safe_psql('postgres', 'CREATE ROLE plain LOGIN');
($rc, $out, $err) = $node->psql('postgres', q{SELECT 'alive'});
is($out, 'alive', 'a superuser connects with session_preload_libraries = outbox') or diag $err;
($rc, $out, $err) = $node->psql('postgres', q{SELECT 'alive'}, extra_params => [ '-U', 'plain' ]);
is($out, 'alive', 'an ordinary role connects too') or diag $err;
is($node->safe_psql('postgres', q{SELECT (outbox_emit('order', 'o-9', 'E', '{}')).aggregate_version}), '1',
	'emit works in such a session');

# pg_restore into this server: CREATE EXTENSION runs inside it.
my $dump = "$PostgreSQL::Test::Utils::tmp_check/nopreload.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ], 'pg_restore succeeds');
is($node->safe_psql('restored', 'SELECT count(*) FROM outbox'), '7', 'the events were restored');

ok(!$node->log_contains('FATAL'), 'no FATAL in the server log');
ok(!$node->log_contains('removing it'), 'no start-up setting was removed as invalid');
$node->stop;

# A preloaded server told to serve only "postgres" (outbox.database, kept
# for compatibility): a second database with the extension is told, at
# CREATE EXTENSION and in outbox_status.
my ($pub, $mk) = outbox_setup('twodb', database => 'postgres');
$pub->safe_psql('postgres', 'CREATE DATABASE other');
($rc, $out, $err) = $pub->psql('other', q{CREATE EXTENSION outbox});
is($rc, 0, 'CREATE EXTENSION in another database succeeds');
like($err, qr/WARNING:  no publisher serves database "other"/, 'and warns');
like($err, qr/outbox\.database/, 'naming outbox.database');
$pub->safe_psql('other', q{SELECT outbox_emit('order', 'x', 'E', '{}')});
is($pub->safe_psql('other', 'SELECT publisher FROM outbox_status'), 'not serving this database',
	'outbox_status in the other database: not served');
like($pub->safe_psql('other', 'SELECT publisher_detail FROM outbox_status'),
	qr/outbox\.database is set to "postgres": only that database is served/, 'and names the database that is');
ok($pub->poll_query_until('postgres', q{SELECT publisher = 'running' FROM outbox_status}),
	'outbox_status in outbox.database: running');
$pub->safe_psql('postgres', q{SELECT outbox_emit('order', 'y', 'E', '{}')});
ok(defined wait_published($pub, 120), 'the served database publishes');
is($pub->safe_psql('other', 'SELECT count(*) FROM outbox_pending'), '1',
	'the other database\'s event waits');

$pub->stop;
$mk->stop;
done_testing();
