# 005_sigterm.pl
#   SIGTERM (pg_terminate_backend) stops an outbox worker at once even while
#   its requests hang on a slow endpoint; the rows it claimed go back to
#   pending with their attempt unchanged; the launcher starts a new worker
#   and the rows are delivered once the endpoint answers.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $delay_s = 30;
my $sink = qb_sink_start(name => 'slow', delay_ms => $delay_s * 1000);
my $port = $sink->{port};
my $node = qb_node('sigterm');

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

# The lease (10 min) is far beyond the test: only the release path can
# bring a claimed row back to pending here.
qb_configure(
	$node,
	qb_config_yaml(
		outbox => { claimTimeoutMs => 600000, maxAttempts => 100 },
		destinations => {
			web => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 60000 }
		},
		routes => [ { topicPattern => '**', destination => 'web' } ]));

my $n = 6;
$node->safe_psql('postgres', qq{
	INSERT INTO queuebox.outbox (topic, payload)
	SELECT 'orders.created', jsonb_build_object('i', i) FROM generate_series(1, $n) i});
is(qb_outbox_count($node), $n, "$n rows inserted");

qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE state = 'processing' AND attempt = 0",
	$n, 'every row is claimed (processing) and waits on the slow endpoint', timeout => 30);
my %token = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	'SELECT id, claim_token FROM queuebox.outbox');
my @old = qb_worker_pids($node);
is(scalar @old, 2, 'two outbox workers');

# ---- SIGTERM every outbox worker while its requests are in flight
my $log_offset = -s $node->logfile;
my $t0 = time;
is( $node->safe_psql('postgres',
		'SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity '
		  . 'WHERE pid IN (' . join(',', @old) . ')'),
	't', 'pg_terminate_backend() on both workers');
my $gone = qb_wait_for(
	sub {
		$node->safe_psql('postgres',
			'SELECT count(*) FROM pg_stat_activity WHERE pid IN (' . join(',', @old) . ')') eq '0';
	},
	'the terminated workers leave pg_stat_activity',
	timeout => $delay_s - 5);
my $took = time - $t0;
diag sprintf('the workers exited %.2f s after SIGTERM (the endpoint would answer after %d s)',
	$took, $delay_s);
ok($gone && $took < $delay_s - 5,
	"the workers exited before the endpoint could have answered (within " . ($delay_s - 5) . ' s)');

# ---- the claimed rows were released: pending again, attempt unchanged.
# The launcher may already have started a new worker that claimed them
# again, so a row counts as released when it is pending, or processing
# under a new claim token (only a pending row can be claimed).
my $rows = $node->safe_psql('postgres', q{
	SELECT id, state, attempt, coalesce(claim_token::text, ''), coalesce(last_error, '')
	FROM queuebox.outbox ORDER BY id});
my ($released, $attempt0, $msg) = (0, 0, 0);
for my $l (split /\n/, $rows)
{
	my ($id, $state, $attempt, $tok, $err) = split /\|/, $l, 5;
	$released++
	  if $state eq 'pending' && $tok eq ''
	  or $state eq 'processing' && $tok ne '' && $tok ne $token{$id};
	$attempt0++ if $attempt eq '0';
	$msg++ if $err =~ /released/;
}
is($released, $n, 'every claimed row went back to pending (released)') or diag $rows;
is($attempt0, $n, 'the release did not spend an attempt (attempt still 0)');
is($msg, $n, 'last_error says the row was released');
my $stoplog = slurp_file($node->logfile, $log_offset);
my $nreleased = 0;
$nreleased += $1 while $stoplog =~ /queuebox outbox \d stopped: .*?, (\d+) released/g;
# (at least $n: a worker whose SIGTERM lands between its loop-top stop check
# and its next claim may claim the rows the other one just released, post
# them, and release them again)
cmp_ok($nreleased, '>=', $n, "the workers' stop lines report the $n rows released");

# ---- the launcher starts new workers
qb_wait_for(
	sub {
		my @now = qb_worker_pids($node);
		my %was = map { $_ => 1 } @old;
		@now == 2 && !grep { $was{$_} } @now;
	},
	'the launcher starts two new outbox workers (new pids)',
	timeout => 30);

# ---- restart the endpoint without the delay, on the same port: the
# requests in flight to the old one fail and are retried there.
qb_sink_stop($sink, 'KILL');
$sink = qb_sink_start(name => 'fast', port => $port);
is($sink->{port}, $port, 'the sink is back on the same port, without delay');

qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'",
	$n, 'every row is delivered once the endpoint answers', timeout => 60);
my $by_id = qb_sink_by_id($sink);
my @mids = split /\n/, $node->safe_psql('postgres', 'SELECT message_id FROM queuebox.outbox');
is(scalar(grep { grep { $_->{status} == 200 } @{ $by_id->{$_} // [] } } @mids),
	$n, 'the restarted sink answered 200 for every message id');

is(qb_outbox_count($node), $n, "after: the outbox still holds the $n rows");

$node->stop;
qb_sink_stop($sink);
done_testing();
