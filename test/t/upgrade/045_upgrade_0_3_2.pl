# 045_upgrade_0_3_2.pl
#   Schema 0.3.2 -> 0.3.3 (takeover: outbox.claimer and inbox.claimer) on
#   both PostgreSQL hosts, each with a filled database: outbox rows
#   pending, processing (claimed under 0.3.2, a lease of an hour), sent and
#   dead, push and pull inbox rows, one processing.
#   - the extension: ALTER EXTENSION queuebox UPDATE from 0.3.2 (installed
#     through the scripts); the workers refuse the 0.3.2 schema until then
#     and say why;
#   - the daemon: queuebox-mssqld --migrate on the schema its 0.3.2 release
#     installed (test/fixtures/daemon-0.3.2-postgresql.sql).
#   For each: no row changes in the upgrade, the rows claimed before it
#   have no claimer (their lease ends them, as before), and the schema
#   equals a fresh install's.  On the extension the reclaim then takes
#   over a row whose claimer holds no lock, and leaves the old claims.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my %sql = (
	outbox => q{SELECT string_agg(concat_ws('|', id, message_id, topic, key, payload, state, attempt,
		destination, hold, last_error, claim_token, lease_until), E'\n' ORDER BY id) FROM queuebox.outbox},
	inbox => q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, payload, consumption, state,
		attempt, claim_token, lease_until), E'\n' ORDER BY id) FROM queuebox.inbox},
	breaker => q{SELECT string_agg(concat_ws('|', destination, state, failures, paused_until, opened_at,
		probe_at, last_error), E'\n' ORDER BY destination) FROM queuebox.destination_state});

# fill($node, $db): the same rows on both hosts
sub fill
{
	my ($node, $db) = @_;
	$node->safe_psql($db, q{
		INSERT INTO queuebox.outbox (topic, key, payload, destination)
		SELECT 'orders.created', 'k' || (g % 3), jsonb_build_object('n', g), 'web' FROM generate_series(1, 6) g;
		UPDATE queuebox.outbox SET state = 'sent', attempt = 1 WHERE id = (SELECT min(id) FROM queuebox.outbox);
		UPDATE queuebox.outbox SET state = 'dead', attempt = 3, last_error = 'HTTP 500'
			WHERE id = (SELECT max(id) FROM queuebox.outbox);
		UPDATE queuebox.outbox SET state = 'processing', hold = NULL,
			claim_token = '22222222-2222-2222-2222-222222222222', lease_until = now() + interval '1 hour'
			WHERE id = (SELECT min(id) + 1 FROM queuebox.outbox);
		INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption)
			VALUES ('hooks', 'h-1', '{"push": true}', 'push'), ('jobs', 'j-1', '{"pull": true}', 'pull');
		INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption, state, claim_token, lease_until)
			VALUES ('hooks', 'h-2', '{"push": true}', 'push', 'processing',
					'33333333-3333-3333-3333-333333333333', now() + interval '1 hour');
		INSERT INTO queuebox.destination_state (destination, state, failures, paused_until, opened_at, probe_at, last_error)
		VALUES ('flaky',  'closed',   2, NULL, NULL, NULL, 'HTTP 500'),
		       ('waited', 'closed',   0, now() - interval '1 hour', NULL, NULL, 'HTTP 429'),
		       ('paused', 'closed',   0, now() + interval '1 hour', NULL, NULL, 'HTTP 429'),
		       ('broken', 'open',     5, NULL, now(), now() + interval '1 hour', 'HTTP 503'),
		       ('gone',   'disabled', 1, NULL, now(), NULL, 'HTTP 410 Gone'),
		       ('fine',   'closed',   0, NULL, NULL, NULL, NULL);
	});
	return;
}

# upgraded($node, $db, $what, \%before): the rows are as they were, and
# those claimed before the upgrade have no claimer
sub upgraded
{
	my ($node, $db, $what, $before) = @_;
	for my $t (sort keys %sql)
	{
		is($node->safe_psql($db, $sql{$t}), $before->{$t}, "$what: the upgrade changes no $t row");
	}
	is($node->safe_psql($db, q{SELECT (SELECT count(*) FROM queuebox.outbox WHERE state = 'processing' AND claimer IS NULL)
		|| '/' || (SELECT count(*) FROM queuebox.inbox WHERE state = 'processing' AND claimer IS NULL)}),
		'1/1', "$what: the claims made before the upgrade have no claimer: their leases end them");
	return;
}

sub snapshot
{
	my ($node, $db) = @_;
	return { map { $_ => $node->safe_psql($db, $sql{$_}) } keys %sql };
}

# ---------------------------------------------------------------- the extension
my $node = qb_node('up032', create_extension => 0, conf => "queuebox.relay_worker = off\n");
$node->safe_psql('postgres', "CREATE EXTENSION queuebox VERSION '0.3.2'");
is(qb_version($node), '0.3.2', 'the extension is installed at version 0.3.2');
my $logstart = -s $node->logfile;
fill($node, 'postgres');
my $before = snapshot($node, 'postgres');
like(qb_wait_log($node, qr/queuebox outbox \d: .*run ALTER EXTENSION queuebox UPDATE/, $logstart, timeout => 60),
	qr/the queuebox schema in this database is version 0\.3\.2 and the library is version \Q$QB_LATEST\E; run ALTER EXTENSION queuebox UPDATE/,
	'the workers refuse the 0.3.2 schema and say to run the update');
$node->safe_psql('postgres', 'ALTER EXTENSION queuebox UPDATE');
is(qb_version($node), $QB_LATEST, "extversion is $QB_LATEST after the update");
upgraded($node, 'postgres', 'extension', $before);
# the new library's reclaim on the upgraded schema, in one transaction (no
# worker sees the row meanwhile): a claimer no session holds the lock of is
# gone, the claim made before the upgrade is left to its lease
is($node->safe_psql('postgres', q{
	BEGIN;
	INSERT INTO queuebox.outbox (topic, payload, state, claim_token, lease_until, claimer, destination)
		VALUES ('gone.claimer', '{}', 'processing', gen_random_uuid(), now() + interval '1 hour', 987654321, 'web');
	SELECT queuebox._outbox_reclaim(100);
	SELECT state || '|' || (last_error LIKE 'taken over:%') || '|' || (claimer IS NULL) FROM queuebox.outbox
		WHERE topic = 'gone.claimer';
	SELECT count(*) FROM queuebox.outbox WHERE state = 'processing';
	ROLLBACK;}), "1\npending|true|true\n1",
	'extension: the reclaim takes over the row of a gone claimer at once, and leaves the claim made before the upgrade');

$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION queuebox');
is(qb_schema_description($node, 'postgres'), qb_schema_description($node, 'fresh'),
	'the upgraded extension equals a fresh install');
$node->stop;

# ---------------------------------------------------------------- the daemon
qbd_upgrade_test('up032d', '0.3.2', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);

done_testing();
