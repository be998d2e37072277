# 019_upgrade.pl
#   ALTER EXTENSION queuebox UPDATE from 0.1.0 to the current version
#   (through every upgrade script) with rows in every state: while the
#   schema is 0.1.0 the current workers refuse to claim (and
#   say to run the update); after it, every pending row is delivered, per
#   key in id order (a row left processing by a 0.1.0 worker once its lease
#   expired), sent and dead rows and the inbox are unchanged, and the
#   upgraded schema is the schema of a fresh install.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink = qb_sink_start(name => 'upgrade');

# no relay: the inbox's pending push rows must stay as they are
my $node = qb_node('upgrade', create_extension => 0, conf => "queuebox.relay_worker = off\n");
my $logstart = -s $node->logfile;
$node->safe_psql('postgres', "CREATE EXTENSION queuebox VERSION '0.1.0'");
is(qb_version($node), '0.1.0', 'the extension is installed at version 0.1.0');

# ---- rows in every state, written as 0.1.0 wrote them
$node->safe_psql('postgres', q{
	-- already final: must not change, must not be delivered
	INSERT INTO queuebox.outbox (topic, key, payload, state, attempt, last_error) VALUES
		('t.old', 'k1', '{"final": "sent"}', 'sent', 1, NULL),
		('t.old', 'k2', '{"final": "dead"}', 'dead', 10, 'attempt 10 of 10 failed: HTTP 500'),
		('t.old', NULL, '{"final": "sent-unkeyed"}', 'sent', 2, NULL);
	-- a row a 0.1.0 worker claimed and never settled; two more of its key
	INSERT INTO queuebox.outbox (topic, key, payload, state, attempt, claim_token, lease_until)
		VALUES ('t.e', 'kp', '{"kp": 0}', 'processing', 0, gen_random_uuid(), now() - interval '1 minute');
	INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('t.e', 'kp', '{"kp": 1}'), ('t.e', 'kp', '{"kp": 2}');
	-- three keys, four rows each, interleaved; some retried (attempt > 0),
	-- some due in a few seconds
	INSERT INTO queuebox.outbox (topic, key, payload, attempt, last_error, scheduled_at)
	SELECT 't.e', 'k' || k, jsonb_build_object('k', k, 'n', n),
		   CASE WHEN n = 1 AND k <> 3 THEN 2 ELSE 0 END,
		   CASE WHEN n = 1 AND k <> 3 THEN 'attempt 2 of 10 failed: HTTP 503' END,
		   CASE WHEN n = 2 AND k = 2 THEN now() + interval '3 seconds'
				WHEN n = 3 AND k = 3 THEN now() + interval '2 seconds'
				ELSE now() - interval '1 second' END
	FROM generate_series(1, 4) n, generate_series(1, 3) k
	ORDER BY n, k;
	-- unkeyed, one due later
	INSERT INTO queuebox.outbox (topic, payload, scheduled_at) VALUES
		('t.e', '{"u": 1}', now()),
		('t.e', '{"u": 2}', now() + interval '2 seconds');

	INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption, state,
								attempt, claim_token, lease_until, last_error) VALUES
		('hooks', 'push-pending', 'a', '{"i": 1}', 'push', 'pending', 0, NULL, NULL, NULL),
		('hooks', 'push-retried', 'a', '{"i": 2}', 'push', 'pending', 3, NULL, NULL, 'relay: HTTP 500'),
		('orders', 'pull-pending', 'b', '{"i": 3}', 'pull', 'pending', 0, NULL, NULL, NULL),
		('orders', 'pull-processing', 'c', '{"i": 4}', 'pull', 'processing', 1, gen_random_uuid(),
		 now() + interval '1 hour', NULL),
		('orders', 'pull-processed', 'd', '{"i": 5}', 'pull', 'processed', 1, NULL, NULL, NULL),
		('hooks', 'push-dead', 'e', '{"i": 6}', 'push', 'dead', 10, NULL, NULL, 'gave up');
});

my $after_fill = -s $node->logfile;

my $final_sql = q{SELECT string_agg(concat_ws('|', id, message_id, topic, key, payload, headers,
		state, attempt, max_attempts, scheduled_at, created_at, claim_token, lease_until, last_error),
		E'\n' ORDER BY id) FROM queuebox.outbox WHERE topic = 't.old'};
my $inbox_sql = q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, event_type,
		aggregate_id, payload, headers, consumption, state, attempt, scheduled_at, created_at,
		claim_token, lease_until, last_error), E'\n' ORDER BY id) FROM queuebox.inbox};
my $final_before = $node->safe_psql('postgres', $final_sql);
my $inbox_before = $node->safe_psql('postgres', $inbox_sql);
my %open_before = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	q{SELECT message_id || '|' || id FROM queuebox.outbox WHERE state IN ('pending', 'processing')});
is(scalar(keys %open_before), 17, '17 rows are open (16 pending, 1 processing) before the upgrade');

# ---- the 0.2.0 workers do not claim from a 0.1.0 schema, and say why
my $log = qb_wait_log($node, qr/run ALTER EXTENSION queuebox UPDATE/, $logstart, timeout => 60);
like($log, qr/the queuebox schema in this database is version 0\.1\.0 and the library is version \Q$QB_LATEST\E; run ALTER EXTENSION queuebox UPDATE/,
	'the workers log that the schema is 0.1.0 and to run ALTER EXTENSION queuebox UPDATE');
# a worker tried again after the rows were there, and still claimed nothing
like(qb_wait_log($node, qr/queuebox outbox \d: .*run ALTER EXTENSION queuebox UPDATE/, $after_fill, timeout => 60),
	qr/queuebox outbox \d: .*run ALTER EXTENSION queuebox UPDATE/,
	'a worker refuses again once the rows are there');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.outbox WHERE state = 'processing' OR claim_token IS NOT NULL"),
	'1', 'nothing was claimed under the 0.1.0 schema (only the 0.1.0 row is processing)');

# ---- the upgrade
$node->safe_psql('postgres', 'ALTER EXTENSION queuebox UPDATE');
is(qb_version($node), $QB_LATEST, "extversion is $QB_LATEST after ALTER EXTENSION queuebox UPDATE");
is($node->safe_psql('postgres', 'SELECT queuebox._schema_version()'), $QB_LATEST, "_schema_version() says $QB_LATEST");
is($node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.outbox WHERE destination IS NOT NULL OR hold IS NOT NULL"),
	'0', 'every row is unrouted and not held after the upgrade (pending rows are in intake)');

qb_configure(
	$node,
	qb_config_yaml(
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/events' } },
		routes => [ { topicPattern => 't.**', destination => 'web' } ]));

qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE state IN ('pending', 'processing')",
	'0', 'every open row is delivered after the upgrade', timeout => 90);
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM queuebox.outbox WHERE topic = 't.e' AND
		  (state <> 'sent' OR destination IS DISTINCT FROM 'web' OR hold IS NOT NULL)}),
	'0', 'each of them is sent, routed to web, not held');
is($node->safe_psql('postgres',
		q{SELECT string_agg(key || ':' || attempt, ',' ORDER BY id) FROM queuebox.outbox
		  WHERE topic = 't.e' AND key IN ('k1', 'k2') AND payload->>'n' = '1'}),
	'k1:3,k2:3', 'a row retried under 0.1.0 keeps its attempts (2 + the one that succeeded)');
is($node->safe_psql('postgres',
		q{SELECT state || ':' || attempt || ':' || (claim_token IS NULL) FROM queuebox.outbox
		  WHERE payload = '{"kp": 0}'}),
	'sent:1:true', 'the row left processing by 0.1.0 was reclaimed and sent');

# ---- the sink: each open row once, per key in id order
my $reqs = qb_sink_requests($sink);
my %seen;
$seen{ $_->{mid} }++ for @$reqs;
is(scalar(grep { !$open_before{$_} } keys %seen), 0, 'the sink saw no row that was final before the upgrade');
is(scalar(grep { !$seen{$_} } keys %open_before), 0, 'the sink saw every row open before the upgrade');
is(scalar(grep { $seen{$_} > 1 } keys %seen), 0, 'each was delivered once');
my %key_of = map { my ($m, $k) = split /\|/; ($m => $k) } split /\n/,
  $node->safe_psql('postgres', q{SELECT message_id || '|' || key FROM queuebox.outbox WHERE key IS NOT NULL});
my %by_key;
push @{ $by_key{ $key_of{ $_->{mid} } } }, $open_before{ $_->{mid} }
  for grep { defined $key_of{ $_->{mid} } } @$reqs;
for my $k (qw(k1 k2 k3 kp))
{
	my @ids = @{ $by_key{$k} // [] };
	is(join(',', @ids), join(',', sort { $a <=> $b } @ids), "key $k: delivered in id order (@ids)");
}
is(scalar(@{ $by_key{kp} // [] }), 3, 'key kp: the reclaimed row and the two behind it');

# ---- final rows and the inbox unchanged
is($node->safe_psql('postgres', $final_sql), $final_before, 'sent and dead rows are unchanged');
is($node->safe_psql('postgres', $inbox_sql), $inbox_before, 'inbox rows are unchanged');

# ---- the upgraded schema is the fresh install's
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION queuebox');
is(qb_version($node, 'fresh'), $QB_LATEST, "a fresh install is $QB_LATEST");
my $upgraded = qb_schema_description($node, 'postgres');
my $fresh = qb_schema_description($node, 'fresh');
cmp_ok(scalar(split /\n/, $fresh), '>', 100, 'the schema description covers the whole schema');
is($upgraded, $fresh, 'the upgraded schema equals a fresh install (columns, indexes, constraints, triggers, functions, views, comments)');
for my $rel (qw(queuebox.outbox queuebox.inbox queuebox.destination_state))
{
	is($node->safe_psql('postgres', "\\d+ $rel"), $node->safe_psql('fresh', "\\d+ $rel"),
		"\\d+ $rel: upgraded = fresh");
}

$node->stop;
qb_sink_stop($sink);
done_testing();
