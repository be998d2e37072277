# 048_netfaults.pl
#   Faults between machines: the daemon, PostgreSQL and the destination on
#   different addresses, joined by veth pairs, with nftables rules in a
#   namespace for the faults.
#
#   The test runs in a user and network namespace of its own (unshare
#   --user --net: no root needed, nothing of the host's network touched).
#   Its namespace holds both clusters, the daemon's sink (10.231.1.3) and
#   the routes; two child namespaces hold the daemon (10.231.1.2, across a
#   veth from PostgreSQL at 10.231.1.1 and its sink at 10.231.1.3) and the
#   extension's destination (10.231.2.2, across a veth from 10.231.2.1).
#
#   Faults, each while rows are being delivered:
#   - a partition without RST (every packet dropped both ways; the
#     connections stay half-open) between the daemon and the database,
#     between the daemon and its destination, and between the extension and
#     its destination.  Each lasts until it has done what it is there for,
#     asserted (a bounded wait: the test fails if it never does), not for a
#     fixed time: to a destination, until attempts time out (timeoutMs 3 s)
#     and the circuit opens (its cooldown 2 s, so the first probe after the
#     partition closes it); to the database, until the daemon finds its
#     connections dead and a reconnect times out, and the server has ended
#     every backend the daemon had.  That partition runs under a second
#     daemon whose URL sets TCP settings of about 4 s (the defaults, about
#     25 s, are checked on the first daemon's connections, and the URL's
#     values on both ends of the second's);
#   - 10 % of the packets lost both ways (nft numgen random), for the daemon
#     (database and destination) and for the extension's destination;
#   - 200 ms of delay, only where the kernel has sch_netem (tc qdisc netem);
#     skipped otherwise.
#   A loss or a delay lasts while rows are left to deliver through it, at
#   most 15 s.
#   Every case counts rows: each one delivered (2xx), each key's rows first
#   delivered in id order (at least once: a row in flight when the fault
#   began may be sent again).  The time from the end of a fault to the first
#   delivery after it is printed, never asserted; the wait fails the test only
#   if delivery never resumes.
#
#   Skipped, with the reason, where a user namespace, a veth pair or an
#   nftables table cannot be made (scripts/setup.sh installs nftables).
use strict;
use warnings;

use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxNetns;
BEGIN { qbn_enter(); }

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(time usleep);
use POSIX qw(WNOHANG);

use QueueBoxTest;
use QueueBoxDaemon;

my $N = 400;

# ---------------------------------------------------------------- network

*sh = \&qbn_sh;
*in_ns = \&qbn_in_ns;

sub fault_on { return qbn_fault_on(@_); }

# fault_off($name): the rules deleted; an ok() that they dropped packets
sub fault_off
{
	my ($name) = @_;
	my ($t, $dropped) = qbn_fault_off($name);
	cmp_ok($dropped, '>', 0, "the fault in namespace $name dropped packets ($dropped)");
	return $t;
}

sh(qw(ip link set lo up));
qbn_ns_new('daemon');
qbn_ns_new('dest');
qbn_veth('daemon', 'qbd0', 'qbd1', [ '10.231.1.1', '10.231.1.3' ], '10.231.1.2');
qbn_veth('dest', 'qbs0', 'qbs1', ['10.231.2.1'], '10.231.2.2');
pass('namespaces: the daemon at 10.231.1.2 (PostgreSQL 10.231.1.1, sink 10.231.1.3), '
	  . 'the extension\'s destination at 10.231.2.2');

# ---------------------------------------------------------------- checks

sub check_rows
{
	my ($node, $sinks, $topic, $n, $what) = @_;
	my $o = qb_key_order($node, $sinks, "topic = '$topic'");
	is($o->{rows}, $n, "$what: all $n rows are in the outbox");
	is($o->{delivered}, $n, "$what: the sink answered 2xx for every row");
	is($o->{keys_first_in_order}, $o->{keys}, "$what: each key's rows were first delivered in id order")
	  or diag explain $o->{bad};
	note "$what: $o->{dups} rows were delivered more than once";
}

# a fault while $n rows of $topic go out: $c{on}->() starts it, $c{off}->()
# ends it; the rows are inserted half before, half during the fault.  How
# long it lasts:
# - until => [ sub, what ]: a partition lasts until the predicate says it has
#   done what the case is there for (attempts timed out and the circuit
#   opened; connections found dead at both ends); an ok() named what, that
#   fails if it never does (bounded wait);
# - otherwise (loss, delay) while rows of $topic are left to deliver through
#   it, at most $c{hold_s} seconds (15): the rows are what it is for.
sub under_fault
{
	my (%c) = @_;
	my ($node, $sink, $topic, $what) = @c{qw(node sink topic what)};
	qb_insert_keyed($node, $topic, $N / 2, 20, "$topic.");
	qb_wait_query($node, "SELECT count(*) >= 20 FROM queuebox.outbox WHERE topic = '$topic' AND state = 'sent'",
		't', "$what: delivery is under way");
	my $t0 = $c{on}->();
	$node->safe_psql('postgres',
		"INSERT INTO queuebox.outbox (topic, key, payload) SELECT '$topic', '$topic.' || (i % 20), "
		  . "jsonb_build_object('seq', i) FROM generate_series($N / 2, $N - 1) i");
	if ($c{until})
	{
		my ($pred, $done) = @{ $c{until} };
		qb_wait_for($pred, "$what: $done", timeout => 120);
	}
	else
	{
		my $deadline = $t0 + ($c{hold_s} // 15);
		usleep(250_000)
		  while time < $deadline && qb_count($node, "topic = '$topic' AND state <> 'sent'") > 0;
	}
	my $t1 = $c{off}->();
	note sprintf('%s: fault from %.1f s to %.1f s', $what, 0, $t1 - $t0);
	qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = '$topic' AND state = 'sent'",
		$N, "$what: every row is sent once the fault ends", timeout => 300);
	my $resume = qb_sink_first_after($sink, $t1);
	if (defined $resume)
	{
		note sprintf('%s: first delivery %.1f s after the fault ended, all %d rows sent %.1f s after it',
			$what, $resume, $N, time - $t1);
	}
	else
	{
		note "$what: every row was delivered during the fault";
	}
	check_rows($node, $sink, $topic, $N, $what);
}

# nft_fault($name, $in_match, $out_match): under_fault's on and off for
# nftables rules in that namespace
sub nft_fault
{
	my ($name, $in, $out) = @_;
	return (on => sub { fault_on($name, $in, $out) }, off => sub { fault_off($name) });
}

my $LOSS = $QBN_LOSS;

# A destination partition lasts until attempts timed out and the circuit
# opened (timeoutMs 3 s, circuitBreaker.failures 10); its cooldown is short
# so that, the partition over, the next probe closes the circuit within 2 s
# (the default 30 s would hold the rows that long after it).
my $BREAKER = { cooldownMs => 2000 };

sub circuit_opened
{
	my ($node) = @_;
	return [ sub { my $st = qb_dest_status($node, 'web'); $st && $st->{state} =~ /open/ },
		'attempts time out and the circuit opens' ];
}

# ---------------------------------------------------------------- the daemon

my $dsink = qb_sink_start(name => 'net_daemon', bind => '10.231.1.3', delay_ms => 50);
is($dsink->{url} =~ m{^http://10\.231\.1\.3:\d+$} ? 1 : 0, 1, 'daemon sink: on 10.231.1.3');
my $db = qbd_node('net_db', conf => "listen_addresses = '127.0.0.1,10.231.1.1'");
$db->append_conf('pg_hba.conf', "host all all 10.231.1.0/24 trust\n");
$db->reload;

my $url = sprintf('postgres://qbd@10.231.1.1:%d/postgres', $db->port);
sub daemon_yaml
{
	my ($u) = @_;
	return qb_config_yaml(
		outbox => { pollIntervalMs => 100, batchSize => 10, claimTimeoutMs => 8000 },
		destinations => {
			web => {
				type => 'http',
				baseUrl => $dsink->{url},
				path => '/d',
				timeoutMs => 3000,
				circuitBreaker => $BREAKER
			} },
		routes => [ { topicPattern => '**', destination => 'web' } ],
		database => { url => $u, connectTimeoutMs => 2000, statementTimeoutMs => 10000 },
		daemon => { outboxWorkers => 2, shutdownGraceMs => 2000 });
}
my $yaml = daemon_yaml($url);
my $r = qbd_run('--config', qbd_write_conf($yaml, 'net'), '--migrate');
is($r->[0], 0, 'daemon: the schema is installed') or diag $r->[2];
my $d = qbd_start($db, $yaml, name => 'net', wrap => [ in_ns('daemon') ]);
qbd_wait_daemon_log($d, qr/outbox 1\[\d+\]: started/);
like($db->safe_psql('postgres',
		q{SELECT string_agg(DISTINCT host(client_addr), ',') FROM pg_stat_activity WHERE usename = 'qbd'}),
	qr/^10\.231\.1\.2$/, 'daemon: connects from 10.231.1.2, its own namespace');

# both ends of the daemon's connections probe an idle peer within $max s:
# the keepalive timers of /proc/net/tcp (timer 2, its ticks at USER_HZ 100;
# the server's end is set by the daemon's session)
sub keepalive_timers
{
	my (@ns) = @_;
	my $pg = sprintf(':%04X', $db->port);
	my @t;
	for my $l (split /\n/, sh(@ns, qw(cat /proc/net/tcp)))
	{
		my @f = split ' ', $l;
		next unless @f > 5 && $f[3] eq '01' && ($f[1] =~ /\Q$pg\E$/ || $f[2] =~ /\Q$pg\E$/);
		next unless "$f[1] $f[2]" =~ /(?:^|\s)0201E70A:/;    # 10.231.1.2, little-endian
		my ($tr, $when) = split /:/, $f[5];
		push @t, hex($when) / 100 if $tr eq '02';    # not one sending now (timer 1)
	}
	return @t;
}
sub check_keepalive
{
	my ($what, $max) = @_;
	my (@daemon_end, @server_end);
	# a role's connection just opened may not have its settings yet (its
	# session sets the server's end): look again, for up to 20 s, until
	# every connection has them
	my $deadline = time + 20;
	while (1)
	{
		@daemon_end = keepalive_timers(in_ns('daemon'));
		@server_end = keepalive_timers();
		last if time >= $deadline
		  || (@daemon_end && @server_end && !grep({ $_ > $max + 0.5 } @daemon_end, @server_end));
		usleep(200_000);
	}
	note "$what: keepalive timers (s): daemon end @daemon_end; server end @server_end";
	ok(@daemon_end > 0 && !grep({ $_ > $max + 0.5 } @daemon_end), "$what: its end of each connection probes within $max s");
	ok(@server_end > 0 && !grep({ $_ > $max + 0.5 } @server_end), "$what: the server's end of each connection probes within $max s");
}
check_keepalive('daemon', 10);

under_fault(node => $db, sink => $dsink, topic => 'net.dest', what => 'daemon <-> destination partition',
	until => circuit_opened($db), nft_fault('daemon', 'ip saddr 10.231.1.3', 'ip daddr 10.231.1.3'));

under_fault(node => $db, sink => $dsink, topic => 'net.loss', what => 'daemon: 10 % packet loss',
	nft_fault('daemon', $LOSS, $LOSS));

SKIP:
{
	# netem is the one way to delay packets this test has (tbf only shapes
	# a rate; an nfqueue program could hold them, but this test has none)
	my ($out, $err) = ('', '');
	my @netem = in_ns('daemon', qw(tc qdisc add dev qbd1 root netem delay 200ms));
	IPC::Run::run(\@netem, '>', \$out, '2>', \$err);
	$err =~ s/\s+$//;
	skip "200 ms delay: sch_netem is not in this kernel (tc: $err)", 5 if $? != 0;
	sh(in_ns('daemon', qw(tc qdisc del dev qbd1 root)));
	under_fault(node => $db, sink => $dsink, topic => 'net.delay', what => 'daemon: 200 ms delay',
		on => sub { sh(@netem); time }, off => sub { sh(in_ns('daemon', qw(tc qdisc del dev qbd1 root))); time });
}

qbd_signal($d, 'TERM');
isnt(qbd_wait_exit($d, 30), undef, 'daemon: stops on SIGTERM');

# The database partition: a daemon whose URL gives its connections shorter
# TCP settings than the defaults checked above (probes after 10 s idle, every
# 5 s, 3 of them; 25 s unacknowledged: about 25 s to find a dead peer), so
# that each end finds the other dead within about 4 s: the same failure (the
# statement waiting on a half-open connection fails, the reconnects time
# out until the partition ends; the server ends its side as soon), in a
# partition of seconds instead of 30 s.  The URL's values must reach both
# ends (docs/daemon.md "A dead peer").
my $tcp = 'keepalives_idle=2&keepalives_interval=1&keepalives_count=2&tcp_user_timeout=4000';
my $d2 = qbd_start($db, daemon_yaml("$url?$tcp"), name => 'net_tcp', wrap => [ in_ns('daemon') ]);
qbd_wait_daemon_log($d2, qr/outbox 1\[\d+\]: started/);
check_keepalive('daemon, TCP settings from its URL', 2);

# the server's backends of the daemon's connections
my $backends = sub {
	return grep { $_ ne '' } split /\n/, $db->safe_psql('postgres',
		q{SELECT pid FROM pg_stat_activity WHERE usename = 'qbd' AND client_addr = '10.231.1.2' ORDER BY pid});
};
my ($off, @before);
my %db_nft = nft_fault('daemon', 'ip saddr 10.231.1.1', 'ip daddr 10.231.1.1');
under_fault(node => $db, sink => $dsink, topic => 'net.db', what => 'daemon <-> database partition',
	on => sub { $off = -s $d2->{log}; @before = $backends->(); $db_nft{on}->() },
	off => $db_nft{off},
	until => [
		sub {
			my $log = qbd_log($d2, $off);
			my %left = map { $_ => 1 } $backends->();
			return @before && $log =~ /Connection timed out/ && $log =~ /database unreachable/
			  && !grep { $left{$_} } @before;
		},
		'the daemon finds its connections dead and fails to reconnect; the server ends each of its backends'
	]);
my $log = qbd_log($d2, $off);
note "daemon log during the database partition:\n" . join("\n", grep { /unreachable|connect|lost|timeout/i } split /\n/, $log);
ok(kill(0, $d2->{pid}), 'daemon <-> database partition: the daemon still runs');

qbd_signal($d2, 'TERM');
isnt(qbd_wait_exit($d2, 30), undef, 'daemon, TCP settings from its URL: stops on SIGTERM');

# ---------------------------------------------------------------- the extension

my $esink = qb_sink_start(name => 'net_ext', bind => '10.231.2.2', delay_ms => 50, wrap => [ in_ns('dest') ]);
my $node = qb_node('net_ext');
qb_configure(
	$node,
	qb_config_yaml(
		outbox => { batchSize => 10, claimTimeoutMs => 8000 },
		destinations => {
			web => {
				type => 'http',
				baseUrl => $esink->{url},
				path => '/e',
				timeoutMs => 3000,
				circuitBreaker => $BREAKER
			} },
		routes => [ { topicPattern => '**', destination => 'web' } ]));

under_fault(node => $node, sink => $esink, topic => 'net.ext', what => 'extension <-> destination partition',
	until => circuit_opened($node), nft_fault('dest', 'iifname "qbs1"', 'oifname "qbs1"'));

under_fault(node => $node, sink => $esink, topic => 'net.extloss', what => 'extension: 10 % packet loss',
	nft_fault('dest', $LOSS, $LOSS));

$node->stop;
qb_sink_stop($esink);
qb_sink_stop($dsink);
$db->stop;
done_testing();
