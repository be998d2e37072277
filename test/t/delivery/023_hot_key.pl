# 023_hot_key.pl
#   A hot key (docs/design/claim.md): 5,000 rows of one key, inserted first,
#   do not hold back the rows of other keys behind them; the hot key's rows
#   are delivered one at a time, strictly in id order, each once.  Rows are
#   counted before and after; waits are bounded polls.
use strict;
use warnings;

use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink_h = qb_sink_start(name => 'hot');
my $node = qb_node('hot');

is(qb_outbox_count($node), '0', 'outbox is empty before the test');
qb_configure(
	$node,
	qb_config_yaml(
		outbox => { batchSize => 200, maxAttempts => 1000 },
		destinations => { h => { type => 'http', baseUrl => $sink_h->{url}, path => '/events' } },
		routes => [ { topicPattern => 'h.**', destination => 'h' } ]));

# 5,000 rows of one key, its first one answered after 3 s, then 1,000 rows
# over 50 other keys (higher ids): the other keys do not wait for it.
my $nhot = 5000;
my $nother = 1000;
$node->safe_psql('postgres', qq{
	INSERT INTO queuebox.outbox (topic, key, payload)
	SELECT 'h.ev', 'hot', CASE WHEN i = 0
		THEN jsonb_build_object('seq', i, '_sink', jsonb_build_object('delay_ms', 3000))
		ELSE jsonb_build_object('seq', i) END
	FROM generate_series(0, $nhot - 1) i});
qb_insert_keyed($node, 'h.ev', $nother, 50, 'other');
is(qb_count($node, "topic = 'h.ev'"), $nhot + $nother, 'the hot key\'s rows and the others\' are in');
qb_wait_query($node,
	"SELECT count(*) FROM queuebox.outbox WHERE topic = 'h.ev' AND key <> 'hot' AND state = 'sent'",
	$nother, "the $nother rows of the other keys are all sent", timeout => 60);
my $hot_open = qb_count($node, "key = 'hot' AND state IN ('pending', 'processing')");
cmp_ok($hot_open, '>', $nhot / 2, "most of the hot key's rows are still waiting then ($hot_open)");
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE key = 'hot' AND state = 'sent'",
	$nhot, "then all $nhot rows of the hot key are sent", timeout => 90);
my $oh = qb_key_order($node, $sink_h, "topic = 'h.ev'");
is($oh->{delivered}, $nhot + $nother, 'the sink answered 2xx for every row');
is($oh->{dups}, 0, 'each row was delivered once');
is($oh->{keys_in_order}, 51, 'the hot key and the 50 others were delivered in id order')
  or diag join("\n", @{ $oh->{bad} });
{
	# the hot key by its payload: seq 0, 1, ..., in the sink's log order, and
	# each request received after the one before it
	my %hot_mid = map { $_ => 1 } split /\n/,
	  $node->safe_psql('postgres', "SELECT message_id FROM queuebox.outbox WHERE key = 'hot'");
	my @hot = grep { $hot_mid{ $_->{mid} } } @{ qb_sink_requests($sink_h) };
	my @seqs = map { decode_json($_->{body})->{seq} } @hot;
	my $t_ok = !grep { $hot[$_]{t_us} < $hot[ $_ - 1 ]{t_us} } 1 .. $#hot;
	is(scalar @hot, $nhot, 'the sink got one request per hot row');
	ok("@seqs" eq join(' ', 0 .. $nhot - 1) && $t_ok,
		'the hot rows arrived strictly in order (payload seq 0..4999, t_us increasing)')
	  or diag 'first seqs: ' . join(',', @seqs[0 .. 20]);
}

is(qb_count($node, "state <> 'sent'"), '0', 'every row ends sent');
is(qb_outbox_count($node), $nhot + $nother, 'and the outbox holds them all');

$node->stop;
qb_sink_stop($sink_h);
done_testing();
