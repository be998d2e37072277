# The settle's plan (QB_PG_OUTBOX_SETTLE, docs/design/claim.md, "What a
# delivered row costs"): each settled row is found by its id from its row of
# the arrays, one probe of outbox_pkey, however many rows one settle ends.
# Before 2026-12-07 the statement also bounded the rows by "o.id = ANY
# (ids)", and the workers' generic plan read the rows by that array and
# matched every row of the arrays against every row read (a join filter):
# quadratic in the batch, 12 µs a sent row at 100 and 22 at 500
# (bench/RESULTS.md).  The fan-out statement (QB_PG_OUTBOX_FANOUT), which
# copies a cycle's fan-out rows, had the same shape and has the same fix.
# Its case here first stalled: a fan-out row is done at its dispatch, and
# its settle pointed at its slot's token where the slots had been before
# they grew (qb_outbox.c, qbo_gather_done; test_outbox_engine.c has the
# unit case): the cycles failed on the garbage until the leases ran out.
# auto_explain logs the workers' statements (nested, inside their cycle)
# with their row counts; every settle and fan-out must show the probe by id
# and no join filter, and a promotion one seek of outbox_key_open_idx a key
# where the key has one destination.  Rows and requests are counted.
# (Plans made on an empty outbox: TAP 077.)
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use QueueBoxTest;

# auto_explain is contrib: Debian's postgresql-NN has it; a server built from
# source without contrib (scripts/pg-majors.sh) has not, and is skipped so.
my $pkglib = `pg_config --pkglibdir` =~ s/\s+$//r;
plan skip_all => "auto_explain is not installed in $pkglib (build the server's contrib/auto_explain)"
  unless -e "$pkglib/auto_explain.so";

my $node = qb_node('settleplan', conf => <<'EOC');
shared_preload_libraries = 'queuebox, auto_explain'
auto_explain.log_min_duration = 0
auto_explain.log_nested_statements = on
auto_explain.log_analyze = on
auto_explain.log_timing = off
auto_explain.log_buffers = off
EOC
# answers after 20 ms, so a batch's requests end together and one settle
# ends many rows
my $sink = qb_sink_start(name => 'settleplan', delay_ms => 20);
my $copy = qb_sink_start(name => 'settleplan_copy');

qb_configure($node,
	qb_config_yaml(
		destinations => {
			s => { type => 'http', baseUrl => $sink->{url}, path => '/e' },
			c => { type => 'http', baseUrl => $copy->{url}, path => '/c' } },
		routes => [
			{ topicPattern => 'fan', destinations => [qw(s c)] },
			{ topicPattern => '**', destination => 's' } ],
		outbox => { batchSize => 100 }));

my $n = 300;
is($node->safe_psql('postgres', 'SELECT count(*) FROM queuebox.outbox'), 0, 'the outbox is empty before');
my $offset = -s $node->logfile;
$node->safe_psql('postgres', qq{INSERT INTO queuebox.outbox (topic, key, payload)
	SELECT 'plan', 'k' || g, jsonb_build_object('n', g) FROM generate_series(1, $n) g});
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'", $n,
	"all $n rows are sent");
is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE state <> 'sent'"), 0,
	'none is left pending, processing or dead');
is(scalar(grep { $_->{body} =~ /"n": / } @{ qb_sink_requests($sink) }), $n,
	"the sink got $n requests");

# $plans->(OFFSET, QUERY TEXT'S START): the statement's plans in the log
# from OFFSET on (an auto_explain entry is its "duration: ... plan:" line and
# the indented lines after it)
my $plans = sub {
	my ($offset, $text) = @_;
	return grep { /Query Text: \Q$text\E/ } split /\n(?=\S)/, slurp_file($node->logfile, $offset);
};

# $check->(NAME, OFFSET, QUERY TEXT'S START): the statement's plans from
# OFFSET on: several rows at a time, never a join filter, always the probe
# by id
my $check = sub {
	my ($name, $offset, $text) = @_;
	my @p = $plans->($offset, $text);
	my @batched = grep { /Update on outbox o\b[^\n]*\(actual rows=([0-9.]+)/ && $1 >= 2 } @p;
	cmp_ok(scalar(@batched), '>=', 1, "the workers ran the $name on several rows at a time ("
		  . scalar(@p) . ' logged)');
	is(scalar(grep { /Join Filter/ } @p), 0,
		"no $name matches the rows by a join filter (quadratic in the batch)");
	is(scalar(grep { !/Index Cond: \(id = s\.id\)/ } @p), 0,
		"every $name finds each row by its id, one probe of outbox_pkey");
	diag($batched[0] // $p[0] // "no $name was logged") if !Test::More->builder->is_passing;
};
$check->('settle', $offset, 'UPDATE queuebox.outbox o SET state = CASE WHEN s.outcome');

# ---- fan-out rows: each is copied to its second destination at its first
# claim, the cycle's rows in one statement
$offset = -s $node->logfile;
$node->safe_psql('postgres', qq{INSERT INTO queuebox.outbox (topic, key, payload)
	SELECT 'fan', 'f' || g, jsonb_build_object('f', g) FROM generate_series(1, $n) g});
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'fan' AND state = 'sent'",
	2 * $n, "the $n fan-out rows and their $n copies are sent");
is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE state <> 'sent'"), 0,
	'none is left pending, processing or dead')
  or diag($node->safe_psql('postgres', "SELECT state, destination, hold, count(*), min(last_error) FROM queuebox.outbox GROUP BY 1, 2, 3"));
is(scalar(grep { $_->{body} =~ /"f": / } @{ qb_sink_requests($copy) }), $n,
	"the copies' sink got $n requests");
$check->('fan-out', $offset, 'WITH r AS (   UPDATE queuebox.outbox o SET origin = o.id');

# ---- the promotion (QB_PG_OUTBOX_PROMOTE): 50 keys of 6 rows, one
# destination, so each settle promotes its keys' next rows.  Its first seek
# of outbox_key_open_idx finds the key's first open row wherever it waits;
# the second, at the ended row's destination, runs only when that row is not
# routed or waits elsewhere: with one destination, never (before 2026-12-07
# both ran for every key)
my $keyed = 300;
$offset = -s $node->logfile;
$node->safe_psql('postgres', qq{INSERT INTO queuebox.outbox (topic, key, payload)
	SELECT 'plan', 'p' || (g % 50), jsonb_build_object('p', g) FROM generate_series(1, $keyed) g});
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE payload ? 'p' AND state = 'sent'",
	$keyed, "all $keyed keyed rows are sent");
is(scalar(grep { $_->{body} =~ /"p": / } @{ qb_sink_requests($sink) }), $keyed,
	"the sink got $keyed requests");
my @promotions = grep { /Update on outbox o[^\n]*\(actual rows=[1-9]/ }
  $plans->($offset, 'UPDATE queuebox.outbox o SET state = CASE WHEN $2::uuid IS NOT NULL');
cmp_ok(scalar(@promotions), '>=', 1, 'the workers promoted rows (' . scalar(@promotions) . ' promotions logged)');
my $seek = qr/Index Scan using outbox_key_open_idx on outbox \w+\s+(?:\(cost=[^)]*\)\s+)?\(([^)]*)\)\n\s*Index Cond: \(\(key = k\.key\) AND \(COALESCE\(destination, ''::text\) = k\.dest\)\)/;
is(scalar(grep { !/$seek/ || $1 ne 'never executed' } @promotions), 0,
	"no promotion sought the ended row's destination again (one seek a key)")
  or diag($promotions[0]);

done_testing();
