# 035_client_ts_mssql.pl
#   @alternayte/queuebox-inbox's SQL Server dialect, fromMssql(pool), on the
#   server QUEUEBOX_TEST_MSSQL_URL names (skipped, saying why, when it is not
#   set): schema queuebox reset and migrated by queuebox-mssqld --migrate,
#   then the node --test scenarios of clients/SCENARIOS.md (1 to 7, the
#   option checks, two workers on one source, a worker process killed with
#   -9 mid-handler, Msg 51000 behind a held claim lock, and a stop while
#   the claim waits for that lock) through mssql, installed from the
#   package's lockfile.  The dialect's server-less unit tests run in TAP
#   033.
#
#   The suite drops and recreates schema queuebox in the database the URL
#   names, as TAP 031 does: give it a database of its own.
use strict;
use warnings;

use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxMssql;

BEGIN { QueueBoxMssql::mssql_skip_unless_url(); }

use PostgreSQL::Test::Utils;
use QueueBoxTest;
use QueueBoxDaemon;

qb_mssql_alone();
my $url = mssql_url();
my $dbh = mssql_connect($url);
mssql_reset($dbh);
my $r = qbd_run('--config', qbd_write_conf(qq{database:\n  url: "$url"\n}, 'migrate'), '--migrate');
is($r->[0], 0, '--migrate creates the schema') or diag $r->[2];

my $dir = qb_npm_dir('clients/ts');
qb_node_tests("$dir/test/mssql.test.js", 'fromMssql on SQL Server', 12, QUEUEBOX_TEST_MSSQL_URL => $url);

# nothing left holding the claim's lock: a claim of the source answers at once
my $t0 = time;
mssql_rows($dbh, 'EXEC queuebox.inbox_claim @source = ?, @batch_size = ?, @lease_ms = ?', 'jobs', 10, 1000);
ok(time - $t0 < 9, 'no claim lock is left held');
mssql_reset($dbh);
done_testing();
