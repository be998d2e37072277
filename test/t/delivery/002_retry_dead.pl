# 002_retry_dead.pl
#   Failed attempts are retried with backoff until the row's max_attempts,
#   then the row is dead; rows that cannot be published go dead at once.
#   An answer that never ends is read up to a bound, not until the timeout.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink = qb_sink_start(name => 'retry');
my $down_port = qb_free_port();    # nothing listens there
my $node = qb_node('retry');

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

qb_configure(
	$node,
	qb_config_yaml(
		outbox => { maxAttempts => 2 },
		destinations => {
			web => { type => 'http', baseUrl => $sink->{url}, path => '/events' },
			slow => {
				type => 'http',
				baseUrl => $sink->{url},
				path => '/slow',
				timeoutMs => 300
			},
			down => { type => 'http', baseUrl => "http://127.0.0.1:$down_port", path => '/x' },
		},
		routes => [
			{ topicPattern => 'orders.**', destination => 'web' },
			{ topicPattern => 'slow.**', destination => 'slow' },
			{ topicPattern => 'down.**', destination => 'down' },
		]));

# One row per case; ids are looked up by the "case" field of the payload.
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, payload, max_attempts) VALUES
	('orders.a', '{"case": "fail2", "_sink": {"fail": 2, "status": 500}}', 5),
	('orders.b', '{"case": "always503", "_sink": {"status": 503}}', 3),
	('orders.c', '{"case": "default_max", "_sink": {"status": 500}}', NULL),
	('nowhere.at.all', '{"case": "no_route"}', 5),
	('down.x', '{"case": "down"}', 3),
	('down.y', '{"case": "down_observe"}', 1000),
	('slow.x', '{"case": "timeout", "_sink": {"fail": 1, "delay_ms": 3000}}', 3),
	('orders.r', '{"case": "redirect", "_sink": {"status": 302}}', 2);
	INSERT INTO queuebox.outbox (topic, payload, headers, max_attempts) VALUES
	('orders.h', '{"case": "bad_header"}', jsonb_build_object('X-Bad', 'a' || chr(13) || chr(10) || 'Injected: 1'), 5);
});
my $inserted = 9;
is(qb_outbox_count($node), $inserted, "$inserted rows inserted");

sub row
{
	my ($case) = @_;
	my $r = $node->safe_psql('postgres', qq{
		SELECT message_id, state, attempt, coalesce(max_attempts::text, 'NULL'),
			   coalesce(last_error, ''), claim_token IS NULL AND lease_until IS NULL
		FROM queuebox.outbox WHERE payload->>'case' = '$case'});
	my %h;
	@h{qw(mid state attempt max_attempts last_error unclaimed)} = split /\|/, $r, 6;
	return \%h;
}

# ---- a connection failure is retried: observe the row between attempts
qb_wait_query($node, q{
	SELECT attempt >= 2 AND state IN ('pending', 'processing')
		   AND (last_error ILIKE '%connect%' OR last_error ILIKE '%refused%')
	FROM queuebox.outbox WHERE payload->>'case' = 'down_observe'},
	't', 'destination down: the row is retried, last_error names the connection failure',
	timeout => 30);
diag 'destination down, last_error: ' . row('down_observe')->{last_error};
# let it run out: the next failure is its last
$node->safe_psql('postgres',
	"UPDATE queuebox.outbox SET max_attempts = 1 WHERE payload->>'case' = 'down_observe'");

qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE state IN ('sent', 'dead')",
	$inserted, 'every row reaches a final state', timeout => 60);

my $by_id = qb_sink_by_id($sink);
my %n = map { $_ => scalar @{ $by_id->{ row($_)->{mid} } // [] } }
  qw(fail2 always503 default_max no_route down down_observe timeout redirect bad_header);

# ---- fails twice, then succeeds
my $r = row('fail2');
is($r->{state}, 'sent', 'fail 2 then succeed: sent');
is($r->{attempt}, '3', 'fail 2 then succeed: attempt 3');
is($n{fail2}, 3, 'fail 2 then succeed: the sink saw 3 requests for its message id');
is( join(',', map { $_->{status} } @{ $by_id->{ $r->{mid} } }),
	'500,500,200', 'fail 2 then succeed: answered 500, 500, 200 in that order');
like($r->{last_error}, qr/HTTP 500/, 'fail 2 then succeed: last_error keeps the last failure');
is($r->{unclaimed}, 't', 'fail 2 then succeed: no claim token or lease left');

# ---- always fails: dead after max_attempts
$r = row('always503');
is($r->{state}, 'dead', 'always 503, max_attempts 3: dead');
is($r->{attempt}, '3', 'always 503: attempt 3');
is($n{always503}, 3, 'always 503: exactly 3 requests');
like($r->{last_error}, qr/503/, 'always 503: last_error mentions 503');
like($r->{last_error}, qr/none remain/, 'always 503: last_error says no attempt remains');
is($r->{unclaimed}, 't', 'always 503: no claim token or lease left');

# ---- NULL max_attempts takes outbox.maxAttempts (2)
$r = row('default_max');
is($r->{state}, 'dead', 'NULL max_attempts: dead');
is($r->{attempt}, '2', 'NULL max_attempts: attempt 2 (outbox.maxAttempts)');
is($n{default_max}, 2, 'NULL max_attempts: exactly 2 requests');
is($r->{max_attempts}, 'NULL', 'NULL max_attempts: the column stays NULL');

# ---- no route: dead at once, nothing sent
$r = row('no_route');
is($r->{state}, 'dead', 'no route: dead');
is($r->{attempt}, '0', 'no route: no attempt counted');
like($r->{last_error}, qr/no route/, 'no route: last_error says no route matches');
is($n{no_route}, 0, 'no route: no request');


# ---- destination down
$r = row('down');
is($r->{state}, 'dead', 'destination down: dead after its attempts');
is($r->{attempt}, '3', 'destination down: attempt 3');
like($r->{last_error}, qr/connect|refused/i, 'destination down: last_error names the connection failure');
like($r->{last_error}, qr/127\.0\.0\.1:$down_port/, 'destination down: last_error names the URL');
$r = row('down_observe');
is($r->{state}, 'dead', 'destination down (observed): dead once no attempt remains');

# ---- timeout: the sink answers after 3 s, timeoutMs is 300
$r = row('timeout');
is($r->{state}, 'sent', 'timeout: sent on a later attempt');
is($r->{attempt}, '2', 'timeout: the timed-out request counted as a failed attempt');
like($r->{last_error}, qr/timed out|timeout/i, 'timeout: last_error says the request timed out');
ok(scalar(grep { $_->{status} == 200 } @{ $by_id->{ $r->{mid} } // [] }) == 1,
	'timeout: one successful request');

# ---- a redirect is not a delivery
$r = row('redirect');
is($r->{state}, 'dead', 'a 302 answer: dead after max_attempts 2');
is($r->{attempt}, '2', 'a 302 answer: attempt 2');
is($n{redirect}, 2, 'a 302 answer: 2 requests, the redirect was not followed as a success');
like($r->{last_error}, qr/HTTP 302/, 'a 302 answer: last_error names the status');

# ---- a row header that would inject a header line: dead at once, not sent
$r = row('bad_header');
is($r->{state}, 'dead', 'a row header with CR LF: dead');
is($r->{attempt}, '0', 'a row header with CR LF: no attempt counted');
like($r->{last_error}, qr/X-Bad.*not a valid HTTP header/, 'a row header with CR LF: last_error names the header');
is($n{bad_header}, 0, 'a row header with CR LF: no request');
ok(!grep({ exists $_->{headers}{injected} } @{ qb_sink_requests($sink) }),
	'no request carried the injected header');

# ---- nothing more is sent for final rows
$node->safe_psql('postgres', q{SELECT pg_sleep(0.5)});
$by_id = qb_sink_by_id($sink);
is(scalar @{ $by_id->{ row('always503')->{mid} } }, 3, 'a dead row gets no further request');
is(scalar @{ $by_id->{ row('fail2')->{mid} } }, 3, 'a sent row gets no further request');

# ---- an answer whose body never ends: read up to a bound, not until the
# 60 s timeout (the endpoint counts what it wrote on each connection)
my $endless = qb_endless_start();
my ($edest, $eroutes) = qb_endless_routes($endless);
qb_configure($node, qb_config_yaml(outbox => { maxAttempts => 2 }, destinations => $edest, routes => $eroutes));
qb_endless_check($node, $endless, 'extension');
$inserted += 2;
qb_endless_stop($endless);

is(qb_outbox_count($node), $inserted, "the outbox still holds the $inserted rows");
is( $node->safe_psql('postgres',
		q{SELECT string_agg(state || ':' || n, ',' ORDER BY state)
		  FROM (SELECT state, count(*) n FROM queuebox.outbox GROUP BY state) s}),
	'dead:8,sent:3', 'after: 3 sent, 8 dead');

$node->stop;
qb_sink_stop($sink);
done_testing();
