# Many databases in one cluster: the launcher serves every database that
# has the extension (three here, a fourth without it is left alone), takes
# up a CREATE EXTENSION within seconds, lets DROP DATABASE and ALTER
# DATABASE RENAME through while a publisher is busy there, stops on DROP
# EXTENSION, leaves template databases out, shares a cap lower than the
# databases in turns, and serves them all again after a restart.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;

my ($node, $mk) = outbox_setup('multidb', max_seconds => 900, workers => 2);
$node->append_conf('postgresql.conf', "max_worker_processes = 24\noutbox.inbox_workers = 0\n");
$node->restart;

my @served = ('postgres', 'shop', 'billing');
for my $db ('shop', 'billing', 'plain')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
}
$node->safe_psql($_, 'CREATE EXTENSION outbox') for ('shop', 'billing');

# Publisher workers per database, from pg_stat_activity.
sub workers_in
{
	my ($db) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox publisher' AND datname = '$db'");
}

# Emit $n events per statement over 20 aggregates, in $tx transactions, to
# the topic outbox.event.<$type>.
sub emit_in
{
	my ($db, $type, $tx, $n) = @_;
	$node->safe_psql($db,
		"SELECT outbox_emit('$type', 'a-' || (g % 20), 'E', jsonb_build_object('g', g))
		   FROM generate_series(1, $n) g") for 1 .. $tx;
}

sub pending_in
{
	my ($db) = @_;
	return $node->safe_psql($db, 'SELECT count(*) FROM outbox_pending');
}

sub published_in
{
	my ($db, $timeout) = @_;
	return wait_until(sub { pending_in($db) == 0 }, $timeout // 120);
}

# Everything in $db's outbox reached topic outbox.event.<$type>, in order.
sub check_topic
{
	my ($db, $type, $label) = @_;
	my $rows = $node->safe_psql($db,
		"SELECT aggregate_id || E'\\t' || max(aggregate_version) FROM outbox
		  WHERE aggregate_type = '$type' GROUP BY aggregate_id ORDER BY 1");
	my %expect = map { split /\t/ } split /\n/, $rows;
	my $r = $mk->check(topics => ["outbox.event.$type"], expect => \%expect);
	is($r->{exit}, 0, "$label: every event of $db in its topic, in order") or diag $r->{output};
	return $r;
}

# --- three databases with the extension, one without ---
for my $db (@served)
{
	ok(defined wait_until(sub { workers_in($db) == 2 }, 60), "two publishers run in $db");
}
sleep 2;
is(workers_in('plain'), '0', 'no publisher stays in the database without the extension');
is($node->safe_psql('postgres',
	q{SELECT string_agg(DISTINCT database::text, ',' ORDER BY database::text) FROM outbox_workers()}),
	'billing,postgres,shop', 'outbox_workers() lists the workers of the three databases, and only those');
is($node->safe_psql('shop',
	q{SELECT jsonb_array_length(workers) || ' ' || publisher FROM outbox_status}),
	'2 running', 'outbox_status in a database shows its own two workers');

emit_in($_, "ev_$_", 5, 400) for @served;
for my $db (@served)
{
	ok(defined published_in($db), "$db: published");
	check_topic($db, "ev_$db", 'three databases');
	cmp_ok($node->safe_psql($db, q{SELECT value FROM outbox_counters() WHERE name = 'events_published'}),
		'==', 2000, "$db: its counters count its own events");
}

# --- CREATE EXTENSION in a fourth database while running ---
$node->safe_psql('postgres', 'CREATE DATABASE late');
sleep 2;
is(workers_in('late'), '0', 'a new database without the extension: no publisher stays');
my $t0 = time;
$node->safe_psql('late', 'CREATE EXTENSION outbox');
emit_in('late', 'ev_late', 1, 100);
my $t_late = published_in('late', 60);
ok(defined $t_late, 'CREATE EXTENSION while running: served and published within seconds');
note sprintf "FIGURES scenario=create_extension create_to_published_s=%.2f", time - $t0;
check_topic('late', 'ev_late', 'late database');

# --- a template database is not served ---
$node->safe_psql('late', 'ALTER DATABASE late IS_TEMPLATE true');
ok(defined wait_until(sub { workers_in('late') == 0 }, 30),
	'a database that becomes a template is no longer served');
like($node->safe_psql('late', 'SELECT publisher_detail FROM outbox_status'), qr/template database/,
	'outbox_status says why');
$node->safe_psql('postgres', 'ALTER DATABASE late IS_TEMPLATE false');
ok(defined wait_until(sub { workers_in('late') == 2 }, 30), 'and is served again when it is not');

# --- DROP DATABASE while its publisher is busy ---
# A backlog in billing keeps its workers inside batches; with one partition
# leaderless, the aggregates there stay pending however fast the rest drains.
$mk->cmd('leader outbox.event.ev_billing 0 -1');
emit_in('billing', 'ev_billing', 4, 20000);
ok(defined wait_until(sub {
	$node->safe_psql('billing', q{SELECT value FROM outbox_counters() WHERE name = 'events_published'}) > 2000 }, 60),
	'billing is publishing its backlog');
cmp_ok(pending_in('billing'), '>', 0, 'with events still pending');
$t0 = time;
my ($rc, $out, $err) = $node->psql('postgres', 'DROP DATABASE billing');
my $t_drop = time - $t0;
is($rc, 0, 'plain DROP DATABASE of a database being published succeeds') or diag $err;
$mk->cmd('leader outbox.event.ev_billing 0 1');
note sprintf "FIGURES scenario=drop_database drop_s=%.2f", $t_drop;
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_database WHERE datname = 'billing'}), '0',
	'billing is gone');
ok(defined wait_until(sub { workers_in('billing') == 0 }, 10), 'and no publisher is left for it');

# --- commands PostgreSQL refuses stop no publisher ---
# The database's owner without CREATEDB renaming it, a tablespace that does
# not exist, a name that is taken, the open database: each fails, and must
# not have stopped late's publishers on its way.
sub publisher_pids
{
	my ($db) = @_;
	return $node->safe_psql('postgres', "SELECT string_agg(pid::text, ' ' ORDER BY pid)
		FROM pg_stat_activity WHERE backend_type = 'outbox publisher' AND datname = '$db'");
}
$node->safe_psql('postgres', 'CREATE ROLE late_owner LOGIN; ALTER DATABASE late OWNER TO late_owner');
my $late_pids = publisher_pids('late');
($rc, $out, $err) = $node->psql('postgres', 'ALTER DATABASE late RENAME TO never',
	extra_params => ['-U', 'late_owner']);
like($err, qr/permission denied to rename database/, 'an owner without CREATEDB cannot rename');
($rc, $out, $err) = $node->psql('postgres', 'ALTER DATABASE late SET TABLESPACE nosuch');
like($err, qr/tablespace "nosuch" does not exist/, 'no such tablespace');
($rc, $out, $err) = $node->psql('postgres', 'ALTER DATABASE late RENAME TO shop');
like($err, qr/database "shop" already exists/, 'a taken name');
($rc, $out, $err) = $node->psql('late', 'DROP DATABASE late');
like($err, qr/cannot drop the currently open database/, 'the open database');
sleep 1;
is(publisher_pids('late'), $late_pids, 'none of them stopped late\'s publishers');
$node->safe_psql('postgres', 'ALTER DATABASE late OWNER TO CURRENT_USER; DROP ROLE late_owner');

# --- ALTER DATABASE RENAME of a served database ---
($rc, $out, $err) = $node->psql('postgres', 'ALTER DATABASE late RENAME TO renamed');
is($rc, 0, 'ALTER DATABASE RENAME of a served database succeeds') or diag $err;
ok(defined wait_until(sub { workers_in('renamed') == 2 }, 30), 'and it is served under its new name');
emit_in('renamed', 'ev_late', 1, 100);
ok(defined published_in('renamed', 60), 'renamed: published');

# --- DROP EXTENSION ---
$node->safe_psql('renamed', 'DROP EXTENSION outbox');
ok(defined wait_until(sub { workers_in('renamed') == 0 }, 30), 'DROP EXTENSION: its publishers stop');
ok($node->log_contains(qr/extension "outbox" is no longer installed in database "renamed"; stopping/),
	'and say why in the log');

# The others went on all along.
emit_in('shop', 'ev_shop', 1, 100);
ok(defined published_in('shop'), 'the other databases are still served');

# --- a cap lower than the databases: they take turns ---
$node->safe_psql('plain', 'CREATE EXTENSION outbox');
$node->append_conf('postgresql.conf', "outbox.max_workers = 1\noutbox.worker_time_slice = 2\n");
$node->reload;
ok(defined wait_until(sub {
	$node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox publisher'}) <= 1 }, 60),
	'outbox.max_workers = 1: at most one publisher runs');
my @capped = ('postgres', 'shop', 'plain');
emit_in($_, "ev_$_", 5, 2000) for @capped;
my $saw_waiting = 0;
my $max_running = 0;
my $t_cap = wait_until(sub {
	for my $db (@capped)
	{
		$saw_waiting = 1 if $node->safe_psql($db, 'SELECT publisher FROM outbox_status') eq 'waiting for its turn';
	}
	my $n = $node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox publisher'});
	$max_running = $n if $n > $max_running;
	return !grep { pending_in($_) > 0 } @capped;
}, 300);
ok(defined $t_cap, 'with the cap, every database is published in turn');
ok($saw_waiting, 'outbox_status said a database was waiting for its turn');
cmp_ok($max_running, '<=', 1, 'never more than the cap at once');
note sprintf "FIGURES scenario=cap_1_of_3 events=30000 seconds=%.2f", $t_cap // -1;
check_topic($_, "ev_$_", 'taking turns') for @capped;

# --- a restart: everything is served again ---
$node->append_conf('postgresql.conf', "outbox.max_workers = 0\n");
$node->restart;
for my $db (@capped)
{
	ok(defined wait_until(sub { workers_in($db) == 2 }, 60), "after a restart, $db is served again");
}
emit_in($_, "ev_$_", 1, 100) for @capped;
for my $db (@capped)
{
	ok(defined published_in($db), "$db: published after the restart");
	check_topic($db, "ev_$db", 'after the restart');
}

$node->stop;
done_testing();
