# 066_rate_limit.pl
#   A destination's limits, shared by every outbox worker of the server
#   (docs/delivery.md, "Limits"): with 2 outbox workers,
#   1. rateLimit {perSecond: 50, burst: 50} over more than 20 s of rows:
#      judged from the sink's own request timestamps, no stretch of time
#      holds more requests than the bucket allows (burst + 50/s, 5 % over
#      at most), and past the burst the rate is 50/s within 5 %; the rows
#      wait in the table (at most 2 x burst claimed at once: over 275 keys,
#      so that key order alone would let both workers claim their room, 2 x
#      100), none is lost, each is sent once, every key in order;
#   2. maxConcurrent: 1 against a sink that answers after 50 ms: the sink
#      never sees two requests at once; every row sent once;
#   3. a limited destination beside an unlimited one: the unlimited one's
#      rows are all sent while the limited one still has rows waiting;
#   4. /metrics and the console's overview show the limits and the waits.
#   Waits are bounded polls; no assertion is on the test's own clock.
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

my $rate = 50;
my $burst = 50;
my $sink_r = qb_sink_start(name => 'rl_rate');
my $sink_c = qb_sink_start(name => 'rl_one', delay_ms => 50);
my $sink_f = qb_sink_start(name => 'rl_free');
my $http_port = qb_free_port();
my $base = "http://127.0.0.1:$http_port";
my $token = 'ratelimit-admin-token-0123';
my $node = qb_node('ratelimit', workers => 2);
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

# r: the rate limit; c: one request at a time; f: no limit
qb_configure(
	$node,
	qb_config_yaml(
		outbox => { maxAttempts => 1000 },
		http => { listen => "127.0.0.1:$http_port" },
		admin => { token => $token },
		destinations => {
			r => { type => 'http', baseUrl => $sink_r->{url}, rateLimit => { perSecond => $rate, burst => $burst } },
			c => { type => 'http', baseUrl => $sink_c->{url}, maxConcurrent => 1 },
			f => { type => 'http', baseUrl => $sink_f->{url} },
		},
		routes => [ map { { topicPattern => "$_.**", destination => $_ } } qw(r c f) ]));
qb_wait_for(sub { $http->get("$base/healthz")->{status} == 200 }, 'the HTTP listener is up', timeout => 30);

# the most rows of a topic claimed at once, sampled until all are sent
sub most_processing_until_sent
{
	my ($topic, $n, $what, $timeout) = @_;
	my $most = 0;
	qb_wait_for(
		sub {
			my ($proc, $sent) = split /\|/, $node->safe_psql('postgres',
				"SELECT count(*) FILTER (WHERE state = 'processing'), count(*) FILTER (WHERE state = 'sent')"
				  . " FROM queuebox.outbox WHERE topic = '$topic'");
			$most = $proc if $proc > $most;
			$sent == $n;
		},
		$what, timeout => $timeout);
	return $most;
}

# ==== 1. rateLimit 50/s, burst 50, 2 workers, 1100 rows (22 s of tokens)
# over 275 keys: more than 2 x batchSize heads, so that what is claimed at
# once is bounded by the limit, not by the keys' order (50 keys bound it to 50)
my $nr = 1100;
my $nk = 275;
qb_insert_keyed($node, 'r.ev', $nr, $nk, 'rk');
is(qb_count($node, "topic = 'r.ev'"), $nr, "rate: $nr rows for r over $nk keys");
my $most = most_processing_until_sent('r.ev', $nr, "rate: all $nr rows of r are sent", 120);

qb_sink_rate_held($sink_r, $rate, $burst, $nr, 'rate');
cmp_ok($most, '<=', 2 * $burst,
	"rate: rows waited in the table: at most $most of them were claimed at once (<= 2 x burst)");
my $or = qb_key_order($node, $sink_r, "topic = 'r.ev'");
is($or->{delivered}, $nr, "rate: all $nr rows were answered 2xx");
is($or->{dups}, 0, 'rate: each row was sent once');
is($or->{keys_in_order}, $nk, "rate: all $nk keys were delivered in id order") or diag join("\n", @{ $or->{bad} });
is(qb_count($node, "topic = 'r.ev' AND attempt = 1"), $nr, 'rate: every row spent exactly one attempt');

# ==== 2. maxConcurrent 1 against a sink that answers after 50 ms
my $nc = 200;
$node->safe_psql('postgres',
	"INSERT INTO queuebox.outbox (topic, key, payload) SELECT 'c.ev', 'ck' || i, jsonb_build_object('seq', i)"
	  . " FROM generate_series(1, $nc) i");
most_processing_until_sent('c.ev', $nc, "one: all $nc rows of c are sent", 120);
my $st = qb_sink_stats($sink_c);
is($st->{requests}, $nc, "one: the sink answered $nc requests");
is($st->{max_concurrent}, 1, 'one: the sink never had two requests at once (maxConcurrent: 1)');
my $oc = qb_key_order($node, $sink_c, "topic = 'c.ev'");
is($oc->{delivered}, $nc, "one: all $nc rows were answered 2xx");
is($oc->{dups}, 0, 'one: each row was sent once');

# ==== 3. a limited destination beside an unlimited one
my $nl = 500;
my $nf = 2000;
qb_insert_keyed($node, 'r.ev2', $nl, 20, 'rk2');
qb_insert_keyed($node, 'f.ev', $nf, 100, 'fk');
qb_drains_beside($node, [ 'f.ev', $nf ], [ 'r.ev2', $nl ], 'beside (f unlimited, r limited)');
my $of = qb_key_order($node, $sink_f, "topic = 'f.ev'");
is($of->{delivered} . '/' . $of->{dups}, "$nf/0", "beside: f's rows each sent once");
is($of->{keys_in_order}, 100, 'beside: f\'s keys in order');
my $o2 = qb_key_order($node, $sink_r, "topic = 'r.ev2'");
is($o2->{delivered} . '/' . $o2->{dups}, "$nl/0", "beside: r's rows each sent once");
is($o2->{keys_in_order}, 20, 'beside: r\'s keys in order');

# ==== 4. /metrics and the console's overview
my $m = $http->get("$base/metrics")->{content};
like($m, qr/^queuebox_destination_rate_limit_per_second\{destination="r"\} 50$/m, 'metrics: r\'s perSecond');
like($m, qr/^queuebox_destination_rate_limit_burst\{destination="r"\} 50$/m, 'metrics: r\'s burst');
like($m, qr/^queuebox_destination_max_concurrent\{destination="c"\} 1$/m, 'metrics: c\'s maxConcurrent');
like($m, qr/^queuebox_destination_concurrent\{destination="c"\} 0$/m, 'metrics: none of c\'s places is in use now');
unlike($m, qr/^queuebox_destination_rate_limit_per_second\{destination="f"\}/m, 'metrics: f has no limit');
my ($waits_r) = $m =~ /^queuebox_outbox_limit_waits_total\{destination="r"\} (\d+)$/m;
cmp_ok($waits_r // 0, '>', 0, "metrics: r's rows waited for its limit (" . ($waits_r // 'none') . ' times)');
like($m, qr/^queuebox_outbox_limit_waits_total\{destination="f"\} 0$/m, 'metrics: f\'s rows never waited');
my $ov = $http->get("$base/admin/overview", { headers => { Authorization => "Bearer $token" } });
is($ov->{status}, 200, 'overview: answered');
my %d = map { $_->{destination} => $_ } @{ decode_json($ov->{content})->{destinations} };
is_deeply($d{r}{limit}, { perSecond => 50, burst => 50 }, 'overview: r\'s limit');
is_deeply($d{c}{limit}, { maxConcurrent => 1, inUse => 0 }, 'overview: c\'s limit, none in use');
ok(!defined $d{f}{limit}, 'overview: f has none');
cmp_ok($d{r}{limit_waits}, '>', 0, 'overview: r\'s waits');

is(qb_outbox_count($node), $nr + $nc + $nl + $nf, 'every row is still in the outbox');
is(qb_count($node, "state <> 'sent'"), '0', 'and every one is sent');

$node->stop;
done_testing();
