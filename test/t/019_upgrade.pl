# ALTER EXTENSION outbox UPDATE, for every update script outbox--A--B.sql
# installed (so each later release is covered without a new test).  A
# producer and a consumer database at version A are left in every state
# the extension knows: events published, pending, of a blocked aggregate,
# of a paused one, dead-lettered; an inbox subscription with stored offsets
# and a dead-lettered message.  The workers doing this are the installed
# library's, the newest, as after a package update before ALTER EXTENSION
# ... UPDATE: so the library must also work on A's objects.  With no
# worker running (outbox.databases names none, no inbox worker) both
# databases are updated to B; then
#   - every row of every table of the extension is still there, unchanged
#     (the columns A and B share), and the sequences go on;
#   - the extension's objects equal those of a fresh install of B: pg_dump
#     --schema-only --binary-upgrade (which dumps an extension's members,
#     not just CREATE EXTENSION) of the updated and of a fresh database,
#     normalised (OIDs, relfrozenxids and a table's column order, which
#     ALTER TABLE ... ADD COLUMN cannot follow, left out);
#   - inbox_subscription.handler holds each handler's schema-qualified
#     signature as text, and no table of the extension has a column of a
#     reg* type pg_upgrade refuses;
# and the updated database survives pg_dump and pg_restore; and with the
# workers back, the pending events reach Kafka, each aggregate complete and
# in version order, and the inbox applies the new events exactly once, from
# the offsets it had stored.
use strict;
use warnings;

use File::Basename qw(basename);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use UpgradeTest;

my $extdir = `pg_config --sharedir`;
chomp $extdir;
$extdir .= '/extension';

# Versions compared numerically, part by part.
sub version_cmp
{
	my @a = split /\./, $_[0];
	my @b = split /\./, $_[1];
	while (@a || @b)
	{
		my $c = (shift(@a) // 0) <=> (shift(@b) // 0);
		return $c if $c;
	}
	return 0;
}

my @pairs = sort { version_cmp($a->[0], $b->[0]) || version_cmp($a->[1], $b->[1]) }
  map { basename($_) =~ /^outbox--([0-9.]+)--([0-9.]+)\.sql$/ ? [ $1, $2 ] : () }
  glob("$extdir/outbox--*--*.sql");
# The source tree's scripts must all be installed (make install).
for my $src (glob("$ENV{TESTDIR}/sql/outbox--*.sql"))
{
	ok(-f "$extdir/" . basename($src), basename($src) . ' is installed')
	  or BAIL_OUT('make install first');
}
ok(@pairs > 0, 'there is an update script') or BAIL_OUT('no update script in ' . $extdir);

# More events pending with no worker running, then the update of both
# databases: every row kept (the columns A and B share).
sub update_pair
{
	my ($t) = @_;
	my ($node, $to) = @$t{qw(node to)};
	quiesce_pair($t);
	for my $db (qw(postgres consumer))
	{
		$node->safe_psql($db, "ALTER EXTENSION outbox UPDATE TO '$to'");
		is($node->safe_psql($db, q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}),
			$to, "$db: updated to $to");
		rows_kept($t, $db);
	}
	is($t->{p}->('SELECT count(*) FROM outbox_pending'), $t->{pending}, "$to: the same events pending");
	is($t->{c}->(q{SELECT string_agg(consumer || ' ' || pg_typeof(handler) || ' '
		|| CASE WHEN handler ~ '^[0-9]+$' THEN 'oid' ELSE handler END, ',' ORDER BY consumer) FROM inbox_subscription}),
		'billing text app.apply(public.inbox_message),gone text oid',
		"$to: each handler is its schema-qualified signature as text (a dropped one's OID)");
	# pg_upgrade refuses a table with a column of these types (their OIDs
	# change); regrole, regclass and regtype it keeps.
	is($t->{c}->(q{SELECT string_agg(c.relname || '.' || a.attname, ',')
		  FROM pg_depend d JOIN pg_class c ON c.oid = d.objid AND d.classid = 'pg_class'::regclass
		  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
		   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
		   AND a.atttypid IN ('regproc'::regtype, 'regprocedure'::regtype, 'regoper'::regtype,
			   'regoperator'::regtype, 'regconfig'::regtype, 'regdictionary'::regtype,
			   'regnamespace'::regtype, 'regcollation'::regtype)}), '',
		"$to: no table of the extension has a column pg_upgrade refuses");
}

# The updated database's objects equal a fresh install's, and the updated
# database survives a dump and restore.
sub compare_pair
{
	my ($t) = @_;
	my ($node, $to, $tag) = @$t{qw(node to tag)};
	compare_fresh($t);
	my $dump = "$PostgreSQL::Test::Utils::tmp_check/updated_$tag.dump";
	$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], "$to: pg_dump");
	$t->{p}->('CREATE DATABASE restored');
	$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ], "$to: pg_restore");
	my $state = q{SELECT (SELECT extversion FROM pg_extension WHERE extname = 'outbox') || ' '
		|| (SELECT count(*) FROM outbox_pending) || ' '
		|| (SELECT string_agg(aggregate_id || ':' || last_published_version || ':' || coalesce(blocked_version, 0)
							  || ':' || paused, ',' ORDER BY aggregate_id) FROM aggregate_publication)};
	is($node->safe_psql('restored', $state), $t->{p}->($state), "$to: the restored database holds the same state");
}

for my $pair (@pairs)
{
	note "update $pair->[0] -> $pair->[1]";
	my $t = start_pair(@$pair);
	make_states($t);
	update_pair($t);
	compare_pair($t);
	resume_pair($t);
}
done_testing();
