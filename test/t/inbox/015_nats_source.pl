# 015_nats_source.pl
#   The NATS source against a real nats-server -js: a JetStream durable pull
#   consumer stores what the stream holds as inbox rows (key = Nats-Msg-Id,
#   else "stream/sequence"; headers; payload); a second stream message with
#   a Nats-Msg-Id already stored is a duplicate; a body that is not JSON is a
#   dead row and is acknowledged, and so is a message whose key has a
#   control character (under a key made of its position); acknowledgements wait for the commit (a
#   consumer worker killed while its store is blocked loses nothing and
#   stores nothing twice); a store that fails naks with a delay and loses
#   nothing; nats-server stopped (TERM, then KILL) while a batch is in its
#   store and restarted on the same store: the same worker resumes from the
#   durable with no operator action, every message published before the
#   stop and after the restart is stored once and the durable drains; a
#   server back without the durable's state replays the stream and stores
#   nothing twice;
#   SIGHUP and SIGTERM reach the consumer worker while its NATS connection
#   is open; a durable made by hand is used as it is, its low MaxAckPending
#   raised, and one without explicit acks is refused; a fetch that starts
#   with messages waiting in the subscription takes at most a batch and
#   corrupts nothing (test/brokers/nats_fetch_check).
use strict;
use warnings;

use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxNats;

my $DURABLE = 'queuebox-ev';
my $nats = nats_start(name => 'src');
# a short duplicate window: the test can put two messages with one
# Nats-Msg-Id into the stream
nats_add_stream($nats, 'EV', 'ev.>', { dup_window_ms => 500 });
# the kill -9 case needs the postmaster to reinitialize (the test default is off)
my $node = qb_node('nats_src', workers => 1, conf => "restart_after_crash = on\n");

sub configure
{
	my (%http) = @_;
	qb_configure(
		$node,
		qb_config_yaml(
			(%http ? (http => \%http) : ()),
			sources => {
				ev => {
					type => 'nats', url => $nats->{url}, subject => 'ev.>', stream => 'EV',
					consumption => 'pull', eventTypePath => '$.type', batchSize => 10,
				},
			}));
}
configure();

sub inbox_count { return qb_inbox_count($node, @_); }

sub row { return qb_inbox_row($node, 'ev', $_[0]); }

sub consumer_pids
{
	return grep { $_ ne '' } split /\n/, $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'queuebox consumer' ORDER BY pid");
}

# the durable is drained: every message delivered and acknowledged
sub drained
{
	my ($what, %o) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return qb_wait_for(sub {
		my $c = nats_consumer($nats, 'EV', $DURABLE);
		$c && $c->{num_ack_pending} == 0 && $c->{num_pending} == 0
		  && $c->{ack_floor} == nats_count($nats, 'EV');
	}, $what, timeout => $o{timeout} // 60);
}

is(inbox_count(), '0', 'the inbox is empty before the test');

# ---- a fetch that starts with messages waiting in the subscription (cnats
# 3.4.1's Fetch(n) wrote past its array there: qb_src_nats.c, "Fetching"),
# through the source's own consumer, with glibc's malloc checks on
{
	nats_add_stream($nats, 'FC', 'fc.>');
	my $debug = '/lib/x86_64-linux-gnu/libc_malloc_debug.so.0';
	my %env = -e $debug ? (LD_PRELOAD => $debug, MALLOC_CHECK_ => 3) : ();
	my ($out, $err) = ('', '');
	local @ENV{ keys %env } = values %env;
	IPC::Run::run([ qb_test_binary('test/brokers/nats_fetch_check'), $nats->{url}, 'FC', 'fc' ],
		'<', \undef, '>', \$out, '2>', \$err);
	is($? ? "exit status $? $err" : $out, "ok 18 messages, at most 10 a fetch\n",
		'a fetch that starts with 8 messages waiting and more coming: at most a batch, each message once'
		  . (%env ? ' (glibc malloc checks on)' : ''));
}

# ---- N messages: keys, headers, payload
my $pub = nats_publish($nats, 'ev.order', '{"type":"order.created","n":{i}}', n => 4,
	headers => { 'Nats-Msg-Id' => 'order-{i}', 'X-Trace' => 't{i}' });
is(scalar(grep { !$_->{duplicate} } @$pub), 4, '4 messages with a Nats-Msg-Id in the stream');
$pub = nats_publish($nats, 'ev.plain', '{"type":"plain","n":{i}}', n => 3);
my @plain_seq = map { $_->{seq} } @$pub;
is(nats_count($nats, 'EV'), 7, 'the stream holds 7 messages');
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ev'", '7',
	'the 7 messages are stored', timeout => 60);
for my $i (1 .. 4)
{
	my $r = row("order-$i");
	ok($r, "order-$i: the key is its Nats-Msg-Id") or next;
	is($r->{state}, 'pending', "order-$i: pending");
	is($r->{event_type}, 'order.created', "order-$i: event type from eventTypePath");
	is_deeply($r->{payload}, { type => 'order.created', n => $i }, "order-$i: payload");
	is($r->{headers}{'X-Trace'}, "t$i", "order-$i: NATS headers stored");
	is($r->{headers}{'Nats-Msg-Id'}, "order-$i", "order-$i: Nats-Msg-Id among the headers");
}
for my $i (1 .. 3)
{
	my $r = row("EV/$plain_seq[$i - 1]");
	ok($r, "plain $i: no Nats-Msg-Id, the key is stream/sequence EV/$plain_seq[$i - 1]") or next;
	is_deeply($r->{payload}, { type => 'plain', n => $i }, "plain $i: payload");
}
drained('all 7 acknowledged after the commit');

# ---- a second stream message with a stored Nats-Msg-Id is a duplicate
my $before = inbox_count();
my $stream_before = nats_count($nats, 'EV');
# the window is 500 ms: publish until the stream keeps a second copy
qb_wait_for(sub { !nats_publish($nats, 'ev.order', '{"type":"order.created","n":1}',
		headers => { 'Nats-Msg-Id' => 'order-1' })->[0]{duplicate} },
	'a second message with Nats-Msg-Id order-1 enters the stream', timeout => 30);
is(nats_count($nats, 'EV'), $stream_before + 1, 'the stream holds one more message');
drained('the repeat is acknowledged');
is(inbox_count(), $before, 'the repeat is not stored again');
is(inbox_count("idempotency_key = 'order-1'"), '1', 'order-1 is stored once');

# ---- a body that is not JSON: a dead row, acknowledged
$before = inbox_count();
$stream_before = nats_count($nats, 'EV');
nats_publish($nats, 'ev.bad', 'not json at all', headers => { 'Nats-Msg-Id' => 'bad-1' });
is(nats_count($nats, 'EV'), $stream_before + 1, 'the non-JSON message is in the stream');
qb_wait_query($node, "SELECT state FROM queuebox.inbox WHERE idempotency_key = 'bad-1'", 'dead',
	'the non-JSON message is a dead row', timeout => 60);
is(row('bad-1')->{payload}, 'not json at all', 'the dead row keeps the body as a JSON string');
is(inbox_count(), $before + 1, 'one row more');
drained('the non-JSON message is acknowledged (nothing pending on the durable)');

# ---- a key with a control character: a dead row under a made-up key (the
# relay would send it on as x-idempotency-key, which every destination
# refuses); an event type with one is left out
$before = inbox_count();
nats_publish($nats, 'ev.ctl', '{"type":"ctl\u0001type","n":1}', headers => { 'Nats-Msg-Id' => "ctl\x01key" });
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ev'", $before + 1,
	'the message whose key has a control character is stored', timeout => 60);
my $ctl = decode_json($node->safe_psql('postgres',
	"SELECT row_to_json(i) FROM queuebox.inbox i WHERE source = 'ev' ORDER BY id DESC LIMIT 1"));
is($ctl->{state}, 'dead', 'a key with a control character: the row is dead');
like($ctl->{idempotency_key}, qr{^no-key:EV/\d+$}, 'a key with a control character: stored under a key made of its position');
like($ctl->{last_error}, qr/the message's idempotency key has a control character/,
	'a key with a control character: last_error says so');
is($ctl->{event_type}, undef, 'an event type with a control character is left out');
is(inbox_count(q{idempotency_key LIKE 'ctl%'}), '0', 'the key with the control character is stored nowhere');
drained('the message with the bad key is acknowledged');

# ---- acknowledged only after the commit: kill -9 while the store is blocked
$before = inbox_count();
$stream_before = nats_count($nats, 'EV');
{
	my $locker = $node->background_psql('postgres', on_error_stop => 0);
	$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN ACCESS EXCLUSIVE MODE;');
	nats_publish($nats, 'ev.crash', '{"type":"crash","n":{i}}', n => 5,
		headers => { 'Nats-Msg-Id' => 'crash-{i}' });
	is(nats_count($nats, 'EV'), $stream_before + 5, 'crash: 5 messages in the stream');
	qb_wait_for(sub { nats_consumer($nats, 'EV', $DURABLE)->{num_ack_pending} == 5 },
		'crash: the 5 are delivered to the worker and not acknowledged while the store is blocked',
		timeout => 60);
	my @pids = consumer_pids();
	is(scalar @pids, 1, 'crash: one consumer worker');
	my $off = -s $node->logfile;
	ok(kill('KILL', $pids[0]), "crash: kill -9 consumer worker $pids[0]");
	local $PostgreSQL::Test::Utils::timeout_default = 60;
	$node->wait_for_log(qr/all server processes terminated; reinitializing/, $off);
	pass('crash: the postmaster crash-restarts the cluster (the lock is gone with it)');
	eval { $locker->quit };
}
cmp_ok(nats_consumer($nats, 'EV', $DURABLE)->{ack_floor}, '<', nats_count($nats, 'EV'),
	'crash: the 5 were not acknowledged');
# The server redelivers them after the durable's AckWait: QueueBox made the
# durable with the server's 30 s; shortened to 2 s once the kill is done and
# checked (in place: the worker binds to the durable as it is, and the
# server re-checks what is pending at the change), given back after this
# case, so the redelivery comes within seconds, not 30.
my $ack_wait = nats_consumer($nats, 'EV', $DURABLE)->{ack_wait_ms};
nats_ack_wait($nats, 'EV', $DURABLE, 2000);
is(nats_consumer($nats, 'EV', $DURABLE)->{ack_wait_ms}, 2000, "crash: the durable's AckWait is 2 s (it was $ack_wait ms)");
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'crash-%'", '5',
	'crash: the 5 are stored after the restart', timeout => 120);
drained('crash: the 5 are acknowledged after the restart', timeout => 60);
is(inbox_count(), $before + 5, 'crash: exactly 5 rows more: no loss, no duplicate');
nats_ack_wait($nats, 'EV', $DURABLE, $ack_wait);

# ---- the store fails: nak with a delay, nothing lost
configure(storeTimeoutMs => 500);
$before = inbox_count();
$stream_before = nats_count($nats, 'EV');
{
	my $locker = $node->background_psql('postgres');
	$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN ACCESS EXCLUSIVE MODE;');
	nats_publish($nats, 'ev.down', '{"type":"down","n":{i}}', n => 3,
		headers => { 'Nats-Msg-Id' => 'down-{i}' });
	is(nats_count($nats, 'EV'), $stream_before + 3, 'db down: 3 messages in the stream');
	# a nak brings the batch back: the server counts the redeliveries
	qb_wait_for(sub { nats_consumer($nats, 'EV', $DURABLE)->{num_redelivered} > 0 },
		'db down: the failed batch is given back (nak) and redelivered', timeout => 60);
	$locker->query_safe('ROLLBACK;');
	$locker->quit;
}
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'down-%'", '3',
	'db down: the 3 are stored once the database is back', timeout => 60);
drained('db down: all acknowledged');
is(inbox_count(), $before + 3, 'db down: exactly 3 rows more');

# ---- nats-server stopped mid-consume, restarted on the same store
# A lock holds a fetched batch in its store while the server stops (TERM,
# then KILL); let go, the batch is stored with the server gone and its acks
# cannot reach it.  The durable lives in the server's store: after the
# restart the same worker resumes from it with no operator action.  These
# messages have no Nats-Msg-Id: each is keyed by its stream/sequence, so a
# redelivered one is a duplicate of its own row.
configure(storeTimeoutMs => 60000);    # the store waits out the lock
sub restart_mid_consume
{
	my ($sig) = @_;
	my $subject = 'ev.restart.' . lc $sig;
	my $before = inbox_count();
	my $stream_before = nats_count($nats, 'EV');
	my @pids = consumer_pids();
	my $locker = $node->background_psql('postgres');
	$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN ACCESS EXCLUSIVE MODE;');
	my @seqs = map { $_->{seq} } @{ nats_publish($nats, $subject, '{"type":"restart","n":{i}}', n => 50) };
	is(nats_count($nats, 'EV'), $stream_before + 50, "$sig: 50 messages in the stream before the stop");
	# a fetch returns what is there (1 to 10): the batch's size is read from the log
	qb_wait_for(sub { nats_consumer($nats, 'EV', $DURABLE)->{num_ack_pending} > 0 && qb_consumers_on_lock($node) },
		"$sig: a fetched batch waits on the locked inbox", timeout => 60);
	my $off = -s $node->logfile;
	my $server = $nats->{pid};
	nats_stop($nats, $sig);
	ok(!kill(0, $server), "$sig: nats-server $server is gone mid-consume");
	$locker->query_safe('ROLLBACK');
	$locker->quit;
	my ($held) = qb_wait_log($node, qr/source "ev": stored \d+ messages? but could not acknowledge/, $off,
		timeout => 60) =~ /source "ev": stored (\d+) messages? but could not acknowledge/;
	ok($held, "$sig: the batch is stored with the server gone, and its acknowledgement cannot reach it");
	cmp_ok(inbox_count(), '>=', $before + ($held // 1), "$sig: its rows are there");
	$nats = nats_start(again => $nats);
	is(nats_count($nats, 'EV'), $stream_before + 50, "$sig: restarted on its store, the stream kept the 50");
	push @seqs, map { $_->{seq} } @{ nats_publish($nats, $subject, '{"type":"restart","n":{i}}', n => 50) };
	is(nats_count($nats, 'EV'), $stream_before + 100, "$sig: 50 more published after the restart");
	qb_wait_query($node, 'SELECT count(*) FROM queuebox.inbox', $before + 100,
		"$sig: all 100 are stored", timeout => 120);
	drained("$sig: the durable drains: nothing pending, nothing unacknowledged", timeout => 120);
	is(inbox_count(), $before + 100, "$sig: exactly 100 rows more: none lost, none twice");
	my %keys = map { $_ => 1 } split /\n/, $node->safe_psql('postgres',
		"SELECT idempotency_key FROM queuebox.inbox WHERE source = 'ev'");
	is(scalar(grep { $keys{"EV/$_"} } @seqs), 100, "$sig: a row for each message, keyed by its sequence");
	is_deeply([ consumer_pids() ], \@pids, "$sig: the same consumer worker throughout");
	return;
}
restart_mid_consume('TERM');
restart_mid_consume('KILL');

# ---- the server comes back without the durable's state: it replays the stream
# nats-server can lose a consumer's state in a crash (its o.dat is written in
# place, nats-server #8036, #3996); CI saw a kill -9 replay the whole stream
# once.  Every message comes again: each is a duplicate of its row, the dead
# one with the unusable key too (its made-up key comes from its position).
{
	my $before = inbox_count();
	my $count = nats_count($nats, 'EV');
	my $state = "$nats->{dir}/jetstream/\$G/streams/EV/obs/$DURABLE/o.dat";
	nats_stop($nats, 'TERM');
	ok(-s $state && unlink($state), "replay: the durable's state is removed while nats-server is stopped");
	$nats = nats_start(again => $nats);
	my $c = nats_consumer($nats, 'EV', $DURABLE);
	is($c && $c->{ack_floor}, 0, 'replay: restarted, the durable starts again at the first message');
	drained("replay: the durable drains the $count messages again", timeout => 120);
	is(inbox_count(), $before, 'replay: no row more: each message is a duplicate of its row')
	  or diag($node->safe_psql('postgres',
		"SELECT id, state, idempotency_key FROM queuebox.inbox WHERE source = 'ev' ORDER BY id DESC LIMIT 5"));
}

# ---- signals reach the consumer worker while its NATS connection is open
my @pids = consumer_pids();
is(scalar @pids, 1, 'one consumer worker');
my $pid = $pids[0];
my ($nthreads, @unmasked) = nats_thread_masks($pid);
cmp_ok($nthreads, '>=', 3, 'the consumer worker runs cnats threads (its connection is open)');
is("@unmasked", '', 'every cnats thread blocks SIGHUP, SIGINT, SIGUSR1, SIGTERM and SIGURG');

my $off = -s $node->logfile;
$node->safe_psql('postgres', "ALTER SYSTEM SET log_min_messages = 'debug5'");
kill 'HUP', $pid;
# an idle consumer runs no transaction: give it a message to store
nats_publish($nats, 'ev.hup', '{"type":"hup"}', headers => { 'Nats-Msg-Id' => 'hup-1' });
my $log = qb_wait_log($node, qr/\[$pid\] DEBUG:/, $off, timeout => 30);
like($log, qr/\[$pid\] DEBUG:/, 'SIGHUP: the consumer worker reloaded its configuration');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET log_min_messages');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');

qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key = 'hup-1'", '1',
	'the message sent with the SIGHUP is stored', timeout => 60);
drained('and acknowledged');
kill 'TERM', $pid;
qb_wait_for(sub { !kill(0, $pid) }, 'SIGTERM: the consumer worker exits', timeout => 30);
qb_wait_for(sub { my @p = consumer_pids(); @p == 1 && $p[0] != $pid },
	'SIGTERM: the launcher starts a new consumer worker', timeout => 60);
$before = inbox_count();
nats_publish($nats, 'ev.after', '{"type":"after"}', headers => { 'Nats-Msg-Id' => 'after-1' });
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key = 'after-1'", '1',
	'the new consumer worker stores from NATS', timeout => 60);
drained('and acknowledges');
is(inbox_count(), $before + 1, 'one row more at the end');

# ---- a durable made by hand: kept, its low MaxAckPending raised; one
# ---- without explicit acks refused with what to do, nothing consumed
nats_add_stream($nats, 'HAND', 'hand.>');
nats_add_consumer($nats, 'HAND', 'hand-low', 'hand.>', 5, 'explicit');
nats_add_stream($nats, 'NONE', 'none.>');
nats_add_consumer($nats, 'NONE', 'hand-none', 'none.>', 1000, 'none');
sub configure_hand
{
	my ($durable, $stream, $subject) = @_;
	qb_configure(
		$node,
		qb_config_yaml(
			sources => {
				hand => {
					type => 'nats', url => $nats->{url}, subject => $subject, stream => $stream,
					durable => $durable, consumption => 'pull', batchSize => 10,
				},
			}));
}
$before = inbox_count();
nats_publish($nats, 'hand.x', qq({"n":$_}), headers => { 'Nats-Msg-Id' => "hand-$_" }) for 1 .. 30;
configure_hand('hand-low', 'HAND', 'hand.>');
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'hand'", '30',
	'hand-made durable: the 30 messages are stored through it', timeout => 60);
is(inbox_count(), $before + 30, 'hand-made durable: 30 rows more, no other');
my $hc = nats_consumer($nats, 'HAND', 'hand-low');
is($hc->{max_ack_pending}, 1000, 'hand-made durable: its MaxAckPending of 5 is raised to 1000');
qb_wait_for(sub { my $c = nats_consumer($nats, 'HAND', 'hand-low');
		$c->{num_ack_pending} == 0 && $c->{num_pending} == 0 && $c->{ack_floor} == 30 },
	'hand-made durable: the 30 are acknowledged', timeout => 60);

$off = -s $node->logfile;
configure_hand('hand-none', 'NONE', 'none.>');
nats_publish($nats, 'none.x', '{"n":1}', headers => { 'Nats-Msg-Id' => 'none-1' });
$log = qb_wait_log($node, qr/does not use explicit acks/, $off, timeout => 60);
like($log, qr/source "hand": could not connect \(.*the durable hand-none of stream NONE does not use explicit acks.*delete it, or name another durable/,
	'a durable without explicit acks is refused, saying what to do');
is(inbox_count(), $before + 30, 'nothing is stored through a durable without explicit acks');
is(nats_count($nats, 'NONE'), 1, 'the message stays in its stream');

$node->stop;
nats_stop($nats);
done_testing();
