# 011_kafka.pl
#   The Kafka destination against librdkafka's mock cluster (a helper
#   process on loopback TCP): each row becomes one message with the row's
#   key, payload and headers plus its message id, on the templated topic;
#   a key's messages stay in order in their partition while deliveries fail
#   and are retried; an unknown topic is dead at once with a last_error that
#   says to create it; a broker down mid-stream loses nothing; a fatal
#   producer error fails the row in flight and a new producer sends it; the
#   header rule on Kafka (a null, a number, the message id's names, an empty
#   name's row dead).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxKafka;

my $kafka = qb_kafka_start(
	topics => [ 'qb.orders:1', 'ordered:4', 'stream:2', 'fatal:1' ],
	missing => ['ghost']);
my $node = qb_node('kafka');

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

qb_configure(
	$node,
	qb_config_yaml(
		outbox => { maxAttempts => 50 },
		destinations => {
			# the row topic "orders" goes to the Kafka topic "qb.orders"
			kd => {
				type => 'kafka',
				brokers => $kafka->{bootstrap},
				topic => 'qb.{{ topic }}',
				config => { 'linger.ms' => '5' }
			},
			# short message timeout: a delivery that cannot finish fails soon
			# and the row is retried by QueueBox; this test is about those
			# retries, so the circuit breaker (TAP 021) stays out of the way
			ko => {
				type => 'kafka',
				brokers => $kafka->{bootstrap},
				config => { 'message.timeout.ms' => '1500', 'linger.ms' => '5' },
				circuitBreaker => { failures => 100000 }
			},
			# gapless: an out-of-order sequence is fatal for the producer
			kf => {
				type => 'kafka',
				brokers => $kafka->{bootstrap},
				config => { 'enable.gapless.guarantee' => 'true' }
			},
			kg => {
				type => 'kafka',
				brokers => $kafka->{bootstrap},
				config => { 'topic.metadata.propagation.max.ms' => '500' }
			},
		},
		routes => [
			{ topicPattern => 'orders', destination => 'kd' },
			{ topicPattern => 'ghost', destination => 'kg' },
			{ topicPattern => 'fatal', destination => 'kf' },
			{ topicPattern => '**', destination => 'ko' },
		]));

# qb_configure refuses what librdkafka refuses, with the key path
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT queuebox.configure($$
destinations:
  k: { type: kafka, brokers: "127.0.0.1:1", config: { "enable.idempotence": "false" } }
routes:
  - { topicPattern: "**", destination: k }
$$)});
like($err, qr/destinations\.k\.config\["enable\.idempotence"\]: QueueBox sets enable\.idempotence itself to true/,
	'configure refuses enable.idempotence=false and names the key');

# ---- delivery: key, value, headers, templated topic
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, headers) VALUES
	('orders', 'c-1', '{"n": 1, "text": "first"}', '{"x-trace": "t-1", "x-count": 5}'),
	('orders', 'c-2', '{"n": 2}', '{}'),
	('orders', NULL, '{"n": 3}', '{}');
});
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders' AND state = 'sent'",
	'3', 'the three orders rows are sent');
my %row_of = map { my @f = split /\|/; ($f[0] => { key => $f[1], payload => $f[2] }) }
  split /\n/, $node->safe_psql('postgres',
	"SELECT message_id, coalesce(key, '<null>'), payload FROM queuebox.outbox WHERE topic = 'orders'");
my $msgs = qb_kafka_consume($kafka, 'qb.orders');
is(scalar(@$msgs), 3, 'three messages on qb.orders (the topic template)');
my $good = 0;
for my $m (@$msgs)
{
	my $r = $row_of{ $m->{headers}{'message-id'} // '' } or next;
	$good++
	  if ($m->{key} // '<null>') eq $r->{key}
	  && JSON::PP->new->canonical->encode(decode_json($m->{value}))
	  eq JSON::PP->new->canonical->encode(decode_json($r->{payload}));
}
is($good, 3, 'each message has its row\'s message-id header, key (or none) and payload as value');
my ($first) = grep { ($_->{key} // '') eq 'c-1' } @$msgs;
is_deeply(
	[ $first->{headers}{'x-trace'}, $first->{headers}{'x-count'} ],
	[ 't-1', '5' ],
	'the row\'s headers go along (a number as its JSON text)');

# ---- the header rule (docs/delivery.md, "Row headers"): a null header is
# left out, a number goes as its JSON text, a row header named like
# QueueBox's message id (any of its names) is left out, so the message
# carries one message-id, QueueBox's; an empty name makes the row dead at
# once, nothing produced; rows counted before and after
my %rule_before = map { $_ => qb_count($node, "state = '$_'") } qw(sent dead);
my $rule_total = qb_outbox_count($node);
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, headers) VALUES
	('orders', 'rule', '{"case": "rule"}',
	 '{"x-null": null, "x-count": 5, "message-id": "forged", "X-Message-Id": "forged"}'),
	('orders', 'rule-bad', '{"case": "bad"}', '{"x-fine": "ok", "": "no name"}')});
qb_wait_query($node, q{
		SELECT string_agg(key || ':' || state || ':' || attempt, ',' ORDER BY id)
		FROM queuebox.outbox WHERE key IN ('rule', 'rule-bad')},
	'rule:sent:1,rule-bad:dead:0',
	'header rule: the row is sent; the row with an empty header name is dead, no attempt counted');
my ($rule_mid, $rule_error) = split /\|/, $node->safe_psql('postgres', q{
	SELECT string_agg(coalesce(last_error, message_id::text), '|' ORDER BY id)
	FROM queuebox.outbox WHERE key IN ('rule', 'rule-bad')}), 2;
my $orders = qb_kafka_consume($kafka, 'qb.orders');
my @rule = grep { ($_->{key} // '') eq 'rule' } @$orders;
is(scalar @rule, 1, 'header rule: one message');
is_deeply($rule[0]{header_list}, [ [ 'x-count', '5' ], [ 'message-id', $rule_mid ] ],
	'header rule: the null and the row\'s message id names are left out, the number is its JSON text, message-id is QueueBox\'s alone');
like($rule_error,
	qr/^row header "" has an empty name, so the row cannot be sent on Kafka; remove or fix it in the row's headers, then requeue the row/,
	'header rule: the dead row\'s last_error names the header, the transport and what to do');
is(scalar(grep { ($_->{key} // '') eq 'rule-bad' } @$orders), 0, 'header rule: nothing produced for the dead row');
is(qb_count($node, "state = 'sent'"), $rule_before{sent} + 1, 'header rule: rows counted after: one more sent');
is(qb_count($node, "state = 'dead'"), $rule_before{dead} + 1, 'header rule: rows counted after: one more dead');
is(qb_outbox_count($node), $rule_total + 2, 'header rule: rows counted after: two more in all');

# ---- per-key order while deliveries fail and are retried
my $before = qb_outbox_count($node);
is(qb_kafka_cmd($kafka, 'errors 300 6'), "ok\n",
	'the next 300 produce requests fail with NOT_LEADER_FOR_PARTITION (retriable)');
my ($nkeys, $per_key) = (8, 5);
for my $s (0 .. $per_key - 1)
{
	$node->safe_psql('postgres', join '',
		"INSERT INTO queuebox.outbox (topic, key, payload) VALUES ",
		join(',', map { "('ordered', 'k$_', '{\"k\": $_, \"s\": $s}')" } 1 .. $nkeys));
}
is(qb_outbox_count($node), $before + $nkeys * $per_key, 'rows counted after the insert');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'ordered' AND state = 'sent'",
	$nkeys * $per_key, 'every ordered row is sent in the end', timeout => 180);
cmp_ok($node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.outbox WHERE topic = 'ordered' AND attempt > 1"),
	'>', 0, 'some deliveries failed and were retried');
is(qb_outbox_count($node), $before + $nkeys * $per_key, 'no row appeared or vanished');
my %ids = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', "SELECT message_id FROM queuebox.outbox WHERE topic = 'ordered'");
my (%seen, %seqs, %parts);
for my $m (@{ qb_kafka_consume($kafka, 'ordered') })
{
	my $mid = $m->{headers}{'message-id'} // '';
	next if $seen{$mid}++;    # a duplicate carries the same message id
	my $v = decode_json($m->{value});
	push @{ $seqs{ $m->{key} } }, $v->{s};
	$parts{ $m->{key} }{ $m->{partition} } = 1;
}
is(scalar(grep { $ids{$_} } keys %seen), $nkeys * $per_key, 'every ordered row reached the topic');
is(scalar(grep { !$ids{$_} } keys %seen), 0, 'no message without a row');
is_deeply(\%seqs, { map { ("k$_" => [ 0 .. $per_key - 1 ]) } 1 .. $nkeys },
	'each key\'s messages are in insert order in its partition');
is(scalar(grep { keys %{ $parts{$_} } != 1 } keys %parts), 0, 'each key stays in one partition');

# ---- an unknown topic is dead at once, with what to do
$before = qb_outbox_count($node);
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('ghost', 'g', '{"n": 1}')});
qb_wait_query($node, "SELECT state || ':' || attempt FROM queuebox.outbox WHERE topic = 'ghost'",
	'dead:1', 'the row for a topic the cluster does not have is dead after one attempt');
like($node->safe_psql('postgres', "SELECT last_error FROM queuebox.outbox WHERE topic = 'ghost'"),
	qr/topic "ghost" does not exist on the Kafka cluster.*create it/,
	'last_error says the topic does not exist and to create it');
is(qb_outbox_count($node), $before + 1, 'rows counted after: one more, dead');

# ---- a broker down mid-stream, then up: nothing lost
$before = qb_outbox_count($node);
is(qb_kafka_cmd($kafka, 'down 1'), "ok\n", 'the broker goes down');
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload)
	SELECT 'stream', 's' || (i % 5), jsonb_build_object('i', i) FROM generate_series(1, 20) i});
is(qb_outbox_count($node), $before + 20, 'rows counted after the insert');
qb_wait_query($node,
	"SELECT count(*) > 0 FROM queuebox.outbox WHERE topic = 'stream' AND attempt >= 1 AND state <> 'sent' AND last_error IS NOT NULL",
	't', 'a delivery fails while the broker is down (the row waits for a retry)');
is(qb_kafka_cmd($kafka, 'up 1'), "ok\n", 'the broker comes back');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'stream' AND state = 'sent'",
	'20', 'every stream row is sent once the broker is back', timeout => 120);
is(qb_outbox_count($node), $before + 20, 'no row appeared or vanished');
%ids = map { $_ => 1 } split /\n/,
  $node->safe_psql('postgres', "SELECT message_id FROM queuebox.outbox WHERE topic = 'stream'");
my $stream = qb_kafka_consume($kafka, 'stream');
my %got = map { (($_->{headers}{'message-id'} // '') => 1) } @$stream;
is(scalar(grep { $ids{$_} } keys %got), 20, 'rows sent = distinct messages consumed (20)');
is(scalar(grep { !$ids{$_} } keys %got), 0, 'every message is one of the rows: a duplicate has the same message id');

# ---- a fatal producer error fails the row in flight; a new producer sends it
$before = qb_outbox_count($node);
is(qb_kafka_cmd($kafka, 'errors 1 45'), "ok\n",
	'the next produce request fails with OUT_OF_ORDER_SEQUENCE_NUMBER (fatal with gapless)');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('fatal', 'f', '{"n": 1}')});
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'fatal'",
	'sent', 'the row is sent in the end');
like($node->safe_psql('postgres', "SELECT attempt || ' ' || coalesce(last_error, '') FROM queuebox.outbox WHERE topic = 'fatal'"),
	qr/^2 .*the producer hit a fatal error and is made anew/,
	'its first attempt failed with the fatal error, the second went through a new producer');
is(scalar(@{ qb_kafka_consume($kafka, 'fatal') }), 1, 'one message on the topic');
is(qb_outbox_count($node), $before + 1, 'rows counted after: one more');

qb_kafka_stop($kafka);
$node->stop;
done_testing();
