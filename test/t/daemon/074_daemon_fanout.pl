# 074_daemon_fanout.pl
#   Fan-out with queuebox-mssqld on PostgreSQL (docs/delivery.md,
#   "Fan-out"), two outbox roles:
#   1. the daemon enables its outbox_fanout trigger only while a route has
#      several destinations, and writes config_route.fanout;
#   2. one INSERT per row to two HTTP destinations: each row reaches both
#      once, with one X-Message-Id, every key in order at each; the outbox
#      holds each row and one copy;
#   3. while one destination answers 500, the other gets every row of the
#      same keys, in order; then the first gets them all, in order;
#   4. a reload switches the trigger off and on; a row inserted while it
#      was off is copied all the same at its claim, in its key's order;
#   5. a kill -9 of a role mid-run loses nothing and copies nothing twice.
#   Waits are bounded polls; no assertion is on the test's own clock.
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $node = qbd_node('daemon_fan');
my $url = qbd_url($node);
my $sink_a = qb_sink_start(name => 'dfan_a');
my $sink_b = qb_sink_start(name => 'dfan_b');
my $http = HTTP::Tiny->new(timeout => 10);

my %config = (
	outbox => { pollIntervalMs => 100, maxAttempts => 1000, claimTimeoutMs => 5000,
		backoff => { initialMs => 20, maxMs => 100 } },
	destinations => {
		a => { type => 'http', baseUrl => $sink_a->{url}, path => '/a', timeoutMs => 2000 },
		b => { type => 'http', baseUrl => $sink_b->{url}, path => '/b', timeoutMs => 2000,
			circuitBreaker => { failures => 100000 } },
	},
	routes => [
		{ topicPattern => 'fan.**', destinations => [qw(a b)] },
		{ topicPattern => 'one.**', destination => 'a' },
	],
	database => { url => $url },
	daemon => { outboxWorkers => 2, shutdownGraceMs => 5000 });
my $d = qbd_start($node, qb_config_yaml(%config), name => 'dfan');
like(qbd_wait_daemon_log($d, qr/(?=.*outbox 0\[\d+\]: started)(?=.*outbox 1\[\d+\]: started)/s),
	qr/outbox 1\[\d+\]: started/, 'the daemon started its two outbox roles');

# ==== 1. the trigger and the routes' table
is($node->safe_psql('postgres',
	"SELECT tgenabled <> 'D' FROM pg_trigger WHERE tgname = 'outbox_fanout'"),
	't', 'the fan-out trigger is on while a route fans out');
is($node->safe_psql('postgres',
	'SELECT string_agg(destination || \'=\' || fanout, \';\' ORDER BY position) FROM queuebox.config_route'),
	'a, b=true;a=false', 'config_route names every destination and says which route fans out');
is($node->safe_psql('postgres', "SELECT queuebox.route_of('fan.x')"), 'a, b', 'route_of names both');

# the rows of each key at one sink, in the order it answered 2xx
sub seq_at
{
	my ($sink) = @_;
	my (%seq, %n);
	for my $r (@{ qb_sink_requests($sink) })
	{
		next unless $r->{status} >= 200 && $r->{status} < 300;
		my $b = decode_json($r->{body});
		# the first answer of each message: a kill -9 may repeat a request
		push @{ $seq{ $b->{k} } }, $b->{n} unless $n{ $r->{mid} }++;
	}
	return (\%seq, \%n);
}

# how many of the keys $prefix1 .. $prefixN have 1 .. $per in order
sub keys_in_order
{
	my ($seq, $prefix, $nkeys, $per) = @_;
	return qb_seq_in_order($seq, [ map { "$prefix$_" } 1 .. $nkeys ], $per);
}

sub insert_rows
{
	my ($topic, $prefix, $nkeys, $per) = @_;
	$node->safe_psql('postgres',
		"INSERT INTO queuebox.outbox (topic, key, payload) SELECT '$topic', '$prefix' || k,"
		  . " jsonb_build_object('k', '$prefix' || k, 'n', n)"
		  . " FROM generate_series(1, $per) n, generate_series(1, $nkeys) k ORDER BY n, k");
	return;
}

# ==== 2. two destinations, one INSERT each
insert_rows('fan.created', 'f', 4, 10);
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'fan.created' AND state = 'sent'",
	80, 'every row and its copy are sent', timeout => 90);
is(qb_count($node, "topic = 'fan.created'"), 80, 'the outbox holds each row and one copy');
my ($sa, $na) = seq_at($sink_a);
my ($sb, $nb) = seq_at($sink_b);
is(keys_in_order($sa, 'f', 4, 10), 4, 'a: every key in order');
is(keys_in_order($sb, 'f', 4, 10), 4, 'b: every key in order');
is(join('/', scalar(grep { $nb->{$_} } keys %$na), scalar(keys %$na), scalar(keys %$nb)), '40/40/40',
	'each sink saw the same 40 message ids');
is(scalar(grep { $_ != 1 } values(%$na), values(%$nb)), 0, 'each message once at each (no kill yet)');

# ==== 3. a failing destination holds nothing at the other
is($http->post("$sink_b->{url}/_sink/fault",
	{ content => '{"status": 500}', headers => { 'content-type' => 'application/json' } })->{status},
	200, 'b answers 500 from now on');
insert_rows('fan.paid', 'p', 3, 5);
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'fan.paid' AND destination = 'a' AND state = 'sent'",
	15, 'a gets every row while b fails', timeout => 60);
is($node->safe_psql('postgres',
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'fan.paid' AND destination = 'b' AND state = 'sent'"),
	'0', 'b has none yet');
($sa) = seq_at($sink_a);
is(keys_in_order($sa, 'p', 3, 5), 3, 'a: the keys in order');
is($http->post("$sink_b->{url}/_sink/fault",
	{ content => '{}', headers => { 'content-type' => 'application/json' } })->{status}, 200, 'b answers again');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'fan.paid' AND state = 'sent'",
	30, 'b gets them all', timeout => 90);
($sb) = seq_at($sink_b);
is(keys_in_order($sb, 'p', 3, 5), 3, 'b: the keys in order after its failures');

# a reload: the file rewritten, then SIGHUP
sub reload
{
	my ($yaml) = @_;
	open(my $fh, '>', $d->{conf}) or die "$d->{conf}: $!";
	print $fh $yaml;
	close $fh;
	qbd_signal($d, 'HUP');
	return;
}

# ==== 4. a reload switches the trigger; rows inserted while it was off
# are copied all the same, at their claim, in their key's order
reload(qb_config_yaml(%config, routes => [ { topicPattern => 'fan.**', destination => 'a' } ]));
qb_wait_for(sub { $node->safe_psql('postgres',
	"SELECT tgenabled = 'D' FROM pg_trigger WHERE tgname = 'outbox_fanout'") eq 't' },
	'a reload with no fan-out route switches the trigger off', timeout => 30);
reload(qb_config_yaml(%config));
qb_wait_for(sub { $node->safe_psql('postgres',
	"SELECT tgenabled <> 'D' FROM pg_trigger WHERE tgname = 'outbox_fanout'") eq 't' },
	'a reload with the fan-out route switches it on again', timeout => 30);
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');
$node->safe_psql('postgres', 'ALTER TABLE queuebox.outbox DISABLE TRIGGER outbox_fanout');
insert_rows('fan.late', 'l', 2, 4);
is(qb_count($node, "topic = 'fan.late' AND origin IS NOT NULL"), '0', 'rows inserted with the trigger off are not marked');
$d = qbd_start($node, qb_config_yaml(%config), name => 'dfan2');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'fan.late' AND state = 'sent'",
	16, 'the restarted daemon copies the unmarked rows at their claim and sends all', timeout => 90);
($sa) = seq_at($sink_a);
($sb) = seq_at($sink_b);
is(keys_in_order($sa, 'l', 2, 4) . '/' . keys_in_order($sb, 'l', 2, 4), '2/2', 'both: the keys in order');

# ==== 5. kill -9 of a role mid-run
my $before = qb_outbox_count($node);
insert_rows('fan.crash', 'c', 20, 10);
qb_wait_query($node, "SELECT count(*) > 20 FROM queuebox.outbox WHERE topic = 'fan.crash' AND state = 'sent'",
	't', 'crash: rows flow', timeout => 60);
my $victim = qbd_role_pids($d)->{'outbox 0'};
ok($victim && kill('KILL', $victim), "crash: outbox 0 (pid $victim) killed");
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'fan.crash' AND state = 'sent'",
	400, 'crash: every row and copy sent after the role is back', timeout => 120);
is(qb_outbox_count($node), $before + 400, 'crash: rows counted after: 200 rows and 200 copies, none twice');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM (SELECT message_id, destination FROM queuebox.outbox WHERE topic = 'fan.crash'"
	  . ' GROUP BY 1, 2 HAVING count(*) > 1) x'), '0', 'crash: one delivery per message and destination');
($sa) = seq_at($sink_a);
($sb) = seq_at($sink_b);
is(keys_in_order($sa, 'c', 20, 10) . '/' . keys_in_order($sb, 'c', 20, 10), '20/20',
	'crash: every key in order at both, by each message\'s first answer')
  or diag explain [ map { "c$_: @{ $sa->{\"c$_\"} // [] } | @{ $sb->{\"c$_\"} // [] }" } 1 .. 20 ];

qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');
done_testing();
