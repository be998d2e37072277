# 036_upgrade_0_3_0.pl
#   Schema 0.3.0 -> 0.3.1 (inbox_claim() runs with jit off) on both
#   PostgreSQL hosts, each with a filled database: pull rows claimed with a
#   live lease, under an expired lease, parked behind their aggregate,
#   retried and not due yet, processed and dead, a push row and outbox rows.
#   - the extension: ALTER EXTENSION queuebox UPDATE from 0.3.0 (installed
#     through the committed scripts); the workers refuse the 0.3.0 schema
#     until then and say why;
#   - the daemon: queuebox-mssqld --migrate on the schema its 0.3.0 release
#     installed (test/fixtures/daemon-0.3.0-postgresql.sql).
#   For each: no row changes in the upgrade, the live claim still completes
#   with its token, every other pull row is then consumed once, per
#   aggregate in order, and the schema equals a fresh install's.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $claim_config = q{SELECT coalesce(array_to_string(proconfig, ','), '(none)') FROM pg_proc
	WHERE oid = 'queuebox.inbox_claim(text, int, int)'::regprocedure};
my $inbox_sql = q{SELECT string_agg(concat_ws('|', id, source, idempotency_key, aggregate_id, payload,
	consumption, state, attempt, scheduled_at, created_at, claim_token, lease_until, last_error, hold),
	E'\n' ORDER BY id) FROM queuebox.inbox};
my $outbox_sql = q{SELECT string_agg(concat_ws('|', id, message_id, topic, key, payload, state, attempt,
	destination, hold), E'\n' ORDER BY id) FROM queuebox.outbox};

# fill($node, $db): the same rows on both hosts, made by the 0.3.0 functions
sub fill
{
	my ($node, $db) = @_;
	$node->safe_psql($db, q{
		INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)
		SELECT 'jobs', 'j-' || g, 'a' || (g % 4), jsonb_build_object('n', g), 'pull'
		FROM generate_series(1, 40) g;
		INSERT INTO queuebox.inbox (source, idempotency_key, payload) VALUES ('hooks', 'h-1', '{"push": true}');
		INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('orders.created', 'k1', '{"o": 1}'), ('orders.paid', NULL, '{"o": 2}');
		-- the first of each aggregate: one completes, one dies, one is retried
		-- an hour later, one stays claimed (a live lease, token kept)
		CREATE TABLE public.held AS SELECT id, claim_token, aggregate_id FROM queuebox.inbox_claim('jobs', 4, 600000);
		SELECT queuebox.inbox_complete(id, claim_token) FROM public.held WHERE aggregate_id = 'a1';
		SELECT queuebox.inbox_dead(id, claim_token, 'bad payload') FROM public.held WHERE aggregate_id = 'a2';
		SELECT queuebox.inbox_retry(id, claim_token, 3600000, 'try later') FROM public.held WHERE aggregate_id = 'a3';
		DELETE FROM public.held WHERE aggregate_id <> 'a0';
		-- the next claim: a1's second row is claimed and its lease then
		-- expires; rows behind an open row of their aggregate are parked
		CREATE TABLE public.expired AS SELECT id FROM queuebox.inbox_claim('jobs', 10, 600000);
		UPDATE queuebox.inbox SET lease_until = now() - interval '1 minute' WHERE id IN (SELECT id FROM public.expired);
	});
	return;
}

# the rows' places before the upgrade, for the comparison after it
sub places
{
	my ($node, $db) = @_;
	return $node->safe_psql($db, q{
		SELECT string_agg(state || ':' || coalesce(hold, '-') || ':' || n, ' ' ORDER BY state, hold)
		FROM (SELECT state, hold, count(*) n FROM queuebox.inbox WHERE source = 'jobs' GROUP BY 1, 2) s});
}

# consume($node, $db): the kept claim completes with its token, then claim
# and complete until nothing is left; returns what was consumed, in order
sub consume
{
	my ($node, $db, $what) = @_;
	is($node->safe_psql($db, 'SELECT queuebox.inbox_complete(id, claim_token) FROM public.held'), 't',
		"$what: the claim made before the upgrade completes with its token");
	$node->safe_psql($db, q{
		UPDATE queuebox.inbox SET scheduled_at = now() WHERE source = 'jobs' AND state = 'pending' AND attempt = 1;
		CREATE TABLE public.done (seq serial, id bigint, aggregate_id text);
		DO $$
		DECLARE r record; n int; rounds int := 0;
		BEGIN
			LOOP
				n := 0;
				FOR r IN SELECT * FROM queuebox.inbox_claim('jobs', 10, 60000) LOOP
					INSERT INTO public.done (id, aggregate_id) VALUES (r.id, r.aggregate_id);
					IF NOT queuebox.inbox_complete(r.id, r.claim_token) THEN
						RAISE EXCEPTION 'message % did not complete', r.id;
					END IF;
					n := n + 1;
				END LOOP;
				rounds := rounds + 1;
				EXIT WHEN n = 0 OR rounds > 100;
			END LOOP;
		END $$;
	});
	is($node->safe_psql($db, q{SELECT state || ':' || count(*) FROM queuebox.inbox WHERE source = 'jobs'
		GROUP BY state ORDER BY state}), "dead:1\nprocessed:39",
		"$what: every pull row is consumed after the upgrade (the dead one stays dead)");
	is($node->safe_psql($db, 'SELECT count(*) - count(DISTINCT id) FROM public.done'), '0',
		"$what: none twice");
	is($node->safe_psql($db, q{SELECT count(*) FROM (SELECT id < lag(id) OVER (PARTITION BY aggregate_id ORDER BY seq) AS back
		FROM public.done) s WHERE back}), '0', "$what: each aggregate in order");
	return;
}

# snapshot($node, $db): the rows before the upgrade, once the places
# this test depends on are checked
sub snapshot
{
	my ($node, $db) = @_;
	is($node->safe_psql($db, $claim_config), '(none)', '0.3.0: inbox_claim() has no settings of its own');
	my $places = places($node, $db);
	like($places, qr/pending:aggregate:\d+/, 'rows are parked behind their aggregate');
	like($places, qr/processing:-:\d+/, 'rows are claimed');
	like($places, qr/dead:-:1/, 'a row is dead');
	return [ map { $node->safe_psql($db, $_) } ($inbox_sql, $outbox_sql) ];
}

# upgraded($node, $db, $what, $before): no row changed, jit is off for
# inbox_claim(), and every pull row is then consumed in order
sub upgraded
{
	my ($node, $db, $what, $before) = @_;
	is($node->safe_psql($db, $claim_config), 'jit=off,search_path=pg_catalog, pg_temp',
		"$what: inbox_claim() runs with jit off (and as its owner, 0.3.5)");
	is($node->safe_psql($db, $inbox_sql), $before->[0], "$what: the upgrade changes no inbox row");
	is($node->safe_psql($db, $outbox_sql), $before->[1], "$what: the upgrade changes no outbox row");
	consume($node, $db, $what);
	return;
}

qb_ext_upgrade_test('up030', '0.3.0', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);
qbd_upgrade_test('up030d', '0.3.0', fill => \&fill, snapshot => \&snapshot, upgraded => \&upgraded);

done_testing();
