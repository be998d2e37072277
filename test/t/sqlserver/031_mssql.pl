# 031_mssql.pl
#   queuebox-mssqld on SQL Server (QUEUEBOX_TEST_MSSQL_URL, e.g.
#   sqlserver://qb:secret@127.0.0.1:1433/qbtest?encrypt=false; skipped,
#   saying why, when it is not set): the migrations (twice, two at once, a
#   foreign schema refused), delivery with per-key order by two outbox
#   workers, rows parked behind final ones released by the sweep, what a
#   failed connect says to check (a wrong password, a database that is not
#   there, a closed port), retries
#   and dead rows, a down destination beside a healthy one with a hot key, kill -9
#   of an outbox role mid-delivery, the server cut away and given back,
#   the ingress with duplicates and a bad signature, the relay with its
#   headers and a source's onDead: holdKey, the five pull statements and
#   the claim's app-lock timeout (Msg 51000), the admin routes and
#   /metrics, and T-SQL topic_matches
#   against the extension's C one, takeover (the applock on SQL Server, the
#   claimers' beats on Babelfish), and the upgrade of filled 0.3.0, 0.3.1,
#   0.3.2, 0.3.3, 0.3.4, 0.3.5, 0.3.6 and 0.3.7 schemas (0.3.6: the outbox takes its
#   session's trace context, the relay claim returns a row's traceparent;
#   TAP 065 has the rest of it; 0.3.7 records the version only; 0.3.8:
#   config_route made again, a fan-out route's rows marked at insert,
#   route_of names every destination; TAP 073 has the rest of it).  Every case counts rows
#   before and after.
#
#   The suite drops and recreates schema queuebox in the database the URL
#   names: give it a database of its own.
use strict;
use warnings;

use Digest::SHA qw(hmac_sha256_hex);
use HTTP::Tiny;
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time usleep);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxMssql;

BEGIN { QueueBoxMssql::mssql_skip_unless_url(); }

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use QueueBoxTest;
use QueueBoxDaemon;

qb_mssql_alone();
my $url = mssql_url();
my $dbh = mssql_connect($url);
my $json = JSON::PP->new->canonical(1);
my $sink = qb_sink_start(name => 'mssql', delay_ms => 5);
mssql_reset($dbh);
# Two outbox workers on SQL Server and on a Babelfish engine alike: that
# engine ignores READPAST and the share lock a claim parks a row under, so
# a settle can miss a park there, and the sweep releases the row
# (docs/sqlserver.md).  Every row must still be delivered, in key order.
my $babelfish = defined mssql_value($dbh, q{SELECT CAST(SERVERPROPERTY('BabelfishVersion') AS NVARCHAR(20))});
my $workers = 2;
note $babelfish ? 'the server is Babelfish: two outbox workers, the sweep frees what a missed park strands'
  : 'the server is SQL Server: two outbox workers';

sub conf
{
	my (%o) = @_;
	return qb_config_yaml(
		outbox => { pollIntervalMs => 100, maxAttempts => 3, claimTimeoutMs => 5000, batchSize => 20,
			backoff => { initialMs => 50, maxMs => 200 }, %{ $o{outbox} // {} } },
		destinations => $o{destinations} // {
			sink => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 3000 } },
		routes => $o{routes} // [ { topicPattern => '**', destination => 'sink' } ],
		database => { url => $o{url} // $url, connectTimeoutMs => 3000, idlePollMaxMs => 500,
			%{ $o{database} // {} } },
		daemon => { outboxWorkers => $o{workers} // $workers, shutdownGraceMs => 5000 }) . ($o{extra} // '');
}

sub count
{
	my ($table, $where, @bind) = @_;
	return mssql_value($dbh, "SELECT COUNT(*) FROM queuebox.$table" . ($where ? " WHERE $where" : ''), @bind);
}

sub all_final
{
	my ($like, $n, $what) = @_;
	mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE state IN (N'sent', N'dead') AND topic LIKE ?},
		[$like], $n, $what, timeout => 180);
}

sub check_order
{
	my ($like, $n, $what) = @_;
	my $o = mssql_key_order($dbh, $sink, 'topic LIKE ?', $like);
	is($o->{delivered}, $n, "$what: every row delivered");
	is($o->{keys_in_order}, $o->{keys}, "$what: every key in id order") or diag explain $o->{bad};
	return $o;
}

# ---- migrations
my $r = qbd_run('--config', qbd_write_conf(conf(), 'migrate'), '--migrate');
is($r->[0], 0, '--migrate creates the schema') or diag $r->[2];
like($r->[2], qr/created the QueueBox schema on SQL Server \(version \d+\.\d+\.\d+\)/, '--migrate says it created the schema');
my $version = mssql_value($dbh, 'SELECT queuebox._schema_version()');
is(mssql_value($dbh, 'SELECT COUNT(*) FROM queuebox.schema_version WHERE version = ?', $version), 1,
	'the version is recorded once');
$r = qbd_run('--config', qbd_write_conf(conf(), 'migrate'), '--migrate');
is($r->[0], 0, '--migrate again: nothing to do') or diag $r->[2];
unlike($r->[2], qr/created/, '--migrate again creates nothing');
mssql_reset($dbh);
{
	my @h = map {
		my $out = '';
		my $h = IPC::Run::start([ qbd_binary(), '--config', qbd_write_conf(conf(), "m$_"), '--migrate' ],
			'>', \$out, '2>', \$out);
		[ $h, \$out ]
	} 1 .. 2;
	my @rc = map { $_->[0]->finish; $? >> 8 } @h;
	is("@rc", '0 0', 'two --migrate at once both succeed (the app lock serialises them)')
	  or diag ${ $h[0][1] }, ${ $h[1][1] };
	is(mssql_value($dbh, 'SELECT COUNT(*) FROM queuebox.schema_version'), 1, 'two --migrate at once: one schema, one version row');
}
is(mssql_value($dbh, q{SELECT COUNT(*) FROM queuebox.config_route WHERE pattern = N'**' AND destination = N'sink'}), 1,
	'the routes are written where the procedures read them');

# ---- a failed connect says what to do: a refused login, a database that is
# not there, a port nobody listens on (qb_odbc_connect_advice reads SQL
# Server's numbers and the SQLSTATE's class; Babelfish answers with its own
# numbers where docs/sqlserver.md says so)
{
	my $fails = sub {
		my ($what, $bad, $advice) = @_;
		my $r = qbd_run('--config', qbd_write_conf(conf(url => $bad), 'connect'), '--migrate');
		isnt($r->[0], 0, "$what: --migrate fails");
		like($r->[2], $advice, "$what: the message says what to check") or diag $r->[2];
		unlike($r->[1] . $r->[2], qr/Wrong-Secret-9/, "$what: no message shows the password");
	};
	(my $bad = $url) =~ s{^(sqlserver://[^:@/]+)(?::[^@/]*)?\@}{$1:Wrong-Secret-9\@};
	$fails->('a wrong password', $bad, qr/check the user and the password in database\.url/);
	($bad = $url) =~ s{^(sqlserver://[^/]+/)[^?]*}{${1}qb_no_such_database_31};
	$fails->('a database that does not exist', $bad, qr/check the database in database\.url's path/);
	# a port just bound and let go: nothing listens there
	my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0, ReuseAddr => 1)
	  or die "no free port: $!";
	my $port = $s->sockport;
	close $s;
	($bad = $url) =~ s{\@[^/]+/}{\@127.0.0.1:$port/};
	$fails->('a closed port', $bad, qr/check database\.url's host and port/);
}

# ---- the store conformance suite, odbc kind (test/store/conformance.c, as TAP 027 runs it)
{
	(my $bad = $url) =~ s{^(sqlserver://[^:@/]+)(?::[^@/]*)?\@}{$1:Wrong-Secret-9\@};
	local $ENV{QB_CONFORMANCE_MSSQL_URL} = $url;
	local $ENV{QB_CONFORMANCE_BAD_MSSQL_URL} = $bad;
	my ($out, $errout) = ('', '');
	IPC::Run::run([ qb_test_binary('test/store/conformance'), 'odbc' ], '>', \$out, '2>', \$errout);
	is($? >> 8, 0, 'the store conformance suite passes against the ODBC store') or diag "$out\n$errout";
	like($out . $errout, qr/\[  PASSED  \] 15 test\(s\)/, 'the fifteen common scenarios ran');
	unlike($out . $errout, qr/Wrong-Secret-9/, 'no message shows the wrong password');
	is(count('outbox') + count('inbox'), 0, 'the suite leaves the tables empty');
}

# ---- delivery, per-key order, and the schema's refusals
my $d = qbd_start(undef, conf(), name => 'mssql');
qbd_wait_daemon_log($d, qr/outbox \d\[\d+\]: started/);
mssql_insert_keyed($dbh, 'orders.created', 300, 15, 'k');
all_final('orders.created', 300, 'delivery: 300 rows reach a final state');
is(count('outbox', q{topic = N'orders.created' AND state <> N'sent'}), 0, 'delivery: every row is sent');
my $o = check_order('orders.created', 300, 'delivery');
is($o->{dups}, 0, 'delivery: no row delivered twice');
is(count('outbox', q{state = N'pending' AND hold = N'key'}), 0, 'delivery: no row is left parked');

# ---- the sweep: rows parked behind keys whose earlier rows are all final (the
# state a missed park leaves) are released by the running daemon and delivered
{
	# in one transaction, so no claim meets them otherwise: the first row of
	# each key sent, every later one parked, as a missed promotion leaves them
	$dbh->begin_work;
	my $sth = $dbh->prepare(q{INSERT INTO queuebox.outbox (topic, [key], payload, state, hold) VALUES (?, ?, ?, ?, ?)});
	$sth->execute($_ < 3 ? ('sweep.ended', 'sw' . $_, '{}', 'sent', undef)
		: ('sweep.parked', 'sw' . ($_ % 3), qq({"seq":$_}), 'pending', 'key')) for 0 .. 29;
	$dbh->commit;
	is(count('outbox', q{topic = N'sweep.parked' AND hold = N'key'}), 27, 'sweep: 27 rows parked behind 3 sent ones');
	all_final('sweep.parked', 27, 'sweep: the daemon releases and delivers them');
	is(count('outbox', q{topic = N'sweep.parked' AND state = N'sent'}), 27, 'sweep: all 27 are sent');
	is(count('outbox', q{topic = N'sweep.parked' AND hold IS NOT NULL}), 0, 'sweep: none is left parked');
	check_order('sweep.parked', 27, 'sweep');
}
{
	my $req = (grep { $_->{path} eq '/events' } @{ qb_sink_requests($sink) })[0];
	like($req->{headers}{'x-message-id'}, qr/^[0-9a-f-]{36}$/, 'delivery: the message id is a UUID in small letters');
	like($req->{body}, qr/"seq"/, 'delivery: the payload is the row\'s');
}
eval { mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, payload) VALUES (N'x', N'not json')}) };
like($@, qr/outbox_payload_check/, 'a payload that is not JSON is refused by its CHECK constraint');
eval { mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, payload, headers) VALUES (N'x', N'{}', N'[1]')}) };
like($@, qr/outbox_headers_check/, 'headers that are not a JSON object are refused');
eval { mssql_do($dbh, q{UPDATE queuebox.outbox SET state = N'lost' WHERE id = (SELECT MIN(id) FROM queuebox.outbox)}) };
like($@, qr/outbox_state_check/, 'a state the spec does not name is refused');

# ---- retries, then dead
my $failing = qb_sink_start(name => 'mssql_500', status => 500);
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops on SIGTERM');
my $two = conf(
	destinations => {
		sink => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 3000 },
		failing => { type => 'http', baseUrl => $failing->{url}, path => '/x', timeoutMs => 3000,
			circuitBreaker => { failures => 1000 } } },
	routes => [ { topicPattern => 'fail.*', destination => 'failing' }, { topicPattern => '**', destination => 'sink' } ]);
$d = qbd_start(undef, $two, name => 'mssql_retry');
mssql_insert_keyed($dbh, 'fail.always', 10, 10, 'f');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'fail.always' AND state = N'dead'}, [], 10,
	'retry: every row of a failing destination goes dead after maxAttempts', timeout => 120);
is(mssql_value($dbh, q{SELECT MIN(attempt) FROM queuebox.outbox WHERE topic = N'fail.always'}), 3,
	'retry: each dead row made its three attempts');
like(mssql_value($dbh, q{SELECT MAX(last_error) FROM queuebox.outbox WHERE topic = N'fail.always'}), qr/500/,
	'retry: last_error says what the destination answered');
is(scalar(grep { $_->{path} eq '/x' } @{ qb_sink_requests($failing) }), 30, 'retry: the failing destination saw 3 attempts of each row');

# ---- onDead: holdKey: a dead head keeps its key's later rows parked until
# an operator requeues it (edited here) or skips it
qbd_signal($d, 'TERM');
qbd_wait_exit($d, 30);
$d = qbd_start(undef, conf(routes => [ { topicPattern => 'hold.*', destination => 'sink', onDead => 'holdKey' },
	{ topicPattern => '**', destination => 'sink' } ]), name => 'mssql_hold');
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, max_attempts) VALUES
	(N'hold.a', N'hk1', N'{"key": "hk1", "seq": 0, "_sink": {"status": 500}}', 1),
	(N'hold.a', N'hk1', N'{"key": "hk1", "seq": 1}', NULL),
	(N'hold.a', N'hk1', N'{"key": "hk1", "seq": 2}', NULL),
	(N'hold.a', N'hk2', N'{"key": "hk2", "seq": 0, "_sink": {"status": 500}}', 1),
	(N'hold.a', N'hk2', N'{"key": "hk2", "seq": 1}', NULL)});
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'hold.a' AND state = N'dead' AND hold = N'dead'},
	[], 2, 'holdKey: both heads go dead holding their keys', timeout => 120);
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'hold.a' AND state = N'pending' AND hold = N'key'},
	[], 3, 'holdKey: the later rows are parked behind them', timeout => 120);
# ok deliveries of a key, as seq ("e": an edited body), in log order
my $held_sent = sub {
	my ($key, $all) = @_;
	my @seq;
	for my $r (@{ qb_sink_requests($sink) })
	{
		next unless $all || ($r->{status} >= 200 && $r->{status} < 300);
		my $b = eval { decode_json($r->{body}) } or next;
		push @seq, $b->{seq} . ($b->{edited} ? 'e' : '') if ($b->{key} // '') eq $key;
	}
	return join(',', @seq);
};
is($held_sent->('hk1', 1) . '|' . $held_sent->('hk2', 1), '0|0', 'holdKey: the sink saw only the failed heads');
is(join(';', map { join('|', @$_[0, 2, 3, 4]) } @{ mssql_rows($dbh, 'EXEC queuebox.held_keys') }),
	join(';', 'hk1|' . mssql_value($dbh, q{SELECT id FROM queuebox.outbox WHERE [key] = N'hk1' AND state = N'dead'}) . '|dead|2',
		'hk2|' . mssql_value($dbh, q{SELECT id FROM queuebox.outbox WHERE [key] = N'hk2' AND state = N'dead'}) . '|dead|1'),
	'held_keys: both keys, their dead heads and the rows behind');
my ($hk1, $hk2) = map { mssql_value($dbh, q{SELECT id FROM queuebox.outbox WHERE [key] = ? AND state = N'dead'}, $_) } qw(hk1 hk2);
eval { mssql_rows($dbh, 'EXEC queuebox.requeue_outbox_edited ?, ?', $hk1, '{not json') };
like($@, qr/payload is not JSON/, 'requeue_outbox_edited refuses a payload that is not JSON');
is(count('outbox_audit', 'outbox_id IN (?, ?)', $hk1, $hk2) . '|' . count('outbox', q{id = ? AND state = N'dead' AND hold = N'dead'}, $hk1),
	'0|1', 'and changes nothing');
is(mssql_value($dbh, 'EXEC queuebox.requeue_outbox_edited ?, ?', $hk1, '{"key": "hk1", "seq": 0, "edited": true}'), 1,
	'requeue_outbox_edited answers 1');
is(mssql_value($dbh, 'EXEC queuebox.skip_outbox ?', $hk2), 1, 'skip_outbox answers 1');
is(mssql_value($dbh, 'EXEC queuebox.skip_outbox ?', $hk2), 0, 'skip_outbox answers 0 for a row that holds nothing');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'hold.a' AND state = N'sent'}, [], 4,
	'holdKey: the requeued and the skipped key drain', timeout => 120);
is($held_sent->('hk1'), '0e,1,2', 'the sink got the edited head first, then the rest in order');
is($held_sent->('hk2'), '1', 'the skipped key goes on without its head');
is(count('outbox', q{id = ? AND state = N'dead' AND hold IS NULL}, $hk2), 1, 'the skipped head stays dead, holding nothing');
is(join(";", map { join("|", map { $_ // "" } @$_) } @{ mssql_rows($dbh,
		q{SELECT outbox_id, action, CASE WHEN done_by <> N'' THEN 1 ELSE 0 END, payload_before, payload_after
		  FROM queuebox.outbox_audit WHERE outbox_id IN (?, ?) ORDER BY id}, $hk1, $hk2) }),
	qq{$hk1|requeue|1|{"key": "hk1", "seq": 0, "_sink": {"status": 500}}|{"key": "hk1", "seq": 0, "edited": true};$hk2|skip|1||},
	'the edited requeue and the skip are audited: who, the payload before and after');

# ---- a down destination beside a healthy one, with a hot key
qbd_signal($d, 'TERM');
qbd_wait_exit($d, 30);
my $down = qb_free_port();
$d = qbd_start(undef, conf(
	destinations => {
		down => { type => 'http', baseUrl => "http://127.0.0.1:$down", timeoutMs => 500,
			circuitBreaker => { failures => 3, cooldownMs => 600000 } },
		sink => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 3000 } },
	routes => [ { topicPattern => 'down.*', destination => 'down' }, { topicPattern => '**', destination => 'sink' } ],
	outbox => { maxAttempts => 1000 }), name => 'mssql_isolation');
qbd_wait_daemon_log($d, qr/outbox \d\[\d+\]: started/);
mssql_insert_keyed($dbh, 'down.x', 200, 5, 'dk');
mssql_insert_keyed($dbh, 'healthy.hot', 150, 1, 'hot');
mssql_insert_keyed($dbh, 'healthy.cold', 300, 50, 'c');
all_final('healthy.%', 450, 'down destination: the healthy destination delivers all its rows, hot key included');
check_order('healthy.%', 450, 'down destination: healthy rows');
mssql_wait($dbh, q{SELECT state FROM queuebox.destination_state WHERE destination = N'down'}, [], 'open',
	'down destination: its circuit is open');
is(count('outbox', q{topic = N'down.x' AND state = N'dead'}), 0, 'down destination: its rows are not spent (none dead)');
is(count('outbox', q{topic = N'down.x'}), 200, 'down destination: its 200 rows are all still there');
{
	my $st = mssql_rows($dbh, 'EXEC queuebox.destination_status');
	my ($row) = grep { $_->[0] eq 'down' } @$st;
	is($row->[1], 'open', 'destination_status: the down destination is open');
	# every row of it waits (pending); held counts only those a claim set
	# aside once the circuit was open: the heads that failed before it
	# opened wait routed, unheld (docs/operations.md), so held may be 0.
	# When it fails, what the down destination's rows and the circuits were.
	ok($row->[8] == 200 && $row->[9] <= 5,
		"destination_status: its 200 rows pending, at most its 5 heads held ($row->[8], $row->[9])")
	  or diag(join("\n", map { join('|', map { $_ // 'NULL' } @$_) }
		@{ mssql_rows($dbh, q{SELECT state, hold, [key], attempt, destination,
			CONVERT(NVARCHAR(40), scheduled_at, 121), CONVERT(NVARCHAR(40), SYSUTCDATETIME(), 121)
			FROM queuebox.outbox WHERE topic = N'down.x' AND (hold IS NULL OR hold <> N'key')}) },
		@{ mssql_rows($dbh, q{SELECT * FROM queuebox.destination_state}) }));
}

# takeover: every role registers its claimer, on SQL Server by its session
# applock, on Babelfish (whose APPLOCK_TEST of a lock another session holds
# crashes the server at the fifth call) by its beat in claimer_beat
unlike(qbd_log($d), qr/could not register for takeover/, 'every role registered for takeover');
if ($babelfish)
{
	cmp_ok(mssql_value($dbh, q{SELECT COUNT(*) FROM queuebox.claimer_beat WHERE alive_until > SYSUTCDATETIME()}),
		'>=', $workers + 1, 'Babelfish: each outbox role and the relay beat (claimer_beat)');
}

# ---- kill -9 of an outbox role mid-delivery
mssql_insert_keyed($dbh, 'kill.role', 400, 20, 'kr');
mssql_wait($dbh, q{SELECT CASE WHEN COUNT(*) > 40 THEN 1 ELSE 0 END FROM queuebox.outbox WHERE topic = N'kill.role' AND state = N'sent'},
	[], 1, 'kill -9 role: delivery is under way');
my $pids = qbd_role_pids($d);
my $off = -s $d->{log};
ok(kill('KILL', $pids->{'outbox 0'}), 'kill -9 role: outbox 0 killed');
my $log = qbd_wait_daemon_log($d, qr/outbox 0\[\d+\]: started/, $off);
like($log, qr/outbox 0 \(pid \d+\) was killed by signal 9; restarting it/, 'kill -9 role: the supervisor restarts it');
all_final('kill.role', 400, 'kill -9 role: every row reaches a final state (the lease returns what it held)');
is(count('outbox', q{topic = N'kill.role' AND state <> N'sent'}), 0, 'kill -9 role: every row is sent');
check_order('kill.role', 400, 'kill -9 role');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');

# ---- the server cut away and given back (a proxy between the daemon and the server)
my $proxy = mssql_proxy_start($url);
$d = qbd_start(undef, conf(url => $proxy->{url}), name => 'mssql_cut');
qbd_wait_daemon_log($d, qr/outbox \d\[\d+\]: started/);
mssql_insert_keyed($dbh, 'cut.server', 400, 20, 'cs');
mssql_wait($dbh, q{SELECT CASE WHEN COUNT(*) > 20 THEN 1 ELSE 0 END FROM queuebox.outbox WHERE topic = N'cut.server' AND state = N'sent'},
	[], 1, 'server cut: delivery is under way');
$off = -s $d->{log};
mssql_proxy_cut($proxy);
my $at_cut = count('outbox', q{topic = N'cut.server' AND state = N'sent'});
$log = qbd_wait_daemon_log($d, qr/WARNING outbox \d\[\d+\]: .*(unreachable|connect|link|SQLSTATE 08)/i, $off, timeout => 30);
like($log, qr/WARNING outbox \d\[\d+\]: /, 'server cut: the roles log the lost server');
sleep 2;
is(count('outbox', q{topic = N'cut.server'}), 400, 'server cut: no row is lost while the server is away');
$proxy = mssql_proxy_start($url, port => $proxy->{port});
all_final('cut.server', 400, 'server cut: back, every row reaches a final state');
is(count('outbox', q{topic = N'cut.server' AND state <> N'sent'}), 0, 'server cut: every row is sent');
check_order('cut.server', 400, 'server cut');
unlike(qbd_log($d, $off), qr/restarting it in/, 'server cut: no role died, they reconnected');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');
mssql_proxy_stop($proxy);

# ---- the ingress, the relay, pull, admin and metrics
my $port = qb_free_port();
my $base = "http://127.0.0.1:$port";
my $http = HTTP::Tiny->new(timeout => 30, keep_alive => 0);
my $secret = 'whsec-mssql-0123456789';
my $token = 'admin-token-mssql-0123456789';
# Babelfish compiles each procedure on a session's first call (docs/sqlserver.md):
# 2 to 5 s for _inbox_insert and destination_status here, past the 5 s
# default when the machine is busy, so the first webhook and the first
# overview of a session would answer 503; SQL Server keeps the default
my $store_timeout = $babelfish ? 30000 : 5000;
my $inbox_yaml = conf(
	destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/hooks', timeoutMs => 3000 } },
	routes => [ { topicPattern => 'shop.**', destination => 'web' }, { topicPattern => 'tasks.**', destination => 'web' },
		{ topicPattern => 'hold.**', destination => 'web' } ],
	workers => 1,
	extra => <<"EOY");
http: { listen: "127.0.0.1:$port", storeTimeoutMs: $store_timeout }
admin: { token: "$token" }
sources:
  shop:
    type: http
    path: /shop
    idempotencyKeyPath: \$.id
    eventTypePath: \$.type
    aggregateIdPath: \$.order
    topic: "shop.{{ eventType }}"
    auth: { type: hmac-sha256, header: X-Signature, secret: "$secret" }
  tasks:
    type: http
    path: /tasks
    idempotencyKeyHeader: X-Task-Id
    consumption: pull
    topic: "tasks.{{ source }}"
  hold:
    type: http
    path: /hold
    idempotencyKeyPath: \$.id
    eventTypePath: \$.type
    aggregateIdPath: \$.order
    onDead: holdKey
inbox:
  relay: { pollIntervalMs: 50 }
EOY
$d = qbd_start(undef, $inbox_yaml, name => 'mssql_inbox');
qb_wait_for(sub { $http->get("$base/readyz")->{status} == 200 }, '/readyz: the SQL Server is reachable', timeout => 30);

sub post_shop
{
	my ($body, %h) = @_;
	return $http->request('POST', "$base/inbox/shop", {
		content => $body,
		headers => { 'Content-Type' => 'application/json', 'X-Correlation-Id' => 'corr-1',
			'X-Signature' => $h{sig} // hmac_sha256_hex($body, $secret) } });
}
my $before = count('inbox');
for my $seq (1 .. 4)
{
	for my $order (1 .. 2)
	{
		my $rr = post_shop($json->encode({ id => "e-$order-$seq", type => 'order.step', order => "o$order", seq => $seq }));
		is($rr->{status}, 202, "webhook e-$order-$seq: 202") if $seq == 1;
	}
}
my $dup = post_shop($json->encode({ id => 'e-1-1', type => 'order.step', order => 'o1', seq => 1 }));
is($dup->{status}, 200, 'a repeated idempotency key: 200');
like($dup->{content}, qr/"status":\s*"duplicate"/, 'a repeated idempotency key: duplicate');
is(post_shop('{"id": "forged", "type": "x"}', sig => 'deadbeef')->{status}, 401, 'a bad signature: 401');
is(count('inbox', q{idempotency_key = N'forged'}), 0, 'a bad signature stores nothing');
is(count('inbox') - $before, 8, 'eight webhooks stored once each');
qb_wait_for(sub { scalar(grep { $_->{path} eq '/hooks' } @{ qb_sink_requests($sink) }) >= 8 },
	'the relay and the outbox deliver the eight webhooks', timeout => 60);
my @hooks = grep { $_->{path} eq '/hooks' } @{ qb_sink_requests($sink) };
is(scalar(@hooks), 8, 'each webhook is delivered once');
my %seq_of;
my $order_ok = 1;
for my $h (@hooks)
{
	my $p = $json->decode($h->{body});
	$order_ok = 0 if ($seq_of{ $p->{order} } // 0) > $p->{seq};
	$seq_of{ $p->{order} } = $p->{seq};
}
ok($order_ok, "each order's webhooks arrive in the order received");
is($hooks[0]{headers}{'x-source'}, 'shop', 'the relay sets x-source');
like($hooks[0]{headers}{'x-idempotency-key'}, qr/^e-\d-\d$/, 'the relay sets x-idempotency-key');
ok($hooks[0]{headers}{'x-inbox-id'}, 'the relay sets x-inbox-id');
is($hooks[0]{headers}{'x-correlation-id'}, 'corr-1', 'the relay keeps X-Correlation-Id');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.inbox WHERE source = N'shop' AND state = N'processed'}, [], 8,
	'the relay marks the push rows processed');

# onDead: holdKey on a source, in the relay's aggregate order: h1/2 has no
# type, so its topic ({{ eventType }}) renders empty and it goes dead,
# holding h1; an edited requeue goes through the relay again and dies again
# (the template still renders empty), holding again; a skip lets h1 go on
sub post_hold
{
	my ($seq, $type) = @_;
	my %b = (id => "h1-$seq", order => 'h1', seq => $seq);
	$b{type} = $type if defined $type;
	my $rr = $http->request('POST', "$base/inbox/hold",
		{ content => $json->encode(\%b), headers => { 'Content-Type' => 'application/json' } });
	is($rr->{status}, 202, "holdKey webhook h1/$seq: 202");
}
my $hold_sent = sub {
	join(',', map { my $b = $json->decode($_->{body}); $b->{seq} . ($b->{edited} ? 'e' : '') }
		grep { $_->{path} eq '/hooks' && $_->{body} =~ /"order":\s*"h1"/ } @{ qb_sink_requests($sink) });
};
my $hold_states = sub {
	join(',', map { join(':', map { $_ // '-' } @$_) } @{ mssql_rows($dbh,
		q{SELECT idempotency_key, state, hold FROM queuebox.inbox WHERE aggregate_id = N'h1' ORDER BY created_at, id}) });
};
my $inbox_before = count('inbox');
post_hold($_, $_ == 2 ? undef : 'hold.step') for 1 .. 3;
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.inbox WHERE aggregate_id = N'h1' AND state = N'pending' AND hold = N'aggregate'},
	[], 1, 'holdKey (relay): the row behind the dead head is parked');
post_hold(4, 'hold.step');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.inbox WHERE aggregate_id = N'h1' AND state = N'pending' AND hold = N'aggregate'},
	[], 2, 'holdKey (relay): a new row of the held aggregate is parked too');
qb_wait_for(sub { $hold_sent->() eq '1' }, 'holdKey (relay): h1/1 is delivered');
is($hold_states->(), 'h1-1:processed:-,h1-2:dead:dead,h1-3:pending:aggregate,h1-4:pending:aggregate',
	'holdKey (relay): the head is dead and holding, the rest parked');
is(count('outbox', q{[key] = N'h1'}), 1, 'holdKey (relay): one outbox row for h1');
my $hh = mssql_value($dbh, q{SELECT id FROM queuebox.inbox WHERE idempotency_key = N'h1-2'});
is(join('|', map { $_ // '' } @{ mssql_rows($dbh, 'EXEC queuebox.held_aggregates')->[0] }[0 .. 3]),
	"h1|hold|$hh|2", 'held_aggregates: h1, its source, its dead head, two rows behind');
my %hadm = (headers => { Authorization => "Bearer $token", 'Content-Type' => 'application/json' });
my $hr = $http->request('GET', "$base/admin/inbox/held", \%hadm);
is($hr->{status}, 200, 'GET /admin/inbox/held') or diag $hr->{content};
like($hr->{content}, qr/"aggregate_id":\s*"h1".*"head_id":\s*$hh/, 'the admin route lists h1 and its head');
$hr = $http->request('POST', "$base/admin/inbox/$hh/requeue",
	{ %hadm, content => '{"payload": {"id": "h1-2", "order": "h1", "seq": 2, "edited": true}}' });
is($hr->{status}, 200, 'POST /admin/inbox/{id}/requeue with an edited payload') or diag $hr->{content};
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.inbox WHERE id = ? AND state = N'dead' AND hold = N'dead' AND payload LIKE N'%edited%'},
	[$hh], 1, 'the edited row goes through the relay again and, its topic still empty, dies holding again');
is($hold_states->(), 'h1-1:processed:-,h1-2:dead:dead,h1-3:pending:aggregate,h1-4:pending:aggregate',
	'the rows behind it stay parked');
$hr = $http->request('POST', "$base/admin/inbox/$hh/skip", \%hadm);
is($hr->{status}, 200, 'POST /admin/inbox/{id}/skip') or diag $hr->{content};
qb_wait_for(sub { $hold_sent->() eq '1,3,4' }, 'after the skip h1 goes on, in order') or diag $hold_sent->();
is($hold_states->(), 'h1-1:processed:-,h1-2:dead:-,h1-3:processed:-,h1-4:processed:-', 'the skipped head stays dead, holding nothing');
is(mssql_value($dbh, 'EXEC queuebox.skip_inbox ?', $hh), 0, 'skip_inbox answers 0 for a row that holds nothing');
# payloads compared as JSON: the ingress stores a body as it re-serialises it
is(join(';', map { join('|', map { $_ // '' } @$_[0 .. 2], map { defined $_ ? $json->encode($json->decode($_)) : '' } @$_[3, 4]) }
		@{ mssql_rows($dbh,
		q{SELECT inbox_id, action, CASE WHEN done_by <> N'' THEN 1 ELSE 0 END, payload_before, payload_after
		  FROM queuebox.inbox_audit WHERE inbox_id = ? ORDER BY id}, $hh) }),
	qq{$hh|requeue|1|{"id":"h1-2","order":"h1","seq":2}|{"edited":true,"id":"h1-2","order":"h1","seq":2};$hh|skip|1||},
	'the edited requeue and the skip are audited: who, the payload before and after');
is(count('inbox') - $inbox_before, 4, 'four held-source rows, stored once each');
is(count('outbox', q{[key] = N'h1'}), 3, 'three outbox rows for h1: the skipped head has none');

# pull: the five statements of examples/pull/sql/sqlserver
for my $i (1 .. 3)
{
	my $rr = $http->request('POST', "$base/inbox/tasks",
		{ content => qq({"n": $i}), headers => { 'Content-Type' => 'application/json', 'X-Task-Id' => "t$i" } });
	is($rr->{status}, 202, "pull webhook t$i: 202");
}
# a key longer than the column: refused with the reason, nothing stored
{
	my $before_long = count('inbox');
	my $rr = $http->request('POST', "$base/inbox/tasks",
		{ content => '{"n": 9}', headers => { 'Content-Type' => 'application/json', 'X-Task-Id' => 'k' x 401 } });
	is($rr->{status}, 503, 'an idempotency key longer than SQL Server stores: 503 (the core takes 1024 bytes)');
	like($rr->{content}, qr/is 401 characters long; SQL Server stores at most 400/, 'the answer says which field and the limit');
	is(count('inbox'), $before_long, 'the long key stores nothing');
}

# the statement of examples/pull/sql/sqlserver/$name.sql, as a driver sends it
sub example
{
	my ($name) = @_;
	my $t = slurp_file("$FindBin::RealBin/../../../examples/pull/sql/sqlserver/$name.sql");
	$t =~ s/^--.*\n//mg;
	return $t;
}
sub claim
{
	my ($n) = @_;
	return mssql_rows($dbh, example('claim'), 'tasks', $n, 30000);
}
my $c = claim(2);
is(scalar(@$c), 2, 'inbox_claim gives two of the three pull rows');
like($c->[0][1], qr/^[0-9A-Fa-f-]{36}$/, 'inbox_claim gives each row a claim token');
is($c->[0][2], 'tasks', 'inbox_claim returns the source');
is($json->decode($c->[0][6])->{n}, 1, 'inbox_claim returns the payload, oldest first');
my ($id1, $tok1, $id2, $tok2) = ($c->[0][0], $c->[0][1], $c->[1][0], $c->[1][1]);
is(mssql_value($dbh, example('renew'), $id1, $tok1, 60000), 1, 'inbox_renew: 1');
is(mssql_value($dbh, example('complete'), $id1, $tok1), 1, 'inbox_complete: 1');
is(mssql_value($dbh, example('complete'), $id1, $tok1), 0, 'inbox_complete again: 0');
is(mssql_value($dbh, example('renew'), $id1, $tok1, 60000), 0,
	'inbox_renew of a completed row: 0');
is(mssql_value($dbh, example('retry'), $id2, $tok2, 0, 'later'), 1,
	'inbox_retry: 1');
$c = claim(5);
is(scalar(@$c), 2, 'inbox_claim again: the retried row and the third');
my ($retried) = grep { $_->[0] == $id2 } @$c;
is($retried->[8], 1, 'the retried row comes back with attempt 1');
is(mssql_value($dbh, example('dead'), $c->[0][0], $c->[0][1], 'poison'), 1,
	'inbox_dead: 1');
is(count('inbox', q{source = N'tasks' AND state = N'processed'}), 1, 'pull: one processed');
is(count('inbox', q{source = N'tasks' AND state = N'dead'}), 1, 'pull: one dead');
{
	my $other = mssql_connect($url);
	$other->begin_work;
	mssql_value($other, q{DECLARE @r INT; EXEC @r = sp_getapplock @Resource = N'queuebox.inbox_claim:tasks',
		@LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 1000; SELECT @r});
	my $t0 = time;
	eval { claim(1) };
	my $waited = time - $t0;
	like($@, qr/51000|another claim of this source held its lock/, 'a claim behind a held lock raises Msg 51000');
	ok($waited >= 9, sprintf('it waited for the lock first (%.1f s)', $waited));
	$other->rollback;
	is(scalar(@{ claim(5) }), 0, 'the lock released, the claim runs (nothing left to claim)');
	$other->disconnect;
}
# takeover (issue 24): a claimer is alive while some session holds its
# applock queuebox.claimer.<id>; on Babelfish (issue 38) while its beat in
# claimer_beat is fresh.  In one transaction, so the daemon's roles never
# see these rows: the reclaim returns the row of a claimer that is gone,
# keeps the one of the live claimer, and the relay claim takes over a push
# row of the gone claimer, whose old token then settles nothing
{
	my $other;
	if ($babelfish)
	{
		$dbh->begin_work;
		is(mssql_value($dbh, 'EXEC queuebox._claimer_beat ?, ?, ?', 777, 3600000, 1), 1,
			'takeover: claimer 777 registers its beat (a fresh id, alive for an hour)');
		is(mssql_value($dbh, 'EXEC queuebox._claimer_beat ?, ?, ?', 777, 3600000, 1), 0,
			'takeover: an id that has a row is not registered again');
		mssql_do($dbh, q{INSERT INTO queuebox.claimer_beat (claimer, alive_until)
			VALUES (778, DATEADD(second, -1, SYSUTCDATETIME()))});
	}
	else
	{
		$other = mssql_connect($url);
		is(mssql_value($other, q{DECLARE @r INT; EXEC @r = sp_getapplock @Resource = N'queuebox.claimer.777',
			@LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = 0; SELECT @r}) >= 0 ? 1 : 0, 1,
			'takeover: another session holds the applock of claimer 777 (session owned)');
		$dbh->begin_work;
	}
	mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, payload, state, claim_token, lease_until, claimer)
		VALUES (N'takeover.alive', N'{}', N'processing', NEWID(), DATEADD(hour, 1, SYSUTCDATETIME()), 777),
		       (N'takeover.gone', N'{}', N'processing', NEWID(), DATEADD(hour, 1, SYSUTCDATETIME()), 778)});
	mssql_do($dbh, q{INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption, state, claim_token,
		lease_until, claimer)
		VALUES (N'hooks', N'takeover-gone', N'{}', N'push', N'processing', NEWID(), DATEADD(hour, 1, SYSUTCDATETIME()), 778)});
	my ($gone_id, $gone_token) = @{ mssql_rows($dbh, q{SELECT id, CONVERT(NVARCHAR(40), claim_token) FROM queuebox.inbox
		WHERE idempotency_key = N'takeover-gone'})->[0] };
	is(mssql_value($dbh, 'EXEC queuebox._outbox_reclaim ?, ?', 100, undef), 1, 'takeover: the reclaim returns one row');
	is(rows_text(q{SELECT topic, state, CASE WHEN last_error LIKE N'taken over:%' THEN 1 ELSE 0 END,
		CASE WHEN claimer IS NULL THEN 1 ELSE 0 END FROM queuebox.outbox WHERE topic LIKE N'takeover.%' ORDER BY topic}),
		"takeover.alive|processing|0|0\ntakeover.gone|pending|1|1",
		'takeover: the gone claimer\'s row is pending (last_error says taken over), the live one\'s stays processing');
	mssql_rows($dbh, 'EXEC queuebox._relay_claim ?, ?, ?, ?', 10, 60000,
		'99999999-9999-9999-9999-999999999999', 4242);
	is(mssql_value($dbh, q{SELECT COUNT(*) FROM queuebox.inbox WHERE idempotency_key = N'takeover-gone'
		AND claim_token = '99999999-9999-9999-9999-999999999999' AND claimer = 4242}), 1,
		'takeover: the relay claim takes over the push row of the gone claimer, recording its own claimer');
	is(mssql_value($dbh, example('complete'), $gone_id, $gone_token), 0,
		'takeover: the gone claimer\'s late settle with its old token changes nothing');
	is(mssql_value($dbh, example('complete'), $gone_id, '99999999-9999-9999-9999-999999999999'), 1,
		'takeover: the new claim\'s token settles it');
	if ($babelfish)
	{
		is(mssql_value($dbh, 'EXEC queuebox._claimer_beat ?, ?, ?', 779, 60000, 1), 1,
			'takeover: claimer 779 registers');
		is(mssql_value($dbh, q{SELECT COUNT(*) FROM queuebox.claimer_beat WHERE claimer = 778}), 0,
			'takeover: a registration deletes the rows whose beat passed (778)');
		is(mssql_value($dbh, 'EXEC queuebox._claimer_beat ?, ?, ?', 778, 60000, 0), 1,
			'takeover: a claimer that could not beat for a while beats again (its row made again)');
		is(mssql_value($dbh, 'SELECT queuebox._claimer_gone(778, NULL)'), 0, 'takeover: and is alive again');
	}
	$dbh->rollback;
	$other->disconnect if $other;
}
eval { mssql_value($dbh, example('claim'), 'tasks', 0, 30000) };
like($@, qr/batch_size \(1 or more\)/, 'inbox_claim refuses a batch size of 0 and says why');

# admin and metrics
is($http->get("$base/admin/inbox/dead")->{status}, 401, 'admin without the token: 401');
my $a = $http->request('GET', "$base/admin/inbox/dead", { headers => { Authorization => "Bearer $token" } });
is($a->{status}, 200, 'admin with the token: 200');
like($a->{content}, qr/poison/, 'admin lists the dead pull row');
my $dead_inbox = mssql_value($dbh, q{SELECT id FROM queuebox.inbox WHERE state = N'dead' AND source = N'tasks'});
$a = $http->request('POST', "$base/admin/inbox/$dead_inbox/replay", { headers => { Authorization => "Bearer $token" } });
is($a->{status}, 200, 'admin replays an inbox row into the outbox (the topic rendered by the daemon)') or diag $a->{content};
mssql_wait($dbh, q{SELECT state FROM queuebox.outbox WHERE topic = N'tasks.tasks'}, [], 'sent', 'the replayed row is delivered');
$a = $http->request('GET', "$base/admin/outbox/dead", { headers => { Authorization => "Bearer $token" } });
is($a->{status}, 200, 'admin lists dead outbox rows');
my $dead_rows = $json->decode($a->{content});
is(scalar(grep { $_->{topic} eq 'fail.always' } @$dead_rows), 10, 'admin: the ten dead rows of the failing destination')
  or diag explain mssql_rows($dbh, q{SELECT topic, COUNT(*), MAX(last_error) FROM queuebox.outbox WHERE state = N'dead' GROUP BY topic});
my $dead_out = $dead_rows->[0]{id};
$a = $http->request('POST', "$base/admin/outbox/$dead_out/requeue", { headers => { Authorization => "Bearer $token" } });
is($a->{status}, 200, 'admin requeues a dead outbox row') or diag $a->{content};
is(mssql_value($dbh, 'SELECT state FROM queuebox.outbox WHERE id = ?', $dead_out) =~ /^(pending|processing|sent|dead)$/ ? 1 : 0, 1,
	'the requeued row is back in the flow');
$a = $http->request('POST', "$base/admin/outbox/requeue",
	{ content => '{"topicPattern": "a..b"}', headers => { Authorization => "Bearer $token", 'Content-Type' => 'application/json' } });
is($a->{status}, 422, 'a bulk requeue with an invalid pattern: 422 (a value the database refused)') or diag $a->{content};
like($a->{content}, qr/segment 2 is empty/, 'the 422 says which segment is wrong');
# admin, onDead: holdKey (rows made by hand: two dead heads that hold their
# keys, each with a parked row behind it, on a topic no route takes)
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, state, attempt, hold, last_error)
	VALUES (N'adm.held', N'ak1', N'{"v": 1}', N'dead', 3, N'dead', N'gave up'),
	       (N'adm.held', N'ak2', N'{"v": 1}', N'dead', 3, N'dead', N'gave up')});
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, hold)
	VALUES (N'adm.held', N'ak1', N'{"v": 2}', N'key'), (N'adm.held', N'ak2', N'{"v": 2}', N'key')});
my ($ak1, $ak2) = map { mssql_value($dbh, q{SELECT id FROM queuebox.outbox WHERE [key] = ? AND state = N'dead'}, $_) } qw(ak1 ak2);
my %adm = (headers => { Authorization => "Bearer $token", 'Content-Type' => 'application/json' });
$a = $http->request('GET', "$base/admin/outbox/held?limit=10", \%adm);
is($a->{status}, 200, 'admin lists held keys') or diag $a->{content};
is(join(',', map { "$_->{key}:$_->{head_id}:$_->{head_state}:$_->{behind}" } grep { $_->{key} =~ /^ak/ } @{ $json->decode($a->{content}) }),
	"ak1:$ak1:dead:1,ak2:$ak2:dead:1", 'held keys: each with its dead head and the rows behind');
$a = $http->request('POST', "$base/admin/outbox/$ak1/requeue", { %adm, content => '{"payload": {"v": 9}}' });
is($a->{status}, 200, 'admin requeues a dead row with an edited payload') or diag $a->{content};
is(join('|', map { $_ // '' } @{ mssql_rows($dbh, q{SELECT action, payload_before, payload_after FROM queuebox.outbox_audit WHERE outbox_id = ?}, $ak1)->[0] }),
	'requeue|{"v": 1}|{"v":9}', 'the edit is audited, before and after');
$a = $http->request('POST', "$base/admin/outbox/$ak2/skip", \%adm);
is($a->{status}, 200, 'admin skips a dead row that holds its key') or diag $a->{content};
is(count('outbox', q{id = ? AND state = N'dead' AND hold IS NULL}, $ak2), 1, 'the skipped row stays dead, holding nothing');
$a = $http->request('POST', "$base/admin/outbox/$ak2/skip", \%adm);
is($a->{status}, 404, 'a second skip is 404');
# the console's reads on SQL Server: one row with its audit (who: the
# route and the peer), dead lists by filter and cursor, the inbox row and
# lookup; pause, reset and resume of a destination
$a = $http->get("$base/admin/outbox/$ak1", \%adm);
is($a->{status}, 200, 'GET /admin/outbox/{id}: 200') or diag $a->{content};
my $orow = eval { $json->decode($a->{content}) } // {};
is($json->encode([ @$orow{qw(id topic key)}, $orow->{payload}, $orow->{headers} ]),
	$json->encode([ 0 + $ak1, 'adm.held', 'ak1', { v => 9 }, {} ]), 'one row: its fields, payload and headers as JSON')
  or diag $a->{content};
is(join('|', map { $_->{action} . ':' . $_->{done_by} } @{ $orow->{audit} // [] }), 'requeue:admin route from 127.0.0.1',
	'one row: the audit names the admin route and the peer (SESSION_CONTEXT), not the login');
is($http->get("$base/admin/outbox/99999999", \%adm)->{status}, 404, 'one row: none is 404');
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, state, attempt, last_error)
	SELECT N'adm.dead', N'dk' + CAST(n % 2 AS NVARCHAR(1)), N'{}', N'dead', 3, N'HTTP 50' + CAST(n AS NVARCHAR(1))
	FROM (VALUES (1), (2), (3), (4), (5)) v(n)});
my @dk = map { $_->[0] } @{ mssql_rows($dbh, q{SELECT id FROM queuebox.outbox WHERE topic = N'adm.dead' ORDER BY id}) };
my $dpage = sub {
	my ($q) = @_;
	my $r = $http->get("$base/admin/outbox/dead?$q", \%adm);
	my $rows = eval { $json->decode($r->{content}) } // [];
	return "$r->{status} " . join(',', map { $_->{id} - $dk[0] + 1 } @$rows)
	  . ' next ' . (defined $r->{headers}{'x-queuebox-next-after'} ? $r->{headers}{'x-queuebox-next-after'} - $dk[0] + 1 : '-');
};
is($dpage->('topic=adm.dead&limit=3'), '200 1,2,3 next 3', 'dead list by topic: a page of 3, its cursor');
is($dpage->("topic=adm.dead&after=$dk[2]"), '200 4,5 next -', 'dead list: the next page, the last');
is($dpage->('key=dk1&topic=adm.dead'), '200 1,3,5 next -', 'dead list: by key and topic');
is($dpage->('topic=adm.dead&error=http%20504&since=2020-01-01'), '200 4 next -', 'dead list: by a part of the error, since');
my $drow = $json->decode($http->get("$base/admin/outbox/dead?topic=adm.dead&limit=1", \%adm)->{content})->[0];
is(join(',', sort keys %$drow), 'attempt,created_at,destination,holds_key,id,key,last_error,max_attempts,message_id,topic',
	'dead list: each row has the contract\'s fields');
$a = $http->get("$base/admin/outbox/dead?error=NO%20SUCH%20ERROR&destination=fail", \%adm);
is("$a->{status} $a->{content}", '200 []', 'dead list: by error and destination, none');
$a = $http->get("$base/admin/outbox/dead?limit=5000", \%adm);
is($a->{status}, 400, 'dead list: limit 5000 is 400');
$a = $http->get("$base/admin/inbox/dead?source=tasks&error=poison", \%adm);
is(join(',', map { $_->{id} } @{ $json->decode($a->{content}) }), $dead_inbox, 'inbox dead list by source and error') or diag $a->{content};
$a = $http->get("$base/admin/inbox/$dead_inbox", \%adm);
my $irow = eval { $json->decode($a->{content}) } // {};
is("$a->{status} $irow->{source} $irow->{state}", '200 tasks dead', 'GET /admin/inbox/{id}') or diag $a->{content};
$a = $http->get("$base/admin/inbox/lookup?source=tasks&idempotency_key=" . $irow->{idempotency_key}, \%adm);
is(eval { $json->decode($a->{content})->{id} }, $dead_inbox, 'inbox lookup: the row of that source and key') or diag $a->{content};
$a = $http->get("$base/admin/inbox/lookup?source=tasks&idempotency_key=nope", \%adm);
is($a->{status}, 404, 'inbox lookup: none is 404');
# the console's pages in headless Chromium, reading SQL Server through the
# ODBC store (TAP 030 runs the same file on PostgreSQL)
SKIP:
{
	skip 'chromium is not installed (scripts/setup.sh installs it)', 4 unless -x '/usr/bin/chromium';
	my $ov = $json->decode($http->get("$base/admin/overview", \%adm)->{content});
	my $home = "$PostgreSQL::Test::Utils::tmp_check/browser-home-mssql";
	mkdir $home;
	qb_node_tests(qb_npm_dir('test/browser') . '/console-daemon.test.js', "the console on SQL Server in headless Chromium", 3,
		QB_CONSOLE_URL => $base,
		QB_ADMIN_TOKEN => $token,
		QB_DEAD_ID => $dead_inbox,
		QB_WEBHOOK_KEY => $irow->{idempotency_key},
		QB_DESTINATIONS => join(',', map { $_->{destination} } @{ $ov->{destinations} }),
		HOME => $home);
}
$a = $http->request('POST', "$base/admin/destinations/web/pause", { %adm, content => '{"seconds": 60}' });
is($a->{status}, 200, 'pause: 200') or diag $a->{content};
is(count('destination_state', q{destination = N'web' AND paused_until > DATEADD(second, 50, SYSUTCDATETIME())}), 1,
	'pause: paused_until about a minute ahead');
$a = $http->request('POST', "$base/admin/destinations/nosuch/pause", { %adm, content => '{"seconds": 60}' });
is($a->{status}, 404, 'pause: an unknown destination is 404') or diag $a->{content};
$a = $http->request('POST', "$base/admin/destinations/web/reset", \%adm);
is($a->{content}, '{"known" : true, "reset" : false}', 'reset: known, nothing to reset') or diag $a->{content};
is(count('destination_state', q{destination = N'web' AND paused_until IS NOT NULL}), 1, 'reset keeps the pause');
$a = $http->request('POST', "$base/admin/destinations/web/resume", \%adm);
is($a->{status}, 200, 'resume: 200');
is(count('destination_state', q{destination = N'web' AND paused_until IS NULL}), 1, 'resume ends the pause');
my $m = $http->get("$base/metrics");
like($m->{content}, qr/queuebox_inbox_received_total\{source="shop",result="accepted"\} 8/, '/metrics counts what the ingress received');
like($m->{content}, qr/queuebox_outbox_pending\s+\d+/, '/metrics reads the gauges from SQL Server');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');

# ---- T-SQL topic_matches against the extension's C one
{
	my $ext = qb_node('mssql_topics');
	my @seg = ('a', 'b', '*', '**', 'a.b', 'x-y', 'é', 'a+b', 'A');
	my @cases;
	srand(11);
	for (1 .. 300)
	{
		my $p = join('.', map { $seg[ int(rand(@seg)) ] } 1 .. 1 + int(rand(4)));
		my $t = join('.', map { ('a', 'b', 'x-y', 'é', 'c', '')[ int(rand(6)) ] } 1 .. 1 + int(rand(5)));
		push @cases, [ $p, $t ];
	}
	my $i = 0;
	my $values = join(',', map { '(' . (++$i) . ',' . qb_sql_quote($_->[0]) . ',' . qb_sql_quote($_->[1]) . ')' } @cases);
	my @c = split /,/, $ext->safe_psql('postgres',
		"SELECT string_agg(CASE WHEN queuebox.topic_matches(p, t) THEN '1' ELSE '0' END, ',' ORDER BY n) FROM (VALUES $values) v(n, p, t)");
	my $sth = $dbh->prepare('SELECT queuebox.topic_matches(?, ?)');
	my @s = map { $sth->execute(@$_); my ($v) = $sth->fetchrow_array; $sth->finish; $v } @cases;
	is("@s", "@c", scalar(@cases) . ' random patterns and topics: T-SQL topic_matches answers as the C one');
	for my $bad ('', 'a..b', '.a', 'or*ders', 'a b')
	{
		is(mssql_value($dbh, 'SELECT queuebox.topic_matches(?, ?)', $bad, 'a'), undef, "an invalid pattern \"$bad\": NULL");
		ok(mssql_value($dbh, 'SELECT queuebox._pattern_error(?)', $bad), "an invalid pattern \"$bad\": _pattern_error says why");
	}
}

# ---- upgrades: the schema the 0.3.0, 0.3.1, 0.3.2, 0.3.3, 0.3.4, 0.3.5, 0.3.6 and 0.3.7 daemons made
# (test/fixtures), filled, then --migrate: no row changes, a claim made
# before still completes, resume_destination answers as 0.3.2 says, the
# sweep of 0.3.3 runs, and the objects are a fresh install's
sub rows_text
{
	my ($sql) = @_;
	return join("\n", map { join('|', map { $_ // '' } @$_) } @{ mssql_rows($dbh, $sql) });
}
# A column's default is read for a column that is not computed only:
# Babelfish's sys.default_constraints reads pg_attrdef, which holds a
# computed column's expression too (outbox.place, ISNULL: a COALESCE), and
# depending on the plan it deparses that before it filters it out, which
# its deparser cannot ("unrecognized node type: 36").
sub objects
{
	return rows_text(q{
		SELECT o.name, o.type, c.name, TYPE_NAME(c.user_type_id), c.max_length, c.is_nullable,
			CASE WHEN c.is_computed = 0 THEN (
				SELECT d.definition FROM sys.default_constraints d
				WHERE d.parent_object_id = c.object_id AND d.parent_column_id = c.column_id) END
		FROM sys.objects o LEFT JOIN sys.columns c ON c.object_id = o.object_id
		WHERE o.schema_id = SCHEMA_ID(N'queuebox')
		  AND o.type <> 'D' -- a default's name: Babelfish makes its own; its definition is on its column
		ORDER BY o.name, c.column_id});
}
my $inbox_rows = q{SELECT id, source, idempotency_key, aggregate_id, payload, state, attempt,
	CONVERT(NVARCHAR(40), claim_token), CONVERT(NVARCHAR(40), lease_until, 126), hold
	FROM queuebox.inbox ORDER BY id};
# upgrade_from($from): the fixture of $from installed and filled, then
# --migrate through every later step
sub upgrade_from
{
	my ($from) = @_;
	my @steps = grep { my ($f) = m{/([\d.]+)--[\d.]+\.sql$}; version_cmp($f, $from) >= 0 }
	  glob("$FindBin::RealBin/../../../sql/sqlserver/upgrade/*--*.sql");
	mssql_reset($dbh);
	{
		my $text = slurp_file("$FindBin::RealBin/../../fixtures/daemon-$from-sqlserver.sql");
		$dbh->begin_work;
		mssql_do($dbh, $_) for grep { /\S/ } split /^GO[ \t]*\r?$/m, $text;
		mssql_do($dbh, 'INSERT INTO queuebox.schema_version (version) VALUES (?)', $from);
		$dbh->commit;
	}
	is(mssql_value($dbh, 'SELECT queuebox._schema_version()'), $from, "the $from daemon's schema is installed");
	mssql_do($dbh, q{INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)
		VALUES (N'tasks', N'u-1', N'a', N'{"n": 1}', N'pull'), (N'tasks', N'u-2', N'a', N'{"n": 2}', N'pull'),
		       (N'tasks', N'u-3', N'b', N'{"n": 3}', N'pull'), (N'hooks', N'h-1', NULL, N'{}', N'push')});
	mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'orders.created', N'k1', N'{"o": 1}')});
	# breaker rows: closed with a count, a pause that is over, a pause ahead, open
	mssql_do($dbh, q{INSERT INTO queuebox.destination_state (destination, state, failures, paused_until)
		VALUES (N'flaky', N'closed', 2, NULL), (N'waited', N'closed', 0, DATEADD(hour, -1, SYSUTCDATETIME())),
		       (N'paused', N'closed', 0, DATEADD(hour, 1, SYSUTCDATETIME())), (N'broken', N'open', 5, NULL)});
	my $outbox_rows = q{SELECT id, CONVERT(NVARCHAR(40), message_id), topic, [key], payload, state, attempt FROM queuebox.outbox ORDER BY id};
	my $breaker_rows = q{SELECT destination, state, failures, CONVERT(NVARCHAR(40), paused_until, 126)
		FROM queuebox.destination_state ORDER BY destination};
	my ($outbox_before, $breaker_before) = map { rows_text($_) } ($outbox_rows, $breaker_rows);
	# the daemon's routes as the 0.3.x daemon wrote them
	mssql_do($dbh, q{INSERT INTO queuebox.config_route (position, pattern, destination) VALUES (1, N'orders.**', N'web')});
	my $held = claim(3);
	is(scalar(@$held), 2, "$from: a claim takes a row of each aggregate (u-2 waits behind u-1)");
	my $inbox_before = rows_text($inbox_rows);
	$r = qbd_run('--config', qbd_write_conf(conf(), "upgrade-$from"), '--migrate');
	is($r->[0], 0, "--migrate on the $from schema exits 0") or diag $r->[2];
	like($r->[2], qr/upgraded the QueueBox schema from \Q$from\E to \Q$version\E/, "--migrate says it upgraded from $from");
	is(mssql_value($dbh, 'SELECT queuebox._schema_version()'), $version, "_schema_version() says $version");
	is(mssql_value($dbh, 'SELECT COUNT(*) FROM queuebox.schema_version'), 1 + @steps,
		"schema_version records $from and each of the " . scalar(@steps) . ' steps after it');
	is(rows_text($inbox_rows), $inbox_before, "$from: the migration changes no inbox row");
	is(rows_text($outbox_rows), $outbox_before, "$from: the migration changes no outbox row");
	is(rows_text($breaker_rows), $breaker_before, "$from: the migration changes no breaker row");
	is(mssql_value($dbh, example('complete'), $held->[0][0], $held->[0][1]), 1,
		"$from: a claim made before the upgrade completes with its token");
	# 0.3.6 (issue 38): the upgraded _outbox_cycle keeps an open circuit open
	# on a success sent (the tallies' "ago", in microseconds) before it opened
	mssql_do($dbh, q{UPDATE queuebox.destination_state SET opened_at = SYSUTCDATETIME() WHERE destination = N'broken'});
	is(join('|', @{ mssql_rows($dbh, 'EXEC queuebox._outbox_cycle ?, NULL, NULL',
		'[{"d": "broken", "ok": 1, "ago": 60000000, "fail": 0, "th": 3, "cd": 60000}]')->[0] }[0 .. 2]),
		'broken|open|open', "$from: a success sent a minute before the circuit opened leaves it open");
	is(join(' ', map { "$_=" . mssql_value($dbh, 'EXEC queuebox.resume_destination ?', $_) } qw(broken flaky paused waited)),
		'broken=1 flaky=0 paused=1 waited=0',
		"$from: resume_destination then answers 1 only where rows were held (open, paused ahead)");
	is(rows_text(q{SELECT destination, state, failures, CASE WHEN paused_until IS NULL THEN 1 ELSE 0 END
		FROM queuebox.destination_state ORDER BY destination}),
		"broken|closed|0|1\nflaky|closed|0|1\npaused|closed|0|1\nwaited|closed|0|1",
		"$from: and leaves each closed with its count and pause cleared");
	# 0.3.3: the sweep runs on the upgraded schema, over its new index
	# (Babelfish lists an index under its name, the table's and a hash)
	is(mssql_value($dbh, q{SELECT COUNT(*) FROM sys.indexes WHERE name LIKE N'outbox[_]parked[_]idx%'
		AND object_id = OBJECT_ID(N'queuebox.outbox')}), 1, "$from: the upgrade adds outbox_parked_idx");
	mssql_do($dbh, q{UPDATE queuebox.outbox SET hold = N'key' WHERE [key] = N'k1'});
	is(rows_text(q{EXEC queuebox._outbox_sweep N'', 10}), '1|', "$from: the sweep releases a stranded row, and its walk ends");
	is(count('outbox', q{[key] = N'k1' AND state = N'pending' AND hold = N'ready'}), 1,
		"$from: the released row is ready to be claimed");
	# 0.3.6: claimer_beat, which _claimer_gone reads on Babelfish (issue 38)
	is(mssql_value($dbh, 'EXEC queuebox._claimer_beat ?, ?, ?', 4711, 60000, 1), 1,
		"$from: a claimer registers its beat on the upgraded schema");
	is(mssql_value($dbh, 'SELECT queuebox._claimer_gone(4711, NULL)'), $babelfish ? 0 : 1,
		$babelfish ? "$from: a claimer that beats is alive (Babelfish)"
		: "$from: a claimer whose applock nobody holds is gone (SQL Server reads no beat)");
	# 0.3.6 (issue 40): an insert takes its session's trace context, and the
	# relay's claim returns a push row's traceparent header (h-1 has none)
	my $tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
	mssql_do($dbh, q{EXEC sp_set_session_context N'queuebox.traceparent', ?}, $tp);
	mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'orders.traced', N'k9', N'{}')});
	mssql_do($dbh, q{EXEC sp_set_session_context N'queuebox.traceparent', NULL});
	is(mssql_value($dbh, q{SELECT JSON_VALUE(headers, '$.traceparent') FROM queuebox.outbox WHERE topic = N'orders.traced'}),
		$tp, "$from: an insert takes its session's trace context on the upgraded schema");
	mssql_do($dbh, q{INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers, consumption)
		VALUES (N'hooks', N'h-tp', N'{}', ?, N'push')}, qq({"Traceparent": "$tp"}));
	is(join(',', map { ($_->[1] // '') . '=' . ($_->[3] // 'none') }
			@{ mssql_rows($dbh, q{EXEC queuebox._relay_claim 10, 60000, '6f9619ff-8b86-d011-b42d-00c04fc964ff'}) }),
		"hooks=none,hooks=$tp", "$from: the relay's claim returns each push row's traceparent");
	# 0.3.8 (issue 39, fan-out): config_route is made again (its rows
	# copied, then --migrate writes the configuration's); a route marked
	# fanout has its rows marked at insert (outbox_fanout)
	is(rows_text(q{SELECT position, pattern, destination, fanout FROM queuebox.config_route}), '1|**|sink|0',
		"$from: --migrate writes its routes into the config_route made again (fanout 0)");
	mssql_do($dbh, q{UPDATE queuebox.config_route SET destination = N'web, mq', fanout = 1});
	mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'orders.fan', N'k1', N'{}')});
	is(count('outbox', q{topic = N'orders.fan' AND origin = id AND place = id}), 1,
		"$from: a row of a fan-out route is marked at insert on the upgraded schema");
	is(mssql_value($dbh, q{SELECT queuebox.route_of(N'orders.fan')}), 'web, mq', "$from: route_of names every destination");
	mssql_do($dbh, q{DELETE FROM queuebox.config_route});
	return objects();
}

# version_cmp: "0.3.0" against "0.3.1", as sort -V does
sub version_cmp
{
	my @a = split /\./, $_[0];
	my @b = split /\./, $_[1];
	for my $i (0 .. 2)
	{
		return $a[$i] <=> $b[$i] if $a[$i] != $b[$i];
	}
	return 0;
}

my @upgraded = map { upgrade_from($_) } qw(0.3.0 0.3.1 0.3.2 0.3.3 0.3.4 0.3.5 0.3.6 0.3.7);
mssql_reset($dbh);
$r = qbd_run('--config', qbd_write_conf(conf(), 'fresh'), '--migrate');
is($r->[0], 0, '--migrate makes a fresh schema') or diag $r->[2];
cmp_ok(scalar(split /\n/, $upgraded[0]), '>', 100, 'the object list covers the schema');
is($upgraded[0], objects(), 'the schema upgraded from 0.3.0 has the objects and columns of a fresh install');
is($upgraded[1], objects(), 'the schema upgraded from 0.3.1 has the objects and columns of a fresh install');
is($upgraded[2], objects(), 'the schema upgraded from 0.3.2 has the objects and columns of a fresh install');
is($upgraded[3], objects(), 'the schema upgraded from 0.3.3 has the objects and columns of a fresh install');
is($upgraded[4], objects(), 'the schema upgraded from 0.3.4 has the objects and columns of a fresh install');
is($upgraded[5], objects(), 'the schema upgraded from 0.3.5 has the objects and columns of a fresh install');
is($upgraded[6], objects(), 'the schema upgraded from 0.3.6 has the objects and columns of a fresh install');
is($upgraded[7], objects(), 'the schema upgraded from 0.3.7 has the objects and columns of a fresh install');

# ---- the database roles (sql/sqlserver/roles.sql): made by a user who may,
# each granted what its job needs; a reader's user may not requeue
is(mssql_value($dbh, q{SELECT COUNT(*) FROM sys.database_principals WHERE type = 'R' AND name IN
	(N'queuebox_writer', N'queuebox_consumer', N'queuebox_reader', N'queuebox_operator', N'queuebox_admin')}), 5,
	'the five queuebox database roles exist');
SKIP:
{
	# Babelfish 4.3.0 lists no permission in sys.database_permissions (the
	# grants are made: the reader's checks below see them)
	skip 'Babelfish: sys.database_permissions is empty there (docs/sqlserver.md, Babelfish)', 1 if $babelfish;
	is(mssql_value($dbh, q{SELECT COUNT(*) FROM sys.database_permissions p
		JOIN sys.database_principals r ON r.principal_id = p.grantee_principal_id
		WHERE r.name = N'queuebox_operator' AND p.permission_name = N'EXECUTE' AND p.state = 'G'}), 18,
		'queuebox_operator may execute its 18 procedures');
}
is(mssql_value($dbh, q{SELECT IS_ROLEMEMBER(N'queuebox_reader', N'queuebox_operator')}), 1,
	'queuebox_operator is a member of queuebox_reader');
if (!$babelfish)
{
	mssql_do($dbh, q{IF DATABASE_PRINCIPAL_ID(N'qb_monitor') IS NULL CREATE USER qb_monitor WITHOUT LOGIN});
	mssql_do($dbh, q{ALTER ROLE queuebox_reader ADD MEMBER qb_monitor});
	eval {
		mssql_do($dbh, q{EXECUTE AS USER = N'qb_monitor'; BEGIN TRY EXEC queuebox.requeue_outbox @id = 1; END TRY
			BEGIN CATCH REVERT; THROW; END CATCH; REVERT;});
	};
	like($@, qr/EXECUTE permission was denied/, 'a reader\'s user may not run requeue_outbox');
	is(mssql_value($dbh, q{EXECUTE AS USER = N'qb_monitor'; SELECT COUNT(*) FROM queuebox.outbox_stats; REVERT;}), 0,
		'a reader\'s user reads outbox_stats');
	mssql_do($dbh, q{DROP USER qb_monitor});
}
else
{
	# Babelfish 4.3.0 has neither CREATE USER WITHOUT LOGIN nor EXECUTE AS:
	# the reader is a login of its own, connected as itself
	my $mon = mssql_connect(mssql_login_add($dbh, $url, 'qb_monitor', 'queuebox_reader'));
	eval { mssql_do($mon, q{EXEC queuebox.requeue_outbox @id = 1}) };
	like($@, qr/permission denied for procedure requeue_outbox/, 'a reader\'s user may not run requeue_outbox');
	is(mssql_value($mon, q{SELECT COUNT(*) FROM queuebox.outbox_stats}), 0, 'a reader\'s user reads outbox_stats');
	$mon->disconnect;
	mssql_login_drop($dbh, 'qb_monitor');
}

# ---- a schema queuebox that the daemon did not make is refused
mssql_reset($dbh);
mssql_do($dbh, 'CREATE SCHEMA queuebox');
mssql_do($dbh, 'CREATE TABLE queuebox.outbox (id INT)');
$r = qbd_run('--config', qbd_write_conf(conf(), 'foreign'), '--migrate');
is($r->[0], 1, 'a foreign schema queuebox: --migrate fails');
like($r->[2], qr/schema queuebox exists but queuebox-mssqld did not make it/, 'a foreign schema: the message says what to do');
is(mssql_value($dbh, q{SELECT COUNT(*) FROM sys.objects WHERE schema_id = SCHEMA_ID(N'queuebox')}), 1,
	'a foreign schema: nothing is added to it');
mssql_reset($dbh);

$dbh->disconnect;
done_testing();
