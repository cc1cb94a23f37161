# No source file grows past 1,500 lines: a file that large holds more than
# one responsibility and is split into parts sharing a private header (as
# publish.h, inbox.h, emit_check.h).  Every src/*.c and src/*.h is counted
# and the offenders are named with their length.  And the check can fail:
# a directory with a file one line over the limit is reported, one at the
# limit is not.
use strict;
use warnings;

use File::Temp qw(tempdir);
use FindBin;
use Test::More;

my $root = "$FindBin::Bin/../..";
my $max_lines = 1500;

# The *.c and *.h files of dir over the limit, as "name: N lines".
sub oversized
{
	my ($dir) = @_;
	my @found;
	for my $path (sort glob("$dir/*.c $dir/*.h"))
	{
		open my $fh, '<', $path or die "$path: $!";
		my $n = 0;
		$n++ while <$fh>;
		close $fh;
		(my $name = $path) =~ s{.*/}{};
		push @found, "$name: $n lines" if $n > $max_lines;
	}
	return @found;
}

# The check itself: one line over is reported, at the limit is not.
my $dir = tempdir(CLEANUP => 1);
for my $case ([ 'at_limit.c', $max_lines ], [ 'over.h', $max_lines + 1 ])
{
	my ($name, $n) = @$case;
	open my $fh, '>', "$dir/$name" or die "$dir/$name: $!";
	print $fh "/* line */\n" x $n;
	close $fh;
}
is_deeply([ oversized($dir) ], [ 'over.h: ' . ($max_lines + 1) . ' lines' ],
	'a file one line over the limit is reported, one at the limit is not');

# The extension's sources: there are some, and none is over.
my @sources = glob("$root/src/*.c $root/src/*.h");
cmp_ok(scalar(@sources), '>', 10, 'the sources are found');
my @over = oversized("$root/src");
is_deeply(\@over, [], "no src/*.c or src/*.h has more than $max_lines lines")
  or diag join("\n", @over);

done_testing();
