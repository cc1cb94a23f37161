#!/usr/bin/perl
#
# test/perl/mockkafka_selftest.pl - TAP self-test of MockKafka.pm
#
# Needs the tools built (make -C test/tools) and kcat installed.  Run
# directly or via test/tools/selftest.sh.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use File::Temp ();
use IPC::Run ();
use Test::More;
use Time::HiRes qw(time);

use MockKafka;

my $dir = File::Temp::tempdir('mockkafka_selftest_XXXX',
	TMPDIR => 1, CLEANUP => 1);

# produce(bootstrap, topic, aggregate, version, extra kcat args...)
sub produce
{
	my ($bs, $topic, $agg, $ver, @extra) = @_;
	my $out = '';
	my $in = qq({"aggregate":"$agg","version":$ver}\n);
	IPC::Run::run(
		[
			'kcat', '-P', '-b', $bs, '-t', $topic, '-k', $agg,
			'-H', "event_id=$agg-$ver", '-H', 'event_type=Tested',
			'-H', 'aggregate_type=Test', '-H', "aggregate_id=$agg",
			'-H', "aggregate_version=$ver", @extra
		],
		'<', \$in, '>&', \$out, IPC::Run::timeout(30));
	return ($? == 0, $out);
}

my $mk = MockKafka->start(
	dir => $dir,
	brokers => 3,
	topics => ['t:4'],
	max_seconds => 120);
ok($mk, 'mock started');
like($mk->bootstrap, qr/^127\.0\.0\.1:\d+(,127\.0\.0\.1:\d+){2}$/,
	'bootstrap lists three brokers');
is($mk->cmd('ping'), '', 'ping returns empty data');
is($mk->cmd('bootstrap'), $mk->bootstrap, 'bootstrap command');
ok(!eval { $mk->cmd('down 9'); 1 }, 'bad command dies');
like($@, qr/command "down 9" failed: err invalid broker id/,
	'error message names the command and the reply');

for my $v (1, 2, 3)
{
	my ($ok, $out) = produce($mk->bootstrap, 't', 'p1', $v);
	ok($ok, "produce p1 v$v") or diag $out;
}

my $r = $mk->check(topics => ['t']);
is($r->{exit}, 0, 'check exit 0') or diag $r->{output};
is($r->{messages}, 3, 'messages=3');
is($r->{accepted}, 3, 'accepted=3');
ok(!defined $r->{lost}, 'lost is undef without expect');

$r = $mk->check(topics => ['t'], expect => { p1 => 5 }, opts => ['--verbose']);
is($r->{exit}, 1, 'check with unmet expectation exits 1');
is($r->{lost}, 2, 'lost=2');
like($r->{output}, qr/lost: aggregate p1 versions 4\.\.5/, 'verbose output');

my $expect = "$dir/p1.exp";
open my $fh, '>', $expect or die $!;
print $fh "p1\t3\n";
close $fh;
$r = $mk->check(topics => ['t'], expect => $expect);
is($r->{exit}, 0, 'expect file satisfied');
is($r->{lost}, 0, 'lost=0');

# control: errors, then all_down makes the read time out
is($mk->cmd('errors 0 10'), 'pushed apikey 0: MSG_SIZE_TOO_LARGE',
	'errors reply');
my ($ok, $out) = produce($mk->bootstrap, 't', 'p1', 4);
ok(!$ok, 'produce fails after errors 0 10');
like($out, qr/Message size too large/, 'kcat reports the injected error');

$mk->cmd('all_down');
$r = $mk->check(topics => ['t'], opts => ['--timeout-ms', '1500']);
is($r->{exit}, 2, 'check times out with all brokers down');
$mk->cmd('all_up');
$r = $mk->check(topics => ['t']);
is($r->{exit}, 0, 'check works again after all_up') or diag $r->{output};

# mockctl works with the module's control file
my $reply = '';
IPC::Run::run([ "$FindBin::RealBin/../tools/mockctl", $mk->control_file, 'ping' ],
	'>', \$reply);
is($?, 0, 'mockctl ping exits 0');
is($reply, "ok\n", 'mockctl prints the reply');

my $control = $mk->control_file;
my $t0 = time;
# 0, not -1: the mock exited by itself on "quit" (stop kills it after 10 s).
is($mk->stop, 0, 'stop returns exit status 0');
note sprintf 'stop took %.2f s', time - $t0;
ok(!-e $control, 'control file removed');
ok(!eval { $mk->cmd('ping'); 1 }, 'cmd after stop dies');

# DESTROY stops a mock that goes out of scope
{
	my $mk2 = MockKafka->start(dir => $dir, brokers => 1);
	$control = $mk2->control_file;
	ok(-e $control, 'second mock running');
}
my $gone = 0;
for (1 .. 50)
{
	if (!-e $control) { $gone = 1; last }
	select undef, undef, undef, 0.1;
}
ok($gone, 'DESTROY stopped the second mock');

# start failure is reported with the log
ok(!eval { MockKafka->start(dir => $dir, topics => ['bad']); 1 },
	'bad topic spec makes start die');
like($@, qr/exited with status 1 during startup.*NAME:PARTITIONS/s,
	'start failure includes the log');

done_testing();
