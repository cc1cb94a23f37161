# test/perl/MockKafka.pm
#
# Perl helper for the outbox TAP tests: a librdkafka mock Kafka cluster
# in its own process, controlled over TCP, plus the order_check verdict.

=pod

=head1 NAME

MockKafka - run a librdkafka mock Kafka cluster for outbox TAP tests

=head1 SYNOPSIS

  use lib "$FindBin::RealBin/../perl";    # wherever test/perl is
  use MockKafka;

  my $mk = MockKafka->start(
	  dir         => $dir,          # where files and the log go
	  brokers     => 3,
	  topics      => ['events:4'],  # NAME:PARTITIONS, pre-created
	  max_seconds => 600);          # the mock exits by itself after that

  my $bootstrap = $mk->bootstrap;   # "127.0.0.1:port,127.0.0.1:port,..."
  $mk->cmd("down 1");               # control command; dies on "err ..."
  $mk->cmd("errors 0 10");          # next ProduceRequest fails

  my $r = $mk->check(
	  topics => ['events'],
	  expect => { 'order-1' => 3 },  # or the name of an expect file
	  events => $file,               # optional: "id<TAB>version<TAB>event_id" lines
	  opts   => ['--verbose']);
  is($r->{exit}, 0, 'events complete and in order') or diag $r->{output};
  is($r->{gaps}, 0, 'no gaps');

  $mk->stop;                        # also done by DESTROY

=head1 DESCRIPTION

Starts test/tools/mock_kafka (located relative to this file, so the module
works from any working directory), waits until it has written its
bootstrap and control files, and offers helpers to send control commands
and to run test/tools/order_check against it.

See test/tools/mock_kafka.c for the list of control commands.

=cut

package MockKafka;

use strict;
use warnings;

use Carp;
use File::Basename qw(dirname);
use File::Spec;
use File::Temp ();
use IO::Socket::INET;
use IO::Select;
use IPC::Run ();
use Scalar::Util qw(weaken);
use Time::HiRes qw(time sleep);

my $tools_dir = File::Spec->catdir(dirname(File::Spec->rel2abs(__FILE__)),
	File::Spec->updir, 'tools');

my $instance = 0;

# Running instances (weak refs), so END can stop them: DESTROY alone is
# not reliable during global destruction, when the harness may be gone.
my %live;

=pod

=head1 METHODS

=over

=item MockKafka->start(%args)

Starts a mock cluster.  Arguments: C<dir> (directory for the bootstrap,
control and log files; default a temporary directory removed at exit),
C<brokers> (default 3), C<topics> (array of C<NAME:PARTITIONS>),
C<max_seconds> (default 600), C<start_timeout> (seconds to wait for the
mock to come up, default 10).  Dies with the mock's log if it does not come
up.

=cut

sub start
{
	my ($class, %args) = @_;

	my $bin = File::Spec->catfile($tools_dir, 'mock_kafka');
	croak "MockKafka: $bin not found or not executable (run make -C $tools_dir)"
	  unless -x $bin;

	my $dir = $args{dir} // File::Temp::tempdir('mock_kafka_XXXX',
		TMPDIR => 1, CLEANUP => 1);
	croak "MockKafka: directory $dir does not exist" unless -d $dir;

	my $brokers = $args{brokers} // 3;
	my $max_seconds = $args{max_seconds} // 600;
	my $start_timeout = $args{start_timeout} // 10;

	$instance++;
	my $base = File::Spec->catfile($dir, "mock_kafka_${$}_$instance");
	my $self = bless {
		dir => $dir,
		brokers => $brokers,
		bootstrap_file => "$base.bootstrap",
		control_file => "$base.control",
		log_file => "$base.log",
		owner_pid => $$,
	}, $class;

	# stale files from an earlier run would look like a live mock
	unlink $self->{bootstrap_file}, $self->{control_file};

	my @cmd = (
		$bin,
		'--brokers' => $brokers,
		'--bootstrap-file' => $self->{bootstrap_file},
		'--control-file' => $self->{control_file},
		'--max-seconds' => $max_seconds);
	push @cmd, '--topic' => $_ for @{ $args{topics} // [] };

	$self->{harness} = IPC::Run::start(\@cmd, '<', File::Spec->devnull,
		'>', $self->{log_file}, '2>&1');
	# last-resort handle for stop(); IPC::Run has no public pid accessor
	$self->{pid} = $self->{harness}{KIDS}[0]{PID};
	$live{"$self"} = $self;
	weaken($live{"$self"});

	my $deadline = time + $start_timeout;
	while (!(-s $self->{control_file} && -s $self->{bootstrap_file}))
	{
		if (!$self->{harness}->pumpable)
		{
			$self->{harness}->finish;
			my $status = $self->{harness}->result(0);
			delete $self->{harness};
			croak "MockKafka: mock_kafka exited with status $status "
			  . "during startup; log:\n"
			  . _slurp($self->{log_file});
		}
		if (time > $deadline)
		{
			$self->{harness}->kill_kill(grace => 2);
			delete $self->{harness};
			croak "MockKafka: mock_kafka did not write "
			  . "$self->{control_file} and $self->{bootstrap_file} "
			  . "within $start_timeout s; log:\n"
			  . _slurp($self->{log_file});
		}
		sleep 0.05;
	}

	$self->{bootstrap} = _slurp($self->{bootstrap_file});
	chomp $self->{bootstrap};
	$self->{port} = _slurp($self->{control_file});
	chomp $self->{port};
	croak "MockKafka: bad control file contents \"$self->{port}\""
	  unless $self->{port} =~ /^\d+$/;

	return $self;
}

=pod

=item $mk->bootstrap

The bootstrap server list, C<127.0.0.1:port,...>.

=item $mk->control_file, $mk->control_port, $mk->log_file, $mk->dir

Where the control port lives (for C<test/tools/mockctl>), the port itself,
the mock's log, and the directory given to start().

=cut

sub bootstrap    { $_[0]->{bootstrap} }
sub control_file { $_[0]->{control_file} }
sub control_port { $_[0]->{port} }
sub log_file     { $_[0]->{log_file} }
sub dir          { $_[0]->{dir} }

=pod

=item $mk->cmd($command)

Sends one control command (e.g. C<"down 1">, C<"errors 0 10">) and returns
the reply's data: the text after C<ok >, or the empty string for a plain
C<ok>.  Dies if the mock answers C<err ...> or cannot be reached.

=cut

sub cmd
{
	my ($self, $command) = @_;

	croak "MockKafka: mock is not running" unless $self->{harness};
	croak "MockKafka: command must be a single line"
	  if !defined $command || $command =~ /[\r\n]/;

	my $sock = IO::Socket::INET->new(
		PeerAddr => '127.0.0.1',
		PeerPort => $self->{port},
		Proto => 'tcp',
		Timeout => 10)
	  or croak "MockKafka: cannot connect to control port $self->{port}: $@";

	$sock->autoflush(1);
	print $sock "$command\n"
	  or croak "MockKafka: cannot send \"$command\": $!";

	my $reply = '';
	my $sel = IO::Select->new($sock);
	my $deadline = time + 30;
	while ($reply !~ /\n/)
	{
		my $left = $deadline - time;
		croak "MockKafka: no reply to \"$command\" within 30 s"
		  if $left <= 0 || !$sel->can_read($left);
		my $n = sysread($sock, my $buf, 4096);
		croak "MockKafka: connection closed before reply to \"$command\""
		  unless $n;
		$reply .= $buf;
	}
	close $sock;

	($reply) = split /\r?\n/, $reply, 2;
	return '' if $reply eq 'ok';
	return $1 if $reply =~ /^ok (.*)$/;
	croak "MockKafka: command \"$command\" failed: $reply";
}

=pod

=item $mk->check(topics => [...], expect => $file_or_hashref, opts => [...])

Runs C<test/tools/order_check> against the mock.  C<expect> is optional:
either an expect file name or a hashref C<< { aggregate_id => last_version } >>.
C<opts> are extra arguments (C<--verbose>, C<--any-start>,
C<--timeout-ms N>, ...).  Returns a hashref with the summary counters
(C<messages aggregates accepted duplicates gaps inversions lost split
malformed unexpected>; C<lost> is undef without C<expect>), C<exit> (0 ok,
1 anomalies, 2 read incomplete, 3 usage error) and C<output> (stdout and
stderr together).  Does not die on anomalies: test the counters.

=cut

sub check
{
	my ($self, %args) = @_;

	my $bin = File::Spec->catfile($tools_dir, 'order_check');
	croak "MockKafka: $bin not found or not executable" unless -x $bin;

	my @topics = @{ $args{topics} // croak "MockKafka: check needs topics" };
	croak "MockKafka: check needs at least one topic" unless @topics;

	my @cmd = ($bin, '--brokers', $self->{bootstrap});
	push @cmd, '--topic', $_ for @topics;

	my $tmp;
	if (defined $args{expect})
	{
		my $file = $args{expect};
		if (ref $file eq 'HASH')
		{
			$tmp = File::Temp->new(
				DIR => $self->{dir},
				TEMPLATE => 'expect_XXXX',
				SUFFIX => '.tsv');
			for my $agg (sort keys %$file)
			{
				croak "MockKafka: aggregate id \"$agg\" contains TAB or newline"
				  if $agg =~ /[\t\r\n]/;
				print $tmp "$agg\t$file->{$agg}\n";
			}
			close $tmp;
			$file = $tmp->filename;
		}
		push @cmd, '--expect', $file;
	}
	# the database's event_id at every (aggregate, version): see --events
	push @cmd, '--events', $args{events} if defined $args{events};
	push @cmd, @{ $args{opts} // [] };

	# order_check bounds itself with --timeout-ms; this is only a backstop
	my $output = '';
	my $ok = eval {
		IPC::Run::run(\@cmd, '<', \undef, '>&', \$output,
			IPC::Run::timeout(600));
		1;
	};
	my %r = (output => $output);
	if (!$ok)
	{
		$r{exit} = -1;
		$r{output} .= "\nMockKafka: order_check did not finish: $@";
		return \%r;
	}
	$r{exit} = $? >> 8;

	if ($output =~ /^order_check: (messages=.*)$/m)
	{
		for my $kv (split ' ', $1)
		{
			my ($k, $v) = split /=/, $kv, 2;
			$r{$k} = $v eq '?' ? undef : $v;
		}
	}
	return \%r;
}

=pod

=item $mk->stop

Sends C<quit>, waits up to 10 s for the mock to exit, then kills it.
Returns the mock's exit status (-1 if it had to be killed).  Called by
DESTROY, so explicit calls are optional.

=back

=cut

sub stop
{
	my ($self) = @_;

	delete $live{"$self"};
	my $h = delete $self->{harness};
	return unless $h;
	local $?;

	eval { local $self->{harness} = $h; $self->cmd('quit'); 1 };

	my $status = eval {
		my $deadline = time + 10;
		sleep 0.05 while $h->pumpable && time < $deadline;
		if ($h->pumpable)
		{
			$h->kill_kill(grace => 2);
			-1;
		}
		else
		{
			$h->finish;
			$h->result(0);
		}
	};
	return $status if defined $status;

	# the harness is unusable (global destruction): signal the pid directly
	if ($self->{pid} && kill(0, $self->{pid}))
	{
		kill 'TERM', $self->{pid};
		for (1 .. 100)
		{
			last unless kill(0, $self->{pid});
			last if waitpid($self->{pid}, 1) == $self->{pid};    # WNOHANG
			sleep 0.05;
		}
		kill 'KILL', $self->{pid} if kill(0, $self->{pid});
	}
	return -1;
}

sub DESTROY
{
	my ($self) = @_;

	# forked children (e.g. from the test framework) must not stop it
	return unless $self->{harness} && $self->{owner_pid} == $$;
	local ($@, $!, $?);
	eval { $self->stop };
}

END
{
	local ($@, $!, $?);
	for my $mk (values %live)
	{
		next unless defined $mk && $mk->{owner_pid} == $$;
		eval { $mk->stop };
	}
}

sub _slurp
{
	my ($file) = @_;
	open my $fh, '<', $file or return "(cannot read $file: $!)";
	local $/;
	my $data = <$fh>;
	close $fh;
	return $data // '';
}

1;
