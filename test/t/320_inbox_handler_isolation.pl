# Inbox handlers as an attacker writes them, on the mock.  Roles billing_app
# and payments_app each subscribe a consumer to the same topic, holding only
# what an application is given (their own schema, EXECUTE on
# inbox_subscribe, inbox_unsubscribe and inbox_claim).
#
# billing_app's handler sets, at session level, search_path (to its own
# schema first, where it planted operators and functions over every name the
# workers' statements use, each trying ALTER ROLE ... SUPERUSER and
# recording the role it ran as), lock_timeout, default_transaction_isolation
# and a setting of its own; takes a session advisory lock; and tries inbox_claim() for payments' consumer.  Required: no
# trap runs as anyone but billing_app, billing_app stays a plain role, every
# handler call (billing's next ones, payments' ones) starts with the
# worker's settings, the claim is refused and payments applies every event.
#
# Subscribing: a handler must be the subscriber's own (or its role's), in a
# schema it may use: another role's SECURITY DEFINER function is refused,
# by name or by OID, and a subscription whose handler changes owner later
# stops being applied.
use strict;
use warnings;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use MockKafka;
use OutboxTest;
use InboxTest;

my $topic = 'outbox.event.sec';
my ($node, $mk) = inbox_setup('inbox_isolation', topics => ["$topic:2"], max_seconds => 600,
	inbox_retry_backoff => '100ms');

my $worker_defaults = $node->safe_psql('consumer', q{SELECT current_setting('lock_timeout')
	|| ' ' || current_setting('default_transaction_isolation')});

# Two applications, and a third role whose SECURITY DEFINER function writes
# where only it may.
$node->safe_psql('consumer', q{
CREATE ROLE billing_app LOGIN;
CREATE ROLE payments_app LOGIN;
CREATE ROLE other_app LOGIN;
CREATE SCHEMA billing AUTHORIZATION billing_app;
CREATE SCHEMA payments AUTHORIZATION payments_app;
CREATE SCHEMA other AUTHORIZATION other_app;
GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure), inbox_unsubscribe(text),
	inbox_claim(text, text) TO billing_app, payments_app;
});

# billing_app's traps: every operator over the types the workers' statements
# compare, add or subtract, and the functions they call, each a better or
# equal match than pg_catalog's once billing comes first in search_path.
$node->safe_psql('consumer', q{
SET ROLE billing_app;
CREATE TABLE billing.fired (what text, run_as name DEFAULT current_user);
GRANT INSERT ON billing.fired TO PUBLIC;
GRANT USAGE ON SCHEMA billing TO PUBLIC;
CREATE FUNCTION billing.sprung(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO billing.fired (what) VALUES (what);
	BEGIN
		EXECUTE 'ALTER ROLE billing_app SUPERUSER';
	EXCEPTION WHEN OTHERS THEN NULL;
	END;
END
$$;
DO $$
DECLARE
	o record;
	n int := 0;
BEGIN
	FOR o IN
		SELECT op, t.l, t.r
		  FROM unnest(ARRAY['=', '<>', '<', '<=', '>', '>=']) op,
			   (VALUES ('text', 'text'), ('integer', 'integer'), ('bigint', 'bigint'),
					   ('integer', 'bigint'), ('bigint', 'integer'),
					   ('timestamptz', 'timestamptz'), ('boolean', 'boolean'), ('tid', 'tid'),
					   ('oid', 'oid'), ('name', 'name')) t(l, r)
		UNION ALL
		SELECT op, t.l, t.r
		  FROM unnest(ARRAY['+', '-']) op,
			   (VALUES ('timestamptz', 'interval'), ('bigint', 'bigint'), ('integer', 'integer'),
					   ('bigint', 'integer')) t(l, r)
		UNION ALL SELECT '-', 'timestamptz', 'timestamptz'
		UNION ALL SELECT '~~', 'text', 'text'
		UNION ALL SELECT '||', 'text', 'text'
	LOOP
		n := n + 1;
		EXECUTE format('CREATE FUNCTION billing.trap_%s(a %s, b %s) RETURNS %s LANGUAGE plpgsql AS %L',
			n, o.l, o.r,
			(SELECT format_type(oprresult, NULL) FROM pg_operator
			  WHERE oprname = o.op AND oprleft = o.l::regtype AND oprright = o.r::regtype
				AND oprnamespace = 'pg_catalog'::regnamespace),
			format('BEGIN PERFORM billing.sprung(%L); RETURN a OPERATOR(pg_catalog.%s) b; END',
				   o.l || ' ' || o.op || ' ' || o.r, o.op));
		EXECUTE format('CREATE OPERATOR billing.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = billing.trap_%s)',
			o.op, o.l, o.r, n);
	END LOOP;
END
$$;
CREATE FUNCTION billing.now() RETURNS timestamptz LANGUAGE plpgsql AS
	$$BEGIN PERFORM billing.sprung('now()'); RETURN pg_catalog.now(); END$$;
CREATE FUNCTION billing.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS
	$$BEGIN PERFORM billing.sprung('clock_timestamp()'); RETURN pg_catalog.clock_timestamp(); END$$;
CREATE FUNCTION billing.make_interval(secs integer) RETURNS interval LANGUAGE plpgsql AS
	$$BEGIN PERFORM billing.sprung('make_interval()'); RETURN pg_catalog.make_interval(secs => secs); END$$;
CREATE FUNCTION billing.unnest(a text[]) RETURNS SETOF text LANGUAGE plpgsql AS
	$$BEGIN PERFORM billing.sprung('unnest(text[])'); RETURN QUERY SELECT pg_catalog.unnest(a); END$$;
CREATE FUNCTION billing.unnest(a bigint[]) RETURNS SETOF bigint LANGUAGE plpgsql AS
	$$BEGIN PERFORM billing.sprung('unnest(bigint[])'); RETURN QUERY SELECT pg_catalog.unnest(a); END$$;

CREATE TABLE billing.seen (
	seq bigint GENERATED ALWAYS AS IDENTITY,
	event_id text, search_path text, lock_timeout text, isolation text, leak text,
	locks bigint, claim text, run_as name);
CREATE FUNCTION billing.apply(m inbox_message) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	claim text;
BEGIN
	BEGIN
		PERFORM public.inbox_claim('payments', m.event_id);
		claim := 'claimed';
	EXCEPTION WHEN OTHERS THEN
		claim := SQLSTATE;
	END;
	INSERT INTO billing.seen (event_id, search_path, lock_timeout, isolation, leak, locks,
							  claim, run_as)
	VALUES (m.event_id, current_setting('search_path'), current_setting('lock_timeout'),
			current_setting('default_transaction_isolation'),
			current_setting('billing.leak', true),
			(SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()),
			claim, current_user);
	PERFORM set_config('search_path', 'billing, pg_catalog', false);
	PERFORM set_config('lock_timeout', '4321ms', false);
	PERFORM set_config('default_transaction_isolation', 'serializable', false);
	PERFORM set_config('billing.leak', m.event_id, false);
	PERFORM pg_advisory_lock(hashtext(m.event_id));
END
$$;
SELECT inbox_subscribe('billing', ARRAY['outbox.event.sec'], 'billing.apply(inbox_message)'::regprocedure);
});

$node->safe_psql('consumer', q{
SET ROLE payments_app;
CREATE TABLE payments.seen (
	seq bigint GENERATED ALWAYS AS IDENTITY,
	event_id text, search_path text, lock_timeout text, isolation text, leak text,
	locks bigint);
CREATE FUNCTION payments.apply(m inbox_message) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO payments.seen (event_id, search_path, lock_timeout, isolation, leak, locks)
	VALUES (m.event_id, current_setting('search_path'), current_setting('lock_timeout'),
			current_setting('default_transaction_isolation'), current_setting('billing.leak', true),
			(SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()));
END
$$;
SELECT inbox_subscribe('payments', ARRAY['outbox.event.sec'], 'payments.apply(inbox_message)'::regprocedure);
});

# Ten events in one transaction (one batch each), then ten more, one a
# transaction, so later batches meet whatever the first ones left behind.
$node->safe_psql('postgres', qq{SELECT outbox_emit('acct', 'a-' || (i % 3), 'E',
	jsonb_build_object('n', i), topic => '$topic') FROM generate_series(1, 10) i});
ok(poll_until($node, 'consumer', q{SELECT count(*) FROM payments.seen}, '10', 120), 'payments applied the first ten');
for my $i (11 .. 20)
{
	$node->safe_psql('postgres', qq{SELECT outbox_emit('acct', 'a-' || ($i % 3), 'E',
		jsonb_build_object('n', $i), topic => '$topic')});
}
ok(poll_until($node, 'consumer', q{SELECT count(*) FROM billing.seen}, '20', 120), 'billing handled all twenty');
ok(poll_until($node, 'consumer', q{SELECT count(*) FROM payments.seen}, '20', 120), 'payments handled all twenty');
# One more refresh and batch round after the last handler call.
$node->safe_psql('postgres', qq{SELECT outbox_emit('acct', 'z', 'E', '{}', topic => '$topic')});
ok(poll_until($node, 'consumer', q{SELECT count(*) FROM payments.seen}, '21', 120), 'and one more');

is($node->safe_psql('consumer', q{SELECT string_agg(DISTINCT what || ' as ' || run_as, ', ')
	FROM billing.fired WHERE run_as <> 'billing_app'}), '',
	'no planted operator or function ran as any role but billing_app');
is($node->safe_psql('consumer', q{SELECT rolsuper FROM pg_roles WHERE rolname = 'billing_app'}), 'f',
	'billing_app is not a superuser');
is($node->safe_psql('consumer', q{SELECT count(*) FROM billing.seen
	WHERE search_path <> 'pg_catalog, pg_temp' OR lock_timeout || ' ' || isolation <> '}
		. $worker_defaults . q{' OR coalesce(leak, '') <> '' OR locks <> 0}), '0',
	'every billing call starts with the worker settings, no advisory lock of an earlier call')
  or diag $node->safe_psql('consumer', 'SELECT * FROM billing.seen ORDER BY seq');
is($node->safe_psql('consumer', q{SELECT count(*) FROM payments.seen
	WHERE search_path <> 'pg_catalog, pg_temp' OR lock_timeout || ' ' || isolation <> '}
		. $worker_defaults . q{' OR coalesce(leak, '') <> '' OR locks <> 0}), '0',
	'nothing billing set reaches payments\' calls')
  or diag $node->safe_psql('consumer', 'SELECT * FROM payments.seen ORDER BY seq');
is($node->safe_psql('consumer', q{SELECT string_agg(DISTINCT run_as, ',') FROM billing.seen}),
	'billing_app', 'the handler ran as its subscriber');

# inbox_claim() inside a handler is authorised as the handler's role.
is($node->safe_psql('consumer', q{SELECT string_agg(DISTINCT claim, ',') FROM billing.seen}), '42501',
	'a handler cannot claim for a consumer registered to another role');
is($node->safe_psql('consumer', q{SELECT count(DISTINCT event_id) FROM payments.seen}), '21',
	'payments applied every event: none was claimed away');
my ($rc, $out, $err) = $node->psql('consumer', q{SELECT inbox_claim('payments', 'x')},
	extra_params => ['-U', 'billing_app']);
like($err, qr/permission denied to claim for consumer "payments"/, 'nor can billing_app directly');
is($node->safe_psql('consumer', q{SET ROLE payments_app; SELECT inbox_claim('payments', 'by-hand')}), 't',
	'the consumer\'s own role claims');

# Subscribing with a handler that is not the subscriber's own.
$node->safe_psql('consumer', q{
SET ROLE other_app;
CREATE TABLE other.private (who name, at timestamptz DEFAULT now());
CREATE FUNCTION other.write_as_other(m inbox_message) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS
	$$INSERT INTO other.private (who) VALUES (current_user)$$;
});
my $definer_oid = $node->safe_psql('consumer', q{SELECT 'other.write_as_other(inbox_message)'::regprocedure::oid});
($rc, $out, $err) = $node->psql('consumer',
	qq{SET ROLE billing_app; SELECT inbox_subscribe('stolen', ARRAY['$topic'], ${definer_oid}::regprocedure)});
like($err, qr/must be owner of function other\.write_as_other/,
	'another role\'s SECURITY DEFINER function, by OID, is refused');
$node->safe_psql('consumer', q{GRANT USAGE ON SCHEMA other TO billing_app});
($rc, $out, $err) = $node->psql('consumer',
	qq{SET ROLE billing_app; SELECT inbox_subscribe('stolen', ARRAY['$topic'], 'other.write_as_other(inbox_message)'::regprocedure)});
like($err, qr/must be owner of function other\.write_as_other/,
	'... and by name with USAGE on its schema');
# A function of billing_app's own in a schema it may not use.
$node->safe_psql('consumer', q{
CREATE SCHEMA locked;
CREATE FUNCTION locked.apply(m inbox_message) RETURNS void LANGUAGE sql AS $$SELECT$$;
ALTER FUNCTION locked.apply(inbox_message) OWNER TO billing_app;
});
my $locked_oid = $node->safe_psql('consumer', q{SELECT 'locked.apply(inbox_message)'::regprocedure::oid});
($rc, $out, $err) = $node->psql('consumer',
	qq{SET ROLE billing_app; SELECT inbox_subscribe('locked', ARRAY['$topic'], ${locked_oid}::regprocedure)});
like($err, qr/permission denied for schema locked/, 'a handler in a schema the subscriber may not use is refused');
is($node->safe_psql('consumer', q{SELECT count(*) FROM inbox_subscription WHERE consumer IN ('stolen', 'locked')}),
	'0', 'neither was subscribed');

# A member of the handler's owning role may subscribe it.
$node->safe_psql('consumer', q{CREATE ROLE billing_ops LOGIN IN ROLE billing_app;
	GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure) TO billing_ops});
is($node->psql('consumer', qq{SET ROLE billing_ops;
	SELECT inbox_subscribe('billing2', ARRAY['$topic'], 'billing.apply(inbox_message)'::regprocedure)}),
	0, 'a member of the owner may subscribe the owner\'s handler');
$node->safe_psql('consumer', q{SET ROLE billing_ops; SELECT inbox_unsubscribe('billing2')});

# The handler given away after subscribing: the subscription is no longer
# applied (and says why).
my $log_pos = -s $node->logfile;
$node->safe_psql('consumer', q{ALTER FUNCTION payments.apply(inbox_message) OWNER TO other_app});
ok($node->wait_for_log(qr/subscription "payments" is not applied: .*does not own its handler/, $log_pos),
	'a handler whose owner changed is no longer run');
$node->safe_psql('postgres', qq{SELECT outbox_emit('acct', 'y', 'E', '{}', topic => '$topic')});
ok(poll_until($node, 'consumer', q{SELECT count(*) FROM billing.seen}, '22', 120), 'billing goes on');
sleep 2;
is($node->safe_psql('consumer', q{SELECT count(*) FROM payments.seen}), '21',
	'payments\' handler, now another role\'s, did not run');

$node->stop;
$mk->stop;
done_testing();
