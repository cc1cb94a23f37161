# test/perl/OutboxTest.pm
#
# Shared set-up of the outbox end-to-end TAP tests: a PostgreSQL node with
# the publisher preloaded and pointed at a mock Kafka cluster, and helpers
# to wait for publication and judge what reached Kafka.

package OutboxTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;

our @EXPORT = qw(pinned_init outbox_node wait_published expect_file events_file emit_load counter);

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
# %conf entries are appended to postgresql.conf as outbox.<key> = '<value>'.
sub outbox_node
{
	my ($name, $mk, %conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);

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
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
	return $node;
}

# Wait until nothing is pending; returns seconds taken, or undef on timeout.
sub wait_published
{
	my ($node, $timeout) = @_;
	my $t0 = time;

	$timeout //= 120;
	while (time - $t0 < $timeout)
	{
		my $pending = $node->safe_psql('postgres',
			'SELECT count(*) FROM outbox_pending');
		return time - $t0 if $pending == 0;
		sleep 0.1;
	}
	diag "still pending after ${timeout}s: "
	  . $node->safe_psql('postgres',
		'SELECT count(*) FROM outbox_pending');
	return undef;
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
