# Every SQL statement the extension runs names its functions, operators,
# cast types and relations with their schema, so that no search_path (a
# handler's SET, a database's settings, a role's) can substitute a planted
# operator or function: test/tools/sql_qualified.pl finds none in src/*.c,
# the current install script and the update scripts.  And the check can fail: fed a statement with a
# bare operator, function, cast and the constructs that hide an operator,
# it reports each at its line, and an OPERATOR() chain whose grouping
# differs from the bare operators'.
use strict;
use warnings;

use File::Temp qw(tempdir);
use FindBin;
use Test::More;

my $root = "$FindBin::Bin/../..";
my $check = "$root/test/tools/sql_qualified.pl";

# Run the check on files; returns (exit status, output lines).
sub run_check
{
	my @files = @_;
	my $out = qx{"$^X" "$check" @files 2>&1};
	return ($? >> 8, [ split /\n/, $out ]);
}

my $dir = tempdir(CLEANUP => 1);

# Write a file of the temporary directory; returns its path.
sub write_file
{
	my ($name, $text) = @_;
	open my $fh, '>', "$dir/$name" or die "$dir/$name: $!";
	print $fh $text;
	close $fh;
	return "$dir/$name";
}

# The check fails, with file:line, on a C file with unqualified names.
my $bad_c = write_file('bad.c', <<'EOF');
static void
bad(void)
{
	plan = outbox_keep_plan(psprintf("SELECT x FROM %s.t "
									 "WHERE a = $1", s), 1, types);
	SPI_execute("SELECT now()", true, 0);
	SPI_execute("SELECT $1::text", true, 0);
	SPI_execute("SELECT v FROM %s.t WHERE v IN (1, 2) AND w LIKE 'a%%' "
				"AND v BETWEEN 1 AND 2 AND v IS DISTINCT FROM w", true, 0);
	SPI_execute("SELECT NULLIF(a, b), CASE a WHEN 1 THEN 2 END FROM %s.t "
				"JOIN %s.u USING (a) JOIN pg_class c ON true", true, 0);
	SPI_execute("SELECT u.a FROM pg_catalog.unnest($1, $2) AS u(a, b)", true, 0);
	SPI_execute("SELECT 1 FROM %s.t WHERE a OPERATOR(pg_catalog.<) pg_catalog.now() OPERATOR(pg_catalog.-) b", true, 0);
	ereport(ERROR, (errmsg("messages like SELECT a = b FROM c are not SQL")));
}
EOF
my ($rc, $lines) = run_check($bad_c);
is($rc, 1, 'the check exits 1 when it finds something');
my %want = (
	qr/bad\.c:5: unqualified operator =/ => 'a bare = (on the second literal\'s line)',
	qr/bad\.c:6: unqualified function now\(\)/ => 'a bare function call',
	qr/bad\.c:7: cast to unqualified type text/ => 'a bare cast type',
	qr/bad\.c:8: IN \(\.\.\.\)/ => 'IN (...)',
	qr/bad\.c:8: LIKE/ => 'LIKE',
	qr/bad\.c:9: BETWEEN/ => 'BETWEEN',
	qr/bad\.c:9: IS DISTINCT FROM/ => 'IS DISTINCT FROM',
	qr/bad\.c:10: NULLIF/ => 'NULLIF',
	qr/bad\.c:10: CASE x WHEN/ => 'a simple CASE',
	qr/bad\.c:11: JOIN \.\.\. USING/ => 'JOIN ... USING',
	qr/bad\.c:11: unqualified relation pg_class/ => 'a bare relation',
	qr/bad\.c:12: a qualified unnest\(\) takes one array/ => 'pg_catalog.unnest of two arrays',
	qr/bad\.c:13: OPERATOR\(pg_catalog.-\) after OPERATOR\(pg_catalog.<\)/ => 'a precedence OPERATOR() changes');
for my $re (sort keys %want)
{
	ok((grep { $_ =~ $re } @$lines), "reported: $want{$re}") or diag explain $lines;
}
is(scalar(@$lines), scalar(keys %want), 'nothing else reported (not the message)')
  or diag explain $lines;

# The same statements qualified pass.
my $good_c = write_file('good.c', <<'EOF');
static void
good(void)
{
	plan = outbox_keep_plan(psprintf("SELECT x FROM %s.t "
									 "WHERE a OPERATOR(pg_catalog.=) $1", s), 1, types);
	SPI_execute("SELECT pg_catalog.now(), pg_catalog.count(*), $1::pg_catalog.text, $2::%s.e", true, 0);
	SPI_execute("UPDATE %s.t SET a = -1, b = COALESCE(b, 0) WHERE c OPERATOR(pg_catalog.=) ANY ($1) "
				"AND d OPERATOR(pg_catalog.>) -1", true, 0);
	SPI_execute("SELECT 1 FROM %s.t WHERE a OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) b) "
				"AND 'a' OPERATOR(pg_catalog.||) b OPERATOR(pg_catalog.||) c OPERATOR(pg_catalog.=) d", true, 0);
}
EOF
($rc, $lines) = run_check($good_c);
is($rc, 0, 'qualified statements pass') or diag explain $lines;

# An install script: bodies are checked, and must pin their search_path.
my $bad_sql = write_file('bad.sql', <<'EOF');
CREATE FUNCTION @extschema@.f(a text)
RETURNS boolean
LANGUAGE sql
AS $$ SELECT a = 'x' $$;
EOF
($rc, $lines) = run_check($bad_sql);
ok((grep { /bad\.sql:4: unqualified operator =/ } @$lines), 'an operator in a function body is reported')
  or diag explain $lines;
ok((grep { /bad\.sql:1: function .*f .*does not pin search_path/ } @$lines),
	'a SQL function without a pinned search_path is reported')
  or diag explain $lines;

# The extension itself: nothing found.
chdir $root or die "$root: $!";
($rc, $lines) = run_check();
is($rc, 0, 'every statement of src/*.c, the install script and the update scripts is qualified');
is_deeply($lines, [], 'no findings') or diag join("\n", @$lines);

done_testing();
