# 032_client_c.pl
#   libqueuebox-inbox (clients/c), the C pull worker, on a real cluster with
#   the extension: the scenarios of clients/SCENARIOS.md that
#   clients/c/test/test_worker.c runs (commit together, renewal, a lost
#   lease, retry and policies, shutdown grace, max_concurrency 4 over 8
#   aggregates), and as processes: two workers on one source divide the
#   work, and a worker killed with -9 mid-handler loses nothing and applies
#   nothing twice.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use QueueBoxTest;

my $node = qb_node('client_c');
my $bin = qb_test_binary('clients/c/test/test_worker');
my ($out, $err) = ('', '');
{
	local $ENV{QBI_TEST_DSN} = $node->connstr('postgres');
	IPC::Run::run([$bin], '>', \$out, '2>', \$err);
}
my $rc = $? >> 8;
note $out, $err;
is($rc, 0, 'the C worker passes its scenarios') or diag "$out\n$err";
like($out . $err, qr/\[  PASSED  \] 8 test\(s\)/, 'all eight ran');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');

# ---- worker processes: two on one source, and kill -9 mid-handler
my $wbin = qb_test_binary('clients/c/test/qbi_test_worker');
qb_pull_process_scenarios($node, sub { [ $wbin, $node->connstr('postgres'), @_ ] });
done_testing();
