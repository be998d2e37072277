# 021_breaker.pl
#   The circuit breaker and the receiver's own signals (docs/design/claim.md):
#   - open -> half-open -> closed, every row delivered once in key order,
#     destination_status() and /metrics showing the open circuit;
#   - 410 Gone disables the destination: rows held, no attempt spent, nothing
#     sent until POST /admin/destinations/{name}/resume (401 without the
#     token);
#   - Retry-After on a 429 pauses the destination and delays the retry;
#   - an operator's pause (POST .../pause) holds every row, reset keeps it,
#     resume sends them all, in key order;
#   - a probe row whose own backoff is not over is still sent as the probe;
#   - a success resets the count: messages that each fail once and then
#     succeed, one at a time, never open the circuit; resume of a closed
#     destination answers resumed: false;
#   - the only destination configured opens, and is still probed again;
#   - a success sent before the circuit opened (answered late) leaves it
#     open; the probe's closes it.
#   Every phase counts rows before and after; waits are bounded polls.
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $r_port = qb_free_port();
my $sink_r = qb_sink_start(name => 'brk_r', port => $r_port, status => 500);
my $sink_g = qb_sink_start(name => 'brk_gone');
my $sink_p = qb_sink_start(name => 'brk_pause');
my $sink_f = qb_sink_start(name => 'brk_flaky');
my $n_port = qb_free_port();
my $sink_n = qb_sink_start(name => 'brk_n', port => $n_port, status => 500);
my $http_port = qb_free_port();
my $base = "http://127.0.0.1:$http_port";
my $token = 'breaker-admin-token-0123';
my $node = qb_node('breaker');
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

sub config
{
	my (%outbox) = @_;
	my $d = sub {
		my ($url, %o) = @_;
		return { type => 'http', baseUrl => $url, path => '/events', %o };
	};
	return qb_config_yaml(
		outbox => { maxAttempts => 1000, %outbox },
		http => { listen => "127.0.0.1:$http_port" },
		admin => { token => $token },
		destinations => {
			r => $d->($sink_r->{url}, circuitBreaker => { failures => 3, cooldownMs => 500 }),
			g => $d->($sink_g->{url}),
			p => $d->($sink_p->{url}),
			n => $d->($sink_n->{url}, circuitBreaker => { failures => 1, cooldownMs => 500 }),
			f => $d->($sink_f->{url}, circuitBreaker => { failures => 3, cooldownMs => 60000 }),
		},
		routes => [ map { { topicPattern => "$_.**", destination => $_ } } qw(r g p n f) ]);
}
qb_configure($node, config());
qb_wait_for(sub { $http->get("$base/healthz")->{status} == 200 }, 'the HTTP listener is up', timeout => 30);

sub metric_state
{
	my ($dest, $state) = @_;
	my $r = $http->get("$base/metrics");
	return undef unless $r->{status} == 200;
	return $r->{content} =~ /^queuebox_destination_state\{destination="$dest",state="$state"\} (\d)$/m ? $1 : undef;
}

sub states
{
	my ($topic) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT coalesce(sum(n), 0) || ' rows: ' || coalesce(string_agg(state || '=' || n, ' ' ORDER BY state), '')
		FROM (SELECT state, count(*) AS n FROM queuebox.outbox WHERE topic = '$topic' GROUP BY state) s});
}

# ==== 4. open -> half-open -> closed, every key's order kept
my $log_offset = -s $node->logfile;
qb_insert_keyed($node, 'r.ev', 100, 4, 'rk');
qb_wait_for(sub { qb_dest_status($node, 'r')->{state} eq 'open' },
	'breaker: r answers 500: destination_status shows its circuit open', timeout => 30);
qb_wait_for(sub { (metric_state('r', 'open') // 0) == 1 },
	'breaker: /metrics shows queuebox_destination_state{destination="r",state="open"} 1', timeout => 30);
is(metric_state('r', 'closed'), 0, 'breaker: and closed 0 while open');
qb_wait_log($node, qr/destination r: circuit half-open -> open/, $log_offset, timeout => 30);
cmp_ok(qb_log_count($node, qr/destination r: circuit half-open -> open/, $log_offset), '>=', 1,
	'breaker: after the cooldown a probe is tried; it fails and the circuit opens again');
my $r_before = states('r.ev');
is($r_before, '100 rows: pending=100', 'breaker: while open all 100 rows are pending, none dead')
  or diag $r_before;
my $probes = @{ qb_sink_requests($sink_r) };
note "breaker: $probes requests reached r while it failed";

# r recovers: a sink that answers 200 on its port
qb_sink_stop($sink_r);
my $sink_r2 = qb_sink_start(name => 'brk_r2', port => $r_port);
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'r.ev' AND state = 'sent'",
	100, 'breaker: after r recovers all 100 rows are sent', timeout => 60);
is(qb_count($node, "topic = 'r.ev'"), 100, 'breaker: no row lost');
my $st = qb_dest_status($node, 'r');
is("$st->{state}/$st->{failures}/$st->{held}", 'closed/0/0',
	'breaker: destination_status shows r closed, no failures, nothing held');
is(metric_state('r', 'closed'), 1, 'breaker: /metrics shows r closed');
my $or = qb_key_order($node, [ $sink_r, $sink_r2 ], "topic = 'r.ev'");
is($or->{delivered}, 100, 'breaker: every row got a 2xx');
is($or->{dups}, 0, 'breaker: exactly once');
is($or->{keys_in_order}, 4, 'breaker: all 4 keys in id order') or diag join("\n", @{ $or->{bad} });
is(qb_log_count($node, qr/destination r: circuit closed -> open/, $log_offset), 1,
	'breaker: one "closed -> open" line');
is(qb_log_count($node, qr/destination r: circuit half-open -> closed/, $log_offset), 1,
	'breaker: one "half-open -> closed" line');

# ==== 5. 410 Gone disables the destination until resumed
$log_offset = -s $node->logfile;
qb_insert_keyed($node, 'g.ev', 40, 4, 'gk', '{"fail": 1, "status": 410}');
my $gone_mid = $node->safe_psql('postgres',
	"SELECT message_id FROM queuebox.outbox WHERE topic = 'g.ev' ORDER BY id LIMIT 1");
qb_wait_for(
	sub {
		qb_dest_status($node, 'g')->{state} eq 'disabled'
		  && qb_count($node, "topic = 'g.ev' AND (state = 'processing' OR (state = 'pending'"
			  . " AND (hold = 'ready' OR destination IS NULL)))") == 0;
	},
	'gone: a 410 disables g; its rows wait for it (held, parked, routed or in its intake), none in flight', timeout => 30);
my $g_reqs = scalar @{ qb_sink_requests($sink_g) };
my $g_att = $node->safe_psql('postgres', q{
	SELECT coalesce(sum(attempt), 0) || '/' || count(*) FILTER (WHERE state = 'pending' AND attempt > 0)
	       || '/' || count(*) FILTER (WHERE state = 'dead')
	FROM queuebox.outbox WHERE topic = 'g.ev'});
is($g_att, "$g_reqs/1/0",
	"gone: attempts spent = requests the sink got ($g_reqs); only the 410 row is pending with an attempt; none dead");
is($node->safe_psql('postgres', "SELECT state || '/' || attempt || '/' || hold FROM queuebox.outbox"
		. " WHERE message_id = '$gone_mid'"), 'pending/1/destination',
	'gone: the 410 row is held for g with its one attempt');
my $g_pending = qb_count($node, "topic = 'g.ev' AND state = 'pending'");
cmp_ok($g_pending, '>', 0, "gone: $g_pending rows wait for g");
# nothing happens while disabled: a bounded observation window
usleep(1_500_000);
is(scalar @{ qb_sink_requests($sink_g) }, $g_reqs, 'gone: nothing more was sent while g is disabled');
is(qb_count($node, "topic = 'g.ev' AND state = 'pending'"), $g_pending, 'gone: the same rows still wait');
is(qb_dest_status($node, 'g')->{state}, 'disabled', 'gone: g is still disabled');
is(metric_state('g', 'disabled'), 1, 'gone: /metrics shows g disabled');
is(qb_log_count($node, qr/destination g: circuit closed -> disabled/, $log_offset), 1,
	'gone: one "closed -> disabled" line');

my $r = $http->request('POST', "$base/admin/destinations/g/resume");
is($r->{status}, 401, 'gone: resume without the token is 401');
$r = $http->request('POST', "$base/admin/destinations/g/resume",
	{ headers => { Authorization => 'Bearer wrong' } });
is($r->{status}, 401, 'gone: resume with a wrong token is 401');
my %auth = (Authorization => "Bearer $token");
$r = $http->request('POST', "$base/admin/destinations/nosuch/resume", { headers => \%auth });
is($r->{status}, 404, 'gone: resume of a destination not in the configuration is 404');
is(qb_dest_status($node, 'g')->{state}, 'disabled', 'gone: the refused calls changed nothing');
$r = $http->request('POST', "$base/admin/destinations/g/resume", { headers => \%auth });
is($r->{status}, 200, 'gone: resume with the token is 200') or diag $r->{content};
is(eval { decode_json($r->{content})->{resumed} } ? 1 : 0, 1, 'gone: it answers resumed: true')
  or diag $r->{content};
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'g.ev' AND state = 'sent'",
	40, 'gone: after the resume all 40 rows are sent', timeout => 60);
my $og = qb_key_order($node, $sink_g, "topic = 'g.ev'");
is("$og->{delivered}/$og->{dups}", '40/0', 'gone: each row delivered once');
is($og->{keys_in_order}, 4, 'gone: all 4 keys in id order') or diag join("\n", @{ $og->{bad} });
is(join(',', map { $_->{status} } @{ qb_sink_by_id($sink_g)->{$gone_mid} }), '410,200',
	'gone: the 410 row was requested twice: 410, then 200 after the resume');
is(qb_dest_status($node, 'g')->{state}, 'closed', 'gone: g is closed');

# ==== 6. Retry-After: a 429 pauses the destination, the retry waits
# The pause and the retry are capped by backoff.maxMs (200 ms in this
# test's backoff): raise it above the 1 s asked for.
$log_offset = -s $node->logfile;
qb_configure($node, config(backoff => { maxMs => 5000 }));
qb_wait_for(sub { qb_log_count($node, qr/queuebox outbox \d: configuration loaded/, $log_offset) >= 2 },
	'retry-after: both workers loaded backoff.maxMs 5000', timeout => 30);
qb_insert_keyed($node, 'p.ev', 1, 1, 'pk', '{"fail": 1, "status": 429, "retry_after": "1"}');
my $ra_mid = $node->safe_psql('postgres', "SELECT message_id FROM queuebox.outbox WHERE topic = 'p.ev'");
my $ps = qb_wait_for(
	sub { my $s = qb_dest_status($node, 'p'); $s->{paused_until} ne '' ? $s : undef },
	'retry-after: the 429 sets paused_until on p', timeout => 30);
note "retry-after: p while paused: state $ps->{state}, paused $ps->{paused}, paused_until $ps->{paused_until}";
my $paused_us = $node->safe_psql('postgres',
	"SELECT (extract(epoch FROM paused_until) * 1e6)::bigint FROM queuebox.destination_state WHERE destination = 'p'");
my $t429 = qb_sink_by_id($sink_p)->{$ra_mid}[0]{t_us};
cmp_ok($paused_us - $t429, '>=', 900_000, 'retry-after: paused_until is at least ~1 s after the 429 was received');
# rows that arrive during the pause wait for it too
qb_insert_keyed($node, 'p.ev2', 10, 5, 'pk2_');
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE topic IN ('p.ev', 'p.ev2') AND state = 'sent'",
	11, 'retry-after: then the row and the 10 inserted during the pause are sent', timeout => 30);
my @ra = @{ qb_sink_by_id($sink_p)->{$ra_mid} };
is(join(',', map { $_->{status} } @ra), '429,200', 'retry-after: the row was requested twice: 429, 200');
cmp_ok($ra[1]{t_us} - $ra[0]{t_us}, '>=', 900_000,
	'retry-after: its second request came at least ~1 s after the first');
my $o2 = qb_key_order($node, $sink_p, "topic = 'p.ev2'");
is("$o2->{delivered}/$o2->{dups}/$o2->{keys_in_order}", '10/0/5', 'retry-after: the later rows once each, in key order');
my @early = grep { $_->{t_us} < $paused_us - 5_000 }
  map { @{ qb_sink_by_id($sink_p)->{$_} // [] } }
  split /\n/, $node->safe_psql('postgres', "SELECT message_id FROM queuebox.outbox WHERE topic = 'p.ev2'");
is(scalar @early, 0, 'retry-after: none of them was sent before paused_until');
is(qb_count($node, "topic LIKE 'p.%' AND state <> 'sent'"), '0', 'retry-after: nothing left pending or dead');

# ==== 7. an operator's pause (POST /admin/destinations/{name}/pause): rows
# wait, none is lost or spent; reset keeps the pause; resume sends them
$r = $http->request('POST', "$base/admin/destinations/p/pause", { headers => \%auth, content => '{"seconds": 0}' });
is($r->{status}, 400, 'pause: seconds 0 is 400');
like($r->{content}, qr/seconds must be a whole number from 1 to 31536000/, 'pause: and says what it takes');
$r = $http->request('POST', "$base/admin/destinations/p/pause", { headers => \%auth, content => '{"secs": 5}' });
is($r->{status}, 400, 'pause: an unknown key is 400');
like($r->{content}, qr/unknown key \\"secs\\"; this route takes: seconds/, 'pause: it names the key and lists seconds');
# an empty body is no key (the ingress once crashed on it: jansson's json_object
# resolved to PostgreSQL's function of that name inside the server)
$r = $http->request('POST', "$base/admin/destinations/p/pause", { headers => \%auth });
is($r->{status}, 400, 'pause: an empty body is 400');
like($r->{content}, qr/seconds/, 'pause: and asks for seconds') or diag $r->{content};
$r = $http->request('POST', "$base/admin/destinations/nosuch/pause", { headers => \%auth, content => '{"seconds": 60}' });
is($r->{status}, 404, 'pause: a destination not in the configuration is 404');
is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.destination_state WHERE destination = 'nosuch'"),
	'0', 'pause: and no state is stored for it');
$r = $http->request('POST', "$base/admin/destinations/p/pause", { headers => \%auth, content => '{"seconds": 3600}' });
is($r->{status}, 200, 'pause: POST pause {"seconds": 3600} is 200') or diag $r->{content};
my $pause = eval { decode_json($r->{content}) } // {};
is($pause->{known} ? 1 : 0, 1, 'pause: it answers known: true');
is($node->safe_psql('postgres', "SELECT paused_until = '$pause->{paused_until}'::timestamptz"
		. " AND paused_until > now() + interval '59 minutes' FROM queuebox.destination_state WHERE destination = 'p'"),
	't', 'pause: paused_until is the answer\'s, an hour ahead');
my $p_reqs = scalar @{ qb_sink_requests($sink_p) };
my $p_before = qb_count($node, "topic LIKE 'p.%'");
qb_insert_keyed($node, 'p.op', 20, 4, 'pok');
qb_wait_for(sub { qb_count($node, "topic = 'p.op' AND state = 'pending' AND hold IS NOT NULL") == 20 },
	'pause: the 20 new rows wait for p (in its intake, parked or held)', timeout => 30);
usleep(1_500_000);    # a bounded observation window: the workers claim every few ms
is(scalar @{ qb_sink_requests($sink_p) }, $p_reqs, 'pause: nothing was sent to p while paused');
is(states('p.op'), '20 rows: pending=20', 'pause: all 20 rows still pending, none processing, sent or dead');
is($node->safe_psql('postgres', "SELECT coalesce(sum(attempt), 0) FROM queuebox.outbox WHERE topic = 'p.op'"),
	'0', 'pause: no attempt spent');
$r = $http->request('POST', "$base/admin/destinations/p/reset", { headers => \%auth });
is($r->{status}, 200, 'pause: reset is 200') or diag $r->{content};
is($r->{content}, '{"known" : true, "reset" : false}', 'pause: reset of a closed circuit changes nothing');
ok(qb_dest_status($node, 'p')->{paused}, 'pause: reset keeps the pause');
$r = $http->request('POST', "$base/admin/destinations/p/resume", { headers => \%auth });
is($r->{status}, 200, 'pause: resume is 200') or diag $r->{content};
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'p.op' AND state = 'sent'",
	20, 'pause: after the resume all 20 rows are sent', timeout => 60);
is(qb_count($node, "topic LIKE 'p.%'"), $p_before + 20, 'pause: no row lost or added');
my $op = qb_key_order($node, $sink_p, "topic = 'p.op'");
is("$op->{delivered}/$op->{dups}/$op->{keys_in_order}", '20/0/4', 'pause: each row once, every key in order');
like(slurp_file($node->logfile), qr/admin: pause destination p for 3600 s: 200 .* \(admin route from 127\.0\.0\.1\)/,
	'pause: the server logged the pause, its target and who asked');
is(scalar(grep { /ingress: admin: / && /\Q$token\E/ } split /\n/, slurp_file($node->logfile)), 0,
	'pause: no admin log line shows the admin token');

# ==== 8. a probe row whose own retry is not due yet is still the probe
# A backoff longer than the cooldown: the held row's scheduled_at is still
# ahead when the circuit goes half-open.
$log_offset = -s $node->logfile;
qb_configure($node, config(backoff => { initialMs => 4000, maxMs => 4000, multiplier => 1 }));
qb_wait_for(sub { qb_log_count($node, qr/queuebox outbox \d: configuration loaded/, $log_offset) >= 2 },
	'probe: both workers loaded the longer backoff', timeout => 30);
qb_insert_keyed($node, 'n.ev', 1, 1, 'nk');
qb_wait_for(sub { qb_dest_status($node, 'n')->{state} eq 'open' }, 'probe: n answers 500 and opens', timeout => 30);
qb_wait_for(sub { @{ qb_sink_requests($sink_n) } >= 2 },
	'probe: after the cooldown the held row is tried as the probe, though its backoff is not over',
	timeout => 20);
qb_sink_stop($sink_n);
my $sink_n2 = qb_sink_start(name => 'brk_n2', port => $n_port);
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'n.ev'", 'sent',
	'probe: once n answers 200, a probe closes it and the row is sent', timeout => 30);
is(qb_dest_status($node, 'n')->{state}, 'closed', 'probe: n is closed');

# ==== 9. a success resets the count (docs/delivery.md)
# Six messages, one at a time, each failing once and then succeeding: with
# circuitBreaker.failures 3 the circuit must never open, and the count is
# back to 0 after each success.  (The engine once skipped a success's
# tally while the circuit was closed: the count grew 1, 2, 3 and f opened.)
$log_offset = -s $node->logfile;
qb_configure($node, config());
qb_wait_for(sub { qb_log_count($node, qr/queuebox outbox \d: configuration loaded/, $log_offset) >= 2 },
	'reset: both workers loaded the short backoff again', timeout => 30);
my @counts;
for my $i (1 .. 6)
{
	qb_insert_keyed($node, "f.ev$i", 1, 1, "fk$i", '{"fail": 1}');
	qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'f.ev$i'", 'sent',
		"reset: message $i fails once, then is sent", timeout => 30);
	my $fs = qb_dest_status($node, 'f');
	push @counts, "$fs->{state}/$fs->{failures}";
}
is(join(' ', @counts), join(' ', ('closed/0') x 6),
	'reset: after each success f is closed with no failure counted');
is(join(',', map { scalar @{ $_ } } values %{ qb_sink_by_id($sink_f) }), join(',', (2) x 6),
	'reset: each message was requested twice (a 500, then a 200)');
is(qb_log_count($node, qr/destination f: circuit/, $log_offset), 0, 'reset: f\'s circuit never moved');
$r = $http->request('POST', "$base/admin/destinations/f/resume", { headers => \%auth });
is($r->{content}, '{"known" : true, "resumed" : false}', 'resume of a closed destination answers resumed: false');
# p's Retry-After pause of section 6 is over: p is simply closed
$r = $http->request('POST', "$base/admin/destinations/p/resume", { headers => \%auth });
is($r->{content}, '{"known" : true, "resumed" : false}', 'resume of a destination whose pause is over answers resumed: false');

# ==== 10. the only destination opens, and is probed again
# With one destination configured, an open circuit left every worker with
# no room anywhere, so none claimed again, and the claim is what moves a
# circuit whose cooldown is over to half-open: no probe was ever sent and
# every row waited for good (TAP 004 met it after a crash).  Five messages,
# each failing twice then succeeding; failures 2 opens the circuit at once.
$log_offset = -s $node->logfile;
qb_configure($node, qb_config_yaml(
	outbox => { maxAttempts => 1000, backoff => { initialMs => 50, maxMs => 100 } },
	http => { listen => "127.0.0.1:$http_port" },
	admin => { token => $token },
	destinations => { f => { type => 'http', baseUrl => $sink_f->{url}, path => '/events',
		circuitBreaker => { failures => 2, cooldownMs => 300 } } },
	routes => [ { topicPattern => '**', destination => 'f' } ]));
qb_wait_for(sub { qb_log_count($node, qr/queuebox outbox \d: configuration loaded/, $log_offset) >= 2 },
	'alone: both workers loaded the one-destination configuration', timeout => 30);
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload)
	SELECT 'alone.ev', jsonb_build_object('i', i, '_sink', jsonb_build_object('fail', 2))
	FROM generate_series(1, 5) i});
qb_wait_for(sub { qb_log_count($node, qr/destination f: circuit closed -> open/, $log_offset) >= 1 },
	'alone: f\'s circuit opens', timeout => 30);
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'alone.ev' AND state = 'sent'", '5',
	'alone: after the cooldown f is probed, closes, and every row is sent', timeout => 60);
ok(qb_log_count($node, qr/destination f is half-open: trying row \d+ as its probe/, $log_offset) >= 1, 'alone: f went half-open and a row was its probe');
is(qb_dest_status($node, 'f')->{state}, 'closed', 'alone: f ends closed');

# ==== 11. a late success does not close an open circuit (issue 38)
# A request answered just before a partition and settled late closed the
# circuit mid-partition.  One worker (so the one that sees l open is the one
# that settles a): row a is sent while l is closed and the sink holds its
# answer; row b fails once and opens l (failures 1, a cooldown of an hour:
# no probe until the test brings probe_at forward).  Then the sink answers a
# with 200: a was sent before l opened, so l stays open.  Then b is the
# probe, sent after l opened: its 200 closes l.  No timed assertion: each
# step waits for the one before.
my $sink_l = qb_sink_start(name => 'brk_late');
$node->safe_psql('postgres', 'ALTER SYSTEM SET queuebox.outbox_workers = 1; SELECT pg_reload_conf()');
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'queuebox outbox%'", '1',
	'late: one outbox worker runs', timeout => 30);
$log_offset = -s $node->logfile;
qb_configure($node, qb_config_yaml(
	outbox => { maxAttempts => 1000, backoff => { initialMs => 50, maxMs => 100 } },
	http => { listen => "127.0.0.1:$http_port" },
	admin => { token => $token },
	destinations => { l => { type => 'http', baseUrl => $sink_l->{url}, path => '/events',
		circuitBreaker => { failures => 1, cooldownMs => 3600000 } } },
	routes => [ { topicPattern => '**', destination => 'l' } ]));
qb_wait_for(sub { qb_log_count($node, qr/queuebox outbox \d: configuration loaded/, $log_offset) >= 1 },
	'late: the worker loaded the configuration of l', timeout => 30);
my $late_a = $node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload)
	VALUES ('late.a', '{"_sink": {"hold": true}}') RETURNING id});
qb_wait_for(sub { qb_sink_stats($sink_l)->{held} == 1 }, 'late: a is sent, the sink holds its answer',
	timeout => 30);
my $late_b = $node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload)
	VALUES ('late.b', '{"_sink": {"fail": 1}}') RETURNING id});
qb_wait_for(sub { qb_dest_status($node, 'l')->{state} eq 'open' }, 'late: b fails and opens l', timeout => 30);
$r = HTTP::Tiny->new(timeout => 10)->post("$sink_l->{url}/_sink/release");
is($r->{content}, '{"released":1}', 'late: the sink answers a (200) now that l is open');
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE id = $late_a", 'sent',
	'late: a is settled as sent', timeout => 30);
my $ls = qb_dest_status($node, 'l');
is("$ls->{state}/$ls->{failures}", 'open/1', 'late: a, sent before l opened, did not close it nor reset its count');
is($node->safe_psql('postgres', "SELECT state || '/' || attempt FROM queuebox.outbox WHERE id = $late_b"),
	'pending/1', 'late: b waits for the probe, one attempt spent');
$node->safe_psql('postgres', "UPDATE queuebox.destination_state SET probe_at = now() WHERE destination = 'l'");
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE id = $late_b", 'sent',
	'late: the cooldown over, b is the probe and is sent', timeout => 30);
is(qb_dest_status($node, 'l')->{state}, 'closed', 'late: the probe, sent after l opened, closed it');
ok(qb_log_count($node, qr/destination l is half-open: trying row $late_b as its probe/, $log_offset) >= 1,
	'late: b was the probe');
is(join(',', sort map { scalar @{ $_ } } values %{ qb_sink_by_id($sink_l) }),
	'1,2', 'late: the sink got a once and b twice (a 500, then the probe)');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET queuebox.outbox_workers; SELECT pg_reload_conf()');

is(qb_count($node, "state <> 'sent'"), '0', 'every row of the test ends sent');
is(qb_outbox_count($node), 100 + 40 + 11 + 20 + 1 + 6 + 5 + 2, 'and the outbox holds them all');

$node->stop;
qb_sink_stop($_) for ($sink_r2, $sink_g, $sink_p, $sink_n2, $sink_f, $sink_l);
done_testing();
