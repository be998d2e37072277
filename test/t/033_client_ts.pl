# 033_client_ts.pl
#   @alternayte/queuebox-inbox (clients/ts), the TypeScript pull worker, on a
#   real cluster with the extension: its node --test scenarios
#   (clients/SCENARIOS.md), with pg installed from the package's lockfile;
#   the SQL Server dialect's unit tests (no server: a hand-made pool);
#   then as processes: two workers on one source divide the work, and a
#   worker killed with -9 mid-handler loses nothing and applies nothing twice.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use QueueBoxTest;

my $dir = qb_npm_dir('clients/ts');
my $node = qb_node('client_ts');
qb_node_tests("$dir/test/worker.test.js", 'the TypeScript worker on PostgreSQL', 8,
	QBI_TEST_PGHOST => $node->host, QBI_TEST_PGPORT => $node->port);
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');

# ---- the SQL Server dialect without a server (its scenarios on one: TAP 035)
qb_node_tests("$dir/test/mssql-dialect.test.js", 'fromMssql without a server', 10);

# ---- worker processes: two on one source, and kill -9 mid-handler
local $ENV{QBI_TEST_PGHOST} = $node->host;
local $ENV{QBI_TEST_PGPORT} = $node->port;
qb_pull_process_scenarios($node, sub { [ 'node', "$dir/test/process-worker.js", @_ ] });
done_testing();
