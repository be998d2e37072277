# 014_kafka_source.pl
#   The Kafka source against librdkafka's mock cluster (a helper process on
#   loopback TCP): each message becomes one inbox row keyed by its position
#   (topic/partition/offset) with its headers and payload, in partition
#   order; a repeated message-id (idempotencyKeyHeader) is stored once; a
#   body that is not JSON is a dead row and its offset is committed all the
#   same; offsets are committed only after the rows are, so a store that
#   fails or a worker killed mid-store loses nothing and stores nothing
#   twice; the broker (leader and coordinator) down mid-stream, or on three
#   brokers the coordinator alone, then back: each message produced before,
#   during (coordinator case) and after is stored once and the group
#   commits to the end, with no operator action; a new group reads
#   everything again and adds no row.
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

my $kafka = qb_kafka_start(topics => [ 'events:3', 'dedup:1' ]);
# three brokers: the group's coordinator (3) is not a partition leader (1, 2)
my $kafka3 = qb_kafka_start(brokers => 3, topics => ['flow:2']);
is(qb_kafka_cmd($kafka3, $_), "ok\n", "3 brokers: $_")
  for 'coordinator queuebox-kc 3', 'leader flow 0 1', 'leader flow 1 2';
# PostgreSQL::Test::Cluster turns restart_after_crash off; the kill -9 needs it
my $node = qb_node('ksrc', conf => "restart_after_crash = on\n");

# a short group session, so a consumer that died is replaced quickly; the
# reconnect backoff capped at 1 s (librdkafka's default grows to 10 s), so a
# broker that comes back is found within a second, not up to 10 s later
my $config = qq{ "session.timeout.ms": "6000", "heartbeat.interval.ms": "500", "reconnect.backoff.max.ms": "1000" };
sub configure
{
	my ($group) = @_;
	my $g = $group ? "\n    group: $group" : '';
	qb_configure($node, <<"EOY");
http:
  storeTimeoutMs: 60000      # a store waits out the test's locks
sources:
  ks:
    type: kafka
    brokers: "$kafka->{bootstrap}"
    topics: [events]$g
    consumption: pull
    eventTypePath: \$.type
    batchSize: 5
    config: { $config }
  kd:
    type: kafka
    brokers: "$kafka->{bootstrap}"
    topics: [dedup]
    idempotencyKeyHeader: message-id
    consumption: pull
    config: { $config }
  kc:
    type: kafka
    brokers: "$kafka3->{bootstrap}"
    topics: [flow]
    consumption: pull
    batchSize: 5
    config: { $config }
EOY
}

sub rows
{
	my ($where) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.inbox WHERE $where");
}

sub committed { return join ',', @{ qb_kafka_committed($kafka, @_) }; }

# how many messages each partition of a topic holds, from the produce
# answers: topic => [ end of partition 0, 1, ... ]; and their positions
my (%high, %positions);
sub produce
{
	my ($k, $topic, @msgs) = @_;
	for my $m (@msgs)
	{
		my $pos = qb_kafka_produce($k, topic => $topic, %$m);
		my (undef, $p, $o) = split m{/}, $pos;
		$high{$topic}[$p] = $o + 1 if ($high{$topic}[$p] // 0) < $o + 1;
		push @{ $positions{$topic} }, $pos;
	}
	return;
}
sub produce_events { return produce($kafka, 'events', @_); }
# high_marks([$topic, $partitions]): as qb_kafka_committed answers them
sub high_marks
{
	my ($topic, $n) = @_ ? @_ : ('events', 3);
	return join ',', map { $high{$topic}[$_] // 0 } 0 .. $n - 1;
}
my $positions = $positions{events} = [];

configure();
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'3', 'a consumer worker runs for each kafka source', timeout => 30);

# ---- N messages: one pending row each, keyed by position, in partition order
my ($nkeys, $per_key) = (4, 3);
my @batch;
for my $s (0 .. $per_key - 1)
{
	push @batch, map {
		{
			key => "k$_",
			value => encode_json({ type => 'order.placed', k => "k$_", s => $s }),
			headers => { 'x-trace' => "t-k$_-$s" }
		}
	} 1 .. $nkeys;
}
produce_events(@batch);
my $n = $nkeys * $per_key;
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ks'",
	$n, "the $n messages are stored", timeout => 90);
is(rows("source = 'ks' AND state = 'pending'"), $n, 'every row is pending (pull)');
my %by_key = map { my @f = split /\|/; ($f[0] => \@f) } split /\n/, $node->safe_psql('postgres',
	q{SELECT idempotency_key, payload->>'k', payload->>'s', headers->>'x-trace', event_type
	  FROM queuebox.inbox WHERE source = 'ks'});
is_deeply([ sort keys %by_key ], [ sort @$positions ],
	'the idempotency keys are the positions topic/partition/offset');
my $good = grep {
	my $r = $by_key{$_};
	$r && $r->[3] eq "t-$r->[1]-$r->[2]" && $r->[4] eq 'order.placed'
} @$positions;
is($good, $n, 'each row has its payload, its Kafka headers and the event type');

# per partition, the order of the rows (created_at, id) is the offset order,
# so each key's messages are stored in the order they were sent
my $order = $node->safe_psql('postgres',
	q{SELECT idempotency_key, payload->>'k', payload->>'s' FROM queuebox.inbox
	  WHERE source = 'ks' ORDER BY created_at, id});
my (%last_off, %last_s, $in_order);
$in_order = 1;
for (split /\n/, $order)
{
	my ($pos, $k, $s) = split /\|/;
	my (undef, $p, $o) = split m{/}, $pos;
	$in_order = 0 if defined $last_off{$p} && $o <= $last_off{$p};
	$in_order = 0 if defined $last_s{$k} && $s <= $last_s{$k};
	($last_off{$p}, $last_s{$k}) = ($o, $s);
}
ok($in_order, 'rows are stored in partition order, so each key keeps its order');
qb_wait_for(sub { committed('queuebox-ks', 'events') eq high_marks() },
	'the group committed every partition up to its end, after the rows');

# ---- a body that is not JSON: a dead row, and its offset is committed
produce_events({ value => 'not json {', partition => 0 });
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ks' AND state = 'dead'",
	'1', 'the non-JSON message is stored dead');
like($node->safe_psql('postgres',
	"SELECT last_error FROM queuebox.inbox WHERE source = 'ks' AND state = 'dead'"),
	qr/not JSON/, 'its last_error says the body is not JSON');
is($node->safe_psql('postgres',
	"SELECT payload #>> '{}' FROM queuebox.inbox WHERE source = 'ks' AND state = 'dead'"),
	'not json {', 'the body is kept as a JSON string');
qb_wait_for(sub { committed('queuebox-ks', 'events') eq high_marks() },
	'its offset is committed like any other');

# ---- the same message-id twice (idempotencyKeyHeader): stored once
for my $id ('m-1', 'm-1', 'm-2')
{
	qb_kafka_produce($kafka, topic => 'dedup', value => encode_json({ id => $id }),
		headers => { 'message-id' => $id });
}
qb_wait_for(sub { committed('queuebox-kd', 'dedup') eq '3' },
	'the three dedup messages are committed');
is($node->safe_psql('postgres',
	"SELECT string_agg(idempotency_key, ',' ORDER BY idempotency_key) FROM queuebox.inbox WHERE source = 'kd'"),
	'm-1,m-2', 'the repeated message-id is stored once');

# ---- the store fails: nothing is acknowledged, nothing is lost
$node->safe_psql('postgres', q{
	CREATE SEQUENCE refused;
	CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN PERFORM nextval('refused'); RAISE EXCEPTION 'the test refuses inbox rows'; END $$;
	CREATE TRIGGER refuse BEFORE INSERT ON queuebox.inbox FOR EACH ROW EXECUTE FUNCTION refuse();
});
my $before = rows("source = 'ks'");
my $marks = committed('queuebox-ks', 'events');
produce_events(map { { key => "f$_", value => encode_json({ k => "f$_", s => 0 }) } } 1 .. 6);
qb_wait_query($node, q{SELECT last_value >= 3 AND is_called FROM refused},
	't', 'the consumer tried to store the messages three times', timeout => 60);
is(rows("source = 'ks'"), $before, 'no row while the store fails');
is(committed('queuebox-ks', 'events'), $marks, 'and no offset was committed');
$node->safe_psql('postgres', 'DROP TRIGGER refuse ON queuebox.inbox');
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ks'",
	$before + 6, 'once the store works the six messages are stored, once each', timeout => 60);
qb_wait_for(sub { committed('queuebox-ks', 'events') eq high_marks() },
	'and then committed');

# ---- kill -9 the worker while its store waits: redelivered, not lost
$before = rows("source = 'ks'");
$marks = committed('queuebox-ks', 'events');
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN EXCLUSIVE MODE;');
produce_events(map { { key => "c$_", value => encode_json({ k => "c$_", s => 0 }) } } 1 .. 6);
my $pid = qb_wait_for(sub { (qb_consumers_on_lock($node))[0] },
	'the ks consumer waits on the locked inbox', timeout => 60);
is(committed('queuebox-ks', 'events'), $marks, 'nothing committed while the store waits');
ok(kill('KILL', $pid), "kill -9 consumer worker $pid");
eval { $locker->quit; };
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ks'",
	$before + 6, 'after the crash restart the six messages are stored, once each', timeout => 120);
qb_wait_for(sub { committed('queuebox-ks', 'events') eq high_marks() },
	'and committed', timeout => 90);

# ---- the broker goes down mid-stream and comes back: no operator action
# down_mid_batch($k, $broker, $source, $tag, sub { produce }): with the
# inbox locked, produce; once a batch waits on the lock take the broker
# down and let the lock go: the consumer stores the batch with the broker
# gone and cannot commit its offsets.
sub down_mid_batch
{
	my ($k, $broker, $source, $tag, $produce) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $lock = $node->background_psql('postgres');
	$lock->query_safe('BEGIN; LOCK TABLE queuebox.inbox IN EXCLUSIVE MODE;');
	$produce->();
	qb_wait_for(sub { qb_consumers_on_lock($node) }, "$tag: a batch waits on the locked inbox");
	my $off = -s $node->logfile;
	is(qb_kafka_cmd($k, "down $broker"), "ok\n", "$tag: broker $broker goes down mid-stream");
	$lock->query_safe('ROLLBACK');
	$lock->quit;
	my $re = qr/source "$source": stored \d+ messages? but could not acknowledge/;
	like(qb_wait_log($node, $re, $off, timeout => 90), $re,
		"$tag: the batch is stored with broker $broker down, and its offsets cannot be committed");
	return;
}

# The one broker leads every partition and coordinates the group.  Produced
# before the down and after the up (a produce waits for the broker); the
# topic-wide check below then finds each message stored once.
$before = rows("source = 'ks'");
down_mid_batch($kafka, 1, 'ks', 'down', sub {
	produce_events(map { { key => "d$_", value => encode_json({ k => "d$_", s => 0 }) } } 1 .. 30);
});
cmp_ok(rows("source = 'ks'"), '>', $before, 'down: rows were stored meanwhile');
is(qb_kafka_cmd($kafka, 'up 1'), "ok\n", 'down: the broker comes back');
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ks'",
	$before + 30, 'down: the 30 produced before the down are stored, once each', timeout => 120);
qb_wait_for(sub { committed('queuebox-ks', 'events') eq high_marks() },
	'down: with no new message, the group commits every partition to its end', timeout => 90);
produce_events(map { { key => "u$_", value => encode_json({ k => "u$_", s => 0 }) } } 1 .. 30);
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ks'",
	$before + 60, 'down: the 30 produced after the up are stored, once each', timeout => 120);
qb_wait_for(sub { committed('queuebox-ks', 'events') eq high_marks() },
	'down: and committed to the end', timeout => 90);

# ---- three brokers: the coordinator goes down, the leaders stay up
# The commit after the stored batch waits for a coordinator (up to
# session.timeout.ms) and fails; producing still works meanwhile.
sub flow_msgs { my ($tag) = @_; return map { { key => "$tag$_", value => encode_json({ k => "$tag$_" }) } } 1 .. 10; }
sub flow_committed { return join(',', @{ qb_kafka_committed($kafka3, 'queuebox-kc', 'flow') }) eq high_marks('flow', 2); }
down_mid_batch($kafka3, 3, 'kc', 'coordinator', sub { produce($kafka3, 'flow', flow_msgs('b')) });
produce($kafka3, 'flow', flow_msgs('m'));    # dies unless the leaders take them
is(qb_kafka_cmd($kafka3, 'up 3'), "ok\n", 'coordinator: broker 3 comes back');
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'kc'",
	'20', 'coordinator: the 20 are stored, once each', timeout => 120);
qb_wait_for(\&flow_committed,
	'coordinator: with no new message, the group commits both partitions to their end', timeout => 90);
produce($kafka3, 'flow', flow_msgs('a'));
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'kc'",
	'30', 'coordinator: the 10 produced after the up are stored', timeout => 120);
qb_wait_for(\&flow_committed,
	'coordinator: and committed to the end', timeout => 90);
my $flow = qb_kafka_consume($kafka3, 'flow');
is(scalar(@$flow), 30, 'coordinator: flow holds the 30 messages produced');
is_deeply(
	[ sort split /\n/, $node->safe_psql('postgres', q{SELECT idempotency_key FROM queuebox.inbox WHERE source = 'kc'}) ],
	[ sort map { "flow/$_->{partition}/$_->{offset}" } @$flow ],
	'coordinator: one row per message of flow, no gap, no double');

# ---- no gaps, no doubles: one row per message of the topic
my $all = qb_kafka_consume($kafka, 'events');
is(scalar(@$all), scalar(@$positions), 'the topic holds every message produced');
is($node->safe_psql('postgres', q{SELECT count(DISTINCT idempotency_key) FROM queuebox.inbox WHERE source = 'ks'}),
	scalar(@$positions), 'one row per message');
is_deeply(
	[ sort split /\n/, $node->safe_psql('postgres', q{SELECT idempotency_key FROM queuebox.inbox WHERE source = 'ks'}) ],
	[ sort map { "events/$_->{partition}/$_->{offset}" } @$all ],
	'and the rows are exactly the topic\'s positions');

# ---- a new group reads the topic again: every message is a duplicate
$before = rows("source = 'ks'");
configure('ks-again');
qb_wait_for(sub { committed('ks-again', 'events') eq high_marks() },
	'the new group reads every message and commits', timeout => 90);
is(rows("source = 'ks'"), $before, 'the redelivered messages are duplicates: no new row');

$node->stop;
qb_kafka_stop($kafka);
qb_kafka_stop($kafka3);
done_testing();
