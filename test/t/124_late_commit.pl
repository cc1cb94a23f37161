# The publisher reads deltas of commits (PgQ-style snapshots), not an id
# cursor: an event whose transaction began early and commits late (a
# prepared transaction here; a long one is the same) has a low id and an
# old transaction id, and must be published when it commits, however many
# later events went out before it (seed 002: why id cursors lose rows).
# Also: a restarted publisher reads from its stored horizon, so what was
# published before is neither sent nor read again from the start; and the
# first read without a horizon (a restore) reads every unsettled event.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;

use MockKafka;
use OutboxTest;

my $dir = $PostgreSQL::Test::Utils::tmp_check;
my ($node, $mk) = outbox_setup('late',
	mock_cmds => [ 'topic_create outbox.event.late 4 1' ]);
$node->append_conf('postgresql.conf', "max_prepared_transactions = 4\nlog_min_messages = debug1\n");
$node->restart;

# Two transactions take their ids and emit first, then stay prepared.
q1(q{BEGIN; SELECT outbox_emit('late', 'early-1', 'E', '{}'); PREPARE TRANSACTION 'early1'});
q1(q{BEGIN; SELECT outbox_emit('late', 'early-2', 'E', '{}'); PREPARE TRANSACTION 'early2'});
my $early_id = q1(q{SELECT max(id) FROM outbox});

# Many later transactions commit and are published meanwhile.
q1(q{SELECT outbox_emit('late', 'later-' || g % 50, 'E', jsonb_build_object('g', g))
	   FROM generate_series(1, 1000) g});
for my $g (1 .. 20)
{
	q1("SELECT outbox_emit('late', 'later-$g', 'E', '{}')");
}
ok(defined wait_published($node, 60), 'the later events are published');
cmp_ok(q1(qq{SELECT min(id) FROM outbox WHERE aggregate_id LIKE 'later-%'}), '>', $early_id,
	'the prepared events have lower ids than everything published');
ok($node->poll_query_until('postgres', q{SELECT count(*) > 0 FROM publisher_horizon}),
	'the publisher stored its horizon');
is(q1(q{SELECT count(*) || ' ' || bool_or(pg_visible_in_snapshot(x.transaction::text::xid8, h.snapshot))
		FROM pg_prepared_xacts x, publisher_horizon h}), '2 false',
	'the horizon does not see the prepared transactions');

# They commit late: their events must go out.
q1(q{COMMIT PREPARED 'early1'});
ok(defined wait_published($node, 60), 'the late commit is published');
q1(q{SELECT outbox_emit('late', 'later-1', 'E', '{}')});
q1(q{COMMIT PREPARED 'early2'});
ok(defined wait_published($node, 60), 'the second late commit is published');
is(q1(q{SELECT string_agg(aggregate_id || ':' || state, ' ' ORDER BY aggregate_id)
	FROM outbox_events WHERE aggregate_id LIKE 'early-%'}),
	'early-1:published early-2:published', 'both late events published');

my $expect = expect_file($node, "$dir/expect1");
my $r = $mk->check(topics => ['outbox.event.late'], expect => $expect);
is($r->{exit}, 0, 'in Kafka: every event, in order') or diag $r->{output};
is($r->{duplicates}, 0, 'no duplicate');

# A restart reads from the horizon: nothing is sent again.
my $messages = $r->{messages};
my $log_pos = -s $node->logfile;
$node->restart;
q1(q{SELECT outbox_emit('late', 'after-restart', 'E', '{}')});
ok(defined wait_published($node, 60), 'published after the restart');
$r = $mk->check(topics => ['outbox.event.late'], expect => expect_file($node, "$dir/expect2"));
is($r->{exit}, 0, 'after the restart: in order') or diag $r->{output};
is($r->{messages}, $messages + 1, 'the restart sent only the new event');
my $log = substr(slurp_file($node->logfile), $log_pos);
like($log, qr/outbox: reading the stream from \d+:\d+:/, 'the restarted publisher read from its horizon');

# Without a horizon (as after a restore) it reads every unsettled event.
q1(q{SELECT outbox_pause()});
q1(q{SELECT outbox_emit('late', 'no-horizon', 'E', '{}')});
q1(q{DELETE FROM publisher_horizon});
$node->restart;
$log_pos = -s $node->logfile;
q1(q{SELECT outbox_resume()});
ok(defined wait_published($node, 60), 'without a horizon the pending event is published');
$log = substr(slurp_file($node->logfile), $log_pos);
like($log, qr/outbox: reading the stream from the start/, 'and the publisher read from the start');
$r = $mk->check(topics => ['outbox.event.late'], expect => expect_file($node, "$dir/expect3"));
is($r->{exit}, 0, 'without a horizon: in order') or diag $r->{output};
is($r->{messages}, $messages + 2, 'only the pending event was sent');

$node->stop;
$mk->stop;
done_testing();
