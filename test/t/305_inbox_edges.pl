# Inbox edges, on the mock: payloads jsonb refuses are applied with payload
# NULL (payload_bytes has them) instead of failing the batch; the inbox
# counters in outbox_counters() and the postgres_exporter queries of
# docs/postgres_exporter.yml; inbox retention in the consumer database,
# which the publisher does not serve (the inbox worker runs it there), and
# a replay after it is still a duplicate; a handler that moves its
# aggregate's row of inbox_aggregate (the versions are still stored);
# messages not from the publisher: one event twice in a batch without a
# version header, and messages with no identity header at all.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use IPC::Run;

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'outbox.event.edge';
my $raw_topic = 'raw.edge';
my ($node, $mk) = inbox_setup('inbox_edges', topics => ["$topic:1", "$raw_topic:1"], max_seconds => 600);
setup_consumer($node, 'billing', $topic);
$node->safe_psql('consumer', 'UPDATE app.knobs SET fail = false');

# 1. Payloads: valid JSON jsonb refuses (a number beyond numeric's range,
# \u0000), and bytes that are not JSON (one that starts like an object,
# which the fast path parses directly), between two JSON events.
$node->safe_psql('postgres', qq{
SELECT outbox_emit('edge', 'a', 'E', '{"ok": 1}', topic => '$topic');
SELECT outbox_emit_raw('edge', 'a', 'E', '{"n": 1e1000000}'::text, topic => '$topic');
SELECT outbox_emit_raw('edge', 'a', 'E', '{"s": "\\u0000"}'::text, topic => '$topic');
SELECT outbox_emit_raw('edge', 'a', 'E', 'not json'::text, topic => '$topic');
SELECT outbox_emit_raw('edge', 'a', 'E', '{"not": json}'::text, topic => '$topic');
SELECT outbox_emit('edge', 'a', 'E', '{"ok": 2}', topic => '$topic');
});
ok(defined wait_published($node, 60), 'producer: published');
ok(defined wait_applied($node, 6, 60), 'all six applied')
  or diag $node->safe_psql('consumer', 'SELECT * FROM inbox_status');
is($node->safe_psql('consumer',
		q{SELECT string_agg(version || ':' || coalesce(payload::text, 'NULL'), ' ' ORDER BY seq) FROM app.applied}),
	'1:{"ok": 1} 2:NULL 3:NULL 4:NULL 5:NULL 6:{"ok": 2}',
	'a payload jsonb refuses is NULL, in order with the others');
is($node->safe_psql('consumer', q{SELECT errors || ' ' || state FROM inbox_status}),
	'0 running', 'no handler error, the partition runs');
is(inbox_counter($node, 'applied'), '6', 'counter inbox_applied');
is(inbox_counter($node, 'handler_errors'), '0', 'counter inbox_handler_errors');
my $pg16 = $node->safe_psql('consumer', q{SELECT current_setting('server_version_num')::int >= 160000});
if ($pg16 eq 'f')
{
	cmp_ok(inbox_counter($node, 'batch_fallbacks'), '>=', 1,
		'before PostgreSQL 16 the refused payload sent the batch to the careful path');
}

# An event already claimed (by inbox_claim(), before it arrives) passes the
# version check: its claim conflicts on the fast path, the batch is applied
# again carefully, and it is a duplicate while the others are applied.
my $fallbacks = inbox_counter($node, 'batch_fallbacks');
$node->safe_psql('consumer', 'GRANT EXECUTE ON FUNCTION inbox_claim(text, text) TO app');
$node->safe_psql('consumer', "SET ROLE app; SELECT inbox_claim('billing', 'pre-claimed')");
$node->safe_psql('postgres', qq{BEGIN;
SELECT outbox_emit('edge', 'c', 'E', '{"n": 1}', topic => '$topic');
SELECT outbox_emit('edge', 'c', 'E', '{"n": 2}', topic => '$topic', event_id => 'pre-claimed');
SELECT outbox_emit('edge', 'c', 'E', '{"n": 3}', topic => '$topic');
COMMIT});
ok(defined wait_published($node, 60), 'producer: three more published');
ok(defined wait_applied($node, 8, 60), 'the two not claimed before are applied');
is($node->safe_psql('consumer', q{SELECT string_agg(version::text, ',' ORDER BY seq) FROM app.applied
	WHERE aggregate_id = 'c'}), '1,3', 'the one claimed before is not applied');
cmp_ok(inbox_counter($node, 'batch_fallbacks'), '>', $fallbacks, 'its claim sent the batch to the careful path');

# 2. More events, then a replay: counters of applied and duplicates.
$node->safe_psql('postgres', qq{SELECT outbox_emit('edge', 'b-' || (i % 10), 'E',
	jsonb_build_object('n', i), topic => '$topic') FROM generate_series(1, 100) i});
ok(defined wait_published($node, 60), 'producer: 100 more published');
ok(defined wait_applied($node, 108, 60), '108 applied');
my $dups = inbox_counter($node, 'duplicates');
my $replayed = $node->safe_psql('postgres', q{SELECT outbox_replay('a', 1)});
is($replayed, '6', 'aggregate a replayed');
ok(defined wait_published($node, 60), 'producer: replay published');
ok($node->poll_query_until('consumer',
		"SELECT value - $dups = 6 FROM outbox_counters() WHERE name = 'inbox_duplicates'"),
	'counter inbox_duplicates counts the replayed events');
is(inbox_counter($node, 'applied'), '108', 'counter inbox_applied: nothing applied twice');
cmp_ok(inbox_counter($node, 'batches'), '>=', 1, 'counter inbox_batches');
cmp_ok(inbox_counter($node, 'rebalances'), '>=', 1, 'counter inbox_rebalances');
is($node->safe_psql('consumer', 'SELECT sum(applied) FROM inbox_status'), '108',
	'inbox_status agrees with the counter');

# 3. The postgres_exporter queries run as a pg_monitor member and give
# every metric they declare.
my $yml = do
{
	local $/;
	open my $fh, '<', "$ENV{TESTDIR}/docs/postgres_exporter.yml" or die $!;
	<$fh>;
};
$node->safe_psql('consumer', 'CREATE ROLE monitor IN ROLE pg_monitor');
my %sections;
while ($yml =~ /^(\w+):\n  query: \|\n((?:    .*\n)+)  metrics:\n((?:    - .*\n)+)/mg)
{
	my ($name, $query, $metrics) = ($1, $2, $3);
	# A histogram x is exported from columns x, x_bucket, x_count, x_sum.
	my @declared = sort map { my ($m, $usage) = @$_;
		$usage eq 'HISTOGRAM' ? ($m, "${m}_bucket", "${m}_count", "${m}_sum") : ($m) }
	  map { [ /^(\w+): \{usage: (\w+)/ ] } $metrics =~ /^    - (.*)$/mg;
	my $cols = $node->safe_psql('consumer', qq{SET ROLE monitor;
		SELECT string_agg(k, ' ' ORDER BY k) FROM (SELECT DISTINCT k FROM ($query) q,
			jsonb_object_keys(to_jsonb(q)) k) s});
	is($cols, join(' ', @declared), "exporter query $name gives its declared metrics");
	$sections{$name} = $query;
}
ok(exists $sections{outbox_inbox} && exists $sections{outbox_inbox_partition},
	'the exporter file has the inbox queries');
is($node->safe_psql('consumer', "SET ROLE monitor; SELECT applied_total FROM ($sections{outbox_inbox}) q"),
	'108', 'exporter: outbox_inbox_applied_total');
is($node->safe_psql('consumer',
		"SET ROLE monitor; SELECT consumer || ' ' || partition || ' ' || applied_total || ' ' || lag FROM ($sections{outbox_inbox_partition}) q"),
	'billing 0 108 0', 'exporter: outbox_inbox_partition_* per partition');

# 4. Retention in the consumer database: the publisher serves "postgres",
# so the inbox worker deletes the consumer's old claims.  A replay after
# that is still dropped, by the aggregates' versions.
my $claims = $node->safe_psql('consumer', 'SELECT count(*) FROM inbox');
is($claims, '109', 'every event claimed (and the one claimed by hand)');
$node->append_conf('postgresql.conf', "outbox.inbox_retention = '1s'\n");
$node->reload;
ok($node->poll_query_until('consumer', 'SELECT count(*) = 0 FROM inbox'),
	'the inbox worker deleted the old claims of the consumer database');
cmp_ok(inbox_counter($node, 'retention_deleted'), '>=', $claims, 'counter inbox_retention_deleted');
$dups = inbox_counter($node, 'duplicates');
$node->safe_psql('postgres', q{SELECT outbox_replay('a', 1)});
ok(defined wait_published($node, 60), 'producer: replayed again');
ok($node->poll_query_until('consumer',
		"SELECT value - $dups = 6 FROM outbox_counters() WHERE name = 'inbox_duplicates'"),
	'without the claims the replay is still dropped, by version');
# Aggregate c (1 and 3 applied, 2 claimed before) was checked above.
$node->safe_psql('consumer', "DELETE FROM app.applied WHERE aggregate_id = 'c'");
my @p = consumer_verdict($node, "aggregate_id <> 'c'");
is_deeply(\@p, [], 'exactly once, in version order') or diag join("\n", @p);

# 5. A handler cannot leave the subscriber's role: RESET ROLE (back to the
# worker's bootstrap superuser) and SET ROLE are refused inside the
# security-restricted operation it runs in.
$node->safe_psql('consumer', q{SET ROLE app;
CREATE TABLE app.who (u text);
CREATE FUNCTION app.escape(m inbox_message) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	BEGIN
		IF m.aggregate_version % 2 = 0 THEN RESET ROLE; ELSE SET ROLE postgres; END IF;
	EXCEPTION WHEN OTHERS THEN
		INSERT INTO app.who VALUES ('refused: ' || SQLERRM);
		RETURN;
	END;
	INSERT INTO app.who VALUES (current_user);
END $$;
SELECT inbox_subscribe('escape', ARRAY['outbox.event.edge'], 'app.escape(inbox_message)'::regprocedure);});
ok($node->poll_query_until('consumer', 'SELECT count(*) >= 100 FROM app.who'),
	'the escaping handler ran');
# (PostgreSQL names the user-id change first: "security-definer function".)
like($node->safe_psql('consumer', q{SELECT string_agg(DISTINCT u, ' | ') FROM app.who}),
	qr/^refused: cannot set parameter "role" within security-(definer function|restricted operation)$/,
	'RESET ROLE and SET ROLE are refused: the handler stays the subscriber');

# 6. A handler that updates its aggregate's row of inbox_aggregate (given
# the privilege for this test) moves the row the batch read: storing the
# versions by the ctid read finds nothing there, and the upsert must take
# over, or the versions stay behind.
$node->safe_psql('consumer', q{GRANT SELECT, UPDATE (updated_at) ON inbox_aggregate TO app;
SET ROLE app;
CREATE TABLE app.moved (aggregate_id text, version bigint);
CREATE FUNCTION app.mover(m inbox_message) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	UPDATE public.inbox_aggregate a SET updated_at = pg_catalog.now()
	 WHERE a.consumer = m.consumer AND a.aggregate_id = m.aggregate_id;
	INSERT INTO app.moved VALUES (m.aggregate_id, m.aggregate_version);
END $$;
SELECT inbox_subscribe('mover', ARRAY['outbox.event.edge'], 'app.mover(inbox_message)'::regprocedure);});
my $events = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox');
ok($node->poll_query_until('consumer', "SELECT count(*) >= $events FROM app.moved"),
	"the moving handler applied the $events events");
# A second round on the same aggregates: the versions stored before are read.
$node->safe_psql('postgres', qq{SELECT outbox_emit('edge', 'b-' || (i % 10), 'E',
	jsonb_build_object('n', i), topic => '$topic') FROM generate_series(1, 50) i});
ok(defined wait_published($node, 60), 'producer: 50 more published');
ok($node->poll_query_until('consumer', 'SELECT count(*) >= ' . ($events + 50) . ' FROM app.moved'),
	'the moving handler applied them');
sleep 1;
is($node->safe_psql('consumer', q{SELECT count(*) FROM (SELECT aggregate_id, version FROM app.moved
	GROUP BY 1, 2 HAVING count(*) > 1) d}), '0', 'moving handler: nothing applied twice');
is($node->safe_psql('consumer', q{SELECT count(*) FROM (SELECT aggregate_id, max(version) AS v FROM app.moved
	GROUP BY 1) m LEFT JOIN inbox_aggregate a ON a.consumer = 'mover' AND a.aggregate_id = m.aggregate_id
	WHERE a.last_version IS DISTINCT FROM m.v}), '0',
	'every aggregate whose row the handler moved has its last version stored');

# 7. Messages another producer wrote, into partition 0 of their own topic
# (kcat, one call per header set, so that each pair is one record batch):
# the same event twice back to back with an event_id header and no
# aggregate_version (no version check: only the claim can drop the second
# copy), then a payload twice with no header at all (each copy is its own
# message, identified by topic/partition/offset).  Written before the
# subscription, so that its first batch holds all four.  The claims are
# kept from now on (part 4 set a retention of 1 s).
$node->append_conf('postgresql.conf', "outbox.inbox_retention = -1\n");
$node->reload;
sub produce_raw
{
	my ($headers, @values) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'kcat', '-P', '-b', $mk->bootstrap, '-t', $raw_topic, '-p', '0',
					'-X', 'linger.ms=100', (map { ('-H', $_) } @$headers) ],
		'<', \join('', map { "$_\n" } @values), '>', \$out, '2>', \$err,
		IPC::Run::timeout(60))
	  or die "kcat failed: $err";
}
produce_raw([ 'event_id=raw-dup-1', 'aggregate_id=r' ], '{"n": 1}', '{"n": 1}');
produce_raw([], '{"n": 2}', '{"n": 2}');
$fallbacks = inbox_counter($node, 'batch_fallbacks');
$dups = inbox_counter($node, 'duplicates');
$node->safe_psql('consumer', qq{SET ROLE app;
	SELECT inbox_subscribe('raw', ARRAY['$raw_topic'], 'app.apply(inbox_message)'::regprocedure)});
ok($node->poll_query_until('consumer',
		"SELECT next_offset = 4 FROM inbox_offset WHERE consumer = 'raw'"),
	'raw: the stored offset moved past the four messages')
  or diag $node->safe_psql('consumer', "SELECT * FROM inbox_status WHERE consumer = 'raw'");
is($node->safe_psql('consumer', qq{SELECT string_agg(coalesce(event_id, '-') || ' ' || "offset"
	|| ' ' || coalesce(aggregate_id, '-') || ' ' || coalesce(version::text, '-') || ' ' || payload::text, ', ' ORDER BY seq)
	FROM app.applied WHERE topic = '$raw_topic'}),
	'raw-dup-1 0 r - {"n": 1}, - 2 - - {"n": 2}, - 3 - - {"n": 2}',
	'raw: the event with an event_id applied once, each message without one applied');
is($node->safe_psql('consumer', q{SELECT applied || ' ' || duplicates || ' ' || gaps || ' ' || errors
	|| ' ' || dead_lettered || ' ' || skipped || ' ' || state || ' ' || coalesce(last_error, '-')
	FROM inbox_status WHERE consumer = 'raw'}),
	'3 1 0 0 0 0 running -', 'raw: inbox_status counts the second copy as a duplicate, nothing failed');
is(inbox_counter($node, 'duplicates') - $dups, 1, 'counter inbox_duplicates counts the second copy');
is(inbox_counter($node, 'batch_fallbacks'), $fallbacks,
	'the copy within the batch was dropped before the claims (no unique violation, no careful path)');
is($node->safe_psql('consumer', q{SELECT string_agg(event_id, ' ' ORDER BY event_id COLLATE "C") FROM inbox WHERE consumer = 'raw'}),
	"raw-dup-1 $raw_topic/0/2 $raw_topic/0/3",
	'raw: claimed by event_id, else by topic/partition/offset');

# The stored offset set back to 0 and the worker restarted: it seeks
# there, and all four come again; with no version to check, the claims
# drop them (on the careful path: each claim conflicts).
$node->safe_psql('consumer', "UPDATE inbox_offset SET next_offset = 0 WHERE consumer = 'raw'");
$node->safe_psql('consumer',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'outbox inbox worker'");
ok($node->poll_query_until('consumer',
		"SELECT next_offset = 4 AND duplicates = 5 FROM inbox_offset WHERE consumer = 'raw'"),
	'raw: re-delivered from offset 0, all four dropped as duplicates')
  or diag $node->safe_psql('consumer', "SELECT * FROM inbox_status WHERE consumer = 'raw'");
is($node->safe_psql('consumer', "SELECT count(*) FROM app.applied WHERE topic = '$raw_topic'"), '3',
	'raw: nothing applied again');
is($node->safe_psql('consumer', q{SELECT errors || ' ' || state FROM inbox_status WHERE consumer = 'raw'}),
	'0 running', 'raw: the partition runs');

$node->stop;
$mk->stop;
done_testing();
