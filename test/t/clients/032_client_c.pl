# 032_client_c.pl
#   libqueuebox-inbox (clients/c), the C pull worker, on a real cluster with
#   the extension: the scenarios of clients/SCENARIOS.md that
#   clients/c/test/test_worker.c runs (commit together, renewal, a lost
#   lease, retry and policies, shutdown grace, max_concurrency 4 over 8
#   aggregates), and as processes: two workers on one source divide the
#   work, and a worker killed with -9 mid-handler loses nothing and applies
#   nothing twice; and the example of clients/c/README.md, compiled and run.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
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
like($out . $err, qr/\[  PASSED  \] 9 test\(s\)/, 'all nine ran (the trace context among them)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');

# ---- worker processes: two on one source, and kill -9 mid-handler
my $wbin = qb_test_binary('clients/c/test/qbi_test_worker');
qb_pull_process_scenarios($node, sub { [ $wbin, $node->connstr('postgres'), @_ ] });

# ---- the README's example, as it is written there but for the database it reaches
{
	my $readme = slurp_file("$FindBin::RealBin/../../../clients/c/README.md");
	my ($code) = $readme =~ /^```c\n(.*?)^```$/ms;
	ok($code, 'clients/c/README.md has a C example');
	my $exe = qb_client_c_program($node, $code, 'readme_example');
	$node->safe_psql('postgres', q{
		CREATE TABLE orders_seen (doc jsonb);
		INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)
		SELECT 'orders', 'o-' || g, 'c' || (g % 2), jsonb_build_object('id', g, 'total', 10 * g), 'pull'
		FROM generate_series(1, 5) g;
	});
	my $h = IPC::Run::start([$exe], '>', \my $eout, '2>', \my $eerr);
	qb_wait_query($node, q{SELECT count(*) FROM queuebox.inbox WHERE source = 'orders' AND state = 'processed'},
		'5', 'the example consumes the five messages');
	$h->kill_kill;
	is($node->safe_psql('postgres', q{SELECT string_agg(doc->>'id', ',' ORDER BY (doc->>'id')::int) FROM orders_seen}),
		'1,2,3,4,5', 'its handler wrote each once, in the completion\'s transaction');
}
done_testing();
