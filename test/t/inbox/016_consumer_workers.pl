# 016_consumer_workers.pl
#   One consumer worker per broker source: the launcher starts them as the
#   stored configuration gains broker sources and stops them as it loses
#   them, up to queuebox.max_consumer_workers, without restarting the other
#   workers; with no other worker running, configure() itself tells the
#   launcher, and after a restart one consumer loads the stored document.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $node = qb_node('consumers', conf => "queuebox.max_consumer_workers = 2\n");

sub consumers
{
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'");
}

sub outbox_pids
{
	return $node->safe_psql('postgres',
		q{SELECT string_agg(pid::text, ',' ORDER BY worker) FROM queuebox.worker_status() WHERE worker LIKE 'outbox %'});
}

qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox outbox'",
	'2', 'two outbox workers run', timeout => 30);
# at start one consumer loads the document; with none stored it stops
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'0', 'no consumer worker without a broker source', timeout => 30);
my $pids = outbox_pids();

my $src = sub {
	my ($n) = @_;
	my $y = "sources:\n  web: { type: http, path: /w, idempotencyKeyPath: \$.id, topic: w }\n";
	$y .= "  k$_: { type: kafka, brokers: \"127.0.0.1:1\", topics: [t$_] }\n" for 1 .. $n;
	return $y;
};

qb_configure($node, $src->(1));
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'1', 'a kafka source starts one consumer worker', timeout => 30);
qb_configure($node, $src->(3));
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'2', 'three sources start two workers: queuebox.max_consumer_workers caps them', timeout => 30);
is(outbox_pids(), $pids, 'the outbox workers kept running through the changes');
qb_configure($node, $src->(0));
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'0', 'removing the broker sources stops the consumer workers', timeout => 30);
is(outbox_pids(), $pids, 'and the outbox workers still run');
ok($node->log_contains(qr/queuebox launcher: 2 consumer workers for the broker sources \(was 1\)/),
	'the launcher logs the change');

# ---- no outbox worker, no relay, no ingress: nothing else loads the document
$node->safe_psql('postgres', 'ALTER SYSTEM SET queuebox.outbox_workers = 0');
$node->safe_psql('postgres', 'ALTER SYSTEM SET queuebox.relay_worker = off');
$node->safe_psql('postgres', 'ALTER SYSTEM SET queuebox.ingress_worker = off');
$node->reload;
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'queuebox %' AND backend_type <> 'queuebox launcher'",
	'0', 'alone: no queuebox worker runs', timeout => 30);
qb_configure($node, $src->(1));
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'1', 'alone: a kafka source stored by configure() starts its consumer worker', timeout => 30);
$node->restart;
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'1', 'alone: after a restart the stored kafka source has its consumer worker', timeout => 30);
qb_configure($node, $src->(0));
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'0', 'alone: removing the source stops it', timeout => 30);
$node->restart;
# the consumer started to load the document stops once it has
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'0', 'alone: after a restart with no broker source no consumer worker stays', timeout => 30);

# a savepoint rolled back over a configure(): the document that commits
# (one kafka source) decides, not the one rolled back (none)
$node->safe_psql('postgres', 'BEGIN; SELECT queuebox.configure(' . qb_sql_quote($src->(1)) . ');'
	  . ' SAVEPOINT s; SELECT queuebox.configure(' . qb_sql_quote($src->(0)) . ');'
	  . ' ROLLBACK TO SAVEPOINT s; COMMIT;');
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'1', 'alone: a configure() rolled back to a savepoint does not hide the committed source', timeout => 30);

$node->stop;
done_testing();
