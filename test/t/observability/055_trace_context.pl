# 055_trace_context.pl
#   W3C Trace Context end to end with no application code
#   (docs/observability.md, "Trace context"), on the extension and the
#   daemon (PostgreSQL):
#   - an application's statement through node's pg driver with a
#     sqlcommenter comment: the row stores that traceparent and tracestate;
#     the HTTP sink gets a child (same trace-id and flags, another span-id),
#     and a retried row a new span-id per attempt;
#   - SET LOCAL queuebox.traceparent; a row's own header wins over the
#     setting, the setting over the comment; a bad setting is refused;
#   - a webhook's traceparent is kept in the inbox, the relay carries it
#     into the outbox and the delivery is its child; a pull claim returns it.
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
use QueueBoxDaemon;

my $json = JSON::PP->new->canonical(1);
my $TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
my $TP = "00-$TRACE-00f067aa0ba902b7-01";
my $TP2 = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
my $TP3 = '00-11111111111111111111111111111111-2222222222222222-00';
my $node_dir = qb_npm_dir('test/node');
my $sink = qb_sink_start(name => 'trace');

sub doc
{
	my (%o) = @_;
	return qb_config_yaml(
		outbox => { pollIntervalMs => 100, maxAttempts => 5, backoff => { initialMs => 100, maxMs => 200 } },
		destinations => { web => { type => 'http', baseUrl => $sink->{url}, path => '/in' } },
		routes => [ { topicPattern => 'orders.**', destination => 'web' },
					{ topicPattern => 'shop.**', destination => 'web' } ],
		%o);
}

# the requests the sink got for one row, in order
sub requests_of
{
	my ($node, $id) = @_;
	my $mid = $node->safe_psql('postgres', "SELECT message_id FROM queuebox.outbox WHERE id = $id");
	return [ grep { $_->{mid} eq $mid } @{ qb_sink_requests($sink) } ];
}

sub header_of { my ($node, $id, $h) = @_;
	return $node->safe_psql('postgres', "SELECT headers->>'$h' FROM queuebox.outbox WHERE id = $id"); }

# traced($node, $what): the cases every host must pass
sub traced
{
	my ($node, $what) = @_;
	my $port = $node->port;

	# (a) pg + sqlcommenter, and a retry
	my ($out, $err) = run_command([ 'node', "$node_dir/traced_insert.mjs", 'orders.created', $TP, 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7' ]);
	# run_command has no env of its own: PG* tell pg where the server is
	chomp(my $id = $out);
	like($id, qr/^\d+$/, "$what: the application inserted a row through pg") or diag $err;
	is(header_of($node, $id, 'traceparent'), $TP, "$what: the row stores the comment's traceparent");
	is(header_of($node, $id, 'tracestate'), 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7',
		"$what: and its tracestate, URL-decoded");
	qb_wait_query($node, "SELECT state FROM queuebox.outbox WHERE id = $id", 'sent', "$what: the row is delivered");
	my $r = requests_of($node, $id);
	is(scalar(@$r), 1, "$what: one request");
	like($r->[0]{headers}{traceparent} // '', qr/^00-$TRACE-(?!00f067aa0ba902b7)[0-9a-f]{16}-01$/,
		"$what: the request carries a child: the trace-id and flags, another span-id");
	is($r->[0]{headers}{tracestate}, 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7', "$what: and the tracestate");

	my $rid = $node->safe_psql('postgres', qq{
		BEGIN; SET LOCAL queuebox.traceparent = '$TP2';
		INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.retried', '{"_sink": {"fail": 2}}') RETURNING id;
		COMMIT;});
	($rid) = $rid =~ /(\d+)/;
	is(header_of($node, $rid, 'traceparent'), $TP2, "$what: SET LOCAL queuebox.traceparent: the row stores it");
	qb_wait_query($node, "SELECT state || ':' || attempt FROM queuebox.outbox WHERE id = $rid", 'sent:3',
		"$what: the row fails twice, then is delivered");
	$r = requests_of($node, $rid);
	my %spans = map { (($_->{headers}{traceparent} // '') =~ /^00-0af7651916cd43dd8448eb211c80319c-([0-9a-f]{16})-01$/)[0] // 'none' => 1 } @$r;
	is(scalar(@$r) . ' requests, ' . scalar(grep { $_ ne 'none' && $_ ne 'b7ad6b7169203331' } keys %spans) . ' span-ids',
		'3 requests, 3 span-ids', "$what: each attempt is a child with a span-id of its own");

	# (c) the row's header wins over the setting, the setting over the comment
	my $ids = $node->safe_psql('postgres', qq{
		BEGIN; SET LOCAL queuebox.traceparent = '$TP2';
		INSERT INTO queuebox.outbox (topic, payload, headers) VALUES ('orders.own', '{}', '{"traceparent": "$TP3"}') RETURNING id;
		INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.set', '{}') RETURNING id /*traceparent='$TP'*/;
		COMMIT;
		INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.none', '{}') RETURNING id;});
	my @ids = $ids =~ /(\d+)/g;
	is(join(',', map { header_of($node, $_, 'traceparent') } @ids), "$TP3,$TP2,",
		"$what: a row's own header wins over the setting, the setting over the comment; no context, none stored");
	my ($ret, $o2, $e2) = $node->psql('postgres', q{SET queuebox.traceparent = '00-nope'});
	if ($what eq 'extension')
	{
		like($e2, qr/invalid value for parameter "queuebox\.traceparent".*\n.*DETAIL:  A traceparent is 00-<trace-id: 32 hex>/,
			"$what: a bad queuebox.traceparent is refused, saying what one looks like");
	}
	else
	{
		my $bad = $node->safe_psql('postgres', q{BEGIN; SET LOCAL queuebox.traceparent = '00-nope';
			INSERT INTO queuebox.outbox (topic, payload) VALUES ('orders.bad', '{}') RETURNING headers; COMMIT;});
		like($bad, qr/^\{\}/, "$what: a bad queuebox.traceparent is passed over (no extension checks the setting)");
	}
	qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state <> 'sent' AND topic LIKE 'orders.%'}, '0',
		"$what: every row is delivered");
	my ($none) = @{ requests_of($node, $ids[2]) };
	ok(!exists $none->{headers}{traceparent}, "$what: a row with no context is sent with no traceparent");
	return;
}

# ---- the extension
my $node = qb_node('trace');
local $ENV{PGHOST} = $node->host;
local $ENV{PGPORT} = $node->port;
local $ENV{PGUSER} = 'postgres' if !$ENV{PGUSER};
local $ENV{PGDATABASE} = 'postgres';
my $port = qb_free_port();
qb_configure($node, doc() . <<"EOY");
http: { listen: "127.0.0.1:$port" }
sources:
  shop:
    type: http
    path: /shop
    idempotencyKeyPath: \$.id
    eventTypePath: \$.type
    topic: "shop.{{ eventType }}"
  jobs:
    type: http
    path: /jobs
    idempotencyKeyPath: \$.id
    consumption: pull
inbox:
  relay: { pollIntervalMs: 50 }
EOY
traced($node, 'extension');

# (e) a webhook's traceparent: kept, relayed, delivered as a child; pulled
my $http = HTTP::Tiny->new(timeout => 10);
qb_wait_for(sub { $http->get("http://127.0.0.1:$port/healthz")->{status} == 200 }, 'the ingress listens');
my $r = $http->request('POST', "http://127.0.0.1:$port/inbox/shop", {
	content => $json->encode({ id => 'w-1', type => 'paid' }),
	headers => { 'Content-Type' => 'application/json', traceparent => $TP3, tracestate => 'shop=1' } });
is($r->{status}, 202, 'a webhook with a traceparent is accepted');
is($node->safe_psql('postgres', q{SELECT headers->>'traceparent' FROM queuebox.inbox WHERE idempotency_key = 'w-1'}),
	$TP3, 'the inbox row keeps the traceparent it arrived with');
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE topic = 'shop.paid' AND state = 'sent'}, '1',
	'the relay forwards it and the outbox delivers it');
my $oid = $node->safe_psql('postgres', q{SELECT id FROM queuebox.outbox WHERE topic = 'shop.paid'});
is(header_of($node, $oid, 'traceparent'), $TP3, 'the relayed outbox row carries the webhook\'s traceparent');
my ($req) = @{ requests_of($node, $oid) };
like($req->{headers}{traceparent} // '', qr/^00-11111111111111111111111111111111-(?!2222222222222222)[0-9a-f]{16}-00$/,
	'the delivery of a relayed webhook is a child of the webhook\'s context');
is($req->{headers}{tracestate}, 'shop=1', 'with its tracestate');
$r = $http->request('POST', "http://127.0.0.1:$port/inbox/jobs", {
	content => $json->encode({ id => 'j-1' }),
	headers => { 'Content-Type' => 'application/json', traceparent => $TP } });
is($r->{status}, 202, 'a pull webhook with a traceparent is accepted');
is($node->safe_psql('postgres', q{SELECT headers->>'traceparent' FROM queuebox.inbox_claim('jobs', 1, 30000)}),
	$TP, 'a pull claim returns the traceparent the webhook arrived with');
$node->stop;

# ---- the daemon on PostgreSQL
my $dn = qbd_node('traced');
$ENV{PGHOST} = $dn->host;
$ENV{PGPORT} = $dn->port;
my $d = qbd_start($dn, doc(database => { url => qbd_url($dn) }), name => 'trace');
qb_wait_query($dn, q{SELECT to_regclass('queuebox.outbox') IS NOT NULL}, 't', 'daemon: the schema is there');
traced($dn, 'daemon');
qbd_signal($d, 'TERM');
qbd_wait_exit($d, 30);

done_testing();
