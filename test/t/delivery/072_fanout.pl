# 072_fanout.pl
#   Fan-out (docs/delivery.md, "Fan-out"): a route with destinations: [...]
#   delivers each row to every one of them, each delivery with its own
#   state, attempts, dead letter and key order.  On the extension, with 2
#   outbox workers:
#   1. one INSERT per row to an HTTP sink, a RabbitMQ exchange and a Kafka
#      topic: every row reaches all three once, with the same X-Message-Id
#      (message-id), each key in order at each; the outbox holds the row and
#      its two copies, nothing else;
#   2. a failing destination: while the partner's sink answers 500, the
#      billing sink gets every row of the same keys, in order (a key held
#      at one destination never holds it at another); once the partner
#      answers, it gets them all, in order, each once;
#   3. a dead letter at one destination (onDead: holdKey there): the row is
#      dead at the partner only, its key's later rows wait there and flow at
#      billing; requeue_outbox() of the dead copy sends it to the partner
#      only (billing's count does not move), and the held rows follow;
#   4. route_of() names every destination; replay_outbox() of a copy goes to
#      its destination only;
#   5. the validator explains a route with both destination and
#      destinations, a list of one, and a destination listed twice, and
#      changes nothing.
#   Waits are bounded polls; no assertion is on the test's own clock.
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
use QueueBoxKafka;

my $bill = qb_sink_start(name => 'fan_bill');
my $part = qb_sink_start(name => 'fan_part');
my $rmq = rmq_start(name => 'fanmq');
rmq_tool($rmq, exchange => 'qb.fan', 'topic', queue => 'q.fan', bind => 'q.fan', 'qb.fan', 'orders.#');
my $kafka = qb_kafka_start(topics => ['fan.orders']);
my $node = qb_node('fanout', workers => 2);

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

my %config = (
	outbox => { maxAttempts => 2, backoff => { initialMs => 20, maxMs => 100 } },
	destinations => {
		bill => { type => 'http', baseUrl => $bill->{url}, path => '/bill' },
		part => {
			type => 'http',
			baseUrl => $part->{url},
			path => '/part',
			onDead => 'holdKey',
			circuitBreaker => { failures => 100000 }
		},
		mq => { type => 'rabbitmq', url => $rmq->{url}, exchange => 'qb.fan' },
		kf => { type => 'kafka', brokers => $kafka->{bootstrap}, topic => 'fan.orders' },
	},
	routes => [
		{ topicPattern => 'orders.**', destinations => [qw(bill mq kf)] },
		{ topicPattern => 'partner.**', destinations => [qw(bill part)] },
	]);
qb_configure($node, qb_config_yaml(%config));

# ==== 1. one INSERT, three destinations of three kinds
my @keys = map { "o$_" } 1 .. 5;
my $per = 6;
$node->safe_psql('postgres',
	'INSERT INTO queuebox.outbox (topic, key, payload) SELECT \'orders.created\', \'o\' || k,'
	  . ' jsonb_build_object(\'k\', \'o\' || k, \'n\', n)'
	  . " FROM generate_series(1, $per) n, generate_series(1, 5) k ORDER BY n, k");
my $rows = 5 * $per;
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.created' AND state = 'sent'",
	3 * $rows, 'every row and its two copies are sent', timeout => 90);
is(qb_count($node, "topic = 'orders.created'"), 3 * $rows, 'the outbox holds each row and two copies, no more');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.created' AND origin = id"),
	$rows, 'each inserted row is marked the origin of its copies');
is($node->safe_psql('postgres',
	"SELECT count(DISTINCT (message_id, destination)) || '/' || count(DISTINCT message_id)"
	  . " FROM queuebox.outbox WHERE topic = 'orders.created'"),
	3 * $rows . "/$rows", 'one delivery per message and destination, the message id shared');

my ($seq, $n) = qb_sink_seq($bill, '/bill');
is(scalar(grep { $_ == 1 } values %$n), $rows, 'billing: each message once');
is(qb_seq_in_order($seq, \@keys, $per), 5, 'billing: every key in order');

my $mq = rmq_get($rmq, 'q.fan');
is(scalar(@$mq), $rows, 'RabbitMQ: one message per row');
my %mq_seq;
push @{ $mq_seq{ decode_json($_->{body})->{k} } }, decode_json($_->{body})->{n} for @$mq;
is(qb_seq_in_order(\%mq_seq, \@keys, $per), 5, 'RabbitMQ: every key in order');

my $kmsgs = qb_kafka_consume($kafka, 'fan.orders');
is(scalar(@$kmsgs), $rows, 'Kafka: one message per row');
my %k_seq;
push @{ $k_seq{ $_->{key} } }, decode_json($_->{value})->{n} for @$kmsgs;
is(qb_seq_in_order(\%k_seq, \@keys, $per), 5, 'Kafka: every key in order (one partition per key)');

my %ids = map { $_ => 1 } keys %$n;
is(scalar(grep { $ids{ $_->{message_id} // '' } } @$mq), $rows,
	'RabbitMQ carries the message ids billing saw');
is(scalar(grep { $ids{ $_->{headers}{'message-id'} // '' } } @$kmsgs), $rows,
	'Kafka carries the message ids billing saw');

# ==== 2. a failing destination holds nothing at another
my $sink_http = HTTP::Tiny->new(timeout => 10);
is($sink_http->post("$part->{url}/_sink/fault",
	{ content => '{"status": 500}', headers => { 'content-type' => 'application/json' } })->{status},
	200, 'the partner answers 500 from now on');
my $before = qb_outbox_count($node);
my @pkeys = map { "p$_" } 1 .. 3;
$node->safe_psql('postgres',
	'INSERT INTO queuebox.outbox (topic, key, payload, max_attempts)'
	  . ' SELECT \'partner.order\', \'p\' || k, jsonb_build_object(\'k\', \'p\' || k, \'n\', n), 1000'
	  . ' FROM generate_series(1, 5) n, generate_series(1, 3) k ORDER BY n, k');
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'partner.order' AND destination = 'bill' AND state = 'sent'",
	15, 'billing gets every row while the partner fails', timeout => 60);
is($node->safe_psql('postgres',
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'partner.order' AND destination = 'part' AND state = 'sent'"),
	'0', 'the partner has none yet');
($seq) = qb_sink_seq($bill, '/bill');
is(qb_seq_in_order($seq, \@pkeys, 5), 3, 'billing: the partner\'s keys in order there');
is($sink_http->post("$part->{url}/_sink/fault",
	{ content => '{}', headers => { 'content-type' => 'application/json' } })->{status},
	200, 'the partner answers again');
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'partner.order' AND state = 'sent'",
	30, 'the partner gets them all', timeout => 90);
($seq, $n) = qb_sink_seq($part, '/part');
is(qb_seq_in_order($seq, \@pkeys, 5), 3, 'partner: every key in order, each row once after its failures');
is(qb_outbox_count($node), $before + 30, 'rows counted after: 15 rows and 15 copies, none lost');

# ==== 3. a dead letter at one destination, requeued there only
$before = qb_outbox_count($node);
$node->safe_psql('postgres',
	"INSERT INTO queuebox.outbox (topic, key, payload) VALUES"
	  . q{ ('partner.dead', 'dk', '{"k": "dk", "n": 1, "_sink": {"fail": 2, "status": 500}}'),}
	  . q{ ('partner.dead', 'dk', '{"k": "dk", "n": 2}'),}
	  . q{ ('partner.dead', 'dk', '{"k": "dk", "n": 3}')});
# billing answers the first row 500 twice too (the script is the message's):
# the row goes dead at billing and at the partner, each with its own attempts
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'partner.dead' AND state = 'dead'",
	2, 'the first row is dead at both destinations (its own attempts at each)', timeout => 60);
my $bill_sent = sub {
	$node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.outbox WHERE topic = 'partner.dead' AND destination = 'bill' AND state = 'sent'");
};
qb_wait_for(sub { $bill_sent->() == 2 }, 'billing (onDead: release) sends the key\'s later rows', timeout => 60);
is($node->safe_psql('postgres',
	"SELECT string_agg(state || coalesce('/' || hold, ''), ',' ORDER BY coalesce(origin, id))"
	  . " FROM queuebox.outbox WHERE topic = 'partner.dead' AND destination = 'part'"),
	'dead/dead,pending/key,pending/key', 'at the partner the dead row holds its key (onDead: holdKey)');
my $dead_part = $node->safe_psql('postgres',
	"SELECT id FROM queuebox.outbox WHERE topic = 'partner.dead' AND destination = 'part' AND state = 'dead'");
my $bill_before = scalar(grep { $_->{path} eq '/bill' } @{ qb_sink_requests($bill) });
is($node->safe_psql('postgres', "SELECT queuebox.requeue_outbox($dead_part)"), 't',
	'the partner\'s dead copy is requeued');
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'partner.dead' AND destination = 'part' AND state = 'sent'",
	3, 'the requeued copy and the rows it held go to the partner', timeout => 60);
is(scalar(grep { $_->{path} eq '/bill' } @{ qb_sink_requests($bill) }), $bill_before,
	'billing saw no request from the requeue');
($seq) = qb_sink_seq($part, '/part');
is("@{ $seq->{dk} }", '1 2 3', 'partner: the key in order after the requeue');
is(qb_outbox_count($node), $before + 6, 'rows counted after: three rows and three copies');

# ==== 4. route_of, replay of one delivery
is($node->safe_psql('postgres', "SELECT queuebox.route_of('orders.created')"), 'bill, mq, kf',
	'route_of names every destination of a fan-out route');
my $copy = $node->safe_psql('postgres',
	"SELECT id FROM queuebox.outbox WHERE topic = 'partner.order' AND destination = 'part' LIMIT 1");
$before = qb_outbox_count($node);
my $replayed = $node->safe_psql('postgres', "SELECT queuebox.replay_outbox($copy)");
qb_wait_query($node, "SELECT state || '/' || destination FROM queuebox.outbox WHERE id = $replayed",
	'sent/part', 'a replayed copy goes to its own destination', timeout => 60);
is(qb_outbox_count($node), $before + 1, 'the replay is one row, no copies');

# ==== 5. the validator
my %bad = (
	'both destination and destinations' => [
		{ topicPattern => 'x.**', destination => 'bill', destinations => [qw(bill part)] },
		qr/not both/],
	'a list of one' => [ { topicPattern => 'x.**', destinations => ['bill'] }, qr/two or more/ ],
	'a destination twice' => [ { topicPattern => 'x.**', destinations => [qw(bill bill)] }, qr/listed twice/ ],
	'an unknown one' => [ { topicPattern => 'x.**', destinations => [qw(bill nope)] },
		qr/routes\[0\]\.destinations\[1\].*unknown destination/ ],);
for my $what (sort keys %bad)
{
	my ($route, $re) = @{ $bad{$what} };
	my ($ret, $out, $err) = $node->psql('postgres',
		'SELECT queuebox.validate(' . qb_sql_quote(qb_config_yaml(%config, routes => [$route])) . ')');
	like($err, $re, "the validator explains $what");
}
is($node->safe_psql('postgres', "SELECT queuebox.route_of('orders.created')"), 'bill, mq, kf',
	'a refused document changes nothing');

qb_kafka_stop($kafka);
$node->stop;
rmq_stop($rmq);
done_testing();
