# 001_delivery.pl
#   Rows committed with a business write are delivered once, with the right
#   request; rolled-back rows never are; enqueue() and COPY wake delivery;
#   outbox_stats and the worker processes are visible; the header rule on
#   HTTP (a null, a number, the message id's names, a bad header's row dead).
#
# The poll interval is one hour, so every delivery here depends on the
# wake-on-commit path (INSERT, enqueue(), COPY), not on the fallback poll.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink = qb_sink_start(name => 'delivery');

# ---- a fresh cluster, and no client connects until the workers run: the
# launcher must find queuebox.database on its own (it connects to no
# database, and a fresh cluster has no relcache init file yet).
my $node = qb_node('delivery', create_extension => 0);
my $startlog = qb_wait_log($node,
	qr/queuebox outbox \d started|"queuebox launcher" \(PID \d+\) exited/, 0, timeout => 30);
like($startlog, qr/queuebox outbox \d started in database "postgres"/,
	'with no client connected, the launcher starts the outbox workers');
unlike($startlog, qr/"queuebox launcher" \(PID \d+\) exited/,
	'with no client connected, the launcher does not exit')
  or diag join("\n", grep { /FATAL|launcher/ } split /\n/, $startlog);
$node->safe_psql('postgres', 'CREATE EXTENSION queuebox');
my $version = qb_version($node);

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

# ---- the processes
qb_wait_query($node,
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox outbox' AND datname = 'postgres'",
	'2', 'pg_stat_activity shows two queuebox outbox workers in database postgres');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox launcher'"),
	'1',
	'pg_stat_activity shows one queuebox launcher');
qb_wait_query($node, q{
		SELECT string_agg(s.worker || ':' || coalesce(s.database, '-') || ':' ||
						  (a.pid IS NOT NULL), ',' ORDER BY s.worker)
		FROM queuebox.worker_status() s
		LEFT JOIN pg_stat_activity a ON a.pid = s.pid
		  AND a.backend_type = CASE WHEN s.worker IN ('launcher', 'relay', 'ingress') THEN 'queuebox ' || s.worker
									ELSE 'queuebox outbox' END},
	'ingress:postgres:true,launcher:-:true,outbox 0:postgres:true,outbox 1:postgres:true,relay:postgres:true',
	'worker_status() lists the launcher, both outbox workers, the relay and the ingress with their live pids', timeout => 30);

# ---- configuration: two http destinations on the sink, one route each
qb_configure(
	$node,
	qb_config_yaml(
		outbox => { pollIntervalMs => 3600000 },
		destinations => {
			web => {
				type => 'http',
				baseUrl => $sink->{url},
				path => '/events',
				headers => { 'X-Static' => 'yes', Authorization => 'Bearer t0k' },
			},
			audit => { type => 'http', baseUrl => $sink->{url}, path => '/audit' },
		},
		routes => [
			{ topicPattern => 'orders.**', destination => 'web' },
			{ topicPattern => 'audit.*', destination => 'audit' },
		]));

$node->safe_psql('postgres',
	'CREATE TABLE orders (id int PRIMARY KEY, amount numeric NOT NULL)');

# ---- a rolled-back transaction: its rows must never reach the sink
$node->safe_psql('postgres', q{
	BEGIN;
	INSERT INTO orders VALUES (99, 1);
	INSERT INTO queuebox.outbox (topic, key, payload)
	VALUES ('orders.created', 'order-99', '{"order": 99, "rolled_back": true}');
	ROLLBACK;
});

# ---- rows committed with the business row
$node->safe_psql('postgres', q{
	BEGIN;
	INSERT INTO orders VALUES (1, 10), (2, 20), (3, 30);
	INSERT INTO queuebox.outbox (topic, key, payload, headers)
	SELECT 'orders.created', 'order-' || i,
		   jsonb_build_object('order', i, 'amount', i * 10, 'note', 'a "quoted" text'),
		   jsonb_build_object('X-Correlation-Id', 'corr-' || i)
	FROM generate_series(1, 3) i;
	-- a row header that a static header and a reserved header override
	INSERT INTO queuebox.outbox (topic, payload, headers)
	VALUES ('orders.updated', '{"order": 1, "status": "paid"}',
			'{"X-Correlation-Id": "corr-u", "X-Static": "from-row", "X-Message-Id": "forged", "X-Trace": "t-1"}');
	COMMIT;
});
is($node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.outbox'),
	'4', 'the rolled-back row is not in the outbox');

qb_wait_query($node,
	"SELECT count(*) FILTER (WHERE state = 'sent') FROM queuebox.outbox",
	'4', 'the four committed rows are sent (woken by the commit)', timeout => 30);

my $rows = $node->safe_psql('postgres', q{
	SELECT message_id, payload::text, headers->>'X-Correlation-Id', state, attempt,
		   last_error IS NULL, claim_token IS NULL, lease_until IS NULL
	FROM queuebox.outbox ORDER BY id});
my $by_id = qb_sink_by_id($sink);
for my $line (split /\n/, $rows)
{
	my ($mid, $payload, $corr, $state, $attempt, $noerr, $notoken, $nolease) =
	  split /\|/, $line;
	is($state, 'sent', "row $mid: state sent");
	is($attempt, '1', "row $mid: attempt 1");
	is("$noerr$notoken$nolease", 'ttt', "row $mid: no last_error, claim token or lease");
	my $reqs = $by_id->{$mid} // [];
	is(scalar @$reqs, 1, "row $mid: the sink saw exactly one request");
	my $r = $reqs->[0] or next;
	is($r->{method}, 'POST', "row $mid: POST");
	is($r->{path}, '/events', "row $mid: to the destination path");
	is($r->{status}, 200, "row $mid: answered 200");
	is($r->{body}, $payload, "row $mid: the body is the payload");
	is($r->{headers}{'content-type'}, 'application/json', "row $mid: Content-Type");
	is($r->{headers}{'x-message-id'}, $mid, "row $mid: X-Message-Id is the row's message_id");
	is($r->{headers}{'x-correlation-id'}, $corr, "row $mid: the row's X-Correlation-Id header");
	is($r->{headers}{'x-static'}, 'yes', "row $mid: the destination's static header (wins over the row's)");
	is($r->{headers}{authorization}, 'Bearer t0k', "row $mid: the destination's Authorization header");
	is($r->{headers}{'user-agent'}, "queuebox/$version", "row $mid: User-Agent queuebox/$version");
}
my $upd = $node->safe_psql('postgres',
	"SELECT message_id FROM queuebox.outbox WHERE topic = 'orders.updated'");
is($by_id->{$upd}[0]{headers}{'x-trace'}, 't-1', 'a free-form row header is passed through');

# ---- enqueue()
my $eid = $node->safe_psql('postgres', q{
	SELECT queuebox.enqueue('orders.shipped', '{"order": 2, "via": "enqueue"}',
							'order-2', '{"X-Correlation-Id": "corr-e"}')});
like($eid, qr/^\d+$/, 'enqueue() returns the new id');
my $eid2 = $node->safe_psql('postgres',
	q{SELECT queuebox.enqueue('orders.shipped', '{"order": 3, "via": "enqueue"}', NULL, NULL)});
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE id IN ($eid, $eid2) AND state = 'sent' AND attempt = 1",
	'2', 'the enqueue()d rows are sent with attempt 1', timeout => 30);
$by_id = qb_sink_by_id($sink);
my ($emid, $epayload) = split /\|/,
  $node->safe_psql('postgres', "SELECT message_id, payload::text FROM queuebox.outbox WHERE id = $eid");
is(scalar @{ $by_id->{$emid} // [] }, 1, 'enqueue(): one request');
is($by_id->{$emid}[0]{body}, $epayload, 'enqueue(): the body is the payload');
is($by_id->{$emid}[0]{headers}{'x-correlation-id'}, 'corr-e', 'enqueue(): the headers argument is sent');
is($node->safe_psql('postgres', "SELECT key IS NULL AND headers = '{}' FROM queuebox.outbox WHERE id = $eid2"),
	't', 'enqueue() with NULL key and headers stores NULL and {}');

# ---- COPY into the outbox (statement trigger -> wake at commit)
$node->safe_psql('postgres', qq{COPY queuebox.outbox (topic, key, payload, headers) FROM STDIN;
audit.copied\tc-1\t{"copied": 1}\t{"X-Correlation-Id": "corr-c1"}
audit.copied\tc-2\t{"copied": 2}\t{}
\\.
});
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'audit.copied' AND state = 'sent' AND attempt = 1",
	'2', 'rows COPYed into the outbox are sent (COPY wakes delivery)', timeout => 30);
$by_id = qb_sink_by_id($sink);
for my $mid (split /\n/, $node->safe_psql('postgres',
		"SELECT message_id FROM queuebox.outbox WHERE topic = 'audit.copied'"))
{
	is(join(',', map { $_->{path} } @{ $by_id->{$mid} // [] }),
		'/audit', "COPY row $mid: one request to the audit destination's path");
}

# ---- a row no route matches goes dead at once, and shows in the stats
$node->safe_psql('postgres',
	q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('unrouted.thing', '{}')});
qb_wait_query($node,
	"SELECT state FROM queuebox.outbox WHERE topic = 'unrouted.thing'",
	'dead', 'an unrouted row goes dead', timeout => 30);

# ---- the rolled-back row never reached the sink; business rows as committed
my $all = qb_sink_requests($sink);
is(scalar(grep { $_->{body} =~ /rolled_back/ } @$all), 0,
	'the rolled-back transaction\'s row was never delivered');
is($node->safe_psql('postgres', 'SELECT string_agg(id::text, \',\' ORDER BY id) FROM orders'),
	'1,2,3', 'the business rows are those of the committed transaction');
is(scalar(@$all), 8, 'the sink saw 8 requests in all: one per routed committed row');
my %mids = map { $_->{mid} => 1 } @$all;
is(scalar(keys %mids), 8, 'eight distinct message ids');

# ---- outbox_stats: per destination and per state, plus totals
is( $node->safe_psql('postgres', q{
		SELECT string_agg(coalesce(destination, 'NULL') || ':' || state || ':' || rows, ','
						  ORDER BY destination = '(all)' DESC, destination, state)
		FROM queuebox.outbox_stats}),
	'(all):dead:1,(all):sent:8,(no route):dead:1,audit:sent:2,web:sent:6',
	'outbox_stats counts rows per destination and state, with totals named (all) and listed first');

# ---- counts after
is(qb_outbox_count($node), '9', 'the outbox holds the 9 committed rows after the test');
is(qb_count($node, "state IN ('pending', 'processing')"), '0', 'none is left pending or processing');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox outbox'"),
	'2', 'still two outbox workers');

# ---- the header rule (docs/delivery.md, "Row headers"): a null header is
# left out, a number goes as its JSON text, QueueBox's message id wins under
# any of its names, a hop-by-hop name is left out; a header HTTP cannot
# carry makes the row dead at once (no attempt, no request), and the rows
# are counted before and after
my %before = map { $_ => qb_count($node, "state = '$_'") } qw(sent dead);
my $total_before = qb_outbox_count($node);
my $requests_before = scalar @{ qb_sink_requests($sink) };
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, payload, headers) VALUES
	('orders.rule', '{"case": "rule"}',
	 '{"X-Null": null, "X-Count": 5, "X-Message-Id": "forged", "message-id": "forged", "Connection": "close"}'),
	('orders.rule', '{"case": "bad"}', '{"X-Fine": "ok", "Bad Name": "v"}')});
qb_wait_query($node, q{
		SELECT string_agg(payload->>'case' || ':' || state || ':' || attempt, ',' ORDER BY id)
		FROM queuebox.outbox WHERE topic = 'orders.rule'},
	'rule:sent:1,bad:dead:0', 'header rule: the row is sent; the row with a bad header is dead, no attempt counted',
	timeout => 30);
my @rule_rows = map { [ split /\|/, $_, 2 ] } split /\n/, $node->safe_psql('postgres', q{
	SELECT message_id, coalesce(last_error, '') FROM queuebox.outbox WHERE topic = 'orders.rule' ORDER BY id});
my ($rule_mid, $bad_mid, $bad_error) = ($rule_rows[0][0], $rule_rows[1][0], $rule_rows[1][1]);
$by_id = qb_sink_by_id($sink);
my $rule = $by_id->{$rule_mid}[0] // { headers => {} };
is($rule->{headers}{'x-count'}, '5', 'header rule: a number header goes as its JSON text');
ok(!exists $rule->{headers}{'x-null'}, 'header rule: a null header is left out');
is($rule->{headers}{'x-message-id'}, $rule_mid, 'header rule: X-Message-Id is the row\'s message_id, once (a row\'s is left out)');
ok(!exists $rule->{headers}{'message-id'}, 'header rule: a row\'s message-id (Kafka\'s name for the id) is left out');
isnt($rule->{headers}{connection} // '', 'close', 'header rule: a row\'s Connection (hop-by-hop) is left out');
like($bad_error,
	qr/^row header "Bad Name" is not a valid HTTP header \(.*\), so the row cannot be sent on HTTP; remove or fix it in the row's headers, then requeue the row/,
	'header rule: the dead row\'s last_error names the header, the transport and what to do');
is(scalar @{ $by_id->{$bad_mid} // [] }, 0, 'header rule: no request for the dead row');
is(qb_count($node, "state = 'sent'"), $before{sent} + 1, 'header rule: rows counted after: one more sent');
is(qb_count($node, "state = 'dead'"), $before{dead} + 1, 'header rule: rows counted after: one more dead');
is(qb_outbox_count($node), $total_before + 2, 'header rule: rows counted after: two more in all');
is(scalar @{ qb_sink_requests($sink) }, $requests_before + 1, 'header rule: the sink saw one request more');

$node->stop;
qb_sink_stop($sink);
done_testing();
