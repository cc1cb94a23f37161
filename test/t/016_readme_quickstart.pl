# The README's Quick start, run as written: its ```sql blocks, in order, in
# psql on a fresh server that preloads the library and has outbox.brokers
# set (a mock Kafka cluster).  The last block is the reader's check: it is
# polled until its output is the one the README shows after it.  So the
# test fails when the README drifts from what the extension does.  Also
# the first mistake a newcomer makes there: CREATE EXTENSION into a schema
# that does not exist says to create it first.
use strict;
use warnings;

use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest qw(mock_setup);

my $readme = dirname(__FILE__) . '/../../README.md';

# The ```sql blocks of the Quick start section, and the plain ``` block
# that follows the last one (its expected output).
sub quick_start
{
	my $text = slurp_file($readme);
	my ($section) = $text =~ /^## Quick start\n(.*?)(?=^## )/ms
	  or die "README.md has no section \"## Quick start\"";
	my (@sql, $expected);
	while ($section =~ /^```(\w*)\n(.*?)^```\n/msg)
	{
		push @sql, $2 if $1 eq 'sql';
		$expected = $2 if $1 eq '' && @sql;
	}
	return (\@sql, $expected);
}

# psql's aligned output without blank lines, row counts or trailing blanks.
sub normalize
{
	my ($s) = @_;
	return join "\n", grep { $_ ne '' && !/^\(\d+ rows?\)$/ }
	  map { s/\s+$//r } split /\n/, $s // '';
}

my ($blocks, $expected) = quick_start();
cmp_ok(scalar @$blocks, '>=', 4, 'the Quick start has its SQL blocks');
ok(defined $expected, 'and shows the output of the last one');

my $mk = mock_setup(brokers => 3, max_seconds => 600);

# A fresh server: the library preloaded and the brokers set, nothing else.
my $node = PostgreSQL::Test::Cluster->new('quickstart');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'outbox'
outbox.brokers = '@{[ $mk->bootstrap ]}'
});
$node->start;

# psql as a reader runs it (aligned output, stopping at the first error):
# exit code, stdout, stderr.
sub run_psql
{
	my ($sql) = @_;
	my ($stdout, $stderr) = ('', '');
	IPC::Run::run([ 'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-P', 'pager=off',
		'-d', $node->connstr('postgres') ], '<', \$sql, '>', \$stdout, '2>', \$stderr);
	return ($? >> 8, $stdout, $stderr);
}

# The newcomer's first mistake: the schema must exist.
my ($rc, $out, $err) = $node->psql('postgres', 'CREATE EXTENSION outbox SCHEMA outbox');
isnt($rc, 0, 'CREATE EXTENSION into a missing schema fails');
like($err, qr/ERROR:  schema "outbox" does not exist/, 'naming the schema');
like($err, qr/HINT:  Create it first: CREATE SCHEMA outbox;/, 'and saying what to do');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_extension WHERE extname = 'outbox'}), '0',
	'nothing was created');

# Every block but the last, in one psql session, stopping at the first error.
my @run = @$blocks;
my $check = pop @run;
($rc, $out, $err) = run_psql(join("\n", @run));
is($rc, 0, 'the Quick start runs as written') or diag $err;
is($err, '', 'without an error or warning');

# The last block, until it shows what the README says it shows.
my $want = normalize($expected);
my $got = '';
my $t0 = time;
while (time - $t0 < 180)
{
	($rc, $got) = run_psql($check);
	$got = normalize($got);
	last if $got eq $want;
	sleep 0.5;
}
is($got, $want, "the last block shows the README's output (published and applied)");

my $r = $mk->check(topics => ['outbox.event.order'], expect => { 'order-42' => 1 });
is($r->{exit}, 0, 'the event reached Kafka, once') or diag $r->{output};
# IF NOT EXISTS of an installed extension stays a no-op whatever it names.
($rc, $out, $err) = $node->psql('postgres', 'CREATE EXTENSION IF NOT EXISTS outbox SCHEMA nowhere');
is($rc, 0, 'CREATE EXTENSION IF NOT EXISTS of the installed extension is not refused for its schema')
  or diag $err;
is($node->safe_psql('postgres',
	q{SELECT consumer, applied, state FROM outbox.inbox_status}),
	'billing|1|running', 'the inbox applied it once, through the subscription');

$node->stop;
$mk->stop;
done_testing();
