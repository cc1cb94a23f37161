# Fault: logical replication's apply writes the outbox's rows (a
# subscription to another server's table of the same name), committing
# asynchronously as apply does by default, and the subscriber crashes under
# that load, again and again.
#
# Apply fires no statement trigger on INSERT: the outbox's row trigger that
# fires only in replica mode (outbox_note_applied) marks its transactions,
# and the publisher flushes the WAL past their commits before publishing
# them (invariant 1).  Without it the publisher publishes commits that a
# crash then takes back; apply sends those transactions again and the
# subscriber gives their rows new event ids (the column's default), so
# Kafka holds at some (aggregate, version) an event the database never
# kept: the order checker counts each as "mismatched".
#
# The WAL writer is slowed down (10 s, 128 MB) so that asynchronous commits
# stay unwritten long enough for the publisher to see them; each crash is a
# pg_ctl -m immediate.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

my $restarts = $ENV{OUTBOX_FAULT_RESTARTS} // 3;
my $events = 3000;

# The source: a plain table named like the extension's, published.
my $source = PostgreSQL::Test::Cluster->new('apply_source');
pinned_init($source, allows_streaming => 'logical');
$source->start;
$source->safe_psql('postgres', q{
CREATE TABLE public.outbox (aggregate_type text, aggregate_id text, aggregate_version bigint,
	event_type text, topic text, payload jsonb);
CREATE PUBLICATION events FOR TABLE public.outbox;
CREATE SEQUENCE public.n MINVALUE 0 START 0;
-- n events over 20 aggregates, one per transaction, versions in order.
CREATE PROCEDURE public.emit(n int) LANGUAGE plpgsql AS $$
DECLARE
	i bigint;
BEGIN
	FOR k IN 1 .. n LOOP
		i := nextval('public.n');
		INSERT INTO public.outbox
			VALUES ('load', 'a-' || i % 20, i / 20 + 1, 'Applied', 'outbox.event.load',
					jsonb_build_object('i', i));
		COMMIT;
		PERFORM pg_sleep(0.003);
	END LOOP;
END $$;
});

my ($node, $mk) = outbox_setup('apply', brokers => 3, fault_conf());
$node->append_conf('postgresql.conf', q{
wal_writer_delay = 10s
wal_writer_flush_after = 128MB
wal_buffers = 16MB
});
$node->restart;
(my $conninfo = $source->connstr('postgres')) =~ s/'/''/g;
$node->safe_psql('postgres',
	"CREATE SUBSCRIPTION events CONNECTION '$conninfo' PUBLICATION events WITH (synchronous_commit = off)");
$node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_subscription WHERE subname = 'events' AND pid IS NOT NULL})
  or die 'the subscription did not start';

my ($out, $err) = ('', '');
my $load = IPC::Run::start(
	[ 'psql', '-X', '-q', '-d', $source->connstr('postgres'), '-c', "CALL public.emit($events)" ],
	'>', \$out, '2>', \$err);
my $t_start = time;
sleep 0.2 while $node->safe_psql('postgres', 'SELECT count(*) FROM outbox') < 300 && time - $t_start < 30;

for my $i (1 .. $restarts)
{
	sleep 1.5;
	my $before = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
	$node->stop('immediate');
	$node->start;
	ok(defined wait_publisher($node, 1, 60), "immediate restart $i: publisher running again");
	note sprintf "immediate restart %d: %d rows before, %d after recovery",
	  $i, $before, $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
}
ok($load->finish, 'the source emitted every event') or diag $err;

ok($node->poll_query_until('postgres', "SELECT count(*) = $events FROM outbox"),
	'apply brought every row across');
ok(defined wait_published($node, 60), 'nothing pending');

db_versions_contiguous($node, 'replication apply');
verdict($mk, $node, 'replication_apply');
note_counters($node, $t_start);

$node->stop;
$source->stop;
$mk->stop;
done_testing();
