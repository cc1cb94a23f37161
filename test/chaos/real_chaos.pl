# Randomized faults on a real Kafka cluster (3 brokers, RF 3,
# min.insync.replicas 2; test/tools/kafka_cluster), emit -> publish ->
# inbox apply, under a steady emit load with rollbacks and savepoints:
#
#   broker SIGKILL and restart, SIGSTOP of a partition leader or of the
#   active controller, a broker's clean restart (one step of a rolling
#   restart), publisher and inbox-worker SIGKILL (crash restarts),
#   immediate PostgreSQL restarts, fast PostgreSQL restarts, reloads,
#
# one at a time for OUTBOX_CHAOS_SECONDS (default 120), in rounds that each
# take every fault once in a random order,
# seeded by OUTBOX_CHAOS_SEED (default: the time; printed, so a run can be
# repeated).  The verdict, from Kafka (order_check) and from the consumer
# database: no event lost, no gap, no inversion, no record in Kafka that is
# not the database's event at its version (phantom, rolled back), every
# committed event applied exactly once by the inbox in version order, and
# fewer than 1% of the events duplicated in Kafka.  Reported: the p99 publish
# delay (emit to Kafka's append; the topic keeps LogAppendTime) of the events
# of partitions that kept a leader, leaving out those emitted during a fault
# of their partition's leader or of PostgreSQL (from 1 s before it to 10 s
# after it ended); and the p99 of the events emitted outside every fault
# (a stopped follower holds up its leader's acknowledgements too, acks=all,
# until it leaves the ISR).
#
# Not in test/t (minutes of three JVMs): run it with
#   OUTBOX_CHAOS_SEED=1 PROVE_TESTS=test/chaos/real_chaos.pl test/run_tests.sh tap
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use List::Util qw(shuffle);
use Time::HiRes qw(time sleep);

use FaultTest;
use InboxTest;
use OutboxTest;
use RealKafka;
use RealTest;

my $seed = $ENV{OUTBOX_CHAOS_SEED} // time % 100000;
my $seconds = $ENV{OUTBOX_CHAOS_SECONDS} // 120;
srand($seed);
note "chaos seed $seed, $seconds s (OUTBOX_CHAOS_SEED=$seed repeats its order of faults)";

my $topic = 'outbox.event.load';
my $rk = real_cluster(max_seconds => $seconds + 900);
$rk->topic($topic, 6, configs => { 'message.timestamp.type' => 'LogAppendTime' });
my $node = inbox_node('chaos', $rk, $rk->outbox_conf,
	inbox_workers => 2, inbox_batch_size => 200,
	inbox_kafka_properties =>
	  'session.timeout.ms=6000;heartbeat.interval.ms=500;max.poll.interval.ms=8000');
$node->append_conf('postgresql.conf', "restart_after_crash = on\n");
$node->reload;
quiet_statements($node);
setup_consumer($node, 'billing', $topic);
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false, delay = 0');

# Emitters: two events per transaction, the second in a savepoint rolled
# back one time in five; one transaction in ten rolled back as a whole.
my $script = <<'EOS';
\set aid random(1, 300)
\set sp random(1, 5)
\set rb random(1, 10)
BEGIN;
SELECT outbox_emit('load', 'agg-' || :aid, 'Changed', jsonb_build_object('client', :client_id, 'n', 1));
SAVEPOINT s;
SELECT outbox_emit('load', 'agg-' || :aid, 'Changed', jsonb_build_object('client', :client_id, 'n', 2));
\if :sp = 1
ROLLBACK TO SAVEPOINT s;
\endif
\if :rb = 1
ROLLBACK;
\else
COMMIT;
\endif
EOS
my $load = start_load($node, script => $script, clients => 4, rate => 200,
	resilient => 1, chunk_s => 3, max_s => $seconds + 600);

# A psql that tolerates a server restarting (undef when it failed).
sub try_psql
{
	my ($db, $sql) = @_;
	my ($rc, $out) = eval { $node->psql($db, $sql) };
	return defined $rc && $rc == 0 ? $out : undef;
}

# Wait until the server accepts connections again.
sub wait_server
{
	my $t0 = time;
	sleep 0.2 until defined try_psql('postgres', 'SELECT 1') || time - $t0 > 60;
}

# A random element.
sub pick { return $_[ int(rand(@_)) ] }

# The partitions broker $id leads now (a hash partition => 1).
sub led_by
{
	my ($id) = @_;
	my $l = $rk->leaders($topic);
	return { map { $_ => 1 } grep { $l->{$_} == $id } keys %$l };
}

# SIGSTOP node $id ($role) for 3-6 s; a fault's description and what it hit.
sub pause_node
{
	my ($id, $role) = @_;
	my $hit = led_by($id);
	$rk->node('pause', $id);
	sleep 3 + rand(3);
	$rk->node('resume', $id);
	return ("SIGSTOP $role $id, resumed", $hit);
}

# The faults: each returns a short description of what it did and what it
# hit: the partitions whose leader it stopped, 'all' (PostgreSQL), or none.
my %faults = (
	broker_kill => sub {
		my $id = 1 + int(rand(3));
		my $hit = led_by($id);
		$rk->node('kill', $id);
		sleep 2 + rand(3);
		$rk->node('start', $id);
		return ("SIGKILL broker $id, restarted", $hit);
	},
	leader_pause => sub {
		my $l = $rk->leaders($topic);
		return pause_node(pick(values %$l) // 1 + int(rand(3)), 'leader');
	},
	controller_pause => sub {
		return pause_node($rk->active_controller // 1 + int(rand(3)), 'active controller');
	},
	broker_restart => sub {
		my $id = 1 + int(rand(3));
		my $hit = led_by($id);
		$rk->node('restart', $id);
		$rk->wait_isr([$topic], 3, 120);
		return ("clean restart of broker $id", $hit);
	},
	publisher_kill => sub {
		my @p = publisher_pids($node);
		return ('no publisher to kill') unless @p;
		kill 'KILL', $p[0];
		wait_server();
		return ("SIGKILL publisher $p[0] (crash restart)", 'all');
	},
	inbox_kill => sub {
		my @p = inbox_pids($node);
		return ('no inbox worker to kill') unless @p;
		my $pid = pick(@p);
		kill 'KILL', $pid;
		wait_server();
		return ("SIGKILL inbox worker $pid (crash restart)", 'all');
	},
	immediate_restart => sub {
		$node->stop('immediate');
		$node->start;
		return ('pg_ctl restart -m immediate', 'all');
	},
	fast_restart => sub {
		$node->restart;
		return ('pg_ctl restart -m fast', 'all');
	},
	reload => sub {
		try_psql('postgres', 'SELECT pg_reload_conf()');
		return ('reload');
	},
);

# Publish delays (ms) of the events of partitions that kept a leader (see
# the top): Kafka's append time of an event's first copy minus its emit
# time, leaving out events emitted inside a window that hit their partition.
sub kept_leader_delays
{
	my ($windows) = @_;
	my $c = $rk->check(topics => [$topic],
		opts => ['--print', '--any-start', '--timeout-ms', 60000]);
	my (%append, %part, $rec);
	for my $line (split /\n/, $c->{output})
	{
		if ($line =~ /^\Q$topic\E \[(\d+)\] \@\d+ key=/) { $rec = { p => $1 } }
		elsif ($rec && $line =~ /^    headers:.* event_id=(\S+)/) { $rec->{id} = $1 }
		elsif ($rec && defined $rec->{id} && $line =~ /^    timestamp: append (\d+)/)
		{
			$append{ $rec->{id} } = $1
			  if !defined $append{ $rec->{id} } || $1 < $append{ $rec->{id} };
			$part{ $rec->{id} } = $rec->{p};
			undef $rec;
		}
	}
	my @d;
	for (split /\n/, $node->safe_psql('postgres',
		q{SELECT event_id, round(extract(epoch FROM created_at) * 1000) FROM outbox}))
	{
		my ($id, $created) = split /\|/;
		next unless defined $append{$id};
		my $t = $created / 1000;
		next if grep {
			$t >= $_->{from} && $t <= $_->{to}
			  && ($_->{hit} eq 'all' || $_->{hit}{ $part{$id} })
		} @$windows;
		push @d, $append{$id} - $created;
	}
	return sort { $a <=> $b } @d;
}

my $t_start = time;
my %done;
my @round;
my @windows;
sleep 5;
while (time - $t_start < $seconds)
{
	@round = shuffle(sort keys %faults) unless @round;
	my $f = shift @round;
	my $t0 = time;
	my ($what, $hit) = $faults{$f}->();
	push @windows, { from => $t0 - 1, to => time + 10, hit => $hit } if $hit;
	$done{$f}++;
	note sprintf "%6.1f s: %s (%.1f s)", $t0 - $t_start, $what, time - $t0;
	sleep 2 + rand(3);
}
note 'faults: ' . join(' ', map { "$_=$done{$_}" } sort keys %done);

ok(stop_load($load, 60), 'emitters stopped');
for my $id (1 .. 3)
{
	eval { $rk->node('resume', $id) };
	eval { $rk->node('start', $id) };
}
ok(defined $rk->wait_isr([$topic], 3, 180), 'every partition in sync again');
ok(defined wait_published($node, 300), 'nothing pending');

my $events = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
ok(defined wait_applied($node, $events, 300), "the inbox applied the $events events");
# p50, p99 and max of a sorted list, and a line saying them.
sub quantiles
{
	my ($label, @d) = @_;
	my @q = @d ? ($d[ int(0.5 * $#d) ], $d[ int(0.99 * $#d) ], $d[-1]) : ('na') x 3;
	note sprintf 'publish delay, %s: %d events, p50 %s ms, p99 %s ms, max %s ms',
	  $label, scalar @d, @q;
	return $q[1];
}
my $p99 = quantiles('partitions that kept a leader', kept_leader_delays(\@windows));
my $p99_quiet = quantiles('outside every fault',
	kept_leader_delays([ map { { %$_, hit => 'all' } } @windows ]));
my $r = real_verdict($rk, $node, 'chaos',
	figures => { seed => $seed, %done, p99_kept_leader_ms => $p99, p99_quiet_ms => $p99_quiet });
my @p = consumer_verdict($node);
is_deeply(\@p, [], 'consumer: every committed event applied exactly once, in version order')
  or diag join("\n", @p);
cmp_ok($r->{duplicates} // 1e9, '<', 0.01 * $events,
	"fewer than 1% of the $events events duplicated in Kafka (" . ($r->{duplicates} // '?') . ')');
note_counters($node, $t_start);

$node->stop;
$rk->stop;
done_testing();
