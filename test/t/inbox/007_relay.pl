# 007_relay.pl
#   The relay forwards push inbox rows into the outbox and the outbox
#   delivers them: the mapped headers arrive at the sink, one aggregate's
#   messages arrive in created_at order across two push sources, pull rows
#   are never touched, an empty topic sends the row to dead,
#   inbox.relay.enabled: false holds push rows pending, and neither kill -9
#   of the relay nor a server restart loses or duplicates a forward.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP ();

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink = qb_sink_start(name => 'relay');
# PostgreSQL::Test::Cluster turns restart_after_crash off; the kill -9 phase needs it.
my $node = qb_node('relay', conf => 'restart_after_crash = on');

sub config
{
	my ($enabled) = @_;
	my $y = qb_config_yaml(
		# a claim the crash leaves behind comes back after 2 s
		outbox => { batchSize => 20, claimTimeoutMs => 2000 },
		destinations =>
		  { web => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 1800 } },
		routes => [ { topicPattern => 'relay.**', destination => 'web' } ]);
	return $y . <<"EOY";
sources:
  a: { type: http, path: /a, idempotencyKeyPath: \$.id, eventTypePath: \$.type, topic: "relay.{{ source }}.{{ eventType }}" }
  b: { type: http, path: /b, idempotencyKeyPath: \$.id, topic: "relay.{{ source }}" }
  c: { type: http, path: /c, idempotencyKeyPath: \$.id, eventTypePath: \$.type }
  p: { type: http, path: /p, idempotencyKeyPath: \$.id, consumption: pull }
inbox:
  relay: { enabled: $enabled, pollIntervalMs: 50, batchSize: 7, claimTimeoutMs: 1000, maxAttempts: 5 }
EOY
}

sub push_count
{
	my ($where) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM queuebox.inbox WHERE consumption = 'push' AND $where");
}

qb_wait_query($node,
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox relay'",
	'1', 'one relay worker runs', timeout => 30);
qb_configure($node, config('true'));

# ---- phase 1: forward, headers, order, pull rows, empty topics
# 8 aggregates x 6 messages, alternating sources a and b, in one
# transaction; created_at spaced so the order is the seq order.
my @values;
for my $seq (0 .. 5)
{
	for my $agg (0 .. 7)
	{
		my $src = ($seq + $agg) % 2 ? 'a' : 'b';
		my $n = $seq * 8 + $agg;
		push @values, sprintf(
			q{('%s', 'm%d', 'order.updated', 'agg-%d', '{"agg": %d, "seq": %d}', '%s', 'push', now() + %d * interval '1 ms')},
			$src, $n, $agg, $agg, $seq,
			$n % 3 == 0
			? '{"X-Source": "forged", "X-INBOX-ID": "0", "x-correlation-id": "corr-' . $n . '", "X-Custom": "kept"}'
			: '{}',
			$n);
	}
}
push @values,
  q{('p', 'pull-1', 'x', 'agg-0', '{"pull": true}', '{}', 'pull', now())},
  q{('c', 'no-type', NULL, NULL, '{"empty": true}', '{}', 'push', now())};
$node->safe_psql('postgres',
	'INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload, headers, consumption, created_at) VALUES '
	  . join(",\n", @values));

qb_wait_query($node,
	"SELECT count(*) FROM queuebox.inbox WHERE consumption = 'push' AND state IN ('processed', 'dead')",
	'49', 'phase 1: every push row is forwarded or dead', timeout => 60);
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'",
	'48', 'phase 1: the 48 outbox rows are sent', timeout => 60);
is(qb_outbox_count($node), '48', 'phase 1: one outbox row per forwarded inbox row');
is($node->safe_psql('postgres',
		q{SELECT state || ':' || (claim_token IS NULL) FROM queuebox.inbox WHERE consumption = 'pull'}),
	'pending:true', 'the pull row is never touched');
like($node->safe_psql('postgres',
		q{SELECT state || ': ' || last_error FROM queuebox.inbox WHERE idempotency_key = 'no-type'}),
	qr/^dead: the topic template rendered empty/, 'an empty topic sends the row to dead with last_error');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM queuebox.outbox WHERE max_attempts <> 5}),
	'0', 'outbox rows carry inbox.relay.maxAttempts');

my $reqs = qb_sink_requests($sink);
my %by_key;
my $bad_headers = 0;
my %ids = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	q{SELECT idempotency_key || '|' || id FROM queuebox.inbox});
for my $r (grep { $_->{status} == 200 } @$reqs)
{
	my $b = JSON::PP::decode_json($r->{body});
	my $n = $b->{seq} * 8 + $b->{agg};
	my $src = ($b->{seq} + $b->{agg}) % 2 ? 'a' : 'b';
	my $h = $r->{headers};
	my $topic_ok = 1;
	$bad_headers++
	  unless ($h->{'x-source'} // '') eq $src
	  && ($h->{'x-idempotency-key'} // '') eq "m$n"
	  && ($h->{'x-inbox-id'} // '') eq $ids{"m$n"}
	  && ($n % 3 == 0
		? (($h->{'x-correlation-id'} // '') eq "corr-$n" && ($h->{'x-custom'} // '') eq 'kept')
		: !exists $h->{'x-correlation-id'});
	push @{ $by_key{ $b->{agg} } }, $b->{seq};
}
is($bad_headers, 0,
	'every delivery carries x-inbox-id, x-source, x-idempotency-key (sender values replaced) and X-Correlation-Id when sent');
my $out_of_order = 0;
for my $agg (keys %by_key)
{
	my @s = @{ $by_key{$agg} };
	# at least once: a repeat may follow, but never an earlier seq after a later one first arrived
	my $max = -1;
	for (@s) { $out_of_order++ if $_ < $max; $max = $_ if $_ > $max; }
}
is($out_of_order, 0, 'each aggregate arrives in created_at order across sources a and b');
is(scalar(keys %by_key), 8, 'all 8 aggregates arrived');
is($node->safe_psql('postgres',
		q{SELECT string_agg(DISTINCT topic, ',' ORDER BY topic) FROM queuebox.outbox}),
	'relay.a.order.updated,relay.b', 'topics are rendered from each source\'s template');

# ---- phase 2: inbox.relay.enabled: false keeps push rows pending
my $offset = -s $node->logfile;
qb_configure($node, config('false'));
my $log = qb_wait_log($node, qr/queuebox relay: configuration loaded: .*relay disabled/, $offset, timeout => 30);
like($log, qr/relay disabled/, 'the relay reloads the configuration with enabled: false');
$node->safe_psql('postgres', q{
	INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload)
	SELECT 'a', 'off-' || i, 'off', 'off-' || (i % 2), jsonb_build_object('off', i)
	FROM generate_series(1, 5) i});
my $pending_before = push_count(q{idempotency_key LIKE 'off-%' AND state = 'pending'});
sleep 1;
is(push_count(q{idempotency_key LIKE 'off-%' AND state = 'pending'}), $pending_before,
	'with enabled: false the push rows stay pending');
is($pending_before, '5', 'five rows were pending');
is(qb_outbox_count($node), '48', 'nothing was forwarded while disabled');
qb_configure($node, config('true'));
qb_wait_query($node,
	q{SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE 'off-%' AND state = 'processed'},
	'5', 're-enabled: the held rows are forwarded', timeout => 30);

# ---- phase 3 and 4: kill -9 of the relay, then a server restart
sub insert_many
{
	my ($tag, $n) = @_;
	$node->safe_psql('postgres', qq{
		INSERT INTO queuebox.inbox (source, idempotency_key, event_type, aggregate_id, payload)
		SELECT CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, '$tag-' || i, 'bulk',
			   CASE WHEN i % 4 = 0 THEN NULL ELSE '$tag-agg-' || (i % 25) END,
			   jsonb_build_object('tag', '$tag', 'i', i)
		FROM generate_series(1, $n) i});
}

sub nothing_lost
{
	my ($what, $tag, $n) = @_;
	qb_wait_query($node,
		"SELECT count(*) FROM queuebox.inbox WHERE idempotency_key LIKE '$tag-%' AND state = 'processed'",
		$n, "$what: every inbox row is processed", timeout => 120);
	is($node->safe_psql('postgres', qq{
			SELECT count(*) || '/' || count(DISTINCT headers->>'x-inbox-id')
			FROM queuebox.outbox WHERE headers->>'x-idempotency-key' LIKE '$tag-%'}),
		"$n/$n", "$what: each inbox row was forwarded exactly once");
	qb_wait_query($node,
		"SELECT count(*) FROM queuebox.outbox WHERE state <> 'sent'",
		'0', "$what: every outbox row is sent", timeout => 120);
	my $by_id = qb_sink_by_id($sink);
	my @mids = split /\n/, $node->safe_psql('postgres',
		"SELECT message_id FROM queuebox.outbox WHERE headers->>'x-idempotency-key' LIKE '$tag-%'");
	my @missing = grep { !grep { $_->{status} == 200 } @{ $by_id->{$_} // [] } } @mids;
	is(scalar @missing, 0, "$what: the sink answered 200 for every forwarded message");
}

insert_many('crash', 1500);
my $relay_pid = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'queuebox relay'");
my $processed_at_kill = push_count(q{idempotency_key LIKE 'crash-%' AND state = 'processed'});
note "kill -9 relay $relay_pid with $processed_at_kill of 1500 rows processed";
$offset = -s $node->logfile;
ok(kill('KILL', $relay_pid), "kill -9 the relay worker ($relay_pid)");
{
	local $PostgreSQL::Test::Utils::timeout_default = 60;
	$node->wait_for_log(qr/all server processes terminated; reinitializing/, $offset);
	pass('the postmaster crash-restarts the cluster');
}
qb_wait_query($node,
	"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'queuebox relay'",
	'1', 'a relay runs again after the crash restart', timeout => 60);
nothing_lost('after kill -9', 'crash', 1500);

insert_many('restart', 1500);
$node->restart;
pass('the server restarted (fast) while the relay was forwarding');
nothing_lost('after the restart', 'restart', 1500);

is($node->safe_psql('postgres',
		q{SELECT count(*) FROM queuebox.inbox WHERE consumption = 'push' AND state NOT IN ('processed', 'dead')}),
	'0', 'no push row is left pending or processing');

$node->stop;
qb_sink_stop($sink);
done_testing();
