# 073_mssql_fanout.pl
#   Fan-out on SQL Server (docs/delivery.md, "Fan-out"; docs/sqlserver.md),
#   on QUEUEBOX_TEST_MSSQL_URL (skipped, saying why, when it is not set):
#   the daemon with 2 outbox workers delivers each row of a route with
#   destinations: [...] to every one of them, each delivery with its own
#   state, attempts, dead letter and key order, as TAP 072 checks on the
#   extension:
#   1. one INSERT of many rows to an HTTP sink and a RabbitMQ exchange:
#      every row reaches both once, with the same message id, each key in
#      order at each; the outbox holds the row and its copy, nothing else;
#   2. a failing destination: while the partner's sink answers 500, the
#      billing sink gets every row of the same keys, in order (a key held
#      at one destination never holds it at another); once the partner
#      answers, it gets them all, in order, each once;
#   3. a dead letter at one destination (onDead: holdKey there): the row is
#      dead at the partner only, its key's later rows wait there and flow
#      at billing; requeue_outbox of the dead copy sends it to the partner
#      only, and the held rows follow;
#   4. route_of names every destination; replay_outbox of a copy goes to
#      its destination only; outbox_row lists a message's deliveries;
#      _outbox_unroute sends a copy whose destination left the
#      configuration dead, saying what to do;
#   5. a member of queuebox_writer (INSERT and SELECT only) inserts rows
#      the trigger marks (on Babelfish it needs topic_matches: roles.sql);
#   6. the promotion, one _outbox_cycle call at a time with the daemon
#      stopped: a row not routed yet, routed without ending, releases its
#      key's row parked at another destination; a row not routed yet parked
#      behind rows in flight at two destinations is released when the first
#      of them ends, and is claimed by a cycle only once none is in flight;
#   7. two ends at once: a fan-out row and the row before it at another
#      destination, ended in two open transactions, release the row parked
#      behind both (not the sweep); released past a row still in flight,
#      the claim parks it again; a copy at its destination keeps it parked.
#   Every case counts rows before and after.  Drops and recreates schema
#   queuebox in the database the URL names.  Waits are bounded polls.
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxMssql;

BEGIN { QueueBoxMssql::mssql_skip_unless_url(); }

use PostgreSQL::Test::Utils;
use QueueBoxTest;
use QueueBoxDaemon;
use QueueBoxRabbit;

qb_mssql_alone();
my $url = mssql_url();
my $dbh = mssql_connect($url);
my $bill = qb_sink_start(name => 'mssql_fan_bill');
my $part = qb_sink_start(name => 'mssql_fan_part');
my $rmq = rmq_start(name => 'mssqlfan');
rmq_tool($rmq, exchange => 'qb.fan', 'topic', queue => 'q.fan', bind => 'q.fan', 'qb.fan', 'orders.#');
mssql_reset($dbh);

my $yaml = qb_config_yaml(
	outbox => { pollIntervalMs => 100, maxAttempts => 2, backoff => { initialMs => 20, maxMs => 100 } },
	destinations => {
		bill => { type => 'http', baseUrl => $bill->{url}, path => '/bill', timeoutMs => 5000 },
		part => {
			type => 'http',
			baseUrl => $part->{url},
			path => '/part',
			timeoutMs => 5000,
			onDead => 'holdKey',
			circuitBreaker => { failures => 100000 }
		},
		mq => { type => 'rabbitmq', url => $rmq->{url}, exchange => 'qb.fan' },
	},
	routes => [
		{ topicPattern => 'orders.**', destinations => [qw(bill mq)] },
		{ topicPattern => 'partner.**', destinations => [qw(bill part)] },
		{ topicPattern => '**', destination => 'bill' },
	],
	database => { url => $url, connectTimeoutMs => 3000, idlePollMaxMs => 500 },
	daemon => { outboxWorkers => 2, shutdownGraceMs => 5000 });
my $d = qbd_start(undef, $yaml, name => 'mssql_fanout');
for my $w (0, 1)
{
	like(qbd_wait_daemon_log($d, qr/outbox $w\[\d+\]: started/), qr/outbox $w\[\d+\]: started/,
		"outbox $w started: the daemon takes a fan-out route on SQL Server");
}

sub count
{
	my ($where, @bind) = @_;
	return mssql_value($dbh, 'SELECT COUNT(*) FROM queuebox.outbox' . ($where ? " WHERE $where" : ''), @bind);
}

# $n rows of $topic in one INSERT, for keys $prefix.1 .. $prefix.$nkeys, $per
# each, {"k": key, "n": i} (n counts per key), keys interleaved
sub insert_rows
{
	my ($topic, $prefix, $nkeys, $per, %o) = @_;
	my (@values, @bind);
	for my $n (1 .. $per)
	{
		for my $k (1 .. $nkeys)
		{
			push @values, '(?, ?, ?' . ($o{max_attempts} ? ", $o{max_attempts}" : '') . ')';
			push @bind, $topic, "$prefix$k", qq({"k": "$prefix$k", "n": $n});
		}
	}
	mssql_do($dbh, 'INSERT INTO queuebox.outbox (topic, [key], payload' . ($o{max_attempts} ? ', max_attempts' : '')
		  . ') VALUES ' . join(', ', @values), @bind);
	return;
}

my $sink_http = HTTP::Tiny->new(timeout => 10);
sub fault
{
	my ($sink, $body) = @_;
	return $sink_http->post("$sink->{url}/_sink/fault",
		{ content => $body, headers => { 'content-type' => 'application/json' } })->{status};
}

# ==== 1. one INSERT, two destinations of two kinds
my @keys = map { "o$_" } 1 .. 4;
my $per = 5;
my $rows = 4 * $per;
insert_rows('orders.created', 'o', 4, $per);
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'orders.created' AND state = N'sent'}, [],
	2 * $rows, 'every row and its copy are sent', timeout => 120);
is(count(q{topic = N'orders.created'}), 2 * $rows, 'the outbox holds each row and one copy, no more');
is(count(q{topic = N'orders.created' AND origin = id}), $rows, 'each inserted row is marked the origin of its copy');
is(mssql_value($dbh, q{SELECT CONCAT(COUNT(DISTINCT CONCAT(CONVERT(NVARCHAR(36), message_id), N'/', destination)),
	N'/', COUNT(DISTINCT message_id)) FROM queuebox.outbox WHERE topic = N'orders.created'}),
	2 * $rows . "/$rows", 'one delivery per message and destination, the message id shared');
is(count(q{topic = N'orders.created' AND origin <> id
	AND NOT EXISTS (SELECT 1 FROM queuebox.outbox f WHERE f.id = outbox.origin AND f.message_id = outbox.message_id
		AND f.created_at = outbox.created_at AND f.payload = outbox.payload AND f.[key] = outbox.[key])}), 0,
	'each copy has its row\'s message id, key, payload and creation time');

my ($seq, $n) = qb_sink_seq($bill, '/bill');
is(scalar(grep { $_ == 1 } values %$n), $rows, 'billing: each message once');
is(qb_seq_in_order($seq, \@keys, $per), 4, 'billing: every key in order');
my $mq = rmq_get($rmq, 'q.fan');
is(scalar(@$mq), $rows, 'RabbitMQ: one message per row');
my %mq_seq;
push @{ $mq_seq{ decode_json($_->{body})->{k} } }, decode_json($_->{body})->{n} for @$mq;
is(qb_seq_in_order(\%mq_seq, \@keys, $per), 4, 'RabbitMQ: every key in order');
my %ids = map { $_ => 1 } keys %$n;
is(scalar(grep { $ids{ $_->{message_id} // '' } } @$mq), $rows, 'RabbitMQ carries the message ids billing saw');

# ==== 2. a failing destination holds nothing at another
is(fault($part, '{"status": 500}'), 200, 'the partner answers 500 from now on');
my $before = count();
my @pkeys = map { "p$_" } 1 .. 3;
insert_rows('partner.order', 'p', 3, 4, max_attempts => 1000);
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'partner.order' AND destination = N'bill'
	AND state = N'sent'}, [], 12, 'billing gets every row while the partner fails', timeout => 90);
is(count(q{topic = N'partner.order' AND destination = N'part' AND state = N'sent'}), 0, 'the partner has none yet');
cmp_ok(count(q{topic = N'partner.order' AND destination = N'part' AND attempt > 0}), '>', 0,
	'the partner\'s rows are retrying');
($seq) = qb_sink_seq($bill, '/bill');
is(qb_seq_in_order($seq, \@pkeys, 4), 3, 'billing: the partner\'s keys in order there');
is(fault($part, '{}'), 200, 'the partner answers again');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'partner.order' AND state = N'sent'}, [], 24,
	'the partner gets them all', timeout => 120);
($seq, $n) = qb_sink_seq($part, '/part');
is(qb_seq_in_order($seq, \@pkeys, 4), 3, 'partner: every key in order after its failures');
is(scalar(grep { $_ == 1 } values %$n), 12, 'partner: each message answered 2xx once');
is(count(), $before + 24, 'rows counted after: 12 rows and 12 copies, none lost');

# ==== 3. a dead letter at one destination, requeued there only
$before = count();
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES
	(N'partner.dead', N'dk', N'{"k": "dk", "n": 1, "_sink": {"fail": 2, "status": 500}}'),
	(N'partner.dead', N'dk', N'{"k": "dk", "n": 2}'), (N'partner.dead', N'dk', N'{"k": "dk", "n": 3}')});
# billing answers the first row 500 twice too (the script is the message's):
# the row goes dead at billing and at the partner, each with its own attempts
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'partner.dead' AND state = N'dead'}, [], 2,
	'the first row is dead at both destinations (its own attempts at each)', timeout => 90);
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'partner.dead' AND destination = N'bill'
	AND state = N'sent'}, [], 2, 'billing (onDead: release) sends the key\'s later rows', timeout => 90);
is(mssql_value($dbh, q{SELECT STRING_AGG(CONCAT(state, N'/' + hold), N',') WITHIN GROUP (ORDER BY place)
	FROM queuebox.outbox WHERE topic = N'partner.dead' AND destination = N'part'}),
	'dead/dead,pending/key,pending/key', 'at the partner the dead row holds its key (onDead: holdKey)');
is_deeply(mssql_rows($dbh, q{EXEC queuebox.held_keys}),
	[ [ 'dk', 'part', mssql_value($dbh, q{SELECT id FROM queuebox.outbox WHERE topic = N'partner.dead'
		AND destination = N'part' AND state = N'dead'}), 'dead', 2,
		mssql_value($dbh, q{SELECT MIN(created_at) FROM queuebox.outbox WHERE topic = N'partner.dead'
		AND destination = N'part' AND state = N'pending'}) ] ],
	'held_keys: the key is held at the partner only, two rows behind its dead head');
my $dead_part = mssql_value($dbh,
	q{SELECT id FROM queuebox.outbox WHERE topic = N'partner.dead' AND destination = N'part' AND state = N'dead'});
my $bill_before = scalar(grep { $_->{path} eq '/bill' } @{ qb_sink_requests($bill) });
is(mssql_value($dbh, 'EXEC queuebox.requeue_outbox ?', $dead_part), 1, 'the partner\'s dead copy is requeued');
is(mssql_value($dbh, 'SELECT destination FROM queuebox.outbox WHERE id = ?', $dead_part), 'part',
	'the requeued copy keeps its destination');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'partner.dead' AND destination = N'part'
	AND state = N'sent'}, [], 3, 'the requeued copy and the rows it held go to the partner', timeout => 90);
is(scalar(grep { $_->{path} eq '/bill' } @{ qb_sink_requests($bill) }), $bill_before,
	'billing saw no request from the requeue');
($seq) = qb_sink_seq($part, '/part');
is("@{ $seq->{dk} }", '1 2 3', 'partner: the key in order after the requeue');
is(count(q{topic = N'partner.dead' AND destination = N'bill' AND state = N'dead'}), 1,
	'billing\'s dead row stays dead');
is(count(), $before + 6, 'rows counted after: three rows and three copies');

# ==== 4. route_of, outbox_row, replay of one delivery, unroute
is(mssql_value($dbh, q{SELECT queuebox.route_of(N'partner.order')}), 'bill, part',
	'route_of names every destination of a fan-out route');
is(mssql_value($dbh, q{SELECT queuebox.route_of(N'other.x')}), 'bill', 'route_of of a route with one destination');
my $copy = mssql_value($dbh,
	q{SELECT TOP (1) id FROM queuebox.outbox WHERE topic = N'partner.order' AND destination = N'part' ORDER BY id});
my $row = decode_json(mssql_value($dbh, 'EXEC queuebox.outbox_row ?', $copy));
is(join(',', map { "$_->{destination}/$_->{state}" } @{ $row->{deliveries} }), 'bill/sent,part/sent',
	'outbox_row lists the message\'s deliveries');
$before = count();
my $replayed = mssql_value($dbh, 'EXEC queuebox.replay_outbox ?', $copy);
mssql_wait($dbh, q{SELECT CONCAT(state, N'/', destination) FROM queuebox.outbox WHERE id = ?}, [$replayed],
	'sent/part', 'a replayed copy goes to its own destination', timeout => 60);
is(count(), $before + 1, 'the replay is one row, no copies');
insert_rows('plain.x', 'x', 1, 1);
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'plain.x' AND state = N'sent'
	AND destination = N'bill' AND origin IS NULL}, [], 1, 'a row of a plain route goes to its one destination');
is(decode_json(mssql_value($dbh, 'EXEC queuebox.outbox_row ?',
	mssql_value($dbh, q{SELECT id FROM queuebox.outbox WHERE topic = N'plain.x'})))->{deliveries}, undef,
	'outbox_row of a row of a plain route: deliveries null');
# a copy whose destination left the configuration (as after a reload): the
# daemon never claims it there, and the unroute step makes it dead
$before = count();
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, destination, origin) VALUES
	(N'partner.gone', N'g1', N'{}', N'gone', 1), (N'partner.gone', N'g1', N'{}', N'bill', NULL)});
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'partner.gone' AND state = N'sent'}, [], 1,
	'a row at a known destination beside it is sent (another destination, its own order)');
is(mssql_value($dbh, q{EXEC queuebox._outbox_unroute N'["bill", "part", "mq"]'}), 1,
	'_outbox_unroute moves the copy of a destination gone');
is(mssql_value($dbh, q{SELECT CONCAT(state, N'/', destination, N'/', last_error) FROM queuebox.outbox
	WHERE topic = N'partner.gone' AND destination = N'gone'}),
	'dead/gone/destination gone is no longer in the configuration; add it back and requeue the row'
	  . ' (queuebox.requeue_outbox), or leave it dead', 'it goes dead at its destination, saying what to do');
is(count(), $before + 2, 'rows counted after the unroute: none lost');

# ==== 5. a queuebox_writer member's rows are marked by the trigger
$before = count();
my $w = mssql_connect(mssql_login_add($dbh, $url, 'qb_writer73', 'queuebox_writer'));
my ($err, $marked) = ('', '');
eval {
	# in its transaction, before any worker can see it: marked by the trigger
	$w->begin_work;
	mssql_do($w, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'orders.writer', N'w1', N'{"k": "w1", "n": 1}')});
	$marked = mssql_value($w, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'orders.writer' AND origin = id});
	$w->commit;
	1;
} or $err = $@;
is($err, '', 'a queuebox_writer member inserts a row of a fan-out route');
is($marked, 1, 'the trigger marks it at insert (origin = id), in the writer\'s transaction');
$w->disconnect;
mssql_login_drop($dbh, 'qb_writer73');
mssql_wait($dbh, q{SELECT COUNT(*) FROM queuebox.outbox WHERE topic = N'orders.writer' AND state = N'sent'}, [], 2,
	'the writer\'s row is delivered to both destinations', timeout => 60);
is(count(), $before + 2, 'rows counted after: the row and its copy');

qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'the daemon stops');
like(qbd_log($d), qr/outbox 0\[\d+\]: started/, 'the log shows the run');
is(count(q{state NOT IN (N'sent', N'dead')}), 0, 'every row ended (sent, or dead where the test made it so)');

# ==== 6. the promotion, by _outbox_cycle itself (the daemon stopped: each
# step is one call, what it leaves is read right after; TAP 072's isolation
# spec outbox_fanout_order is the extension's)
my $T1 = '6f9619ff-8b86-d011-b42d-00c04fc964f1';
my $T2 = '6f9619ff-8b86-d011-b42d-00c04fc964f2';
# a cycle of settles and a claim, on handle $h (cycle: on $dbh)
sub cycle_in
{
	my ($h, $settles, $claim) = @_;
	return mssql_rows($h, 'EXEC queuebox._outbox_cycle NULL, ?, ?', $settles, $claim);
}
sub cycle { return cycle_in($dbh, @_); }
sub claim_json
{
	my ($token) = @_;
	return encode_json({ batch => 10, lease => 60000, maxa => 5, token => $token, floor => 0, probe => 1000,
		dests => [ { n => 'bill', l => 10 }, { n => 'part', l => 10 } ] });
}
sub ids_of
{
	my ($topic) = @_;
	return map { $_->[0] } @{ mssql_rows($dbh, 'SELECT id FROM queuebox.outbox WHERE topic = ? ORDER BY id', $topic) };
}
sub hold_of
{
	my ($id) = @_;
	return mssql_value($dbh, q{SELECT CONCAT(state, N'/', ISNULL(hold, N'-')) FROM queuebox.outbox WHERE id = ?}, $id);
}
# a: a row not routed yet (z1) holds back its key's row at the partner (z2,
# parked behind it); routed to billing without ending, it no longer does:
# its settle promotes z2 at once, not the sweep later
$before = count();
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'cycle.z', N'z', N'{}')});
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, destination) VALUES (N'cycle.z', N'z', N'{}', N'part')});
my ($z1, $z2) = ids_of('cycle.z');
cycle(undef, claim_json($T1));
is(join(' ', hold_of($z1), hold_of($z2)), 'processing/- pending/key',
	'a claim takes the row not routed yet and parks the partner\'s row behind it');
cycle(qq([{"id": $z1, "t": "$T1", "o": "route", "a": 0, "d": "bill", "u": true}]), undef);
is(join(' ', hold_of($z1), hold_of($z2)), 'pending/- pending/-',
	'routed to billing, the row no longer holds the partner\'s row back: its settle released it');
# b: a row not routed yet (y3) parked behind its key's rows in flight at two
# destinations (y1 at billing, y2 at the partner): the first of them to end
# releases it (the claim then checks its order again), as a promotion that
# counted the other in flight would not
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, destination) VALUES
	(N'cycle.y', N'y', N'{}', N'bill'), (N'cycle.y', N'y', N'{}', N'part')});
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'cycle.y', N'y', N'{}')});
my ($y1, $y2, $y3) = ids_of('cycle.y');
cycle(undef, claim_json($T2));
is(join(' ', map { hold_of($_) } $y1, $y2, $y3), 'processing/- processing/- pending/key',
	'both destinations\' rows are in flight, the row not routed yet parked behind them');
cycle(qq([{"id": $y1, "t": "$T2", "o": "sent", "a": 1, "d": "bill", "u": false}]), undef);
is(join(' ', map { hold_of($_) } $y1, $y2, $y3), 'sent/- processing/- pending/ready',
	'billing\'s row sent: the row not routed yet is released (the partner\'s, in flight, does not keep it)');
cycle(qq([{"id": $y2, "t": "$T2", "o": "sent", "a": 1, "d": "part", "u": false}]), undef);
# c: as b, each settle in a cycle that also claims: billing's row sent, the
# row not routed yet is released but not claimed at once while the
# partner's row is in flight (claimed, it would go out beside it); once that
# row is sent, the claim takes it
my $T3 = '6f9619ff-8b86-d011-b42d-00c04fc964f3';
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, destination) VALUES
	(N'cycle.x', N'x', N'{}', N'bill'), (N'cycle.x', N'x', N'{}', N'part')});
mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'cycle.x', N'x', N'{}')});
my ($x1, $x2, $x3) = ids_of('cycle.x');
cycle(undef, claim_json($T3));
is(join(' ', map { hold_of($_) } $x1, $x2, $x3), 'processing/- processing/- pending/key',
	'x: both destinations\' rows are in flight, the row not routed yet parked behind them');
cycle(qq([{"id": $x1, "t": "$T3", "o": "sent", "a": 1, "d": "bill", "u": false}]), claim_json($T3));
is(join(' ', map { hold_of($_) } $x1, $x2), 'sent/- processing/-', 'x: billing\'s row sent, the partner\'s in flight');
like(hold_of($x3), qr{^pending/},
	'billing\'s row sent by a cycle that claims: the row not routed yet is not claimed beside the partner\'s in flight');
cycle(qq([{"id": $x2, "t": "$T3", "o": "sent", "a": 1, "d": "part", "u": false}]), claim_json($T3));
is(hold_of($x3), 'processing/-', 'the partner\'s row sent: the row not routed yet is claimed');
is(count(), $before + 8, 'rows counted after: none lost');

# ==== 7. two ends at once (docs/design/claim.md): a fan-out row u is
# claimed whatever its key's order, so it is in flight beside p, the row
# before it at the partner, and c, parked at the partner, waits for both.
# Two sessions end u and p in two open transactions: each promotion reads
# the other row in flight, and the fan-out row's cycle releases c (before,
# c waited for the sweep).  Needs reads of the last committed version
# (READ_COMMITTED_SNAPSHOT, docs/sqlserver.md): without it the second
# session would wait for the first, which this script holds open.
my ($ta, $tb) = (mssql_connect($url), mssql_connect($url));
# p at the partner, u not routed yet and marked fan-out (origin = its id, as
# outbox_fanout marks a row of a fan-out route), c at the partner; one claim
# takes p and u and parks c
sub three
{
	my ($key, $token) = @_;
	mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, destination) VALUES (N'cycle.w', ?, N'{}', N'part')},
		$key);
	mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (N'cycle.w', ?, N'{}')}, $key);
	mssql_do($dbh, q{UPDATE queuebox.outbox SET origin = id WHERE [key] = ? AND destination IS NULL}, $key);
	mssql_do($dbh, q{INSERT INTO queuebox.outbox (topic, [key], payload, destination) VALUES (N'cycle.w', ?, N'{}', N'part')},
		$key);
	my @ids = map { $_->[0] } @{ mssql_rows($dbh, q{SELECT id FROM queuebox.outbox WHERE [key] = ? ORDER BY id}, $key) };
	cycle(undef, claim_json($token));
	is(join(' ', map { hold_of($_) } @ids), 'processing/- processing/- pending/key',
		"$key: p and the fan-out row u in flight, c parked at the partner behind both");
	return @ids;
}
sub p_sent { my ($p, $t) = @_; return qq([{"id": $p, "t": "$t", "o": "sent", "a": 1, "d": "part", "u": false}]); }
sub u_sent
{
	my ($u, $t, $copies) = @_;
	return qq([{"id": $u, "t": "$t", "o": "sent", "a": 1, "d": "bill", "u": true, "c": $copies}]);
}
SKIP:
{
	skip 'two ends at once needs READ_COMMITTED_SNAPSHOT ON (docs/sqlserver.md): a read would wait for the other session', 13
	  unless mssql_value($dbh, 'SELECT is_read_committed_snapshot_on FROM sys.databases WHERE name = DB_NAME()');
	$before = count();
	# a: p's end first, then u's, each in its own open transaction; committed in that order
	my $Ta = '6f9619ff-8b86-d011-b42d-00c04fc964fa';
	my ($p, $u, $c) = three('w.a', $Ta);
	mssql_do($_, 'BEGIN TRANSACTION') for ($ta, $tb);
	cycle_in($ta, p_sent($p, $Ta), undef);
	cycle_in($tb, u_sent($u, $Ta, '["mq"]'), undef);
	mssql_do($_, 'COMMIT') for ($ta, $tb);
	is(join(' ', map { hold_of($_) } $p, $u, $c), 'sent/- sent/- pending/-',
		'a: p and u ended at once: c is released, not left for the sweep');
	# b: u's end first, then p's; committed in that order
	my $Tb = '6f9619ff-8b86-d011-b42d-00c04fc964fb';
	($p, $u, $c) = three('w.b', $Tb);
	mssql_do($_, 'BEGIN TRANSACTION') for ($ta, $tb);
	cycle_in($tb, u_sent($u, $Tb, '["mq"]'), undef);
	cycle_in($ta, p_sent($p, $Tb), undef);
	mssql_do($_, 'COMMIT') for ($tb, $ta);
	is(join(' ', map { hold_of($_) } $p, $u, $c), 'sent/- sent/- pending/-', 'b: the other order: c is released');
	# c: u ends alone while p stays in flight: c is released past it, and
	# the next claim checks its order and parks it again (not sent beside
	# p); p's end then releases it
	my $Tc = '6f9619ff-8b86-d011-b42d-00c04fc964fc';
	($p, $u, $c) = three('w.c', $Tc);
	cycle(u_sent($u, $Tc, '["mq"]'), undef);
	is(hold_of($c), 'pending/-', 'c: u ended, p in flight: c is released, for the claim to look at again');
	cycle(undef, claim_json($Tc));
	is(join(' ', map { hold_of($_) } $p, $c), 'processing/- pending/key', 'c: the claim parks c again behind p in flight');
	cycle(p_sent($p, $Tc), claim_json($Tc));
	is(hold_of($c), 'processing/-', 'c: p sent: c is claimed');
	# d: u is copied to the partner too: its copy comes before c there, so c
	# stays parked at both ends, and goes out after the copy
	my $Td = '6f9619ff-8b86-d011-b42d-00c04fc964fd';
	($p, $u, $c) = three('w.d', $Td);
	mssql_do($_, 'BEGIN TRANSACTION') for ($ta, $tb);
	cycle_in($ta, p_sent($p, $Td), undef);
	cycle_in($tb, u_sent($u, $Td, '["part"]'), undef);
	mssql_do($_, 'COMMIT') for ($ta, $tb);
	my $copy = mssql_value($dbh, q{SELECT id FROM queuebox.outbox WHERE origin = ? AND id <> ?}, $u, $u);
	is(join(' ', map { hold_of($_) } $copy, $c), 'pending/- pending/key',
		'd: u\'s copy at the partner comes first: c stays parked behind it');
	cycle(undef, claim_json($Td));
	is(join(' ', map { hold_of($_) } $copy, $c), 'processing/- pending/key', 'd: the claim takes the copy, c waits');
	cycle(qq([{"id": $copy, "t": "$Td", "o": "sent", "a": 1, "d": "part", "u": false}]), claim_json($Td));
	is(hold_of($c), 'processing/-', 'd: the copy sent: c is claimed');
	is(count(), $before + 16, 'rows counted after: 12 inserted, 4 copies, none lost');
}
$_->disconnect for ($ta, $tb);
rmq_stop($rmq);
qb_sink_stop($_) for ($bill, $part);
done_testing();
