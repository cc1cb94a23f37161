# Batches are bounded by bytes (outbox.batch_bytes), not only by events:
# 200 events of ~900 kB each must not all be read into one batch.  The
# publisher's peak resident memory (VmHWM of /proc/PID/status) stays far
# below the 180 MB of payloads; before, the batch held them all (and a
# copy in librdkafka): 1.4 GB for 500 such events.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use FaultTest;
use MockKafka;
use OutboxTest;

# Peak and current resident memory of a process, in kB.
sub memory_kb
{
	my ($pid) = @_;
	my $status = slurp_file("/proc/$pid/status");
	my ($hwm) = $status =~ /^VmHWM:\s+(\d+) kB/m;
	my ($anon) = $status =~ /^RssAnon:\s+(\d+) kB/m;
	return ($hwm, $anon);
}

my $limit_mb = $ENV{OUTBOX_TEST_RSS_LIMIT_MB} // 120;
my ($node, $mk) = outbox_setup('bytes', batch_bytes => $ENV{OUTBOX_TEST_BATCH_BYTES} // '8MB');
$node->append_conf('postgresql.conf', "shared_buffers = 16MB\n");
$node->restart;
ok(defined wait_publisher($node, 1, 60), 'publisher running');
my ($pid) = publisher_pids($node);

# 4 transactions of 50 events of 900,000 bytes (under librdkafka's
# message.max.bytes), emitted while publishing is paused so that all 200
# are pending at once; the rows compress well, the messages do not.
$node->safe_psql('postgres', 'SELECT outbox_pause()');
for my $t (0 .. 3)
{
	$node->safe_psql('postgres', qq{
		SELECT outbox_emit('big', 'big-' || g, 'E', to_jsonb(repeat(chr(97 + g % 26), 900000)))
		  FROM generate_series($t * 50 + 1, $t * 50 + 50) g});
}
$node->safe_psql('postgres', 'SELECT outbox_resume()');
ok(defined wait_published($node, 180), 'every large event published');
my ($hwm, $anon) = memory_kb($pid);
my $batches = counter($node, 'batches');
note sprintf 'FIGURES scenario=batch_bytes events=200 event_kb=879 batches=%d worker_peak_rss_mb=%.1f worker_rss_anon_mb=%.1f',
  $batches, $hwm / 1024, $anon / 1024;
cmp_ok($hwm, '<', $limit_mb * 1024, "the publisher's peak RSS stayed under $limit_mb MB");
cmp_ok($batches, '>=', 15, 'the events went out in many batches');
is((publisher_pids($node))[0], $pid, 'the same publisher did it all (no restart)');

# The mock keeps only ~5 MB per partition, so Kafka's side is not read back.
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM outbox_events WHERE state = 'published'}), '200',
	'every event published');
cmp_ok(counter($node, 'events_published'), '>=', 200, 'every event acknowledged by Kafka');

$node->stop;
$mk->stop;
done_testing();
