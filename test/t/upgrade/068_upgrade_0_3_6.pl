# 068_upgrade_0_3_6.pl
#   Schema 0.3.6 -> 0.3.7 (issue 37, speed: outbox_created_brin dropped) on
#   both PostgreSQL hosts, each with a filled database: outbox rows sent (a
#   few thousand, over several block ranges of the BRIN), pending,
#   processing and dead, inbox rows push (one processing) and pull.
#   - the extension: ALTER EXTENSION queuebox UPDATE from 0.3.6 (installed
#     through the scripts); the workers refuse the 0.3.6 schema until then;
#     and once more with the index dropped CONCURRENTLY beforehand, as
#     docs/operations.md says an operator may (the update skips it);
#   - the daemon: queuebox-mssqld --migrate on the schema its 0.3.6 release
#     installed (test/fixtures/daemon-0.3.6-postgresql.sql).
#   For each: the index is there before, no row changes in the upgrade, the
#   index is gone after, and the schema equals a fresh install's.
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
		destination, hold, last_error, claim_token, lease_until, claimer, created_at, scheduled_at), E'\n' ORDER BY id)
		FROM queuebox.outbox},
	inbox => q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, aggregate_id, payload, headers,
		consumption, state, hold, attempt, claim_token, lease_until, claimer), E'\n' ORDER BY id) FROM queuebox.inbox},
	brin => q{SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
		WHERE i.indrelid = 'queuebox.outbox'::regclass AND a.amname = 'brin'});

# fill($node, $db): the same rows on both hosts (3,000 old sent ones, then
# qb_upgrade_fill's); the BRIN is there
sub fill
{
	my ($node, $db) = @_;
	is($node->safe_psql($db, q{SELECT pg_get_indexdef('queuebox.outbox_created_brin'::regclass)}),
		'CREATE INDEX outbox_created_brin ON queuebox.outbox USING brin (created_at)',
		'the 0.3.6 schema has outbox_created_brin');
	$node->safe_psql($db, q{
		INSERT INTO queuebox.outbox (topic, key, payload, destination, state, attempt, hold, created_at)
		SELECT 'orders.sent', 'old' || (g % 50), jsonb_build_object('m', g, 'pad', repeat('x', 200)), 'web',
			'sent', 1, NULL, now() - interval '10 days' + g * interval '1 second'
		FROM generate_series(1, 3000) g});
	qb_upgrade_fill($node, $db);
	cmp_ok($node->safe_psql($db, q{SELECT pg_relation_size('queuebox.outbox') / current_setting('block_size')::int}),
		'>', 128, 'the outbox spans more than one block range of the BRIN');
	return;
}

sub snapshot
{
	my ($node, $db) = @_;
	return { map { $_ => $node->safe_psql($db, $sql{$_}) } keys %sql };
}

# upgraded($node, $db, $what, \%before): the rows are as they were, and the
# index is gone
sub upgraded
{
	my ($node, $db, $what, $before) = @_;
	for my $t (qw(inbox outbox))
	{
		is($node->safe_psql($db, $sql{$t}), $before->{$t}, "$what: the upgrade changes no $t row");
	}
	is($before->{brin}, '1', "$what: before the upgrade the outbox had one BRIN index");
	is($node->safe_psql($db, q{SELECT to_regclass('queuebox.outbox_created_brin') IS NULL}), 't',
		"$what: outbox_created_brin is gone");
	is($node->safe_psql($db, $sql{brin}), '0', "$what: the outbox has no BRIN index");
	return;
}

qb_ext_upgrade_test('up036', '0.3.6', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);
qbd_upgrade_test('up036d', '0.3.6', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);

# docs/operations.md: an operator drops it CONCURRENTLY first (outside a
# transaction, so not inside the update); the update skips it
qb_ext_upgrade_test('up036c', '0.3.6',
	fill => sub {
		my ($node, $db) = @_;
		fill($node, $db);
		$node->safe_psql($db, 'DROP INDEX CONCURRENTLY IF EXISTS queuebox.outbox_created_brin');
		return;
	},
	snapshot => \&snapshot,
	upgraded => sub {
		my ($node, $db, $what, $before) = @_;
		is($before->{brin}, '0', "$what, dropped CONCURRENTLY first: no BRIN before the update");
		for my $t (qw(inbox outbox))
		{
			is($node->safe_psql($db, $sql{$t}), $before->{$t}, "$what, dropped CONCURRENTLY first: no $t row changed");
		}
		is($node->safe_psql($db, $sql{brin}), '0', "$what, dropped CONCURRENTLY first: still no BRIN after the update");
		return;
	});

done_testing();
