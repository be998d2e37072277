# 009_webhook_to_sink.pl
#   The whole path of a webhook with every worker running: POST to the
#   ingress (202 after commit), the relay forwards the row into the outbox,
#   the outbox delivers it to the sink with the relay's headers, one
#   aggregate's webhooks arrive in the order they were received, and the
#   shared metrics count each step: every configured destination and source
#   at 0 before its first event, a removed one no longer rendered.
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $json = JSON::PP->new->canonical(1);
my $sink = qb_sink_start(name => 'hooks');
my $node = qb_node('hooks');
my $port = qb_free_port();
my $base = "http://127.0.0.1:$port";
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);

qb_configure($node,
	qb_config_yaml(
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/hooks' } },
		routes => [ { topicPattern => 'shop.**', destination => 'web' } ])
	  . <<"EOY");
http: { listen: "127.0.0.1:$port" }
sources:
  shop:
    type: http
    path: /shop
    idempotencyKeyPath: \$.id
    eventTypePath: \$.type
    aggregateIdPath: \$.order
    topic: "shop.{{ eventType }}"
inbox:
  relay: { pollIntervalMs: 50 }
EOY
qb_wait_for(sub { $http->get("$base/healthz")->{status} == 200 }, 'the ingress listens', 30);

# ---- before the first event: every configured name has its counters, at 0
is(qb_inbox_count($node) . '/' . qb_outbox_count($node), '0/0', 'no inbox or outbox row yet');
my $m0 = $http->get("$base/metrics")->{content};
for my $f (qw(delivered failed dead))
{
	like($m0, qr/^queuebox_outbox_${f}_total\{destination="web"\} 0$/m,
		"metrics before any row: queuebox_outbox_${f}_total of web is 0");
}
like($m0, qr/^queuebox_delivery_latency_seconds_count\{destination="web"\} 0$/m,
	'metrics before any row: the latency histogram of web is there, empty');
for my $res (qw(accepted duplicate bad_request unauthorized too_large unprocessable unavailable))
{
	like($m0, qr/^queuebox_inbox_received_total\{source="shop",result="$res"\} 0$/m,
		"metrics before any webhook: received of shop, result $res, is 0");
}

# 3 orders x 5 events, interleaved; each POST is answered after its commit
my %id_of;
my $accepted = 0;
for my $seq (1 .. 5)
{
	for my $order (1 .. 3)
	{
		my $key = "evt-$order-$seq";
		my $r = $http->request('POST', "$base/inbox/shop", {
				content => $json->encode({ id => $key, type => 'order.step', order => "o$order", seq => $seq }),
				headers => { 'Content-Type' => 'application/json', 'X-Correlation-Id' => "corr-$key",
					'X-Source' => 'forged' } });
		$accepted++ if $r->{status} == 202;
		$id_of{$key} = eval { $json->decode($r->{content})->{id} };
	}
}
is($accepted, 15, 'the ingress accepted 15 webhooks');

qb_wait_for(sub { scalar(@{ qb_sink_requests($sink) }) >= 15 }, 'the sink received 15 requests', 60);
my $reqs = qb_sink_requests($sink);
is(scalar(@$reqs), 15, 'each webhook was delivered once');

my ($headers_ok, $order_ok) = (0, 1);
my %last_seq;
for my $r (@$reqs)
{
	my $p = $json->decode($r->{body});
	my $key = $p->{id};
	my $h = $r->{headers};
	$headers_ok++
	  if $r->{path} eq '/hooks'
	  && ($h->{'x-inbox-id'} // '') eq ($id_of{$key} // 'none')
	  && ($h->{'x-source'} // '') eq 'shop'
	  && ($h->{'x-idempotency-key'} // '') eq $key
	  && ($h->{'x-correlation-id'} // '') eq "corr-$key";
	$order_ok = 0 if ($last_seq{ $p->{order} } // 0) >= $p->{seq};
	$last_seq{ $p->{order} } = $p->{seq};
}
is($headers_ok, 15,
	'every delivery carries x-inbox-id, x-source (the sender value replaced), x-idempotency-key and X-Correlation-Id');
ok($order_ok, "each order's events arrived in the order they were received");

qb_wait_query($node,
	q{SELECT (SELECT count(*) FROM queuebox.inbox WHERE state = 'processed') || '/' ||
	         (SELECT count(*) FROM queuebox.outbox WHERE state = 'sent')},
	'15/15', 'the inbox rows are processed and the outbox rows sent', timeout => 30);

my $m = $http->get("$base/metrics")->{content};
like($m, qr/^queuebox_inbox_received_total\{source="shop",result="accepted"\} 15$/m,
	'metrics: 15 received');
like($m, qr/^queuebox_relay_forwarded_total 15$/m, 'metrics: 15 forwarded by the relay');
like($m, qr/^queuebox_outbox_delivered_total\{destination="web"\} 15$/m,
	'metrics: 15 delivered to web (counted by the outbox workers, read by the ingress)');
like($m, qr/^queuebox_delivery_latency_seconds_count\{destination="web"\} 15$/m,
	'metrics: the latency histogram has 15 observations');
like($m, qr/^queuebox_outbox_pending 0$/m, 'metrics: nothing pending');

# ---- a reconfiguration: a removed name is no longer rendered, a new one at 0
my $rows = qb_inbox_count($node) . '/' . qb_outbox_count($node);
qb_configure($node,
	qb_config_yaml(
		destinations => { web2 => { type => 'http', baseUrl => $sink->{url}, path => '/hooks' } },
		routes => [ { topicPattern => 'shop.**', destination => 'web2' } ])
	  . <<"EOY");
http: { listen: "127.0.0.1:$port" }
sources:
  shop2:
    type: http
    path: /shop
    idempotencyKeyPath: \$.id
    eventTypePath: \$.type
EOY
qb_wait_for(sub { $http->get("$base/metrics")->{content} =~ /destination="web2"/ },
	'metrics: the ingress renders the new configuration', timeout => 30);
$m = $http->get("$base/metrics")->{content};
like($m, qr/^queuebox_outbox_delivered_total\{destination="web2"\} 0$/m, 'metrics: the new destination at 0');
like($m, qr/^queuebox_inbox_received_total\{source="shop2",result="accepted"\} 0$/m,
	'metrics: the new source at 0');
unlike($m, qr/destination="web"|source="shop"/, 'metrics: the removed destination and source are gone');
is(qb_inbox_count($node) . '/' . qb_outbox_count($node), $rows, 'the reconfiguration changed no row');

qb_sink_stop($sink);
$node->stop;
done_testing();
