# test/perl/MessageShape.pm
#
# What a record looks like to a consumer, checked against any cluster (the
# mock in 013, a real Kafka in 208): JSON, text and bytea payloads reach
# Kafka byte for byte (NUL bytes and invalid UTF-8 included); the record
# timestamp is the event's emit time, not its publish time; the session's
# W3C trace context travels in the headers; and a consumer written for
# Debezium's outbox event router with its defaults reads the records
# unchanged (topic outbox.event.<aggregate type>, key = aggregate id,
# value = payload, event id in header "id").

package MessageShape;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use JSON::PP;
use Test::More;

use OutboxTest;

our @EXPORT = qw(check_message_shape);

# Emits eight events on $node (whose publisher writes to $bootstrap, where
# topic outbox.event.order exists) and judges what a consumer reads back.
sub check_message_shape
{
	my ($node, $bootstrap) = @_;

	my $traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
	my $tracestate = 'rojo=00f067aa0ba902b7';
	# Every byte value, in a bytea payload.
	my $all_bytes = join '', map { chr } 0 .. 255;
	# JSON as the application wrote it: jsonb would reorder, respace and write
	# 1.5e300 out as a 301-digit number.
	my $exact_json = '{"b": 1,   "a": 1.5e300}';

	# Publishing paused: the events are published well after they were emitted.
	$node->safe_psql('postgres', 'SELECT outbox_pause()');
	$node->safe_psql('postgres', qq{
	BEGIN;
	SET LOCAL outbox.traceparent = '$traceparent';
	SET LOCAL outbox.tracestate = '$tracestate';
	SELECT event_id FROM outbox_emit('order', 'o-1', 'OrderCreated', '{"total": 10}');
	SELECT event_id FROM outbox_emit_raw('order', 'o-1', 'OrderText', '$exact_json');
	SELECT event_id FROM outbox_emit_raw('order', 'o-2', 'OrderBytes',
		(SELECT decode(string_agg(lpad(to_hex(b), 2, '0'), '' ORDER BY b), 'hex')
		   FROM generate_series(0, 255) b));
	SELECT event_id FROM outbox_emit_raw('order', 'o-2', 'OrderNul', '\\x0000ff80c328fe00'::bytea);
	SELECT event_id FROM outbox_emit('order', 'o-3', 'OrderDeleted', NULL);
	SELECT event_id FROM outbox_emit_many_raw(ARRAY[
		ROW('order', 'o-4', 'ManyText', '$exact_json', NULL, NULL, NULL, NULL)]::outbox_event_text[]);
	SELECT event_id FROM outbox_emit_many_raw(ARRAY[
		ROW('order', 'o-4', 'ManyBytes',
			(SELECT decode(string_agg(lpad(to_hex(b), 2, '0'), '' ORDER BY b), 'hex')
			   FROM generate_series(0, 255) b), NULL, NULL, NULL, NULL),
		ROW('order', 'o-4', 'ManyNul', '\\x0000ff80c328fe00'::bytea, NULL, NULL, NULL, NULL)]::outbox_event_bytea[]);
	COMMIT;
	});
	sleep 2;
	# Over 1.5 s after their emit, all eight are still pending and Kafka
	# holds none of them: they are published later (the database records no
	# publish time).
	is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox_pending
		WHERE clock_timestamp() - created_at > interval '1.5 s'}),
		'8', 'all eight still pending 1.5 s after their emit');
	my ($early, $eerr) = ('', '');
	my $read = IPC::Run::run([ 'kcat', '-C', '-b', $bootstrap, '-t', 'outbox.event.order', '-e', '-q', '-J' ],
		'>', \$early, '2>', \$eerr, IPC::Run::timeout(60));
	ok($read && !grep({ /^\{/ } split /\n/, $early), 'and Kafka holds none of them yet')
	  or diag "kcat: $eerr$early";
	$node->safe_psql('postgres', 'SELECT outbox_resume()');
	ok(defined wait_published($node, 120), 'everything published');

	# What PostgreSQL has, by event id: the payload's bytes as the publisher
	# must send them, the emit time in Unix milliseconds.
	my %db;
	for my $row (split /\n/, $node->safe_psql('postgres', q{
		SELECT event_id, aggregate_id, event_type,
		       coalesce(encode(payload_bytes, 'hex'), encode(convert_to(payload::text, 'UTF8'), 'hex'), 'null'),
		       floor(extract(epoch FROM created_at) * 1000)::bigint
		  FROM outbox ORDER BY id}))
	{
		my ($id, $agg, $type, $hex, $ms) = split /\|/, $row;
		$db{$id} = { aggregate_id => $agg, event_type => $type, ms => $ms,
			payload => $hex eq 'null' ? undef : pack('H*', $hex) };
	}
	is(scalar(keys %db), 8, 'eight events in the outbox');

	# The consumer's side: the records' exact bytes (kcat's format with
	# lengths, so NUL bytes and newlines are no delimiters) ...
	my ($raw, $err) = ('', '');
	IPC::Run::run([ 'kcat', '-C', '-b', $bootstrap, '-t', 'outbox.event.order', '-e', '-q',
					'-f', '%p %o %K %S\n%k%s' ],
		'>', \$raw, '2>', \$err, IPC::Run::timeout(60));
	my %bytes;
	while ($raw =~ /\G(\d+) (\d+) (-?\d+) (-?\d+)\n/gc)
	{
		my ($p, $o, $klen, $vlen) = ($1, $2, $3, $4);
		my $pos = pos($raw);
		my $key = $klen < 0 ? undef : substr($raw, $pos, $klen);
		$pos += $klen if $klen > 0;
		my $value = $vlen < 0 ? undef : substr($raw, $pos, $vlen);
		$pos += $vlen if $vlen > 0;
		$bytes{"$p/$o"} = { key => $key, value => $value };
		pos($raw) = $pos;
	}
	is(scalar(keys %bytes), 8, 'eight records read with their exact bytes') or diag $err;

	# ... and their headers and timestamps, as a Debezium user's consumer sees
	# them.
	my ($json, $jerr) = ('', '');
	IPC::Run::run([ 'kcat', '-C', '-b', $bootstrap, '-t', 'outbox.event.order', '-e', '-q', '-J' ],
		'>', \$json, '2>', \$jerr, IPC::Run::timeout(60));
	# (Decoded as bytes: kcat copies invalid UTF-8 into its JSON as is.)
	my @records = map { JSON::PP->new->decode($_) } grep { /^\{/ } split /\n/, $json;
	is(scalar(@records), 8, 'eight records read with their headers') or diag $jerr;

	# A consumer written for Debezium's outbox event router (defaults): the
	# event id from header "id" (for deduplication), the aggregate id from
	# the key, the payload from the value, the event time from the timestamp.
	my $debezium_consume = sub
	{
		my ($r) = @_;
		my %h = @{ $r->{headers} // [] };
		my $b = $bytes{"$r->{partition}/$r->{offset}"};
		return { id => $h{id}, key => $b->{key}, value => $b->{value}, ts => $r->{ts},
			tstype => $r->{tstype}, headers => \%h };
	};

	my %seen;
	for my $r (@records)
	{
		my $m = $debezium_consume->($r);
		my $d = defined $m->{id} ? $db{ $m->{id} } : undef;
		ok($d, "record $r->{partition}/$r->{offset}: header id is an emitted event id") or next;
		$seen{ $m->{id} }++;
		my $what = $d->{event_type};
		is($m->{headers}{event_id}, $m->{id}, "$what: header event_id equals header id");
		is($m->{key}, $d->{aggregate_id}, "$what: key = aggregate id");
		ok(defined $m->{value} == defined $d->{payload}
			  && (!defined $m->{value} || $m->{value} eq $d->{payload}),
			"$what: value = the payload, byte for byte");
		is($m->{ts}, $d->{ms}, "$what: timestamp = emit time ($d->{ms})");
		is($m->{tstype}, 'create', "$what: a create-time timestamp");
		is($m->{headers}{traceparent}, $traceparent, "$what: traceparent from the session");
		is($m->{headers}{tracestate}, $tracestate, "$what: tracestate from the session");
		is($m->{headers}{event_type}, $what, "$what: header event_type");
	}
	is(scalar(keys %seen), 8, 'each event read once, by its header id');

	# The exact bytes, against what the application passed (not only against
	# what the database holds).
	my %by_type = map { my $m = $debezium_consume->($_); ($db{ $m->{id} }{event_type} => $m) } @records;
	is($by_type{OrderText}{value}, $exact_json, 'a text payload is sent as written, not normalised');
	is($by_type{OrderBytes}{value}, $all_bytes, 'a bytea payload with every byte value is sent exactly');
	is($by_type{OrderNul}{value}, "\x00\x00\xff\x80\xc3\x28\xfe\x00",
		'a bytea payload with NUL bytes and invalid UTF-8 is sent exactly');
	is($by_type{OrderCreated}{value}, '{"total": 10}', 'a JSON payload is sent as jsonb renders it');
	ok(!defined $by_type{OrderDeleted}{value}, 'a NULL payload is a null value (tombstone)');
	# The same through outbox_emit_many_raw.
	is($by_type{ManyText}{value}, $exact_json, 'outbox_emit_many_raw: a text payload is sent as written');
	is($by_type{ManyBytes}{value}, $all_bytes, 'outbox_emit_many_raw: a bytea payload with every byte value is sent exactly');
	is($by_type{ManyNul}{value}, "\x00\x00\xff\x80\xc3\x28\xfe\x00",
		'outbox_emit_many_raw: NUL bytes and invalid UTF-8 are sent exactly');
	return;
}

1;
