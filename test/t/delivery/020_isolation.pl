# 020_isolation.pl
#   Destination isolation (docs/design/claim.md): a down destination with a
#   deep backlog and a slow destination do not hold back the rows of other
#   destinations, and lose, kill or reorder nothing (the hot key: 023).
#   Every phase counts the rows before and after; waits are bounded polls,
#   never assertions on speed.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $sink_a = qb_sink_start(name => 'iso_a');
my $sink_s = qb_sink_start(name => 'iso_slow', delay_ms => 50);
my $sink_f = qb_sink_start(name => 'iso_fast');
my $b_port = qb_free_port();    # nothing listens there (until phase 1 ends)
my $workers = 2;
my $slow_mif = 4;
my $node = qb_node('iso', workers => $workers);

is(qb_outbox_count($node), '0', 'outbox is empty before the test');

sub http_dest
{
	my ($url, %o) = @_;
	return { type => 'http', baseUrl => $url, path => '/events', %o };
}

qb_configure(
	$node,
	qb_config_yaml(
		outbox => { batchSize => 200, maxAttempts => 1000 },
		destinations => {
			a => http_dest($sink_a->{url}),
			# a cooldown longer than the test: b stays open until resumed
			# the default timeoutMs: a request's time counts while its worker
			# runs SQL (a sanitizer build's cycles took 2 s after the resume,
			# and a 2 s timeout re-sent answered rows)
			b => http_dest("http://127.0.0.1:$b_port",
				circuitBreaker => { failures => 10, cooldownMs => 600000 }),
			s => http_dest($sink_s->{url}, maxInFlight => $slow_mif),
			f => http_dest($sink_f->{url}),
		},
		routes => [ map { { topicPattern => "$_.**", destination => $_ } } qw(a b s f) ]));

# where B's rows are: held for b, parked behind their key, routed (a
# retry that b will take when it closes), claimable, in flight, ended
sub b_places
{
	my $r = $node->safe_psql('postgres', q{
		SELECT count(*),
			   count(*) FILTER (WHERE state = 'pending' AND hold = 'destination'),
			   count(*) FILTER (WHERE state = 'pending' AND hold = 'key'),
			   count(*) FILTER (WHERE state = 'pending' AND hold IS NULL AND destination IS NOT NULL),
			   count(*) FILTER (WHERE state = 'pending' AND (hold = 'ready' OR (hold IS NULL AND destination IS NULL))),
			   count(*) FILTER (WHERE state = 'processing'),
			   count(*) FILTER (WHERE state = 'sent'),
			   count(*) FILTER (WHERE state = 'dead'),
			   coalesce(sum(attempt), 0),
			   count(*) FILTER (WHERE state = 'pending' AND hold = 'intake'),
			   count(*) FILTER (WHERE state = 'pending' AND hold = 'intake' AND attempt > 0)
		FROM queuebox.outbox WHERE topic = 'b.ev'});
	my %h;
	@h{qw(total held parked routed claimable processing sent dead attempts intake intake_tried)} = split /\|/, $r;
	return \%h;
}

sub places_str
{
	my ($p) = @_;
	return join(', ', map { "$_=$p->{$_}" } qw(total held parked routed intake claimable processing sent dead attempts));
}

# ==== 1. a down destination with a deep backlog while another delivers
my $log_offset = -s $node->logfile;
my $nb = 20000;
qb_insert_keyed($node, 'b.ev', $nb, 200, 'bk');
is(qb_count($node, "topic = 'b.ev'"), $nb, "phase 1: $nb rows for b (down) over 200 keys");

qb_wait_for(
	sub {
		my $st = qb_dest_status($node, 'b');
		my $p = b_places();
		$st && $st->{state} eq 'open' && $p->{claimable} == 0 && $p->{processing} == 0;
	},
	"phase 1: b's circuit is open and none of its rows is claimable or in flight",
	timeout => 60);
my $b_before = b_places();
note 'b before: ' . places_str($b_before);
is($b_before->{total}, $nb, "phase 1: b still has its $nb rows");
is($b_before->{held} + $b_before->{routed} + $b_before->{parked} + $b_before->{intake}, $nb,
	'phase 1: every row of b waits: held, routed, parked behind its key, or in its intake');
# rows no claim met: each key's rows after its head went in parked at insert
# (claim.md, "Parked at insert"), any others wait in b's intake
cmp_ok($b_before->{intake} + $b_before->{parked}, '>=', $nb - 200,
	"phase 1: the rows after each key's head wait parked or in b's intake, unread ($b_before->{parked} parked, $b_before->{intake} in intake)");
is($b_before->{intake_tried}, 0, "phase 1: b's intake rows spent no attempt");
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM (SELECT DISTINCT ON (key) hold FROM queuebox.outbox
		  WHERE topic = 'b.ev' AND state IN ('pending', 'processing') ORDER BY key, id) h
		WHERE hold = 'key'}),
	'0', 'phase 1: no key of b has its first open row parked (none is stuck)');
is($b_before->{dead} + $b_before->{sent}, 0, 'phase 1: none of b\'s rows is dead or sent');
is($node->safe_psql('postgres',
		"SELECT rows FROM queuebox.outbox_stats WHERE destination = 'b' AND state = 'pending'"),
	$nb, "phase 1: outbox_stats counts all $nb rows of b as pending");
is(qb_dest_status($node, 'b')->{pending}, $nb,
	"phase 1: destination_status() counts all $nb rows waiting for b as pending (parked ones too)");
note "phase 1: $b_before->{attempts} attempts were spent on b's heads before its circuit opened";

my $na = 2000;
qb_insert_keyed($node, 'a.ev', $na, 100, 'ak');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'a.ev' AND state = 'sent'",
	$na, "phase 1: all $na rows of a are sent while b is down", timeout => 60);
my $oa = qb_key_order($node, $sink_a, "topic = 'a.ev'");
is($oa->{delivered}, $na, "phase 1: the sink of a answered 2xx for all $na rows");
is($oa->{dups}, 0, 'phase 1: each row of a was delivered once');
is($oa->{keys_in_order}, $oa->{keys}, "phase 1: a's $oa->{keys} keys were delivered in id order")
  or diag join("\n", @{ $oa->{bad} });

my $b_after = b_places();
note 'b after: ' . places_str($b_after);
is(places_str($b_after), places_str($b_before),
	"phase 1: b's rows did not move while a delivered: none lost, dead or attempted");
is(qb_dest_status($node, 'b')->{state}, 'open', 'phase 1: b is still open');
is(qb_dest_status($node, 'b')->{held}, $b_after->{held}, 'phase 1: destination_status counts b\'s held rows');
is(qb_log_count($node, qr/destination b: circuit closed -> open/, $log_offset), 1,
	'phase 1: the log has one "circuit closed -> open" line for b, not one per row');
is(qb_log_count($node, qr/destination b: circuit/, $log_offset), 1,
	'phase 1: and no other circuit line for b');

# b comes back: every row is delivered once, in key order
my $sink_b = qb_sink_start(name => 'iso_b', port => $b_port);
is($node->safe_psql('postgres', "SELECT queuebox.resume_destination('b')"), 't',
	'phase 1: resume_destination(b) closes its circuit');
qb_wait_query($node, "SELECT count(*) FROM queuebox.outbox WHERE topic = 'b.ev' AND state = 'sent'",
	$nb, "phase 1: once b is back all its $nb rows are sent", timeout => 90);
my $ob = qb_key_order($node, $sink_b, "topic = 'b.ev'");
is($ob->{delivered}, $nb, "phase 1: b's sink answered 2xx for all $nb rows");
is($ob->{dups}, 0, 'phase 1: each of b\'s rows was delivered once');
is($ob->{keys_in_order}, 200, 'phase 1: all 200 keys of b were delivered in id order')
  or diag join("\n", @{ $ob->{bad} });
is(qb_count($node, "topic = 'b.ev'"), $nb, "phase 1: b's $nb rows are all still in the outbox");

# ==== 2. a slow destination: s answers after 50 ms, maxInFlight 4
my $ns = 800;
my $nf = 1000;
qb_insert_keyed($node, 's.ev', $ns, 20, 'sk');
qb_insert_keyed($node, 'f.ev', $nf, 50, 'fk');
qb_drains_beside($node, [ 'f.ev', $nf ], [ 's.ev', $ns ], 'phase 2 (s slow)', held_timeout => 90);
is(qb_count($node, "topic IN ('s.ev', 'f.ev')"), $ns + $nf, 'phase 2: no row lost');
for my $c ([ 's', $sink_s, 's.ev', $ns, 20 ], [ 'f', $sink_f, 'f.ev', $nf, 50 ])
{
	my ($d, $sink, $topic, $n, $k) = @$c;
	my $o = qb_key_order($node, $sink, "topic = '$topic'");
	is($o->{delivered} . '/' . $o->{dups}, "$n/0", "phase 2: $d: every row delivered once");
	is($o->{keys_in_order}, $k, "phase 2: $d: all $k keys in id order")
	  or diag join("\n", @{ $o->{bad} });
}
{
	# Each answer of s came at least 50 ms after its body was read, so the
	# requests in flight at once are at least those whose [t_us, t_us + 49
	# ms) overlap: never more than maxInFlight per worker.
	my @t = sort { $a <=> $b } map { $_->{t_us} } @{ qb_sink_requests($sink_s) };
	my ($max, $j) = (0, 0);
	for my $i (0 .. $#t)
	{
		$j++ while $t[$j] <= $t[$i] - 49_000;
		$max = $i - $j + 1 if $i - $j + 1 > $max;
	}
	cmp_ok($max, '<=', $workers * $slow_mif,
		"phase 2: at most maxInFlight ($slow_mif) x $workers workers requests to s at once (saw $max)");
}

is(qb_count($node, "state <> 'sent'"), '0', 'every row of the test ends sent');
is(qb_outbox_count($node), $nb + $na + $ns + $nf, 'and the outbox holds them all');

$node->stop;
qb_sink_stop($_) for ($sink_a, $sink_b, $sink_s, $sink_f);
done_testing();
