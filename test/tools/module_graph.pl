#!/usr/bin/perl
# module_graph.pl: the module graph of the built objects and its cycles.
#
# An edge A -> B means A.o uses a function or variable that B.o defines
# (nm -u against nm -g --defined-only).  The strongly connected components
# of more than one module are the circles the layering must not have.
#
#   perl test/tools/module_graph.pl [--edges] [DIR | OBJECT.o ...]
#
# The objects are those named, or those of DIR (default src; after a
# rebuild that dropped a file, name the Makefile's OBJS instead: a stale
# object of DIR would still count).  Prints one line per component of more
# than one module ("scc: a b c"); with --edges, first every edge
# ("edge: a -> b").  Dies when an object is missing or nm fails.
# test/t/018_module_graph.pl holds the layering these edges must follow.
use strict;
use warnings;

my $print_edges = 0;
if (@ARGV && $ARGV[0] eq '--edges')
{
	$print_edges = 1;
	shift @ARGV;
}
my @objs = @ARGV;
@objs = ('src') unless @objs;
@objs = sort glob("$objs[0]/*.o") if @objs == 1 && -d $objs[0];
die "module_graph: no objects (run make first)\n" unless @objs;

my %edges = module_edges(@objs);
if ($print_edges)
{
	for my $from (sort keys %edges)
	{
		print "edge: $from -> $_\n" for sort keys %{ $edges{$from} };
	}
}
print 'scc: ', join(' ', @$_), "\n" for cycles(\%edges);
exit 0;

# The edges between the objects, as { from => { to => 1 } }.
sub module_edges
{
	my @objs = @_;
	my (%defines, %uses);
	for my $obj (@objs)
	{
		my ($name) = $obj =~ m{([^/]+)\.o$}
		  or die "module_graph: $obj is not an object file\n";
		die "module_graph: no $obj\n" unless -f $obj;
		$uses{$name} = {};
		for my $sym (nm('-g', '--defined-only', $obj))
		{
			$defines{$sym} = $name;
		}
		$uses{$name}{$_} = 1 for nm('-u', $obj);
	}
	my %edges = map { $_ => {} } keys %uses;
	for my $from (keys %uses)
	{
		for my $sym (keys %{ $uses{$from} })
		{
			my $to = $defines{$sym};
			$edges{$from}{$to} = 1 if defined $to && $to ne $from;
		}
	}
	return %edges;
}

# The symbol names nm prints for one object with the given options.
sub nm
{
	my @args = @_;
	open(my $fh, '-|', 'nm', @args) or die "module_graph: nm: $!\n";
	my @syms;
	while (my $line = <$fh>)
	{
		push @syms, $1 if $line =~ /\s([A-Za-z_][\w.]*)\s*$/;
	}
	close($fh) or die "module_graph: nm @args failed\n";
	return @syms;
}

# The strongly connected components of more than one node (Tarjan),
# each sorted, sorted by their first member.
sub cycles
{
	my ($edges) = @_;
	my ($index, @stack, %on, %idx, %low, @out) = (0);
	my $visit;
	$visit = sub {
		my ($v) = @_;
		$idx{$v} = $low{$v} = $index++;
		push @stack, $v;
		$on{$v} = 1;
		for my $w (sort keys %{ $edges->{$v} })
		{
			if (!exists $idx{$w})
			{
				$visit->($w);
				$low{$v} = $low{$w} if $low{$w} < $low{$v};
			}
			elsif ($on{$w})
			{
				$low{$v} = $idx{$w} if $idx{$w} < $low{$v};
			}
		}
		if ($low{$v} == $idx{$v})
		{
			my @scc;
			my $w;
			do
			{
				$w = pop @stack;
				delete $on{$w};
				push @scc, $w;
			} while ($w ne $v);
			push @out, [ sort @scc ] if @scc > 1;
		}
	};
	for my $v (sort keys %$edges)
	{
		$visit->($v) unless exists $idx{$v};
	}
	undef $visit;
	return sort { $a->[0] cmp $b->[0] } @out;
}
