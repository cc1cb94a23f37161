# The reference pages against the server: docs/configuration.md lists
# every outbox.* setting of pg_settings with its type, default and context
# (and a section of its own), and nothing pg_settings lacks; docs/sql.md
# has a heading for every object of the extension (pg_depend on
# pg_extension, as pg_describe_object() names it) and none for an object
# that does not exist.  So neither page can go missing or stale unseen.
# Also every relative link of README.md and docs/ resolves.
use strict;
use warnings;

use File::Basename qw(basename dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $docs = dirname(__FILE__) . '/../../docs';

my $node = PostgreSQL::Test::Cluster->new('reference');
$node->init;
# Preloaded, so that the start-up settings exist; no broker is needed.
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'outbox'
outbox.brokers = '127.0.0.1:9'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

# A documented default in pg_settings' terms: a value with a unit is
# converted to the setting's base unit (ms, s or B); '' is empty.
my %ms = (ms => 1, s => 1000, min => 60_000, h => 3_600_000, d => 86_400_000);
my %bytes = (B => 1, kB => 1024, MB => 1024**2, GB => 1024**3);
sub boot_value
{
	my ($doc, $unit) = @_;
	return '' if $doc eq "''";
	my ($n, $u) = $doc =~ /^(-?\d+)\s*([A-Za-z]+)?$/ or return $doc;
	return $n if !defined $u;
	return $n * $ms{$u} / $ms{$unit} if exists $ms{$u} && exists $ms{$unit};
	return $n * $bytes{$u} / $bytes{$unit} if exists $bytes{$u} && exists $bytes{$unit};
	return "$n$u (unit $u against pg_settings' " . ($unit // 'none') . ')';
}

# configuration.md: the table's rows and the sections' headings.
my $conf = slurp_file("$docs/configuration.md");
my (%row, %section);
while ($conf =~ /^\| `(outbox\.[a-z_]+)` \| (\w+) \| `([^`]*)` \| (\w+) \|$/mg)
{
	ok(!exists $row{$1}, "configuration.md lists $1 once");
	$row{$1} = { type => $2, default => $3, context => $4 };
}
$section{$1} = 1 while $conf =~ /^### `(outbox\.[a-z_]+)`$/mg;

my %server;
for my $line (split /\n/, $node->safe_psql('postgres',
	q{SELECT name, vartype, boot_val, coalesce(unit, ''), context
	    FROM pg_settings WHERE name LIKE 'outbox.%' ORDER BY name}))
{
	my ($name, $type, $boot, $unit, $context) = split /\|/, $line, -1;
	$server{$name} = 1;
	my $doc = $row{$name};
	ok(defined $doc, "configuration.md lists $name") or next;
	is($doc->{type}, $type, "$name: type");
	is(boot_value($doc->{default}, $unit eq '' ? undef : $unit), $boot, "$name: default");
	is($doc->{context}, $context, "$name: context");
	ok($section{$name}, "$name has a section saying what it does");
}
cmp_ok(scalar keys %server, '>', 30, 'the server has the outbox settings');
is_deeply([ sort grep { !$server{$_} } keys %row ], [],
	'configuration.md lists no setting the server lacks');
is_deeply([ sort grep { !$server{$_} } keys %section ], [],
	'and has no section for one');

# sql.md: "### kind `identity`" headings against the extension's members.
my $sql = slurp_file("$docs/sql.md");
my %documented;
while ($sql =~ /^### (function|view|table|type|sequence) `([^`]+)`$/mg)
{
	(my $id = "$1 $2") =~ s/,\s+/,/g;
	ok(!exists $documented{$id}, "sql.md documents $id once");
	$documented{$id} = 1;
}
my @members = split /\n/, $node->safe_psql('postgres', q{
	SELECT pg_describe_object(classid, objid, 0)
	  FROM pg_depend
	 WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
	   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
	   -- from PostgreSQL 17 a table's or view's row type and every array
	   -- type are members too: documented with their relation or element
	   AND NOT (classid = 'pg_type'::regclass AND EXISTS
	            (SELECT 1 FROM pg_type t
	               LEFT JOIN pg_class c ON c.oid = t.typrelid
	              WHERE t.oid = objid
	                AND (t.typcategory = 'A' OR c.relkind <> 'c')))
	 ORDER BY 1});
cmp_ok(scalar @members, '>', 40, 'the extension has its objects');
is_deeply([ grep { !$documented{$_} } @members ], [],
	'sql.md documents every object of the extension');
my %member = map { $_ => 1 } @members;
is_deeply([ sort grep { !$member{$_} } keys %documented ], [],
	'sql.md documents no object the extension lacks');

# Every relative link of README.md and docs/ reaches a file and, with a
# #fragment, one of its headings (GitHub's anchors).  versions.md is
# written apart from these pages and may come later.
my %pending = ();
my $top = dirname(__FILE__) . '/../..';
my %anchors;
sub anchors_of
{
	my ($file) = @_;
	return $anchors{$file} //= { map {
		my $a = lc($_);
		$a =~ s/[^\w\- ]//g;
		$a =~ tr/ /-/;
		($a => 1)
	} slurp_file("$top/$file") =~ /^#+ (.*?)\s*$/mg };
}
my @broken;
for my $page ('README.md', map { "docs/" . basename($_) } glob("$top/docs/*.md"))
{
	my $dir = $page =~ m{/} ? 'docs/' : '';
	for my $link (slurp_file("$top/$page") =~ /\]\(([^)\s]+)\)/g)
	{
		next if $link =~ m{^[a-z]+://};
		my ($path, $fragment) = split /#/, $link, 2;
		my $target = $path eq '' ? $page : $dir . $path;
		1 while $target =~ s{[^/]+/\.\./}{};
		next if $pending{$target};
		if (!-e "$top/$target") { push @broken, "$page: $link"; next; }
		push @broken, "$page: $link"
		  if defined $fragment && $target =~ /\.md$/ && !anchors_of($target)->{$fragment};
	}
}
is_deeply(\@broken, [], 'every link of README.md and docs/ reaches its file and heading');

$node->stop;
done_testing();
