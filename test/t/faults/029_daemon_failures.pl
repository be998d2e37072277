# 029_daemon_failures.pl
#   queuebox-mssqld when things break: kill -9 of an outbox role and of the
#   whole daemon mid-delivery, a PostgreSQL restart while it runs, a wrong
#   password and an unreachable server, two daemons on one database, and a
#   down destination beside a healthy one with a hot key, and a breaker
#   whose count a success resets.  Every case counts
#   rows: nothing lost, per-key order kept (a row may be delivered twice
#   after a kill: at least once).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $node = qbd_node('daemon_failures');
my $sink = qb_sink_start(name => 'failures', delay_ms => 20);

sub conf
{
	my (%o) = @_;
	return qb_config_yaml(
		outbox => { pollIntervalMs => 100, claimTimeoutMs => 4000, batchSize => 20, %{ $o{outbox} // {} } },
		destinations => $o{destinations} // {
			sink => { type => 'http', baseUrl => $sink->{url}, path => '/f', timeoutMs => 3000 } },
		routes => $o{routes} // [ { topicPattern => '**', destination => 'sink' } ],
		database => { url => $o{url} // qbd_url($node), connectTimeoutMs => 2000, %{ $o{database} // {} } },
		daemon => { outboxWorkers => 2, shutdownGraceMs => 5000 });
}

sub all_final
{
	my ($where, $n, $what) = @_;
	qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE state IN ('sent', 'dead') AND $where",
		$n, $what, timeout => 120);
}

sub check_order
{
	my ($where, $n, $what) = @_;
	my $o = qb_key_order($node, $sink, $where);
	is($o->{delivered}, $n, "$what: every row delivered");
	is($o->{keys_in_order}, $o->{keys}, "$what: every key in id order") or diag explain $o->{bad};
	return $o;
}

my $r = qbd_run('--config', qbd_write_conf(conf(), 'migrate'), '--migrate');
is($r->[0], 0, 'the schema is installed') or diag $r->[2];

# ---- kill -9 of an outbox role mid-delivery: restarted, nothing lost
my $d = qbd_start($node, conf(), name => 'kill_role');
qbd_wait_daemon_log($d, qr/outbox 1\[\d+\]: started/);
qb_insert_keyed($node, 'kill.role', 400, 20, 'kr');
qb_wait_query($node, q{SELECT count(*) > 40 FROM queuebox.outbox WHERE topic = 'kill.role' AND state = 'sent'},
	't', 'kill -9 role: delivery is under way');
my $pids = qbd_role_pids($d);
ok($pids->{'outbox 0'}, 'kill -9 role: outbox 0 has a process');
my $off = -s $d->{log};
kill 'KILL', $pids->{'outbox 0'};
my $log = qbd_wait_daemon_log($d, qr/outbox 0\[\d+\]: started/, $off);
like($log, qr/outbox 0 \(pid $pids->{'outbox 0'}\) was killed by signal 9; restarting it in \d+ ms/,
	'kill -9 role: the supervisor logs the death and restarts the role');
all_final(q{topic = 'kill.role'}, 400, 'kill -9 role: every row reaches a final state (the lease returns what it held)');
is(qb_count($node, q{topic = 'kill.role' AND state <> 'sent'}), '0', 'kill -9 role: every row is sent');
check_order(q{topic = 'kill.role'}, 400, 'kill -9 role');
isnt(qbd_role_pids($d)->{'outbox 0'}, $pids->{'outbox 0'}, 'kill -9 role: outbox 0 runs as a new process');

# ---- a PostgreSQL restart while the daemon runs: the roles reconnect
qb_insert_keyed($node, 'pg.restart', 400, 20, 'pr');
qb_wait_query($node, q{SELECT count(*) > 20 FROM queuebox.outbox WHERE topic = 'pg.restart' AND state = 'sent'},
	't', 'server restart: delivery is under way');
$off = -s $d->{log};
$node->restart;
all_final(q{topic = 'pg.restart'}, 400, 'server restart: every row reaches a final state');
is(qb_count($node, q{topic = 'pg.restart' AND state <> 'sent'}), '0', 'server restart: every row is sent');
check_order(q{topic = 'pg.restart'}, 400, 'server restart');
$log = qbd_log($d, $off);
unlike($log, qr/restarting it in/, 'server restart: no role died, they reconnected');
like($log, qr/WARNING outbox \d\[\d+\]: .*(terminat|connection|unreachable)/i,
	'server restart: a role logs the lost connection');

# ---- kill -9 of the whole daemon: its roles follow, a new daemon finishes
qb_insert_keyed($node, 'kill.all', 400, 20, 'ka');
qb_wait_query($node, q{SELECT count(*) > 40 FROM queuebox.outbox WHERE topic = 'kill.all' AND state = 'sent'},
	't', 'kill -9 daemon: delivery is under way');
$pids = qbd_role_pids($d);
kill 'KILL', $d->{pid};
qbd_wait_exit($d, 10);
qb_wait_for(sub { !grep { kill(0, $_) } values %$pids },
	'kill -9 daemon: every role process exits with its supervisor (none left to race a new daemon)');
$d = qbd_start($node, conf(), name => 'after_kill');
all_final(q{topic = 'kill.all'}, 400, 'kill -9 daemon: a new daemon finishes every row');
is(qb_count($node, q{topic = 'kill.all' AND state <> 'sent'}), '0', 'kill -9 daemon: every row is sent');
check_order(q{topic = 'kill.all'}, 400, 'kill -9 daemon');

# ---- two daemons on one database share the work.  Keyed rows stay with
# the worker that holds their key's chain (the settle promotes and claims
# the next row), so the sharing shows on rows without a key.
# two new daemons, so their stop lines count these rows only
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'kill -9 daemon: the daemon that finished stops');
# both woken at the commit (LISTEN): an idle daemon's stretched poll would
# let the other take every row before it looks
$d = qbd_start($node, conf(database => { listen => 'true' }), name => 'first');
my $d2 = qbd_start($node, conf(database => { listen => 'true' }), name => 'second');
qbd_wait_daemon_log($_, qr/outbox 1\[\d+\]: started/) for $d, $d2;
my %off = (first => 0, second => 0);
qb_insert_keyed($node, 'two.daemons', 1000, 50, 'td');
$node->safe_psql('postgres',
	q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'two.unkeyed', jsonb_build_object('i', i) FROM generate_series(1, 3000) i});
all_final(q{topic LIKE 'two.%'}, 4000, 'two daemons: every row reaches a final state');
my $o = check_order(q{topic = 'two.daemons'}, 1000, 'two daemons');
is($o->{dups}, 0, 'two daemons: no keyed row is delivered twice');
is(qb_key_order($node, $sink, q{topic = 'two.unkeyed'})->{dups}, 0, 'two daemons: no unkeyed row is delivered twice');
my %sent;
for my $dd ([$d, 'first'], [$d2, 'second'])
{
	qbd_signal($dd->[0], 'TERM');
	is(qbd_wait_exit($dd->[0], 30), 0, "two daemons: the $dd->[1] stops cleanly");
	my $l = qbd_log($dd->[0], $off{ $dd->[1] });
	$sent{$dd->[1]} += $1 while $l =~ /outbox \d\[\d+\]: stopped: \d+ claims, (\d+) sent/g;
}
ok($sent{first} > 0 && $sent{second} > 0, "two daemons: both sent rows ($sent{first} and $sent{second})");
is($sent{first} + $sent{second}, 4000, 'two daemons: together they sent each row once');

# ---- a down destination beside a healthy one, with a hot key
my $down = qb_free_port();
$d = qbd_start($node, conf(
	destinations => {
		down => { type => 'http', baseUrl => "http://127.0.0.1:$down", timeoutMs => 500,
			circuitBreaker => { failures => 3, cooldownMs => 600000 } },
		sink => { type => 'http', baseUrl => $sink->{url}, path => '/f', timeoutMs => 3000 } },
	routes => [ { topicPattern => 'down.*', destination => 'down' }, { topicPattern => '**', destination => 'sink' } ],
	outbox => { maxAttempts => 1000 }), name => 'isolation');
qbd_wait_daemon_log($d, qr/outbox 1\[\d+\]: started/);
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload) SELECT 'down.x', 'dk' || (i % 5), '{}' FROM generate_series(1, 300) i;
	INSERT INTO queuebox.outbox (topic, key, payload) SELECT 'healthy.hot', 'hot', jsonb_build_object('i', i) FROM generate_series(1, 200) i;
	INSERT INTO queuebox.outbox (topic, key, payload) SELECT 'healthy.cold', 'c' || (i % 50), '{}' FROM generate_series(1, 500) i;
});
all_final(q{topic LIKE 'healthy.%'}, 700, 'down destination: the healthy destination delivers all its rows, hot key included');
check_order(q{topic LIKE 'healthy.%'}, 700, 'down destination: healthy rows');
qb_wait_query($node, q{SELECT state FROM queuebox.destination_status() WHERE destination = 'down'}, 'open',
	'down destination: its circuit is open');
is(qb_count($node, q{topic = 'down.x' AND state = 'dead'}), '0', 'down destination: its rows are not spent (none dead)');
is(qb_count($node, q{topic = 'down.x' AND state IN ('pending', 'processing')}), '300', 'down destination: its rows wait');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'down destination: the daemon stops');
is(qb_count($node, q{topic = 'down.x' AND state = 'pending'}), '300', 'down destination: after the stop every row is pending again');

# ---- a success resets the breaker's count (docs/delivery.md): six
# messages, one at a time, each failing once then succeeding, never open a
# circuit of 3 failures (the engine once skipped a success's tally while
# the circuit was closed: the count grew until it opened)
$d = qbd_start($node, conf(
	destinations => {
		flaky => { type => 'http', baseUrl => $sink->{url}, path => '/flaky', timeoutMs => 3000,
			circuitBreaker => { failures => 3, cooldownMs => 600000 } } },
	routes => [ { topicPattern => 'flaky.*', destination => 'flaky' } ],
	outbox => { maxAttempts => 10, backoff => { initialMs => 50, maxMs => 100 } }), name => 'reset');
qbd_wait_daemon_log($d, qr/outbox 1\[\d+\]: started/);
my @counts;
for my $i (1 .. 6)
{
	qb_insert_keyed($node, "flaky.e$i", 1, 1, "fl$i", '{"fail": 1}');
	all_final("topic = 'flaky.e$i'", 1, "breaker reset: message $i is settled");
	my $fs = qb_dest_status($node, 'flaky');
	push @counts, "$fs->{state}/$fs->{failures}";
}
is(join(' ', @counts), join(' ', ('closed/0') x 6), 'breaker reset: after each success the circuit is closed, no failure counted');
is(qb_count($node, q{topic LIKE 'flaky.%' AND state = 'sent' AND attempt = 2}), '6',
	'breaker reset: each message was sent at its second attempt');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'breaker reset: the daemon stops');

# ---- a wrong password: a clear error, retried with a backoff, no crash loop
$d = qbd_start($node, conf(url => qbd_url($node, user => 'qbdpw', password => 'wrong-password')), name => 'badpw');
sleep 6;
$log = qbd_log($d);
like($log, qr/ERROR supervisor\[\d+\]: could not connect to postgres:\/\/qbdpw:\*\*\*\@127\.0\.0\.1:\d+\/postgres: .*password authentication failed for user "qbdpw"; check the user and the password in database\.url .*; trying again in 1000 ms$/m,
	'wrong password: the error names the user and the server, not the password, and says what to check');
unlike($log, qr/wrong-password/, 'wrong password: the password is never logged');
my $tries = () = $log =~ /could not connect/g;
ok($tries >= 2 && $tries <= 4, "wrong password: retried with a backoff ($tries tries in 6 s)");
unlike($log, qr/started/, 'wrong password: no role starts before the database is reachable');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 10), 0, 'wrong password: SIGTERM still stops it');

# the right password works (qbdpw may use the schema qbd made: its member)
$node->safe_psql('postgres', 'GRANT qbd TO qbdpw');
$d = qbd_start($node, conf(url => qbd_url($node, user => 'qbdpw', password => 'right-password')), name => 'goodpw');
like(qbd_wait_daemon_log($d, qr/outbox 0\[\d+\]: started/), qr/outbox 0\[\d+\]: started/, 'the right password connects');
qbd_signal($d, 'TERM');
qbd_wait_exit($d, 30);

# an unreachable server: refused, retried
my $nowhere = qb_free_port();
$d = qbd_start($node, conf(url => "postgres://qbd\@127.0.0.1:$nowhere/postgres"), name => 'unreachable');
$log = qbd_wait_daemon_log($d, qr/trying again in 2000 ms/, 0, timeout => 15);
like($log, qr/could not connect to postgres:\/\/qbd\@127\.0\.0\.1:$nowhere\/postgres: .*(refused|Connection)/,
	'unreachable server: the error says so');
like($log, qr/trying again in 1000 ms.*trying again in 2000 ms/s, 'unreachable server: the retries back off');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 10), 0, 'unreachable server: SIGTERM stops it');

# ---- libpq's options pass through the URL: sslmode=require against a
# server without TLS is libpq's own refusal, logged and retried
$d = qbd_start($node, conf(url => qbd_url($node) . '?sslmode=require&application_name=ignored'), name => 'tls');
$log = qbd_wait_daemon_log($d, qr/trying again in 1000 ms/, 0, timeout => 15);
like($log, qr/could not connect to postgres:\/\/qbd\@127\.0\.0\.1:\d+\/postgres\?sslmode=require&application_name=ignored: .*SSL/,
	'sslmode=require in the URL reaches libpq (the server has no TLS: refused, and said so)');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 10), 0, 'sslmode=require: SIGTERM stops it');

done_testing();
