# 010_rabbitmq.pl
#   The RabbitMQ destination against a real broker (Debian's rabbitmq-server,
#   started privately on loopback): message properties and routing keys;
#   each key's order while some of its rows keep failing (an unbound routing
#   key, an exchange that does not exist yet); basic.nack, basic.return, a
#   missing exchange and a refused connection retried until dead with the
#   reason; amqps with certificate checks; the broker stopped, then killed,
#   mid-stream and started again with nothing lost and no operator action;
#   a destination removed by a reload has its connections closed; the
#   header rule on AMQP (a null, a number, the message id's names, an empty
#   name's row dead).
use strict;
use warnings;

use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxRabbit;

my $rmq = rmq_start(name => 'mq', tls => 1);
my $url = $rmq->{url};
my $refused_port = qb_free_port();    # nothing listens there

# The topology the destinations publish into; qb.late is declared later.
rmq_tool($rmq,
	exchange => 'qb.events', 'topic',
	queue => 'q.orders', bind => 'q.orders', 'qb.events', 'orders.#',
	queue => 'q.keyed', bind => 'q.keyed', 'qb.events', 'k.#',
	queue => 'q.seq.a', bind => 'q.seq.a', 'qb.events', 'seq.bound',
	queue => 'q.seq.b',
	queue => 'q.late',
	queue => 'q.tls', bind => 'q.tls', 'qb.events', 'tls.#',
	'queue-reject' => 'q.full', 0,
	exchange => 'qb.stream', 'direct',
	queue => 'q.stream', bind => 'q.stream', 'qb.stream', 'stream');

my $node = qb_node('rabbit');
is(qb_outbox_count($node), '0', 'before: the outbox is empty');

# The circuit opens on the destinations this test makes fail (late, before
# qb.late is declared; stream, while the broker is down): a short cooldown,
# so each probes again, and resumes, within half a second of being fixed,
# not at the end of the default 30 s
my %mq = (type => 'rabbitmq', url => $url, circuitBreaker => { cooldownMs => 500 });
qb_configure(
	$node,
	qb_config_yaml(
		outbox => { maxAttempts => 100000, batchSize => 20 },
		destinations => {
			orders => { %mq, exchange => 'qb.events' },
			keyed => {
				%mq,
				exchange => 'qb.events',
				routingKey => 'k.{{ key }}.{{ topic }}',
				persistent => 'false'
			},
			ordered => { %mq, exchange => 'qb.events' },
			late => { %mq, exchange => 'qb.late', routingKey => 'late' },
			full => { %mq, exchange => '', routingKey => 'q.full' },
			unbound => { %mq, exchange => 'qb.events', routingKey => 'nobody.home' },
			loose => {
				%mq,
				exchange => 'qb.events',
				routingKey => 'nobody.home',
				mandatory => 'false'
			},
			missing => { %mq, exchange => 'qb.missing' },
			refused => {
				type => 'rabbitmq',
				url => "amqp://guest:guest\@127.0.0.1:$refused_port/",
				exchange => 'qb.events'
			},
			stream => { %mq, exchange => 'qb.stream', routingKey => 'stream' },
			secure => {
				type => 'rabbitmq',
				url => "amqps://guest:guest\@localhost:$rmq->{tls_port}/?cacertfile=$rmq->{ca}",
				exchange => 'qb.events',
				routingKey => 'tls.{{ topic }}'
			},
			untrusted => {
				type => 'rabbitmq',
				url => "amqps://guest:guest\@localhost:$rmq->{tls_port}/",
				exchange => 'qb.events',
				routingKey => 'tls.{{ topic }}'
			},
		},
		routes => [
			(map { +{ topicPattern => "$_.**", destination => $_ } }
				  qw(orders keyed late full unbound loose missing refused stream secure untrusted)),
			{ topicPattern => 'seq.**', destination => 'ordered' },
		]));

my $inserted = 0;

sub insert_rows
{
	my (@values) = @_;
	$node->safe_psql('postgres',
		"INSERT INTO queuebox.outbox (topic, key, payload, headers, max_attempts) VALUES\n"
		  . join(",\n", @values));
	$inserted += @values;
	return;
}

sub row
{
	my ($case) = @_;
	my $r = $node->safe_psql('postgres', qq{
		SELECT message_id, state, attempt, coalesce(last_error, '')
		FROM queuebox.outbox WHERE payload->>'case' = '$case'});
	my %h;
	@h{qw(mid state attempt last_error)} = split /\|/, $r, 4;
	return \%h;
}

# ---- properties: message_id, content_type, delivery_mode, headers,
# ---- correlation_id, the routing key from its template
insert_rows(
	q{('orders.created', 'c-1', '{"case": "props1", "n": 1}',
	   '{"X-Correlation-Id": "corr-42", "tenant": "acme", "x-inbox-id": "7"}', NULL)},
	q{('orders.paid', NULL, '{"case": "props2", "n": 2}', '{}', NULL)},
	q{('keyed.updated', 'cust-7', '{"case": "props3", "nested": {"a": [1, 2]}}',
	   '{"x-correlation-id": "lower-case-works"}', NULL)});
qb_wait_query($node,
	q{SELECT count(*) FROM queuebox.outbox WHERE payload->>'case' LIKE 'props%' AND state = 'sent'},
	'3', 'properties: three rows sent', timeout => 60);

my $orders = rmq_get($rmq, 'q.orders');
is(scalar @$orders, 2, 'properties: q.orders got the two orders.* messages');
my %by_mid = map { $_->{message_id} => $_ } @$orders, @{ rmq_get($rmq, 'q.keyed') };
my $p1 = $by_mid{ row('props1')->{mid} };
my $p2 = $by_mid{ row('props2')->{mid} };
my $p3 = $by_mid{ row('props3')->{mid} };
ok($p1 && $p2 && $p3, 'properties: each message carries its row\'s message_id');
SKIP:
{
	skip 'messages missing', 17 unless $p1 && $p2 && $p3;
	is($p1->{exchange}, 'qb.events', 'properties: published to the exchange');
	is($p1->{routing_key}, 'orders.created', 'properties: default routing key is the topic');
	is($p1->{content_type}, 'application/json', 'properties: content_type application/json');
	is($p1->{delivery_mode}, 2, 'properties: persistent by default (delivery_mode 2)');
	is($p1->{correlation_id}, 'corr-42', 'properties: correlation_id from X-Correlation-Id');
	is_deeply(
		$p1->{headers},
		{ 'X-Correlation-Id' => 'corr-42', tenant => 'acme', 'x-inbox-id' => '7' },
		'properties: the row\'s headers are the AMQP headers table');
	is($p1->{header_kinds}, 'SSS', 'properties: header values are long strings');
	is_deeply(decode_json($p1->{body}), { case => 'props1', n => 1 },
		'properties: the body is the payload');
	is($p2->{routing_key}, 'orders.paid', 'properties: second message routing key');
	is($p2->{correlation_id}, undef, 'properties: no correlation_id without the header');
	is_deeply($p2->{headers}, {}, 'properties: empty headers table for {} headers');
	is($p3->{exchange}, 'qb.events', 'keyed: published to the exchange');
	is($p3->{routing_key}, 'k.cust-7.keyed.updated',
		'keyed: routing key rendered from "k.{{ key }}.{{ topic }}"');
	is($p3->{delivery_mode}, 1, 'keyed: persistent: false gives delivery_mode 1');
	is($p3->{correlation_id}, 'lower-case-works',
		'keyed: the correlation header is found in any letter case');
	is_deeply(decode_json($p3->{body}), { case => 'props3', nested => { a => [ 1, 2 ] } },
		'keyed: the body is the payload');
	is($p3->{message_id}, row('props3')->{mid}, 'keyed: message_id is the row\'s');
}

# ---- the header rule (docs/delivery.md, "Row headers"): a null header is
# left out, a number goes as its JSON text, a header named like QueueBox's
# message id is left out (the id is the message_id property); an empty name
# makes the row dead at once, nothing published; rows counted before and after
my $dead_before = qb_count($node, "state = 'dead'");
my $total_before = qb_outbox_count($node);
insert_rows(
	q{('orders.rule', NULL, '{"case": "rule"}',
	   '{"X-Null": null, "X-Count": 5, "X-Message-Id": "forged", "message-id": "forged", "tenant": "acme"}', NULL)},
	q{('orders.rule', NULL, '{"case": "rule_bad"}', '{"tenant": "acme", "": "no name"}', NULL)});
qb_wait_query($node, q{
		SELECT string_agg(payload->>'case' || ':' || state || ':' || attempt, ',' ORDER BY id)
		FROM queuebox.outbox WHERE payload->>'case' IN ('rule', 'rule_bad')},
	'rule:sent:1,rule_bad:dead:0',
	'header rule: the row is sent; the row with an empty header name is dead, no attempt counted', timeout => 60);
my %rule_msgs = map { $_->{message_id} => $_ } @{ rmq_get($rmq, 'q.orders') };
my $rule = $rule_msgs{ row('rule')->{mid} } // {};
is_deeply($rule->{headers}, { 'X-Count' => '5', tenant => 'acme' },
	'header rule: the null and the message id\'s names are left out, the number is its JSON text');
is($rule->{header_kinds}, 'SS', 'header rule: as long strings');
is($rule->{message_id}, row('rule')->{mid}, 'header rule: message_id is the row\'s');
like(row('rule_bad')->{last_error},
	qr/^row header "" has an empty name, so the row cannot be sent on AMQP; remove or fix it in the row's headers, then requeue the row/,
	'header rule: the dead row\'s last_error names the header, the transport and what to do');
ok(!exists $rule_msgs{ row('rule_bad')->{mid} }, 'header rule: nothing published for the dead row');
is(qb_count($node, "state = 'dead'"), $dead_before + 1, 'header rule: rows counted after: one more dead');
is(qb_outbox_count($node), $total_before + 2, 'header rule: rows counted after: two more in all');

# ---- per-key order while some keys keep failing
# k1..k3 route to a bound key; u1..u3 to an unbound key (mandatory:
# basic.return); l1..l2 to an exchange that does not exist yet (404,
# channel closed).  Rows interleaved across keys.
my @okeys = qw(k1 k2 k3);
my @ukeys = qw(u1 u2 u3);
my @lkeys = qw(l1 l2);
my $per_key = 8;
my @values;
for my $s (1 .. $per_key)
{
	push @values, qq{('seq.bound', '$_', '{"key": "$_", "seq": $s}', '{}', NULL)} for @okeys;
	push @values, qq{('seq.unbound', '$_', '{"key": "$_", "seq": $s}', '{}', NULL)} for @ukeys;
	push @values, qq{('late.x', '$_', '{"key": "$_", "seq": $s}', '{}', NULL)} for @lkeys;
}
insert_rows(@values);

qb_wait_query($node, qq{
	SELECT count(*) FROM queuebox.outbox WHERE topic = 'seq.bound' AND state = 'sent'},
	scalar(@okeys) * $per_key, 'order: the bound keys are all delivered while other keys fail',
	timeout => 60);
qb_wait_query($node, q{
	SELECT bool_and(attempt >= 2) FROM queuebox.outbox
	WHERE topic IN ('seq.unbound', 'late.x') AND payload->>'seq' = '1'},
	't', 'order: the failing keys\' first rows are retried', timeout => 60);
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM queuebox.outbox
		WHERE topic IN ('seq.unbound', 'late.x') AND (state = 'sent' OR
		      (payload->>'seq' <> '1' AND attempt > 0))}),
	'0', 'order: no later row of a failing key was attempted or sent');
my $uerr = $node->safe_psql('postgres', q{
	SELECT last_error FROM queuebox.outbox WHERE key = 'u1' AND payload->>'seq' = '1'});
like($uerr,
	qr/unroutable: no queue is bound to exchange "qb\.events" with routing key "seq\.unbound"/,
	'order: an unroutable row says which exchange and routing key');
my $lerr = $node->safe_psql('postgres', q{
	SELECT last_error FROM queuebox.outbox WHERE key = 'l1' AND payload->>'seq' = '1'});
like($lerr, qr/404 NOT_FOUND - no exchange 'qb\.late'/,
	'order: a row for a missing exchange gives the broker\'s reason');
like($lerr, qr/retry in \d+ ms/, 'order: ... and is retried');

# now let them through
rmq_tool($rmq,
	bind => 'q.seq.b', 'qb.events', 'seq.unbound',
	exchange => 'qb.late', 'direct',
	bind => 'q.late', 'qb.late', 'late');
qb_wait_query($node, q{
	SELECT count(*) FROM queuebox.outbox
	WHERE (topic LIKE 'seq.%' OR topic = 'late.x') AND state = 'sent'},
	scalar(@values), 'order: once bound and declared, every row is sent', timeout => 60);

for my $q ([ 'q.seq.a', \@okeys ], [ 'q.seq.b', \@ukeys ], [ 'q.late', \@lkeys ])
{
	my ($queue, $keys) = @$q;
	my %seen;
	push @{ $seen{ $_->{key} } }, $_->{seq} for map { decode_json($_->{body}) } @{ rmq_get($rmq, $queue) };
	is_deeply(
		{ map { $_ => $seen{$_} } sort keys %seen },
		{ map { $_ => [ 1 .. $per_key ] } @$keys },
		"order: $queue holds each of its keys' messages once, in order");
}

# ---- failures retried until dead, with the reason
insert_rows(
	q{('full.x', NULL, '{"case": "nack"}', '{}', 3)},
	q{('unbound.x', NULL, '{"case": "return"}', '{}', 3)},
	q{('missing.x', NULL, '{"case": "no_exchange"}', '{}', 3)},
	q{('refused.x', NULL, '{"case": "refused"}', '{}', 3)},
	q{('loose.x', NULL, '{"case": "not_mandatory"}', '{}', 3)},
	q{('secure.x', NULL, '{"case": "tls"}', '{}', 3)},
	q{('untrusted.x', NULL, '{"case": "tls_untrusted"}', '{}', 2)});
insert_rows(
	q{('orders.bad', NULL, '{"case": "long_header"}', jsonb_build_object(repeat('h', 300), 'v'), 3)},
	q{('keyed.' || repeat('t', 300), 'x', '{"case": "long_key"}', '{}', 3)});

qb_wait_query($node, q{
	SELECT count(*) FROM queuebox.outbox
	WHERE payload->>'case' IN ('nack', 'return', 'no_exchange', 'refused', 'not_mandatory',
	                           'long_header', 'long_key', 'tls', 'tls_untrusted')
	  AND state IN ('sent', 'dead')},
	'9', 'failures: every row reaches a final state', timeout => 60);

my $r = row('nack');
is($r->{state}, 'dead', 'basic.nack (queue full, reject-publish): dead');
is($r->{attempt}, '3', 'basic.nack: after its 3 attempts');
like($r->{last_error}, qr/none remain: .*basic\.nack/, 'basic.nack: last_error says the broker nacked');

$r = row('return');
is($r->{state}, 'dead', 'basic.return (mandatory, unroutable): dead');
is($r->{attempt}, '3', 'basic.return: after its 3 attempts');
like($r->{last_error},
	qr/unroutable: no queue is bound to exchange "qb\.events" with routing key "nobody\.home"/,
	'basic.return: last_error names the exchange and routing key');

$r = row('no_exchange');
is($r->{state}, 'dead', 'missing exchange: dead');
is($r->{attempt}, '3', 'missing exchange: after its 3 attempts');
like($r->{last_error}, qr/404 NOT_FOUND - no exchange 'qb\.missing'/,
	'missing exchange: last_error has the broker\'s reason');

$r = row('refused');
is($r->{state}, 'dead', 'connection refused: dead');
is($r->{attempt}, '3', 'connection refused: after its 3 attempts');
like($r->{last_error}, qr/127\.0\.0\.1:$refused_port .*cannot connect: Connection refused/,
	'connection refused: last_error names the broker and the reason');
unlike($r->{last_error}, qr/guest/, 'connection refused: last_error shows no credentials');

$r = row('not_mandatory');
is($r->{state}, 'sent', 'mandatory: false: an unroutable message is acked, sent');
is($r->{attempt}, '1', 'mandatory: false: one attempt');

$r = row('long_header');
is($r->{state}, 'dead', 'a header name over 255 bytes: dead at once');
is($r->{attempt}, '0', 'a header name over 255 bytes: no attempt counted');
like($r->{last_error}, qr/1 to 255 bytes/, 'a header name over 255 bytes: last_error says why');

$r = row('long_key');
is($r->{state}, 'dead', 'a routing key over 255 bytes: dead at once');
like($r->{last_error}, qr/routing key .* 255/, 'a routing key over 255 bytes: last_error says why');

is(rmq_count($rmq, 'q.full'), '0', 'the nacked message is not in its queue');

$r = row('tls');
is($r->{state}, 'sent', 'amqps with cacertfile: sent');
my $tls_msgs = rmq_get($rmq, 'q.tls');
is(scalar(@$tls_msgs), 1, 'amqps: one message in its queue');
is($tls_msgs->[0]{message_id}, $r->{mid}, 'amqps: it is the row\'s message');
is($tls_msgs->[0]{routing_key}, 'tls.secure.x', 'amqps: with its routing key');
$r = row('tls_untrusted');
is($r->{state}, 'dead', 'amqps, a certificate from an unknown CA: dead after its attempts');
like($r->{last_error}, qr/cannot connect: SSL peer cert verification failed/,
	'amqps, a certificate from an unknown CA: last_error says verification failed');

# ---- the broker stopped, then killed, while rows keep coming
# A session inserts one keyed row every 30 ms until told to stop.
$node->safe_psql('postgres', 'CREATE TABLE stream_stop (stop bool)');
my $stream_sql = q{
	DO $$
	DECLARE i int := 0;
	BEGIN
	  LOOP
	    EXIT WHEN EXISTS (SELECT 1 FROM stream_stop) OR i >= 3000;
	    i := i + 1;
	    INSERT INTO queuebox.outbox (topic, key, payload)
	    VALUES ('stream.x', 's' || (i % 4), jsonb_build_object('case', 'stream', 'key', 's' || (i % 4), 'seq', i));
	    COMMIT;
	    PERFORM pg_sleep(0.03);
	  END LOOP;
	END $$;};
my ($ins_out, $ins_err) = ('', '');
my $inserter = IPC::Run::start(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c', $stream_sql ],
	'<', \undef, '>', \$ins_out, '2>', \$ins_err);

sub stream_sent
{
	return $node->safe_psql('postgres',
		q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'stream.x' AND state = 'sent'});
}

# rows of the stream that failed an attempt since $since (a timestamptz)
sub stream_failing_since
{
	my ($since, $re) = @_;
	return qq{
	SELECT count(*) > 0 FROM queuebox.outbox
	WHERE topic = 'stream.x' AND state = 'pending' AND attempt > 0
	  AND scheduled_at > '$since' AND last_error ~ '$re'};
}

qb_wait_for(sub { stream_sent() >= 20 }, 'stream: rows are delivered before the broker stops',
	timeout => 60);
my $t_stop = time;
my $since = $node->safe_psql('postgres', 'SELECT now()');
rmq_stop($rmq);
qb_wait_query($node, stream_failing_since($since, 'CONNECTION_FORCED|Connection refused'),
	't', 'stream: the broker stopped (graceful): rows fail and wait for a retry', timeout => 30);
my $sent_down = stream_sent();
usleep(1_000_000);
is(stream_sent(), $sent_down, 'stream: nothing is sent while the broker is down');
rmq_start($rmq);
note sprintf('broker was down %.1f s', time - $t_stop);
qb_wait_for(sub { stream_sent() >= $sent_down + 20 },
	'stream: delivery resumes once the broker is back, no operator action', timeout => 90);

$since = $node->safe_psql('postgres', 'SELECT now()');
rmq_kill($rmq);
qb_wait_query($node, stream_failing_since($since, 'connection lost|Connection refused'),
	't', 'stream: the broker killed (SIGKILL): rows fail and wait for a retry', timeout => 30);
$sent_down = stream_sent();
rmq_start($rmq);
qb_wait_for(sub { stream_sent() >= $sent_down + 20 },
	'stream: delivery resumes after the kill, no operator action', timeout => 90);

$node->safe_psql('postgres', 'INSERT INTO stream_stop VALUES (true)');
$inserter->finish;
is($inserter->result(0), 0, 'stream: the inserter committed all its rows') or diag $ins_err;
my $nstream = $node->safe_psql('postgres',
	q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'stream.x'});
$inserted += $nstream;
note "stream: $nstream rows inserted";
qb_wait_query($node,
	q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'stream.x' AND state = 'sent'},
	$nstream, "stream: all $nstream rows are sent in the end", timeout => 120);
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'stream.x' AND attempt > 1}) > 0,
	1, 'stream: some rows needed more than one attempt');

my %want = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', q{SELECT message_id FROM queuebox.outbox WHERE topic = 'stream.x'});
my $got = rmq_get($rmq, 'q.stream');
my (%count, %first_seq, @unknown, %seqs_by_key);
for my $m (@$got)
{
	my $b = decode_json($m->{body});
	push @unknown, $m->{message_id} unless $want{ $m->{message_id} };
	if (exists $first_seq{ $m->{message_id} })
	{
		# a duplicate: the same message, same id, same body
		is($first_seq{ $m->{message_id} }, $b->{seq}, "stream: duplicate of seq $b->{seq} has the same body");
	}
	else
	{
		push @{ $seqs_by_key{ $b->{key} } }, $b->{seq};
	}
	$first_seq{ $m->{message_id} } = $b->{seq};
	$count{ $m->{message_id} }++;
}
is(scalar(keys %count), $nstream,
	"stream: the queue holds every one of the $nstream messages (no loss)");
is(scalar(@unknown), 0, 'stream: and no message the outbox did not send');
my $dups = grep { $count{$_} > 1 } keys %count;
note sprintf('stream: %d messages in the queue for %d rows, %d with duplicates',
	scalar(@$got), $nstream, $dups);
my $ordered = 1;
for my $k (sort keys %seqs_by_key)
{
	my @s = @{ $seqs_by_key{$k} };
	for my $i (1 .. $#s)
	{
		$ordered = 0 if $s[$i] <= $s[ $i - 1 ];
	}
}
ok($ordered, 'stream: each key\'s messages are in order across the restarts');

# ---- a destination removed by a reload: its connections are closed
# the outbox connections the broker holds for a destination (one per worker)
sub dest_conns
{
	my ($dest) = @_;
	# the connection name is in the client properties
	my $out = rmq_ctl($rmq, '-q', 'list_connections', '--no-table-headers', 'client_properties');
	return scalar grep { /outbox, destination \Q$dest\E"/ } split /\n/, $out;
}
# a row each, so both destinations hold a connection (the broker's restart
# above dropped them; a publisher connects again at its next message)
insert_rows(q{('orders.created', 'o-last', '{"case": "reload1"}', '{}', 100)},
	q{('stream.x', 's-last', '{"case": "reload2", "seq": 0, "key": "s-last"}', '{}', 100)});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE payload->>'case' LIKE 'reload_' AND state = 'sent'},
	'2', 'reload: a row to each destination is sent', timeout => 60);
cmp_ok(dest_conns('orders'), '>=', 1, 'reload: the orders destination holds a connection');
cmp_ok(dest_conns('stream'), '>=', 1, 'reload: so does the stream destination');
qb_configure(
	$node,
	qb_config_yaml(
		outbox => { maxAttempts => 100000, batchSize => 20 },
		destinations => { stream => { %mq, exchange => 'qb.stream', routingKey => 'stream' } },
		routes => [ { topicPattern => 'stream.**', destination => 'stream' } ]));
qb_wait_for(sub { dest_conns('orders') == 0 },
	'reload: the connections of the removed orders destination are closed', timeout => 60);
insert_rows(q{('stream.x', 's-after', '{"case": "reload3", "seq": 0, "key": "s-after"}', '{}', 100)});
qb_wait_query($node, q{SELECT state FROM queuebox.outbox WHERE key = 's-after'}, 'sent',
	'reload: the destination that stayed still delivers', timeout => 60);
cmp_ok(dest_conns('stream'), '>=', 1, 'reload: and keeps its connection');

# ---- after
is(qb_outbox_count($node), $inserted, "after: the outbox holds the $inserted rows inserted");
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM queuebox.outbox WHERE state NOT IN ('sent', 'dead')}),
	'0', 'after: every row is sent or dead');
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM queuebox.outbox WHERE state = 'dead'}),
	'8', 'after: the 8 rows of the failure cases (and the header rule\'s) are dead, every other row is sent');

$node->stop;
rmq_stop($rmq);
done_testing();
