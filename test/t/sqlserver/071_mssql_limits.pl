# 071_mssql_limits.pl
#   A destination's limits on the daemon on SQL Server and on a Babelfish
#   engine (QUEUEBOX_TEST_MSSQL_URL; skipped, saying why, when it is not
#   set), kept in the database (docs/delivery.md, "Limits":
#   queuebox.destination_limit and destination_limit_place, engine.sql
#   _limits_take):
#   1. one daemon, two outbox roles (TAP 067's case): rateLimit
#      {perSecond: 50, burst: 50} over 1100 rows, judged from the sink's
#      own request timestamps (no stretch over the bucket +5 %, 50/s
#      within 5 % past the burst), every row sent once, keys in order;
#      maxConcurrent: 1 against a sink that answers after 50 ms, never two
#      requests at once;
#   2. a second daemon on the same database: the same rate over 1100 rows
#      of another destination with both sending (two daemons with limits
#      of their own would send 100/s), on Babelfish too, whose claims wait
#      for each other (a claim's tokens are kept however long it waited,
#      and what it does not use goes back at once);
#   3. maxConcurrent: 1 across both: never two requests at once; the
#      daemon whose role holds the place (its claimers: those written
#      before the second started, or the others) is killed -9 (supervisor
#      and roles): its place stops counting when its claimer is gone (its
#      applock; on Babelfish its beat, within the beat's alive bound), so
#      the other sends every row, again never two at once from a second
#      after the kill.  Rows are counted before and after: none lost.
#   Waits are bounded polls; no assertion is on the test's own clock.
#
#   Drops and recreates schema queuebox in the database the URL names.
use strict;
use warnings;

use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxMssql;

BEGIN { QueueBoxMssql::mssql_skip_unless_url(); }

use HTTP::Tiny;
use PostgreSQL::Test::Utils;
use QueueBoxTest;
use QueueBoxDaemon;

my $rate = 50;
my $burst = 50;
qb_mssql_alone();
my $url = mssql_url();
my $dbh = mssql_connect($url);
mssql_reset($dbh);
my $babelfish = defined mssql_value($dbh, q{SELECT CAST(SERVERPROPERTY('BabelfishVersion') AS NVARCHAR(20))});
note $babelfish ? 'the server is Babelfish' : 'the server is SQL Server';
my %sink_r = map { $_ => qb_sink_start(name => "mssql_rate_$_") } qw(r s);
my $sink_c = qb_sink_start(name => 'mssql_one', delay_ms => 50);
my $sink_f = qb_sink_start(name => 'mssql_free');

my $conf = qb_config_yaml(
	outbox => { pollIntervalMs => 100, maxAttempts => 100, claimTimeoutMs => 5000 },
	destinations => {
		(map { $_ => { type => 'http', baseUrl => $sink_r{$_}{url}, timeoutMs => 2000,
			rateLimit => { perSecond => $rate, burst => $burst } } } qw(r s)),
		c => { type => 'http', baseUrl => $sink_c->{url}, timeoutMs => 2000, maxConcurrent => 1 },
		f => { type => 'http', baseUrl => $sink_f->{url}, timeoutMs => 2000 },
	},
	routes => [ map { { topicPattern => "$_.**", destination => $_ } } qw(r s c f) ],
	database => { url => $url, connectTimeoutMs => 3000, idlePollMaxMs => 500 },
	daemon => { outboxWorkers => 2, shutdownGraceMs => 5000 });
my $r = qbd_run('--config', qbd_write_conf($conf, 'migrate'), '--migrate');
is($r->[0], 0, 'the schema is installed') or diag $r->[2];

sub count
{
	my ($where) = @_;
	return mssql_value($dbh, "SELECT COUNT(*) FROM queuebox.outbox WHERE $where");
}

# a daemon started, and warmed: rows of f (no limit) over as many keys
# until each of its roles has claimed (a role's first claim on Babelfish
# takes about a second, and the tokens reserved before it would be spent
# that late: docs/delivery.md, "Limits")
my $warm = 0;
sub start
{
	my ($name) = @_;
	my $d = qbd_start(undef, $conf, name => $name);
	like(qbd_wait_daemon_log($d, qr/(?=.*outbox 0\[\d+\]: started)(?=.*outbox 1\[\d+\]: started)/s),
		qr/outbox 1\[\d+\]: started/, "$name started its two outbox roles");
	for (1 .. 3)
	{
		mssql_insert_keyed($dbh, 'f.warm', 40, 40, 'w' . $warm++);
		mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'f.warm' AND state <> N'sent'}, [],
			0, "$name: warm-up rows of f are sent");
	}
	return $d;
}

# the rate phase: $n rows of $topic over 275 keys to destination $dest, all sent at 50/s
sub rate_phase
{
	my ($dest, $n, $what) = @_;
	my $topic = "$dest.ev";
	mssql_insert_keyed($dbh, $topic, $n, 275, 'rk');
	is(count("topic = N'$topic'"), $n, "$what: $n rows over 275 keys");
	mssql_wait($dbh, "SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'$topic' AND state = N'sent'", [],
		$n, "$what: all $n rows are sent", timeout => 120);
	qb_sink_rate_held($sink_r{$dest}, $rate, $burst, $n, $what);
	my $o = mssql_key_order($dbh, $sink_r{$dest}, "topic = N'$topic'");
	is($o->{delivered} . '/' . $o->{dups}, "$n/0", "$what: every row sent, each once");
	is($o->{keys_in_order}, 275, "$what: all 275 keys in id order") or diag join("\n", @{ $o->{bad} });
	return;
}

# ==== 1. one daemon, two roles
my $a = start('daemon_a');
rate_phase('r', 1100, 'one daemon');
my $nc = 100;
mssql_insert_keyed($dbh, 'c.one', $nc, $nc, 'ck');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'c.one' AND state = N'sent'}, [], $nc,
	"one daemon: all $nc rows of c are sent");
is(qb_sink_stats($sink_c)->{max_concurrent}, 1, 'one daemon: the sink never had two requests at once');

# ==== 2. two daemons on the database
my %a_claimers = map { $_->[0] => 1 } @{ mssql_rows($dbh,
	q{SELECT claimer FROM queuebox.destination_limit_place WHERE destination = N'c'}) };
ok(scalar(keys %a_claimers), 'daemon A\'s roles wrote their places (claimers ' . join(', ', sort keys %a_claimers) . ')');
my $b = start('daemon_b');
rate_phase('s', 1100, 'two daemons');

# ==== 3. maxConcurrent 1 across both; the daemon whose role holds the place killed -9
HTTP::Tiny->new(timeout => 10)->post("$sink_c->{url}/_sink/reset");
my $n3 = 600;
my $before = count(q{topic <> N'f.warm'});
mssql_insert_keyed($dbh, 'c.two', $n3, $n3, 'ck2');
is(count(q{topic <> N'f.warm'}), $before + $n3, "two daemons: $n3 rows of c added");
mssql_wait($dbh, q{SELECT CASE WHEN COUNT(*) >= 40 THEN 1 ELSE 0 END FROM queuebox.outbox
	WHERE topic = N'c.two' AND state = N'sent'}, [], 1, 'two daemons: rows of c flow');
is(qb_sink_stats($sink_c)->{max_concurrent}, 1, 'two daemons: so far the sink never had two requests at once');
cmp_ok(mssql_value($dbh, q{SELECT COUNT(DISTINCT claimer) FROM queuebox.destination_limit_place WHERE destination = N'c'}),
	'>', scalar(keys %a_claimers), 'two daemons: daemon B\'s roles took part in c\'s places too');
my ($victim, $alive);
qb_wait_for(
	sub {
		my ($holder) = map { $_->[0] } @{ mssql_rows($dbh,
			q{SELECT claimer FROM queuebox.destination_limit_place WHERE destination = N'c' AND held > 0}) };
		($victim, $alive) = !defined $holder ? () : $a_claimers{$holder} ? ($a, $b) : ($b, $a);
		defined $victim;
	},
	'two daemons: a role holds c\'s place', timeout => 60);
note "$victim->{name}, whose role holds c's place, is killed; $alive->{name} stays";
my %victim_claimers = map { $_->[0] => 1 } @{ mssql_rows($dbh,
	q{SELECT claimer FROM queuebox.destination_limit_place WHERE destination = N'c'}) };
delete @victim_claimers{ grep { ($victim == $a) != !!$a_claimers{$_} } keys %victim_claimers };
qbd_kill9($victim, "$victim->{name} killed -9");
cmp_ok(count(q{topic = N'c.two' AND state <> N'sent'}), '>', 0, 'rows of c were still to be sent at the kill');
sleep 1;
HTTP::Tiny->new(timeout => 10)->post("$sink_c->{url}/_sink/reset");
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'c.two' AND state = N'sent'}, [], $n3,
	"after the kill all $n3 rows of c are sent by $alive->{name} (the dead one's place stopped counting)",
	timeout => 120);
is(qb_sink_stats($sink_c)->{max_concurrent}, 1, 'after the kill, again never two requests at once');
my $oc = mssql_key_order($dbh, $sink_c, q{topic = N'c.two'});
note "$oc->{dups} rows were sent twice: the killed daemon's requests in flight, taken over";
is(mssql_value($dbh, q{SELECT COUNT(*) FROM queuebox.destination_limit_place WHERE destination = N'c' AND held > 0
	AND claimer IN (} . join(',', map { int } keys %victim_claimers) . ')'), 0,
	'the killed daemon\'s claimers hold no place any more');

# ==== counts
is(count(q{topic <> N'f.warm'}), 2200 + $nc + $n3, 'every row is still in the outbox');
is(count(q{state <> N'sent'}), 0, 'and every one is sent');
qbd_signal($alive, 'TERM');
is(qbd_wait_exit($alive, 30), 0, "$alive->{name} stops cleanly");
qb_sink_stop($_) for values(%sink_r), $sink_c, $sink_f;
done_testing();
