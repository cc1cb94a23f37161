# Sustained load on a real Kafka cluster (3 brokers, RF 3), both halves:
# emit -> publish -> inbox apply, at OUTBOX_SOAK_RATE events/s (default
# 5,000: pgbench, 10 events per transaction on aggregates of 10,000) for
# OUTBOX_SOAK_SECONDS (default 600), with the server's default autovacuum,
# outbox.retention = 0 and outbox.inbox_retention = 1min.  Sampled every
# 10 s: events emitted, published and applied per second, the publishing
# lag (pending events) and the inbox lag (published, not applied), the
# extension's tables in both databases (bytes), and the private memory
# (RssAnon: not the shared buffers a process has touched) of every
# publisher and inbox worker.  Flat means: over the second half each
# rate within 20% of the target; the lags' last third no higher than their
# first third plus one second of load; tables and memory at the end within
# 25% (plus 8 MB) of the highest sample of the middle third (the tables
# level off once autovacuum has come round, every minute by default: runs
# shorter than about five minutes do not get there).  At the end every event is
# applied once, in version order (a per-aggregate progress row).
#
# Not in test/t (minutes of three JVMs and two busy cores): run it with
#   OUTBOX_SOAK_RATE=5000 OUTBOX_SOAK_SECONDS=600 PROVE_TESTS=test/chaos/real_soak.pl test/run_tests.sh tap
use strict;
use warnings;

use IPC::Run ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use InboxTest;
use OutboxTest;
use RealKafka;
use RealTest;

my $rate = $ENV{OUTBOX_SOAK_RATE} // 5000;
my $seconds = $ENV{OUTBOX_SOAK_SECONDS} // 600;
my $per_tx = 10;
my $topic = 'outbox.event.soak';
my $dir = $PostgreSQL::Test::Utils::tmp_check;

my $rk = real_cluster(topics => ["$topic:6"], max_seconds => $seconds + 900);
my $node = inbox_node('soak', $rk, $rk->outbox_conf,
	retention => '0', inbox_retention => '1min', inbox_workers => 2,
	inbox_kafka_properties => 'session.timeout.ms=6000;heartbeat.interval.ms=500');
$node->append_conf('postgresql.conf', "shared_buffers = 256MB\nmax_wal_size = 4GB\n");
$node->restart;
quiet_statements($node);

# The handler keeps one row per aggregate: its last version, and how many
# applications did not follow the one before (a gap, a repeat, a reversal).
$node->safe_psql('consumer', q{
CREATE ROLE app LOGIN;
CREATE SCHEMA app AUTHORIZATION app;
SET ROLE app;
CREATE TABLE app.progress (aggregate_id text PRIMARY KEY, version bigint NOT NULL,
	applied bigint NOT NULL DEFAULT 1, out_of_order bigint NOT NULL DEFAULT 0);
CREATE FUNCTION app.apply(m inbox_message) RETURNS void LANGUAGE sql AS $$
	INSERT INTO app.progress AS p (aggregate_id, version, out_of_order)
	VALUES (m.aggregate_id, m.aggregate_version, (m.aggregate_version <> 1)::int)
	ON CONFLICT (aggregate_id) DO UPDATE
	   SET version = excluded.version, applied = p.applied + 1,
		   out_of_order = p.out_of_order + (excluded.version <> p.version + 1)::int
$$;
RESET ROLE;
GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure) TO app;
});
$node->safe_psql('consumer',
	qq{SET ROLE app; SELECT inbox_subscribe('soak', ARRAY['$topic'], 'app.apply(inbox_message)'::regprocedure)});

my $script = "$dir/soak.sql";
open my $fh, '>', $script or die "cannot write $script: $!";
print $fh "\\set aid random(1, 10000)\nBEGIN;\n";
print $fh "SELECT outbox_emit('soak', 'agg-' || ((:aid + $_) % 10000), 'Changed', "
  . "'{\"n\": $_, \"pad\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}');\n"
  for 1 .. $per_tx;
print $fh "COMMIT;\n";
close $fh;
my ($out, $err) = ('', '');
my $bench = IPC::Run::start(
	[ 'pgbench', '-n', '-c', 4, '-j', 2, '-R', $rate / $per_tx, '-T', $seconds,
	  '-f', $script, '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);

# The extension's tables in a database, in bytes.
sub ext_bytes
{
	my ($db) = @_;
	return $node->safe_psql($db, q{
		SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_depend d
		  JOIN pg_class c ON c.oid = d.objid AND d.classid = 'pg_class'::regclass
		 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
		   AND c.relkind = 'r'});
}

# Private resident memory (kB) of each worker: "type pid" => kB.
sub worker_rss
{
	my %rss;
	for (split /\n/, $node->safe_psql('postgres', q{SELECT backend_type || ' ' || pid
		FROM pg_stat_activity WHERE backend_type IN ('outbox publisher', 'outbox inbox worker')}))
	{
		my ($pid) = /(\d+)$/;
		next unless -r "/proc/$pid/status";
		$rss{$_} = $1 if slurp_file("/proc/$pid/status") =~ /^RssAnon:\s+(\d+)/m;
	}
	return \%rss;
}

# One sample: cumulative counts, lags, sizes, memory.
sub sample
{
	my $emitted = $node->safe_psql('postgres',
		q{SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outbox_id_seq});
	my $published = counter($node, 'events_published');
	my $applied = $node->safe_psql('consumer', 'SELECT coalesce(sum(applied), 0) FROM app.progress');
	return { t => time, emitted => $emitted, published => $published, applied => $applied,
		pending => $node->safe_psql('postgres', 'SELECT pending_events FROM outbox_status'),
		outbox_bytes => ext_bytes('postgres'), inbox_bytes => ext_bytes('consumer'),
		rss => worker_rss() };
}

my @s = (sample());
note '| t (s) | emit/s | publish/s | apply/s | pending | inbox lag | outbox tables (MB) | inbox tables (MB) | worker memory (MB) |';
while ($bench->pumpable && time - $s[0]{t} < $seconds + 30)
{
	sleep 10;
	$bench->pump_nb;
	my ($a, $b) = ($s[-1], sample());
	my $dt = $b->{t} - $a->{t};
	$b->{$_ . '_rate'} = ($b->{$_} - $a->{$_}) / $dt for qw(emitted published applied);
	$b->{inbox_lag} = $b->{published} - $b->{applied};
	push @s, $b;
	note sprintf '| %d | %.0f | %.0f | %.0f | %s | %d | %.1f | %.1f | %s |', $b->{t} - $s[0]{t},
	  @$b{qw(emitted_rate published_rate applied_rate pending inbox_lag)},
	  $b->{outbox_bytes} / 1048576, $b->{inbox_bytes} / 1048576,
	  join(' ', map { sprintf '%.0f', $b->{rss}{$_} / 1024 } sort keys %{ $b->{rss} });
}
$bench->finish;
like($out, qr/^tps = /m, 'pgbench ran') or diag $err;
note $1 if $out =~ /^(tps = .*)$/m;

# The samples taken while the load ran.
my @run = grep { $_->{t} <= $s[0]{t} + $seconds + 1 } @s[ 1 .. $#s ];
my @second_half = @run[ int(@run / 2) .. $#run ];
for my $k (qw(emitted published applied))
{
	my @off = grep { abs($_->{"${k}_rate"} - $rate) > 0.2 * $rate } @second_half;
	is(scalar @off, 0, "second half: $k within 20% of $rate/s in every sample")
	  or diag join ' ', map { sprintf '%.0f', $_->{"${k}_rate"} } @second_half;
}
my $third = int(@run / 3) || 1;
my @first = @run[ 0 .. $third - 1 ];
my @last = @run[ $#run - $third + 1 .. $#run ];
for my $k (qw(pending inbox_lag))
{
	my ($f) = sort { $b <=> $a } map { $_->{$k} } @first;
	my ($l) = sort { $b <=> $a } map { $_->{$k} } @last;
	cmp_ok($l, '<=', $f + $rate, "$k flat (highest in the first third $f, in the last $l)");
}
my @middle = @run[ $third .. $#run - $third ];
@middle = ($run[-1]) unless @middle;
for my $k (qw(outbox_bytes inbox_bytes))
{
	my ($m) = sort { $b <=> $a } map { $_->{$k} } @middle;
	my $e = $run[-1]{$k};
	cmp_ok($e, '<=', 1.25 * $m + (8 << 20), sprintf '%s flat (%.1f MB at most in the middle third, %.1f MB at the end)',
		$k, $m / 1048576, $e / 1048576);
}
my $e = $run[-1]{rss};
for my $w (sort keys %$e)
{
	my ($m) = sort { $b <=> $a } grep { defined } map { $_->{rss}{$w} } @middle;
	next unless defined $m;
	cmp_ok($e->{$w}, '<=', 1.25 * $m + 8192,
		sprintf '%s memory flat (%.0f MB at most in the middle third, %.0f MB at the end)',
		$w, $m / 1024, $e->{$w} / 1024);
}

ok(defined wait_published($node, 300), 'nothing pending after the load');
my $events = $node->safe_psql('postgres', q{SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outbox_id_seq});
my $t0 = time;
sleep 0.5 while $node->safe_psql('consumer', 'SELECT sum(applied) FROM app.progress') < $events
  && time - $t0 < 300;
is($node->safe_psql('consumer', 'SELECT sum(applied), sum(out_of_order) FROM app.progress'),
	"$events|0", "the inbox applied the $events events once each, in version order");

$node->stop;
$rk->stop;
done_testing();
