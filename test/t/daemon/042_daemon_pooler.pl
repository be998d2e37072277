# 042_daemon_pooler.pl
#   queuebox-mssqld with database.listen: true, straight to PostgreSQL and
#   through PgBouncer in transaction mode on loopback (issue 21): at start
#   the supervisor checks that a NOTIFY reaches a LISTEN.  Directly it does,
#   silently; through the pooler it does not, so the daemon warns, saying
#   why and what to do, and polls (with statements the pooler can carry):
#   every row is still delivered.  Directly each outbox role and the relay
#   hold a claimer lock; through the pooler none does and the claims record
#   no claimer (takeover by lease only, issue 24).  Also the process titles
#   of each role (/proc/<pid>/cmdline: "queuebox-mssqld: outbox 0", ...).
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $pgbouncer = '/usr/sbin/pgbouncer';
plan skip_all => "no $pgbouncer (scripts/setup.sh installs Debian's pgbouncer)" unless -x $pgbouncer;

my $node = qbd_node('pooler');
my $sink = qb_sink_start(name => 'pooler');

sub conf
{
	my ($url, $poll) = @_;
	return qb_config_yaml(
		outbox => { pollIntervalMs => $poll },
		destinations => { sink => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 2000 } },
		routes => [ { topicPattern => 'orders.**', destination => 'sink' } ],
		database => { url => $url, listen => 'true', idlePollMaxMs => 500 },
		daemon => { outboxWorkers => 2, shutdownGraceMs => 5000 });
}

sub sent { return $node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE topic = '$_[0]' AND state = 'sent'"); }

# cmdline($pid): what ps shows, from /proc/<pid>/cmdline (NULs as spaces, trailing ones dropped)
sub cmdline
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/cmdline") or return '';
	local $/;
	my $c = <$fh>;
	close $fh;
	$c =~ s/\0+$//;
	$c =~ s/\0/ /g;
	return $c;
}

# ---- directly: notifications arrive, no warning; the process titles
# an hour-long poll: delivery depends on the NOTIFY
my $d = qbd_start($node, conf(qbd_url($node), 3600000), name => 'direct');
my $log = qbd_wait_daemon_log($d, qr/outbox 0\[\d+\]: started.*outbox 1\[\d+\]: started|outbox 1\[\d+\]: started.*outbox 0\[\d+\]: started/s);
like($log, qr/outbox 1\[\d+\]: started/, 'direct: the roles start');
# the roles LISTEN before they say started; insert until a NOTIFY delivers one
qb_wait_for(sub {
	$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.direct', '{}')});
	usleep(200_000);
	sent('orders.direct') > 0;
}, 'direct: with an hour-long poll, a committed row is delivered (LISTEN works)');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.direct2', '{}' FROM generate_series(1, 10)});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.direct2' AND state = 'sent'}, '10',
	'direct: every later commit is delivered at once (no poll)', timeout => 30);
$log = qbd_log($d);
unlike($log, qr/did not arrive|could not check that notifications arrive/, 'direct: no warning about notifications');

# directly, each outbox role and the relay hold their claimer lock
is($node->safe_psql('postgres', q{SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1}),
	'3', 'direct: the two outbox roles and the relay each hold a claimer lock (takeover)');
is(cmdline($d->{pid}), 'queuebox-mssqld: supervisor', 'ps: the supervisor is "queuebox-mssqld: supervisor"');
my $roles = qbd_role_pids($d);
is_deeply([ sort keys %$roles ], [ 'ingress', 'outbox 0', 'outbox 1', 'relay' ], 'ps: every role is a child of the supervisor');
is(cmdline($roles->{$_}), "queuebox-mssqld: $_", "ps: the $_ role is \"queuebox-mssqld: $_\"") for sort keys %$roles;
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'direct: the daemon stops');

# ---- PgBouncer in transaction mode
my $bdir = PostgreSQL::Test::Utils::tempdir('pgbouncer');
my $bport = qb_free_port();
my $node_port = $node->port;
open(my $fh, '>', "$bdir/userlist.txt") or die $!;
print $fh qq{"qbd" ""\n};
close $fh;
open($fh, '>', "$bdir/pgbouncer.ini") or die $!;
print $fh <<"EOC";
[databases]
postgres = host=127.0.0.1 port=$node_port dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = trust
auth_file = $bdir/userlist.txt
pool_mode = transaction
default_pool_size = 4
ignore_startup_parameters = extra_float_digits
logfile = $bdir/pgbouncer.log
pidfile = $bdir/pgbouncer.pid
EOC
close $fh;
my $bouncer = IPC::Run::start([ $pgbouncer, "$bdir/pgbouncer.ini" ], '>', "$bdir/stdout", '2>&1');
my $burl = qbd_url($node, port => $bport);
qb_wait_for(sub {
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'psql', '-X', '-At', '-d', $burl, '-c', 'SELECT 1' ], '>', \$out, '2>', \$err);
	$out eq "1\n";
}, 'PgBouncer answers', timeout => 30);

$d = qbd_start($node, conf($burl, 100), name => 'pooled');
$log = qbd_wait_daemon_log($d, qr/did not arrive/);
like($log, qr/WARNING supervisor\[\d+\]: database\.listen: a NOTIFY sent to check it did not arrive within 3000 ms: database\.url goes through a connection pooler in transaction or statement mode/,
	'pooled: the supervisor warns that notifications do not arrive');
like($log, qr/the roles poll instead .* Connect the daemon to the database directly or through a pooler in session mode, or set database\.listen: false/,
	'pooled: the warning says what the daemon does and what to do');
$log = qbd_wait_daemon_log($d, qr/outbox 1\[\d+\]: started/);
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.pooled', '{}' FROM generate_series(1, 50)});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.pooled' AND state = 'sent'}, '50',
	'pooled: every row is delivered by polling through the pooler');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.pooled2', '{}' FROM generate_series(1, 20)});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.pooled2' AND state = 'sent'}, '20',
	'pooled: and later rows too');
# takeover needs a session lock the pooler would keep on a server
# connection: through it the claims record no claimer (the lease alone)
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload)
	SELECT 'orders.pooled_slow', '{"_sink": {"delay_ms": 1500}}' FROM generate_series(1, 3)});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.pooled_slow' AND state = 'processing'},
	'3', 'pooled: slow rows are processing');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.pooled_slow' AND claimer IS NOT NULL}),
	'0', 'pooled: the claims record no claimer (takeover by lease only)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'}), '0',
	'pooled: no role holds a claimer lock on a pooled server connection');
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.pooled_slow' AND state = 'sent'}, '3',
	'pooled: the slow rows are delivered');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE state <> 'sent'}), '0', 'no row is left behind');
$log = qbd_log($d);
unlike($log, qr/prepared statement|ERROR (?:outbox|relay|ingress)/, 'pooled: no role failed a statement');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'pooled: the daemon stops');

$bouncer->kill_kill;
done_testing();
