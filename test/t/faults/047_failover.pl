# 047_failover.pl
#   A streaming standby takes over, for the extension and for the daemon.
#   - Extension: a standby made by pg_basebackup (-R) with queuebox in
#     shared_preload_libraries runs no QueueBox process and sends nothing
#     while in recovery; the primary is stopped (immediate) mid-delivery,
#     the standby promoted, and it delivers the rest.
#   - Daemon: queuebox-mssqld with libpq's host list (primary, standby;
#     target_session_attrs=read-write) goes on with the promoted standby
#     when the primary is stopped (immediate) mid-delivery.
#   Every case counts the rows on the new primary and the sink's 2xx: none
#   lost, the first delivery of each key's rows in id order (rows in flight
#   on the old primary are sent again: at least once).  The time from the
#   promotion to the first new delivery is printed, never asserted.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $N = 600;

# the sink's 2xx for rows of $topic on $node, every row and key checked
sub check_delivery
{
	my ($node, $sink, $topic, $what) = @_;
	my $o = qb_key_order($node, $sink, "topic = '$topic'");
	is($o->{rows}, $N, "$what: the new primary has all $N rows");
	is($o->{delivered}, $N, "$what: the sink answered 2xx for every row");
	is($o->{keys_first_in_order}, $o->{keys}, "$what: each key's rows were first delivered in id order")
	  or diag explain $o->{bad};
	note "$what: $o->{dups} rows were delivered more than once (in flight at the failover)";
}

# fail_over($old, $new, $sink, $topic, $what, $in_recovery): stop $old
# (immediate) mid-delivery, run $in_recovery (checks on the standby still in
# recovery), promote $new, wait until it has every row sent, and count
sub fail_over
{
	my ($old, $new, $sink, $topic, $what, $in_recovery) = @_;
	$old->stop('immediate');
	my $sent_before = scalar grep { $_->{status} < 300 } @{ qb_sink_requests($sink) };
	note "$what: the sink had $sent_before 2xx when the primary stopped";
	cmp_ok($sent_before, '<', $N, "$what: the primary stopped before delivering every row");
	$in_recovery->($sent_before) if $in_recovery;
	my $t_promote = time;
	$new->promote;
	qb_wait_query($new, "SELECT count(*) FROM queuebox.outbox WHERE topic = '$topic' AND state = 'sent'",
		$N, "$what: every row is delivered after the promotion", timeout => 180);
	my $resume = qb_sink_first_after($sink, $t_promote);
	note sprintf('%s: first delivery %.1f s after the promotion, all %d rows sent %.1f s after it',
		$what, $resume // -1, $N, time - $t_promote);
	ok(defined $resume, "$what: delivery resumed after the promotion");
	is(qb_count($new, "topic = '$topic' AND state <> 'sent'"), '0',
		"$what: no row left pending, processing or dead");
	check_delivery($new, $sink, $topic, $what);
}

# ---------------------------------------------------------------- extension
my $sink = qb_sink_start(name => 'failover_ext', delay_ms => 100);
my $primary = qb_node('ext_primary', init => { allows_streaming => 1 });
qb_configure(
	$primary,
	qb_config_yaml(
		outbox => { batchSize => 10, claimTimeoutMs => 3000 },
		destinations => {
			web => { type => 'http', baseUrl => $sink->{url}, path => '/f', timeoutMs => 2000 } },
		routes => [ { topicPattern => '**', destination => 'web' } ]));
$primary->backup('ext_backup');
my $standby = PostgreSQL::Test::Cluster->new('ext_standby');
$standby->init_from_backup($primary, 'ext_backup', has_streaming => 1);
$standby->start;

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'extension: the standby is in recovery');
like($standby->safe_psql('postgres', 'SHOW shared_preload_libraries'), qr/queuebox/,
	'extension: the standby preloads queuebox');

# The sink's delay (100 ms a request, one row of a key in flight) spreads the
# 600 rows of 20 keys over about 3 s: the primary stops mid-stream.
qb_insert_keyed($primary, 'failover.ext', $N, 20, 'fe');
$primary->wait_for_catchup($standby, 'replay');
is(qb_count($standby, q{topic = 'failover.ext'}), $N, "extension: the standby has the $N rows");
is($standby->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'queuebox%'}),
	'0', 'extension: no QueueBox process runs on the standby');

qb_wait_query($primary, q{SELECT count(*) >= 100 FROM queuebox.outbox WHERE topic = 'failover.ext' AND state = 'sent'},
	't', 'extension: delivery is under way on the primary');
fail_over($primary, $standby, $sink, 'failover.ext', 'extension', sub {
	my ($sent_before) = @_;
	# still in recovery: nothing goes out (a pause, then the same count)
	usleep(1_500_000);
	is(scalar(grep { $_->{status} < 300 } @{ qb_sink_requests($sink) }), $sent_before,
		'extension: the standby sends nothing while in recovery');
	is($standby->safe_psql('postgres',
			q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'queuebox%'}),
		'0', 'extension: still no QueueBox process on the standby');
});
$standby->stop;
qb_sink_stop($sink);

# ---------------------------------------------------------------- daemon
my $dsink = qb_sink_start(name => 'failover_daemon', delay_ms => 100);
my $dp = qbd_node('daemon_primary', init => { allows_streaming => 1 });
$dp->backup('daemon_backup');
my $ds = PostgreSQL::Test::Cluster->new('daemon_standby');
$ds->init_from_backup($dp, 'daemon_backup', has_streaming => 1);
$ds->start;

my $url = sprintf('postgres://qbd@127.0.0.1:%d,127.0.0.1:%d/postgres?target_session_attrs=read-write',
	$dp->port, $ds->port);
my $yaml = qb_config_yaml(
	outbox => { pollIntervalMs => 100, batchSize => 10, claimTimeoutMs => 3000 },
	destinations => {
		web => { type => 'http', baseUrl => $dsink->{url}, path => '/d', timeoutMs => 2000 } },
	routes => [ { topicPattern => '**', destination => 'web' } ],
	database => { url => $url, connectTimeoutMs => 2000 },
	daemon => { outboxWorkers => 2, shutdownGraceMs => 2000 });
my $conf = qbd_write_conf($yaml, 'failover');

my $r = qbd_run('--config', $conf, '--check');
is($r->[0], 0, 'daemon: --check accepts the host list') or diag $r->[2];
like($r->[1], qr/127\.0\.0\.1:\d+,127\.0\.0\.1:\d+\/postgres\?target_session_attrs=read-write/,
	'daemon: --check names both hosts');
(my $typo = $yaml) =~ s/target_session_attrs/target_session_attr/;
$r = qbd_run('--config', qbd_write_conf($typo, 'failover_typo'), '--check');
is($r->[0], 1, 'daemon: --check refuses an option libpq does not know');
like($r->[2], qr/database\.url: libpq refuses it: invalid URI query parameter: "target_session_attr"/,
	'daemon: the message names the option');
(my $badhost = $yaml) =~ s/,127\.0\.0\.1:\d+/,127.0.0.1:0/;
$r = qbd_run('--config', qbd_write_conf($badhost, 'failover_badhost'), '--check');
like($r->[2], qr/database\.url: host 2 of the host list: the port must be a number from 1 to 65535/,
	'daemon: a bad host of the list is named by its place');

$r = qbd_run('--config', $conf, '--migrate');
is($r->[0], 0, 'daemon: the schema is installed on the primary, through the host list') or diag $r->[2];
my $d = qbd_start($dp, $yaml, name => 'failover', conf => $conf);
qbd_wait_daemon_log($d, qr/outbox 1\[\d+\]: started/);

qb_insert_keyed($dp, 'failover.daemon', $N, 20, 'fd');
$dp->wait_for_catchup($ds, 'replay');
qb_wait_query($dp, q{SELECT count(*) >= 100 FROM queuebox.outbox WHERE topic = 'failover.daemon' AND state = 'sent'},
	't', 'daemon: delivery is under way on the primary');
my $off = -s $d->{log};
fail_over($dp, $ds, $dsink, 'failover.daemon', 'daemon');
my $log = qbd_log($d, $off);
unlike($log, qr/was killed by signal|exited with/, 'daemon: no role died; the roles reconnected')
  or diag $log;
ok(defined $d->{pid} && kill(0, $d->{pid}), 'daemon: still running');

qbd_signal($d, 'TERM');
isnt(qbd_wait_exit($d, 30), undef, 'daemon: stops on SIGTERM');
$ds->stop;
qb_sink_stop($dsink);
done_testing();
