# 044_crash_takeover.pl
#   Takeover after a crash (issue 24): rows a dead claimer held are claimed
#   again at once, not when their lease ends.  Every lease here is 10
#   minutes (claimTimeoutMs 600000) and every wait is well below it, so a
#   row delivered again after a crash was taken over: the old code leaves
#   it processing for 10 minutes and fails each "every row ends sent".
#   - extension, kill -9 of an outbox worker (the cluster crash-restarts)
#     and kill -9 of the postmaster with its children, mid-delivery over
#     20 keys, 5 of them with a first row the sink holds for 25 s on its
#     first attempt only (so rows under a committed claim are in flight at
#     any kill, however slow the machine, and the takeover's attempt is
#     answered at once): every row sent,
#     none lost, every key in id order, the duplicates no more than the
#     rows the workers could hold;
#   - a claimer that is a plain session (its advisory lock held): its
#     outbox rows and its push inbox rows stay processing while it lives
#     (other rows go through meanwhile), and are taken over when it ends;
#   - a worker's own rows held by the sink over reclaim rounds: sent once;
#   - outbox.takeover: false records no claimer (the lease alone);
#   - the daemon on PostgreSQL, kill -9 of the whole daemon (supervisor and
#     roles together): a new daemon finishes every row at once; its own
#     rows held by the sink over reclaim rounds: sent once.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $LEASE = 600000;
my $BATCH = 20;
my $sink = qb_sink_start(name => 'takeover', delay_ms => 100);

sub conf
{
	my (%o) = @_;
	return qb_config_yaml(
		outbox => { batchSize => $BATCH, claimTimeoutMs => $LEASE, %{ $o{outbox} // {} } },
		inbox => { relay => { claimTimeoutMs => $LEASE } },
		destinations => {
			web => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 30000 } },
		routes => [ { topicPattern => '**', destination => 'web' } ],
		%{ $o{extra} // {} });
}

# load($node, $topic, $prefix): 400 rows over 20 keys, row i with key
# $prefix . (i % 20); the first attempt at the first rows of 5 keys takes
# the sink 25 s (below the 30 s timeout), so whenever the crash comes they
# are processing under a committed claim; the sink answers later attempts
# (its "fail" count is per X-Message-Id) at once
sub load
{
	my ($node, $topic, $prefix) = @_;
	$node->safe_psql('postgres', qq{
		INSERT INTO queuebox.outbox (topic, key, payload)
		SELECT '$topic', '$prefix' || (i % 20),
			   CASE WHEN i < 5 THEN jsonb_build_object('seq', i, '_sink', jsonb_build_object('fail', 1, 'status', 200, 'delay_ms', 25000))
					ELSE jsonb_build_object('seq', i) END
		FROM generate_series(0, 399) i});
	return;
}

# under_way($node, $topic): slow rows are processing, other rows are sent
# and pending.  Returns the rows processing and the slow ones among them
# (all five, nearly always: a claim takes the heads of every key at once;
# the kill is checked against what was in flight, not against five).
sub under_way
{
	my ($node, $topic, $what) = @_;
	qb_wait_query($node, qq{
		SELECT count(*) FILTER (WHERE state = 'processing' AND payload ? '_sink') > 0
		   AND count(*) FILTER (WHERE state = 'sent') > 20
		   AND count(*) FILTER (WHERE state = 'pending') > 0
		FROM queuebox.outbox WHERE topic = '$topic'},
		't', "$what: delivery is under way (rows sent, processing and pending)", timeout => 60)
	  or diag explain { sink => qb_sink_stats($sink) };
	my ($n, $slow) = split /\|/, $node->safe_psql('postgres', qq{
		SELECT count(*), count(*) FILTER (WHERE payload ? '_sink')
		FROM queuebox.outbox WHERE topic = '$topic' AND state = 'processing'});
	return ($n, $slow);
}

# finished($node, $topic, $n, $what, $most_dups, $slow): every row sent well
# before a lease could end, none lost, keys in order, duplicates bounded,
# and at least the $slow slow rows in flight at the kill taken over
sub finished
{
	my ($node, $topic, $n, $what, $most_dups, $slow) = @_;
	qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = '$topic' AND state = 'sent'",
		$n, "$what: every row ends sent, long before a 10-minute lease could end", timeout => 180);
	is(qb_count($node, "topic = '$topic'"), $n, "$what: no row lost ($n rows)");
	cmp_ok($node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.outbox WHERE topic = '$topic' AND last_error LIKE 'taken over:%'"),
		'>=', $slow, "$what: the $slow slow rows in flight at least were taken over (last_error says so), not waited out");
	my $o = qb_key_order($node, $sink, "topic = '$topic'");
	is($o->{delivered}, $n, "$what: the sink answered 2xx for every row");
	is($o->{keys_in_order}, $o->{keys}, "$what: every key in id order") or diag explain $o->{bad};
	cmp_ok($o->{dups}, '<=', $most_dups, "$what: $o->{dups} rows delivered twice, at most the $most_dups the workers could hold");
	return;
}

# own_claims($node, $topic, $what): a worker's own claims in flight outlast
# reclaim rounds untouched (its own lock never stops its own test, so the
# reclaim must leave its claimer out): three rows the sink holds 2.5 s are
# each sent once, none taken over
sub own_claims
{
	my ($node, $topic, $what) = @_;
	$node->safe_psql('postgres', qq{
		INSERT INTO queuebox.outbox (topic, key, payload)
		SELECT '$topic', '$topic' || i, '{"_sink": {"delay_ms": 2500}}' FROM generate_series(1, 3) i});
	qb_wait_query($node, qq{SELECT count(*) FROM queuebox.outbox WHERE topic = '$topic' AND state = 'sent'},
		'3', "$what: the rows held 2.5 s by the sink (two reclaim rounds) are sent");
	my %mine = map { $_ => 1 } split /\n/,
	  $node->safe_psql('postgres', qq{SELECT message_id FROM queuebox.outbox WHERE topic = '$topic'});
	is(scalar(grep { $mine{ $_->{mid} } } @{ qb_sink_requests($sink) }), 3,
		"$what: each sent once (no reclaim round took them back mid-flight)");
	is($node->safe_psql('postgres', qq{SELECT count(*) FROM queuebox.outbox WHERE topic = '$topic' AND last_error IS NOT NULL}),
		'0', "$what: none was taken over");
	return;
}

# ======================================================================
# The extension
# ======================================================================
# claims commit synchronously here: an asynchronous claim lost in the crash
# leaves its row pending, which would let the old code pass too
my $node = qb_node('takeover', conf => "restart_after_crash = on\nqueuebox.worker_async_commit = off\n");
qb_configure($node, conf());

# ---- kill -9 of an outbox worker: the cluster crash-restarts
load($node, 'worker.kill', 'wk');
my ($in_flight, $slow) = under_way($node, 'worker.kill', 'worker kill');
note "worker kill: $in_flight rows processing at the kill, $slow of them slow";
my @pids = qb_worker_pids($node);
is(scalar @pids, 2, 'worker kill: two outbox workers');
qb_kill9_crash($node, $pids[0], 'worker kill');
finished($node, 'worker.kill', 400, 'worker kill', 2 * $BATCH, $slow);

# ---- kill -9 of the postmaster and, as in a machine crash, its children
load($node, 'pm.kill', 'pk');
($in_flight, $slow) = under_way($node, 'pm.kill', 'postmaster kill');
note "postmaster kill: $in_flight rows processing at the kill, $slow of them slow";
my $pm = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
my @children = qb_kill9_postmaster($node);
ok(!grep({ kill(0, $_) } @children), 'postmaster kill: every server process is gone');
$node->start;
isnt($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $pm,
	'postmaster kill: the server runs again (a new postmaster)');
finished($node, 'pm.kill', 400, 'postmaster kill', 2 * $BATCH, $slow);

# ---- a claimer that is a session: alive, its rows wait; gone, taken over
my $claimer = $node->background_psql('postgres');
$claimer->query_safe(q{SELECT pg_advisory_lock(424242)});
$claimer->query_safe(q{
	INSERT INTO queuebox.outbox (topic, key, payload, state, claim_token, lease_until, claimer,
								 destination)
	SELECT 'session.claim', 'sc' || i, jsonb_build_object('i', i), 'processing',
		   gen_random_uuid(), now() + interval '1 hour', 424242, 'web'
	FROM generate_series(1, 5) i});
$claimer->query_safe(q{
	INSERT INTO queuebox.inbox (source, idempotency_key, event_type, payload, consumption, state,
								claim_token, lease_until, claimer)
	SELECT 'hooks', 'sc-' || i, 'hooks.session', jsonb_build_object('i', i), 'push', 'processing',
		   gen_random_uuid(), now() + interval '1 hour', 424242
	FROM generate_series(1, 5) i});
# rows inserted after them go through: the reclaim and the relay ran meanwhile
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, payload) SELECT 'session.other', '{}' FROM generate_series(1, 5);
	INSERT INTO queuebox.inbox (source, idempotency_key, event_type, payload)
	SELECT 'hooks', 'other-' || i, 'hooks.other', '{}' FROM generate_series(1, 5) i});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'session.other' AND state = 'sent'},
	'5', 'session claimer: other outbox rows are sent meanwhile');
qb_wait_query($node, q{SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'other-%' AND state = 'processed'},
	'5', 'session claimer: other push rows are forwarded meanwhile');
# one more reclaim round after those (it runs about once a second)
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('session.other2', '{}')});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'session.other2' AND state = 'sent'},
	'1', 'session claimer: a later row is sent too');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'session.claim' AND state = 'processing'}),
	'5', 'session claimer alive: its outbox rows stay processing');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'sc-%' AND state = 'processing'}),
	'5', 'session claimer alive: its push rows stay processing');
$claimer->quit;
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'session.claim' AND state = 'sent'},
	'5', 'session claimer gone: its outbox rows are taken over and sent (10 minutes before their lease)');
qb_wait_query($node, q{SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'sc-%' AND state = 'processed'},
	'5', 'session claimer gone: its push rows are taken over and forwarded');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE payload->>'i' IS NOT NULL AND headers->>'x-idempotency-key' LIKE 'sc-%'}),
	'5', 'session claimer gone: each push row became one outbox row');

own_claims($node, 'own.slow', 'own claims');

# ---- outbox.takeover: false: claims record no claimer
qb_configure($node, conf(outbox => { takeover => 'false' }));
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.outbox (topic, key, payload)
	SELECT 'off.slow', 'off' || i, '{"_sink": {"delay_ms": 3000}}' FROM generate_series(1, 4) i});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'off.slow' AND state = 'processing'},
	'4', 'takeover off: the slow rows are processing');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'off.slow' AND claimer IS NOT NULL}),
	'0', 'takeover off: the claims record no claimer (only the lease ends them)');
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'off.slow' AND state = 'sent'},
	'4', 'takeover off: the rows are still delivered');
$node->stop;

# ======================================================================
# The daemon on PostgreSQL: kill -9 of the whole daemon
# ======================================================================
my $dnode = qbd_node('takeover_daemon');
my $dconf = conf(extra => {
	database => { url => qbd_url($dnode), connectTimeoutMs => 2000 },
	daemon => { outboxWorkers => 2, shutdownGraceMs => 5000 } });
my $r = qbd_run('--config', qbd_write_conf($dconf, 'migrate'), '--migrate');
is($r->[0], 0, 'daemon: the schema is installed') or diag $r->[2];
my $d = qbd_start($dnode, $dconf, name => 'first');
load($dnode, 'daemon.kill', 'dk');
($in_flight, $slow) = under_way($dnode, 'daemon.kill', 'daemon kill');
note "daemon kill: $in_flight rows processing at the kill, $slow of them slow";
is($dnode->safe_psql('postgres', q{SELECT count(*) FROM queuebox.outbox WHERE state = 'processing' AND claimer IS NULL}),
	'0', 'daemon: its claims record a claimer');
# the supervisor and its roles at once, as the OOM killer or a lost host
# would.  A role that outlived its supervisor for a moment would release
# its rows (PR_SET_PDEATHSIG), and a supervisor that outlived a role would
# start another: the supervisor is stopped first, then every role killed
my $roles = qbd_role_pids($d);
kill 'STOP', $d->{pid};
kill 'KILL', values %$roles;
kill 'KILL', $d->{pid};
qbd_wait_exit($d, 10);
qb_wait_for(sub { !grep { kill(0, $_) } values %$roles }, 'daemon kill: every role process exits with its supervisor');
$d = qbd_start($dnode, $dconf, name => 'second');
finished($dnode, 'daemon.kill', 400, 'daemon kill', 2 * $BATCH, $slow);
own_claims($dnode, 'daemon.own', 'daemon: own claims');
qbd_signal($d, 'TERM');
is(qbd_wait_exit($d, 30), 0, 'daemon: the second daemon stops');
$dnode->stop;

qb_sink_stop($sink);
done_testing();
