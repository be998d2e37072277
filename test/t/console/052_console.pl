# 052_console.pl
#   The web console (docs/console.md) on the extension's ingress: off
#   without admin.token; its pages with a strict Content-Security-Policy;
#   login turns the token into an HttpOnly, SameSite=Strict cookie that the
#   admin routes accept, writes with it need X-QueueBox-CSRF; GET
#   /admin/overview; the login's rate limit.  Then in headless Chromium
#   (Debian's chromium driven by playwright-core, test/browser), the issue's
#   scenario: refused without the token, a down destination's open circuit
#   after login, a destination paused, reset and resumed, a dead letter found
#   with the filters (and pages of them), its payload edited and requeued and
#   the HTTP sink receiving it first, then its key's held rows in order; a
#   held key's head skipped from the keys page; markup in an error, a
#   payload and a header shown as text, no script run; the inbox tab and an
#   inbox lookup.
#   QB_CONSOLE_SCREENSHOTS=<folder> saves the pages' screenshots there
#   (docs/img/ holds the committed ones).
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Utils;
use QueueBoxTest;
use Test::More;

my $sink = qb_sink_start(name => 'console');
my $node = qb_node('console');
my $port = qb_free_port();
my $down_port = qb_free_port();    # nothing listens: the destination is down
my $base = "http://127.0.0.1:$port";
my $token = 'console-token-0123456789';
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);
my $csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
  . "img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

sub config
{
	my (%o) = @_;
	return qb_config_yaml(
		http => { listen => "127.0.0.1:$port" },
		%o,
		destinations => {
			down => { type => 'http', baseUrl => "http://127.0.0.1:$down_port", path => '/events',
				circuitBreaker => { failures => 1, cooldownMs => 3600000 } },
			shop => { type => 'http', baseUrl => $sink->{url}, path => '/shop', onDead => 'holdKey' },
		},
		routes => [ { topicPattern => 'orders.**', destination => 'down' },
			{ topicPattern => 'shop.**', destination => 'shop' } ],
		sources => { stripe => { type => 'http', path => '/stripe', idempotencyKeyPath => '$.id',
			eventTypePath => '$.type', consumption => 'pull' } });
}

# ---- off without admin.token: /console is any unknown path
qb_configure($node, config());
qb_wait_for(sub { $http->get("$base/healthz")->{status} == 200 }, 'the listener is up', timeout => 30);
my $r = $http->get("$base/console");
is($r->{status}, 404, 'without admin.token /console is 404');
unlike($r->{content}, qr/<html/i, 'and serves no page');
is(decode_json($r->{content})->{reason}, 'the console is off; set admin.token to turn it on (docs/console.md)',
	'and says what turns it on');

qb_configure($node, config(admin => { token => $token }));
qb_wait_for(sub { $http->get("$base/console")->{status} == 200 }, 'with admin.token /console is served',
	timeout => 30);

# ---- the pages and their headers
for my $p ([ '/console', 'text/html' ], [ '/console/app.js', 'text/javascript' ], [ '/console/app.css', 'text/css' ])
{
	$r = $http->get("$base$p->[0]");
	is($r->{status}, 200, "$p->[0] is 200");
	like($r->{headers}{'content-type'}, qr/^\Q$p->[1]\E/, "$p->[0] is $p->[1]");
	is($r->{headers}{'content-security-policy'}, $csp, "$p->[0] has the strict CSP");
	is($r->{headers}{'x-content-type-options'}, 'nosniff', "$p->[0] has nosniff");
	is($r->{headers}{'cache-control'}, 'no-store', "$p->[0] is not cached");
}
$r = $http->get("$base/console");
unlike($r->{content}, qr/<script>|\son\w+=|style=/i, 'the page has no inline script, handler or style');
unlike($http->get("$base/console/app.js")->{content}, qr/innerHTML|outerHTML|insertAdjacentHTML|document\.write/,
	'app.js never writes HTML');
is($http->get("$base/console/nope.js")->{status}, 404, 'an unknown console file is 404');
is($http->request('POST', "$base/console")->{status}, 405, 'a POST to the page is 405');

# ---- the overview without and with the token
$r = $http->get("$base/admin/overview");
is($r->{status}, 401, 'GET /admin/overview without the token is 401');
$r = $http->get("$base/admin/overview", { headers => { Authorization => "Bearer $token" } });
is($r->{status}, 200, 'GET /admin/overview with the bearer token is 200');
my $o = decode_json($r->{content});
is_deeply([ map { $_->{destination} } @{ $o->{destinations} } ], ['down', 'shop'], 'it lists the destinations');
is_deeply([ map { $_->{name} } @{ $o->{sources} } ], ['stripe'], 'and the source');
is($o->{outbox}{pending}, 0, 'and the outbox counts');

# ---- login, the cookie, CSRF, logout
my %csrf = ('X-QueueBox-CSRF' => '1', 'Content-Type' => 'application/json');
$r = $http->request('GET', "$base/console/login?token=$token");
is($r->{status}, 405, 'login is never a GET (the token stays out of URLs)');
ok(!$r->{headers}{'set-cookie'}, 'and sets no cookie');
$r = $http->request('POST', "$base/console/login",
	{ headers => { 'Content-Type' => 'application/json' }, content => qq({"token":"$token"}) });
is($r->{status}, 403, 'login without X-QueueBox-CSRF is 403');
ok(!$r->{headers}{'set-cookie'}, 'and sets no cookie');
is(decode_json($r->{content})->{reason},
	"a console login must carry the X-QueueBox-CSRF header (any value), which no cross-site form can send; the console's page sends it",
	'and names the login, not a cookie it does not have');
$r = $http->request('POST', "$base/console/login", { headers => \%csrf, content => '{"token":"wrong-token-0123456789"}' });
is($r->{status}, 401, 'login with a wrong token is 401');
ok(!$r->{headers}{'set-cookie'}, 'and sets no cookie');
$r = $http->request('POST', "$base/console/login", { headers => \%csrf, content => 'token=' . $token });
is($r->{status}, 400, 'a login body that is not {"token": ...} is 400');
$r = $http->request('POST', "$base/console/login", { headers => \%csrf, content => qq({"token":"$token"}) });
is($r->{status}, 200, 'login with the token is 200');
my $set = $r->{headers}{'set-cookie'} // '';
like($set, qr/^queuebox_admin=[0-9a-f]+; Path=\/; HttpOnly; SameSite=Strict$/, 'it sets an HttpOnly, SameSite=Strict cookie');
unlike($set, qr/\Q$token\E/, 'the cookie is not the token in clear text');
my ($cookie) = $set =~ /^([^;]+)/;
$r = $http->request('POST', "$base/console/login",
	{ headers => { %csrf, 'X-Forwarded-Proto' => 'https' }, content => qq({"token":"$token"}) });
like($r->{headers}{'set-cookie'}, qr/; Secure$/, 'behind a TLS proxy (X-Forwarded-Proto: https) it is Secure');

$r = $http->get("$base/admin/overview", { headers => { Cookie => "other=1; $cookie" } });
is($r->{status}, 200, 'the admin routes accept the cookie');
$r = $http->get("$base/admin/overview", { headers => { Cookie => 'queuebox_admin=' . unpack('H*', 'wrong-token-0123456789') } });
is($r->{status}, 401, 'a cookie of another token is 401');
$r = $http->request('POST', "$base/admin/destinations/nosuch/resume", { headers => { Cookie => $cookie } });
is($r->{status}, 403, 'a write with the cookie and without X-QueueBox-CSRF is 403');
like(decode_json($r->{content})->{reason}, qr/^a write with the console's cookie must carry the X-QueueBox-CSRF header/, 'and says which header is missing');
$r = $http->request('POST', "$base/admin/destinations/nosuch/resume", { headers => { Cookie => $cookie, %csrf } });
is($r->{status}, 404, 'with X-QueueBox-CSRF it reaches the route');
$r = $http->request('POST', "$base/admin/destinations/nosuch/resume", { headers => { Authorization => "Bearer $token" } });
is($r->{status}, 404, 'the bearer header needs no CSRF header');

$r = $http->request('POST', "$base/console/logout", { headers => { Cookie => $cookie } });
is($r->{status}, 403, 'logout without X-QueueBox-CSRF is 403');
$r = $http->request('POST', "$base/console/logout", { headers => { Cookie => $cookie, %csrf } });
is($r->{status}, 200, 'logout is 200');
like($r->{headers}{'set-cookie'}, qr/^queuebox_admin=; Path=\/; HttpOnly; SameSite=Strict; Max-Age=0$/,
	'and clears the cookie');

# ---- wrong tokens from one address are slowed (docs/console.md#the-rate-limit)
{
	my %from = map { $_ => HTTP::Tiny->new(timeout => 10, keep_alive => 0, local_address => "127.0.0.$_") } 3, 4;
	my $login = sub {
		my ($who, $t) = @_;
		return $from{$who}->request('POST', "$base/console/login", { headers => \%csrf, content => qq({"token":"$t"}) });
	};
	is($login->(3, 'wrong-token-000000000' . $_)->{status}, 401, "wrong token $_ of 5 from one address: 401")
	  for 1 .. 5;
	$r = $login->(3, 'wrong-token-0000000006');
	is($r->{status}, 429, 'the sixth within the minute: 429');
	like($r->{headers}{'retry-after'} // '', qr/^([1-9]|[1-5][0-9]|60)$/, 'with Retry-After: the seconds left of the minute');
	like(decode_json($r->{content})->{reason}, qr/too many wrong admin tokens/, 'and says why');
	$r = $login->(3, $token);
	is($r->{status}, 429, 'the right token from that address is not even checked while it waits');
	ok(!$r->{headers}{'set-cookie'}, 'and sets no cookie');
	$r = $from{3}->get("$base/admin/overview", { headers => { Authorization => "Bearer $token" } });
	is($r->{status}, 429, 'a bearer token on /admin from that address waits too');
	is($from{3}->get("$base/admin/overview")->{status}, 401, 'a request with no token is no guess: 401, not 429');
	is($http->get("$base/admin/overview", { headers => { Authorization => "Bearer $token" } })->{status}, 200,
		'another address with the right token is not slowed');
	is($login->(4, 'wrong-token-0000000007')->{status}, 401, "another address's wrong token counts apart: 401");
}

# ---- a down destination, and an error that carries markup
$node->safe_psql('postgres', q{SELECT queuebox.enqueue('orders.created', '{"id": 1}', 'c-1')});
qb_wait_query($node, q{SELECT state FROM queuebox.destination_status() WHERE destination = 'down'}, 'open',
	'the down destination\'s circuit opens');
my $xss = q{<script>window.qbPwned = 1</script><img src=x onerror="window.qbPwned = 2">};
# the circuit holds for an hour: no attempt writes last_error again during the test
$node->safe_psql('postgres',
	'UPDATE queuebox.destination_state SET last_error = ' . qb_sql_quote($xss) . q{ WHERE destination = 'down'});
$r = $http->get("$base/admin/overview", { headers => { Authorization => "Bearer $token" } });
$o = decode_json($r->{content});
is($o->{destinations}[0]{destination}, 'down', 'the overview lists down first');
is($o->{destinations}[0]{state}, 'open', 'the overview shows the circuit open');
is($o->{destinations}[0]{last_error}, $xss, 'and the last error as it is');
is($o->{outbox}{pending}, 1, 'and the row waiting');
is(join(',', map { $o->{destinations}[0]{$_} } qw(pending intake retrying parked held)), '1,0,0,0,1',
	'the destination\'s pending row is held (not in intake, retrying or parked)');
cmp_ok($o->{destinations}[0]{oldest_pending_sec}, '>', 0, 'with its age');

# ---- dead letters for the pages
# cust-7 and cust-9: the first row dies (the sink answers 500; one attempt) and
# holds its key (onDead: holdKey); the rows behind it are parked
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, max_attempts) VALUES
	('shop.order', 'cust-7', '{"key": "cust-7", "seq": 0, "_sink": {"status": 500}}', 1),
	('shop.order', 'cust-7', '{"key": "cust-7", "seq": 1}', NULL),
	('shop.order', 'cust-7', '{"key": "cust-7", "seq": 2}', NULL),
	('shop.order', 'cust-9', '{"key": "cust-9", "seq": 0, "_sink": {"status": 500}}', 1),
	('shop.order', 'cust-9', '{"key": "cust-9", "seq": 1}', NULL)});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'dead' AND hold = 'dead'}, 2,
	'the heads of cust-7 and cust-9 die holding their keys', timeout => 60);
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'pending' AND hold = 'key'}, 3,
	'the rows behind them are parked', timeout => 60);
my %head = map { $_ => $node->safe_psql('postgres',
		qq{SELECT id FROM queuebox.outbox WHERE key = '$_' AND state = 'dead'}) } qw(cust-7 cust-9);
# 55 dead rows of another topic (a page of 50 and the next), and one whose
# payload, header and error carry markup
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, state, attempt, max_attempts, destination, last_error)
	SELECT 'bulk.x', 'bulk-' || g, jsonb_build_object('n', g), 'dead', 3, 3, 'down', 'HTTP 503 from the bulk endpoint'
	FROM generate_series(1, 55) g});
my $xss_id = $node->safe_psql('postgres', sprintf(q{
	INSERT INTO queuebox.outbox (topic, key, payload, headers, state, attempt, destination, last_error)
	VALUES ('shop.order', 'xss-1', jsonb_build_object('note', %1$s::text), jsonb_build_object('X-Note', %1$s::text),
		'dead', 1, 'shop', %1$s) RETURNING id}, qb_sql_quote($xss)));
# a dead inbox row, and a webhook that arrives
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, consumption, state, attempt, last_error)
	VALUES ('stripe', 'evt_dead_1', 'charge.failed', 'cus_1', '{"id": "evt_dead_1", "type": "charge.failed"}', 'pull',
		'dead', 3, 'the consumer failed: timeout')});
$r = $http->post("$base/inbox/stripe",
	{ headers => { 'Content-Type' => 'application/json' }, content => '{"id": "evt_live_1", "type": "charge.succeeded"}' });
is($r->{status}, 202, 'the stripe source takes a webhook');
# an aggregate held in the relay's order (a source's onDead: holdKey): its
# dead push row, and one row parked behind it
my $agg_head = $node->safe_psql('postgres', q{
	INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, consumption, state,
		attempt, hold, last_error, created_at)
	VALUES ('ledger', 'led-1', 'entry.posted', 'acct-4', '{"n": 1}', 'push', 'dead', 1, 'dead',
		'the topic rendered empty', now() - interval '1 minute') RETURNING id});
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, consumption, hold)
	VALUES ('ledger', 'led-2', 'entry.posted', 'acct-4', '{"n": 2}', 'push', 'aggregate')});
is($node->safe_psql('postgres', 'SELECT aggregate_id || \':\' || head_id || \':\' || behind FROM queuebox.held_aggregates()'),
	"acct-4:$agg_head:1", 'acct-4 is held by its dead head');
my $rows_before = $node->safe_psql('postgres',
	q{SELECT (SELECT count(*) FROM queuebox.outbox) || '/' || (SELECT count(*) FROM queuebox.inbox)});
is($rows_before, '62/4', 'outbox and inbox rows before the browser');

# ---- the browser
SKIP:
{
	skip 'chromium is not installed (scripts/setup.sh installs it)', 16 unless -x '/usr/bin/chromium';
	my $dir = qb_npm_dir('test/browser');
	my $home = "$PostgreSQL::Test::Utils::tmp_check/browser-home-052";
	mkdir $home;
	qb_node_tests("$dir/console.test.js", 'the console in headless Chromium', 13,
		QB_CONSOLE_URL => $base,
		QB_ADMIN_TOKEN => $token,
		QB_XSS => $xss,
		QB_XSS_ID => $xss_id,
		QB_HELD_HEAD => $head{'cust-7'},
		QB_SKIP_HEAD => $head{'cust-9'},
		QB_AGG_HEAD => $agg_head,
		QB_SINK_LOG => $sink->{log},
		QB_WEBHOOK_KEY => 'evt_live_1',
		HOME => $home);

	# what the browser did, seen from the database and the sink
	my $states = sub {
		my ($key) = @_;
		return $node->safe_psql('postgres', qq{
			SELECT string_agg(coalesce(payload->>'seq', '?') || ':' || state, ',' ORDER BY id)
			FROM queuebox.outbox WHERE key = '$key'});
	};
	qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE key IN ('cust-7', 'cust-9') AND state = 'sent'},
		4, 'cust-7 and cust-9 drain', timeout => 60);
	is($states->('cust-7'), '0:sent,1:sent,2:sent', 'cust-7: the edited head and the rows behind it sent');
	my @seq = map { my $b = decode_json($_->{body}); $b->{seq} . ($b->{edited} ? 'e' : '') }
	  grep { $_->{status} >= 200 && $_->{status} < 300 && ($_->{body} // '') =~ /"cust-7"/ } @{ qb_sink_requests($sink) };
	is(join(',', @seq), '0e,1,2', 'the sink got the edited head first, then 1 and 2');
	is($node->safe_psql('postgres', qq{
			SELECT action || ':' || (payload_before ? '_sink') || ':' || (payload_after->>'edited')
			FROM queuebox.outbox_audit WHERE outbox_id = $head{'cust-7'}}),
		'requeue:true:true', 'the edit is audited with the payload before and after');
	is($states->('cust-9'), '0:dead,1:sent', 'cust-9: the skipped head stays dead, the key went on');
	is($node->safe_psql('postgres', qq{SELECT action FROM queuebox.outbox_audit WHERE outbox_id = $head{'cust-9'}}),
		'skip', 'the skip is audited');
	is($node->safe_psql('postgres', qq{SELECT state FROM queuebox.outbox WHERE id = $xss_id}), 'dead',
		'the row with markup is untouched');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'bulk.x' AND state = 'dead'}),
		'55', 'the bulk rows are untouched');
	is($node->safe_psql('postgres', qq{SELECT action FROM queuebox.inbox_audit WHERE inbox_id = $agg_head}),
		'skip', 'the held aggregate\'s skip is audited');
	# the row behind it is free: the relay forwards it into the outbox
	qb_wait_query($node, q{SELECT state || ':' || coalesce(hold, '-') FROM queuebox.inbox WHERE idempotency_key = 'led-2'},
		'processed:-', 'acct-4 goes on: the relay forwards the row behind the skipped head', timeout => 60);
	is($node->safe_psql('postgres', qq{SELECT state || ':' || coalesce(hold, '-') FROM queuebox.inbox WHERE id = $agg_head}),
		'dead:-', 'the skipped head stays dead, holding nothing');
	is($node->safe_psql('postgres',
			q{SELECT (SELECT count(*) FROM queuebox.outbox) || '/' || (SELECT count(*) FROM queuebox.inbox)}),
		'63/4', 'no row added or lost (the outbox gained only the forwarded row)');
}

is($node->safe_psql('postgres', q{SELECT state FROM queuebox.destination_status() WHERE destination = 'down'}),
	'open', 'nothing the console did changed the destination');
done_testing();
