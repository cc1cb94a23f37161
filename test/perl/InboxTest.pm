# test/perl/InboxTest.pm
#
# Shared set-up of the inbox TAP tests: one cluster whose publisher serves
# database "postgres" (the producer) and whose inbox workers serve database
# "consumer", both with the extension, and a consumer-side handler that
# records what it applied.

package InboxTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use OutboxTest qw(outbox_node outbox_setup wait_until);

our @EXPORT = qw(inbox_node inbox_setup setup_consumer subscribe_database
  wait_applied wait_applied_across_restarts consumer_verdict inbox_counter
  inbox_pids producer_expected);

# A node with the publisher on "postgres" and the inbox on "consumer"
# (OutboxTest's node plus the inbox settings and the consumer database).
# %conf entries are appended as outbox.<key> = '<value>'.
sub inbox_node
{
	my ($name, $mk, %conf) = @_;
	my $node = outbox_node($name, $mk,
		inbox_database => 'consumer',
		inbox_kafka_properties => 'session.timeout.ms=6000;heartbeat.interval.ms=500',
		%conf);

	$node->safe_psql('postgres', 'CREATE DATABASE consumer');
	$node->safe_psql('consumer', 'CREATE EXTENSION outbox');
	return $node;
}

# OutboxTest's outbox_setup with an inbox_node: ($node, $mk).
sub inbox_setup
{
	my ($name, %opts) = @_;

	return outbox_setup($name, %opts, make_node => \&inbox_node);
}

# Role app, table app.applied and handler app.apply(inbox_message), which
# fails for payloads {"fail": true} while app.knobs.fail is set and sleeps
# app.knobs.delay seconds per message; then subscribe consumer $consumer to
# @topics as app.
sub setup_consumer
{
	my ($node, $consumer, @topics) = @_;

	$node->safe_psql('consumer', q{
CREATE ROLE app LOGIN;
CREATE SCHEMA app AUTHORIZATION app;
SET ROLE app;
CREATE TABLE app.applied (
	seq bigint GENERATED ALWAYS AS IDENTITY,
	aggregate_id text, version bigint, event_id text, topic text,
	"partition" int, "offset" bigint, payload jsonb, applied_by text);
CREATE TABLE app.knobs (fail boolean NOT NULL, delay float8 NOT NULL);
INSERT INTO app.knobs VALUES (true, 0);
CREATE FUNCTION app.apply(m inbox_message) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	IF (m.payload ->> 'fail')::boolean AND (SELECT fail FROM app.knobs) THEN
		RAISE EXCEPTION 'handler refuses %', m.event_id;
	END IF;
	PERFORM pg_sleep(delay) FROM app.knobs WHERE delay > 0;
	INSERT INTO app.applied (aggregate_id, version, event_id, topic, "partition", "offset", payload, applied_by)
	VALUES (m.aggregate_id, m.aggregate_version, m.event_id, m.topic, m."partition", m."offset",
			m.payload, current_user);
END
$$;
RESET ROLE;
});
	$node->safe_psql('consumer', 'GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure), inbox_unsubscribe(text) TO app');
	my $arr = join(',', map { "'$_'" } @topics);
	$node->safe_psql('consumer', qq{SET ROLE app;
		SELECT inbox_subscribe('$consumer', ARRAY[$arr], 'app.apply(inbox_message)'::regprocedure)});
}

# Wait until app.applied has $n rows; seconds taken, undef on timeout.
sub wait_applied
{
	my ($node, $n, $timeout) = @_;
	my $have;

	$timeout //= 120;
	my $t = wait_until(sub {
		$have = $node->safe_psql('consumer', 'SELECT count(*) FROM app.applied');
		return $have >= $n;
	}, $timeout, 0.2);
	diag "applied $have of $n after ${timeout}s" unless defined $t;
	return $t;
}

# wait_applied for a server that may be restarting: a failed query is
# polled again.  Seconds taken, undef on timeout.
sub wait_applied_across_restarts
{
	my ($node, $n, $timeout) = @_;
	my $t = wait_until(sub {
		my ($rc, $out) = (1, '');
		eval { ($rc, $out) = $node->psql('consumer', 'SELECT count(*) FROM app.applied') };
		return $rc == 0 && $out >= $n;
	}, $timeout, 0.2);

	diag "not all of $n applied after $timeout s" unless defined $t;
	return $t;
}

# What the producer committed: "aggregate_id\tversion\tevent_id" lines.
sub producer_expected
{
	my ($node, $where) = @_;
	$where //= 'true';
	return $node->safe_psql('postgres',
		"SELECT aggregate_id || E'\\t' || aggregate_version || E'\\t' || event_id
		   FROM outbox WHERE $where ORDER BY aggregate_id, aggregate_version");
}

# The consumer database's check: every committed event (matching $where)
# applied exactly once, per aggregate in version order.  Returns a list of
# problems.  Versions a policy dropped ($where leaves them out) may be
# missing between two applied ones; any other hole is caught by the
# comparison with the producer's events.
sub consumer_verdict
{
	my ($node, $where) = @_;
	my @problems;
	my $expected = producer_expected($node, $where);
	my $got = $node->safe_psql('consumer',
		"SELECT aggregate_id || E'\\t' || version || E'\\t' || event_id
		   FROM app.applied ORDER BY aggregate_id, version, seq");
	push @problems, 'applied events differ from the committed ones'
	  if $got ne $expected;
	my $dups = $node->safe_psql('consumer',
		'SELECT count(*) FROM (SELECT event_id FROM app.applied GROUP BY 1 HAVING count(*) > 1) d');
	push @problems, "$dups events applied more than once" if $dups;
	my $inversions = $node->safe_psql('consumer', q{
		SELECT count(*) FROM (SELECT version, lag(version) OVER (PARTITION BY aggregate_id ORDER BY seq) AS prev
								FROM app.applied) s
		 WHERE prev IS NOT NULL AND version <= prev});
	push @problems, "$inversions applications out of version order" if $inversions;
	return @problems;
}

# Database $db (existing, as role app) consuming: the extension, schema app
# with table app.applied and handler app.apply(inbox_message) recording
# each event's aggregate and version, and consumer $consumer subscribed to
# $topic as app (handlers never run as a superuser).
sub subscribe_database
{
	my ($node, $db, $consumer, $topic) = @_;

	$node->safe_psql($db, qq{
CREATE EXTENSION outbox;
CREATE SCHEMA app AUTHORIZATION app;
GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure) TO app;
SET ROLE app;
CREATE TABLE app.applied (aggregate_id text, version bigint);
CREATE FUNCTION app.apply(m inbox_message) RETURNS void LANGUAGE sql
  AS \$\$ INSERT INTO app.applied VALUES (m.aggregate_id, m.aggregate_version) \$\$;
SELECT inbox_subscribe('$consumer', ARRAY['$topic'], 'app.apply(inbox_message)'::regprocedure);
RESET ROLE;
});
	return;
}

# An inbox counter (outbox_counters() row inbox_<name>) of the consumer's server.
sub inbox_counter
{
	my ($node, $name) = @_;
	return $node->safe_psql('consumer',
		"SELECT value FROM outbox_counters() WHERE name = 'inbox_$name'");
}

# Pids of the inbox workers.
sub inbox_pids
{
	my ($node) = @_;
	my $pids = $node->safe_psql('postgres',
		"SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE backend_type = 'outbox inbox worker'");
	return grep { $_ } split / /, $pids;
}

1;
