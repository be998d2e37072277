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

is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');
done_testing();
