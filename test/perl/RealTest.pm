# test/perl/RealTest.pm
#
# Shared pieces of the real-Kafka TAP tests (test/t/2NN_real_*.pl): a
# cluster under the test's tmp_check, and the verdict every one of them ends
# with: the order checker (no gap, no inversion, none lost), the publisher's
# order_violations counter at 0, and one figures line,
#
#   FIGURES scenario=real_<name> events=N duplicates=D gaps=G inversions=I
#     lost=L recover_s=S creations=C fatal=F implicit_acks=A [more key=value]
#
# like the mock fault tests' (FaultTest.pm), plus the fatal producer errors
# (delivery_errors_fatal), producer creations and events acknowledged
# without an offset (implicit_acks) of the run; nothing is excused.

package RealTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use FaultTest;
use OutboxTest;
use RealKafka;

our @EXPORT = qw(real_cluster real_verdict real_readback);

# Start a cluster in tmp_check/kafka_<test file> (bounded by max_seconds,
# default 600).
sub real_cluster
{
	my (%a) = @_;
	my ($test) = $0 =~ m{([^/]+?)(?:\.pl)?$};
	my $dir = "$PostgreSQL::Test::Utils::tmp_check/kafka_$test";
	my $rk = RealKafka->start(dir => $dir, max_seconds => 600, %a);
	note sprintf "real Kafka: %d nodes up in %.1f s (%s)", $a{brokers} // 3,
	  $rk->{start_s}, $rk->bootstrap;
	return $rk;
}

# The verdict: order checker over $a{topics} against the database (the
# events matching $a{where}, default all), the
# order_violations counter, and the FIGURES line (extra figures in
# $a{figures}, a hash).  Returns the checker's result hash.
sub real_verdict
{
	my ($rk, $node, $name, %a) = @_;
	my $dir = $PostgreSQL::Test::Utils::tmp_check;
	my $topics = $a{topics} // ['outbox.event.load'];
	# $a{where}: only these events are judged (e.g. the load's)
	my $where = $a{where} // 'true';
	my $expect = "$dir/expect_$name";
	my $rows = $node->safe_psql('postgres',
		qq{SELECT aggregate_id || E'\t' || max(aggregate_version)
		  FROM outbox WHERE $where GROUP BY aggregate_id ORDER BY 1});
	open my $fh, '>', $expect or die "cannot write $expect: $!";
	print $fh "$rows\n" if $rows ne '';
	close $fh;
	my $events = $node->safe_psql('postgres',
		"SELECT count(*) FROM outbox WHERE $where");
	my $r = $rk->check(topics => $topics, expect => $expect,
		opts => ['--timeout-ms', 60000], sasl => $a{sasl});

	is($r->{exit}, 0, "$name: order checker clean") or diag _anomalies($rk, $topics, $expect, \%a);
	is($r->{gaps}, 0, "$name: no gap");
	is($r->{inversions}, 0, "$name: no inversion");
	is($r->{lost}, 0, "$name: none lost");
	is($r->{accepted}, $events, "$name: every published event accepted once")
	  unless $a{no_accepted};
	is(counter($node, 'order_violations'), '0', "$name: order_violations counter stays 0");

	# implicit_acks: events librdkafka acknowledged without an offset (-1001),
	# which the mock can lose (FaultTest.pm); a real broker must hold them
	my %f = (fatal => counter($node, 'delivery_errors_fatal'),
		creations => counter($node, 'producer_creations'),
		implicit_acks => $node->safe_psql('postgres',
			"SELECT count(*) FROM outbox WHERE $where AND kafka_offset = -1001"),
		%{ $a{figures} // {} });
	my $line = sprintf
	  "FIGURES scenario=real_%s events=%s duplicates=%s gaps=%s inversions=%s lost=%s recover_s=%s",
	  $name, $events, map({ $r->{$_} // '?' } qw(duplicates gaps inversions lost)),
	  defined $a{recover_s} ? sprintf('%.2f', $a{recover_s}) : 'na';
	$line .= join '', map { " $_=$f{$_}" } sort keys %f;
	note $line;
	note "checker: $1" if $r->{output} =~ /^order_check: (messages=.*)$/m;
	return $r;
}

# Read the topics back with the Java client and compare its independent
# verdict with order_check's result $r: both must count the same.
sub real_readback
{
	my ($rk, $node, $name, $r, %a) = @_;
	my $dir = $PostgreSQL::Test::Utils::tmp_check;
	my $topics = $a{topics} // ['outbox.event.load'];
	my $expect = expect_file($node, "$dir/expect_${name}_java");
	my $t0 = time;
	my $j = $rk->readback(topics => $topics, expect => $expect);
	is($j->{exit}, 0, "$name: the Java client read the topics back") or diag $j->{output};
	note sprintf "Java read-back in %.1f s: %s", time - $t0,
	  $j->{output} =~ /^(readback: .*)$/m ? $1 : $j->{output};
	for my $k (qw(messages aggregates accepted duplicates gaps inversions lost split))
	{
		is($j->{$k}, $r->{$k}, "$name: Java client and order_check agree on $k");
	}
	return $j;
}

# Anomalies of a failed check (not its duplicates), for the log.
sub _anomalies
{
	my ($rk, $topics, $expect, $a) = @_;
	my $v = $rk->check(topics => $topics, expect => $expect, sasl => $a->{sasl},
		opts => ['--verbose', '--timeout-ms', 60000]);
	my @lines = grep { !/: duplicate: / } split /\n/, $v->{output};
	splice @lines, 60 if @lines > 60;
	return join "\n", @lines;
}

1;
