# The HTTP ingress end to end: every answer of a source with a real client,
# each authentication scheme, limits, slow clients, 503 while the database
# cannot store, a restart that loses nothing answered 202, health, metrics
# and the admin routes.
use strict;
use warnings;

use Digest::SHA qw(hmac_sha256 hmac_sha256_hex);
use HTTP::Tiny;
use IO::Socket::INET;
use IO::Select;
use JSON::PP;
use MIME::Base64 qw(encode_base64 decode_base64);
use PostgreSQL::Test::Utils;
use QueueBoxTest;
use Test::More;
use POSIX ();
use Time::HiRes qw(usleep);

my $json = JSON::PP->new->canonical(1);
my $node = qb_node('ingress', workers => 0, conf => "queuebox.relay_worker = off\n");
my $port = qb_free_port();
my $base = "http://127.0.0.1:$port";
my $admin_token = 'admin-token-0123456789';
my $sw_secret = 'whsec_' . encode_base64('standard webhooks secret', '');

my $yaml = <<"EOY";
http: { listen: "127.0.0.1:$port", connectionTimeoutMs: 2000, storeTimeoutMs: 500, maxConnections: 50 }
admin: { token: "$admin_token" }
sources:
  plain:
    type: http
    path: /plain
    idempotencyKeyPath: \$.id
    eventTypePath: \$.type
    aggregateIdPath: \$.customer
    maxBodyBytes: 1024
  gh:
    type: http
    path: /github
    idempotencyKeyHeader: X-GitHub-Delivery
    eventTypeHeader: X-GitHub-Event
    auth: { type: github, secret: gh-secret }
  stripe:
    type: http
    path: /stripe
    idempotencyKeyPath: \$.id
    eventTypePath: \$.type
    auth: { type: stripe, secrets: [new-secret, old-secret], toleranceSec: 300 }
  sw:
    type: http
    path: /sw
    eventTypePath: \$.type
    auth: { type: standard-webhooks, secret: "$sw_secret" }
  hm:
    type: http
    path: /hmac
    idempotencyKeyPath: \$.id
    topic: "hm.{{ source }}"
    auth: { type: hmac-sha256, secret: hm-secret, header: X-Sig, prefix: "sha256=", encoding: base64 }
  orders:
    type: http
    path: /orders
    idempotencyKeyHeader: Idempotency-Key
    consumption: pull
    auth: { type: bearer, token: orders-token }
EOY
qb_configure($node, $yaml);

my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);

sub post
{
	my ($path, $body, %h) = @_;
	return $http->request('POST', "$base$path", { content => $body, headers => \%h });
}

sub reason
{
	my ($r) = @_;
	my $d = eval { $json->decode($r->{content}) } // {};
	return $d->{reason} // '';
}

# raw_request($bytes): send bytes as they are (HTTP::Tiny refuses some on
# purpose) and read the answer until the server closes or 10 s pass.
sub raw_request
{
	my ($bytes) = @_;
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
	print $s $bytes;
	my $sel = IO::Select->new($s);
	my $got = '';
	while ($sel->can_read(10))
	{
		my $n = sysread($s, my $buf, 4096);
		last unless $n;
		$got .= $buf;
		last if $got =~ /\r\n\r\n.*\}/s;
	}
	close $s;
	my ($status) = $got =~ m{^HTTP/1\.1 (\d+)};
	my (undef, $content) = split /\r\n\r\n/, $got, 2;
	return { status => $status // 0, content => $content // '' };
}

sub inbox_count { return qb_inbox_count($node, @_); }

qb_wait_for(sub { my $r = $http->get("$base/healthz"); $r->{status} == 200 },
	'the ingress listens', 30);

# ---- 202, duplicate, stored fields and headers
my $r = post('/inbox/plain', '{"id":"a1","type":"order.created","customer":"c1"}',
	'Content-Type' => 'application/json', 'X-Correlation-Id' => 'corr-1',
	'Authorization' => 'Basic c2VjcmV0', 'Cookie' => 'session=1', 'X-Custom' => 'kept');
is($r->{status}, 202, 'a new message is accepted');
my $d = $json->decode($r->{content});
is($d->{status}, 'accepted', '202 body says accepted');
is($d->{idempotencyKey}, 'a1', '202 body names the key');
my $row = $node->safe_psql('postgres',
	"SELECT id, source, idempotency_key, event_type, aggregate_id, consumption, state,"
	  . " headers ? 'X-Correlation-Id', headers ? 'X-Custom', headers ? 'Authorization',"
	  . " headers ? 'Cookie', headers ? 'Host', payload->>'customer'"
	  . " FROM queuebox.inbox WHERE idempotency_key = 'a1'");
is($row, "$d->{id}|plain|a1|order.created|c1|push|pending|t|t|f|f|f|c1",
	'the row holds the extracted fields, kept headers, no credentials or transport headers');

$r = post('/inbox/plain', '{"id":"a1","type":"order.created","customer":"c1"}');
is($r->{status}, 200, 'a repeat is answered 200');
is($json->decode($r->{content})->{status}, 'duplicate', '200 body says duplicate');
is(inbox_count("idempotency_key = 'a1'"), 1, 'the repeat stored nothing');

# ---- refusals store nothing
my $before = inbox_count();
$r = post('/inbox/plain', '{"id": "b1", "type": ');
is($r->{status}, 400, 'malformed JSON is 400');
like(reason($r), qr/not valid JSON: .* at line 1, column \d+ \(byte \d+\)/, '400 says where');
$r = post('/inbox/plain', "{\"id\": \"b2\", \"type\": \"x\xff\"}");
is($r->{status}, 400, 'bad UTF-8 in the body is 400');
like(reason($r), qr/not valid JSON/, 'bad UTF-8 reason');
$r = post('/inbox/plain', '');
is($r->{status}, 400, 'an empty body is 400');
$r = post('/inbox/plain', '{"type":"x"}');
is($r->{status}, 422, 'a missing idempotency key is 422');
like(reason($r), qr/no value at \$\.id/, '422 names the JSONPath');
$r = post('/inbox/plain', '{"id":{"nested":1},"type":"x"}');
is($r->{status}, 422, 'an object as idempotency key is 422');
$r = raw_request("POST /inbox/plain HTTP/1.1\r\nHost: x\r\nX-Bad: caf\xe9\r\n"
	  . "Content-Length: 11\r\nConnection: close\r\n\r\n{\"id\":\"b3\"}");
is($r->{status}, 400, 'a header that is not UTF-8 is 400');
like(reason($r), qr/X-Bad header is not valid UTF-8/i, '400 names the header');
# a header the outbox could never send on is refused, so no relayed row dies of it
sub with_header
{
	my ($lines) = @_;
	return raw_request("POST /inbox/plain HTTP/1.1\r\nHost: x\r\n$lines"
		  . "Content-Length: 11\r\nConnection: close\r\n\r\n{\"id\":\"b4\"}");
}
$r = with_header("Bad Header\x01: v\r\n");
is($r->{status}, 400, 'a header name that is not a token is 400');
like(reason($r), qr/the header name "Bad Header\\x01" is not an HTTP token \(byte 3 is 0x20\)/,
	'400 names the header, the byte and what names may hold');
$r = with_header("X(y): v\r\n");
is($r->{status}, 400, 'a name with a separator is 400');
$r = with_header("X-Ctl: a\x01b\r\n");
is($r->{status}, 400, 'a control character in a header value is 400');
like(reason($r), qr/the X-Ctl header has a control character in its value \(byte 1 is 0x01\)/,
	'400 names the header and the byte');
$r = with_header("X-Tab: a\tb\r\n");
is($r->{status}, 202, 'a tab in a value is allowed');
is($node->safe_psql('postgres', q{SELECT headers->>'X-Tab' FROM queuebox.inbox WHERE idempotency_key = 'b4'}), "a\tb",
	'and stored as sent');
$node->safe_psql('postgres', q{DELETE FROM queuebox.inbox WHERE idempotency_key = 'b4'});
$r = with_header("NoColonHere\r\n");
is($r->{status}, 400, 'a header line without a colon is 400');
# obsolete line folding: libmicrohttpd 0.9.75 (Debian 12) takes it without a
# word and joins the continuation to the name ("X-Fold" + "folded"), so it
# cannot be refused (docs/operations.md); what is stored can still be sent on
$r = with_header("X-Fold: a\r\n folded\r\n");
is($r->{status}, 202, 'a folded header line is taken');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.inbox i, jsonb_each_text(i.headers) h
	WHERE i.idempotency_key = 'b4' AND (h.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' OR h.value ~ '[\x01-\x08\x0a-\x1f\x7f]')}),
	'0', 'every stored header of it has a token name and a value with no control character');
$node->safe_psql('postgres', q{DELETE FROM queuebox.inbox WHERE idempotency_key = 'b4'});
$r = with_header(join('', map { "X-Pad-$_: " . ('p' x 1000) . "\r\n" } 1 .. 70));
is($r->{status}, 431, 'headers of 70 KB are 431');
$r = $http->get("$base/inbox/plain");
is($r->{status}, 405, 'GET on a source is 405');
is($r->{headers}{allow}, 'POST', '405 carries Allow: POST');
$r = post('/inbox/nope', '{}');
is($r->{status}, 404, 'an unknown path is 404');
like(reason($r), qr/no source answers/, '404 reason');
$r = post('/inbox/plain', '{"id":"big","pad":"' . ('x' x 2000) . '"}');
is($r->{status}, 413, 'a body over maxBodyBytes is 413');
is(inbox_count(), $before, 'no refusal stored a row');

# ---- 413 before the body is read: headers only, then wait for the answer
$r = raw_request("POST /inbox/plain HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	  . "Content-Length: 50000000\r\n\r\n");
is($r->{status}, 413, '413 is answered without reading a 50 MB body');

# ---- chunked body over the limit: read and dropped, then 413
my $chunk = 'y' x 600;
$r = raw_request("POST /inbox/plain HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
	  . sprintf("%x\r\n%s\r\n", length $chunk, $chunk) x 3 . "0\r\n\r\n");
is($r->{status}, 413, 'a chunked body over the limit is 413');
is(inbox_count(), $before, 'no refusal stored a row');

# ---- a chunked body that never ends: dropped up to a bound, then the
# connection is closed (the client stops at 256 MB: the ingress read on)
{
	local $SIG{PIPE} = 'IGNORE';
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
	syswrite($s, "POST /inbox/plain HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
	my $c = 'z' x 65536;
	my $frame = sprintf("%x\r\n%s\r\n", length $c, $c);
	my $written = 0;
	while ($written < 256 * 1024 * 1024)
	{
		my $w = syswrite($s, $frame);
		last unless $w;
		$written += $w;
	}
	close $s;
	note "endless chunked body: $written bytes written before the ingress closed";
	cmp_ok($written, '<', 64 * 1024 * 1024, 'an endless chunked body: the ingress closes the connection (under 64 MB written)');
	is(inbox_count(), $before, 'an endless chunked body stores no row');
	$r = $http->get("$base/healthz");
	is($r->{status}, 200, 'the ingress answers after an endless body');
}

# ---- authentication, every scheme
my $body = '{"action":"opened","number":1}';
$r = post('/inbox/github', $body, 'X-GitHub-Delivery' => 'd-1', 'X-GitHub-Event' => 'pull_request',
	'X-Hub-Signature-256' => 'sha256=' . hmac_sha256_hex($body, 'gh-secret'));
is($r->{status}, 202, 'github: a valid signature is accepted');
is($node->safe_psql('postgres',
	"SELECT event_type || '|' || (headers ? 'X-Hub-Signature-256')::text FROM queuebox.inbox WHERE source = 'gh'"),
	'pull_request|false', 'github: event type from the header; the signature header is not stored');
$r = post('/inbox/github', $body, 'X-GitHub-Delivery' => 'd-2',
	'X-Hub-Signature-256' => 'sha256=' . hmac_sha256_hex($body, 'wrong'));
is($r->{status}, 401, 'github: a wrong secret is 401');
like(reason($r), qr/X-Hub-Signature-256/, '401 names the header');
$r = post('/inbox/github', $body . ' ', 'X-GitHub-Delivery' => 'd-3',
	'X-Hub-Signature-256' => 'sha256=' . hmac_sha256_hex($body, 'gh-secret'));
is($r->{status}, 401, 'github: a tampered body is 401');
$r = post('/inbox/github', $body, 'X-GitHub-Delivery' => 'd-4');
is($r->{status}, 401, 'github: no signature is 401');
is(inbox_count("source = 'gh'"), 1, 'nothing is stored for a 401');

my $now = time;
my $sbody = '{"id":"evt_1","type":"invoice.paid"}';
my $sig = hmac_sha256_hex("$now.$sbody", 'old-secret');
$r = post('/inbox/stripe', $sbody, 'Stripe-Signature' => "t=$now,v1=$sig");
is($r->{status}, 202, 'stripe: the old secret of a rotation is still accepted');
my $stale = $now - 1000;
$sig = hmac_sha256_hex("$stale.$sbody", 'new-secret');
$r = post('/inbox/stripe', '{"id":"evt_2","type":"x"}', 'Stripe-Signature' => "t=$stale,v1=$sig");
is($r->{status}, 401, 'stripe: a stale timestamp is 401');
like(reason($r), qr/tolerance|timestamp/i, 'stale reason');

my $swbody = '{"type":"user.created"}';
my $swsig = encode_base64(hmac_sha256("msg_1.$now.$swbody", decode_base64(substr($sw_secret, 6))), '');
$r = post('/inbox/sw', $swbody, 'webhook-id' => 'msg_1', 'webhook-timestamp' => $now,
	'webhook-signature' => "v1,$swsig");
is($r->{status}, 202, 'standard-webhooks: a valid signature is accepted');
is($node->safe_psql('postgres', "SELECT idempotency_key FROM queuebox.inbox WHERE source = 'sw'"),
	'msg_1', 'standard-webhooks: the key defaults to webhook-id');

my $hbody = '{"id":"h1"}';
$r = post('/inbox/hmac', $hbody, 'X-Sig' => 'sha256=' . encode_base64(hmac_sha256($hbody, 'hm-secret'), ''));
is($r->{status}, 202, 'hmac-sha256: base64 with a prefix is accepted');
$r = post('/inbox/hmac', '{"id":"h2"}', 'X-Sig' => 'sha256=' . encode_base64(hmac_sha256($hbody, 'hm-secret'), ''));
is($r->{status}, 401, 'hmac-sha256: a signature of another body is 401');

$r = post('/inbox/orders', '{"n":1}', 'Authorization' => 'Bearer wrong', 'Idempotency-Key' => 'o1');
is($r->{status}, 401, 'bearer: a wrong token is 401');
$r = post('/inbox/orders', '{"n":1}', 'Authorization' => 'Bearer orders-token', 'Idempotency-Key' => 'o1');
is($r->{status}, 202, 'bearer: the right token is accepted');
$r = post('/inbox/orders', '{"n":1}', 'Authorization' => 'Bearer orders-token');
is($r->{status}, 422, 'a missing idempotency key header is 422');
like(reason($r), qr/Idempotency-Key header is missing/, '422 names the header');
is($node->safe_psql('postgres', "SELECT consumption FROM queuebox.inbox WHERE source = 'orders'"),
	'pull', 'the consumption of the source is stored on the row');

# ---- a slow client cannot hold the listener
{
	my $slow = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
	print $slow "POST /inbox/plain HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"id\":";
	my $ok = 0;
	for my $i (1 .. 5)
	{
		$r = post('/inbox/plain', qq({"id":"slow-$i","type":"t"}));
		$ok++ if $r->{status} == 202;
	}
	is($ok, 5, 'other clients are served while a slow client holds a connection');
	my $sel = IO::Select->new($slow);
	my $closed = 0;
	for (1 .. 100)
	{
		if ($sel->can_read(0.2))
		{
			my $n = sysread($slow, my $buf, 4096);
			if (!$n) { $closed = 1; last; }
		}
	}
	ok($closed, 'the slow client is disconnected after connectionTimeoutMs');
	close $slow;
}

# ---- 503 while the database cannot store, and nothing half-stored
{
	my $locker = $node->background_psql('postgres');
	$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN ACCESS EXCLUSIVE MODE;');
	$r = post('/inbox/plain', '{"id":"locked-1","type":"t"}');
	is($r->{status}, 503, 'the store timing out is 503');
	like(reason($r), qr/did not store the message.*retry later/, '503 says to retry');
	$r = $http->get("$base/healthz");
	is($r->{status}, 200, 'health stays 200 while the store is blocked');
	$locker->query_safe('ROLLBACK;');
	$locker->quit;
	is(inbox_count("idempotency_key = 'locked-1'"), 0, 'the 503 stored nothing');
	$r = post('/inbox/plain', '{"id":"locked-1","type":"t"}');
	is($r->{status}, 202, 'the retried message is accepted once the store is back');
}

# ---- health, readiness, metrics
$r = $http->get("$base/readyz");
is($r->{status}, 200, 'readyz is 200 with the database up');
$r = $http->get("$base/metrics");
is($r->{status}, 200, 'metrics answers');
like($r->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4}, 'Prometheus content type');
# seven of the tests above, and two of the header cases (a tab, a fold)
like($r->{content}, qr/^queuebox_inbox_received_total\{source="plain",result="accepted"\} 9$/m,
	'accepted count per source');
like($r->{content}, qr/^queuebox_inbox_received_total\{source="plain",result="duplicate"\} 1$/m,
	'duplicate count');
like($r->{content}, qr/^queuebox_inbox_received_total\{source="gh",result="unauthorized"\} 3$/m,
	'unauthorized count');
like($r->{content}, qr/^queuebox_inbox_received_total\{source="plain",result="unavailable"\} 1$/m,
	'unavailable count');
my $pending = inbox_count("state = 'pending'");
like($r->{content}, qr/^queuebox_inbox_pending $pending$/m, 'the inbox pending gauge');
like($r->{content}, qr/^queuebox_database_up 1$/m, 'database up');

# ---- admin
$r = $http->get("$base/admin/outbox/dead");
is($r->{status}, 401, 'admin without a token is 401');
$r = $http->get("$base/admin/outbox/dead", { headers => { Authorization => 'Bearer nope' } });
is($r->{status}, 401, 'admin with a wrong token is 401');
my %auth = (Authorization => "Bearer $admin_token");
my $dead_id = $node->safe_psql('postgres',
	"INSERT INTO queuebox.outbox (topic, key, payload, state, attempt, last_error)"
	  . " VALUES ('t.x', 'k', '{\"v\":1}', 'dead', 10, 'gave up') RETURNING id");
$r = $http->get("$base/admin/outbox/dead?limit=10", { headers => \%auth });
is($r->{status}, 200, 'admin lists dead outbox rows');
is($json->decode($r->{content})->[0]{id}, $dead_id, 'the dead row is listed');
# a body on a route that takes none is refused, and nothing is made
my $outbox_rows = $node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.outbox');
$r = $http->request('POST', "$base/admin/outbox/$dead_id/replay", { headers => \%auth, content => '{"payload": {"x": 1}}' });
is($r->{status}, 400, 'a replay with a body is 400');
like(reason($r), qr/takes no body; only requeue \(\{"payload": \.\.\.\}\) and pause/, 'and says only requeue takes a body');
is($node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.outbox'), $outbox_rows, 'and replays nothing');
$r = $http->request('POST', "$base/admin/outbox/$dead_id/replay", { headers => \%auth });
is($r->{status}, 200, 'admin replays an outbox row');
my $new_id = $json->decode($r->{content})->{id};
ok($new_id > $dead_id, 'the replay is a new row');
$r = $http->request('POST', "$base/admin/outbox/$dead_id/requeue", { headers => \%auth });
is($r->{status}, 200, 'admin requeues a dead outbox row');
is($node->safe_psql('postgres', "SELECT state || attempt FROM queuebox.outbox WHERE id = $dead_id"),
	'pending0', 'requeued: pending, attempts reset');
$r = $http->request('POST', "$base/admin/outbox/$dead_id/requeue", { headers => \%auth });
is($r->{status}, 404, 'requeue of a row that is not dead is 404');
# onDead: holdKey: held keys, an edited requeue, a skip (rows made by hand:
# two dead heads that hold their keys, a parked row behind each)
my ($held1, $held2) = split /\n/, $node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, state, attempt, hold, last_error)
	VALUES ('h.x', 'hk1', '{"v": 1}', 'dead', 10, 'dead', 'gave up'),
	       ('h.x', 'hk2', '{"v": 1}', 'dead', 10, 'dead', 'gave up') RETURNING id;
	INSERT INTO queuebox.outbox (topic, key, payload, hold) VALUES ('h.x', 'hk1', '{"v": 2}', 'key'),
		('h.x', 'hk2', '{"v": 2}', 'key');});
$r = $http->get("$base/admin/outbox/held?limit=10", { headers => \%auth });
is($r->{status}, 200, 'admin lists held keys');
is(join(',', map { "$_->{key}:$_->{head_id}:$_->{head_state}:$_->{behind}" } @{ $json->decode($r->{content}) }),
	"hk1:$held1:dead:1,hk2:$held2:dead:1", 'each held key with its dead head and the rows behind');
$r = $http->request('POST', "$base/admin/outbox/held", { headers => \%auth });
is($r->{status}, 405, 'held keys: use GET');
$r = $http->request('POST', "$base/admin/outbox/$held1/requeue", { headers => \%auth, content => '{"payload": {"v": 9}, "x": 1}' });
is($r->{status}, 400, 'an edited requeue with an unknown key is 400');
like(reason($r), qr/unknown key "x"/, 'the key is named');
$r = $http->request('POST', "$base/admin/outbox/$held1/requeue", { headers => \%auth, content => '{"v": 9}' });
is($r->{status}, 400, 'an edited requeue without payload is 400');
is($node->safe_psql('postgres', "SELECT state || ':' || hold || ':' || payload::text FROM queuebox.outbox WHERE id = $held1"),
	'dead:dead:{"v": 1}', 'and changes nothing');
$r = $http->request('POST', "$base/admin/outbox/$held1/requeue", { headers => \%auth, content => '{"payload": {"v": 9}}' });
is($r->{status}, 200, 'admin requeues a dead row with an edited payload');
is($json->decode($r->{content})->{requeued}, JSON::PP::true, 'requeued: true');
is($node->safe_psql('postgres',
		"SELECT action || ':' || payload_before::text || ':' || payload_after::text FROM queuebox.outbox_audit WHERE outbox_id = $held1"),
	'requeue:{"v": 1}:{"v": 9}', 'the edit is audited, before and after');
$r = $http->request('POST', "$base/admin/outbox/$held2/skip", { headers => \%auth });
is($r->{status}, 200, 'admin skips a dead row that holds its key');
is($json->decode($r->{content})->{skipped}, JSON::PP::true, 'skipped: true');
is($node->safe_psql('postgres', "SELECT state || ':' || coalesce(hold, '-') FROM queuebox.outbox WHERE id = $held2"),
	'dead:-', 'the skipped row stays dead and holds nothing');
$r = $http->request('POST', "$base/admin/outbox/$held2/skip", { headers => \%auth });
is($r->{status}, 404, 'a skip of a row that holds nothing is 404');
like(reason($r), qr/holds its key/, 'and says which rows can be skipped');
$r = $http->request('POST', "$base/admin/outbox/requeue",
	{ headers => \%auth, content => '{"topicPattern":"t.*","bogus":1}' });
is($r->{status}, 400, 'an unknown filter key is 400');
like(reason($r), qr/unknown key "bogus"/, 'the key is named');
$r = $http->request('POST', "$base/admin/inbox/requeue",
	{ headers => \%auth, content => '{"source":"plain","since":"not a time"}' });
is($r->{status}, 422, 'a malformed timestamp is 422');
$node->safe_psql('postgres', "UPDATE queuebox.inbox SET state = 'dead', last_error = 'x' WHERE idempotency_key = 'a1'");
$r = $http->request('POST', "$base/admin/inbox/requeue", { headers => \%auth, content => '{"source":"plain"}' });
is($r->{status}, 200, 'admin requeues dead inbox rows in bulk');
is($json->decode($r->{content})->{requeued}, 1, 'one row requeued');
$r = $http->request('POST', "$base/admin/inbox/999999/replay", { headers => \%auth });
is($r->{status}, 404, 'replay of an inbox row that does not exist is 404');
my $a1 = $node->safe_psql('postgres', "SELECT id FROM queuebox.inbox WHERE idempotency_key = 'a1'");
$r = $http->request('POST', "$base/admin/inbox/$a1/replay", { headers => \%auth });
is($r->{status}, 200, 'admin replays an inbox row into the outbox');
is($node->safe_psql('postgres', "SELECT topic || '|' || key || '|' || (headers->>'x-inbox-id') FROM queuebox.outbox WHERE id = "
	  . $json->decode($r->{content})->{id}), "order.created|c1|$a1", 'through the relay mapping');
$r = $http->request('POST', "$base/admin/nothing", { headers => \%auth });
is($r->{status}, 404, 'an unknown admin route is 404');
$r = $http->request('DELETE', "$base/admin/outbox/dead", { headers => \%auth });
is($r->{status}, 405, 'a wrong method on an admin route is 405');

# the console's reads: dead lists by filter, one page at a time (the next
# page's after= in X-QueueBox-Next-After), one row, an inbox lookup; bad
# parameters named (issue 25, docs/http-api.md)
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, headers, state, destination, attempt, last_error, created_at)
	SELECT 'c.' || (g % 2), 'ck' || (g % 3), jsonb_build_object('g', g), '{"x-h": "1"}', 'dead',
	       CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END, 3,
	       CASE WHEN g = 7 THEN 'HTTP 418 Teapot' ELSE 'HTTP 500' END,
	       timestamptz '2026-10-01T00:00:00Z' + g * interval '1 day'
	FROM generate_series(1, 9) g});
my $cmin = $node->safe_psql('postgres', "SELECT min(id) FROM queuebox.outbox WHERE topic LIKE 'c.%'");
my $dead_before = $node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE state = 'dead'");
my $page = sub {
	my ($q) = @_;
	my $r = $http->get("$base/admin/outbox/dead?$q", { headers => \%auth });
	return "$r->{status} " . ($r->{status} == 200
		? join(',', map { $_->{id} - $cmin + 1 } grep { $_->{topic} =~ /^c\./ } @{ $json->decode($r->{content}) })
		  . ' next ' . (defined $r->{headers}{'x-queuebox-next-after'} ? $r->{headers}{'x-queuebox-next-after'} - $cmin + 1 : '-')
		: reason($r));
};
my $a0 = $cmin - 1;
is($page->("after=$a0&limit=4"), '200 1,2,3,4 next 4', 'dead list: a page of 4 from after=, the next page in the header');
is($page->('after=' . ($cmin + 3) . '&limit=4'), '200 5,6,7,8 next 8', 'dead list: the next page');
is($page->('after=' . ($cmin + 7) . '&limit=4'), '200 9 next -', 'dead list: the last page has no next');
is($page->("after=$a0&topic=c.0&limit=10"), '200 2,4,6,8 next -', 'dead list: by topic');
is($page->("after=$a0&destination=odd"), '200 1,3,5,7,9 next -', 'dead list: by destination');
is($page->("after=$a0&key=ck1"), '200 1,4,7 next -', 'dead list: by key');
is($page->("after=$a0&error=teapot"), '200 7 next -', 'dead list: by a case-insensitive part of the error');
is($page->("after=$a0&since=2026-10-03&until=2026-10-05T00:00:00%2B00:00"), '200 2,3 next -',
	'dead list: since (a date) and until (a time with its zone) on created_at');
is($page->("after=$a0&topic=&destination=odd&key=ck0"), '200 3,9 next -', 'dead list: an empty parameter is no filter; filters combine');
my $dead_row = $json->decode($http->get("$base/admin/outbox/dead?after=$a0&limit=1", { headers => \%auth })->{content})->[0];
is(join(',', sort keys %$dead_row), 'attempt,created_at,destination,holds_key,id,key,last_error,max_attempts,message_id,topic',
	'dead list: each row has the contract\'s fields');
is($page->('limit=0'), '400 limit must be a whole number from 1 to 1000', 'dead list: limit 0 is 400, saying what it takes');
is($page->('limit=1001'), '400 limit must be a whole number from 1 to 1000', 'dead list: limit 1001 is 400');
like($page->('after=x'), qr/^400 after must be an id/, 'dead list: a bad after is 400');
like($page->('since=yesterday'), qr/^400 since must be an ISO 8601 time/, 'dead list: a bad since is 400');
like($page->('until=2026-13-01'), qr/^400 until must be an ISO 8601 time/, 'dead list: a bad until is 400');
is($page->('source=x'), '400 unknown query parameter "source"; this route takes: destination, topic, key, error, since, until, after, limit',
	'dead list: an unknown parameter is 400, naming it and listing the accepted ones');
is($page->('topic=a&topic=b'), '400 query parameter "topic" is given twice', 'dead list: a parameter twice is 400');
is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE state = 'dead'"), $dead_before,
	'dead list: reads change nothing');
$r = $http->get("$base/admin/inbox/dead?source=plain&event_type=x&idempotency_key=k&aggregate_id=a&error=e&since=2026-01-01&until=2030-01-01&after=0&limit=5",
	{ headers => \%auth });
is("$r->{status} $r->{content}", '200 []', 'inbox dead list: every filter is taken');
$r = $http->get("$base/admin/inbox/dead?topic=x", { headers => \%auth });
like(reason($r), qr/unknown query parameter "topic"; this route takes: source, event_type, idempotency_key, aggregate_id/,
	'inbox dead list: its own accepted parameters');
# one row: the whole row, payload, headers and audit
my $c2 = $cmin + 1;
$r = $http->request('POST', "$base/admin/outbox/$c2/requeue", { headers => \%auth, content => '{"payload": {"g": 20}}' });
is($r->{status}, 200, 'one row: an edited requeue first (for the audit)');
$r = $http->get("$base/admin/outbox/$c2", { headers => \%auth });
is($r->{status}, 200, 'GET /admin/outbox/{id} is 200');
my $o = $json->decode($r->{content});
is(join(',', sort keys %$o), 'attempt,audit,created_at,deliveries,destination,headers,hold,id,key,last_error,max_attempts,message_id,payload,scheduled_at,state,topic',
	'one row: every field');
is($json->encode([ $o->{id}, $o->{state}, $o->{payload}, $o->{headers} ]), $json->encode([ 0 + $c2, 'pending', { g => 20 }, { 'x-h' => '1' } ]),
	'one row: its state, payload and headers as JSON');
is(scalar @{ $o->{audit} }, 1, 'one row: one audit row');
is($json->encode([ @{ $o->{audit}[0] }{qw(action done_by payload_before payload_after)} ]),
	$json->encode([ 'requeue', 'admin route from 127.0.0.1', { g => 2 }, { g => 20 } ]),
	'one row: the audit says what, who (the route and the peer, not the database role), before and after');
$r = $http->get("$base/admin/outbox/99999999", { headers => \%auth });
is("$r->{status} " . reason($r), '404 no outbox row with id 99999999', 'one row: none is 404');
$r = $http->get("$base/admin/outbox/$c2?x=1", { headers => \%auth });
is($r->{status}, 400, 'one row: a query parameter is 400');
$r = $http->request('POST', "$base/admin/outbox/$c2", { headers => \%auth });
is($r->{status}, 405, 'one row: use GET');
$r = $http->get("$base/admin/inbox/$a1", { headers => \%auth });
is($r->{status}, 200, 'GET /admin/inbox/{id} is 200');
$o = $json->decode($r->{content});
is(join(',', sort keys %$o), 'aggregate_id,attempt,consumption,created_at,event_type,headers,hold,id,idempotency_key,last_error,payload,scheduled_at,source,state',
	'inbox row: every field');
is("$o->{source}/$o->{idempotency_key}", 'plain/a1', 'inbox row: the row asked for');
$r = $http->get("$base/admin/inbox/lookup?source=plain&idempotency_key=a1", { headers => \%auth });
is($r->{status}, 200, 'inbox lookup: 200');
is($json->decode($r->{content})->{id}, $a1, 'inbox lookup: the row of that source and key');
$r = $http->get("$base/admin/inbox/lookup?source=plain&idempotency_key=nope", { headers => \%auth });
is("$r->{status} " . reason($r), '404 no row from source plain with idempotency key nope: it did not arrive, or retention has deleted it',
	'inbox lookup: none is 404 saying why it may be missing');
$r = $http->get("$base/admin/inbox/lookup?source=plain", { headers => \%auth });
is("$r->{status} " . reason($r), '400 idempotency_key is required (this route takes source and idempotency_key)',
	'inbox lookup: a missing parameter is 400, named');
# the overview's workers: the ingress answering this very request
$r = $http->get("$base/admin/overview", { headers => \%auth });
my ($ingress) = grep { $_->{name} eq 'ingress' } @{ $json->decode($r->{content})->{workers} // [] };
is(($ingress->{state} // '') . '/' . (($ingress->{pid} // 0) > 0 ? 'pid' : 'no pid'), 'serving/pid',
	'overview: the ingress worker is listed, serving, with its pid');
cmp_ok($ingress->{cycles} // 0, '>', 0, 'overview: with the passes it served');
# writes: a query parameter is refused; each write is logged with who asked
$r = $http->request('POST', "$base/admin/outbox/$c2/replay?x=1", { headers => \%auth });
is($r->{status}, 400, 'a POST with a query parameter is 400');
like(slurp_file($node->logfile), qr/admin: requeue outbox $c2: 200 \{"requeued" : true\} \(admin route from 127\.0\.0\.1\)/,
	'the edited requeue is logged: action, target, result, who; not the payload');
is(scalar(grep { /ingress: admin: / && /\Q$admin_token\E|"g" ?: ?20/ } split /\n/, slurp_file($node->logfile)), 0,
	'no admin log line shows the token or the payload');

# ---- a restart loses nothing that was answered 202
{
	my $total = 400;
	my $log = $node->basedir . '/restart_answers.txt';
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		my $c = HTTP::Tiny->new(timeout => 5, keep_alive => 0);
		open my $fh, '>', $log or die;
		$fh->autoflush(1);
		for my $i (1 .. $total)
		{
			my $a = $c->request('POST', "$base/inbox/plain",
				{ content => qq({"id":"r-$i","type":"t","customer":"c$i"}) });
			print $fh "r-$i $a->{status}\n";
			usleep(5_000);
		}
		close $fh;
		# _exit: a plain exit would run the test library's END blocks here,
		# which stop the node
		POSIX::_exit(0);
	}
	qb_wait_for(sub { -s $log && (() = slurp_file($log) =~ /\n/g) >= 50 },
		'the client has sent 50 messages', 60);
	$node->restart;
	waitpid($pid, 0);
	my %ans = map { split / / } split /\n/, slurp_file($log);
	my @accepted = grep { $ans{$_} == 202 } keys %ans;
	my @other = grep { $ans{$_} != 202 } keys %ans;
	ok(@accepted >= 50, scalar(@accepted) . ' messages were accepted around the restart');
	my $bad = join ',', grep { $ans{$_} !~ /^(503|599)$/ } @other;
	is($bad, '', 'every other answer is 503 or no connection');
	my $stored = $node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.inbox WHERE idempotency_key = ANY ('{"
		  . join(',', @accepted) . "}')");
	is($stored, scalar(@accepted), 'every message answered 202 is stored after the restart');
	qb_wait_for(sub { my $h = $http->get("$base/healthz"); $h->{status} == 200 },
		'the ingress listens again', 60);
	my $retried = 0;
	for my $k (@other)
	{
		(my $i = $k) =~ s/^r-//;
		my $a = post('/inbox/plain', qq({"id":"$k","type":"t","customer":"c$i"}));
		$retried++ if $a->{status} == 202 || $a->{status} == 200;
	}
	is($retried, scalar(@other), 'the messages not answered 202 are accepted when sent again');
	is(inbox_count("idempotency_key LIKE 'r-%'"), $total, 'all messages stored exactly once');
}

# ---- no listener without http.listen; admin off without a token
qb_configure($node, "sources:\n  plain: { type: http, path: /plain, idempotencyKeyPath: \$.id, topic: p }\n");
qb_wait_for(sub { !IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) },
	'the listener closes when http.listen is removed', 30);
qb_configure($node, "http: { listen: $port }\n");
qb_wait_for(sub { my $h = $http->get("$base/healthz"); $h->{status} == 200 },
	'a port alone listens on loopback', 30);
$r = $http->get("$base/admin/outbox/dead", { headers => \%auth });
is($r->{status}, 404, 'without admin.token the admin routes are off');
like(reason($r), qr/set admin.token/, 'and the answer says how to turn them on');

$node->stop;
done_testing();
