# 034_client_go.pl
#   github.com/alternayte/queuebox/clients/go, the Go pull worker, on a real
#   cluster with the extension: go vet, gofmt and go test through
#   clients/go/test.sh (Debian's Go sources, no module proxy): the unit
#   tests and the scenarios 1 to 7 of clients/SCENARIOS.md (with a lease
#   lost at the completion and a handler that panics); on SQL Server too
#   when QUEUEBOX_TEST_MSSQL_URL is set (the same scenarios, Msg 51000, a
#   stop during a claim, two workers on one source, both driver names; the
#   schema migrated by queuebox-mssqld), else those are skipped, saying why; then as processes: two workers on one source
#   divide the work, and a worker killed with -9 mid-handler loses nothing
#   and applies nothing twice.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

BAIL_OUT('go is not installed (run scripts/setup.sh)') if system('command -v go >/dev/null 2>&1') != 0;
my $script = qb_test_binary('clients/go/test.sh');
my $node = qb_node('client_go');
# the Go build cache and home: the test's own, writable by whoever runs it
local $ENV{GOCACHE} = "$PostgreSQL::Test::Utils::tmp_check/go-cache";
local $ENV{HOME} = "$PostgreSQL::Test::Utils::tmp_check";
local $ENV{QBI_TEST_PGHOST} = $node->host;
local $ENV{QBI_TEST_PGPORT} = $node->port;
my $mssql = qb_mssql_alone();
local $ENV{QBI_TEST_MSSQLD} = qb_test_binary('queuebox-mssqld') if $mssql;

my ($out, $err) = ('', '');
IPC::Run::run([ $script, '-v', '-count=1' ], '>', \$out, '2>', \$err);
my $rc = $? >> 8;
note $out, $err;
is($rc, 0, 'the Go worker passes vet, gofmt and its tests') or diag "$out\n$err";
my @pg = $out =~ m{^    --- PASS: TestPostgreSQL/(\w+)}mg;
is(scalar(@pg), 10, 'the scenarios 1 to 7 (nine subtests) and the handler span passed on PostgreSQL') or diag "@pg";
my @unit = grep { !/^(TestPostgreSQL|TestSQLServer)/ } $out =~ m{^--- PASS: (\w+)}mg;
is(scalar(@unit), 10, 'the ten unit tests passed') or diag "@unit";
unlike($out, qr/^\s*--- FAIL/m, 'none failed');
if ($mssql)
{
	my @ms = $out =~ m{^    --- PASS: TestSQLServer/(\w+)}mg;
	is(scalar(@ms), 12, 'SQL Server: the scenarios 1 to 7 (nine subtests), Msg 51000, a stop during a claim, two workers passed')
	  or diag "@ms";
	like($out, qr/^--- PASS: TestSQLServerQuestionMarks/m, 'SQL Server: the driver name "mssql" (? parameters) works too');
}
else
{
	like($out, qr/^\s+mssql_test.go:\d+: QUEUEBOX_TEST_MSSQL_URL is not set.*\n--- SKIP: TestSQLServer /m,
		'SQL Server: skipped, saying why');
}
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');

# ---- worker processes: two on one source, and kill -9 mid-handler
my $worker = "$PostgreSQL::Test::Utils::tmp_check/go-testworker";
IPC::Run::run([ $script, '--build-worker', $worker ], '>', \$out, '2>', \$err)
  or BAIL_OUT("clients/go/test.sh --build-worker: $out $err");
qb_pull_process_scenarios($node, sub { [ $worker, @_ ] });
done_testing();
