# 025_upgrade_0_2_0.pl
#   ALTER EXTENSION queuebox UPDATE from 0.2.0 with rows in every place of
#   the 0.2.0 claim: new (unrouted intake), ready, routed (due and not
#   due), parked behind a key, held for a destination, processing under an
#   expired lease, sent and dead, and a breaker row.  While the schema is
#   0.2.0 the workers refuse to claim; after the update every open row is
#   delivered once, per key in id order, the final rows, the inbox and the
#   breaker row of a destination outside the configuration are unchanged,
#   rows inserted after it are routed at insert (hold 'intake'), and the
#   schema is the fresh install's.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink = qb_sink_start(name => 'upgrade020');

my $node = qb_node('upgrade020', create_extension => 0, conf => "queuebox.relay_worker = off\n");
my $logstart = -s $node->logfile;
$node->safe_psql('postgres', "CREATE EXTENSION queuebox VERSION '0.2.0'");
is(qb_version($node), '0.2.0', 'the extension is installed at version 0.2.0');

# ---- rows in every 0.2.0 place, as the 0.2.0 claim and settle left them
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, state, attempt, destination) VALUES
		('t.old', 'k1', '{"final": "sent"}', 'sent', 1, 'web'),
		('t.old', 'k2', '{"final": "dead"}', 'dead', 10, 'web');
	-- key ka: processing under an expired lease (the sink holds its
	-- delivery 3 s, so the key is still open when a row of it is inserted
	-- after the update, below), then a row parked behind it, then a new row
	INSERT INTO queuebox.outbox (topic, key, payload, state, claim_token, lease_until, destination)
		VALUES ('t.e', 'ka', '{"ka": 0, "_sink": {"delay_ms": 3000}}', 'processing', gen_random_uuid(),
				now() - interval '1 minute', 'web');
	INSERT INTO queuebox.outbox (topic, key, payload, hold) VALUES ('t.e', 'ka', '{"ka": 1}', 'key');
	INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('t.e', 'ka', '{"ka": 2}');
	-- key kb: routed and retried (due now), then routed not due yet, then
	-- parked (routed), then new
	INSERT INTO queuebox.outbox (topic, key, payload, attempt, destination, scheduled_at, last_error) VALUES
		('t.e', 'kb', '{"kb": 0}', 2, 'web', now() - interval '1 second', 'attempt 2 of 10 failed: HTTP 503');
	INSERT INTO queuebox.outbox (topic, key, payload, destination, hold) VALUES
		('t.e', 'kb', '{"kb": 1}', 'web', 'key');
	INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('t.e', 'kb', '{"kb": 2}');
	-- key kc: held for its destination (an open circuit in 0.2.0), ready, new
	INSERT INTO queuebox.outbox (topic, key, payload, destination, hold) VALUES
		('t.e', 'kc', '{"kc": 0}', 'web', 'destination');
	INSERT INTO queuebox.outbox (topic, key, payload, hold) VALUES
		('t.e', 'kc', '{"kc": 1}', 'ready'), ('t.e', 'kc', '{"kc": 2}', NULL);
	-- unkeyed: new, ready, routed due in two seconds
	INSERT INTO queuebox.outbox (topic, payload, hold) VALUES ('t.e', '{"u": 0}', NULL), ('t.e', '{"u": 1}', 'ready');
	INSERT INTO queuebox.outbox (topic, payload, destination, scheduled_at) VALUES
		('t.e', '{"u": 2}', 'web', now() + interval '2 seconds');

	-- a breaker row of a destination the configuration does not name
	INSERT INTO queuebox.destination_state (destination, state, failures, opened_at, last_error)
		VALUES ('gone', 'disabled', 3, now(), 'HTTP 410');

	INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption, state, hold) VALUES
		('orders', 'pull-pending', 'b', '{"i": 1}', 'pull', 'pending', NULL),
		('orders', 'pull-parked', 'b', '{"i": 2}', 'pull', 'pending', 'aggregate'),
		('orders', 'pull-processed', 'd', '{"i": 3}', 'pull', 'processed', NULL);
});
my $after_fill = -s $node->logfile;

my $final_sql = q{SELECT string_agg(concat_ws('|', id, message_id, topic, key, payload, headers, state,
		attempt, max_attempts, scheduled_at, created_at, claim_token, lease_until, last_error, destination, hold),
		E'\n' ORDER BY id) FROM queuebox.outbox WHERE topic = 't.old'};
my $inbox_sql = q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, aggregate_id, payload,
		consumption, state, attempt, scheduled_at, created_at, claim_token, lease_until, last_error, hold),
		E'\n' ORDER BY id) FROM queuebox.inbox};
my $gone_sql = q{SELECT concat_ws('|', state, failures, opened_at, last_error, changed_at)
		FROM queuebox.destination_state WHERE destination = 'gone'};
my ($final_before, $inbox_before, $gone_before) =
  map { $node->safe_psql('postgres', $_) } ($final_sql, $inbox_sql, $gone_sql);
my %open_before = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	q{SELECT message_id || '|' || id FROM queuebox.outbox WHERE state IN ('pending', 'processing')});
is(scalar(keys %open_before), 12, '12 rows are open before the upgrade');

# ---- the current workers do not claim from a 0.2.0 schema, and say why
like(qb_wait_log($node, qr/queuebox outbox \d: .*run ALTER EXTENSION queuebox UPDATE/, $after_fill, timeout => 60),
	qr/the queuebox schema in this database is version 0\.2\.0 and the library is version \Q$QB_LATEST\E; run ALTER EXTENSION queuebox UPDATE/,
	'the workers refuse the 0.2.0 schema and say to run the update');
is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE state = 'processing'"),
	'1', 'nothing was claimed under the 0.2.0 schema');

# ---- the upgrade
$node->safe_psql('postgres', 'ALTER EXTENSION queuebox UPDATE');
is(qb_version($node), $QB_LATEST, "extversion is $QB_LATEST after the update");
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM queuebox.outbox WHERE hold = 'intake'}),
	'0', 'the update moves no row: rows pending at the update keep their 0.2.0 places');

qb_configure(
	$node,
	qb_config_yaml(
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/events' } },
		routes => [ { topicPattern => 't.**', destination => 'web' } ]));

# rows inserted now are routed at insert, in the transaction that inserts
# them; the keyed one goes in parked behind its key's rows pending since
# 0.2.0 (claim.md, "Parked at insert")
is($node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('t.new', 'ka', '{"ka": 3}'), ('t.new', NULL, '{"u": 3}')
	RETURNING destination || ':' || hold}),
	"web:key\nweb:intake", 'rows inserted after the update are routed at insert (destination web; the keyed row parked behind its key, the other in intake)');
$open_before{$_->[0]} = $_->[1] for map { [ split /\|/ ] } split /\n/, $node->safe_psql('postgres',
	q{SELECT message_id || '|' || id FROM queuebox.outbox WHERE topic = 't.new'});

qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE state IN ('pending', 'processing')",
	'0', 'every open row is delivered after the update', timeout => 90);
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM queuebox.outbox WHERE topic IN ('t.e', 't.new')
		  AND (state <> 'sent' OR destination IS DISTINCT FROM 'web' OR hold IS NOT NULL)}),
	'0', 'each is sent, routed to web, not held');
is($node->safe_psql('postgres', q{SELECT attempt FROM queuebox.outbox WHERE payload = '{"kb": 0}'}),
	'3', 'the row retried under 0.2.0 keeps its attempts (2 + the one that succeeded)');

my $reqs = qb_sink_requests($sink);
my %seen;
$seen{ $_->{mid} }++ for @$reqs;
is(scalar(grep { !$open_before{$_} } keys %seen), 0, 'the sink saw no row that was final before the update');
is(scalar(grep { !$seen{$_} } keys %open_before), 0, 'the sink saw every open row');
is(scalar(grep { $seen{$_} > 1 } keys %seen), 0, 'each was delivered once');
my $order = qb_key_order($node, $sink, "topic IN ('t.e', 't.new')");
is($order->{keys_in_order}, $order->{keys}, "every key's rows were delivered in id order ($order->{keys} keys)")
  or diag(join("\n", @{ $order->{bad} }));
is($order->{keys}, 3, 'keys ka, kb and kc');

is($node->safe_psql('postgres', $final_sql), $final_before, 'sent and dead rows are unchanged');
is($node->safe_psql('postgres', $inbox_sql), $inbox_before, 'inbox rows are unchanged');
is($node->safe_psql('postgres', $gone_sql), $gone_before, 'the breaker row of a destination not configured is unchanged');

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION queuebox');
is(qb_schema_description($node, 'postgres'), qb_schema_description($node, 'fresh'),
	'the upgraded schema equals a fresh install');

$node->stop;
qb_sink_stop($sink);
done_testing();
