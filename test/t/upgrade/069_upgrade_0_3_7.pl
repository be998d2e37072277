# 069_upgrade_0_3_7.pl
#   Schema 0.3.7 -> 0.3.8 (issue 39: the version, the tables of the limits
#   across daemon replicas; fan-out adds to it) on both PostgreSQL hosts,
#   each with a filled database (qb_upgrade_fill): outbox rows sent,
#   pending, processing under a claim and dead, inbox rows push (one
#   processing under a claim) and pull.
#   - the extension: ALTER EXTENSION queuebox UPDATE from 0.3.7 (installed
#     through the scripts); the workers refuse the 0.3.7 schema until then;
#   - the daemon: queuebox-mssqld --migrate on the schema its 0.3.7 release
#     installed (test/fixtures/daemon-0.3.7-postgresql.sql).
#   For each: no row changes in the upgrade, and the schema equals a fresh
#   install's; the limits' tables (destination_limit, destination_limit_place)
#   are there and empty.  A feature that adds to the step adds its checks here.
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
		consumption, state, hold, attempt, claim_token, lease_until, claimer), E'\n' ORDER BY id) FROM queuebox.inbox});

sub snapshot
{
	my ($node, $db) = @_;
	return { map { $_ => $node->safe_psql($db, $sql{$_}) } keys %sql };
}

# upgraded($node, $db, $what, \%before): the rows are as they were
sub upgraded
{
	my ($node, $db, $what, $before) = @_;
	for my $t (sort keys %sql)
	{
		is($node->safe_psql($db, $sql{$t}), $before->{$t}, "$what: the upgrade changes no $t row");
	}
	is($node->safe_psql($db, q{SELECT (SELECT count(*) FROM queuebox.destination_limit)
		+ (SELECT count(*) FROM queuebox.destination_limit_place)}), '0',
		"$what: the limits' tables are there, empty");
	return;
}

qb_ext_upgrade_test('up037', '0.3.7', fill => \&qb_upgrade_fill, snapshot => \&snapshot, upgraded => \&upgraded);
qbd_upgrade_test('up037d', '0.3.7', fill => \&qb_upgrade_fill, snapshot => \&snapshot, upgraded => \&upgraded);

done_testing();
