# Two ends at once (docs/design/claim.md): a row parked behind two rows in
# flight, whose ends two transactions settle at the same time.  Each
# promotion used to see the other's row still open, and the parked row
# waited for worker 0's sweep (up to 30 s); a reviewer found it with a
# fan-out row (not routed yet while a worker routes it, claimed whatever
# its key's order) in flight beside the row before it at its destination.
# Now, after the promotion of a row that had no destination when claimed,
# QB_PG_OUTBOX_PROMOTE_PAST releases a parked row unclaimed when a row in
# flight before it is being ended by another transaction (its lock held),
# for the claim to check its order again, and locks FOR SHARE the rows in
# flight that nobody is ending, so their ends come after its commit.
#
# The workers' own statements (QB_PG_OUTBOX_SETTLE, QB_PG_OUTBOX_PROMOTE,
# QB_PG_OUTBOX_PROMOTE_PAST, from qb_sql_pg.h) run step by step in two
# sessions, as the stores run them, with no worker
# running: P (at E) and U (a fan-out row, not routed) in flight, C parked
# behind both at E.  Rows are counted before and after each case.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use QueueBoxTest;

my $node = qb_node('twoends', workers => 0);
my $settle = qb_pg_statement('QB_PG_OUTBOX_SETTLE');
my $promote = qb_pg_statement('QB_PG_OUTBOX_PROMOTE');
my $past = qb_pg_statement('QB_PG_OUTBOX_PROMOTE_PAST');
my ($aa, $bb) = ('00000000-0000-0000-0000-0000000000aa', '00000000-0000-0000-0000-0000000000bb');

# one session of a worker: the two statements prepared, and its pid
sub worker_session
{
	my $s = $node->background_psql('postgres');
	$s->query_safe("PREPARE settle(uuid[], bigint[], text[], int[], bigint[], text[], text[], bool[]) AS $settle");
	$s->query_safe("PREPARE prom(text[], uuid, bigint, int, bigint, text[]) AS $promote");
	$s->query_safe("PREPARE past(text[]) AS $past");
	$s->{pid} = $s->query_safe('SELECT pg_backend_pid()') =~ s/\s+//gr;
	return $s;
}
my ($s1, $s2) = (worker_session(), worker_session());

# settle row ID (outcome, destination, not routed at its claim) under TOKEN
sub settle_sql
{
	my ($token, $id, $outcome, $dest, $unrouted) = @_;
	my $delay = $outcome eq 'retry' ? 60000 : 0;
	return "EXECUTE settle(ARRAY['$token']::uuid[], ARRAY[$id]::bigint[], ARRAY['$outcome'],"
	  . " ARRAY[1], ARRAY[$delay]::bigint[], ARRAY[NULL]::text[], ARRAY['$dest'], ARRAY[$unrouted])";
}
# the promotion of key k after a row at DEST ('NULL': it had none, and the
# release past rows in flight follows, as the stores run them), claiming
# with TOKEN
sub promote_sql
{
	my ($token, $dest) = @_;
	return "EXECUTE prom(ARRAY['k'], '$token', 60000, 10, 0, ARRAY['$dest'])" if $dest ne 'NULL';
	return "EXECUTE prom(ARRAY['k'], '$token', 60000, 10, 0, ARRAY[NULL::text]); EXECUTE past(ARRAY['k'])";
}

# S starts SQL without waiting for its end (it may wait for a lock the
# other session holds; its output is read with S's next query)
sub started
{
	my ($s, $sql) = @_;
	$s->query_until(qr/started/, "\\echo started\n$sql;\n");
}
# S runs SQL and waits for a lock: returns once the server says it waits
sub blocked
{
	my ($s, $sql, $what) = @_;
	started($s, $sql);
	ok($node->poll_query_until('postgres',
			"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $s->{pid}"),
		"$what waits for the other transaction");
}

# P (at E), U (fan-out, not routed: origin = its id) and, per @more, more
# rows; then C at E, parked at insert; one claim takes P and U (and the
# other fan-out rows).  Returns C's id.
sub scenario
{
	my (@more) = @_;
	$node->safe_psql('postgres', 'TRUNCATE queuebox.outbox RESTART IDENTITY');
	$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, key, payload, destination) VALUES ('e', 'k', '"P"', 'E')});
	# a fan-out row as the route trigger marks it, origin = its id (ids
	# count from 1 here): the trigger does not park it
	my $id = 1;
	for my $name ('U', @more)
	{
		$id++;
		$node->safe_psql('postgres', qq{INSERT INTO queuebox.outbox (topic, key, payload, origin)
			VALUES ('fan', 'k', '"$name"', $id)});
	}
	my $c = $node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, key, payload, destination)
		VALUES ('e', 'k', '"C"', 'E') RETURNING id});
	$node->safe_psql('postgres', qq{SELECT count(*) FROM queuebox._outbox_claim(10, 60000, 10, '$aa',
		0, ARRAY['E'], ARRAY[10], ARRAY[]::text[], ARRAY[0]::bigint[])});
	is(row($c), 'pending|E|key|', 'C is parked behind P and U, which are in flight');
	is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE state = 'processing'"),
		1 + @more + 1, 'P and the fan-out rows are claimed');
	return $c;
}
sub row
{
	my ($id) = @_;
	return $node->safe_psql('postgres', qq{SELECT state, destination, coalesce(hold, ''),
		CASE claim_token WHEN '$aa' THEN 'aa' WHEN '$bb' THEN 'bb' ELSE '' END
		FROM queuebox.outbox WHERE id = $id});
}
# the claim after both: C is taken when nothing holds it back
sub claim
{
	$node->safe_psql('postgres', qq{SELECT count(*) FROM queuebox._outbox_claim(10, 60000, 10,
		'00000000-0000-0000-0000-0000000000cc', 0, ARRAY['E'], ARRAY[10], ARRAY[]::text[], ARRAY[0]::bigint[])});
}

# ---- both settled, then both promotions: each sees the other's row in
# flight.  U's release past rows in flight finds P's lock held (P's settle)
# and releases C, unclaimed, whichever promotion runs first.
for my $first (1, 2)
{
	my $c = scenario();
	$s1->query_safe('BEGIN');
	$s1->query_safe(settle_sql($aa, 1, 'sent', 'E', 'false'));
	$s2->query_safe('BEGIN');
	$s2->query_safe(settle_sql($aa, 2, 'route', 'D', 'true'));
	my ($a, $b) = $first == 1 ? ($s1, $s2) : ($s2, $s1);
	$a->query_safe(promote_sql($first == 1 ? ($aa, 'E') : ($bb, 'NULL')));
	$b->query_safe(promote_sql($first == 1 ? ($bb, 'NULL') : ($aa, 'E')));
	$a->query_safe('COMMIT');
	$b->query_safe('COMMIT');
	is(row($c), 'pending|E||', "at once, promotion $first first: C is released, not claimed (its order is checked again)");
	is(row(1) . ' ' . row(2), 'sent|E|| pending|D||', "at once, promotion $first first: P sent, U routed to D");
	claim();
	is(row($c), 'processing|E||', "at once, promotion $first first: the next claim takes C");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.outbox'), 3, "at once, promotion $first first: 3 rows before, 3 after");
}

# ---- P retried while U is routed: C is released to be checked again, and
# the claim parks it behind P (still open at E), never sends it first
{
	my $c = scenario();
	$s1->query_safe('BEGIN');
	$s1->query_safe(settle_sql($aa, 1, 'retry', 'E', 'false'));
	$s2->query_safe('BEGIN');
	$s2->query_safe(settle_sql($aa, 2, 'route', 'D', 'true'));
	$s2->query_safe(promote_sql($bb, 'NULL'));
	$s1->query_safe(promote_sql($aa, 'E'));
	$s2->query_safe('COMMIT');
	$s1->query_safe('COMMIT');
	is(row(1), 'pending|E||', 'retry: P waits for its next attempt');
	is(row($c), 'pending|E||', 'retry: C is released, not claimed');
	claim();
	is(row($c), 'pending|E|key|', 'retry: the claim parks C behind P again');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.outbox'), 3, 'retry: 3 rows before, 3 after');
}

# ---- one after the other: U's promotion finds P in flight and nobody
# ending it, so it leaves C parked and holds P's lock: P's settle waits for
# that commit, and its promotion then claims C at once
{
	my $c = scenario();
	$s2->query_safe('BEGIN');
	$s2->query_safe(settle_sql($aa, 2, 'route', 'D', 'true'));
	$s2->query_safe(promote_sql($bb, 'NULL'));
	is(row($c), 'pending|E|key|', 'in turn: U\'s promotion leaves C parked (P is in flight)');
	$s1->query_safe('BEGIN');
	blocked($s1, settle_sql($aa, 1, 'sent', 'E', 'false'), "in turn: P's settle");
	$s2->query_safe('COMMIT');
	$s1->query_safe(promote_sql($aa, 'E'));
	$s1->query_safe('COMMIT');
	is(row($c), 'processing|E||aa', "in turn: P's promotion claims C at once");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.outbox'), 3, 'in turn: 3 rows before, 3 after');
}

# ---- two fan-out rows in flight, U and V, routed at once: C is released
{
	my $c = scenario('V');
	$s1->query_safe('BEGIN');
	$s1->query_safe(settle_sql($aa, 1, 'sent', 'E', 'false'));
	$s1->query_safe('COMMIT');
	is(row($c), 'pending|E|key|', 'two fan-out rows: C waits for U and V');
	$s1->query_safe('BEGIN');
	$s1->query_safe(settle_sql($aa, 2, 'route', 'D', 'true'));
	$s2->query_safe('BEGIN');
	$s2->query_safe(settle_sql($aa, 3, 'route', 'D', 'true'));
	$s1->query_safe(promote_sql($aa, 'NULL'));
	started($s2, promote_sql($bb, 'NULL'));
	$s1->query_safe('COMMIT');
	$s2->query_safe('COMMIT');
	is(row($c), 'pending|E||', 'two fan-out rows: C is released, not claimed');
	claim();
	is(row($c), 'processing|E||', 'two fan-out rows: the next claim takes C');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.outbox'), 4, 'two fan-out rows: 4 rows before, 4 after');
}

$s1->quit;
$s2->quit;
$node->stop;
done_testing();
