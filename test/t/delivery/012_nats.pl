# 012_nats.pl
#   The NATS destination against a real nats-server -js: JetStream delivery
#   with the subject template, payload, headers and Nats-Msg-Id; per-key
#   order while a subject has no stream yet; no stream -> retried, then dead
#   with a last_error that says how to fix it, and docs/delivery.md's bash
#   request creates the stream the retried rows land in; createStream: true
#   makes a missing stream (or goes on with one of that name that exists
#   with other settings) and the rows are delivered; a server restart in the
#   middle of a run loses nothing (dedup by Nats-Msg-Id); SIGHUP and SIGTERM
#   still reach the worker while its NATS connection (and cnats's threads)
#   are up; the header rule on NATS (a null, a number, the message id's
#   names, Nats-*, a bad name's row dead).
use strict;
use warnings;

use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxNats;

my $nats = nats_start(name => 'js');
my $node = qb_node('nats', workers => 1);

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

nats_add_stream($nats, 'QB', 'qb.>');
qb_configure(
	$node,
	qb_config_yaml(
		destinations => {
			js => { type => 'nats', url => $nats->{url}, subject => 'qb.{{ topic }}' },
			keyed => { type => 'nats', url => $nats->{url}, subject => 'keyed.{{ key }}' },
			nostream => { type => 'nats', url => $nats->{url}, subject => 'nostream.{{ topic }}' },
			made => { type => 'nats', url => $nats->{url}, subject => 'made.{{ topic }}', createStream => 'true' },
			pre => { type => 'nats', url => $nats->{url}, subject => 'pre.{{ topic }}', createStream => 'true' },
		},
		routes => [
			{ topicPattern => 'orders.**', destination => 'js' },
			{ topicPattern => 'keyed.**', destination => 'keyed' },
			{ topicPattern => 'lost.**', destination => 'nostream' },
			{ topicPattern => 'made.**', destination => 'made' },
			{ topicPattern => 'pre.**', destination => 'pre' },
		]));

sub rows
{
	my ($where) = @_;
	return [ map { [ split /\|/, $_, 6 ] } split /\n/, $node->safe_psql('postgres', qq{
		SELECT message_id, state, attempt, coalesce(key, ''), payload::text, coalesce(last_error, '')
		FROM queuebox.outbox WHERE $where ORDER BY id}) ];
}

# ---- delivery: subject from the template, payload, headers, Nats-Msg-Id
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, headers)
	SELECT 'orders.created', 'o' || i, jsonb_build_object('i', i, 'name', 'caf' || chr(233)),
		   jsonb_build_object('X-Trace', 't' || i, 'X-Num', i)
	FROM generate_series(1, 3) i});
is(qb_outbox_count($node), '3', '3 rows inserted');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'", '3',
	'the 3 rows are sent', timeout => 60);
my $msgs = nats_dump($nats, 'QB');
is(scalar @$msgs, 3, 'stream QB holds 3 messages');
my %by_mid = map { $_->{headers}{'Nats-Msg-Id'} => $_ } @$msgs;
for my $r (@{ rows("topic = 'orders.created'") })
{
	my ($mid, $state, $attempt, $key, $payload) = @$r;
	my $m = $by_mid{$mid};
	ok($m, "row $key: a message with Nats-Msg-Id = its message_id") or next;
	is($m->{subject}, 'qb.orders.created', "row $key: subject rendered from qb.{{ topic }}");
	# data is text already (the tool's JSON line was decoded); payload is bytes
	is_deeply(JSON::PP->new->decode($m->{data}), decode_json($payload), "row $key: payload");
	my ($i) = $key =~ /(\d+)/;
	is($m->{headers}{'X-Trace'}, "t$i", "row $key: string header");
	is($m->{headers}{'X-Num'}, $i, "row $key: number header as JSON text");
	is($attempt, '1', "row $key: sent on attempt 1");
}

# ---- the header rule (docs/delivery.md, "Row headers"): a null header is
# left out, a number goes as its JSON text, a row header named like
# QueueBox's message id (any of its names) is left out, and so is any Nats-*
# name (JetStream's controls: it refuses a message whose Nats-Expected-Stream
# names another stream); a name NATS cannot carry makes the row dead
# at once, nothing published; rows counted before and after
my %rule_before = map { $_ => qb_count($node, "state = '$_'") } qw(sent dead);
my $rule_total = qb_outbox_count($node);
my $rule_qb = nats_count($nats, 'QB');
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, headers) VALUES
	('orders.rule', 'rule', '{"case": "rule"}',
	 '{"X-Null": null, "X-Count": 5, "Nats-Msg-Id": "forged", "X-Message-Id": "forged", "Nats-Expected-Stream": "elsewhere"}'),
	('orders.rule', 'rule-bad', '{"case": "bad"}', '{"X-Fine": "ok", "Bad Name": "v"}')});
qb_wait_query($node, q{
		SELECT string_agg(key || ':' || state || ':' || attempt, ',' ORDER BY id)
		FROM queuebox.outbox WHERE topic = 'orders.rule'},
	'rule:sent:1,rule-bad:dead:0',
	'header rule: the row is sent; the row with a bad header name is dead, no attempt counted', timeout => 60);
my ($rule_row, $rule_bad) = @{ rows("topic = 'orders.rule'") };
my ($rule_msg) = grep { $_->{subject} eq 'qb.orders.rule' } @{ nats_dump($nats, 'QB') };
is_deeply(($rule_msg // {})->{headers}, { 'X-Count' => '5', 'Nats-Msg-Id' => $rule_row->[0] },
	'header rule: the null, the message id\'s names and Nats-* are left out, the number is its JSON text');
like($rule_bad->[5],
	qr/^row header "Bad Name" is not a valid NATS header \(.*\), so the row cannot be sent on NATS; remove or fix it in the row's headers, then requeue the row/,
	'header rule: the dead row\'s last_error names the header, the transport and what to do');
is(nats_count($nats, 'QB'), $rule_qb + 1, 'header rule: one message more in the stream, none for the dead row');
is(qb_count($node, "state = 'sent'"), $rule_before{sent} + 1, 'header rule: rows counted after: one more sent');
is(qb_count($node, "state = 'dead'"), $rule_before{dead} + 1, 'header rule: rows counted after: one more dead');
is(qb_outbox_count($node), $rule_total + 2, 'header rule: rows counted after: two more in all');

# ---- createStream: the missing stream is made before the first publish
is(nats_count($nats, 'queuebox-made'), undef, 'createStream: no stream queuebox-made before the first row');
my $n0 = qb_outbox_count($node);
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload)
	SELECT 'made.evt', 'm' || i, jsonb_build_object('i', i) FROM generate_series(1, 5) i});
is(qb_outbox_count($node), $n0 + 5, 'createStream: 5 rows inserted');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'made.evt' AND state = 'sent'", '5',
	'createStream: the 5 rows are sent', timeout => 60);
is(qb_count($node, "topic = 'made.evt' AND attempt = 1"), '5', 'createStream: each sent on its first attempt');
is(nats_count($nats, 'queuebox-made'), 5, 'createStream: stream queuebox-made holds the 5 messages');
is_deeply(nats_stream($nats, 'queuebox-made'),
	{ subjects => ['made.>'], retention => 'limits', storage => 'file',
	  description => 'made by QueueBox for destination made (createStream: true)' },
	'createStream: the stream captures made.> (the literal part of made.{{ topic }}), limits, file');

# the stream deleted under a running link: the next publish is answered "no
# stream", and the stream is made again before the retry
nats_delete_stream($nats, 'queuebox-made');
$n0 = qb_outbox_count($node);
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, max_attempts) VALUES ('made.again', 'm1', '{"again": true}', 1000)});
is(qb_outbox_count($node), $n0 + 1, 'createStream, stream deleted: one row inserted');
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'made.again'", 'sent',
	'createStream, stream deleted: the row is sent', timeout => 60);
my ($again_attempt, $again_error) = split /\|/, $node->safe_psql('postgres',
	"SELECT attempt, coalesce(last_error, '') FROM queuebox.outbox WHERE topic = 'made.again'");
is($again_attempt, '2', 'createStream, stream deleted: sent on the retry');
like($again_error,
	qr/no JetStream stream captures subject made\.made\.again; createStream: stream queuebox-made \(subjects made\.>\) is made before the next attempt/,
	'createStream, stream deleted: the failed attempt said the stream is made again');
is(nats_count($nats, 'queuebox-made'), 1, 'createStream, stream deleted: the new stream holds the row');

# a stream of that name with other settings (as a replica that won a race
# with other code, or an operator, left it): kept as it is, and used
nats_add_stream($nats, 'queuebox-pre', 'pre.>', { dup_window_ms => 300000 });
$n0 = qb_outbox_count($node);
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, payload) SELECT 'pre.evt', jsonb_build_object('i', i) FROM generate_series(1, 3) i});
is(qb_outbox_count($node), $n0 + 3, 'createStream, stream exists: 3 rows inserted');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'pre.evt' AND state = 'sent'", '3',
	'createStream, stream exists: the 3 rows are sent into it', timeout => 60);
is(nats_count($nats, 'queuebox-pre'), 3, 'createStream, stream exists: queuebox-pre holds the 3 messages');
is(qb_outbox_count($node), $n0 + 3, 'createStream: no row lost or added');

# ---- no stream captures the subject: retried, then dead, saying how to fix it
my $before = qb_outbox_count($node);
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, payload, max_attempts) VALUES ('lost.x', '{"case": "lost"}', 3)});
is(qb_outbox_count($node), $before + 1, 'one row for a subject without a stream');
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'lost.x'", 'dead',
	'no stream: the row goes dead after its attempts', timeout => 90);
my ($lost) = @{ rows("topic = 'lost.x'") };
is($lost->[2], '3', 'no stream: dead on attempt 3 (retried, not dead at once)');
like($lost->[5],
	qr/no JetStream stream captures subject nostream\.lost\.x; set createStream: true on the destination, or create a stream for it with a NATS client or a \$JS\.API\.STREAM\.CREATE request \(docs\/delivery\.md, "Creating the stream"\), or set jetstream: false/,
	'no stream: last_error names the subject and the fixes');
like($lost->[5], qr/none remain/, 'no stream: last_error says no attempt remains');
diag "no stream, last_error: $lost->[5]";

# ---- per-key order while deliveries fail: no stream at first, then one
$before = qb_outbox_count($node);
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, max_attempts)
	SELECT 'keyed.evt', 'k' || k, jsonb_build_object('k', k, 'seq', s), 1000
	FROM generate_series(1, 5) s, generate_series(1, 3) k ORDER BY s, k});
is(qb_outbox_count($node), $before + 15, '15 keyed rows inserted (3 keys x 5)');
qb_wait_query($node, q{
	SELECT count(*) > 0 FROM queuebox.outbox
	WHERE topic = 'keyed.evt' AND attempt >= 2 AND last_error LIKE '%no JetStream stream captures subject keyed.k%'},
	't', 'keyed rows are retried while no stream captures keyed.>', timeout => 60);
is(qb_count($node, "topic = 'keyed.evt' AND state = 'sent'"), '0', 'no keyed row was sent without a stream');
# the stream is made by docs/delivery.md's request (bash alone, no nats CLI)
my ($recipe) = slurp_file("$FindBin::RealBin/../../../docs/delivery.md")
  =~ /<!-- docs-test: nats-stream-create .*?-->\n```sh\n(.*?)```/s;
ok($recipe, 'docs/delivery.md has the stream-create request');
$recipe =~ s{127\.0\.0\.1/4222}{127.0.0.1/$nats->{port}}g;
$recipe =~ s/ORDERS/KEYED/g;
$recipe =~ s/orders\.>/keyed.>/g;
my ($out, $err) = ('', '');
IPC::Run::run([ 'bash', '-e', '-c', $recipe ], '<', \undef, '>', \$out, '2>', \$err);
is($? >> 8, 0, 'the docs request ran') or diag "stderr: $err";
like($out, qr/"did_create":true/, 'the docs request: the server created stream KEYED');
is_deeply(nats_stream($nats, 'KEYED')->{subjects}, ['keyed.>'], 'the docs request: KEYED captures keyed.>');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'keyed.evt' AND state = 'sent'",
	'15', 'once the stream exists every keyed row is sent', timeout => 90);
$msgs = nats_dump($nats, 'KEYED');
is(scalar @$msgs, 15, 'stream KEYED holds 15 messages (no duplicates)');
for my $k (1 .. 3)
{
	my @seq = map { JSON::PP->new->decode($_->{data})->{seq} } grep { $_->{subject} eq "keyed.k$k" } @$msgs;
	is(join(',', @seq), '1,2,3,4,5', "key k$k: its 5 messages arrived in order");
}

# ---- nats-server stopped mid-run, restarted on the same store: nothing lost
$before = qb_outbox_count($node);
my $qb_before = nats_count($nats, 'QB');
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, max_attempts)
	SELECT 'orders.bulk', 'b' || (i % 7), jsonb_build_object('i', i), 1000 FROM generate_series(1, 100) i});
qb_wait_query($node, "SELECT count(*) > 0 FROM queuebox.outbox WHERE topic = 'orders.bulk' AND state = 'sent'",
	't', 'restart: the first bulk rows are being sent', timeout => 60);
nats_stop($nats);
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload, max_attempts)
	SELECT 'orders.bulk', 'b' || (i % 7), jsonb_build_object('i', i), 1000 FROM generate_series(101, 200) i});
is(qb_outbox_count($node), $before + 200, 'restart: 200 bulk rows inserted');
qb_wait_query($node, q{
	SELECT count(*) > 0 FROM queuebox.outbox
	WHERE topic = 'orders.bulk' AND state <> 'sent' AND attempt >= 1 AND last_error IS NOT NULL},
	't', 'restart: with the server down, rows fail and wait for a retry', timeout => 60);
diag 'server down, a last_error: '
  . $node->safe_psql('postgres', "SELECT last_error FROM queuebox.outbox WHERE topic = 'orders.bulk' AND last_error IS NOT NULL LIMIT 1");
$nats = nats_start(again => $nats);
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.bulk' AND state = 'sent'",
	'200', 'restart: every bulk row is sent after the server is back', timeout => 120);
is(qb_count($node, "state = 'dead' AND topic NOT IN ('lost.x', 'orders.rule')"), '0', 'restart: no row went dead');
$msgs = nats_dump($nats, 'QB');
my @bulk = grep { $_->{subject} eq 'qb.orders.bulk' } @$msgs;
my %mids = map { $_->{headers}{'Nats-Msg-Id'} => 1 } @bulk;
is(scalar @bulk, 200, 'restart: the stream holds exactly 200 bulk messages (retries deduplicated)');
is(scalar keys %mids, 200, 'restart: 200 distinct Nats-Msg-Id');
is(join(',', sort keys %mids),
	join(',', sort map { $_->[0] } @{ rows("topic = 'orders.bulk'") }),
	'restart: the Nats-Msg-Ids are the rows\' message_ids');
is(nats_count($nats, 'QB'), $qb_before + 200, 'restart: the earlier messages survived the restart');

# ---- signals reach the worker while its NATS connection is open
my @pids = qb_worker_pids($node);
is(scalar @pids, 1, 'one outbox worker');
my $pid = $pids[0];
my ($nthreads, @unmasked) = nats_thread_masks($pid);
cmp_ok($nthreads, '>=', 3, 'the worker runs cnats threads (its NATS connection is open)');
is("@unmasked", '', 'every cnats thread blocks SIGHUP, SIGINT, SIGUSR1, SIGTERM and SIGURG');

# SIGHUP to the worker alone (ALTER SYSTEM reloads nobody by itself): only
# a worker that re-read its configuration logs at DEBUG5 (its transactions).
my $off = -s $node->logfile;
$node->safe_psql('postgres', "ALTER SYSTEM SET log_min_messages = 'debug5'");
kill 'HUP', $pid;
my $log = qb_wait_log($node, qr/\[$pid\] DEBUG:/, $off, timeout => 30);
like($log, qr/\[$pid\] DEBUG:/, 'SIGHUP: the worker reloaded its configuration (it now logs at DEBUG5)');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET log_min_messages');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');

# SIGTERM: the worker stops at once and the launcher starts another.
$off = -s $node->logfile;
kill 'TERM', $pid;
qb_wait_for(sub { !kill(0, $pid) }, 'SIGTERM: the worker process exits', timeout => 30);
$log = qb_wait_log($node, qr/\[$pid\].*queuebox outbox \d+ stopped/, $off, timeout => 30);
like($log, qr/\[$pid\].*queuebox outbox \d+ stopped/, 'SIGTERM: the worker logged "stopped"');
qb_wait_for(sub { my @p = qb_worker_pids($node); @p == 1 && $p[0] != $pid },
	'SIGTERM: the launcher started a new outbox worker', timeout => 60);

# the new worker publishes to NATS again
$before = qb_outbox_count($node);
$node->safe_psql('postgres',
	q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.after', '{"after": true}')});
is(qb_outbox_count($node), $before + 1, 'one more row after the restart');
qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE topic = 'orders.after'", 'sent',
	'the new worker delivers to NATS', timeout => 60);
is(scalar(grep { $_->{subject} eq 'qb.orders.after' } @{ nats_dump($nats, 'QB') }), 1,
	'the row after the restart is in the stream once');

is(qb_outbox_count($node), $before + 1, 'row count unchanged at the end');
$node->stop;
nats_stop($nats);
done_testing();
