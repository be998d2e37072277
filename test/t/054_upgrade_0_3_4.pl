# 054_upgrade_0_3_4.pl
#   Schema 0.3.4 -> 0.3.5 (issue 27, production fit: trace context, the
#   configuration file, least-privilege roles, egress rules) on both
#   PostgreSQL hosts, each with a filled database: outbox rows sent,
#   pending, processing and dead (some carrying a traceparent header their
#   application put there), inbox rows push and pull.
#   - the extension: ALTER EXTENSION queuebox UPDATE from 0.3.4 (installed
#     through the scripts); the workers refuse the 0.3.4 schema until then;
#   - the daemon: queuebox-mssqld --migrate on the schema its 0.3.4 release
#     installed (test/fixtures/daemon-0.3.4-postgresql.sql).
#   For each: no row changes in the upgrade, what each part added works on
#   the old rows, and the schema equals a fresh install's.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my %sql = (
	outbox => q{SELECT string_agg(concat_ws('|', id, message_id, topic, key, payload, headers, state, attempt,
		destination, hold, last_error, claim_token, lease_until, claimer), E'\n' ORDER BY id) FROM queuebox.outbox},
	inbox => q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, aggregate_id, payload, headers,
		consumption, state, hold, attempt, claim_token, lease_until), E'\n' ORDER BY id) FROM queuebox.inbox});

my $tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

# fill($node, $db): the same rows on both hosts
sub fill
{
	my ($node, $db) = @_;
	$node->safe_psql($db, qq{
		INSERT INTO queuebox.outbox (topic, key, payload, headers, destination)
		SELECT 'orders.created', 'k' || (g % 3), jsonb_build_object('n', g),
			   CASE WHEN g % 2 = 0 THEN jsonb_build_object('traceparent', '$tp') ELSE '{}' END, 'web'
		FROM generate_series(0, 5) g;
		UPDATE queuebox.outbox SET state = 'sent', attempt = 1, hold = NULL WHERE payload->>'n' = '0';
		UPDATE queuebox.outbox SET state = 'dead', attempt = 3, hold = NULL, last_error = 'HTTP 500'
			WHERE payload->>'n' = '2';
		UPDATE queuebox.outbox SET state = 'processing', hold = NULL,
			claim_token = '22222222-2222-2222-2222-222222222222', lease_until = now() + interval '1 hour'
			WHERE payload->>'n' = '1';
		INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers, consumption)
			VALUES ('hooks', 'h-1', '{"push": true}', jsonb_build_object('traceparent', '$tp'), 'push'),
				   ('jobs', 'j-1', '{"pull": true}', jsonb_build_object('traceparent', '$tp'), 'pull');
	});
	return;
}

sub snapshot
{
	my ($node, $db) = @_;
	return { map { $_ => $node->safe_psql($db, $sql{$_}) } keys %sql };
}

# upgraded($node, $db, $what, \%before): the rows are as they were, and
# each part of 0.3.5 works on them
sub upgraded
{
	my ($node, $db, $what, $before) = @_;
	for my $t (sort keys %sql)
	{
		is($node->safe_psql($db, $sql{$t}), $before->{$t}, "$what: the upgrade changes no $t row");
	}
	return;
}

qb_ext_upgrade_test('up034', '0.3.4', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);
qbd_upgrade_test('up034d', '0.3.4', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);

done_testing();
