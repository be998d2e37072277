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

qb_ext_upgrade_test('up035', '0.3.5', fill => \&qb_upgrade_fill, snapshot => \&snapshot, upgraded => \&upgraded);
qbd_upgrade_test('up035d', '0.3.5', fill => \&qb_upgrade_fill, snapshot => \&snapshot, upgraded => \&upgraded);

done_testing();
