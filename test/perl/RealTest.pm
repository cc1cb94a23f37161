# test/perl/RealTest.pm
#
# Shared pieces of the real-Kafka TAP tests (test/t/2NN_real_*.pl): a
# cluster under the test's tmp_check, the records as Kafka holds them
# (partition, offset, event id), and the verdict every test ends with: the
# order checker (no gap, no inversion, none lost, every record the
# database's event at its version), the publisher's order_violations
# counter at 0, and one figures line,
#
#   FIGURES scenario=real_<name> events=N duplicates=D gaps=G inversions=I
#     lost=L mismatched=K recover_s=S creations=C fatal=F implicit_acks=A
#     [more key=value]
#
# like the mock fault tests' (FaultTest.pm), plus the fatal producer errors
# (delivery_errors_fatal), producer creations and events acknowledged
# without an offset (implicit_acks, from the publisher's log) of the run;
# nothing is excused.  The database does not record where (partition, offset) or when
# an event was published: Kafka says where (real_records), and when is
# seen by sampling outbox_pending / outbox_events over time.

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

our @EXPORT = qw(real_cluster real_verdict real_read_all real_readback real_records
  real_homes aggregates_on first_published_since start_real_load);

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

# The real-Kafka fault tests' load: 4 clients, 5 events a transaction over
# 1000 aggregates at 120 transactions/s, carrying on across restarts
# (resilient, at most 300 s); returns once 2000 events exist (at most 30 s).
sub start_real_load
{
	my ($node) = @_;
	return start_load($node, clients => 4, jobs => 1, resilient => 1,
		events_per_tx => 5, aggregates => 1000, rate => 120, max_s => 300,
		until_id => 2000, within_s => 30);
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
	my $ids = events_file($node, "$dir/events_$name");
	my $r = real_read_all($rk, topics => $topics, expect => $expect, events => $ids,
		sasl => $a{sasl});

	is($r->{exit}, 0, "$name: order checker clean")
	  or diag _anomalies($rk, $topics, $expect, $ids, \%a);
	is($r->{gaps}, 0, "$name: no gap");
	is($r->{inversions}, 0, "$name: no inversion");
	is($r->{lost}, 0, "$name: none lost");
	is($r->{mismatched}, 0, "$name: every record in Kafka is the database's event at its version");
	is($r->{accepted}, $events, "$name: every published event accepted once")
	  unless $a{no_accepted};
	is(counter($node, 'order_violations'), '0', "$name: order_violations counter stays 0");

	my %f = (fatal => counter($node, 'delivery_errors_fatal'),
		creations => counter($node, 'producer_creations'),
		implicit_acks => _implicit_acks($node, $where),
		%{ $a{figures} // {} });
	my $line = sprintf
	  "FIGURES scenario=real_%s events=%s duplicates=%s gaps=%s inversions=%s lost=%s mismatched=%s recover_s=%s",
	  $name, $events, map({ $r->{$_} // '?' } qw(duplicates gaps inversions lost mismatched)),
	  defined $a{recover_s} ? sprintf('%.2f', $a{recover_s}) : 'na';
	$line .= join '', map { " $_=$f{$_}" } sort keys %f;
	note $line;
	note "checker: $1" if $r->{output} =~ /^order_check: (messages=.*)$/m;
	return $r;
}

# order_check over the topics (expect/events files as $rk->check takes them),
# read again while it finds events missing, three times at most, 3 s apart:
# order_check reads each partition up to the high watermark it queried, and
# right after a leader change (a paused broker resumed and made leader
# again) that can lag the records already acknowledged; a CI run read
# 15,530 of 19,590 events and, a moment later, all of them.  A record
# really missing stays missing.
sub real_read_all
{
	my ($rk, %a) = @_;
	my $r;
	for my $attempt (1 .. 3)
	{
		$r = $rk->check(topics => $a{topics}, expect => $a{expect}, events => $a{events},
			opts => ['--timeout-ms', 60000], sasl => $a{sasl});
		last unless ($r->{lost} // 0) > 0 && $attempt < 3;
		note "read back $r->{messages} messages, $r->{lost} events missing: reading again in 3 s";
		sleep 3;
	}
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

# Events matching $where that librdkafka acknowledged without an offset
# (implied by a later request's success), which the mock can lose
# (FaultTest.pm) and a real broker must hold: counted from the publisher's
# log, the only record of them.
sub _implicit_acks
{
	my ($node, $where) = @_;
	my %judged = map { ($_ => 1) } split /\n/, $node->safe_psql('postgres',
		"SELECT DISTINCT aggregate_id FROM outbox WHERE $where");
	my @runs = PostgreSQL::Test::Utils::slurp_file($node->logfile) =~
	  /outbox: acknowledged without an offset: aggregate "([^"]+)" versions (\d+)\.\.(\d+)/g;
	my $n = 0;
	while (my ($agg, $lo, $hi) = splice(@runs, 0, 3))
	{
		$n += $hi - $lo + 1 if $judged{$agg};
	}
	return $n;
}

# The records of $a{topics} as Kafka holds them (order_check --print): a
# list of { topic, partition, offset, key, version, event_id }, in no
# particular order.  Dies if the read was incomplete.
sub real_records
{
	my ($rk, %a) = @_;
	my $c = $rk->check(topics => $a{topics}, sasl => $a{sasl},
		opts => ['--print', '--any-start', '--timeout-ms', 60000]);
	die "real_records: order_check could not read @{ $a{topics} }:\n$c->{output}"
	  unless defined $c->{exit} && ($c->{exit} == 0 || $c->{exit} == 1);
	my @recs;
	my $rec;
	for my $line (split /\n/, $c->{output})
	{
		if ($line =~ /^(\S+) \[(\d+)\] \@(\d+) key=(.*) version=(\d+|\(invalid\))$/)
		{
			$rec = { topic => $1, partition => $2, offset => $3, key => $4,
				version => $5 };
			push @recs, $rec;
		}
		elsif ($rec && $line =~ /^    headers:.* event_id=(\S+)/)
		{
			$rec->{event_id} = $1;
		}
	}
	die "real_records: $c->{messages} messages but @{[ scalar @recs ]} printed"
	  unless @recs == ($c->{messages} // -1);
	return \@recs;
}

# Where Kafka holds each aggregate of $a{topics}: aggregate id => "topic/partition"
# of its records (the partitioner keeps an aggregate on one partition;
# order_check counts any that is not as split).
sub real_homes
{
	my ($rk, %a) = @_;
	return { map { ($_->{key} => "$_->{topic}/$_->{partition}") }
		  @{ real_records($rk, %a) } };
}

# The aggregates that $homes (from real_homes) places on these partitions
# of $topic.
sub aggregates_on
{
	my ($homes, $topic, @partitions) = @_;
	my %on = map { ("$topic/$_" => 1) } @partitions;
	return [ sort grep { $on{ $homes->{$_} } } keys %$homes ];
}

# The event id of the first event of the aggregates @$aggs emitted after
# $since (a timestamptz) that is published (no longer pending, not disposed
# of), or undef if none is yet.
sub first_published_since
{
	my ($node, $aggs, $since) = @_;
	return undef unless @$aggs;
	# an array literal of quoted elements, inside a string literal
	my $list = join ',', map { '"' . (s/(["\\])/\\$1/gr =~ s/'/''/gr) . '"' } @$aggs;
	my $id = $node->safe_psql('postgres', qq{
		SELECT event_id FROM outbox_events
		 WHERE state = 'published' AND created_at > '$since'
		   AND aggregate_id = ANY ('{$list}'::text[])
		 ORDER BY id LIMIT 1});
	return $id eq '' ? undef : $id;
}

# Anomalies of a failed check (not its duplicates), for the log.
sub _anomalies
{
	my ($rk, $topics, $expect, $ids, $a) = @_;
	my $v = $rk->check(topics => $topics, expect => $expect, events => $ids, sasl => $a->{sasl},
		opts => ['--verbose', '--timeout-ms', 60000]);
	my @lines = grep { !/: duplicate: / } split /\n/, $v->{output};
	splice @lines, 60 if @lines > 60;
	return join "\n", @lines;
}

1;
