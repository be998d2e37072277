# 033_client_ts.pl
#   @alternayte/queuebox-inbox (clients/ts), the TypeScript pull worker, on a
#   real cluster with the extension: its node --test scenarios
#   (clients/SCENARIOS.md), with pg installed from the package's lockfile;
#   then as processes: two workers on one source divide the work, and a
#   worker killed with -9 mid-handler loses nothing and applies nothing twice.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use QueueBoxTest;

my $dir = qb_npm_dir('clients/ts');
my $node = qb_node('client_ts');
my ($out, $err) = ('', '');
{
	local $ENV{QBI_TEST_PGHOST} = $node->host;
	local $ENV{QBI_TEST_PGPORT} = $node->port;
	IPC::Run::run([ 'node', '--test', '--test-reporter=tap', "$dir/test/worker.test.js" ], '>', \$out, '2>', \$err);
}
my $rc = $? >> 8;
note $out, $err;
is($rc, 0, 'the TypeScript worker passes its scenarios') or diag "$out\n$err";
like($out, qr/^# pass 8$/m, 'all eight ran and passed');
like($out, qr/^# fail 0$/m, 'none failed');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');
# ---- worker processes: two on one source, and kill -9 mid-handler
$node->safe_psql('postgres', q{
	DELETE FROM queuebox.inbox;
	CREATE TABLE effects (source text, idempotency_key text, worker text, PRIMARY KEY (source, idempotency_key));
	INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption)
	  SELECT 'jobs', 'p' || i, jsonb_build_object('n', i), 'pull' FROM generate_series(1, 300) i;
});
local $ENV{QBI_TEST_PGHOST} = $node->host;
local $ENV{QBI_TEST_PGPORT} = $node->port;
sub worker_start
{
	my ($name, $lease, $handler_ms) = @_;
	my ($o, $e) = ('', '');
	my $h = IPC::Run::start([ 'node', "$dir/test/process-worker.js", $name, $lease, $handler_ms ],
		'>', \$o, '2>', \$e);
	my $p = { h => $h, out => \$o, err => \$e };
	qb_wait_for(sub { $h->pump_nb; ${ $p->{out} } =~ /ready/ }, "worker $name started", timeout => 20);
	return $p;
}
sub worker_stop
{
	my ($p) = @_;
	$p->{h}->signal('TERM');
	$p->{h}->finish;
	return ${ $p->{out} } . ${ $p->{err} };
}
my $w1 = worker_start('one', 30000, 5);
my $w2 = worker_start('two', 30000, 5);
qb_wait_query($node, q{SELECT count(*) FROM queuebox.inbox WHERE state = 'processed'}, '300',
	'two worker processes: all 300 messages processed', timeout => 60);
my $o = worker_stop($w1) . worker_stop($w2);
my %by = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	q{SELECT worker, count(*) FROM effects GROUP BY worker ORDER BY 1});
ok(($by{one} // 0) > 0 && ($by{two} // 0) > 0, "two worker processes divide the work ($by{one} and $by{two})");
is(($by{one} // 0) + ($by{two} // 0), 300, 'two worker processes: each effect applied once');
like($o, qr/one: claimed \d+ completed \d+ retried 0 dead 0 lease_lost 0/, 'worker one stops cleanly, counting') or diag $o;

$node->safe_psql('postgres', q{
	INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption) VALUES ('jobs', 'killed', '{"n": 0}', 'pull');
});
my $wk = worker_start('victim', 1000, 60000);
qb_wait_query($node, q{SELECT state FROM queuebox.inbox WHERE idempotency_key = 'killed'}, 'processing',
	'kill -9: the message is claimed');
$wk->{h}->signal('KILL');
$wk->{h}->finish;
is($node->safe_psql('postgres', q{SELECT count(*) FROM effects WHERE idempotency_key = 'killed'}), '0',
	'kill -9: the killed handler\'s write was never committed');
my $wr = worker_start('rescuer', 1000, 5);
qb_wait_query($node, q{SELECT state FROM queuebox.inbox WHERE idempotency_key = 'killed'}, 'processed',
	'kill -9: another worker takes it over once the lease ends', timeout => 30);
worker_stop($wr);
is($node->safe_psql('postgres', q{SELECT worker || ':' || count(*) FROM effects WHERE idempotency_key = 'killed' GROUP BY worker}),
	'rescuer:1', 'kill -9: its effect is applied once, by the worker that took it over');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.inbox WHERE state <> 'processed'}), '0',
	'no message is left behind');
done_testing();
