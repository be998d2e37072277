# 017_rabbitmq_source.pl
#   The RabbitMQ source against a private rabbitmq-server: basic.consume on
#   a queue stores its messages as inbox rows (key = the message_id
#   property, event type = the type property with eventTypeFromHeader,
#   headers table as JSON); a repeated message_id is stored once; a body
#   that is not JSON is a dead row and is acknowledged; a store that fails
#   nacks (requeue) and loses nothing.  Rows and queue depth are counted
#   before and after each case.
use strict;
use warnings;

use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use QueueBoxTest;
use QueueBoxRabbit;

my $Q = 'qb.src';
my $rmq = rmq_start(name => 'src');
rmq_tool($rmq, 'queue', $Q);
my $node = qb_node('rmq_src', workers => 1);

sub configure
{
	my (%http) = @_;
	qb_configure(
		$node,
		qb_config_yaml(
			(%http ? (http => \%http) : ()),
			sources => {
				ev => {
					type => 'rabbitmq', url => $rmq->{url}, queue => $Q, prefetch => 20, consumption => 'pull',
					eventTypeFromHeader => JSON::PP::true, batchSize => 10,
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

sub drained
{
	my ($what) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return qb_wait_for(sub { rmq_count($rmq, $Q) == 0 }, $what, timeout => 60);
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
configure(storeTimeoutMs => 500);
$before = inbox_count();
{
	my $locker = $node->background_psql('postgres');
	$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN ACCESS EXCLUSIVE MODE;');
	publish(qq({"n":$_}), "down-$_", 'down') for 1 .. 3;
	# ready + unacknowledged, as the broker counts them
	my $held = sub {
		my ($line) = grep { /^\Q$Q\E\s/ } split /\n/,
		  rmq_ctl($rmq, 'list_queues', '-q', '--no-table-headers', 'name', 'messages', 'messages_unacknowledged');
		return $line ? [ (split /\s+/, $line)[ 1, 2 ] ] : [ -1, -1 ];
	};
	qb_wait_for(sub { $held->()->[1] > 0 }, 'db down: the 3 are delivered to the worker', timeout => 60);
	# storeTimeoutMs 500: several stores fail and the batch goes back meanwhile
	sleep 3;
	is($held->()->[0], '3', 'db down: the broker still holds the 3: nothing acknowledged');
	$locker->query_safe('ROLLBACK;');
	$locker->quit;
}
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'down-%'", '3',
	'db down: the 3 are stored once the database is back', timeout => 60);
drained('db down: all acknowledged: the queue is empty');
is(inbox_count(), $before + 3, 'db down: exactly 3 rows more');

$node->stop;
done_testing();
