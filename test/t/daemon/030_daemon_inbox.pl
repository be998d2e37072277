# 030_daemon_inbox.pl
#   The inbox side under queuebox-mssqld: webhooks at the ingress (202 after
#   the commit, 200 for a duplicate, 401 for a bad signature), the relay's
#   forward into the outbox and on to the sink, /healthz /readyz /metrics,
#   the admin routes (closed without the token), the console (its pages in
#   headless Chromium: the overview, a dead row, a lookup), the five pull statements
#   on the daemon's schema, a NATS source in a consumer role, and the
#   daemon's SQL topic_matches() against the extension's C one.
use strict;
use warnings;

use Digest::SHA qw(hmac_sha256_hex);
use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;
use QueueBoxNats;

my $json = JSON::PP->new->canonical(1);
my $node = qbd_node('daemon_inbox');
my $sink = qb_sink_start(name => 'dinbox');
my $nats = nats_start(name => 'dsrc');
nats_add_stream($nats, 'EV', 'ev.>');
my $port = qb_free_port();
my $base = "http://127.0.0.1:$port";
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);
my $secret = 'whsec-0123456789abcdef';
my $token = 'admin-token-0123456789abcdef';

my $yaml = qb_config_yaml(
	destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/hooks' },
		bus => { type => 'nats', url => $nats->{url}, subject => 'bus.{{ topic }}', createStream => 'true' } },
	routes => [ { topicPattern => 'shop.**', destination => 'web' }, { topicPattern => 'ev.**', destination => 'web' },
		{ topicPattern => 'tasks.**', destination => 'web' }, { topicPattern => 'out.**', destination => 'bus' } ],
	database => { url => qbd_url($node) },
	daemon => { outboxWorkers => 1 })
  . <<"EOY";
http: { listen: "127.0.0.1:$port" }
admin: { token: "$token" }
sources:
  shop:
    type: http
    path: /shop
    idempotencyKeyPath: \$.id
    eventTypePath: \$.type
    aggregateIdPath: \$.order
    topic: "shop.{{ eventType }}"
    auth: { type: hmac-sha256, header: X-Signature, secret: "$secret" }
  tasks:
    type: http
    path: /tasks
    idempotencyKeyHeader: X-Task-Id
    consumption: pull
    topic: "tasks.{{ source }}"
  ev:
    type: nats
    url: "$nats->{url}"
    subject: "ev.>"
    stream: EV
    eventTypePath: \$.type
    topic: "ev.{{ eventType }}"
inbox:
  relay: { pollIntervalMs: 50 }
EOY
my $d = qbd_start($node, $yaml, name => 'inbox');
qb_wait_for(sub { $http->get("$base/healthz")->{status} == 200 }, 'the ingress role listens', timeout => 30);
qb_wait_for(sub { $http->get("$base/readyz")->{status} == 200 }, '/readyz: the database is reachable', timeout => 30);

# ---- /metrics before the first event: every configured name at 0
is(qb_inbox_count($node) . '/' . qb_outbox_count($node), '0/0', 'no inbox or outbox row yet');
my $m0 = $http->get("$base/metrics")->{content};
like($m0, qr/^queuebox_outbox_delivered_total\{destination="web"\} 0$/m,
	'/metrics before any row: the destination web at 0');
like($m0, qr/^queuebox_outbox_dead_total\{destination="web"\} 0$/m, '/metrics before any row: web dead at 0');
like($m0, qr/^queuebox_outbox_delivered_total\{destination="bus"\} 0$/m, '/metrics before any row: the destination bus at 0');
for my $src (qw(shop tasks ev))
{
	like($m0, qr/^queuebox_inbox_received_total\{source="$src",result="accepted"\} 0$/m,
		"/metrics before any message: the source $src at 0");
}

sub post_shop
{
	my ($body, %h) = @_;
	return $http->request('POST', "$base/inbox/shop", {
		content => $body,
		headers => { 'Content-Type' => 'application/json',
			'X-Signature' => $h{sig} // hmac_sha256_hex($body, $secret), %{ $h{headers} // {} } } });
}

# ---- webhooks: accepted after commit, duplicates, a bad signature
my %inbox_id;
for my $seq (1 .. 4)
{
	for my $order (1 .. 2)
	{
		my $body = $json->encode({ id => "e-$order-$seq", type => 'order.step', order => "o$order", seq => $seq });
		my $r = post_shop($body);
		is($r->{status}, 202, "webhook e-$order-$seq: 202") if $seq == 1;
		$inbox_id{"e-$order-$seq"} = eval { $json->decode($r->{content})->{id} };
	}
}
my $dup = post_shop($json->encode({ id => 'e-1-1', type => 'order.step', order => 'o1', seq => 1 }));
is($dup->{status}, 200, 'a repeated idempotency key: 200');
like($dup->{content}, qr/"status":\s*"duplicate"/, 'a repeated idempotency key: duplicate');
my $bad = post_shop('{"id": "forged", "type": "x"}', sig => 'deadbeef');
is($bad->{status}, 401, 'a bad signature: 401');
is(qb_inbox_count($node, q{idempotency_key = 'forged'}), '0', 'a bad signature stores nothing');
is(qb_inbox_count($node, q{source = 'shop'}), '8', 'eight webhooks stored once each');

qb_wait_for(sub { scalar(@{ qb_sink_requests($sink) }) >= 8 }, 'the relay and the outbox deliver the eight webhooks', timeout => 60);
my $reqs = qb_sink_requests($sink);
is(scalar(grep { $_->{path} eq '/hooks' } @$reqs), 8, 'each webhook is delivered once');
my %seq_of;
my $order_ok = 1;
for my $r (@$reqs)
{
	my $p = $json->decode($r->{body});
	$order_ok = 0 if ($seq_of{ $p->{order} } // 0) > $p->{seq};
	$seq_of{ $p->{order} } = $p->{seq};
}
ok($order_ok, "each order's webhooks arrive in the order received");
is($reqs->[0]{headers}{'x-source'}, 'shop', 'the relay sets x-source');
ok($reqs->[0]{headers}{'x-inbox-id'}, 'the relay sets x-inbox-id');
qb_wait_query($node, q{SELECT count(*) FROM queuebox.inbox WHERE source = 'shop' AND state = 'processed'}, '8',
	'the relay marks the push rows processed');

# ---- pull: the five statements on the daemon's schema
for my $i (1 .. 3)
{
	my $r = $http->request('POST', "$base/inbox/tasks",
		{ content => qq({"n": $i}), headers => { 'Content-Type' => 'application/json', 'X-Task-Id' => "t$i" } });
	is($r->{status}, 202, "pull webhook t$i: 202");
}
my $claimed = $node->safe_psql('postgres', q{SELECT string_agg(id || ':' || claim_token, ',' ORDER BY id) FROM queuebox.inbox_claim('tasks', 2, 30000)});
my @c = map { [ split /:/ ] } split /,/, $claimed;
is(scalar(@c), 2, 'inbox_claim gives two of the three pull rows');
is($node->safe_psql('postgres', "SELECT queuebox.inbox_renew($c[0][0], '$c[0][1]', 60000)"), 't', 'inbox_renew: true');
is($node->safe_psql('postgres', "SELECT queuebox.inbox_complete($c[0][0], '$c[0][1]')"), 't', 'inbox_complete: true');
is($node->safe_psql('postgres', "SELECT queuebox.inbox_complete($c[0][0], '$c[0][1]')"), 'f', 'inbox_complete again: false');
is($node->safe_psql('postgres', "SELECT queuebox.inbox_retry($c[1][0], '$c[1][1]', 0, 'later')"), 't', 'inbox_retry: true');
$claimed = $node->safe_psql('postgres', q{SELECT string_agg(id || ':' || claim_token, ',' ORDER BY id) FROM queuebox.inbox_claim('tasks', 5, 30000)});
@c = map { [ split /:/ ] } split /,/, $claimed;
is(scalar(@c), 2, 'inbox_claim again: the retried row and the third');
is($node->safe_psql('postgres', "SELECT queuebox.inbox_dead($c[0][0], '$c[0][1]', 'poison')"), 't', 'inbox_dead: true');
is(qb_inbox_count($node, q{source = 'tasks' AND state = 'processed'}), '1', 'pull: one processed');
is(qb_inbox_count($node, q{source = 'tasks' AND state = 'dead'}), '1', 'pull: one dead');

# ---- a broker source in a consumer role
nats_publish($nats, 'ev.a', '{"type":"made","n":{i}}', n => 5, headers => { 'Nats-Msg-Id' => 'm{i}' });
qb_wait_query($node, q{SELECT count(*) FROM queuebox.inbox WHERE source = 'ev'}, '5',
	'the NATS consumer role stores the five stream messages', timeout => 60);
qb_wait_for(sub { scalar(grep { $_->{body} =~ /"made"/ } @{ qb_sink_requests($sink) }) == 5 },
	'the NATS messages are relayed and delivered', timeout => 60);
ok(qbd_role_pids($d)->{'consumer 0'}, 'the NATS source runs in role "consumer 0"');

# ---- /metrics and the admin routes
my $m = $http->get("$base/metrics");
is($m->{status}, 200, '/metrics: 200');
like($m->{content}, qr/queuebox_inbox_received_total\{source="shop",result="accepted"\} 8/,
	'/metrics counts what the ingress role received');
like($m->{content}, qr/queuebox_outbox_delivered_total\{destination="web"[^}]*\} (\d+)/,
	'/metrics counts what the outbox role delivered (one shared block for every role)');
is($http->get("$base/admin/inbox/dead")->{status}, 401, 'admin without the token: 401');
my $a = $http->request('GET', "$base/admin/inbox/dead", { headers => { Authorization => "Bearer $token" } });
is($a->{status}, 200, 'admin with the token: 200');
like($a->{content}, qr/poison/, 'admin lists the dead pull row');
my $dead_id = $node->safe_psql('postgres', q{SELECT id FROM queuebox.inbox WHERE state = 'dead'});
$a = $http->request('POST', "$base/admin/inbox/$dead_id/replay", { headers => { Authorization => "Bearer $token" } });
is($a->{status}, 200, 'admin replays an inbox row into the outbox (the topic rendered by the daemon)') or diag $a->{content};
qb_wait_query($node, q{SELECT state FROM queuebox.outbox WHERE topic = 'tasks.tasks'}, 'sent',
	'the replayed row is delivered');

# ---- the web console on the ingress role (docs/console.md; TAP 052 has the rest)
my $page = $http->get("$base/console");
is($page->{status}, 200, 'the ingress role serves /console');
like($page->{headers}{'content-security-policy'} // '', qr/^default-src 'none'; script-src 'self';/,
	'with the strict Content-Security-Policy');
is($http->get("$base/admin/overview")->{status}, 401, '/admin/overview without the token: 401');
my $ov = $http->get("$base/admin/overview", { headers => { Authorization => "Bearer $token" } });
is($ov->{status}, 200, '/admin/overview through the libpq store: 200') or diag $ov->{content};
$ov = decode_json($ov->{content});
is(join(',', map { $_->{destination} } @{ $ov->{destinations} }), 'bus,web', 'it lists the destinations');
is((grep { $_->{name} eq 'shop' } @{ $ov->{sources} })[0]{received}, 8,
	'and what the ingress role received (the shared block)');
# the workers: every role in the shared block, what it does and since when
my %w = map { $_->{name} => $_ } @{ $ov->{workers} // [] };
ok(exists $w{$_}, "workers: the $_ role is listed") for ('outbox 0', 'relay', 'ingress');
is($w{ingress}{state}, 'serving', 'workers: the ingress is serving (this request)');
ok(kill(0, $w{$_}{pid}), "workers: $_ has the pid of a live process ($w{$_}{pid})") for ('outbox 0', 'relay', 'ingress');
like($w{'outbox 0'}{state}, qr/^(idle|claiming|delivering)$/, "workers: the outbox role is $w{'outbox 0'}{state}");
like($w{'outbox 0'}{since}, qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'workers: since is an ISO 8601 time');
cmp_ok($w{'outbox 0'}{cycles}, '>', 0, 'workers: the outbox role has cycled');
# the console's reads through the libpq store: a filtered page, one row
my $dp = $http->get("$base/admin/inbox/dead?source=tasks&error=poison&limit=5", { headers => { Authorization => "Bearer $token" } });
my $drows = decode_json($dp->{content});
is(scalar(@$drows) . '/' . ($drows->[0]{last_error} // ''), '1/poison', 'the daemon filters dead inbox rows') or diag $dp->{content};
my $one = $http->get("$base/admin/inbox/$drows->[0]{id}", { headers => { Authorization => "Bearer $token" } });
is(decode_json($one->{content})->{state}, 'dead', 'and shows one inbox row') or diag $one->{content};
SKIP:
{
	skip 'chromium is not installed (scripts/setup.sh installs it)', 4 unless -x '/usr/bin/chromium';
	my $home = "$PostgreSQL::Test::Utils::tmp_check/browser-home-030";
	mkdir $home;
	qb_node_tests(qb_npm_dir('test/browser') . '/console-daemon.test.js', "the daemon's console in headless Chromium", 3,
		QB_CONSOLE_URL => $base,
		QB_ADMIN_TOKEN => $token,
		QB_DEAD_ID => $dead_id,
		QB_WEBHOOK_KEY => 't3',
		HOME => $home);
}

# ---- a NATS destination with createStream under the daemon: the stream is made
is(nats_count($nats, 'queuebox-bus'), undef, 'createStream (daemon): no stream queuebox-bus yet');
my $n0 = qb_outbox_count($node);
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('out.made', '{"bus": 1}')});
is(qb_outbox_count($node), $n0 + 1, 'createStream (daemon): one row inserted');
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'out.made'", 'sent',
	'createStream (daemon): the row is sent', timeout => 60);
is(nats_count($nats, 'queuebox-bus'), 1, 'createStream (daemon): stream queuebox-bus was made and holds the row');
is_deeply(nats_stream($nats, 'queuebox-bus')->{subjects}, ['bus.>'], 'createStream (daemon): it captures bus.>');

# ---- the SQL topic_matches() of the daemon equals the extension's C one
my $ext = qb_node('daemon_inbox_ext');
my @seg = ('a', 'b', '*', '**', 'a.b', 'x-y', 'é', 'a+b', 'A');
my @cases;
srand(7);
for (1 .. 400)
{
	my $p = join('.', map { $seg[ int(rand(@seg)) ] } 1 .. 1 + int(rand(4)));
	my $t = join('.', map { ('a', 'b', 'x-y', 'é', 'c', '')[ int(rand(6)) ] } 1 .. 1 + int(rand(5)));
	next if $p eq '';
	push @cases, [ $p, $t ];
}
my $i = 0;
my $values = join(',', map { '(' . (++$i) . ',' . qb_sql_quote($_->[0]) . ',' . qb_sql_quote($_->[1]) . ')' } @cases);
my $q = "SELECT string_agg(queuebox.topic_matches(p, t)::text, ',' ORDER BY n) FROM (VALUES $values) v(n, p, t)";
is($node->safe_psql('postgres', $q), $ext->safe_psql('postgres', $q),
	scalar(@cases) . ' random patterns and topics: the daemon\'s SQL topic_matches() answers as the C one');
for my $bad ('', 'a..b', '.a', 'a.', 'or*ders', 'a b')
{
	my (undef, undef, $e1) = $node->psql('postgres', 'SELECT queuebox.topic_matches(' . qb_sql_quote($bad) . q{, 'a')});
	my (undef, undef, $e2) = $ext->psql('postgres', 'SELECT queuebox.topic_matches(' . qb_sql_quote($bad) . q{, 'a')});
	s/^.*?ERROR:\s+//s, s/\n.*//s for $e1, $e2;
	ok($e1 ne '' && $e1 eq $e2, "an invalid pattern \"$bad\" is refused with the extension's message ($e1)");
}

qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');
nats_stop($nats);
done_testing();
