# test/perl/FaultTest.pm
#
# Shared pieces of the end-to-end fault tests (test/t/1NN_*.pl): background
# emitters that survive server crashes, waiting for a backlog, the
# database-side invariants, and the order checker's verdict with the
# one-line figure summary every fault test prints:
#
#   FIGURES scenario=<name> events=N duplicates=D gaps=G inversions=I lost=L mock_lost=M mismatched=K recover_s=S
#
# events: events in the database (each must reach Kafka); duplicates, gaps,
# inversions, lost: the order checker's counts; mock_lost: how many of the
# lost the mock never appended although librdkafka acknowledged them
# implicitly (see verdict), excused; recover_s: seconds from the
# end of the fault until the backlog it left was published (what that means
# exactly is said by each test).

package FaultTest;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OutboxTest;

our @EXPORT = qw(start_load stop_load pending max_id wait_backlog immediate_restarts
  db_versions_contiguous judge verdict figures publisher_pids wait_publisher
  kill_publisher_in_batch install_phase_probe quiet_statements fault_conf
  stall_aggregates
  note_counters start_publish_sampler publish_delays savepoint_script);

# A pgbench script for start_load(script => ...): two of $hot aggregates a
# transaction (lower id first: no deadlock), emitting in savepoint s1
# (rolled back 35 % of the time, else released; %x's in_s1 lines added in
# it, its after_s1 lines after it) and a last event; 15 % rolled back.
sub savepoint_script
{
	my ($hot, %x) = @_;
	my ($in_s1, $after_s1) = ($x{in_s1} // '', $x{after_s1} // '');

	return <<"EOS";
\\set x random(1, $hot)
\\set y random(1, $hot)
\\set a1 least(:x, :y)
\\set a2 greatest(:x, :y)
\\set sp random(1, 100)
\\set rb random(1, 100)
BEGIN;
SELECT outbox_emit('hot', 'hot-' || :a1, 'First', jsonb_build_object('client', :client_id));
SAVEPOINT s1;
SELECT outbox_emit('hot', 'hot-' || :a2, 'InSavepoint', jsonb_build_object('client', :client_id));
$in_s1\\if :sp <= 35
ROLLBACK TO SAVEPOINT s1;
\\else
RELEASE SAVEPOINT s1;
\\endif
${after_s1}SELECT outbox_emit('hot', 'hot-' || :a2, 'Last', jsonb_build_object('client', :client_id));
\\if :rb <= 15
ROLLBACK;
\\else
COMMIT;
\\endif
EOS
}

my $load_seq = 0;
my @loads;			# every start_load() handle, for END

# The test framework logs every statement; thousands of emitter statements a
# second would bury the publisher's lines (and cost CPU).  Log the test's own
# statements only at the default level from here on.
sub quiet_statements
{
	my ($node) = @_;
	$node->append_conf('postgresql.conf', "log_statement = 'none'\n");
	$node->reload;
	return;
}

# The default emitter script: one aggregate per transaction, $per_tx
# events, about $rollback_pct % of the transactions rolled back.
sub _default_script
{
	my (%a) = @_;
	my $aggregates = $a{aggregates} // 1000;
	my $per_tx = $a{events_per_tx} // 5;
	my $type = $a{type} // 'load';
	my $prefix = $a{prefix} // 'agg-';
	my $rb = $a{rollback_pct} // 10;
	my $s = "\\set aid random(1, $aggregates)\n\\set rb random(1, 100)\nBEGIN;\n";
	$s .= "SELECT outbox_emit('$type', '$prefix' || :aid, 'Changed', "
	  . "jsonb_build_object('client', :client_id, 'n', $_));\n"
	  for 1 .. $per_tx;
	$s .= "\\if :rb <= $rb\nROLLBACK;\n\\else\nCOMMIT;\n\\endif\n";
	return $s;
}

# Start emitters in the background.  Options:
#   clients (4), jobs (2), aggregates, events_per_tx, type, prefix,
#   rollback_pct: for the default script; script: a pgbench script instead;
#   transactions: per client (one pgbench run; default 1000);
#   rate: transactions per second over all clients (pgbench -R);
#   max_tries: pgbench --max-tries (retries deadlocks and 40001);
#   resilient: loop pgbench runs (of `chunk_s` seconds each) until
#   stop_load(), so that emitters carry on across crash restarts and
#   server restarts (a run aborted by a crash is simply started again);
#   until_id: return only once that many events exist (at most within_s
#   seconds, default 120), so that a fault lands on a load under way.
# Returns a handle for stop_load().
sub start_load
{
	my ($node, %a) = @_;
	my $dir = $PostgreSQL::Test::Utils::tmp_check;
	$load_seq++;
	my $base = "$dir/load_${$}_$load_seq";
	my $script = "$base.sql";

	open my $fh, '>', $script or die "cannot write $script: $!";
	print $fh ($a{script} // _default_script(%a));
	close $fh;

	my @pgbench = ('pgbench', '-n', '-c', $a{clients} // 4,
		'-j', $a{jobs} // 2, '-f', $script,
		'-h', $node->host, '-p', $node->port);
	push @pgbench, '-R', $a{rate} if $a{rate};
	push @pgbench, '--max-tries', $a{max_tries} if $a{max_tries};

	my %h = (base => $base, log => "$base.log", stop => "$base.stop",
		resilient => $a{resilient});
	if ($a{resilient})
	{
		# Bounded even if the test dies without stop_load (see END).
		my $chunk = $a{chunk_s} // 2;
		my $max_s = $a{max_s} // 300;
		my $cmd = join ' ', map { "'$_'" } @pgbench, '-T', $chunk, 'postgres';
		$h{harness} = IPC::Run::start(
			[
				'bash', '-c',
				qq{while [ ! -e '$h{stop}' ] && [ \$SECONDS -lt $max_s ]; do $cmd >>'$h{log}' 2>&1; }
				  . qq{echo "pgbench exit \$?" >>'$h{log}'; sleep 0.1; done}
			],
			'<', '/dev/null');
	}
	else
	{
		push @pgbench, '-t', $a{transactions} // 1000, 'postgres';
		$h{harness} = IPC::Run::start(\@pgbench, '<', '/dev/null',
			'>', $h{log}, '2>&1');
	}
	push @loads, \%h;
	if ($a{until_id})
	{
		my $t0 = time;
		my $within = $a{within_s} // 120;
		sleep 0.2 while max_id($node) < $a{until_id} && time - $t0 < $within;
	}
	return \%h;
}

# When each event was published, as seen from the database: nothing is
# written per event when Kafka acknowledges it (the aggregate's progress
# covers it), so a session samples every 50 ms, for at most $seconds, the
# events that became published since, into published_seen.  Returns the
# harness (publish_delays() stops it).
sub start_publish_sampler
{
	my ($node, $seconds) = @_;

	$node->safe_psql('postgres', q{
		CREATE TABLE published_seen (id bigint PRIMARY KEY, at timestamptz NOT NULL);
		CREATE TABLE sampler_stop (stop boolean);
		CREATE PROCEDURE sample_published(seconds float8) LANGUAGE plpgsql AS $$
		DECLARE t0 timestamptz := clock_timestamp();
		BEGIN
			WHILE clock_timestamp() < t0 + make_interval(secs => seconds)
				  AND NOT EXISTS (SELECT 1 FROM sampler_stop) LOOP
				INSERT INTO published_seen
				SELECT o.id, clock_timestamp()
				  FROM outbox o JOIN aggregate_publication p USING (aggregate_id)
				 WHERE o.aggregate_version <= p.last_published_version
				   AND NOT EXISTS (SELECT 1 FROM published_seen s WHERE s.id = o.id);
				COMMIT;
				PERFORM pg_sleep(0.05);
			END LOOP;
		END $$;});
	return IPC::Run::start(
		[ 'psql', '-X', '-d', $node->connstr('postgres'), '-c', "CALL sample_published($seconds)" ],
		'<', '/dev/null', '>', '/dev/null', '2>&1');
}

# Publish delays (ms, published_seen.at - created_at) of the events matching
# $where (stopping the sampler): a list of [aggregate_id, delay].
sub publish_delays
{
	my ($node, $sampler, $where) = @_;

	$node->safe_psql('postgres', 'INSERT INTO sampler_stop VALUES (true)');
	$sampler->finish;
	return map { [ split /\|/ ] } split /\n/, $node->safe_psql('postgres', qq{
		SELECT o.aggregate_id, round(extract(epoch FROM s.at - o.created_at) * 1000)
		  FROM outbox o JOIN published_seen s USING (id) WHERE $where});
}

# Emitters still running when the test ends (it died, or forgot): stop them
# so that nothing outlives the test.
END
{
	local ($?, $@);
	for my $h (@loads)
	{
		next unless $h->{harness} && $h->{harness}->pumpable;
		if (open my $fh, '>', $h->{stop}) { close $fh }
		eval { $h->{harness}->kill_kill(grace => 2) };
	}
}

# Stop (resilient) or await (one run) the emitters; returns true when a
# plain run succeeded (a resilient loop always counts as success).
sub stop_load
{
	my ($h, $timeout) = @_;
	$timeout //= 300;
	if ($h->{resilient})
	{
		open my $fh, '>', $h->{stop} or die $!;
		close $fh;
	}
	my $t0 = time;
	while ($h->{harness}->pumpable && time - $t0 < $timeout)
	{
		sleep 0.1;
		eval { $h->{harness}->pump_nb };
	}
	if ($h->{harness}->pumpable)
	{
		diag "emitters did not finish within ${timeout}s; killed";
		$h->{harness}->kill_kill(grace => 2);
		return 0;
	}
	$h->{harness}->finish;
	my $ok = $h->{resilient} ? 1 : ($h->{harness}->result(0) == 0);
	diag "pgbench failed:\n" . PostgreSQL::Test::Utils::slurp_file($h->{log})
	  unless $ok;
	return $ok;
}

sub pending
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		'SELECT count(*) FROM outbox_pending');
}

sub max_id
{
	my ($node) = @_;
	return $node->safe_psql('postgres', 'SELECT coalesce(max(id), 0) FROM outbox');
}

# Wait until no event with id <= $id is pending (the backlog that existed
# when the fault ended), even while emitters keep adding newer ones.
# Returns the seconds taken, or undef on timeout.
sub wait_backlog
{
	my ($node, $id, $timeout) = @_;
	my $t0 = time;
	$timeout //= 180;
	while (time - $t0 < $timeout)
	{
		my $n = $node->safe_psql('postgres',
			"SELECT count(*) FROM outbox_pending WHERE id <= $id");
		return time - $t0 if $n == 0;
		sleep 0.05;
	}
	diag "backlog up to id $id still pending after ${timeout}s";
	return undef;
}

# Stop $node immediately and start it again, $n times, $o{every_s} s
# apart (default 1.5; $o{down_s} s down, default 0), each time waiting up
# to $o{timeout} s (default 120) for a publisher; then up to $o{backlog_s}
# s (default the same) for the backlog of the last restart.  Returns the seconds from the last
# start until that backlog was published, or undef.
sub immediate_restarts
{
	my ($node, $n, %o) = @_;
	my $timeout = $o{timeout} // 120;
	my $t_last;

	for my $i (1 .. $n)
	{
		sleep($o{every_s} // 1.5);
		my ($pending, $before) = (pending($node), max_id($node));
		$node->stop('immediate');
		sleep $o{down_s} if $o{down_s};
		$node->start;
		$t_last = time;
		ok(defined wait_publisher($node, 1, $timeout), "immediate restart $i: publisher running again");
		note sprintf "immediate restart %d with %d pending: ids %d before, %d after recovery",
		  $i, $pending, $before, max_id($node);
	}
	my $recover = wait_backlog($node, max_id($node), $o{backlog_s} // $timeout);
	ok(defined $recover, 'backlog published after the last restart');
	return defined $recover ? time - $t_last : undef;
}

# Versions in the database are 1..count for every aggregate.
sub db_versions_contiguous
{
	my ($node, $label) = @_;
	is($node->safe_psql('postgres',
		q{SELECT count(*) FROM (SELECT aggregate_id FROM outbox GROUP BY 1
		   HAVING max(aggregate_version) <> count(*) OR min(aggregate_version) <> 1) s}),
		'0', "$label: versions contiguous from 1 in the database");
}

# The order checker's verdict over $topics against the database's
# expectations, without testing it: the checker's result hash, plus events
# (in the database), mock_lost and mock_gaps (excused, see below) and clean
# (nothing but excused anomalies).
#
# One loss is the mock's, not the publisher's: librdkafka acknowledges
# without an offset (the publisher logs them) the messages of a failed request
# when a later request of the same partition succeeds, because a broker that
# checks idempotent sequence numbers accepts the later one only if the
# earlier was persisted.  The mock does not check them, so it may append the
# later request and never the earlier one.  Such versions, and only those,
# are excused; any other missing version fails.
sub judge
{
	my ($mk, $node, $name, %a) = @_;
	my $dir = $PostgreSQL::Test::Utils::tmp_check;
	my $topics = $a{topics} // ['outbox.event.load'];
	my $expect = expect_file($node, "$dir/expect_$name");
	my $ids = events_file($node, "$dir/events_$name");
	my $events = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
	my $r = $mk->check(topics => $topics, expect => $expect, events => $ids,
		opts => ['--timeout-ms', 60000]);
	my $m = { lost => 0, gaps => 0, output => '' };

	$m = _mock_losses($mk, $node, $topics, $expect)
	  if ($r->{exit} == 1 && ($r->{lost} || $r->{gaps}));
	$r->{events} = $events;
	$r->{mock_lost} = $m->{lost};
	$r->{mock_gaps} = $m->{gaps};
	$r->{mock_output} = $m->{output};
	$r->{clean} = $r->{exit} == 0
	  || ($r->{exit} == 1 && $m->{lost} == $r->{lost} && $m->{gaps} == $r->{gaps}
		&& !grep { $r->{$_} } qw(inversions split malformed unexpected mismatched));
	$r->{topics} = $topics;
	$r->{expect} = $expect;
	$r->{ids} = $ids;
	return $r;
}

# Test the verdict of judge(): no gap, no inversion, none lost (but for the
# mock's own losses); duplicates allowed.  Prints the FIGURES line and
# returns the result hash.
sub verdict
{
	my ($mk, $node, $name, %a) = @_;
	my $r = judge($mk, $node, $name, %a);

	note "mock_lost: $r->{mock_lost} version(s) acknowledged implicitly by "
	  . "librdkafka (no offset) were never appended by the mock:\n$r->{mock_output}"
	  if $r->{mock_lost};
	ok($r->{clean}, "$name: order checker clean")
	  or diag _anomalies($mk, $r->{topics}, $r->{expect}, $r, $r->{ids});
	is(_minus($r->{gaps}, $r->{mock_gaps}), 0, "$name: no gap");
	is($r->{inversions}, 0, "$name: no inversion");
	is(_minus($r->{lost}, $r->{mock_lost}), 0, "$name: none lost");
	is($r->{mismatched}, 0, "$name: every version in Kafka is the database's event");
	# The checker does not count the version that follows a gap as accepted.
	is($r->{accepted}, $r->{events} - $r->{mock_lost} - $r->{mock_gaps},
		"$name: every event in the database accepted once");
	figures($name, $r->{events}, $r, $a{recover_s});
	note "checker: $1" if $r->{output} =~ /^order_check: (messages=.*)$/m;
	return $r;
}

# $x - $y, undef if the checker gave no figure.
sub _minus
{
	my ($x, $y) = @_;
	return defined $x ? $x - $y : undef;
}

# The missing versions librdkafka acknowledged implicitly (see verdict):
# their number, the number of gaps made only of them, and the checker's
# lines about them.
sub _mock_losses
{
	my ($mk, $node, $topics, $expect) = @_;
	my %implicit;
	my @runs = slurp_file($node->logfile) =~
	  /outbox: acknowledged without an offset: aggregate "([^"]+)" versions (\d+)\.\.(\d+)/g;
	while (my ($agg, $lo, $hi) = splice(@runs, 0, 3))
	{
		$implicit{"$agg $_"} = 1 for $lo .. $hi;
	}
	my $v = $mk->check(topics => $topics, expect => $expect,
		opts => ['--verbose', '--timeout-ms', 60000]);
	my %m = (lost => 0, gaps => 0, output => '');
	my $all_implicit = sub {
		my ($agg, $lo, $hi) = @_;
		return !grep { !$implicit{"$agg $_"} } $lo .. $hi;
	};

	for my $line (split /\n/, $v->{output})
	{
		if ($line =~ /: lost: aggregate (\S+) versions (\d+)\.\.(\d+) never seen/)
		{
			my ($agg, $lo, $hi) = ($1, $2, $3);

			$m{lost} += grep { $implicit{"$agg $_"} } $lo .. $hi;
			$m{output} .= "$line\n" if $all_implicit->($agg, $lo, $hi);
		}
		elsif ($line =~ /: gap: aggregate (\S+) at .*\((\d+)\.\.(\d+) not seen\)/
			&& $all_implicit->($1, $2, $3))
		{
			$m{gaps}++;
			$m{output} .= "$line\n";
		}
	}
	return \%m;
}

# The anomalies (not the duplicates) of a failed check, for the log.
sub _anomalies
{
	my ($mk, $topics, $expect, $r, $ids) = @_;
	my $v = $mk->check(topics => $topics, expect => $expect, events => $ids,
		opts => ['--verbose', '--timeout-ms', 60000]);
	my @lines = grep { !/: duplicate: / } split /\n/, $v->{output};
	my $more = @lines > 60 ? "\n... " . (@lines - 60) . " more lines" : '';
	return join("\n", @lines[0 .. ($#lines < 59 ? $#lines : 59)]) . $more;
}

sub figures
{
	my ($name, $events, $r, $recover) = @_;
	my $line = sprintf
	  "FIGURES scenario=%s events=%s duplicates=%s gaps=%s inversions=%s lost=%s mock_lost=%s mismatched=%s recover_s=%s",
	  $name, $events, map({ $r->{$_} // '?' } qw(duplicates gaps inversions lost mock_lost mismatched)),
	  defined $recover ? sprintf('%.2f', $recover) : 'na';
	note $line;
	return $line;
}

# Pids of the running publisher workers.
sub publisher_pids
{
	my ($node) = @_;
	my $out = $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox publisher' ORDER BY pid");
	return grep { /^\d+$/ } split /\n/, $out;
}

# Wait until the server accepts connections and $n publishers run (none
# of them with a pid in @$exclude: a killed worker stays listed until the
# postmaster has noticed its death).  Returns the seconds taken or undef.
sub wait_publisher
{
	my ($node, $n, $timeout, $exclude) = @_;
	$n //= 1;
	$timeout //= 120;
	my $not = $exclude && @$exclude ? ' AND pid NOT IN (' . join(',', @$exclude) . ')' : '';
	my $t0 = time;
	while (time - $t0 < $timeout)
	{
		# During a crash restart psql can exit before IPC::Run has written
		# the query to it: the write's broken pipe dies; just look again.
		my ($rc, $out) = eval {
			$node->psql('postgres',
				"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox publisher'$not");
		};
		return time - $t0 if defined $rc && $rc == 0 && $out >= $n;
		sleep 0.05;
	}
	return undef;
}

# A procedure that waits (up to max_ms) until a publisher is inside a batch
# in one of the given phases (default: producing, awaiting acknowledgements
# or marking published) and returns its pid and phase.  It commits between
# looks: pg_stat_activity is a per-transaction snapshot.
sub install_phase_probe
{
	my ($node) = @_;
	$node->safe_psql('postgres', q{
CREATE OR REPLACE PROCEDURE public.fault_wait_batch(max_ms int,
	phases text[] DEFAULT ARRAY['producing', 'awaiting acknowledgements', 'marking published'],
	INOUT wpid int DEFAULT NULL, INOUT wphase text DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz := clock_timestamp();
BEGIN
	LOOP
		SELECT pid, query INTO wpid, wphase FROM pg_catalog.pg_stat_activity
		 WHERE backend_type = 'outbox publisher' AND query = ANY (phases)
		 LIMIT 1;
		EXIT WHEN wpid IS NOT NULL
		  OR clock_timestamp() - t0 > make_interval(secs => max_ms / 1000.0);
		COMMIT;
		PERFORM pg_catalog.pg_sleep(0.0005);
	END LOOP;
END $$});
}

# SIGKILL a publisher caught inside a batch, in one of @$phases if given.
# Returns (phase, pid) as seen just before the kill, or () if none was
# caught within $ms.
sub kill_publisher_in_batch
{
	my ($node, $ms, $phases) = @_;
	my $arr = $phases
	  ? ', ARRAY[' . join(',', map { "'$_'" } @$phases) . ']'
	  : '';
	my ($rc, $out) = $node->psql('postgres',
		"CALL public.fault_wait_batch($ms$arr)");
	return () unless $rc == 0;
	my ($pid, $phase) = split /\|/, $out;
	return () unless defined $pid && $pid =~ /^\d+$/;
	kill 'KILL', $pid or return ();
	return ($phase, $pid);
}

# Node settings of a fault test: OUTBOX_FAULT_KAFKA_PROPERTIES reruns any
# scenario with other producer properties (e.g. max.in.flight=1).
sub fault_conf
{
	my %conf;
	$conf{kafka_properties} = $ENV{OUTBOX_FAULT_KAFKA_PROPERTIES}
	  if $ENV{OUTBOX_FAULT_KAFKA_PROPERTIES};
	return %conf;
}

# Publisher 0 idle with $n aggregates of type $type awaiting Kafka: one
# event published first (the producer is connected, so the outage is what
# delays delivery), then every broker down and $n events emitted, until
# their batch timed out.  Two test results.
sub stall_aggregates
{
	my ($node, $mk, $type, $n) = @_;

	$node->safe_psql('postgres', qq{SELECT outbox_emit('$type', 'warm', 'E', '{}')});
	ok(defined wait_published($node, 30), 'warm-up event published');
	$mk->cmd('all_down');
	$node->safe_psql('postgres',
		qq{SELECT outbox_emit('$type', '$type-' || g, 'E', '{}') FROM generate_series(1, $n) g});
	ok($node->poll_query_until('postgres',
		q{SELECT state LIKE 'idle, % aggregates awaiting Kafka' FROM outbox_workers() WHERE worker = 0}),
		"the batch timed out and its $n aggregates are stalled");
	return;
}

# The run's duration and every non-zero publisher counter, for the log.
sub note_counters
{
	my ($node, $t_start) = @_;
	note sprintf "all done %.1f s after the start; counters: %s", time - $t_start,
	  $node->safe_psql('postgres',
		q{SELECT string_agg(name || '=' || value, ' ') FROM outbox_counters()
		   WHERE value <> 0});
}

1;
