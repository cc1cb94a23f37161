# test/perl/UpgradeTest.pm
#
# Shared steps of the upgrade TAP tests (019: ALTER EXTENSION outbox
# UPDATE; 020: pg_upgrade to the next PostgreSQL major version): a producer
# and a consumer database left in every state the extension knows
# (published, pending, blocked, paused, dead-lettered events; an inbox
# subscription with stored offsets and a dead letter), recorded with no
# worker running, compared after the upgrade (every row kept, the objects
# equal to a fresh install's), then served again (everything published in
# version order, the inbox resuming at its stored offsets).

package UpgradeTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use OutboxTest qw(pinned_init poll_until mock_setup);

our @EXPORT = qw(start_pair make_states quiesce_pair rows_kept compare_fresh resume_pair);

# Emit $n events of aggregate $agg to $topic (payload {"i": i} merged with $extra).
sub emit
{
	my ($node, $agg, $topic, $n, $extra) = @_;
	$extra //= '{}';
	$node->safe_psql('postgres', qq{
		SELECT count(*) FROM generate_series(1, $n) i,
			LATERAL outbox_emit('order', '$agg', 'E', jsonb_build_object('i', i) || '$extra'::jsonb,
								topic => '$topic')});
}

# The consumer's role, tables and handler (as test/perl/InboxTest.pm's):
# app.apply(inbox_message) records what it applies and fails for payloads
# {"fail": true}.
sub consumer_objects
{
	my ($node, $db) = @_;
	$node->safe_psql($db, q{
		DO $$ BEGIN CREATE ROLE app LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
		CREATE SCHEMA app AUTHORIZATION app;
		SET ROLE app;
		CREATE TABLE app.applied (
			seq bigint GENERATED ALWAYS AS IDENTITY,
			aggregate_id text, version bigint, event_id text, topic text,
			"partition" int, "offset" bigint);
		CREATE FUNCTION app.apply(m inbox_message) RETURNS void
		LANGUAGE plpgsql AS $f$
		BEGIN
			IF (m.payload ->> 'fail')::boolean THEN
				RAISE EXCEPTION 'handler refuses %', m.event_id;
			END IF;
			INSERT INTO app.applied (aggregate_id, version, event_id, topic, "partition", "offset")
			VALUES (m.aggregate_id, m.aggregate_version, m.event_id, m.topic, m."partition", m."offset");
		END
		$f$;
		RESET ROLE;
		GRANT EXECUTE ON FUNCTION inbox_subscribe TO app;
	});
}

# The extension's tables in $db: name => its columns.
sub extension_tables
{
	my ($node, $db) = @_;
	my %t;
	for (split /\n/, $node->safe_psql($db, q{
		SELECT c.relname || ':' || string_agg(quote_ident(a.attname), ',' ORDER BY a.attname)
		  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'outbox'
		  JOIN pg_class c ON c.oid = d.objid AND d.classid = 'pg_class'::regclass AND c.relkind = 'r'
		  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		 WHERE d.deptype = 'e' GROUP BY c.relname}))
	{
		my ($name, $cols) = split /:/, $_, 2;
		$t{$name} = [ split /,/, $cols ];
	}
	return \%t;
}

# A copy, as text, of every row of the extension's tables in $db, in
# schema upgrade_snap (dropped before the schema is compared).  Under
# search_path pg_catalog, as rows_changed: a regprocedure (0.1.0's
# inbox_subscription.handler) prints as the text 0.2.0 stores instead.
sub snapshot_rows
{
	my ($node, $db, $tables) = @_;
	my $sql = 'SET search_path = pg_catalog; CREATE SCHEMA upgrade_snap;';
	for my $name (sort keys %$tables)
	{
		my $cols = join(', ', map { "${_}::text AS $_" } @{ $tables->{$name} });
		$sql .= "CREATE TABLE upgrade_snap.$name AS SELECT $cols FROM public.$name;";
	}
	$node->safe_psql($db, $sql);
}

# The rows of table $name that differ from its copy in upgrade_snap, in
# the columns @$cols: "missing N, new M".
sub rows_changed
{
	my ($node, $db, $name, $cols) = @_;
	my $now = join(', ', map { "${_}::text" } @$cols);
	my $then = join(', ', @$cols);
	return $node->safe_psql($db, qq{SET search_path = pg_catalog;
		SELECT 'missing ' || (SELECT count(*) FROM (SELECT $then FROM upgrade_snap.$name
													EXCEPT ALL SELECT $now FROM public.$name) m)
			|| ', new ' || (SELECT count(*) FROM (SELECT $now FROM public.$name
												 EXCEPT ALL SELECT $then FROM upgrade_snap.$name) n)
			|| ' of ' || (SELECT count(*) FROM upgrade_snap.$name)});
}

# The schema of $db as pg_dump --binary-upgrade writes it (every object of
# the extension, with its ACL and comment), without what differs between
# two databases made alike: OIDs and relfilenodes, relfrozenxids, dropped
# columns kept by number, and the order of a table's columns.
sub schema_dump
{
	my ($node, $db, $path, $bare_acls) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'pg_dump', '--schema-only', '--binary-upgrade', '-d', $node->connstr($db) ], '>', \$out, '2>', \$err)
	  or die "pg_dump $db: $err";
	my (@lines, @columns, $in_table, $skip);
	for my $l (split /\n/, $out)
	{
		# A statement that sets OIDs, xids or dropped columns (pg_upgrade's
		# business) follows its comment: skipped up to its end.
		if ($l =~ /^-- For binary upgrade, (.*)/)
		{
			$skip = $1 !~ /extension membership/;
			next;
		}
		if ($skip)
		{
			$skip = 0 if $l =~ /;$/;
			next;
		}
		# Also the dump's random \restrict key, and sequence values (data).
		next if $l =~ /binary_upgrade|pg\.dropped|^-- Dumped|^\\(un)?restrict |^SELECT pg_catalog\.setval\(/;
		next if $l =~ /^--$/ || $l eq '';
		if ($in_table)
		{
			if ($l =~ /^\);?$|^\)/)
			{
				push @lines, sort(@columns), $l;
				($in_table, @columns) = (0);
				next;
			}
			(my $c = $l) =~ s/,$//;
			push @columns, $c;
			next;
		}
		$in_table = 1 if $l =~ /^CREATE TABLE .*\($/;
		push @lines, $l;
	}
	# With $bare_acls: an ACL entry with no statement (initial privileges
	# recorded equal to the defaults) left out.
	if ($bare_acls)
	{
		my @kept;
		for my $i (0 .. $#lines)
		{
			next if $lines[$i] =~ /^-- Name: .*; Type: ACL;/
			  && ($lines[ $i + 1 ] // '-- PostgreSQL') =~ /^-- (Name:|PostgreSQL)/;
			push @kept, $lines[$i];
		}
		@lines = @kept;
	}
	open my $fh, '>', "$path.raw" or die "cannot write $path.raw: $!";
	print $fh $out;
	close $fh;
	open $fh, '>', $path or die "cannot write $path: $!";
	print $fh "$_\n" for @lines;
	close $fh;
	return join("\n", @lines);
}

# A mock Kafka and a cluster for the update A -> B: a hash of what the
# steps below share ($t->{p} and $t->{c} run SQL in the producer and the
# consumer database of $t->{node}; $t->{conf} is the settings but which
# databases are served).  %opt: install_path (the server's installation,
# default the one on PATH), extra (initdb's options), tag (names).
sub start_pair
{
	my ($from, $to, %opt) = @_;
	my $t = { from => $from, to => $to, what => "$from -> $to",
		tag => $opt{tag} // ("$from-$to" =~ s/\./_/gr) };
	# Permanent errors are injected on broker 3, which leads topic poison only.
	my $mk = mock_setup(name => "upgrade_$t->{tag}", brokers => 3, max_seconds => 900,
		mock_cmds => [ 'topic_create poison 1 3', 'leader poison 0 3',
			map { ("topic_create $_ 2 3", "leader $_ 0 1", "leader $_ 1 2") } 'orders', 'outbox.dead_letter' ]);
	my $node = PostgreSQL::Test::Cluster->new("upgrade_$t->{tag}",
		$opt{install_path} ? (install_path => $opt{install_path}) : ());
	pinned_init($node, extra => $opt{extra} // []);
	$t->{serving} = "outbox.databases = 'postgres,consumer'\noutbox.inbox_workers = 1\n";
	$t->{conf} = qq{
shared_preload_libraries = 'outbox'
outbox.brokers = '@{[ $mk->bootstrap ]}'
outbox.poll_interval = '500ms'
outbox.delivery_timeout = '5s'
outbox.max_attempts = 2
outbox.poison_policy = 'block'
outbox.inbox_database = 'consumer'
outbox.inbox_kafka_properties = 'session.timeout.ms=6000;heartbeat.interval.ms=500'
outbox.inbox_max_attempts = 2
outbox.inbox_retry_backoff = '100ms'
outbox.inbox_poison_policy = 'dead_letter'
max_connections = 60
};
	$node->append_conf('postgresql.conf', $t->{conf} . $t->{serving});
	$node->start;
	@$t{qw(mk node)} = ($mk, $node);
	# The node of the moment: a server upgrade replaces it.
	$t->{p} = sub { $t->{node}->safe_psql('postgres', shift) };
	$t->{c} = sub { $t->{node}->safe_psql('consumer', shift) };
	return $t;
}

# At version A, workers running: events published, applied by the inbox
# and dead-lettered there, an aggregate blocked, an event dead-lettered, an
# aggregate paused with events pending.
sub make_states
{
	my ($t) = @_;
	my ($node, $mk, $from) = @$t{qw(node mk from)};
	$t->{p}->("CREATE EXTENSION outbox VERSION '$from'");
	$t->{p}->('CREATE DATABASE consumer');
	$t->{c}->("CREATE EXTENSION outbox VERSION '$from'");
	consumer_objects($node, 'consumer');
	$t->{c}->(q{SET ROLE app;
		SELECT inbox_subscribe('billing', ARRAY['orders'], 'app.apply(inbox_message)'::regprocedure)});
	# A subscription whose handler was dropped (no worker saw it there).
	$t->{c}->(q{SET ROLE app; BEGIN;
		CREATE FUNCTION app.gone(m inbox_message) RETURNS void LANGUAGE sql AS 'SELECT';
		SELECT inbox_subscribe('gone', ARRAY['orders'], 'app.gone(inbox_message)'::regprocedure);
		DROP FUNCTION app.gone(inbox_message);
		COMMIT});
	emit($node, 'o-1', 'orders', 5);
	emit($node, 'o-2', 'orders', 3);
	emit($node, 'f-1', 'orders', 1, '{"fail": true}');
	emit($node, 'z-1', 'orders', 2);
	ok(poll_until($node, 'postgres', 'SELECT count(*) = 0 FROM outbox_pending'), "$from: published");
	ok(poll_until($node, 'consumer', 'SELECT count(*) = 10 FROM app.applied'), "$from: applied by the inbox");
	ok(poll_until($node, 'consumer', 'SELECT count(*) = 1 FROM inbox_dead_letter'), "$from: an inbox dead letter");
	for my $agg ('p-1', 'd-1')
	{
		$mk->cmd('broker_errors 3 0 ' . join(' ', ('87:0') x 2));
		emit($node, $agg, 'poison', $agg eq 'p-1' ? 2 : 1);
		ok(poll_until($node, 'postgres',
			"SELECT blocked_version = 1 FROM aggregate_publication WHERE aggregate_id = '$agg'"),
			"$from: aggregate $agg blocked");
	}
	$t->{p}->(q{SELECT outbox_dead_letter(event_id) FROM outbox WHERE aggregate_id = 'd-1'});
	ok(poll_until($node, 'postgres',
		q{SELECT disposition = 'dead_lettered' FROM outbox WHERE aggregate_id = 'd-1'}),
		"$from: an event dead-lettered");
	$t->{p}->(q{SELECT outbox_pause('z-1')});
	emit($node, 'z-1', 'orders', 2);
}

# With no worker running, more events pending; what is there is recorded
# (a copy of every row of the extension's tables in schema upgrade_snap,
# the last event id, the inbox's stored offsets, the events pending) for
# rows_kept and resume_pair.
sub quiesce_pair
{
	my ($t) = @_;
	my ($node, $from) = @$t{qw(node from)};
	$node->append_conf('postgresql.conf', "outbox.databases = 'none'\noutbox.inbox_workers = 0\n");
	$node->restart;
	emit($node, 'o-1', 'orders', 3);
	emit($node, 'o-3', 'orders', 3);
	is($t->{p}->(q{SELECT count(*) FROM pg_stat_activity
		WHERE backend_type IN ('outbox publisher', 'outbox inbox worker')}), '0', "$from: no worker runs while updating");
	$t->{before} = { map { $_ => extension_tables($node, $_) } qw(postgres consumer) };
	snapshot_rows($node, $_, $t->{before}{$_}) for qw(postgres consumer);
	$t->{max_id} = $t->{p}->('SELECT max(id) FROM outbox');
	$t->{stored} = { map { split /\|/ } split /\n/,
		$t->{c}->(q{SELECT topic || ':' || "partition" || '|' || next_offset FROM inbox_offset}) };
	$t->{last_seq} = $t->{c}->('SELECT max(seq) FROM app.applied');
	$t->{pending} = $t->{p}->('SELECT count(*) FROM outbox_pending');
}

# Every row recorded by quiesce_pair is still in $db's tables (the columns
# they still have), unchanged; the copy is dropped.
sub rows_kept
{
	my ($t, $db) = @_;
	my $node = $t->{node};
	my $after = extension_tables($node, $db);
	for my $table (sort keys %{ $t->{before}{$db} })
	{
		my %now = map { $_ => 1 } @{ $after->{$table} // [] };
		my @common = grep { $now{$_} } @{ $t->{before}{$db}{$table} };
		next unless @common;
		like(rows_changed($node, $db, $table, \@common), qr/^missing 0, new 0 of \d+$/,
			"$db: every row of $table kept");
	}
	$node->safe_psql($db, 'DROP SCHEMA upgrade_snap CASCADE');
}

# The objects of the consumer database (the extension's and the
# application's) equal those of a fresh install of B in a new database
# ($t->{bare_acls}: but for ACL entries with no statement, see schema_dump).
sub compare_fresh
{
	my ($t) = @_;
	my ($node, $from, $to, $tag) = @$t{qw(node from to tag)};
	my $dir = $PostgreSQL::Test::Utils::tmp_check;
	$t->{p}->('CREATE DATABASE fresh');
	$node->safe_psql('fresh', "CREATE EXTENSION outbox VERSION '$to'");
	consumer_objects($node, 'fresh');
	my $updated = schema_dump($node, 'consumer', "$dir/schema_updated_$tag.sql", $t->{bare_acls});
	my $fresh = schema_dump($node, 'fresh', "$dir/schema_fresh_$tag.sql", $t->{bare_acls});
	ok(length($fresh) > 10000 && $fresh =~ /CREATE TABLE public\.outbox \(/,
		"$to: the dump holds the extension's objects");
	is($updated, $fresh, "$t->{what}: the extension's objects equal a fresh install of $to")
	  or diag `diff -u $dir/schema_fresh_$tag.sql $dir/schema_updated_$tag.sql | head -100`;
	my $ext = q{SELECT extversion || ' ' || array_to_string(extconfig::regclass[], ',') || ' '
		|| array_to_string(extcondition, ',') FROM pg_extension WHERE extname = 'outbox'};
	is($t->{c}->($ext), $node->safe_psql('fresh', $ext), "$to: the same tables dumped as data");
}

# Workers back: ids go on, everything is published in order, the inbox
# applies the rest exactly once from the offsets it had stored.
sub resume_pair
{
	my ($t) = @_;
	my ($node, $mk, $to) = @$t{qw(node mk to)};
	my ($p, $c) = @$t{qw(p c)};
	my $log_pos = -s $node->logfile;
	$node->append_conf('postgresql.conf', $t->{serving});
	$node->restart;
	ok($node->wait_for_log(qr/subscription "gone" is not applied: its handler no longer exists/, $log_pos),
		"$to: a subscription whose handler was dropped is still not applied, and says so");
	cmp_ok($p->(q{SELECT id FROM outbox_emit('order', 'o-1', 'E', '{}', topic => 'orders')}), '>', $t->{max_id},
		"$to: event ids go on");
	$p->(q{SELECT outbox_resume('z-1')});
	$p->(q{SELECT outbox_retry('p-1')});
	ok(poll_until($node, 'postgres', 'SELECT count(*) = 0 FROM outbox_pending'), "$to: everything published");
	my $r = $mk->check(topics => ['orders'],
		expect => { 'o-1' => 9, 'o-2' => 3, 'o-3' => 3, 'z-1' => 4, 'f-1' => 1 });
	is($r->{exit}, 0, "$to: topic orders complete, each aggregate in version order") or diag $r->{output};
	$r = $mk->check(topics => ['poison'], expect => { 'p-1' => 2 });
	is($r->{exit}, 0, "$to: the blocked aggregate published in order once retried") or diag $r->{output};
	ok(poll_until($node, 'consumer', 'SELECT count(*) = 19 FROM app.applied'), "$to: the inbox applied the rest");
	is($c->(q{SELECT count(*) FROM (SELECT event_id FROM app.applied GROUP BY 1 HAVING count(*) > 1) d}),
		'0', "$to: nothing applied twice");
	is($c->(q{SELECT string_agg(aggregate_id || ' ' || version, ',' ORDER BY aggregate_id, version) FROM app.applied}),
		$p->(q{SELECT string_agg(aggregate_id || ' ' || aggregate_version, ',' ORDER BY aggregate_id, aggregate_version)
			FROM outbox WHERE topic = 'orders' AND aggregate_id <> 'f-1'}), "$to: every event applied once");
	is($c->(q{SELECT count(*) FROM (SELECT version, lag(version) OVER (PARTITION BY aggregate_id ORDER BY seq) AS prev
		FROM app.applied) s WHERE version <= prev}), '0', "$to: applied in version order");
	my $resumed = 1;
	for my $row (split /\n/, $c->(qq{SELECT topic || ':' || "partition" || '|' || min("offset")
		FROM app.applied WHERE seq > $t->{last_seq} GROUP BY topic, "partition"}))
	{
		my ($tp, $first) = split /\|/, $row;
		next if $first == ($t->{stored}{$tp} // -1);
		$resumed = 0;
		diag "$tp: first offset read after the update $first, stored " . ($t->{stored}{$tp} // 'none');
	}
	ok($resumed, "$to: the inbox resumed at its stored offsets");
	is($c->('SELECT count(*) FROM inbox_dead_letter'), '1', "$to: the inbox dead letter kept");
	$node->stop;
	$mk->stop;
}

1;
