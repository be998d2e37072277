# 003_key_order.pl
#   The rows of one key are delivered one at a time in id order, across two
#   workers and retries; rows with a NULL key are not held back by a keyed
#   row that keeps failing.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $nkeys = 20;
my $per_key = 10;

my $sink = qb_sink_start(name => 'order');
my $node = qb_node('order');

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

# Small batches so both workers claim rows of the same keys concurrently.
qb_configure(
	$node,
	qb_config_yaml(
		outbox => { batchSize => 7, maxAttempts => 10 },
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/events' } },
		routes => [ { topicPattern => '**', destination => 'web' } ]));

# Scripted failures: how many times row (key k, seq s) fails before it is
# accepted.
sub fails
{
	my ($k, $s) = @_;
	return 2 if $k % 3 == 0 && $s == 0;
	return 1 if $k % 3 == 1 && $s == 1;
	return 1 if $k % 5 == 0 && $s == 4;
	return 2 if $k % 7 == 3 && $s == 2;
	return 1 if $k % 4 == 2 && $s == 0;
	return 0;
}

# Rows interleaved across keys (seq-major), so ids of one key are spread out.
my @values;
for my $s (0 .. $per_key - 1)
{
	for my $k (0 .. $nkeys - 1)
	{
		my $f = fails($k, $s);
		my $sinkdir = $f ? qq{, "_sink": {"fail": $f, "status": 500}} : '';
		push @values,
		  sprintf(q{('orders.k', 'k%02d', '{"key": "k%02d", "seq": %d%s}', NULL)},
			$k, $k, $s, $sinkdir);
	}
}
# A key whose first row keeps failing (it would block its key for ever),
# then rows with a NULL key inserted after it.
push @values,
  q{('orders.stuck', 'stuck', '{"key": "stuck", "seq": 0, "_sink": {"status": 503}}', 1000)},
  q{('orders.stuck', 'stuck', '{"key": "stuck", "seq": 1}', NULL)},
  q{('orders.stuck', 'stuck', '{"key": "stuck", "seq": 2}', NULL)};
for my $i (0 .. 19)
{
	my $sinkdir = $i % 4 == 0 ? q{, "_sink": {"fail": 1, "status": 500}} : '';
	push @values, qq{('orders.nokey', NULL, '{"nokey": $i$sinkdir}', NULL)};
}
$node->safe_psql('postgres',
	"INSERT INTO queuebox.outbox (topic, key, payload, max_attempts) VALUES\n"
	  . join(",\n", @values));
my $total = $nkeys * $per_key + 3 + 20;
is(qb_outbox_count($node), $total, "$total rows inserted");

# ---- NULL-key rows pass the stuck key; keyed rows all arrive
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE state = 'sent' AND (key IS NULL OR key <> 'stuck')",
	$nkeys * $per_key + 20, 'every keyed row and every NULL-key row is sent', timeout => 90);

my $stuck = $node->safe_psql('postgres', q{
	SELECT string_agg(payload->>'seq' || ':' || state || ':' || (attempt > 0), ',' ORDER BY id)
	FROM queuebox.outbox WHERE key = 'stuck'});
like($stuck, qr/^0:(pending|processing):true,1:pending:false,2:pending:false$/,
	'the stuck key: its failing first row is still being retried, the later rows wait')
  or diag "stuck rows: $stuck";

# ---- what the sink saw
my %row;    # message_id -> { id, key, seq }
for my $l (split /\n/, $node->safe_psql('postgres',
		q{SELECT message_id, id, coalesce(key, ''), coalesce(payload->>'seq', '') FROM queuebox.outbox}))
{
	my ($mid, $id, $key, $seq) = split /\|/, $l;
	$row{$mid} = { id => $id, key => $key, seq => $seq };
}
my $reqs = qb_sink_requests($sink);
my (%ok_by_key, %first_req, %ok_req);
for my $r (@$reqs)
{
	my $meta = $row{ $r->{mid} } or next;
	$first_req{ $r->{mid} } //= $r;
	if ($r->{status} >= 200 && $r->{status} < 300)
	{
		push @{ $ok_by_key{ $meta->{key} } }, $meta->{id};
		$ok_req{ $r->{mid} } //= $r;
	}
}
my %mid_of_id = map { $row{$_}{id} => $_ } keys %row;

my ($keys_in_order, $keys_gated) = (0, 0);
for my $k (0 .. $nkeys - 1)
{
	my $key = sprintf('k%02d', $k);
	my @ids = sort { $a <=> $b } map { $row{$_}{id} } grep { $row{$_}{key} eq $key } keys %row;
	my $got = join(',', @{ $ok_by_key{$key} // [] });
	if ($got eq join(',', @ids))
	{
		$keys_in_order++;
	}
	else
	{
		diag "key $key: successful deliveries in log order: $got; ids: @ids";
	}
	# no request for row n+1 before row n was delivered
	my $gated = 1;
	for my $i (0 .. $#ids - 1)
	{
		my $ok = $ok_req{ $mid_of_id{ $ids[$i] } };
		my $next = $first_req{ $mid_of_id{ $ids[ $i + 1 ] } };
		if (!$ok || !$next || $next->{idx} < $ok->{idx} || $next->{t_us} < $ok->{t_us})
		{
			$gated = 0;
			diag sprintf('key %s: row %d (ok at line %s, t_us %s) vs row %d (first request line %s, t_us %s)',
				$key, $ids[$i], $ok ? $ok->{idx} : '-', $ok ? $ok->{t_us} : '-',
				$ids[ $i + 1 ], $next ? $next->{idx} : '-', $next ? $next->{t_us} : '-');
		}
	}
	$keys_gated += $gated;
}
is($keys_in_order, $nkeys, "for all $nkeys keys the successful deliveries are in id order, once each");
is($keys_gated, $nkeys,
	"for all $nkeys keys no request for row n+1 arrived before row n was delivered");

# the scripted failures really happened (the test exercised retries)
my $failed = grep { $_->{status} >= 500 && $row{ $_->{mid} } && $row{ $_->{mid} }{key} =~ /^k/ } @$reqs;
my $want_failed = 0;
for my $k (0 .. $nkeys - 1) { $want_failed += fails($k, $_) for 0 .. $per_key - 1 }
is($failed, $want_failed, "the sink answered the $want_failed scripted failures of keyed rows");
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM queuebox.outbox
		WHERE key LIKE 'k%' AND attempt <> 1 + coalesce((payload->'_sink'->>'fail')::int, 0)}),
	'0', 'each keyed row took 1 + its scripted failures attempts');

# ---- the stuck row runs out of attempts; then its key moves on, in order
$node->safe_psql('postgres',
	"UPDATE queuebox.outbox SET max_attempts = 1 WHERE key = 'stuck' AND payload->>'seq' = '0'");
qb_wait_query($node, q{
	SELECT string_agg(payload->>'seq' || ':' || state, ',' ORDER BY id)
	FROM queuebox.outbox WHERE key = 'stuck'},
	'0:dead,1:sent,2:sent', 'the stuck key: the first row is dead, the rows after it are sent',
	timeout => 30);
$reqs = qb_sink_requests($sink);
my @stuck_mids = split /\n/, $node->safe_psql('postgres',
	"SELECT message_id FROM queuebox.outbox WHERE key = 'stuck' ORDER BY id");
my @last0 = grep { $_->{mid} eq $stuck_mids[0] } @$reqs;
my @first1 = grep { $_->{mid} eq $stuck_mids[1] } @$reqs;
my @first2 = grep { $_->{mid} eq $stuck_mids[2] } @$reqs;
ok(@last0 >= 2 && @first1 == 1 && @first2 == 1
	  && $last0[-1]{idx} < $first1[0]{idx} && $first1[0]{idx} < $first2[0]{idx},
	'the stuck key: seq 1 and 2 were requested only after seq 0 gave up, in order');

is(qb_outbox_count($node), $total, "the outbox still holds the $total rows");
is(qb_count($node, "state = 'sent'"), $total - 1, 'all rows but the stuck one are sent');

$node->stop;
qb_sink_stop($sink);
done_testing();
