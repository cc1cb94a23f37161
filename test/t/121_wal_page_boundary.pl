# A batch whose WAL insert position sits right after a page header publishes.
#
# The publisher flushes WAL up to the insert position it reads after taking
# its batch snapshot.  When the last record ends exactly on a page boundary,
# GetXLogInsertRecPtr() points past the next page's header, which is not yet
# written, and XLogFlush() fails ("xlog flush request ... is not satisfied")
# on every retry until something else writes WAL.  Here nothing else does:
# wal_level = minimal (no standby snapshots from the background writer), no
# autovacuum, no checkpoint, no retention.  The event commits through 2PC,
# which does not wake the publisher; non-transactional logical messages then
# pad the WAL so that the insert position is a page start + header, and a
# SIGHUP (which writes no WAL) makes the publisher fetch.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use FaultTest;
use MockKafka;
use OutboxTest;

use constant PAGE => 8192;
use constant SHORT_PHD => 24;
use constant LONG_PHD => 40;

my ($node, $mk) = outbox_setup('walpage', database => 'postgres', poll_interval => '10min',
	retention => -1, inbox_retention => -1, server_conf => q{
wal_level = minimal
max_wal_senders = 0
max_prepared_transactions = 2
autovacuum = off
checkpoint_timeout = '1h'
max_wal_size = '1GB'
});
ok(defined wait_publisher($node, 1, 60), 'publisher running');

# Connect the producer first, so that only the flush can hold the event up.
$node->safe_psql('postgres', q{SELECT outbox_emit('walpage', 'warm', 'E', '{}')});
ok(defined wait_published($node, 60), 'warm-up event published');

my $segsize = $node->safe_psql('postgres',
	q{SELECT setting::bigint * (CASE unit WHEN '8kB' THEN 8192 WHEN 'B' THEN 1 ELSE 1048576 END)
	    FROM pg_settings WHERE name = 'wal_segment_size'});
my $usable_seg = ($segsize / PAGE) * (PAGE - SHORT_PHD) - (LONG_PHD - SHORT_PHD);

# An LSN as an integer, and as the count of record bytes before it
# (xlog.c's XLogRecPtrToBytePos).
sub lsn_int
{
	my ($hi, $lo) = split m{/}, shift;
	return hex($hi) * 2**32 + hex($lo);
}

sub bytepos
{
	my $ptr = shift;
	my $fullsegs = int($ptr / $segsize);
	my $off = $ptr % $segsize;
	my $fullpages = int($off / PAGE);
	my $inpage = $off % PAGE;
	my $pos = $fullsegs * $usable_seg;

	return $pos + $inpage - LONG_PHD if $fullpages == 0;
	return $pos + (PAGE - LONG_PHD) + ($fullpages - 1) * (PAGE - SHORT_PHD) + $inpage - SHORT_PHD;
}

sub insert_lsn
{
	return $node->safe_psql('postgres', 'SELECT pg_current_wal_insert_lsn()');
}

# Emit one non-transactional message of $n bytes (no xid, no commit record).
sub pad
{
	my $n = shift;
	$node->safe_psql('postgres', "SELECT pg_logical_emit_message(false, 'pad', repeat('x', $n))");
}

# A position right after a page header, where the old code's flush failed.
sub after_header
{
	my $ptr = lsn_int(shift);
	return ($ptr % $segsize == LONG_PHD) || ($ptr % PAGE == SHORT_PHD && $ptr % $segsize != SHORT_PHD);
}

# The event commits without waking the publisher (2PC: README).
my $published = counter($node, 'events_published');
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT outbox_emit('walpage', 'edge', 'E', '{}');
	PREPARE TRANSACTION 'walpage';
	COMMIT PREPARED 'walpage';
});

# A message's size: a fixed overhead plus its length (MAXALIGNed; lengths
# here are multiples of 8 and at least 256, so the overhead is constant).
my $l0 = insert_lsn();
pad(1000);
my $overhead = bytepos(lsn_int(insert_lsn())) - bytepos(lsn_int($l0)) - 1000;
note "per-message overhead: $overhead bytes";

# Pad to the start of the next page that leaves room for one message.
# Retried should anything else have written WAL in between.
my $lsn;
for my $attempt (1 .. 5)
{
	my $cur = lsn_int(insert_lsn());
	my $page = $cur - $cur % PAGE + PAGE;
	my $need = bytepos($page + ($page % $segsize == 0 ? LONG_PHD : SHORT_PHD)) - bytepos($cur);
	if ($need < $overhead + 256)
	{
		$page += PAGE;
		$need = bytepos($page + ($page % $segsize == 0 ? LONG_PHD : SHORT_PHD)) - bytepos($cur);
	}
	pad($need - $overhead);
	$lsn = insert_lsn();
	last if after_header($lsn);
	note "attempt $attempt missed: insert position $lsn";
}
ok(after_header($lsn), "WAL insert position $lsn is right after a page header");
is(counter($node, 'events_published'), $published, 'the event is not published yet');

# Wake the publisher without writing WAL.
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
my $t0 = time;
sleep 0.1 while counter($node, 'events_published') == $published && time - $t0 < 20;
cmp_ok(counter($node, 'events_published'), '>', $published,
	'the event is published with the insert position on a page boundary');
note sprintf 'FIGURES scenario=wal_page_boundary insert_lsn=%s published_s=%.2f', $lsn, time - $t0;
ok(!$node->log_contains('flush request'), 'no failed WAL flush in the log')
  or diag join "\n", grep { /flush request/ } split /\n/, slurp_file($node->logfile);

$node->stop;
$mk->stop;
done_testing();
