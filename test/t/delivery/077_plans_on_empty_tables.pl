# 077_plans_on_empty_tables.pl
#   The workers' plans made on empty tables (docs/design/claim.md, "What a
#   delivered row costs"): a worker keeps one generic plan per statement
#   (plan_cache_mode = force_generic_plan, qb_pg_stmt.c), and a plan made
#   while a table looked empty (a fresh install, a TRUNCATE) stays until the
#   table's first ANALYZE.  Four statements read far more than their rows
#   with such a plan once the table filled (a review of every statement,
#   2026-12-07):
#   - the promotion and the release past rows in flight: whether the key
#     has a parked row became a hashed subplan over all of
#     outbox_parked_idx (QB_PG_OUTBOX_KEY_PARKED; fixed with OFFSET 0);
#   - the unpark read every held row through outbox_held_idx;
#   - the relay's forward walked every open inbox row through
#     inbox_open_idx, and its promotion the whole of that index;
#   (the last three fixed with coalesce(), which keeps the planner from
#   matching a partial index's predicate: the rows are found by id);
#   - and, whatever the statistics, the replay of one inbox row read the
#     whole inbox: a generic plan of "($1 IS NULL OR id = $1)" cannot probe
#     inbox_pkey (now one id and the filters are two branches).
#   Each statement's own text (cpp over qb_sql_pg.h) is prepared with the
#   workers' session settings in a database the workers do not serve,
#   executed once on the empty tables, then explained on filled ones,
#   without ANALYZE.  Each check fails with the statements before.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use QueueBoxTest;

my $node = qb_node('emptyplans');
$node->safe_psql('postgres', 'CREATE DATABASE emptyplan');
$node->safe_psql('emptyplan', 'CREATE EXTENSION queuebox CASCADE');
$node->safe_psql('emptyplan', "ALTER TABLE queuebox.$_ SET (autovacuum_enabled = false)") for qw(outbox inbox);

my $explain = 'EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF)';
my $token = '6f9619ff-8b86-d011-b42d-00c04fc96400';
# the workers' session (qb_pg_session_settings), the statements prepared,
# and each executed once while the tables are empty: the plans are made then
my @prepare = (
	qb_pg_session_sql(),
	'PREPARE promote(text[], uuid, int8, int4, int8, text[]) AS ' . qb_pg_statement('QB_PG_OUTBOX_PROMOTE') . ';',
	'PREPARE past(text[]) AS ' . qb_pg_statement('QB_PG_OUTBOX_PROMOTE_PAST') . ';',
	'PREPARE unpark(text[], int4) AS ' . qb_pg_statement('QB_PG_OUTBOX_UNPARK') . ';',
	'PREPARE forward(uuid, int8[], text[], int4, bool[]) AS ' . qb_pg_statement('QB_PG_RELAY_FORWARD') . ';',
	'PREPARE relay_promote(int8[]) AS ' . qb_pg_statement('QB_PG_RELAY_PROMOTE') . ';',
	'PREPARE replay_select(int8, text, text, timestamptz, timestamptz) AS '
	  . qb_pg_statement('QB_PG_INBOX_REPLAY_SELECT') . ';',
	'BEGIN;',
	"EXECUTE promote(ARRAY['u'], NULL, 0, 5, 0, ARRAY[NULL]::text[]); EXECUTE past(ARRAY['u']);",
	"EXECUTE unpark(ARRAY['free'], 1000);",
	"EXECUTE forward('$token', ARRAY[1]::int8[], ARRAY['t'], NULL, NULL); EXECUTE relay_promote(ARRAY[1]::int8[]);",
	'EXECUTE replay_select(1, NULL, NULL, NULL, NULL);',
	'ROLLBACK;');
# the fill, in the same session (inserts do not replan):
# - 10,000 keys with two rows each at s, the second parked behind the first;
# - 20,000 rows held for destination shut, whose circuit is open;
# - 20,000 open inbox rows of 10,000 aggregates, and 50 processing under $token
my @fill = (
	"INSERT INTO queuebox.outbox (topic, key, payload, destination) SELECT 't', 'k' || g, '{}', 's' FROM generate_series(1, 10000) g;",
	"INSERT INTO queuebox.outbox (topic, key, payload, destination) SELECT 't', 'k' || g, '{}', 's' FROM generate_series(1, 10000) g;",
	"INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('t', 'u', '{}');",
	"INSERT INTO queuebox.outbox (topic, payload, destination, hold) SELECT 'h', '{}', 'shut', 'destination' FROM generate_series(1, 20000);",
	"INSERT INTO queuebox.destination_state (destination, state, failures, opened_at, probe_at) VALUES ('shut', 'open', 5, now(), now() + interval '1 hour');",
	"INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload) SELECT 'src', 'i' || g, 'a' || (g % 10000), '{}' FROM generate_series(1, 20000) g;",
	"INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, state, claim_token, lease_until) SELECT 'src', 'p' || g, 'b' || g, '{}', 'processing', '$token', now() + interval '1 minute' FROM generate_series(1, 50) g;",
	"SELECT 'parked ' || count(*) FROM queuebox.outbox WHERE state = 'pending' AND hold = 'key';",
	"SELECT 'held ' || count(*) FROM queuebox.outbox WHERE state = 'pending' AND hold = 'destination';",
	"SELECT 'claimed ' || count(*) FROM queuebox.inbox WHERE state = 'processing';");
# the claimed rows' ids, into psql's :'claimed' (EXECUTE takes no subquery)
my $claimed = q{SELECT array_agg(id ORDER BY id) AS claimed FROM queuebox.inbox WHERE state = 'processing' \gset};
# an inbox row to replay by its id
my $one = q{SELECT id AS one FROM queuebox.inbox WHERE idempotency_key = 'i777' \gset};
my $sql = join("\n", @prepare, @fill, $claimed, $one, 'BEGIN;',
	"SELECT '==== promote';", "$explain EXECUTE promote(ARRAY['u'], NULL, 0, 5, 0, ARRAY[NULL]::text[]);",
	"SELECT '==== past';", "$explain EXECUTE past(ARRAY['u']);",
	"SELECT '==== unpark';", "$explain EXECUTE unpark(ARRAY['shut'], 1000);",
	"SELECT '==== forward';",
	"$explain EXECUTE forward('$token', :'claimed', array_fill('t'::text, ARRAY[50]), NULL, NULL);",
	"SELECT '==== relay_promote';",
	"$explain EXECUTE relay_promote(:'claimed');",
	"SELECT '==== replay_select';", "$explain EXECUTE replay_select(:'one', NULL, NULL, NULL, NULL);",
	"SELECT '==== end';", 'ROLLBACK;',
	# what it returns: the one row; by filter, the claimed rows, in created_at, id order
	"SELECT '---- one';", "EXECUTE replay_select(:'one', NULL, NULL, NULL, NULL);",
	"SELECT '---- filter';", "EXECUTE replay_select(NULL, 'processing', 'src', NULL, NULL);",
	"SELECT '---- done';");
my $out = $node->safe_psql('emptyplan', $sql);
like($out, qr/^parked 10000$/m, '10,000 rows are parked behind their keys');
like($out, qr/^held 20000$/m, '20,000 rows are held for a destination whose circuit is open');
like($out, qr/^claimed 50$/m, '50 inbox rows are processing under one token');
my %plan = $out =~ /^==== (\w+)\n(.*?)(?=^==== )/msg;
is(scalar(keys %plan), 6, 'six plans explained') or diag($out);

# the promotion and the release past rows in flight ask outbox_parked_idx for their key only
for my $name (qw(promote past))
{
	# (18 prints rows with two decimals)
	my @scans = $plan{$name} =~ /Index Only Scan using outbox_parked_idx on outbox \w+ \(actual rows=([0-9.]+) loops=\d+\)/g;
	cmp_ok(scalar(@scans), '>=', 1, "$name: asks outbox_parked_idx");
	is(scalar(grep { $_ > 1 } @scans), 0, "$name: for its key only, not every parked row")
	  or diag($plan{$name});
	unlike($plan{$name}, qr/hashed SubPlan/, "$name: no hashed subplan");
}
# the unpark finds the rows it moves by id: here none, so it reads a block or three
like($plan{unpark}, qr/Index Scan using outbox_pkey on outbox o/, 'unpark: finds its rows by id')
  or diag($plan{unpark});
unlike($plan{unpark}, qr/outbox_held_idx on outbox o\b/, 'unpark: does not walk every held row');
# the relay's forward and promotion find each inbox row by id
like($plan{forward}, qr/Index Scan using inbox_pkey on inbox i\b/, 'forward: finds each claimed row by id')
  or diag($plan{forward});
unlike($plan{forward}, qr/Index Scan using inbox_open_idx on inbox i\b/, 'forward: does not walk the open inbox rows');
like($plan{relay_promote}, qr/Index Scan using inbox_pkey on inbox o\b/, 'relay promote: releases rows by id')
  or diag($plan{relay_promote});
unlike($plan{relay_promote}, qr/inbox_open_idx on inbox o\b/, 'relay promote: does not walk inbox_open_idx');

# the replay of one row probes inbox_pkey; the filters still find their rows
like($plan{replay_select}, qr/Index Scan using inbox_pkey on inbox i\b/, 'replay select: one row by its id')
  or diag($plan{replay_select});
my ($one_rows) = $out =~ /^---- one\n(.*?)^---- filter$/ms;
like($one_rows, qr/^\d+\|src\|\n\z/, 'replay select: the one row') or diag($one_rows);
my ($filtered) = $out =~ /^---- filter\n(.*?)^---- done$/ms;
my @ids = map { (split /\|/)[0] } split /\n/, $filtered;
is(scalar(@ids), 50, 'replay select by filter: the 50 processing rows of the source');
is(join(',', @ids), join(',', sort { $a <=> $b } @ids), 'replay select by filter: in created_at, id order');

done_testing();
