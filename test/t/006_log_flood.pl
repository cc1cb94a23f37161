# Megabyte arguments that are refused are not repeated in the server log:
# neither in the message (values are cut) nor as the failed statement.
# No publisher and no Kafka are needed.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use OutboxTest;

my $node = PostgreSQL::Test::Cluster->new('log_flood');
pinned_init($node);
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'outbox'
outbox.workers = 0
log_min_error_statement = error
# The test framework logs every statement; a server in production does not.
log_statement = none
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

my $mb = 10 * 1024 * 1024;
my %calls = (
	'a 10 MB topic' => "SELECT outbox_emit('order', 'a', 't', '{}', topic => repeat('x', $mb))",
	'a 10 MB event_id' => "SELECT outbox_emit('order', 'a', 't', '{}', event_id => repeat('x', $mb))",
	'a 10 MB aggregate_id' => "SELECT outbox_emit('order', repeat('x', $mb), 't', '{}')",
	'a 10 MB header name' => "SELECT outbox_emit('order', 'a', 't', '{}', headers => jsonb_build_object('dead_letter_' || repeat('x', $mb), 'v'))",
	'a 10 MB header value' => "SELECT outbox_emit('order', 'a', 't', '{}', headers => jsonb_build_object('h', repeat('x', $mb)))",
	'a 10 MB payload' => "SELECT outbox_emit('order', 'a', 't', ('\"' || repeat('x', $mb) || '\"')::jsonb)",
	'a 3 MB inbox_claim event_id' => "SELECT inbox_claim('billing', repeat('x', 3 * 1024 * 1024))",
	'a 10 MB operator argument' => "SELECT outbox_retry(repeat('x', $mb))",
);

# Literal values, as an application sends them: the statement is as large
# as the value.
foreach my $what (sort keys %calls)
{
	(my $stmt = $calls{$what}) =~ s/repeat\('x', ([^)]*)\)/"'" . ('x' x eval($1)) . "'"/ge;
	my $offset = -s $node->logfile;
	my ($rc, $out, $err) = $node->psql('postgres', $stmt);
	isnt($rc, 0, "$what is refused");
	cmp_ok(length($err), '<', 2000, "$what: the error the client sees is short");
	my $logged = slurp_file($node->logfile, $offset);
	cmp_ok(length($logged), '<', 2000, "$what: the server log grew by " . length($logged) . " bytes")
	  or diag substr($logged, 0, 500);
}

$node->stop;
done_testing();
