# 067_daemon_rate_limit.pl
#   A destination's limits on the daemon on PostgreSQL, shared by its two
#   outbox roles (docs/delivery.md, "Limits"); its rows are routed at claim
#   (no trigger), so rows come to a worker without a reservation too:
#   1. rateLimit {perSecond: 50, burst: 50}: from the sink's own request
#      timestamps, no stretch holds more than the bucket allows (+5 %), and
#      past the burst the rate is 50/s within 5 %; nothing lost, each row
#      sent once, every key in order, one attempt each;
#   2. maxConcurrent: 1 against a sink that answers after 50 ms: never two
#      requests at once; then an outbox role is killed -9 while rows flow:
#      its place is given back (else, with one place, nothing more would be
#      sent), every row is sent, and from a second after the kill on the
#      sink again never sees two requests at once.
#   Waits are bounded polls; no assertion is on the test's own clock.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use HTTP::Tiny;
use Test::More;
use Time::HiRes qw(usleep);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $rate = 50;
my $burst = 50;
my $node = qbd_node('daemon_rl');
my $url = qbd_url($node);
my $sink_r = qb_sink_start(name => 'drl_rate');
my $sink_c = qb_sink_start(name => 'drl_one', delay_ms => 50);

my $d = qbd_start(
	$node,
	qb_config_yaml(
		outbox => { pollIntervalMs => 100, maxAttempts => 100, claimTimeoutMs => 5000 },
		destinations => {
			r => { type => 'http', baseUrl => $sink_r->{url}, timeoutMs => 2000,
				rateLimit => { perSecond => $rate, burst => $burst } },
			c => { type => 'http', baseUrl => $sink_c->{url}, timeoutMs => 2000, maxConcurrent => 1 },
		},
		routes => [ map { { topicPattern => "$_.**", destination => $_ } } qw(r c) ],
		database => { url => $url },
		daemon => { outboxWorkers => 2, shutdownGraceMs => 5000 }),
	name => 'drl');
like(qbd_wait_daemon_log($d, qr/(?=.*outbox 0\[\d+\]: started)(?=.*outbox 1\[\d+\]: started)/s),
	qr/outbox 1\[\d+\]: started/, 'the daemon started its two outbox roles');

# ==== 1. rateLimit 50/s, burst 50, 2 outbox roles, 1100 rows (22 s of tokens)
my $nr = 1100;
qb_insert_keyed($node, 'r.ev', $nr, 50, 'rk');
is(qb_count($node, "topic = 'r.ev'"), $nr, "rate: $nr rows for r over 50 keys");
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'r.ev' AND state = 'sent'",
	$nr, "rate: all $nr rows of r are sent", timeout => 120);
qb_sink_rate_held($sink_r, $rate, $burst, $nr, 'rate');
my $or = qb_key_order($node, $sink_r, "topic = 'r.ev'");
is($or->{delivered} . '/' . $or->{dups}, "$nr/0", 'rate: every row sent, each once');
is($or->{keys_in_order}, 50, 'rate: all 50 keys in id order') or diag join("\n", @{ $or->{bad} });
is(qb_count($node, "topic = 'r.ev' AND attempt = 1"), $nr, 'rate: every row spent exactly one attempt');

# ==== 2. maxConcurrent 1, answers after 50 ms; an outbox role killed -9 midway
my $nc = 300;
$node->safe_psql('postgres',
	"INSERT INTO queuebox.outbox (topic, key, payload) SELECT 'c.ev', 'ck' || i, jsonb_build_object('seq', i)"
	  . " FROM generate_series(1, $nc) i");
qb_wait_query($node, "SELECT count(*) >= 60 FROM queuebox.outbox WHERE topic = 'c.ev' AND state = 'sent'",
	't', 'one: rows of c flow', timeout => 60);
is(qb_sink_stats($sink_c)->{max_concurrent}, 1, 'one: so far the sink never had two requests at once');
my $victim = qbd_role_pids($d)->{'outbox 0'};
ok($victim, "one: outbox 0 runs (pid $victim)");
kill 'KILL', $victim;
qbd_wait_daemon_log($d, qr/outbox 0 \(pid $victim\) was killed by signal 9/);
# its request in flight still reaches its 50 ms answer at the sink, into a
# closed socket, while another role may send: count from a second on
sleep 1;
HTTP::Tiny->new(timeout => 10)->post("$sink_c->{url}/_sink/reset");
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'c.ev' AND state = 'sent'",
	$nc, "one: after the kill all $nc rows of c are sent (the dead role's place came back)", timeout => 120);
is(qb_sink_stats($sink_c)->{max_concurrent}, 1, 'one: after the kill, again never two requests at once');
my $oc = qb_key_order($node, $sink_c, "topic = 'c.ev'");
is($oc->{delivered}, $nc, "one: all $nc rows were answered 2xx");
note "one: $oc->{dups} rows were sent twice: the request of the killed role, sent again after its lease";
cmp_ok($oc->{dups}, '<=', 1, 'one: at most the killed role\'s one row was sent again');
is(qb_count($node), $nr + $nc, 'every row is still in the outbox');

qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops cleanly');
done_testing();
