# 060_mssql_takeover.pl
#   Takeover after kill -9 of a daemon on SQL Server and on a Babelfish
#   engine (QUEUEBOX_TEST_MSSQL_URL; skipped, saying why, when it is not
#   set).  Two daemons on one database: daemon A claims rows the sink holds
#   (their first attempt is answered after 100 s), daemon B starts beside
#   it and leaves them alone while A lives, then A is killed (supervisor
#   and roles at once) and B delivers every one of them while the leases
#   A's claims wrote (claimTimeoutMs 120 s) still have time left: the
#   database's own clock is compared with those lease_until values, so
#   a row that came back by its lease fails the test.  On SQL Server a
#   claimer is alive while its session applock is held; on Babelfish, whose
#   APPLOCK_TEST of a held lock crashes the server, while its beat in
#   queuebox.claimer_beat is fresh (docs/sqlserver.md).  Rows are counted
#   before and after: none lost, each held row delivered by B (its
#   last_error says taken over), none settled by A.
#
#   Drops and recreates schema queuebox in the database the URL names.
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

my $LEASE = 120000;
my $HELD = 10;
qb_mssql_alone();
my $url = mssql_url();
my $dbh = mssql_connect($url);
my $sink = qb_sink_start(name => 'mssql_takeover');
mssql_reset($dbh);
my $babelfish = defined mssql_value($dbh, q{SELECT CAST(SERVERPROPERTY('BabelfishVersion') AS NVARCHAR(20))});
note $babelfish ? 'the server is Babelfish: claimers beat' : 'the server is SQL Server: claimers hold an applock';

my $conf = qb_config_yaml(
	outbox => { pollIntervalMs => 100, claimTimeoutMs => $LEASE, batchSize => 20 },
	inbox => { relay => { claimTimeoutMs => $LEASE } },
	destinations => {
		web => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 110000 } },
	routes => [ { topicPattern => '**', destination => 'web' } ],
	database => { url => $url, connectTimeoutMs => 3000, idlePollMaxMs => 500 },
	daemon => { outboxWorkers => 2, shutdownGraceMs => 5000 });
my $r = qbd_run('--config', qbd_write_conf($conf, 'migrate'), '--migrate');
is($r->[0], 0, 'the schema is installed') or diag $r->[2];

sub count
{
	my ($where) = @_;
	return mssql_value($dbh, "SELECT COUNT(*) FROM queuebox.outbox WHERE $where");
}

sub started
{
	my ($d) = @_;
	for my $w (0, 1)
	{
		my $log = qbd_wait_daemon_log($d, qr/outbox $w\[\d+\]: started/);
		like($log, qr/outbox $w\[\d+\]: started/, "$d->{name}: outbox $w started");
	}
	return;
}

# ---- daemon A claims the held rows
my $a = qbd_start(undef, $conf, name => 'daemon_a');
started($a);
$dbh->begin_work;
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (?, ?, ?)}, 'held.x', "h$_",
	qq({"seq": $_, "_sink": {"fail": 1, "status": 200, "delay_ms": 100000}})) for 1 .. $HELD;
$dbh->commit;
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'held.x' AND state = N'processing'
	AND claimer IS NOT NULL}, [], $HELD, "daemon A: the $HELD held rows are processing under a claimer");
my @a_claimers = map { $_->[0] } @{ mssql_rows($dbh,
	q{SELECT DISTINCT claimer FROM queuebox.outbox WHERE topic = N'held.x'}) };
if ($babelfish)
{
	is(mssql_value($dbh, q{SELECT COUNT(*) FROM queuebox.claimer_beat WHERE alive_until > SYSUTCDATETIME()
		AND claimer IN (SELECT claimer FROM queuebox.outbox WHERE topic = N'held.x')}), scalar(@a_claimers),
		"daemon A: each of its claimers (@a_claimers) beats");
}

# ---- daemon B beside it: A is alive, its rows stay where they are
my $b = qbd_start(undef, $conf, name => 'daemon_b');
started($b);
my $before = mssql_rows($dbh, q{SELECT id, CONVERT(NVARCHAR(40), claim_token), claimer FROM queuebox.outbox
	WHERE topic = N'held.x' ORDER BY id});
# rows inserted after them go through (both daemons claim and reclaim meanwhile)
mssql_insert_keyed($dbh, 'other.x', 20, 5, 'o');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'other.x' AND state = N'sent'}, [], 20,
	'both alive: other rows are sent meanwhile');
if ($babelfish)
{
	# B's beats moved on since (its reclaim ran between them, once a second)
	my $beat = mssql_value($dbh, q{SELECT CONVERT(NVARCHAR(40), MAX(alive_until), 126) FROM queuebox.claimer_beat});
	mssql_wait($dbh, q{SELECT CASE WHEN MAX(alive_until) > ? THEN 1 ELSE 0 END FROM queuebox.claimer_beat}, [$beat], 1,
		'both alive: the beats go on');
}
mssql_insert_keyed($dbh, 'other.y', 1, 1, 'y');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'other.y' AND state = N'sent'}, [], 1,
	'both alive: a later row is sent too');
is_deeply(mssql_rows($dbh, q{SELECT id, CONVERT(NVARCHAR(40), claim_token), claimer FROM queuebox.outbox
	WHERE topic = N'held.x' AND state = N'processing' ORDER BY id}), $before,
	'daemon A alive: its held rows stay processing under its claims (same tokens, same claimers)');

# ---- kill -9 of daemon A: its supervisor stopped first, then every role
# killed, then the supervisor (a role that outlived it would release its
# rows as on a stop, PR_SET_PDEATHSIG)
my $lease_end = mssql_value($dbh, q{SELECT CONVERT(NVARCHAR(40), MIN(lease_until), 126) FROM queuebox.outbox
	WHERE topic = N'held.x' AND state = N'processing'});
my $roles = qbd_role_pids($a);
ok(defined $roles->{'outbox 0'} && defined $roles->{'outbox 1'}, 'daemon A: its role processes are known')
  or diag explain $roles;
qbd_kill9($a, 'daemon A');
unlike(qbd_log($a), qr/could not register for takeover/, 'daemon A: every role had registered for takeover');

# ---- daemon B takes A's rows over, before their leases end
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'held.x' AND state = N'sent'}, [], $HELD,
	"daemon B: A's $HELD held rows are sent", timeout => 100);
cmp_ok(mssql_value($dbh, q{SELECT DATEDIFF(ms, SYSUTCDATETIME(), CONVERT(DATETIME2(6), ?, 126))}, $lease_end), '>', 0,
	"daemon B: every held row was sent before the first of A's leases ($lease_end) ended");
is(count(q{topic = N'held.x' AND last_error LIKE N'taken over:%'}), $HELD,
	'each held row was taken over (its last_error says so), not returned by its lease');
is(count(q{topic = N'held.x' AND attempt = 1}), $HELD,
	'each held row counts one attempt: B\'s, which the sink answered (A settled none)');

# ---- counts: nothing lost, each row delivered
is(count('1 = 1'), $HELD + 21, 'every row is still there');
is(count(q{state <> N'sent'}), 0, 'every row is sent');
my $by = qb_sink_by_id($sink);
my @held_ids = map { lc $_->[0] } @{ mssql_rows($dbh,
	q{SELECT CONVERT(NVARCHAR(40), message_id) FROM queuebox.outbox WHERE topic = N'held.x'}) };
is(scalar(grep { my $m = $_; grep { $_->{status} == 200 } @{ $by->{$m} // [] } } @held_ids), $HELD,
	'the sink answered each held row once it was taken over');

qbd_signal($b, 'TERM');
is(qbd_wait_exit($b, 30), 0, 'daemon B stops');
unlike(qbd_log($b), qr/could not register for takeover/, 'daemon B: every role had registered for takeover');
qb_sink_stop($sink);
done_testing();
