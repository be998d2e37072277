# 014_kafka_source.pl
#   The Kafka source against librdkafka's mock cluster (a helper process on
#   loopback TCP): each message becomes one inbox row keyed by its position
#   (topic/partition/offset) with its headers and payload, in partition
#   order; a repeated message-id (idempotencyKeyHeader) is stored once; a
#   body that is not JSON is a dead row and its offset is committed all the
#   same; offsets are committed only after the rows are, so a store that
#   fails or a worker killed mid-store loses nothing and stores nothing
#   twice; a new group reads everything again and adds no row.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use QueueBoxTest;
use QueueBoxKafka;

my $kafka = qb_kafka_start(topics => [ 'events:3', 'dedup:1' ]);
# PostgreSQL::Test::Cluster turns restart_after_crash off; the kill -9 needs it
my $node = qb_node('ksrc', conf => "restart_after_crash = on\n");

# a short group session, so a consumer that died is replaced quickly
my $config = qq{ "session.timeout.ms": "6000", "heartbeat.interval.ms": "500" };
sub configure
{
	my ($group) = @_;
	my $g = $group ? "\n    group: $group" : '';
	qb_configure($node, <<"EOY");
http:
  storeTimeoutMs: 1000
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
EOY
}

sub rows
{
	my ($where) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.inbox WHERE $where");
}

sub committed { return join ',', @{ qb_kafka_committed($kafka, @_) }; }

# how many messages each partition of events holds, from the produce answers
my %high;
my @positions;
sub produce_events
{
	my (@msgs) = @_;
	for my $m (@msgs)
	{
		my $pos = qb_kafka_produce($kafka, topic => 'events', %$m);
		my (undef, $p, $o) = split m{/}, $pos;
		$high{$p} = $o + 1 if ($high{$p} // 0) < $o + 1;
		push @positions, $pos;
	}
	return;
}
sub high_marks { return join ',', map { $high{$_} // 0 } 0 .. 2; }

configure();
qb_wait_query($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox consumer'",
	'2', 'a consumer worker runs for each kafka source', timeout => 30);

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
is_deeply([ sort keys %by_key ], [ sort @positions ],
	'the idempotency keys are the positions topic/partition/offset');
my $good = grep {
	my $r = $by_key{$_};
	$r && $r->[3] eq "t-$r->[1]-$r->[2]" && $r->[4] eq 'order.placed'
} @positions;
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
my $pid = qb_wait_for(sub {
	$node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity
		WHERE backend_type = 'queuebox consumer' AND wait_event_type = 'Lock'});
}, 'the ks consumer waits on the locked inbox', timeout => 60);
is(committed('queuebox-ks', 'events'), $marks, 'nothing committed while the store waits');
ok(kill('KILL', $pid), "kill -9 consumer worker $pid");
eval { $locker->quit; };
qb_wait_query($node, "SELECT count(*) FROM queuebox.inbox WHERE source = 'ks'",
	$before + 6, 'after the crash restart the six messages are stored, once each', timeout => 120);
qb_wait_for(sub { committed('queuebox-ks', 'events') eq high_marks() },
	'and committed', timeout => 90);

# ---- no gaps, no doubles: one row per message of the topic
my $all = qb_kafka_consume($kafka, 'events');
is(scalar(@$all), scalar(@positions), 'the topic holds every message produced');
is($node->safe_psql('postgres', q{SELECT count(DISTINCT idempotency_key) FROM queuebox.inbox WHERE source = 'ks'}),
	scalar(@positions), 'one row per message');
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
done_testing();
