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
local $ENV{QBI_TEST_PGHOST} = $node->host;
local $ENV{QBI_TEST_PGPORT} = $node->port;
qb_pull_process_scenarios($node, sub { [ 'node', "$dir/test/process-worker.js", @_ ] });
done_testing();
