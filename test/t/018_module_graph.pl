# The modules call each other top-down, as the data flows: an edge A -> B
# (A's object uses a function or variable B's defines, found by
# test/tools/module_graph.pl with nm) must go down the layering below (the
# list of allowed back edges is empty: there is no circle).  A new back
# edge fails; so does a listed one that is gone (the list only shrinks),
# and a module missing from the layering (place it).  And the check can
# fail: the tool finds the circle of two objects that call each other, and
# a synthetic edge from the bottom to the top is reported.
#
# The objects are the Makefile's OBJS; if any is missing or older than the
# sources (the test runs from a copy of the tree, maybe never built), they
# are compiled in a temporary copy.
use strict;
use warnings;

use File::Copy qw(copy);
use File::Temp qw(tempdir);
use FindBin;
use Test::More;

my $root = "$FindBin::Bin/../..";
my $tool = "$root/test/tools/module_graph.pl";

# Top to bottom: _PG_init; the SQL-facing modules and the launcher; the
# publisher (the loop, then its steps); the inbox (the loop, apply, store,
# consume, its SQL functions' checks, its settings and state); retention
# and the publisher's own state (the extension's look-up, the bucket
# shares, this worker's state), below both; emit; the shared bottom
# (kafka, stats, shared memory, utilities).
#
# The stream (publish_stream.c) sits below produce: it is the bookkeeping
# of where the read is in the stream of commits (deltas, what each owes,
# the aggregates diverted to be read by index), which the read, produce
# (an aggregate it cannot send is diverted) and settle (a settled one pays
# its debt) all update, and it calls none of them (what is busy in flight
# it is told by its caller).
my @layers = qw(
  init
  operator
  launcher
  worker
  publish_read
  publish_durable
  publish_settle
  publish_produce
  publish_stream
  publish_poison
  publish_delta
  publish_progress
  publish_heap
  inbox_worker
  inbox_apply
  inbox_store
  inbox_consumer
  inbox_sql
  inbox_state
  retention
  publish_extension
  publish_shares
  publish_state
  emit
  emit_check
  kafka
  stats
  shmem
  util
);

# The back edges allowed, each with why it is still there: none remain.
# A ratchet: never add one (move the code to the module it belongs in);
# an entry whose edge is gone fails until it is deleted.
my %back_edges = ();

# The problems of a graph (edges "a -> b") against a layering and the
# allowed back edges: new back edges, listed ones gone, unplaced modules.
sub layering_problems
{
	my ($edges, $layers, $allowed) = @_;
	my %pos;
	@pos{@$layers} = (0 .. $#$layers);
	my (@problems, %seen);
	for my $edge (@$edges)
	{
		my ($from, $to) = split / -> /, $edge;
		$seen{$edge} = 1;
		for my $m (grep { !exists $pos{$_} } $from, $to)
		{
			push @problems, "module $m is not in the layering";
			$pos{$m} = -1;
		}
		next if $pos{$from} < 0 || $pos{$to} < 0;
		push @problems, "new back edge $edge"
		  if $pos{$from} > $pos{$to} && !exists $allowed->{$edge};
	}
	push @problems, "listed back edge $_ is gone: delete it from the list"
	  for grep { !$seen{$_} } sort keys %$allowed;
	push @problems, "listed back edge $_ goes down the layering: delete it"
	  for grep {
		my ($f, $t) = split / -> /;
		$seen{$_} && exists $pos{$f} && exists $pos{$t} && $pos{$f} < $pos{$t}
	  } sort keys %$allowed;
	return sort { $a cmp $b } do { my %u; grep { !$u{$_}++ } @problems };
}

# Run the tool; returns (exit status, output lines).
sub run_tool
{
	my @args = @_;
	my $out = qx{"$^X" "$tool" @args 2>&1};
	return ($? >> 8, [ split /\n/, $out ]);
}

# The Makefile's OBJS, as paths relative to the top of the tree.
sub makefile_objs
{
	open my $fh, '<', "$root/Makefile" or die "$root/Makefile: $!";
	my $text = do { local $/; <$fh> };
	close $fh;
	$text =~ s/\\\n/ /g;
	my ($objs) = $text =~ /^OBJS\s*=\s*(.*)$/m or die "no OBJS in the Makefile";
	return split ' ', $objs;
}

# Whether obj exists and is newer than its source and every header.
sub fresh
{
	my ($obj) = @_;
	(my $src = $obj) =~ s/\.o$/.c/;
	return 0 unless -f "$root/$obj";
	my $t = (stat "$root/$obj")[9];
	for my $dep ("$root/$src", glob("$root/src/*.h"))
	{
		return 0 if (stat $dep)[9] > $t;
	}
	return 1;
}

# Paths of the objects: the tree's if fresh, else compiled in a copy.
sub objects
{
	my @objs = makefile_objs();
	return map { "$root/$_" } @objs unless grep { !fresh($_) } @objs;
	my $copy = tempdir(CLEANUP => 1);
	mkdir "$copy/src" or die "$copy/src: $!";
	for my $f ("Makefile", "outbox.control", glob("$root/src/*.[ch]"))
	{
		(my $rel = $f) =~ s{^\Q$root\E/}{};
		copy($f =~ m{^/} ? $f : "$root/$f", "$copy/$rel")
		  or die "copy $f: $!";
	}
	my $out = qx{make -s -C "$copy" @objs 2>&1};
	die "building the objects in a copy failed:\n$out" if $?;
	return map { "$copy/$_" } @objs;
}

# The tool finds a circle in real objects: two that call each other.
SKIP:
{
	my $cc = qx{command -v cc 2>/dev/null};
	skip 'no C compiler', 2 unless $cc;
	my $dir = tempdir(CLEANUP => 1);
	my %src = (
		'a.c' => "int b_fn(void);\nint a_fn(void);\nint a_fn(void) { return b_fn(); }\n",
		'b.c' => "int a_fn(void);\nint b_fn(void);\nint b_fn(void) { return a_fn() + 1; }\n",
		'c.c' => "int a_fn(void);\nint c_fn(void);\nint c_fn(void) { return a_fn(); }\n");
	for my $name (sort keys %src)
	{
		open my $fh, '>', "$dir/$name" or die "$dir/$name: $!";
		print $fh $src{$name};
		close $fh;
		(my $obj = $name) =~ s/\.c$/.o/;
		system('cc', '-c', '-o', "$dir/$obj", "$dir/$name") == 0
		  or die "cc $name failed";
	}
	my ($rc, $lines) = run_tool('--edges', "$dir/a.o", "$dir/b.o", "$dir/c.o");
	is($rc, 0, 'the tool reads the synthetic objects') or diag explain $lines;
	is_deeply($lines,
		[ 'edge: a -> b', 'edge: b -> a', 'edge: c -> a', 'scc: a b' ],
		'it finds their edges and the circle a <-> b, not c')
	  or diag explain $lines;
}

# The extension's graph.
my @objs = objects();
my ($rc, $lines) = run_tool('--edges', @objs);
is($rc, 0, 'the tool reads the extension\'s objects') or diag explain $lines;
my @edges = map { /^edge: (.*)$/ ? $1 : () } @$lines;
cmp_ok(scalar(@edges), '>', 50, 'it finds the calls between modules')
  or diag explain $lines;
my @problems = layering_problems(\@edges, \@layers, \%back_edges);
is_deeply([ grep { /^scc: / } @$lines ], [], 'no circle: no two modules reach each other')
  or diag explain $lines;
is_deeply(\@problems, [], 'every edge goes down the layering or is a listed back edge')
  or diag join("\n", @problems);
note "remaining back edges: " . scalar(keys %back_edges);

# And the check can fail: an edge from the bottom to the top, a listed
# back edge gone, a module nobody placed.
my %real = map { $_ => 1 } @problems;
my @bad = grep { !$real{$_} } layering_problems(
	[ @edges, 'shmem -> worker', 'newmod -> util' ],
	\@layers, { %back_edges, 'util -> init' => 'synthetic' });
is_deeply(
	\@bad,
	[
		'listed back edge util -> init is gone: delete it from the list',
		'module newmod is not in the layering',
		'new back edge shmem -> worker',
	],
	'a synthetic back edge, a stale entry and an unplaced module are reported'
) or diag explain \@bad;

done_testing();
