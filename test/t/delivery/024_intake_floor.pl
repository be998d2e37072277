# The intake floor (docs/design/claim.md): new rows are claimed from where
# the last claim stopped, so rows that commit late must still be delivered:
# an insert that got its id before a claim passed it and committed after,
# a prepared transaction (COMMIT PREPARED runs no callback of ours), rows
# inserted while a REPEATABLE READ snapshot is held, and rows parked at
# insert whose transaction stays open across their key's earlier row.  Rows are counted
# before and after each case.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use QueueBoxTest;

my $node = qb_node('floor', conf => "max_prepared_transactions = 4\n");
my $sink = qb_sink_start(name => 'floor');

qb_configure($node,
	qb_config_yaml(
		destinations => { s => { type => 'http', baseUrl => $sink->{url}, path => '/e' } },
		routes => [ { topicPattern => '**', destination => 's' } ]));

my $sent = sub {
	my ($topic) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.outbox WHERE topic = '$topic' AND state = 'sent'");
};

# The workers log each report at debug level ("commits reported new rows
# above id N"): a wrong report is otherwise seen only as a longer wait (the
# read from the start every second finds what it missed).
$node->safe_psql('postgres', "ALTER SYSTEM SET log_min_messages = 'debug1'");
$node->reload;
my $reported = sub {
	my ($after, $offset, $name) = @_;
	ok($node->wait_for_log(qr/commits reported new rows above id \Q$after\E\b/, $offset), $name);
};

# ---- a late commit: its id is below rows claimed before it committed
my $offset = -s $node->logfile;
my $late = $node->background_psql('postgres');
$late->query_safe(q{BEGIN; INSERT INTO queuebox.outbox (topic, payload) VALUES ('late', '{"n": 0}')});
my $late_id = $late->query_safe(q{SELECT max(id) FROM queuebox.outbox WHERE topic = 'late'});
$late_id =~ s/\s+//g;
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, key, payload)
	SELECT 'early', 'e' || (g % 10), jsonb_build_object('n', g) FROM generate_series(1, 200) g});
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'early' AND state = 'sent'",
	200, 'the 200 rows inserted after it are sent (the claims passed its id)');
cmp_ok($node->safe_psql('postgres', "SELECT min(id) FROM queuebox.outbox WHERE topic = 'early'"),
	'>', $late_id, 'their ids are above the open transaction\'s row');
$late->query_safe('COMMIT');
$late->quit;
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'late'", 'sent',
	'the row that committed late is sent');
is(scalar(grep { $_->{body} =~ /"n": 0/ } @{ qb_sink_requests($sink) }), 1,
	'and it reached the sink once');
$reported->($late_id - 1, $offset, 'its commit reported its id to the workers');

# ---- a late commit of a row with an id of its own (OVERRIDING SYSTEM
# VALUE), below the sequence's value when its statement began: the report
# is the row's id, not the sequence's
$offset = -s $node->logfile;
my $count0 = qb_outbox_count($node);
my $gap = $node->safe_psql('postgres', "SELECT nextval('queuebox.outbox_id_seq')");
$node->safe_psql('postgres', "SELECT nextval('queuebox.outbox_id_seq')");
my $own = $node->background_psql('postgres');
$own->query_safe(qq{BEGIN; INSERT INTO queuebox.outbox (id, topic, payload) OVERRIDING SYSTEM VALUE
	VALUES ($gap, 'own-id', '{"n": 0}')});
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload)
	SELECT 'own-after', jsonb_build_object('n', g) FROM generate_series(1, 50) g});
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'own-after' AND state = 'sent'",
	50, 'own id: the 50 rows inserted after it are sent');
$own->query_safe('COMMIT');
$own->quit;
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE id = $gap", 'sent',
	'own id: the row that committed late is sent');
$reported->($gap - 1, $offset, 'own id: its commit reported the id below its own');
is(qb_outbox_count($node), $count0 + 51, 'own id: no row appeared or vanished');

# ---- the route trigger disabled: the statement trigger cannot know the
# rows' ids, and reports "from the start"
$offset = -s $node->logfile;
$count0 = qb_outbox_count($node);
$node->safe_psql('postgres', 'ALTER TABLE queuebox.outbox DISABLE TRIGGER outbox_route');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('unrouted', '{"n": 0}')});
$node->safe_psql('postgres', 'ALTER TABLE queuebox.outbox ENABLE TRIGGER outbox_route');
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'unrouted'", 'sent',
	'route trigger disabled: the row is sent (the claim routes it)');
$reported->(0, $offset, 'route trigger disabled: its commit reported "from the start"');
is(qb_outbox_count($node), $count0 + 1, 'route trigger disabled: one row more');

# ---- a commit whose rows were all parked reports nothing: the next
# report (an unkeyed row's) is that row's own
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, key, payload)
	VALUES ('quiet', 'q', '{"n": 1, "_sink": {"delay_ms": 2000}}')});
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'quiet' AND payload->>'n' = '1'",
	'processing', 'all parked: the key\'s first row is in flight');
$offset = -s $node->logfile;
my $parked_id = $node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, key, payload)
	VALUES ('quiet', 'q', '{"n": 2}') RETURNING id});
is($node->safe_psql('postgres', "SELECT hold FROM queuebox.outbox WHERE id = $parked_id"), 'key',
	'all parked: the second row went in parked');
my $marker = $node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload)
	VALUES ('quiet-marker', '{"n": 3}') RETURNING id});
$reported->($marker - 1, $offset, 'all parked: the next report is the unkeyed row\'s');
my $log = slurp_file($node->logfile, $offset);
unlike($log, qr/commits reported new rows above id \Q@{[$parked_id - 1]}\E\b/,
	'all parked: the parked row\'s commit reported nothing');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic LIKE 'quiet%' AND state = 'sent'",
	3, 'all parked: the three rows are sent');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET log_min_messages');
$node->reload;

# ---- a prepared transaction's rows
$node->safe_psql('postgres', q{BEGIN;
	INSERT INTO queuebox.outbox (topic, payload) SELECT 'prepared', jsonb_build_object('n', g) FROM generate_series(1, 5) g;
	PREPARE TRANSACTION 'qb_floor'});
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload)
	SELECT 'after', jsonb_build_object('n', g) FROM generate_series(1, 50) g});
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'after' AND state = 'sent'",
	50, 'rows inserted after the PREPARE are sent');
$node->safe_psql('postgres', q{COMMIT PREPARED 'qb_floor'});
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'prepared' AND state = 'sent'",
	5, 'the prepared transaction\'s 5 rows are sent after COMMIT PREPARED (no commit callback: the full read finds them)');

# ---- a held snapshot: a REPEATABLE READ reader open from before the rows
my $before = qb_outbox_count($node);
my $reader = $node->background_psql('postgres');
$reader->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
my $seen = $reader->query_safe('SELECT count(*) FROM queuebox.outbox');
$seen =~ s/\s+//g;
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, key, payload)
	SELECT 'held', 'h' || (g % 100), jsonb_build_object('n', g) FROM generate_series(1, 3000) g});
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'held' AND state = 'sent'",
	3000, 'the 3000 rows inserted under a held snapshot are sent', timeout => 120);
my $still = $reader->query_safe('SELECT count(*) FROM queuebox.outbox');
$still =~ s/\s+//g;
is($still, $seen, 'the reader\'s snapshot was held the whole time (it still sees the old count)');
$reader->query_safe('COMMIT');
$reader->quit;
is(qb_outbox_count($node), $before + 3000, 'no row appeared or vanished');
is($node->safe_psql('postgres', "SELECT count(*) FROM queuebox.outbox WHERE state <> 'sent'"),
	'0', 'every row of the test is sent');
my $o = qb_key_order($node, $sink, "topic = 'held'");
is($o->{delivered}, 3000, 'the sink has every held-snapshot row');
is($o->{keys_in_order}, $o->{keys}, 'each key\'s rows reached the sink in id order')
  or diag(explain($o->{bad}));

# ---- parked at insert (claim.md, "Parked at insert"): a row whose key's
# earlier row is in flight goes in parked; its transaction stays open across
# that row's settle, which cannot see it.  Committed after the settle: its
# PRE_COMMIT finds the earlier row ended and releases it.  Committed while
# the earlier row is in flight: the settle's promotion releases it.  Each
# earlier row is held at the sink for 2 s.
my $parked_case = sub {
	my ($key, $commit_after_settle) = @_;
	$node->safe_psql('postgres', qq{INSERT INTO queuebox.outbox (topic, key, payload)
		VALUES ('parked', '$key', '{"n": 1, "_sink": {"delay_ms": 2000}}')});
	qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'parked' AND key = '$key' AND payload->>'n' = '1'",
		'processing', "$key: the earlier row is in flight");
	my $app = $node->background_psql('postgres');
	$app->query_safe(qq{BEGIN; INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('parked', '$key', '{"n": 2}')});
	my $hold = $app->query_safe(qq{SELECT hold FROM queuebox.outbox WHERE topic = 'parked' AND key = '$key' AND payload->>'n' = '2'});
	$hold =~ s/\s+//g;
	is($hold, 'key', "$key: the new row went in parked behind it");
	if ($commit_after_settle)
	{
		qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'parked' AND key = '$key' AND payload->>'n' = '1'",
			'sent', "$key: the earlier row is sent while the transaction is open");
	}
	$app->query_safe('COMMIT');
	$app->quit;
	qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'parked' AND key = '$key' AND state = 'sent'",
		2, "$key: both rows are sent");
};
$before = qb_outbox_count($node);
$parked_case->('p-after', 1);
$parked_case->('p-during', 0);
is(qb_outbox_count($node), $before + 4, 'no row appeared or vanished');
$o = qb_key_order($node, $sink, "topic = 'parked'");
is($o->{keys_in_order}, $o->{keys}, 'each key\'s two rows reached the sink in id order')
  or diag(explain($o->{bad}));

qb_sink_stop($sink);
$node->stop;
done_testing();
