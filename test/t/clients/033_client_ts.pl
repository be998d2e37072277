# 033_client_ts.pl
#   @alternayte/queuebox-inbox (clients/ts), the TypeScript pull worker, on a
#   real cluster with the extension: its node --test scenarios
#   (clients/SCENARIOS.md), with pg installed from the package's lockfile;
#   the SQL Server dialect's unit tests (no server: a hand-made pool);
#   then as processes: two workers on one source divide the work, and a
#   worker killed with -9 mid-handler loses nothing and applies nothing twice;
#   and docs/pull.md's TypeScript example, run as it is written there.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $dir = qb_npm_dir('clients/ts');
my $node = qb_node('client_ts');
qb_node_tests("$dir/test/worker.test.js", 'the TypeScript worker on PostgreSQL', 8,
	QBI_TEST_PGHOST => $node->host, QBI_TEST_PGPORT => $node->port);
qb_node_tests("$dir/test/trace.test.js", 'the handler\'s span continues the message\'s trace', 2,
	QBI_TEST_PGHOST => $node->host, QBI_TEST_PGPORT => $node->port);
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');

# ---- the SQL Server dialect without a server (its scenarios on one: TAP 035)
qb_node_tests("$dir/test/mssql-dialect.test.js", 'fromMssql without a server', 10);

# ---- worker processes: two on one source, and kill -9 mid-handler
local $ENV{QBI_TEST_PGHOST} = $node->host;
local $ENV{QBI_TEST_PGPORT} = $node->port;
qb_pull_process_scenarios($node, sub { [ 'node', "$dir/test/process-worker.js", @_ ] });

# ---- docs/pull.md's example, as written there: a pool and the imports before
# it, SIGTERM (its own stop) once the messages are in
{
	my ($example) = slurp_file("$FindBin::RealBin/../../../docs/pull.md") =~ /^#### TypeScript\n\n(?:<!--[^\n]*-->\n)?```js\n(.*?)^```$/ms;
	ok($example, 'docs/pull.md has a TypeScript example');
	my $file = "$dir/docs-example.mjs";
	open(my $fh, '>', $file) or die "$file: $!";
	printf $fh "import pg from 'pg';\nimport { InboxWorker, fromPg } from './src/index.js';\n"
	  . "const pool = new pg.Pool({ host: %s, port: %d, database: 'postgres', user: 'postgres' });\n%s"
	  . "await pool.end();\n", qb_sql_quote($node->host), $node->port, $example;
	close $fh;
	$node->safe_psql('postgres', q{
		CREATE TABLE orders (id text PRIMARY KEY, total int);
		INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)
		SELECT 'orders', 'o-' || g, 'c' || (g % 2), jsonb_build_object('id', 'o-' || g, 'total', 10 * g), 'pull'
		FROM generate_series(1, 5) g;
	});
	my $h = IPC::Run::start([ 'node', $file ], '>', \my $eout, '2>', \my $eerr);
	qb_wait_query($node, q{SELECT count(*) FROM queuebox.inbox WHERE source = 'orders' AND state = 'processed'},
		'5', 'the example consumes the five messages');
	$h->signal('TERM');
	$h->finish;
	is($? >> 8, 0, 'the example stops on SIGTERM and exits 0') or diag $eerr;
	is($node->safe_psql('postgres', q{SELECT string_agg(id || ':' || total, ',' ORDER BY id) FROM orders}),
		'o-1:10,o-2:20,o-3:30,o-4:40,o-5:50', 'its handler wrote each order once');
}
done_testing();
