# 017_rabbitmq_source.pl
#   The RabbitMQ source against a private rabbitmq-server: basic.consume on
#   a queue stores its messages as inbox rows (key = the message_id
#   property, event type = the type property with eventTypeFromHeader,
#   headers table as JSON); a repeated message_id is stored once; a body
#   that is not JSON is a dead row and is acknowledged; a store that fails
#   nacks (requeue) and loses nothing; the source transform reshapes the
#   stored payload, and a message it rejects is a dead row with the reason,
#   acknowledged; acknowledgements wait for the commit (the worker killed
#   -9 while its store is blocked: the broker redelivers, each message is
#   stored once); a connection lost between commit and ack brings the
#   batch back as duplicates, not second rows; the broker stopped, then
#   killed, while a batch is being stored and started again: the worker
#   reconnects by itself and every message is stored exactly once.  Rows,
#   queue depth and the received counters of /metrics are compared before
#   and after each case.
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxRabbit;

my $Q = 'qb.src';
my $rmq = rmq_start(name => 'src');
rmq_tool($rmq, 'queue', $Q);
# the kill -9 case needs the postmaster to reinitialize (the test default is off)
my $node = qb_node('rmq_src', workers => 1, conf => "restart_after_crash = on\n");
# the listener only serves /metrics here: the consumer counts what it stores
my $port = qb_free_port();

# configure(http => {...}, source => {...}): the one rabbitmq source ev
sub configure
{
	my (%o) = @_;
	qb_configure(
		$node,
		qb_config_yaml(
			http => { listen => "127.0.0.1:$port", %{ $o{http} // {} } },
			sources => {
				ev => {
					type => 'rabbitmq', url => $rmq->{url}, queue => $Q, prefetch => 20, consumption => 'pull',
					eventTypeFromHeader => JSON::PP::true, batchSize => 10, %{ $o{source} // {} },
				},
			}));
}
configure();

sub inbox_count { return qb_inbox_count($node, @_); }

sub row { return qb_inbox_row($node, 'ev', $_[0]); }

sub publish
{
	my ($body, $mid, $type, $headers) = @_;
	rmq_tool($rmq, 'publish', $Q, $body, $mid // '', $type // '', encode_json($headers // {}));
}

# publish_n($prefix, $from, $to): {"n":i} keyed "$prefix-i", on one connection
sub publish_n
{
	my ($prefix, $from, $to) = @_;
	rmq_tool($rmq, map { ('publish', $Q, qq({"n":$_}), "$prefix-$_", $prefix, '{}') } $from .. $to);
}

sub drained
{
	my ($what, %o) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return qb_wait_for(sub { rmq_count($rmq, $Q) == 0 }, $what, timeout => $o{timeout} // 60);
}

# [ready, unacknowledged] as the broker counts them
sub held
{
	my ($line) = grep { /^\Q$Q\E\s/ } split /\n/,
	  rmq_ctl($rmq, 'list_queues', '-q', '--no-table-headers', 'name', 'messages_ready',
		'messages_unacknowledged');
	return $line ? [ (split /\s+/, $line)[ 1, 2 ] ] : [ -1, -1 ];
}

# the keys stored under a prefix, sorted, and the keys expected
sub keys_of
{
	my ($prefix) = @_;
	return [ split /\n/, $node->safe_psql('postgres',
		"SELECT idempotency_key FROM queuebox.inbox WHERE source = 'ev' AND idempotency_key LIKE '$prefix-%' ORDER BY 1") ];
}
sub keys_expected { my ($prefix, $n) = @_; return [ sort map { "$prefix-$_" } 1 .. $n ]; }

# the source's received counters from /metrics: { accepted => n, duplicate => n, ... }
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);
sub received
{
	my $r = $http->get("http://127.0.0.1:$port/metrics");
	die "GET /metrics: $r->{status} $r->{content}" unless $r->{status} == 200;
	my %c = $r->{content} =~ /^queuebox_inbox_received_total\{source="ev",result="(\w+)"\} (\d+)$/mg;
	return \%c;
}

sub consumer_pid
{
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'");
}

# the consumer worker's store waits on the locked inbox
sub store_waits
{
	my ($what) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return qb_wait_for(sub {
		$node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity
			WHERE backend_type = 'queuebox consumer' AND wait_event_type = 'Lock'});
	}, $what, timeout => 60);
}

is(inbox_count(), '0', 'the inbox is empty before the test');
is(rmq_count($rmq, $Q), '0', 'the queue is empty before the test');

# ---- N messages: key, event type, headers, payload
publish(qq({"n":$_}), "order-$_", 'order.created', { 'X-Trace' => "t$_" }) for 1 .. 5;
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ev'", '5',
	'the 5 messages are stored', timeout => 60);
for my $i (1 .. 5)
{
	my $r = row("order-$i");
	ok($r, "order-$i: the key is its message_id") or next;
	is($r->{state}, 'pending', "order-$i: pending");
	is($r->{event_type}, 'order.created', "order-$i: event type from the type property");
	is_deeply($r->{payload}, { n => $i }, "order-$i: payload");
	is($r->{headers}{'X-Trace'}, "t$i", "order-$i: AMQP headers stored");
}
drained('the 5 are acknowledged: the queue is empty');

# ---- a repeated message_id is stored once
my $before = inbox_count();
publish('{"n":1}', 'order-1', 'order.created');
drained('the repeat is acknowledged');
is(inbox_count(), $before, 'the repeat is not stored again');
is(inbox_count("idempotency_key = 'order-1'"), '1', 'order-1 is stored once');

# ---- a body that is not JSON: a dead row, acknowledged
$before = inbox_count();
publish('not json at all', 'bad-1', 'bad');
qb_wait_query($node, "SELECT state FROM queuebox.inbox WHERE idempotency_key = 'bad-1'", 'dead',
	'the non-JSON message is a dead row', timeout => 60);
is(row('bad-1')->{payload}, 'not json at all', 'the dead row keeps the body as a JSON string');
is(inbox_count(), $before + 1, 'one row more');
drained('the non-JSON message is acknowledged: the queue is empty');

# ---- the store fails: nothing acknowledged, the broker redelivers
configure(http => { storeTimeoutMs => 500 });
$before = inbox_count();
{
	my $locker = $node->background_psql('postgres');
	$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN ACCESS EXCLUSIVE MODE;');
	publish_n('down', 1, 3);
	qb_wait_for(sub { held()->[1] > 0 }, 'db down: the 3 are delivered to the worker', timeout => 60);
	# storeTimeoutMs 500: several stores fail and the batch goes back meanwhile
	sleep 3;
	my $h = held();
	is($h->[0] + $h->[1], 3, 'db down: the broker still holds the 3: nothing acknowledged');
	$locker->query_safe('ROLLBACK;');
	$locker->quit;
}
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'down-%'", '3',
	'db down: the 3 are stored once the database is back', timeout => 60);
drained('db down: all acknowledged: the queue is empty');
is(inbox_count(), $before + 3, 'db down: exactly 3 rows more');

# ---- the source transform: reshapes what is stored; a rejection is a dead row, acknowledged
configure(source => { transform =>
	'if .reject then error("rejected: \(.n)") '
	  . 'else {n, doubled: (.n * 2), source: $source, eventType: $eventType, trace: $headers["X-Trace"]} end' });
$before = inbox_count();
my $rx = received();
is(rmq_count($rmq, $Q), '0', 'transform: the queue is empty before');
publish('{"n":1}', 'tf-1', 'order.created', { 'X-Trace' => 't1' });
publish('{"n":2,"reject":true}', 'tf-2', 'order.created');
publish('{"n":3}', 'tf-3', 'order.created', { 'X-Trace' => 't3' });
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'tf-%'", '3',
	'transform: the 3 messages are stored', timeout => 60);
for my $i (1, 3)
{
	my $r = row("tf-$i");
	is($r->{state}, 'pending', "transform: tf-$i pending");
	is_deeply($r->{payload},
		{ n => $i, doubled => 2 * $i, source => 'ev', eventType => 'order.created', trace => "t$i" },
		"transform: tf-$i stored as the transform output, with \$source, \$eventType and \$headers bound");
}
my $r = row('tf-2');
is($r->{state}, 'dead', 'transform: the rejected message is a dead row');
is_deeply($r->{payload}, { n => 2, reject => JSON::PP::true }, 'transform: the dead row keeps the body as it came');
is($node->safe_psql('postgres', "SELECT last_error FROM queuebox.inbox WHERE idempotency_key = 'tf-2'"),
	'the source transform rejected the message: rejected: 2', 'transform: last_error gives the reason');
drained('transform: all 3 acknowledged, the rejected one too: the queue is empty');
is(inbox_count(), $before + 3, 'transform: exactly 3 rows more');
my $rx2 = received();
is($rx2->{accepted} - $rx->{accepted}, 2, 'transform: 2 counted accepted');
is($rx2->{unprocessable} - $rx->{unprocessable}, 1, 'transform: 1 counted unprocessable');

# The lock cases below hold the inbox locked as long as they need: the
# store must wait, not time out and give the batch back.
configure(http => { storeTimeoutMs => 300000 });

# ---- acknowledged only after the commit: kill -9 while the store is blocked
$before = inbox_count();
is(rmq_count($rmq, $Q), '0', 'crash: the queue is empty before');
{
	my $locker = $node->background_psql('postgres', on_error_stop => 0);
	$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN ACCESS EXCLUSIVE MODE;');
	publish_n('crash', 1, 5);
	qb_wait_for(sub { held()->[1] == 5 },
		'crash: the 5 are delivered to the worker and stay unacknowledged', timeout => 60);
	my $pid = store_waits('crash: the worker\'s store waits on the locked inbox');
	my $off = -s $node->logfile;
	ok(kill('KILL', $pid), "crash: kill -9 consumer worker $pid");
	local $PostgreSQL::Test::Utils::timeout_default = 60;
	$node->wait_for_log(qr/all server processes terminated; reinitializing/, $off);
	pass('crash: the postmaster crash-restarts the cluster (the lock is gone with it)');
	eval { $locker->quit };
}
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'crash-%'", '5',
	'crash: the broker redelivers the 5 and they are stored after the restart', timeout => 120);
drained('crash: the 5 are acknowledged after the restart');
is_deeply(keys_of('crash'), keys_expected('crash', 5), 'crash: each of the 5 is stored once');
is(inbox_count(), $before + 5, 'crash: exactly 5 rows more');
# the crash restart made new shared memory: the counters start again at 0
qb_wait_for(sub { received() }, 'crash: /metrics answers after the restart', timeout => 60);
$rx = received();
is($rx->{accepted}, 5, 'crash: the 5 counted accepted after the restart');
is($rx->{duplicate}, 0, 'crash: none was a duplicate: nothing had been committed before the kill');

# ---- stored but the acknowledgement lost: the redelivery is a duplicate
$before = inbox_count();
$rx = received();
is(rmq_count($rmq, $Q), '0', 'ack lost: the queue is empty before');
{
	my $locker = $node->background_psql('postgres');
	$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN ACCESS EXCLUSIVE MODE;');
	publish_n('lost', 1, 5);
	qb_wait_for(sub { held()->[1] == 5 }, 'ack lost: the 5 are delivered to the worker', timeout => 60);
	store_waits('ack lost: the worker\'s store waits on the locked inbox');
	# the broker drops the worker's connection: the batch in the store will
	# commit, and its ack has nowhere to go
	rmq_ctl($rmq, 'close_all_connections', 'the test drops the consumer');
	qb_wait_for(sub { held()->[0] == 5 }, 'ack lost: the broker requeued the 5', timeout => 60);
	$locker->query_safe('ROLLBACK;');
	$locker->quit;
}
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'lost-%'", '5',
	'ack lost: the 5 are stored', timeout => 60);
drained('ack lost: the worker reconnects and the redelivery is acknowledged');
is_deeply(keys_of('lost'), keys_expected('lost', 5), 'ack lost: each of the 5 is stored once');
is(inbox_count(), $before + 5, 'ack lost: exactly 5 rows more');
my $rx3 = received();
is($rx3->{accepted} - $rx->{accepted}, 5, 'ack lost: 5 counted accepted, once each');
my $dups = $rx3->{duplicate} - $rx->{duplicate};
ok($dups >= 1 && $dups <= 5,
	"ack lost: the batch committed before the connection dropped came back as $dups duplicates");

# ---- the broker stopped, then killed, while a batch is stored; then started again
my $pid = consumer_pid();
my $total = 0;
for my $how ('stop', 'kill')
{
	$before = inbox_count();
	$rx = received();
	is(rmq_count($rmq, $Q), '0', "broker $how: the queue is empty before");
	my $off = -s $node->logfile;
	my $locker = $node->background_psql('postgres');
	$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN ACCESS EXCLUSIVE MODE;');
	publish_n($how, 1, 30);
	qb_wait_for(sub { held()->[1] > 0 }, "broker $how: a batch is delivered to the worker", timeout => 60);
	store_waits("broker $how: the worker's store waits on the locked inbox");
	if ($how eq 'stop') { rmq_stop($rmq); } else { rmq_kill($rmq); }
	# the batch commits while the broker is gone: its ack is lost
	$locker->query_safe('ROLLBACK;');
	$locker->quit;
	rmq_start($rmq);
	# more while the worker may still be reconnecting
	publish_n($how, 31, 40);
	qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE '$how-%'", '40',
		"broker $how: the worker reconnects by itself and stores all 40", timeout => 180);
	drained("broker $how: the queue drains", timeout => 60);
	is_deeply(keys_of($how), keys_expected($how, 40), "broker $how: each of the 40 is stored once");
	is(inbox_count(), $before + 40, "broker $how: exactly 40 rows more");
	my $rx4 = received();
	is($rx4->{accepted} - $rx->{accepted}, 40, "broker $how: 40 counted accepted, once each");
	is(consumer_pid(), $pid, "broker $how: the same consumer worker: it reconnected, nobody restarted it");
	# once an ack cannot be sent the connection is dead: no further batch is
	# stored on it (each would only come back as duplicates)
	my $seq = join '', map { /could not acknowledge/ ? 'A' : 'R' }
	  grep { /source "ev": .*(could not acknowledge|; reconnecting$)/ } split /\n/,
	  slurp_file($node->logfile, $off);
	unlike($seq, qr/AA/, "broker $how: after a failed ack the worker reconnects before it stores again ($seq)");
}
$node->stop;
done_testing();
