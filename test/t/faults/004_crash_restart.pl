# 004_crash_restart.pl
#   No row is lost when an outbox worker is killed mid-batch (the cluster
#   crash-restarts) or when the server is restarted (fast) mid-stream: every
#   row ends sent and the sink saw every message id at least once.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink = qb_sink_start(name => 'crash');
# PostgreSQL::Test::Cluster turns restart_after_crash off; this test needs it.
my $node = qb_node('crash', conf => 'restart_after_crash = on');

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

# Slow rows take 1.5 s; a claim left by a dead worker comes back after 2 s
# (the validator wants timeoutMs below claimTimeoutMs).
qb_configure(
	$node,
	qb_config_yaml(
		outbox => { batchSize => 10, claimTimeoutMs => 2000 },
		destinations => {
			web => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 1800 }
		},
		routes => [ { topicPattern => '**', destination => 'web' } ]));

sub insert_rows
{
	my ($phase, $n) = @_;
	$node->safe_psql('postgres', qq{
		INSERT INTO queuebox.outbox (topic, key, payload)
		SELECT 'orders.created', CASE WHEN i % 3 = 0 THEN 'key-' || (i % 4) END,
			   CASE WHEN i % 5 = 0
					THEN jsonb_build_object('phase', '$phase', 'i', i, '_sink', jsonb_build_object('delay_ms', 1500))
					ELSE jsonb_build_object('phase', '$phase', 'i', i) END
		FROM generate_series(1, $n) i});
}

sub all_delivered
{
	my ($what, $expect_rows) = @_;
	qb_wait_query($node,
		"SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'",
		$expect_rows, "$what: every row ends sent", timeout => 90);
	is(qb_outbox_count($node), $expect_rows, "$what: no row lost ($expect_rows rows in the outbox)");
	is(qb_count($node, "state <> 'sent'"), '0', "$what: no row left pending, processing or dead");
	my $by_id = qb_sink_by_id($sink);
	my @mids = split /\n/, $node->safe_psql('postgres', 'SELECT message_id FROM queuebox.outbox');
	my @missing = grep { !grep { $_->{status} == 200 } @{ $by_id->{$_} // [] } } @mids;
	is(scalar @missing, 0, "$what: the sink answered 200 for every message id")
	  or diag "missing: @missing[0 .. ($#missing > 4 ? 4 : $#missing)]";
	my $dups = grep { @{ $by_id->{$_} // [] } > 1 } @mids;
	note "$what: $dups message ids were delivered more than once (at least once is allowed)";
}

# ---- phase 1: kill -9 an outbox worker mid-batch
insert_rows('crash', 60);
qb_wait_query($node, q{
	SELECT count(*) FILTER (WHERE state = 'processing') > 0
	   AND count(*) FILTER (WHERE state = 'sent') > 0
	   AND count(*) FILTER (WHERE state = 'pending') > 0
	FROM queuebox.outbox},
	't', 'phase 1: delivery is under way (rows sent, processing and pending)', timeout => 30);
my @pids = qb_worker_pids($node);
is(scalar @pids, 2, 'two outbox workers before the crash');
my $launcher_before = qb_launcher_pid($node);
my $log_offset = -s $node->logfile;
note "kill -9 outbox worker $pids[0]";
ok(kill('KILL', $pids[0]), "kill -9 outbox worker $pids[0]");

{
	local $PostgreSQL::Test::Utils::timeout_default = 60;
	$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
	pass('the postmaster crash-restarts the cluster');
}
qb_wait_query($node, q{
	SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox outbox'},
	'2', 'after recovery two outbox workers run again', timeout => 60);
isnt(qb_launcher_pid($node), $launcher_before, 'a new launcher runs after the crash restart');
all_delivered('after kill -9', 60);

my $after_crash = slurp_file($node->logfile, $log_offset);
unlike($after_crash, qr/background worker "queuebox launcher" \(PID \d+\) exited with exit code 1/,
	'the launcher did not fail after the crash restart');

# ---- phase 2: fast restart mid-stream
insert_rows('restart', 60);
qb_wait_query($node, q{
	SELECT count(*) FILTER (WHERE state = 'processing') > 0
	   AND count(*) FILTER (WHERE state = 'pending') > 0
	FROM queuebox.outbox WHERE payload->>'phase' = 'restart'},
	't', 'phase 2: delivery is under way', timeout => 30);
$log_offset = -s $node->logfile;
$node->restart;
pass('the server restarted (fast) mid-stream');
my $stop_log = slurp_file($node->logfile, $log_offset);
like($stop_log, qr/queuebox outbox \d stopped: .* released/,
	'the workers stopped cleanly at shutdown (their summary line is logged)');
all_delivered('after the fast restart', 120);

$node->stop;
qb_sink_stop($sink);
done_testing();
