# test/perl/RealKafka.pm
#
# Perl helper for the outbox TAP tests: a real Apache Kafka 3.9 cluster
# (test/tools/kafka_cluster), with the same start/bootstrap/check/stop calls
# as MockKafka.pm so that a test can run against either.

=pod

=head1 NAME

RealKafka - run a real Kafka cluster for outbox TAP tests

=head1 SYNOPSIS

  use RealKafka;

  my $rk = RealKafka->start(
	  dir         => $dir,          # node configurations, data and logs
	  brokers     => 3,
	  topics      => ['events:4'],  # NAME:PARTITIONS, pre-created (RF 3)
	  sasl        => 1,             # also a SASL_PLAINTEXT listener
	  max_seconds => 600);          # the cluster stops by itself after that

  my $bootstrap = $rk->bootstrap;   # PLAINTEXT list
  $rk->topic('small', 1, configs => { 'max.message.bytes' => 2000 });
  $rk->node(kill => 2);             # kill|stop|start|restart|pause|resume
  my $leader = $rk->leader('events', 0);
  my $r = $rk->check(topics => ['events'], expect => { 'order-1' => 3 });
  my $j = $rk->readback(topics => ['events'], expect => $file);  # Java client
  $rk->stop;                        # also done by DESTROY and END

=head1 DESCRIPTION

Every cluster file stays under C<dir>.  The first start of a user resolves
the Kafka jars with Maven (see C<kafka_cluster --help>), which may take a
minute.  The SASL users are those of C<kafka_cluster --help>; see
C<sasl_properties>.

=cut

package RealKafka;

use strict;
use warnings;

use Carp;
use File::Basename qw(dirname);
use File::Spec;
use File::Temp ();
use IPC::Run ();
use MockKafka ();
use Scalar::Util qw(weaken);
use Time::HiRes qw(time);

my $test_dir = File::Spec->catdir(dirname(File::Spec->rel2abs(__FILE__)),
	File::Spec->updir);
my $tool = File::Spec->catfile($test_dir, 'tools', 'kafka_cluster');
my $kafka_src = File::Spec->catdir($test_dir, 'kafka');

# Running clusters (weak refs), so END can stop them.
my %live;

# The users kafka_cluster creates with --sasl (see its --help).
my %users = (
	'PLAIN' => [ 'outboxplain', 'plain-secret' ],
	'SCRAM-SHA-256' => [ 'outboxscram', 'scram-secret' ]);

=pod

=head1 METHODS

=over

=item RealKafka->start(%args)

Starts a cluster with C<kafka_cluster start>.  Arguments: C<dir> (default a
temporary directory), C<brokers> (3), C<sasl> (false), C<max_seconds>
(600), C<topics> (array of C<NAME:PARTITIONS>, created with the default
replication factor).  Dies with the tool's output if the cluster does not
come up.  The start time in seconds is C<< $rk->{start_s} >>.

=cut

sub start
{
	my ($class, %args) = @_;

	my $dir = $args{dir} // File::Temp::tempdir('real_kafka_XXXX',
		TMPDIR => 1, CLEANUP => 1);
	my @cmd = ($tool, 'start', $dir, '--brokers', $args{brokers} // 3,
		'--max-seconds', $args{max_seconds} // 600);
	push @cmd, '--sasl' if $args{sasl};

	my $self = bless { dir => $dir, owner_pid => $$, brokers => $args{brokers} // 3 },
	  $class;
	my $t0 = time;
	# the first run of a user downloads the jars: allow for it
	my $out = $self->_run(\@cmd, 600);
	$self->{start_s} = time - $t0;
	$live{"$self"} = $self;
	weaken($live{"$self"});

	$self->{bootstrap} = _slurp("$dir/bootstrap");
	chomp $self->{bootstrap};
	if ($args{sasl})
	{
		$self->{bootstrap_sasl} = _slurp("$dir/bootstrap.sasl");
		chomp $self->{bootstrap_sasl};
	}
	for my $t (@{ $args{topics} // [] })
	{
		my ($name, $partitions) = split /:/, $t;
		$self->topic($name, $partitions // 1);
	}
	return $self;
}

=pod

=item $rk->bootstrap, $rk->bootstrap_sasl, $rk->dir

The PLAINTEXT and SASL_PLAINTEXT bootstrap lists, the cluster directory.

=cut

sub bootstrap      { $_[0]->{bootstrap} }
sub bootstrap_sasl { $_[0]->{bootstrap_sasl} }
sub dir            { $_[0]->{dir} }

=pod

=item $rk->sasl_properties($mechanism, $password)

librdkafka properties (a hash) to log in as the cluster's user of
C<$mechanism> (C<PLAIN> or C<SCRAM-SHA-256>), with its own password unless
C<$password> is given.

=cut

sub sasl_properties
{
	my ($self, $mechanism, $password) = @_;
	my $u = $users{$mechanism} or croak "RealKafka: no user for $mechanism";
	return (
		'security.protocol' => 'SASL_PLAINTEXT',
		'sasl.mechanisms' => $mechanism,
		'sasl.username' => $u->[0],
		'sasl.password' => $password // $u->[1]);
}

=pod

=item $rk->outbox_conf(sasl => $mechanism, password => $pw, properties => 'k=v;...')

The outbox settings (a hash for C<outbox_node>) that point the publisher
at this cluster: C<brokers>, C<kafka_properties> from C<properties>, and
with C<sasl> a C<kafka_credentials_file> holding the login of that
mechanism's user (a new file, mode 0600, under the cluster directory, on
every call: a changed file name makes a reload recreate the producer).
The only place where tests pass Kafka credentials to the publisher.

=cut

my $credentials_seq = 0;

sub outbox_conf
{
	my ($self, %a) = @_;
	my %conf = (brokers => $self->{bootstrap});
	$conf{kafka_properties} = $a{properties} if defined $a{properties};
	if ($a{sasl})
	{
		my %p = $self->sasl_properties($a{sasl}, $a{password});
		my $file = sprintf '%s/credentials-%d', $self->{dir}, ++$credentials_seq;
		my $old = umask 077;
		open my $fh, '>', $file or croak "RealKafka: cannot write $file: $!";
		umask $old;
		print $fh map { "$_=$p{$_}\n" } sort keys %p;
		close $fh or croak "RealKafka: cannot write $file: $!";
		chmod 0600, $file;
		$conf{kafka_credentials_file} = $file;
		$conf{brokers} = $self->{bootstrap_sasl};
	}
	return %conf;
}

=pod

=item $rk->topic($name, $partitions, rf => N, configs => { k => v })

Creates a topic (dies if it exists).

=cut

sub topic
{
	my ($self, $name, $partitions, %a) = @_;
	my @cmd = ($tool, 'topic', $self->{dir}, $name, $partitions);
	push @cmd, $a{rf} if $a{rf};
	my $c = $a{configs} // {};
	push @cmd, map { "$_=$c->{$_}" } sort keys %$c;
	$self->_run(\@cmd, 120);
	return;
}

=pod

=item $rk->node($op, $id)

C<kafka_cluster $op DIR $id>, C<$op> one of kill, stop, start, restart,
pause, resume.  Returns the seconds it took.

=cut

sub node
{
	my ($self, $op, $id) = @_;
	croak "RealKafka: bad node operation $op"
	  unless $op =~ /^(kill|stop|start|restart|pause|resume)$/;
	my $t0 = time;
	$self->_run([ $tool, $op, $self->{dir}, $id ], 180);
	return time - $t0;
}

=pod

=item $rk->status

Parsed C<kafka_cluster status>: C<< { nodes => { ID => 'up'|'paused'|'down' },
brokers => [ids], partitions => { "TOPIC/P" => { leader, replicas => [..],
isr => [..] } } } >>, or undef if no broker answered.

=cut

sub status
{
	my ($self) = @_;
	my %s;
	my $out = eval { $self->_run([ $tool, 'status', $self->{dir} ], 120) };
	return undef unless defined $out;
	for (split /\n/, $out)
	{
		if (/^node (\d+) pid \S+ (\w+)/) { $s{nodes}{$1} = $2 }
		elsif (/^brokers (\S+)/) { $s{brokers} = [ split /,/, $1 ] }
		elsif (/^partition (\S+) (\d+) leader (\S+) replicas (\S+) isr (\S+)/)
		{
			$s{partitions}{"$1/$2"} = {
				leader => $3,
				replicas => [ split /,/, $4 ],
				isr => [ $5 eq '-' ? () : split /,/, $5 ] };
		}
	}
	return \%s;
}

=pod

=item $rk->leader($topic, $partition), $rk->leaders($topic)

The id of the partition's leader (undef if none or unknown); a hash
partition => leader id of every partition of the topic (one status call).

=cut

sub leader
{
	my ($self, $topic, $partition) = @_;
	return $self->leaders($topic)->{$partition};
}

sub leaders
{
	my ($self, $topic) = @_;
	my $s = $self->status or return {};
	my %l;
	while (my ($k, $p) = each %{ $s->{partitions} // {} })
	{
		$l{$1} = $p->{leader} if $k =~ m{^\Q$topic\E/(\d+)$} && $p->{leader} ne 'none';
	}
	return \%l;
}

=pod

=item $rk->wait_isr($topics, $size, $timeout)

Waits until every partition of the topics (array ref) has at least
C<$size> replicas in sync (default: all).  Returns the seconds taken or
undef on timeout.

=cut

sub wait_isr
{
	my ($self, $topics, $size, $timeout) = @_;
	$timeout //= 120;
	my $t0 = time;
	while (time - $t0 < $timeout)
	{
		my $s = $self->status;
		my $ok = $s && $s->{partitions};
		for my $k (keys %{ $ok ? $s->{partitions} : {} })
		{
			my ($t) = $k =~ m{^(.*)/\d+$};
			next unless grep { $_ eq $t } @$topics;
			my $p = $s->{partitions}{$k};
			$ok = 0 if @{ $p->{isr} } < ($size // scalar @{ $p->{replicas} });
		}
		return time - $t0 if $ok;
		sleep 1;
	}
	return undef;
}

=pod

=item $rk->check(topics => [...], expect => $file_or_hashref, opts => [...], sasl => [mech])

Runs test/tools/order_check against the cluster, exactly like
C<< MockKafka->check >> (same result hash).  C<sasl> reads over the SASL
listener as that mechanism's user.

=cut

sub check
{
	my ($self, %args) = @_;
	my @opts = @{ $args{opts} // [] };
	my $boot = $self->{bootstrap};
	if ($args{sasl})
	{
		my %p = $self->sasl_properties($args{sasl});
		push @opts, map { ('-X', "$_=$p{$_}") } sort keys %p;
		$boot = $self->{bootstrap_sasl};
	}
	# MockKafka->check reads only bootstrap and dir from its object
	local $self->{bootstrap} = $boot;
	return MockKafka::check($self, %args, opts => \@opts);
}

=pod

=item $rk->readback(topics => [...], expect => $file)

Reads the topics with the Java client (test/kafka/ReadBack.java, not
librdkafka) and returns its counters (C<messages aggregates accepted
duplicates gaps inversions lost split>) plus C<exit> and C<output>.

=cut

sub readback
{
	my ($self, %args) = @_;
	my $cp = $self->_run([ $tool, 'classpath' ], 600);
	chomp $cp;
	my @cmd = ('java', '-Xmx512m', '-XX:+UseSerialGC',
		"-Dlog4j.configuration=file:$kafka_src/log4j-tools.properties",
		'-cp', $cp, "$kafka_src/ReadBack.java", $self->{bootstrap});
	push @cmd, '--expect', $args{expect} if $args{expect};
	push @cmd, @{ $args{topics} };
	my $output = '';
	my $ok = eval {
		IPC::Run::run(\@cmd, '<', \undef, '>&', \$output, IPC::Run::timeout(300));
		1;
	};
	my %r = (output => $output, exit => $ok ? $? >> 8 : -1);
	if ($output =~ /^readback: (messages=.*)$/m)
	{
		for my $kv (split ' ', $1)
		{
			my ($k, $v) = split /=/, $kv, 2;
			$r{$k} = $v;
		}
	}
	return \%r;
}

=pod

=item $rk->active_controller

The id of the node that last became the active KRaft controller (by the
highest epoch its server.log announces), or undef.

=item $rk->log_tail($id, $lines)

The last lines of node C<$id>'s server.log (for diagnostics).

=item $rk->stop

C<kafka_cluster down>.  Called by DESTROY and END.

=back

=cut

sub active_controller
{
	my ($self) = @_;
	my ($best, $epoch) = (undef, -1);
	for my $id (1 .. $self->{brokers})
	{
		my $log = _slurp("$self->{dir}/node-$id/server.log");
		while ($log =~ /\[QuorumController id=(\d+)\] Becoming the active controller at epoch (\d+)/g)
		{
			($best, $epoch) = ($1, $2) if $2 > $epoch;
		}
	}
	return $best;
}

sub log_tail
{
	my ($self, $id, $lines) = @_;
	my @l = split /\n/, _slurp("$self->{dir}/node-$id/server.log");
	$lines //= 40;
	return join "\n", @l[ ($#l - $lines + 1 < 0 ? 0 : $#l - $lines + 1) .. $#l ];
}

sub stop
{
	my ($self) = @_;
	return unless delete $live{"$self"};
	local ($?, $@);
	eval { $self->_run([ $tool, 'down', $self->{dir} ], 120) };
	return;
}

# Stop the cluster when the object goes (not in forked children).
sub DESTROY
{
	my ($self) = @_;
	return unless $self->{owner_pid} == $$;
	local ($@, $!, $?);
	eval { $self->stop };
}

END
{
	local ($@, $!, $?);
	for my $rk (values %live)
	{
		next unless defined $rk && $rk->{owner_pid} == $$;
		eval { $rk->stop };
	}
}

# Run kafka_cluster; returns its stdout, dies with everything on failure.
sub _run
{
	my ($self, $cmd, $timeout) = @_;
	my ($out, $err) = ('', '');
	my $ok = eval {
		IPC::Run::run($cmd, '<', \undef, '>', \$out, '2>', \$err,
			IPC::Run::timeout($timeout));
	};
	croak "RealKafka: @$cmd failed (" . ($@ || "exit " . ($? >> 8)) . "):\n$out$err"
	  unless $ok;
	return $out;
}

# A file's contents ('' if unreadable).
sub _slurp
{
	my ($file) = @_;
	open my $fh, '<', $file or return '';
	local $/;
	my $data = <$fh>;
	close $fh;
	return $data // '';
}

1;
