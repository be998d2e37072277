# 062_upgrade_0_3_5.pl
#   Schema 0.3.5 -> 0.3.6 (issue 38, chaos with a checker) on both
#   PostgreSQL hosts, each with a filled database: outbox rows sent,
#   pending, processing under a claimer and dead, inbox rows push (one
#   processing under a claimer) and pull.
#   - the extension: ALTER EXTENSION queuebox UPDATE from 0.3.5 (installed
#     through the scripts); the workers refuse the 0.3.5 schema until then;
#   - the daemon: queuebox-mssqld --migrate on the schema its 0.3.5 release
#     installed (test/fixtures/daemon-0.3.5-postgresql.sql).
#   For each: no row changes in the upgrade, and the schema equals a fresh
#   install's; on the extension, the reclaim takes over an old processing
#   row whose claimer is gone.
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
	outbox => q{SELECT string_agg(concat_ws('|', id, message_id, topic, key, payload, headers, state, attempt,
		destination, hold, last_error, claim_token, lease_until, claimer), E'\n' ORDER BY id) FROM queuebox.outbox},
	inbox => q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, aggregate_id, payload, headers,
		consumption, state, hold, attempt, claim_token, lease_until, claimer), E'\n' ORDER BY id) FROM queuebox.inbox});

# fill($node, $db): the same rows on both hosts
sub fill
{
	my ($node, $db) = @_;
	$node->safe_psql($db, q{
		INSERT INTO queuebox.outbox (topic, key, payload, destination)
		SELECT 'orders.created', 'k' || (g % 3), jsonb_build_object('n', g), 'web'
		FROM generate_series(0, 5) g;
		UPDATE queuebox.outbox SET state = 'sent', attempt = 1, hold = NULL WHERE payload->>'n' = '0';
		UPDATE queuebox.outbox SET state = 'dead', attempt = 3, hold = NULL, last_error = 'HTTP 500'
			WHERE payload->>'n' = '2';
		UPDATE queuebox.outbox SET state = 'processing', hold = NULL,
			claim_token = '22222222-2222-2222-2222-222222222222', lease_until = now() + interval '1 hour'
			WHERE payload->>'n' = '1';
		INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption)
			VALUES ('hooks', 'h-1', '{"push": true}', 'push'), ('jobs', 'j-1', '{"pull": true}', 'pull');
		UPDATE queuebox.inbox SET state = 'processing',
			claim_token = '33333333-3333-3333-3333-333333333333', lease_until = now() + interval '1 hour'
			WHERE idempotency_key = 'h-1';
	});
	return;
}

sub snapshot
{
	my ($node, $db) = @_;
	return { map { $_ => $node->safe_psql($db, $sql{$_}) } keys %sql };
}

# upgraded($node, $db, $what, \%before): the rows are as they were; on the
# extension, the processing row, given a claimer that is gone (77: no
# session holds its lock) in a transaction the workers cannot see, is taken
# over by a reclaim as a worker runs it
sub upgraded
{
	my ($node, $db, $what, $before) = @_;
	for my $t (sort keys %sql)
	{
		is($node->safe_psql($db, $sql{$t}), $before->{$t}, "$what: the upgrade changes no $t row");
	}
	return if $what ne 'extension';
	is($node->safe_psql($db, q{BEGIN; UPDATE queuebox.outbox SET claimer = 77 WHERE state = 'processing';
		SELECT queuebox._outbox_reclaim(10); ROLLBACK}), '1',
		"$what: the reclaim takes over an old row whose claimer is gone");
	return;
}

qb_ext_upgrade_test('up035', '0.3.5', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);
qbd_upgrade_test('up035d', '0.3.5', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);

done_testing();
