# 056_otlp.pl
#   Spans exported with OTLP over HTTP (docs/observability.md, "Exporting
#   spans (OTLP)") to a real receiver on loopback: test/node/otlp_receiver.mjs
#   decodes every post with OpenTelemetry's own protobuf definitions
#   (@opentelemetry/otlp-transformer) and writes each span it holds.
#   - extension: a traced row's attempts (a failed one, then the delivery)
#     are spans in the row's trace, each the parent of the request the sink
#     got, with destination, outcome, HTTP status and attempt, and the
#     row's tracestate as their traceState; a webhook's receipt is a child
#     of the traceparent it came with, with its tracestate; the relay's
#     forward has its span (no traceState: the relay's claim returns no
#     tracestate); the delivery of the outbox row it made carries the
#     webhook's; a Kafka message's receipt is a child of its traceparent
#     header, with its tracestate header; a row without a context has no
#     traceState; the headers reach the receiver;
#   - the receiver down, then answering 503: every row is still delivered
#     (rows counted before and after), the spans are dropped and counted in
#     /metrics, the failure is logged; back up, spans arrive again;
#   - daemon (PostgreSQL): a delivery's span, service.instance.id its own;
#     its row has a traceparent and no tracestate: no traceState.
use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;
use QueueBoxKafka;
use QueueBoxOtlp;

my $json = JSON::PP->new->canonical(1);
my $sink = qb_sink_start(name => 'otlp');
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);
my $TRACE = '0af7651916cd43dd8448eb211c80319c';
my $TP = "00-$TRACE-b7ad6b7169203331-01";
my $TRACE2 = '4bf92f3577b34da6a3ce929d0e0e4736';
my $TP2 = "00-$TRACE2-00f067aa0ba902b7-01";
my $TS = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7';
my $TS2 = 'vendor2=opaque-2';

sub doc
{
	my ($port, %o) = @_;
	return qb_config_yaml(
		outbox => { pollIntervalMs => 100, maxAttempts => 5, backoff => { initialMs => 100, maxMs => 200 } },
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/in' } },
		routes => [ { topicPattern => 'orders.**', destination => 'web' },
					{ topicPattern => 'shop.**', destination => 'web' } ],
		telemetry => { otlp => { endpoint => "http://127.0.0.1:$port", flushIntervalMs => 100,
			timeoutMs => 2000, serviceName => 'billing', headers => { 'x-api-key' => 'k-056' } } },
		%o);
}

sub requests_of
{
	my ($node, $id) = @_;
	my $mid = $node->safe_psql('postgres', "SELECT message_id FROM queuebox.outbox WHERE id = $id");
	return [ grep { $_->{mid} eq $mid } @{ qb_sink_requests($sink) } ];
}

sub metric
{
	my ($port, $name) = @_;
	my $m = $http->get("http://127.0.0.1:$port/metrics")->{content} // '';
	return $m =~ /^\Q$name\E (\d+)$/m ? $1 : undef;
}

# ---- the extension
my $rx = otlp_receiver();
my $kafka = qb_kafka_start(topics => ['ev:1']);
my $node = qb_node('otlp');
my $lport = qb_free_port();
qb_configure($node, doc($rx->{port}) . <<"EOY");
http: { listen: "127.0.0.1:$lport" }
sources:
  kk:
    type: kafka
    brokers: "$kafka->{bootstrap}"
    topics: [ev]
    consumption: pull
  shop:
    type: http
    path: /shop
    idempotencyKeyPath: \$.id
    eventTypePath: \$.type
    topic: "shop.{{ eventType }}"
inbox:
  relay: { pollIntervalMs: 50 }
EOY
my $id = $node->safe_psql('postgres', qq{
	BEGIN; SET LOCAL queuebox.traceparent = '$TP'; SET LOCAL queuebox.tracestate = '$TS';
	INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.created', '{"_sink": {"fail": 1}}') RETURNING id;
	COMMIT;});
($id) = $id =~ /(\d+)/;
qb_wait_query($node, "SELECT state || ':' || attempt FROM queuebox.outbox WHERE id = $id", 'sent:2',
	'a traced row fails once, then is delivered');
my @att;
qb_wait_for(sub { @att = sort { $a->{attributes}{'queuebox.attempt'} <=> $b->{attributes}{'queuebox.attempt'} }
	grep { ($_->{attributes}{'queuebox.outbox.id'} // 0) == $id } @{ otlp_spans($rx) }; @att == 2 },
	'the receiver gets one span per attempt', timeout => 30);
is(join(' ', map { $_->{name} } @att), 'deliver web deliver web', 'named by the operation and the destination');
is(join(' ', map { $_->{traceId} } @att), "$TRACE $TRACE", 'both in the row\'s trace');
is(join(' ', map { $_->{parentSpanId} } @att), 'b7ad6b7169203331 b7ad6b7169203331', 'both children of the row\'s context');
is(join(' ', map { $_->{traceState} } @att), "$TS $TS", 'both carry the row\'s tracestate as their traceState');
is(join(' ', map { $_->{attributes}{'queuebox.outcome'} } @att), 'failed delivered', 'the outcomes');
is(join(' ', map { $_->{attributes}{'http.response.status_code'} } @att), '500 200', 'the HTTP statuses');
is(join(' ', map { $_->{status}{code} } @att), '2 1', 'status: error, then ok');
like($att[0]{status}{message}, qr/attempt 1 of 5 failed/, 'the failed attempt says why');
is(join(' ', map { $_->{kind} } @att), '3 3', 'client spans (an HTTP destination)');
is($att[1]{attributes}{'queuebox.destination'}, 'web', 'the destination');
is($att[0]{resource}{'service.name'}, 'billing', 'the resource names the service (telemetry.otlp.serviceName)');
like($att[0]{resource}{'service.instance.id'}, qr/:\d+$/, 'and this process (host:pid)');
is($att[0]{headers}{'x-api-key'}, 'k-056', 'the configured headers reach the receiver');
my $r = requests_of($node, $id);
is(join(' ', map { ($_->{headers}{traceparent} // '') =~ /^00-$TRACE-([0-9a-f]{16})-01$/ ? $1 : 'none' } @$r),
	join(' ', map { $_->{spanId} } @att), 'each request the sink got carries its attempt\'s span-id');

# a webhook: receipt and forward
my $w = $http->request('POST', "http://127.0.0.1:$lport/inbox/shop", {
	content => $json->encode({ id => 'w-56', type => 'paid' }),
	headers => { 'Content-Type' => 'application/json', traceparent => $TP2, tracestate => $TS2 } });
is($w->{status}, 202, 'a traced webhook is accepted');
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'shop.paid' AND state = 'sent'}, '1',
	'it is relayed and delivered');
my %by;
qb_wait_for(sub { %by = map { $_->{name} => $_ } @{ otlp_spans($rx) }; $by{'receive shop'} && $by{'forward shop'}
	  && grep { $_->{name} eq 'deliver web' && $_->{traceId} eq $TRACE2 } @{ otlp_spans($rx) } },
	'the receipt, the forward and the delivery are exported', timeout => 30);
my ($wd) = grep { $_->{name} eq 'deliver web' && $_->{traceId} eq $TRACE2 } @{ otlp_spans($rx) };
is($by{'receive shop'}{traceId} . ' ' . $by{'receive shop'}{parentSpanId}, "$TRACE2 00f067aa0ba902b7",
	'the receipt is a child of the traceparent the webhook came with');
is($by{'receive shop'}{kind}, 2, 'a server span');
is($by{'receive shop'}{traceState}, $TS2, 'with the tracestate the webhook came with');
is($by{'forward shop'}{traceState}, '', 'the forward: no traceState (the relay\'s claim returns none)');
is($wd->{traceState}, $TS2, 'the delivery of the relayed row: the webhook\'s tracestate, which the row carries');
is($by{'receive shop'}{attributes}{'queuebox.result'} . ' ' . $by{'receive shop'}{attributes}{'http.response.status_code'},
	'accepted 202', 'with its result and status');
is($by{'forward shop'}{attributes}{'queuebox.topic'} . ' ' . $by{'forward shop'}{attributes}{'queuebox.outcome'},
	'shop.paid forwarded', 'the forward names the topic it rendered');
is($by{'forward shop'}{traceId} . ' ' . $by{'forward shop'}{parentSpanId}, "$TRACE2 00f067aa0ba902b7",
	'the forward is a child of the inbox row\'s traceparent');

# a broker message: its receipt, a child of its traceparent header
qb_kafka_produce($kafka, topic => 'ev', value => '{"n": 1}', key => 'k1', headers => { traceparent => $TP, tracestate => $TS2 });
my ($ks);
qb_wait_for(sub { ($ks) = grep { $_->{name} eq 'receive kk' } @{ otlp_spans($rx) }; $ks },
	'a Kafka message\'s receipt is exported', timeout => 60);
is("$ks->{traceId} $ks->{parentSpanId} $ks->{kind} $ks->{attributes}{'queuebox.result'}",
	"$TRACE b7ad6b7169203331 5 accepted", 'a consumer span, child of the message\'s traceparent, accepted');
is($ks->{traceState}, $TS2, 'with its tracestate header');
is($node->safe_psql('postgres', q{SELECT count(*) FROM queuebox.inbox WHERE source = 'kk'}), '1', 'the message is stored once');
qb_kafka_stop($kafka);
ok(!-e "$rx->{out}.bad", 'every post decoded') or diag slurp_file("$rx->{out}.bad");

# the receiver down, then overloaded: delivery goes on, spans are dropped and counted
otlp_receiver_stop($rx);
my $offset = -s $node->logfile;
my $before = qb_outbox_count($node);
my $sent = qb_sink_stats($sink)->{ok};
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.down', jsonb_build_object('n', g) FROM generate_series(1, 5) g});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.down' AND state = 'sent'}, '5',
	'the receiver down: every row is delivered');
is(qb_outbox_count($node), $before + 5, 'every row is there');
is(qb_sink_stats($sink)->{ok} - $sent, 5, 'the sink got each once');
qb_wait_for(sub { (metric($lport, 'queuebox_otlp_spans_dropped_total') // 0) >= 5 },
	'the spans are dropped and counted in /metrics', timeout => 30);
like(qb_wait_log($node, qr/span export failed/, $offset), qr/span export failed .*POST http:\/\/127\.0\.0\.1:\d+\/v1\/traces failed/,
	'the failure is logged');
my $busy = otlp_receiver(503);
qb_configure($node, doc($busy->{port}) . "http: { listen: \"127.0.0.1:$lport\" }\n");
my $dropped = metric($lport, 'queuebox_otlp_spans_dropped_total');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) SELECT 'orders.busy', jsonb_build_object('n', g) FROM generate_series(1, 3) g});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'orders.busy' AND state = 'sent'}, '3',
	'a receiver answering 503: every row is delivered');
qb_wait_for(sub { (metric($lport, 'queuebox_otlp_spans_dropped_total') // 0) >= $dropped + 3 },
	'its spans are dropped and counted', timeout => 30);
otlp_receiver_stop($busy);
my $rx2 = otlp_receiver();
my $exported = metric($lport, 'queuebox_otlp_spans_exported_total');
qb_configure($node, doc($rx2->{port}) . "http: { listen: \"127.0.0.1:$lport\" }\n");
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.back', '{}')});
my ($back);
qb_wait_for(sub { ($back) = grep { ($_->{attributes}{'queuebox.topic'} // '') eq 'orders.back' } @{ otlp_spans($rx2) } },
	'a receiver back: spans arrive again', timeout => 30);
is($back->{parentSpanId} // 'none', 'none', 'a row without a context: the root of a trace');
is($back->{traceState}, '', 'with no traceState');
# the receiver records the spans before it answers; the count follows the answer
qb_wait_for(sub { (metric($lport, 'queuebox_otlp_spans_exported_total') // 0) > $exported },
	'counted as exported', timeout => 30);
$node->stop;

# ---- the daemon
my $dn = qbd_node('otlpd');
my $d = qbd_start($dn, doc($rx2->{port}, database => { url => qbd_url($dn) }), name => 'otlp');
qb_wait_query($dn, q{SELECT to_regclass('queuebox.outbox') IS NOT NULL}, 't', 'daemon: the schema is there');
$dn->safe_psql('postgres', qq{BEGIN; SET LOCAL queuebox.traceparent = '$TP2';
	INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.daemon', '{}'); COMMIT;});
my ($ds);
qb_wait_for(sub { ($ds) = grep { ($_->{attributes}{'queuebox.topic'} // '') eq 'orders.daemon' } @{ otlp_spans($rx2) }; $ds },
	'daemon: the delivery\'s span is exported', timeout => 30);
is($ds->{traceId} . ' ' . $ds->{parentSpanId} . ' ' . $ds->{attributes}{'queuebox.outcome'},
	"$TRACE2 00f067aa0ba902b7 delivered", 'daemon: in the row\'s trace, delivered');
is($ds->{traceState}, '', 'daemon: a row with a traceparent and no tracestate: no traceState');
qbd_signal($d, 'TERM');
qbd_wait_exit($d, 30);
otlp_receiver_stop($rx2);
ok(!-e "$rx2->{out}.bad", 'every post decoded');

done_testing();
