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
use lib "$FindBin::RealBin/../../perl";
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
	roles_upgraded($node, $db, $what);
	return;
}

# roles_upgraded: EXECUTE is nobody's; where the roles exist (the
# extension made them; the daemon's role may not, then a superuser makes
# them and runs grant_roles() again), each login does its job on the old
# rows and no more
sub roles_upgraded
{
	my ($node, $db, $what) = @_;
	is($node->safe_psql($db, q{SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'queuebox'::regnamespace
		AND has_function_privilege('public', p.oid, 'EXECUTE')}), '0', "$what: PUBLIC may execute no queuebox function");
	if ($what eq 'daemon')
	{
		is($node->safe_psql($db, q{SELECT count(*) FROM pg_roles WHERE rolname LIKE 'queuebox\_%'}), '0',
			'daemon: its role may not create roles, so there are none');
		$node->safe_psql($db, q{
			CREATE ROLE queuebox_writer NOLOGIN; CREATE ROLE queuebox_consumer NOLOGIN;
			CREATE ROLE queuebox_reader NOLOGIN; CREATE ROLE queuebox_operator NOLOGIN;
			CREATE ROLE queuebox_admin NOLOGIN;
			GRANT queuebox_reader TO queuebox_operator; GRANT queuebox_operator TO queuebox_admin;});
		is($node->safe_psql($db, q{SET ROLE qbd; SELECT string_agg(g, ',') FROM queuebox.grant_roles() g}), '',
			'daemon: grant_roles() run again by its owner grants to the roles a superuser made');
	}
	$node->safe_psql($db, qq{
		CREATE ROLE up_app_$what LOGIN IN ROLE queuebox_writer;
		CREATE ROLE up_mon_$what LOGIN IN ROLE queuebox_reader;
		CREATE ROLE up_ops_$what LOGIN IN ROLE queuebox_operator;});
	my $as = sub {
		my ($user, $sql) = @_;
		my ($ret, $out, $err) = $node->psql($db, $sql, extra_params => ['-U', $user]);
		return $ret == 0 ? $out : ($err =~ /(permission denied for \w+ \w+)/)[0] // $err;
	};
	like($as->("up_app_$what", q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.created', '{}') RETURNING id}),
		qr/^\d+$/, "$what: a writer inserts a row");
	is($as->("up_app_$what", q{SELECT payload FROM queuebox.outbox}), 'permission denied for table outbox',
		"$what: a writer reads no row");
	is($as->("up_mon_$what", q{SELECT rows FROM queuebox.outbox_stats WHERE destination = '(all)' AND state = 'dead'}),
		'1', "$what: a reader counts the old dead row");
	is($as->("up_mon_$what", q{SELECT queuebox.requeue_outbox(1)}),
		'permission denied for function requeue_outbox', "$what: a reader requeues nothing");
	is($as->("up_ops_$what", q{BEGIN; SELECT queuebox.requeue_outbox(id) FROM queuebox.outbox WHERE state = 'dead'; ROLLBACK}),
		't', "$what: an operator requeues the old dead row");
	$node->safe_psql($db, qq{DROP ROLE up_app_$what, up_mon_$what, up_ops_$what});
	return;
}

qb_ext_upgrade_test('up034', '0.3.4', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);
qbd_upgrade_test('up034d', '0.3.4', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);

done_testing();
