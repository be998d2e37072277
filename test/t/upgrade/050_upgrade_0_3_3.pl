# 050_upgrade_0_3_3.pl
#   Schema 0.3.3 -> 0.3.4 (onDead: holdKey: hold 'dead' on a dead row that
#   holds its key, outbox_key_open_idx with that predicate, outbox_audit,
#   requeue_outbox(id, payload), skip_outbox(id), held_keys(); the same for
#   the relay's aggregate order: inbox hold 'dead', inbox_push_aggregate_idx
#   with that predicate, inbox_audit, requeue_inbox(id, payload),
#   skip_inbox(id), held_aggregates(); every requeue audited) on both
#   PostgreSQL hosts, each with a filled database: keyed outbox rows sent,
#   processing, parked behind their key and dead, inbox rows (a dead push
#   row with a pending one of its aggregate behind it).
#   - the extension: ALTER EXTENSION queuebox UPDATE from 0.3.3 (installed
#     through the scripts); the workers refuse the 0.3.3 schema until then;
#   - the daemon: queuebox-mssqld --migrate on the schema its 0.3.3 release
#     installed (test/fixtures/daemon-0.3.3-postgresql.sql).
#   For each: no row changes in the upgrade, a dead row of 0.3.3 holds no
#   key and a dead inbox row no aggregate (they were dead under release),
#   the new functions work on the old rows, and the schema equals a fresh
#   install's (the extension's: both audit tables kept by pg_dump).
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
		destination, hold, last_error, claim_token, lease_until, claimer), E'\n' ORDER BY id) FROM queuebox.outbox},
	inbox => q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, aggregate_id, payload, consumption,
		state, hold, attempt, claim_token, lease_until), E'\n' ORDER BY id) FROM queuebox.inbox});

# fill($node, $db): the same rows on both hosts.  Key k0: sent, then dead
# (0.3.3 released its key), then a parked row; key k1: processing, then
# two parked rows; key k2: a dead row alone.
sub fill
{
	my ($node, $db) = @_;
	$node->safe_psql($db, q{
		INSERT INTO queuebox.outbox (topic, key, payload, destination)
		SELECT 'orders.created', 'k' || (g % 3), jsonb_build_object('n', g), 'web' FROM generate_series(0, 8) g;
		UPDATE queuebox.outbox SET state = 'sent', attempt = 1, hold = NULL WHERE payload->>'n' = '0';
		UPDATE queuebox.outbox SET state = 'dead', attempt = 3, hold = NULL, last_error = 'HTTP 500'
			WHERE payload->>'n' IN ('3', '2');
		UPDATE queuebox.outbox SET state = 'processing', hold = NULL,
			claim_token = '22222222-2222-2222-2222-222222222222', lease_until = now() + interval '1 hour'
			WHERE payload->>'n' = '1';
		UPDATE queuebox.outbox SET hold = 'key' WHERE payload->>'n' IN ('6', '4', '7');
		UPDATE queuebox.outbox SET state = 'sent', hold = NULL WHERE payload->>'n' IN ('5', '8');
		INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption)
			VALUES ('hooks', 'h-1', '{"push": true}', 'push'), ('jobs', 'j-1', '{"pull": true}', 'pull');
		INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption, state,
									last_error, created_at)
			VALUES ('hooks', 'h-2', 'a1', '{"n": 2}', 'push', 'dead', 'the topic template rendered empty',
					now() - interval '1 minute'),
				   ('hooks', 'h-3', 'a1', '{"n": 3}', 'push', 'pending', NULL, now());
	});
	return;
}

sub snapshot
{
	my ($node, $db) = @_;
	return { map { $_ => $node->safe_psql($db, $sql{$_}) } keys %sql };
}

# upgraded($node, $db, $what, \%before): the rows are as they were; the
# new functions and index on them, in a transaction rolled back
sub upgraded
{
	my ($node, $db, $what, $before) = @_;
	for my $t (sort keys %sql)
	{
		is($node->safe_psql($db, $sql{$t}), $before->{$t}, "$what: the upgrade changes no $t row");
	}
	is($node->safe_psql($db, q{SELECT count(*) FROM queuebox.outbox WHERE hold = 'dead'}), '0',
		"$what: no dead row of 0.3.3 holds its key");
	is($node->safe_psql($db, q{SELECT count(*) FROM queuebox.held_keys()}), '0',
		"$what: held_keys(): none (k1's head is processing, k0's dead head was released)");
	my $dead = $node->safe_psql($db, q{SELECT id FROM queuebox.outbox WHERE payload->>'n' = '3'});
	is($node->safe_psql($db, qq{
		BEGIN;
		SELECT queuebox.skip_outbox($dead);
		SELECT queuebox.requeue_outbox($dead, '{"n": 3, "edited": true}');
		SELECT state || '|' || hold || '|' || (payload->>'edited') FROM queuebox.outbox WHERE id = $dead;
		SELECT action || '|' || payload_before || '|' || payload_after FROM queuebox.outbox_audit;
		ROLLBACK;}),
		"f\nt\npending|ready|true\nrequeue|{\"n\": 3}|{\"n\": 3, \"edited\": true}",
		"$what: skip refuses a dead row that holds nothing, an edited requeue works and is audited");
	is($node->safe_psql($db, q{
		BEGIN;
		UPDATE queuebox.outbox SET hold = 'dead' WHERE payload->>'n' = '2';
		SET LOCAL enable_seqscan = off;
		SELECT count(*) FROM queuebox.outbox WHERE key = 'k2' AND (state IN ('pending', 'processing') OR hold = 'dead');
		ROLLBACK;}), '1', "$what: the open-rows index of a key counts a dead row that holds it");

	# the relay's aggregate order: a dead push row of 0.3.3 holds nothing
	is($node->safe_psql($db, q{SELECT count(*) FROM queuebox.inbox WHERE hold = 'dead'}), '0',
		"$what: no dead inbox row of 0.3.3 holds its aggregate");
	is($node->safe_psql($db, q{SELECT count(*) FROM queuebox.held_aggregates()}), '0',
		"$what: held_aggregates(): none");
	is($node->safe_psql($db, q{
		SET enable_seqscan = off;
		SELECT count(*) FROM queuebox.inbox e, queuebox.inbox c
		WHERE c.idempotency_key = 'h-3' AND e.consumption = 'push' AND e.aggregate_id = c.aggregate_id
		  AND (e.state IN ('pending', 'processing') OR e.hold = 'dead')
		  AND (e.created_at, e.id) < (c.created_at, c.id)}), '0',
		"$what: the relay claim's blocker finds nothing before a1's pending row");
	my $idead = $node->safe_psql($db, q{SELECT id FROM queuebox.inbox WHERE idempotency_key = 'h-2'});
	my $odead = $node->safe_psql($db, q{SELECT id FROM queuebox.outbox WHERE payload->>'n' = '2'});
	is($node->safe_psql($db, qq{
		BEGIN;
		SELECT queuebox.skip_inbox($idead);
		SELECT queuebox.requeue_inbox($idead, '{"n": 2, "edited": true}');
		SELECT queuebox.requeue_outbox($odead);
		SELECT state || '|' || coalesce(hold, '-') || '|' || (payload->>'edited') FROM queuebox.inbox WHERE id = $idead;
		SELECT action || '|' || payload_before || '|' || payload_after FROM queuebox.inbox_audit;
		SELECT outbox_id || '|' || action || '|' || coalesce(payload_after::text, '-') FROM queuebox.outbox_audit;
		ROLLBACK;}),
		"f\nt\nt\npending|-|true\nrequeue|{\"n\": 2}|{\"n\": 2, \"edited\": true}\n$odead|requeue|-",
		"$what: skip_inbox refuses an old dead row, an edited inbox requeue and a plain outbox requeue are audited");
	return;
}

qb_ext_upgrade_test('up033', '0.3.3', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);
qbd_upgrade_test('up033d', '0.3.3', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);

done_testing();
