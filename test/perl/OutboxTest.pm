# test/perl/OutboxTest.pm
#
# Shared set-up of the outbox end-to-end TAP tests: a PostgreSQL node with
# the publisher preloaded and pointed at a mock Kafka cluster, and helpers
# to query it, poll for a condition, wait for publication and judge what
# reached Kafka.

package OutboxTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;

our @EXPORT = qw(pinned_init outbox_node worker_role reload_with write_file_mode mock_setup outbox_setup q1 wait_until
  poll_until wait_back wait_published expect_file events_file emit_load counter order_clean);

# The node outbox_node made last: the one q1() queries.
my $last_node;

# $node->init(%params), with initdb's encoding and locale fixed (UTF8, C):
# left to the caller's environment, no LANG gives SQL_ASCII and other output.
sub pinned_init
{
	my ($node, %params) = @_;

	$node->init(%params,
		extra => [ '--encoding=UTF8', '--locale=C', @{ $params{extra} // [] } ]);
	return $node;
}

# A started node with the extension created in database "postgres" (the
# launcher serves every database that has it).
# %conf entries are appended to postgresql.conf as outbox.<key> = '<value>',
# but for server_conf: lines of postgresql.conf appended as they are.
sub outbox_node
{
	my ($name, $mk, %conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	my $server_conf = delete $conf{server_conf};

	pinned_init($node);
	$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'outbox'
outbox.brokers = '@{[ $mk->bootstrap ]}'
outbox.poll_interval = '500ms'
outbox.delivery_timeout = '5s'
max_connections = 60
log_min_messages = info
});
	while (my ($k, $v) = each %conf)
	{
		$node->append_conf('postgresql.conf', "outbox.$k = '$v'\n");
	}
	$node->append_conf('postgresql.conf', $server_conf) if defined $server_conf;
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
	$last_node = $node;
	return $node;
}

# Run the publisher as role outbox_worker with only the privileges it needs
# (then $extra_sql, in the same statement), and restart the node so.
sub worker_role
{
	my ($node, $extra_sql) = @_;

	$node->safe_psql('postgres', q{
	CREATE ROLE outbox_worker LOGIN;
	GRANT SELECT, UPDATE, DELETE ON outbox TO outbox_worker;
	GRANT SELECT, INSERT, UPDATE ON aggregate_publication TO outbox_worker;
	GRANT SELECT, INSERT, UPDATE, DELETE ON publisher_horizon TO outbox_worker;
	GRANT SELECT, UPDATE, DELETE ON inbox TO outbox_worker;
	GRANT SELECT ON poison_policy, publisher_control TO outbox_worker;
} . ($extra_sql // ''));
	$node->append_conf('postgresql.conf', "outbox.role = 'outbox_worker'\n");
	$node->restart;
	return;
}

# Append a line to the node's postgresql.conf and reload.
sub reload_with
{
	my ($node, $line) = @_;

	$node->append_conf('postgresql.conf', "$line\n");
	$node->reload;
	return;
}

# Write $content to $path and give it $mode (a secrets file's permissions).
sub write_file_mode
{
	my ($path, $content, $mode) = @_;

	open my $fh, '>', $path or die "cannot write $path: $!";
	print $fh $content;
	close $fh;
	chmod $mode, $path or die "chmod: $!";
	return;
}

# A started mock Kafka cluster in its own directory under tmp_check:
# brokers (default 1), topics (["name:partitions", ...]), max_seconds
# (default 300), then the control commands of mock_cmds, in order.
sub mock_setup
{
	my (%opts) = @_;
	my $dir = "$PostgreSQL::Test::Utils::tmp_check/mock_" . ($opts{name} // 'kafka');

	mkdir $dir;
	my $mk = MockKafka->start(dir => $dir,
		brokers => $opts{brokers} // 1,
		max_seconds => $opts{max_seconds} // 300,
		defined $opts{topics} ? (topics => $opts{topics}) : ());
	$mk->cmd($_) for @{ $opts{mock_cmds} // [] };
	return $mk;
}

# The usual start of a test: a Kafka cluster and a node on it made by
# make_node (default outbox_node) with every other option as its settings.
# The cluster is the mock (options brokers, topics, max_seconds, mock_cmds
# as for mock_setup) or, with kafka => 'real', a real one (RealTest's
# real_cluster: options brokers, topics, max_seconds; sasl => MECHANISM
# starts it with SASL and logs the publisher in with that mechanism's user).
# Returns ($node, $cluster).
sub outbox_setup
{
	my ($name, %opts) = @_;
	my $kafka = delete $opts{kafka} // 'mock';
	my %cluster;

	for my $k (qw(brokers topics max_seconds mock_cmds sasl))
	{
		$cluster{$k} = delete $opts{$k} if exists $opts{$k};
	}
	my $make_node = delete $opts{make_node} // \&outbox_node;
	my ($cl, %conf);
	if ($kafka eq 'real')
	{
		require RealTest;
		my $sasl = delete $cluster{sasl};
		$cl = RealTest::real_cluster(%cluster, $sasl ? (sasl => 1) : ());
		%conf = $cl->outbox_conf($sasl ? (sasl => $sasl) : ());
	}
	elsif ($kafka eq 'mock')
	{
		die "outbox_setup: sasl needs kafka => 'real'" if exists $cluster{sasl};
		$cl = mock_setup(name => $name, %cluster);
	}
	else
	{
		die "outbox_setup: kafka must be 'mock' or 'real', not '$kafka'";
	}
	my $node = $make_node->($name, $cl, %conf, %opts);
	return ($node, $cl);
}

# One query's result in database "postgres" of the node outbox_node made
# last (the tests' shorthand).
sub q1
{
	my ($sql) = @_;
	return $last_node->safe_psql('postgres', $sql);
}

# Call $cond every $interval s (default 0.1) until it returns true, for up
# to $timeout s: the seconds taken, or undef on timeout.
sub wait_until
{
	my ($cond, $timeout, $interval) = @_;
	my $t0 = time;

	while (time - $t0 < $timeout)
	{
		return time - $t0 if $cond->();
		sleep($interval // 0.1);
	}
	return undef;
}

# Run $sql in database $db until it returns $want (default 't'), for up to
# $timeout s (default 60): the seconds taken (true, a query ran), or undef
# after a diag of the last answer.
sub poll_until
{
	my ($node, $db, $sql, $want, $timeout) = @_;
	my $got;
	my $t = wait_until(sub {
		$got = $node->safe_psql($db, $sql);
		return $got eq ($want // 't');
	}, $timeout // 60);

	diag "waited for [$sql] = [@{[ $want // 't' ]}], last got [$got]"
	  unless defined $t;
	return $t;
}

# Wait until the server answers in database $db (default "postgres") again
# after a crash restart: true, or false after 60 s.
sub wait_back
{
	my ($node, $db) = @_;

	return defined wait_until(sub {
		eval { $node->safe_psql($db // 'postgres', 'SELECT 1') eq '1' };
	}, 60);
}

# What Kafka holds on @$topics, read back by order_check against every
# aggregate's last version in the node (written to $file): four results
# (the checker's verdict, nothing lost, no gap or inversion, no
# duplicate).  Returns the checker's result hash.
sub order_clean
{
	my ($mk, $node, $topics, $file) = @_;
	my $r = $mk->check(
		topics => $topics,
		expect => expect_file($node, $file),
		opts => [ '--timeout-ms', '20000' ]);

	is($r->{exit}, 0, 'order_check: ' . ($r->{output} =~ s/\s+$//r));
	is($r->{lost}, 0, 'nothing lost');
	is($r->{gaps} + $r->{inversions}, 0, 'no gap, no inversion');
	is($r->{duplicates}, 0, 'no duplicate');
	return $r;
}

# Wait until nothing is pending; returns seconds taken, or undef on timeout.
sub wait_published
{
	my ($node, $timeout) = @_;

	$timeout //= 120;
	my $t = wait_until(sub {
		$node->safe_psql('postgres', 'SELECT count(*) FROM outbox_pending') == 0;
	}, $timeout);
	diag "still pending after ${timeout}s: "
	  . $node->safe_psql('postgres', 'SELECT count(*) FROM outbox_pending')
	  unless defined $t;
	return $t;
}

# Write the expected last version of every aggregate (1..N must all be in
# Kafka) to a file for order_check.
sub expect_file
{
	my ($node, $path) = @_;

	my $rows = $node->safe_psql('postgres',
		q{SELECT aggregate_id || E'\t' || max(aggregate_version)
		  FROM outbox GROUP BY aggregate_id ORDER BY 1});
	open my $fh, '>', $path or die "cannot write $path: $!";
	print $fh "$rows\n" if $rows ne '';
	close $fh;
	return $path;
}

# Write the database's event_id at every (aggregate, version) to a file for
# order_check --events, which then finds any message Kafka holds at a
# version the database gave to another event.
sub events_file
{
	my ($node, $path) = @_;

	my $rows = $node->safe_psql('postgres',
		q{SELECT aggregate_id || E'\t' || aggregate_version || E'\t' || event_id
		  FROM outbox ORDER BY aggregate_id, aggregate_version});
	open my $fh, '>', $path or die "cannot write $path: $!";
	print $fh "$rows\n" if $rows ne '';
	close $fh;
	return $path;
}

# Run pgbench with a script of concurrent emitters: $clients sessions,
# $tx transactions each, over $aggregates aggregates, rolling back about
# one transaction in ten (or for $seconds, at $rate transactions/s if
# given).  Returns the pgbench harness (not yet finished) when $background
# is true.
sub emit_load
{
	my ($node, %a) = @_;
	my $clients = $a{clients} // 4;
	my $tx = $a{transactions} // 500;
	my $aggregates = $a{aggregates} // 100;
	my $per_tx = $a{events_per_tx} // 1;
	my $script = "$PostgreSQL::Test::Utils::tmp_check/emit_$$.sql";

	open my $fh, '>', $script or die $!;
	print $fh "\\set aid random(1, $aggregates)\n";
	print $fh "\\set rb random(1, 10)\n";
	print $fh "BEGIN;\n";
	print $fh "SELECT outbox_emit('load', 'agg-' || :aid, 'Changed', jsonb_build_object('client', :client_id, 'n', $_));\n"
	  for 1 .. $per_tx;
	print $fh "\\if :rb = 1\nROLLBACK;\n\\else\nCOMMIT;\n\\endif\n";
	close $fh;

	# -T seconds (at --rate tx/s if given) instead of -t transactions
	my @run = defined $a{seconds} ? ('-T', $a{seconds}) : ('-t', $tx);
	push @run, '-R', $a{rate} if defined $a{rate};
	my @cmd = ('pgbench', '-n', '-c', $clients, '-j', 2, @run,
		'-f', $script, '-h', $node->host, '-p', $node->port, 'postgres');
	my ($out, $err) = ('', '');
	if ($a{background})
	{
		return IPC::Run::start(\@cmd, '>', \$out, '2>', \$err);
	}
	IPC::Run::run(\@cmd, '>', \$out, '2>', \$err)
	  or die "pgbench failed: $err";
	return;
}

# One publisher counter from outbox_counters().
sub counter
{
	my ($node, $name) = @_;
	return $node->safe_psql('postgres',
		"SELECT value FROM outbox_counters() WHERE name = '$name'");
}

1;
