# 043_upgrade_0_3_1.pl
#   Schema 0.3.1 -> 0.3.2 (resume_destination() answers true only when the
#   destination was holding rows) on both PostgreSQL hosts, each with a
#   filled database: outbox rows pending, sent and dead, inbox rows, and a
#   breaker row of every kind (closed with failures counted, closed with a
#   pause that is over, paused ahead, open, disabled).
#   - the extension: ALTER EXTENSION queuebox UPDATE from 0.3.1 (installed
#     through the committed scripts); the workers refuse the 0.3.1 schema
#     until then and say why;
#   - the daemon: queuebox-mssqld --migrate on the schema its 0.3.1 release
#     installed (test/fixtures/daemon-0.3.1-postgresql.sql).
#   For each: no row changes in the upgrade, resume_destination() then
#   answers as docs/http-api.md says and clears every count and pause, and
#   the schema equals a fresh install's.
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
		destination, hold, last_error), E'\n' ORDER BY id) FROM queuebox.outbox},
	inbox => q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, payload, consumption, state,
		attempt), E'\n' ORDER BY id) FROM queuebox.inbox},
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
		INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption)
			VALUES ('hooks', 'h-1', '{"push": true}', 'push'), ('jobs', 'j-1', '{"pull": true}', 'pull');
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

# upgraded($node, $db, $what, \%before): the rows are as they were; then
# resume_destination() answers true only where rows were held, and leaves
# every destination closed with nothing counted
sub upgraded
{
	my ($node, $db, $what, $before) = @_;
	for my $t (sort keys %sql)
	{
		is($node->safe_psql($db, $sql{$t}), $before->{$t}, "$what: the upgrade changes no $t row");
	}
	is($node->safe_psql($db, q{SELECT string_agg(d || '=' || queuebox.resume_destination(d), ' ' ORDER BY d)
		FROM unnest(ARRAY['broken', 'fine', 'flaky', 'gone', 'nosuch', 'paused', 'waited']) d}),
		'broken=true fine=false flaky=false gone=true nosuch=false paused=true waited=false',
		"$what: resume_destination() is true for open, disabled and paused ahead; false for closed, "
		  . 'a count without a circuit, a pause that is over, and an unknown name');
	is($node->safe_psql($db, q{SELECT string_agg(destination || ':' || state || '/' || failures || '/'
		|| (paused_until IS NULL), ' ' ORDER BY destination) FROM queuebox.destination_state}),
		'broken:closed/0/true fine:closed/0/true flaky:closed/0/true gone:closed/0/true paused:closed/0/true waited:closed/0/true',
		"$what: and every destination is closed, its count and pause cleared");
	return;
}

sub snapshot
{
	my ($node, $db) = @_;
	return { map { $_ => $node->safe_psql($db, $sql{$_}) } keys %sql };
}

qb_ext_upgrade_test('up031', '0.3.1', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);
qbd_upgrade_test('up031d', '0.3.1', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);

done_testing();
