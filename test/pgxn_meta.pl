#!/usr/bin/perl
#
# test/pgxn_meta.pl [META.json]: checks a META.json against the PGXN Meta
# Spec 1.0 (the required keys, each key's type and
# form, SemVer versions, the license names, terms and tags, custom keys only
# as x_*), and against this tree: the versions equal outbox.control's
# default_version, each provided extension's file and docfile exist.
# Prints one line per problem and exits 1 if there is any.
#
use strict;
use warnings;
use JSON::PP;

my $file = shift // 'META.json';
my @problems;
my $semver = qr/^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$/;
my $term = qr/^[^\/\\\s[:cntrl:]]{2,}$/;
my %licenses = map { $_ => 1 } qw(agpl_3 apache_1_1 apache_2_0 artistic_1 artistic_2 bsd
  freebsd gfdl_1_2 gfdl_1_3 gpl_1 gpl_2 gpl_3 lgpl_2_1 lgpl_3_0 mit mozilla_1_0 mozilla_1_1
  openssl perl_5 postgresql qpl_1_0 ssleay sun zlib open_source restricted unrestricted unknown);

# problem MESSAGE: records a problem.
sub problem { push @problems, "$file: $_[0]" }

# string_ok VALUE NAME: a non-empty string.
sub string_ok {
	my ($v, $name) = @_;
	return 1 if defined $v && !ref $v && length $v;
	problem("$name must be a non-empty string");
	return 0;
}

# keys_ok HASH NAME ALLOWED...: no key but the allowed ones and x_*.
sub keys_ok {
	my ($h, $name, @allowed) = @_;
	my %ok = map { $_ => 1 } @allowed;
	for (sort keys %$h) {
		problem("$name: unknown key \"$_\" (custom keys start with x_)") unless $ok{$_} || /^[xX]_./;
	}
}

# version_ok VALUE NAME: a SemVer 1.0 version.
sub version_ok {
	my ($v, $name) = @_;
	string_ok($v, $name) or return;
	problem("$name \"$v\" is not a semantic version (MAJOR.MINOR.PATCH)") unless $v =~ $semver;
}

# check_license VALUE: a known name, a list of them, or names mapped to URLs.
sub check_license {
	my ($l) = @_;
	if (!ref $l) {
		problem("license \"$l\" is not one of the spec's names") unless $licenses{$l // ''};
	} elsif (ref $l eq 'ARRAY') {
		problem('license: an empty list') unless @$l;
		check_license($_) for @$l;
	} elsif (ref $l eq 'HASH') {
		problem('license: an empty object') unless %$l;
		for (sort keys %$l) {
			problem("license \"$_\": the value must be a URL") unless ($l->{$_} // '') =~ m{^[a-z][a-z0-9+.-]*://\S+$}i;
		}
	} else {
		problem('license must be a string, a list or an object');
	}
}

# check_provides HASH: each extension has a file and a version, both real.
sub check_provides {
	my ($p) = @_;
	if (ref $p ne 'HASH' || !%$p) {
		problem('provides must be a non-empty object');
		return;
	}
	for my $ext (sort keys %$p) {
		my $e = $p->{$ext};
		problem("provides: \"$ext\" is not a term") unless $ext =~ $term;
		if (ref $e ne 'HASH') {
			problem("provides.$ext must be an object");
			next;
		}
		keys_ok($e, "provides.$ext", qw(file version abstract docfile docpath));
		version_ok($e->{version}, "provides.$ext.version");
		for my $k (qw(file docfile)) {
			next if $k eq 'docfile' && !exists $e->{$k};
			string_ok($e->{$k}, "provides.$ext.$k") or next;
			problem("provides.$ext.$k: no file $e->{$k}") unless -f $e->{$k};
		}
		string_ok($e->{abstract}, "provides.$ext.abstract") if exists $e->{abstract};
	}
}

# check_prereqs HASH: phases of relations of names to versions.
sub check_prereqs {
	my ($p) = @_;
	return problem('prereqs must be an object') if ref $p ne 'HASH';
	keys_ok($p, 'prereqs', qw(configure build test runtime develop));
	for my $phase (grep { !/^[xX]_/ } sort keys %$p) {
		my $ph = $p->{$phase};
		if (ref $ph ne 'HASH' || !%$ph) {
			problem("prereqs.$phase must be a non-empty object");
			next;
		}
		keys_ok($ph, "prereqs.$phase", qw(requires recommends suggests conflicts));
		for my $rel (grep { !/^[xX]_/ } sort keys %$ph) {
			my $r = $ph->{$rel};
			if (ref $r ne 'HASH') {
				problem("prereqs.$phase.$rel must be an object");
				next;
			}
			for (sort keys %$r) {
				my $v = $r->{$_};
				problem("prereqs.$phase.$rel.$_: \"$v\" is not 0, a version or a range")
				  unless !ref $v && ($v eq '0' || $v =~ $semver
					|| $v =~ /^\s*(?:(?:[<>]=?|[!=]=)\s*\S+)(?:\s*,\s*(?:[<>]=?|[!=]=)\s*\S+)*\s*$/);
			}
		}
	}
}

# check_meta HASH: the whole document.
sub check_meta {
	my ($m) = @_;
	keys_ok($m, 'META.json', qw(name version abstract maintainer license provides meta-spec
		  description generated_by tags no_index prereqs release_status resources));
	for (qw(name version abstract maintainer license provides meta-spec)) {
		problem("required key \"$_\" missing") unless exists $m->{$_};
	}
	problem("name \"$m->{name}\" is not a term (2 characters or more, no slash, space or control)")
	  if string_ok($m->{name}, 'name') && $m->{name} !~ $term;
	version_ok($m->{version}, 'version');
	string_ok($m->{$_}, $_) for grep { exists $m->{$_} } qw(abstract description generated_by);
	my $mt = $m->{maintainer};
	string_ok($_, 'maintainer') for (ref $mt eq 'ARRAY' ? (@$mt ? @$mt : (undef)) : ($mt));
	check_license($m->{license});
	check_provides($m->{provides});
	my $spec = $m->{'meta-spec'};
	problem('meta-spec.version must be 1.0.x')
	  unless ref $spec eq 'HASH' && ($spec->{version} // '') =~ /^1\.0\.[0-9]+$/;
	check_prereqs($m->{prereqs}) if exists $m->{prereqs};
	problem('release_status must be stable, testing or unstable')
	  if exists $m->{release_status} && ($m->{release_status} // '') !~ /^(stable|testing|unstable)$/;
	if (exists $m->{tags}) {
		my $t = $m->{tags};
		problem('tags must be a non-empty list') unless ref $t eq 'ARRAY' && @$t;
		for (ref $t eq 'ARRAY' ? @$t : ()) {
			problem("tag \"$_\" must be 2-255 characters, no slash or control")
			  unless !ref $_ && length $_ <= 255 && /^[^\/\\[:cntrl:]]{2,}$/;
		}
	}
	if (exists $m->{no_index}) {
		my $n = $m->{no_index};
		problem('no_index must be an object') if ref $n ne 'HASH';
		keys_ok($n, 'no_index', qw(file directory)) if ref $n eq 'HASH';
	}
	keys_ok($m->{resources}, 'resources', qw(homepage bugtracker repository))
	  if ref $m->{resources} eq 'HASH';
}

# check_tree HASH: the versions agree with outbox.control's default_version.
sub check_tree {
	my ($m) = @_;
	open(my $fh, '<', 'outbox.control') or return problem("cannot read outbox.control: $!");
	my ($control) = map { /^\s*default_version\s*=\s*'([^']*)'/ ? $1 : () } <$fh>;
	close $fh;
	$control //= '(none)';
	problem("version $m->{version} is not outbox.control's default_version $control")
	  if ($m->{version} // '') ne $control;
	my $ext = ref $m->{provides} eq 'HASH' ? $m->{provides}{outbox} : undef;
	return problem('provides no extension "outbox"') unless ref $ext eq 'HASH';
	problem("provides.outbox.version $ext->{version} is not $control")
	  if ($ext->{version} // '') ne $control;
	problem("provides.outbox.file is not sql/outbox--$control.sql")
	  if ($ext->{file} // '') ne "sql/outbox--$control.sql";
}

my $text = do { local $/; open(my $fh, '<', $file) or die "cannot read $file: $!\n"; <$fh> };
my $meta = eval { JSON::PP->new->utf8->decode($text) };
if (!$meta) {
	print "$file: not JSON: $@";
	exit 1;
}
if (ref $meta ne 'HASH') {
	print "$file: not a JSON object\n";
	exit 1;
}
check_meta($meta);
check_tree($meta);
print "$_\n" for @problems;
print "$file: valid (PGXN Meta Spec $meta->{'meta-spec'}{version}, $meta->{name} $meta->{version})\n" unless @problems;
exit(@problems ? 1 : 0);
