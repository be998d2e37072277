# 070_replica_limits.pl
#   A destination's limits across two daemon replicas on one PostgreSQL
#   database (docs/delivery.md, "Limits": kept in the database, in
#   queuebox.destination_limit and destination_limit_place), each replica
#   with two outbox roles:
#   1. rateLimit {perSecond: 50, burst: 50}, 1100 rows (22 s of tokens):
#      from the sink's own request timestamps, no stretch holds more than
#      the bucket allows (+5 %), and past the burst the rate is 50/s within
#      5 % (two replicas each with a limit of its own would send 100/s);
#      each row sent once, every key in order, one attempt each;
#   2. maxConcurrent: 1 against a sink that answers after 50 ms: never two
#      requests at once across the replicas; then the replica whose role
#      holds the place (its claimer's row in destination_limit_place) is
#      killed -9, supervisor and roles: its place stops counting (its
#      claimer's session lock went with it), so the other replica sends
#      every row (with one place held for good, nothing more would be
#      sent), again never two at once from a second after the kill; the
#      rows are counted before and after: none lost;
#   3. a destination with no limit writes nothing in those tables.
#   Waits are bounded polls; no assertion is on the test's own clock.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use HTTP::Tiny;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $rate = 50;
my $burst = 50;
my $node = qbd_node('replica_limits');
my $url = qbd_url($node);
my $sink_r = qb_sink_start(name => 'rep_rate');
my $sink_c = qb_sink_start(name => 'rep_one', delay_ms => 50);
my $sink_f = qb_sink_start(name => 'rep_free');

my $conf = qb_config_yaml(
	outbox => { pollIntervalMs => 100, maxAttempts => 100, claimTimeoutMs => 5000 },
	destinations => {
		r => { type => 'http', baseUrl => $sink_r->{url}, timeoutMs => 2000,
			rateLimit => { perSecond => $rate, burst => $burst } },
		c => { type => 'http', baseUrl => $sink_c->{url}, timeoutMs => 2000, maxConcurrent => 1 },
		f => { type => 'http', baseUrl => $sink_f->{url}, timeoutMs => 2000 },
	},
	routes => [ map { { topicPattern => "$_.**", destination => $_ } } qw(r c f) ],
	database => { url => $url },
	daemon => { outboxWorkers => 2, shutdownGraceMs => 5000 });

my %d;
for my $name (qw(replica_a replica_b))
{
	$d{$name} = qbd_start($node, $conf, name => $name);
	like(qbd_wait_daemon_log($d{$name}, qr/(?=.*outbox 0\[\d+\]: started)(?=.*outbox 1\[\d+\]: started)/s),
		qr/outbox 1\[\d+\]: started/, "$name started its two outbox roles");
}

# ==== 1. rateLimit 50/s, burst 50, two replicas of two roles each
my $nr = 1100;
qb_insert_keyed($node, 'r.ev', $nr, 275, 'rk');
is(qb_count($node, "topic = 'r.ev'"), $nr, "rate: $nr rows for r over 275 keys");
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'r.ev' AND state = 'sent'",
	$nr, "rate: all $nr rows of r are sent", timeout => 120);
qb_sink_rate_held($sink_r, $rate, $burst, $nr, 'rate');
my $or = qb_key_order($node, $sink_r, "topic = 'r.ev'");
is($or->{delivered} . '/' . $or->{dups}, "$nr/0", 'rate: every row sent, each once');
is($or->{keys_in_order}, 275, 'rate: all 275 keys in id order') or diag join("\n", @{ $or->{bad} });
is(qb_count($node, "topic = 'r.ev' AND attempt = 1"), $nr, 'rate: every row spent exactly one attempt');
# every role of both replicas took from this one bucket
is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.destination_limit WHERE destination = 'r'"),
	'1', 'rate: r\'s bucket is one row in the database');

# ==== 2. maxConcurrent 1, answers after 50 ms; the replica holding the place killed -9
my $nc = 300;
my $before = qb_count($node);
$node->safe_psql('postgres',
	"INSERT INTO queuebox.outbox (topic, key, payload) SELECT 'c.ev', 'ck' || i, jsonb_build_object('seq', i)"
	  . " FROM generate_series(1, $nc) i");
is(qb_count($node), $before + $nc, "one: $nc rows added");
qb_wait_query($node, "SELECT count(*) >= 60 FROM queuebox.outbox WHERE topic = 'c.ev' AND state = 'sent'",
	't', 'one: rows of c flow', timeout => 60);
is(qb_sink_stats($sink_c)->{max_concurrent}, 1, 'one: so far the sink never had two requests at once');
cmp_ok($node->safe_psql('postgres', "SELECT count(DISTINCT claimer) FROM queuebox.destination_limit_place WHERE destination = 'c'"),
	'>=', 2, 'one: more than one claimer took part in c\'s places');

# which replica holds c's place: its claimer's lock, its backend's client
# port, the role process on that port
sub place_holder
{
	my $port = $node->safe_psql('postgres', q{
		SELECT a.client_port FROM queuebox.destination_limit_place p
		JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
		  AND ((l.classid::bigint << 32) | l.objid::bigint) = p.claimer
		JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE p.destination = 'c' AND p.held > 0 LIMIT 1});
	return undef unless $port;
	my ($pid) = `ss -tnpH state established '( sport = :$port )'` =~ /pid=(\d+)/;
	return undef unless $pid;
	for my $name (keys %d)
	{
		return $name if grep { $_ == $pid } values %{ qbd_role_pids($d{$name}) };
	}
	return undef;
}
my $victim;
qb_wait_for(sub { defined($victim = place_holder()) }, 'one: a replica\'s role holds c\'s place', timeout => 30);
my ($alive) = grep { $_ ne $victim } keys %d;
note "one: $victim holds the place; it is killed, $alive stays";
qbd_kill9($d{$victim}, "one: $victim killed -9");
# its request in flight still reaches its 50 ms answer at the sink, into a
# closed socket, while the other replica may send: count from a second on
sleep 1;
HTTP::Tiny->new(timeout => 10)->post("$sink_c->{url}/_sink/reset");
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'c.ev' AND state = 'sent'",
	$nc, "one: after the kill all $nc rows of c are sent by $alive (the dead replica's place stopped counting)",
	timeout => 120);
is(qb_sink_stats($sink_c)->{max_concurrent}, 1, 'one: after the kill, again never two requests at once');
my $oc = qb_key_order($node, $sink_c, "topic = 'c.ev'");
is($oc->{delivered}, $nc, "one: all $nc rows were answered 2xx");
note "one: $oc->{dups} rows were sent twice: the killed replica's requests, taken over";
cmp_ok($oc->{dups}, '<=', 2, 'one: at most the killed replica\'s rows in flight were sent again');
is(qb_count($node), $before + $nc, 'one: every row is still in the outbox');

# ==== 3. a destination with no limit pays nothing in the database
my $nf = 200;
qb_insert_keyed($node, 'f.ev', $nf, 20, 'fk');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'f.ev' AND state = 'sent'",
	$nf, "free: all $nf rows of f are sent");
is($node->safe_psql('postgres',
	"SELECT (SELECT count(*) FROM queuebox.destination_limit WHERE destination = 'f')"
	  . " + (SELECT count(*) FROM queuebox.destination_limit_place WHERE destination = 'f')"),
	'0', 'free: f, with no limit, has no row in the limits\' tables');

is(qb_count($node), $nr + $nc + $nf, 'every row is still in the outbox');
is(qb_count($node, "state <> 'sent'"), '0', 'and every one is sent');
qbd_signal($d{$alive}, 'TERM');
is(qbd_wait_exit($d{$alive}, 30), 0, "$alive stops cleanly");
done_testing();
