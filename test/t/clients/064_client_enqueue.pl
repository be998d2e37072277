# 064_client_enqueue.pl
#   The outbox from application code (docs/enqueue.md): each library's
#   enqueue call, by its own runner, on a real cluster whose outbox delivers
#   topics enq.** to the real HTTP sink: TypeScript (node --test
#   clients/ts/test/enqueue.test.js), Go (clients/go/enqueue_test.go through
#   clients/go/test.sh) and C (clients/c/test/test_enqueue). Each checks a
#   business write and an enqueue committed together and rolled back
#   together (rows counted), the trace context of the current span in the
#   row and a child of it at the sink, a caller's traceparent kept and a
#   malformed one refused, a batch in order, and a delayed row still pending
#   and never attempted after a later row was delivered. On SQL Server too
#   (TypeScript and Go; the C library has no ODBC side) when
#   QUEUEBOX_TEST_MSSQL_URL is set, queuebox-mssqld delivering; skipped,
#   saying so, otherwise. Then docs/enqueue.md's examples as written there.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;
use QueueBoxMssql;

my $ROOT = "$FindBin::RealBin/../../..";
my $sink = qb_sink_start(name => 'enqueue');
my $node = qb_node('client_enqueue');
my $doc = qb_config_yaml(
	outbox => { pollIntervalMs => 100, maxAttempts => 3, backoff => { initialMs => 100, maxMs => 200 } },
	destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/enq', timeoutMs => 3000 } },
	routes => [ { topicPattern => 'enq.**', destination => 'web' }, { topicPattern => 'orders.**', destination => 'web' } ]);
$node->safe_psql('postgres', "SELECT queuebox.configure(\$y\$$doc\$y\$)");

my $dir = qb_npm_dir('clients/ts');
local $ENV{QBI_TEST_SINK_LOG} = $sink->{log};

# ---- PostgreSQL
qb_node_tests("$dir/test/enqueue.test.js", 'TypeScript: enqueue on PostgreSQL', 4,
	QBI_TEST_PGHOST => $node->host, QBI_TEST_PGPORT => $node->port);

# go test -run TestEnqueue: the subtests that passed, by test
sub go_enqueue
{
	my (%env) = @_;
	local @ENV{ keys %env } = values %env;
	my ($out, $err) = ('', '');
	IPC::Run::run([ qb_test_binary('clients/go/test.sh'), '-v', '-count=1', '-run', 'TestEnqueue' ], '>', \$out, '2>', \$err);
	note $out, $err;
	is($? >> 8, 0, 'Go: go vet, gofmt and go test -run TestEnqueue pass') or diag "$out\n$err";
	unlike($out, qr/^\s*--- FAIL/m, 'Go: none failed');
	return $out;
}
local $ENV{GOCACHE} = "$PostgreSQL::Test::Utils::tmp_check/go-cache";
local $ENV{HOME} = "$PostgreSQL::Test::Utils::tmp_check";
{
	my $out = go_enqueue(QBI_TEST_PGHOST => $node->host, QBI_TEST_PGPORT => $node->port, QUEUEBOX_TEST_MSSQL_URL => '');
	my @pass = $out =~ m{^    --- PASS: TestEnqueuePostgreSQL/(\w+)}mg;
	is("@pass", 'commit_and_rollback_together trace_context batch delayed', 'Go: the four enqueue tests passed on PostgreSQL');
	like($out, qr/^--- PASS: TestEnqueueDocsExample/m, 'Go: docs/enqueue.md\'s example ran on PostgreSQL');
}
{
	my ($out, $err) = ('', '');
	local $ENV{QBI_TEST_DSN} = $node->connstr('postgres');
	IPC::Run::run([ qb_test_binary('clients/c/test/test_enqueue') ], '>', \$out, '2>', \$err);
	note $out, $err;
	is($? >> 8, 0, 'C: qbi_enqueue passes its tests') or diag "$out\n$err";
	like($out . $err, qr/\[  PASSED  \] 4 test\(s\)/, 'C: the four ran');
}

# ---- docs/enqueue.md's examples, as written there
my $page = slurp_file("$ROOT/docs/enqueue.md");
my @ts = ($page =~ /^## TypeScript\n(.*?)^## /ms)[0] =~ /^```js\n(.*?)^```$/msg;
is(scalar(@ts), 2, 'docs/enqueue.md has two TypeScript examples');
my ($go) = $page =~ /^## Go\n.*?^```go\n(.*?)^```$/ms;
my ($c) = $page =~ /^## C\n.*?^```c\n(.*?)^```$/ms;
# (the C# section's example is TAP 039's: it runs it as written)
like($page, qr/^## C#\n\n`QueueBox\.Inbox` \(clients\/dotnet\)/m, 'docs/enqueue.md has its C# section');

# run_node($code, %env): an .mjs in clients/ts with $code, run; its exit code and stderr
sub run_node
{
	my ($code, %env) = @_;
	local @ENV{ keys %env } = values %env;
	my $file = "$dir/enqueue-docs-example.mjs";
	open(my $fh, '>', $file) or die "$file: $!";
	print $fh $code;
	close $fh;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'node', $file ], '>', \$out, '2>', \$err);
	unlink $file;
	return ($? >> 8, "$out$err");
}

{
	$node->safe_psql('postgres', q{
		CREATE TABLE IF NOT EXISTS shop_orders (id int PRIMARY KEY, status text);
		DELETE FROM shop_orders; INSERT INTO shop_orders VALUES (42, 'new');
		DELETE FROM queuebox.outbox WHERE key = 'order-42';});
	my ($rc, $err) = run_node(sprintf("import pg from 'pg';\nimport { enqueue } from './src/index.js';\n"
		  . "const pool = new pg.Pool({ host: %s, port: %d, database: 'postgres', user: 'postgres' });\n%s"
		  . "await pool.end();\n", qb_sql_quote($node->host), $node->port, $ts[0]));
	is($rc, 0, 'TypeScript: the first example runs') or diag $err;
	is($node->safe_psql('postgres', q{SELECT (SELECT status FROM shop_orders WHERE id = 42) || ' ' ||
		(SELECT string_agg(topic || ':' || (payload->>'status'), ',') FROM queuebox.outbox WHERE key = 'order-42')}),
		'paid orders.paid:paid', 'TypeScript: the order is paid and its message written, in one transaction');
}
{
	my $test = slurp_file("$ROOT/clients/go/enqueue_example_test.go");
	(my $body = $go) =~ s/^(?=.)/\t/mg;
	ok(index($test, $body) >= 0, 'Go: docs/enqueue.md\'s example is payOrder\'s body in clients/go/enqueue_example_test.go');
}
{
	my $readme = slurp_file("$ROOT/clients/c/README.md");
	my (undef, $code) = $readme =~ /^```c\n(.*?)^```$/msg;
	ok($code && index($code, $c) >= 0, 'C: docs/enqueue.md\'s example is in clients/c/README.md\'s program');
	my $exe = qb_client_c_program($node, $code, 'enqueue_example');
	$node->safe_psql('postgres', q{UPDATE shop_orders SET status = 'new'; DELETE FROM queuebox.outbox WHERE key = 'order-42';});
	IPC::Run::run([$exe], '>', \my $eout, '2>', \my $eerr);
	is($? >> 8, 0, 'C: the program exits 0') or diag $eerr;
	is($node->safe_psql('postgres', q{SELECT (SELECT status FROM shop_orders WHERE id = 42) || ' ' ||
		(SELECT string_agg(topic || ':' || (scheduled_at > now() + interval '23 hours')::text, ',' ORDER BY id)
		 FROM queuebox.outbox WHERE key = 'order-42')}),
		'paid orders.paid:false,orders.reminder:true', 'C: the order is paid, its message and a delayed reminder written');
}

# ---- SQL Server: TypeScript and Go, queuebox-mssqld delivering to the sink
SKIP:
{
	skip('QUEUEBOX_TEST_MSSQL_URL is not set: enqueue on SQL Server not run', 11) unless qb_mssql_alone();
	my $url = mssql_url();
	my $dbh = mssql_connect($url);
	mssql_reset($dbh);
	my $conf = qb_config_yaml(
		outbox => { pollIntervalMs => 100, maxAttempts => 3, backoff => { initialMs => 100, maxMs => 200 } },
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/enq', timeoutMs => 3000 } },
		routes => [ { topicPattern => 'enq.**', destination => 'web' }, { topicPattern => 'orders.**', destination => 'web' } ],
		database => { url => $url, connectTimeoutMs => 3000, idlePollMaxMs => 500 },
		daemon => { outboxWorkers => 1, shutdownGraceMs => 5000 });
	my $r = qbd_run('--config', qbd_write_conf($conf, 'migrate'), '--migrate');
	is($r->[0], 0, 'SQL Server: --migrate creates the schema') or diag $r->[2];
	my $d = qbd_start(undef, $conf, name => 'enqueue_mssql');
	qbd_wait_daemon_log($d, qr/outbox \d\[\d+\]: started/);

	qb_node_tests("$dir/test/enqueue.test.js", 'TypeScript: enqueue on SQL Server', 4,
		QBI_TEST_DIALECT => 'mssql', QUEUEBOX_TEST_MSSQL_URL => $url);
	my $out = go_enqueue(QUEUEBOX_TEST_MSSQL_URL => $url, QBI_TEST_PGHOST => '');
	my @pass = $out =~ m{^    --- PASS: TestEnqueueSQLServer/(\w+)}mg;
	is("@pass", 'commit_and_rollback_together trace_context batch delayed', 'Go: the four enqueue tests passed on SQL Server');

	mssql_do($dbh, q{IF OBJECT_ID(N'dbo.shop_orders') IS NULL CREATE TABLE dbo.shop_orders (id INT PRIMARY KEY, status NVARCHAR(20))});
	mssql_do($dbh, q{DELETE FROM dbo.shop_orders});
	mssql_do($dbh, q{INSERT INTO dbo.shop_orders VALUES (42, N'new')});
	my ($rc, $err) = run_node("import sql from 'mssql';\nimport { enqueueBatch } from './src/index.js';\n"
		  . "import { mssqlConfig } from './test/mssql-config.js';\n"
		  . "const pool = await new sql.ConnectionPool(mssqlConfig()).connect();\n$ts[1]await pool.close();\n",
		QUEUEBOX_TEST_MSSQL_URL => $url);
	is($rc, 0, 'TypeScript: the second example runs on SQL Server') or diag $err;
	is(mssql_value($dbh, q{SELECT status FROM dbo.shop_orders WHERE id = 42}), 'paid', 'TypeScript: the order is paid');
	is(mssql_value($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE [key] = N'order-42' AND
		((topic = N'orders.paid' AND scheduled_at < DATEADD(hour, 1, SYSUTCDATETIME()))
		 OR (topic = N'orders.reminder' AND scheduled_at > DATEADD(hour, 23, SYSUTCDATETIME())))}),
		2, 'TypeScript: its message and a delayed reminder are written, in its transaction');
	qbd_signal($d, 'TERM');
	qbd_wait_exit($d);
	mssql_reset($dbh);
}

is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');
done_testing();
