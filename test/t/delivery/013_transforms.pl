# 013_transforms.pl
#   jq transforms where they run: on an outbox row, the route's transform
#   then the destination's, and what reaches the sink is the result; a
#   rejection on a route or a destination (or a runaway) sends the row dead
#   at once with the reason in last_error; at the ingress the source's
#   transform reshapes what is stored, and a rejection is 422 with nothing
#   stored.
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Utils;
use QueueBoxTest;
use Test::More;

my $json = JSON::PP->new->canonical(1);
my $sink = qb_sink_start(name => 'transforms');
my $node = qb_node('transforms', workers => 1, conf => "queuebox.relay_worker = off\n");
my $port = qb_free_port();
my $base = "http://127.0.0.1:$port";

my $yaml = <<'EOY';
outbox: { pollIntervalMs: 100, maxAttempts: 5, backoff: { initialMs: 50, maxMs: 200, jitter: 0 } }
http: { listen: "127.0.0.1:@PORT@" }
destinations:
  web:
    type: http
    baseUrl: "@SINK@"
    path: /events
    transform: '.order += ["destination"] | .destSawRoute = .route'
  strict:
    type: http
    baseUrl: "@SINK@"
    path: /strict
    transform: 'if .ok then {id, checked: true} else error("not ok: \(.id)") end'
routes:
  - topicPattern: "reject.*"
    destination: web
    transform: 'error({code: "R1", id: .id})'
  - topicPattern: "slow.*"
    destination: web
    transform: 'last(range(1e15))'
  - topicPattern: "orders.**"
    destination: web
    transform: |
      {id, route: true, order: ["route"], topic: $topic, key: $key,
       tenant: $headers["X-Tenant"], source: $source}
  - topicPattern: "strict.*"
    destination: strict
sources:
  shop:
    type: http
    path: /shop
    idempotencyKeyPath: $.id
    eventTypePath: $.type
    aggregateIdPath: $.customer
    transform: |
      if .type == "spam" then error("spam is not accepted")
      else {id, type, total: ([.lines[].price] | add), source: $source,
            eventType: $eventType, key: $key, agent: $headers["X-Agent"]}
      end
EOY
$yaml =~ s/\@PORT\@/$port/g;
$yaml =~ s/\@SINK\@/$sink->{url}/g;
qb_configure($node, $yaml);

# ---- outbox: route then destination, the result is what is published
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, headers) VALUES
	  ('orders.created', 'k1', '{"id": 1, "secret": "not for the sink"}', '{"X-Tenant": "acme"}'),
	  ('reject.me', NULL, '{"id": 2}', '{}'),
	  ('strict.check', NULL, '{"id": 3, "ok": false}', '{}'),
	  ('strict.check', NULL, '{"id": 4, "ok": true, "extra": 1}', '{}'),
	  ('slow.one', NULL, '{"id": 5}', '{}');
});
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE state IN ('sent', 'dead')",
	'5', 'every row is settled', timeout => 60);

my %row;
for my $line (split /\n/, $node->safe_psql('postgres',
	q{SELECT payload->>'id', message_id, state, attempt, coalesce(last_error, ''), payload::text
	  FROM queuebox.outbox ORDER BY id}))
{
	my ($id, $mid, $state, $attempt, $err, $payload) = split /\|/, $line, 6;
	$row{$id} = { mid => $mid, state => $state, attempt => $attempt, err => $err,
		payload => $payload };
}
my $by_id = qb_sink_by_id($sink);
sub sink_body
{
	my ($id) = @_;
	my $reqs = $by_id->{ $row{$id}{mid} } // [];
	return @$reqs ? $json->decode($reqs->[0]{body}) : undef;
}

is($row{1}{state}, 'sent', 'a transformed row is sent');
is_deeply(sink_body(1),
	{ id => 1, route => JSON::PP::true, order => [ 'route', 'destination' ],
	  topic => 'orders.created', key => 'k1', tenant => 'acme', source => undef,
	  destSawRoute => JSON::PP::true },
	'the sink got the route transform then the destination transform, with $topic, $key and $headers bound');
like($row{1}{payload}, qr/not for the sink/, 'the stored row keeps its original payload');

is($row{2}{state}, 'dead', 'a route transform rejection: dead');
is($row{2}{attempt}, '0', 'a rejection spends no attempt');
is($row{2}{err}, 'route routes[0] transform rejected the message: {"code":"R1","id":2}',
	'last_error names the route and the error value');
is(sink_body(2), undef, 'the rejected row never reached the sink');

is($row{3}{state}, 'dead', 'a destination transform rejection: dead');
is($row{3}{err}, 'destination strict transform rejected the message: not ok: 3',
	'last_error names the destination and the message');
is(sink_body(3), undef, 'the row the destination rejected never reached the sink');
is($row{4}{state}, 'sent', 'the destination transform passes another row');
is_deeply(sink_body(4), { id => 4, checked => JSON::PP::true }, 'reshaped by the destination alone');
is($by_id->{ $row{4}{mid} }[0]{path}, '/strict', 'at the destination of its route');

is($row{5}{state}, 'dead', 'a runaway program: dead');
like($row{5}{err}, qr/^route routes\[1\] transform rejected the message: the transform ran longer than 1000 ms/,
	'last_error says the run was stopped at its deadline');

# the worker goes on after all of that
$node->safe_psql('postgres',
	q{INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('orders.after', 'k9', '{"id": 9}')});
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'orders.after'",
	'sent', 'the worker still delivers after rejections and a runaway');

# ---- ingress: the source transform shapes what is stored
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);
qb_wait_for(sub { $http->get("$base/healthz")->{status} == 200 }, 'the ingress listens', timeout => 30);
sub post
{
	my ($body) = @_;
	return $http->request('POST', "$base/inbox/shop",
		{ content => $body, headers => { 'Content-Type' => 'application/json', 'X-Agent' => 'a/1' } });
}
sub inbox_count { return $node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.inbox'); }

my $r = post('{"id":"s1","type":"order.paid","customer":"c9","lines":[{"price":5},{"price":7}],"card":"4111"}');
is($r->{status}, 202, 'a message the transform reshapes is accepted');
my ($key, $type, $agg, $payload) = split /\|/, $node->safe_psql('postgres',
	q{SELECT idempotency_key, event_type, aggregate_id, payload::text FROM queuebox.inbox WHERE source = 'shop'}), 4;
is("$key|$type|$agg", 's1|order.paid|c9', 'the values are extracted from the body as received');
is_deeply($json->decode($payload),
	{ id => 's1', type => 'order.paid', total => 12, source => 'shop', eventType => 'order.paid',
	  key => 'c9', agent => 'a/1' },
	'the stored payload is the transform output, with $source, $eventType, $key and $headers bound');

$r = post('{"id":"s1","type":"order.paid","customer":"c9","lines":[]}');
is($r->{status}, 200, 'a repeat is still a duplicate');

my $before = inbox_count();
$r = post('{"id":"s2","type":"spam","customer":"c9","lines":[]}');
is($r->{status}, 422, 'a rejected message is 422');
my $d = $json->decode($r->{content});
is_deeply($d, { status => 'error', reason => 'the source transform rejected the message: spam is not accepted' },
	'the 422 gives the reason');
$r = post('{"id":"s3","type":"order.paid","customer":"c9","lines":[{"price":"x"},{"price":1}]}');
is($r->{status}, 422, 'a runtime error in the transform is 422');
like($json->decode($r->{content})->{reason}, qr/^the source transform rejected the message: .*cannot be added/,
	'with jq\'s message');
is(inbox_count(), $before, 'nothing rejected was stored');

$node->stop;
qb_sink_stop($sink);
done_testing();
