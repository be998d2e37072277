# 037_ingress_hostile.pl
#   The ingress against hostile clients (issue 13, part 3), with a valid
#   webhook between the bursts: random bytes, truncated requests, bad and
#   huge Content-Length, chunked bodies with bad sizes, invalid UTF-8 and
#   JSON, deep nesting, NUL bytes, oversized URLs and headers, connections
#   closed by the peer mid-request (released at once, not at the idle
#   timeout), then slow senders and hundreds of idle connections
#   (http.maxConnections and http.connectionTimeoutMs hold).  Every request
#   is answered 4xx or closed, nothing of them is stored, each valid webhook
#   after a burst is answered 202, and /metrics counts what was refused.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use HTTP::Tiny;
use IO::Select;
use IO::Socket::INET;
use Test::More;
use Time::HiRes qw(usleep);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $node = qb_node('hostile', workers => 0, conf => "queuebox.relay_worker = off\n");
my $port = qb_free_port();
my $base = "http://127.0.0.1:$port";
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);

# an idle timeout far longer than any wait below: a slot released before it
# was released by the close, not by the timeout
sub configure
{
	my ($timeout_ms) = @_;
	qb_configure($node, <<"EOY");
http: { listen: "127.0.0.1:$port", connectionTimeoutMs: $timeout_ms, maxConnections: 50 }
sources:
  plain: { type: http, path: /plain, idempotencyKeyPath: \$.id, consumption: pull, maxBodyBytes: 65536 }
EOY
	qb_wait_for(sub { $http->get("$base/healthz")->{status} == 200 }, 'the ingress listens', 30);
}
configure(120000);

sub server_sockets
{
	my ($state) = @_;
	my $out = `ss -Htn state $state '( sport = :$port )' 2>/dev/null`;
	return scalar(grep { /\S/ } split /\n/, $out);
}

sub connect_raw
{
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp')
	  or die "connect: $!";
	return $s;
}

# exchange($bytes): send, then read what comes back for up to half a second;
# the status of the answer, 'closed' when the server closed without one,
# 'none' when it said nothing (the client then closes)
sub exchange
{
	my ($bytes) = @_;
	my $s = connect_raw();
	local $SIG{PIPE} = 'IGNORE';
	syswrite($s, $bytes);
	my ($got, $sel) = ('', IO::Select->new($s));
	while ($sel->can_read(0.5))
	{
		my $n = sysread($s, my $buf, 65536);
		last unless $n;
		$got .= $buf;
		last if $got =~ /\r\n\r\n/;
	}
	close $s;
	return $1 if $got =~ m{^HTTP/1\.[01] (\d{3})};
	return length($got) ? 'garbage' : ($sel->can_read(0) ? 'closed' : 'none');
}

my $valid = 0;
sub valid_webhook
{
	my ($after) = @_;
	$valid++;
	my $r = $http->post("$base/inbox/plain", { content => qq({"id":"valid-$valid"}) });
	is($r->{status}, 202, "a valid webhook right after $after is answered 202");
}

my %seen;
sub burst
{
	my ($what, @requests) = @_;
	my @bad = grep { !/^(4\d\d|closed|none)$/ } map { my $s = exchange($_); $seen{$s}++; $s } @requests;
	is(scalar(@bad), 0, "$what: every request is answered 4xx or closed (" . scalar(@requests) . ')')
	  or diag "answers: @bad";
}

my $post = "POST /inbox/plain HTTP/1.1\r\nHost: x\r\n";
my $json = "Content-Type: application/json\r\n";

# ---- random bytes
srand(13);
burst('random bytes', map { join('', map { chr(int(rand(256))) } 1 .. 1 + int(rand(1500))) } 1 .. 60);
burst('random bytes after a request line',
	map { "POST /inbox/plain HTTP/1.1\r\n" . join('', map { chr(int(rand(256))) } 1 .. 1 + int(rand(800))) . "\r\n\r\n" } 1 .. 40);
valid_webhook('random bytes');

# ---- Content-Length: bad, huge, two of them, a body short of it
burst('bad Content-Length',
	map { "$post${json}Content-Length: $_\r\n\r\n{\"id\":\"cl\"}" } 'abc', '-1', '1e3', '0x10', '99999999999999999999999', '');
burst('two Content-Length headers', "$post${json}Content-Length: 11\r\nContent-Length: 12\r\n\r\n{\"id\":\"cl2\"}");
burst('a huge Content-Length', "$post${json}Content-Length: 4294967296\r\n\r\n{\"id\":\"big\"}");
valid_webhook('bad Content-Length');

# ---- chunked bodies with bad sizes
burst('chunked with bad sizes',
	map { "$post${json}Transfer-Encoding: chunked\r\n\r\n$_" }
	  "zz\r\n{}\r\n0\r\n\r\n", "-5\r\n{}\r\n0\r\n\r\n", "fffffffffffffffffffff\r\n{}\r\n0\r\n\r\n",
	  "3\r\n{\"id\":\"ch\"}\r\n0\r\n\r\n", "2;ext=\x01\r\n{}\r\n0\r\n\r\n");
valid_webhook('bad chunked bodies');

# ---- bodies: invalid UTF-8, invalid JSON, deep nesting, NUL bytes
sub body { my ($b) = @_; return "$post${json}Content-Length: " . length($b) . "\r\nConnection: close\r\n\r\n$b"; }
burst('bodies that are not UTF-8 JSON',
	body("{\"id\":\"u\xff\xfe\"}"), body("{\"id\":\"\xc3\x28\"}"), body('{"id": "x",'), body('{"id":}'),
	body('[' x 30000), body('{"a":' x 20000 . '1' . '}' x 20000), body("{\"id\":\"n\x00ul\"}"), body("\x00\x00\x00"),
	body("{\"id\":\"ok\"}\x00trailing"));
valid_webhook('bad bodies');

# ---- NUL bytes in the request line and headers, oversized URLs and headers
burst('NUL bytes in the head',
	"POST /inbox/pl\x00ain HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
	"$post${json}X-N\x00: v\r\nContent-Length: 11\r\n\r\n{\"id\":\"h0\"}");
# a NUL inside a header value: libmicrohttpd 0.9.75 cuts the line there and
# hands over the part before it, so the ingress cannot see it
# (docs/receiving-webhooks.md); what is stored holds no NUL and can be sent on
is(exchange("$post${json}X-N: v\x00w\r\nContent-Length: 11\r\n\r\n{\"id\":\"h1\"}"), 202,
	'a NUL inside a header value is cut by the HTTP library, and the request taken');
is($node->safe_psql('postgres', q{SELECT headers->>'X-N' FROM queuebox.inbox WHERE idempotency_key = 'h1'}), 'v',
	'what is stored is the value up to the NUL');
$node->safe_psql('postgres', q{DELETE FROM queuebox.inbox WHERE idempotency_key = 'h1'});
burst('oversized URLs', map { "POST /inbox/plain?" . ('q' x $_) . " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" } 70000, 200000);
burst('oversized headers', "$post${json}X-Big: " . ('h' x 100000) . "\r\nContent-Length: 11\r\n\r\n{\"id\":\"h2\"}",
	$post . join('', map { "X-H$_: v\r\n" } 1 .. 8000) . "Content-Length: 11\r\n\r\n{\"id\":\"h3\"}");
valid_webhook('bad heads');

# ---- truncated requests (fewer body bytes than Content-Length, or half a head), each closed by the client
for my $i (1 .. 40)
{
	my $s = connect_raw();
	print $s $i % 2
	  ? "$post${json}Content-Length: 100\r\n\r\n{\"id\":\"t$i\""
	  : "POST /inbox/plain HTTP/1.1\r\nHost: x\r\nContent-Ty";
	close $s;
}
qb_wait_for(sub { server_sockets('close-wait') == 0 },
	'the server side of every connection the peer closed mid-request is released (no CLOSE-WAIT left)', 30);
valid_webhook('40 truncated requests');

is(qb_inbox_count($node), $valid, 'only the valid webhooks were stored');

# ---- with a 2 s idle timeout: slow senders and idle connections hold no slot for long
configure(2000);
{
	my @slow = map { connect_raw() } 1 .. 10;
	# a byte every 300 ms keeps each of them alive; the others are served meanwhile
	for my $k (0 .. 5)
	{
		print $_ substr("$post${json}Content-Length: 11\r\n\r\n", $k, 1) for @slow;
		usleep(300_000);
	}
	valid_webhook('10 slow senders started');
	close $_ for @slow;
}
{
	# more idle connections than http.maxConnections: the ones over it wait
	# in the listen backlog and are taken as the idle timeout frees slots
	my @idle = map { IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp') } 1 .. 300;
	@idle = grep { defined } @idle;
	cmp_ok(scalar(@idle), '>', 0, scalar(@idle) . ' idle connections opened');
	qb_wait_for(sub { server_sockets('established') == 0 }, 'the idle connections are all closed by the server', 60);
	valid_webhook('300 idle connections');
	close $_ for @idle;
}

is(qb_inbox_count($node), $valid, 'only the valid webhooks were stored, after every burst');
my $m = $http->get("$base/metrics")->{content};
like($m, qr/^queuebox_inbox_received_total\{source="plain",result="bad_request"\} [1-9]\d*$/m, '/metrics counts the 400s');
like($m, qr/^queuebox_inbox_received_total\{source="plain",result="too_large"\} [1-9]\d*$/m, '/metrics counts the 413s');
like($m, qr/^queuebox_http_closed_total\{reason="no_request"\} [1-9]\d*$/m,
	'/metrics counts connections closed before a request reached the ingress');
like($m, qr/^queuebox_http_closed_total\{reason="incomplete"\} [1-9]\d*$/m, '/metrics counts requests that never completed');
note 'answers seen: ' . join(', ', map { "$_ x$seen{$_}" } sort keys %seen);
$node->stop;
done_testing();
