# 037_ingress_hostile.pl
#   The ingress against hostile clients (issue 13, part 3): connections
#   closed by the peer mid-request are released at once, not at the idle
#   timeout.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use HTTP::Tiny;
use IO::Socket::INET;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use QueueBoxTest;

my $node = qb_node('hostile', workers => 0, conf => "queuebox.relay_worker = off\n");
my $port = qb_free_port();
my $base = "http://127.0.0.1:$port";
# an idle timeout far longer than any wait below: a slot released before it
# was released by the close, not by the timeout
qb_configure($node, <<"EOY");
http: { listen: "127.0.0.1:$port", connectionTimeoutMs: 120000, maxConnections: 50 }
sources:
  plain: { type: http, path: /plain, idempotencyKeyPath: \$.id, consumption: pull }
EOY
my $http = HTTP::Tiny->new(timeout => 10, keep_alive => 0);
qb_wait_for(sub { $http->get("$base/healthz")->{status} == 200 }, 'the ingress listens', 30);

sub server_sockets
{
	my ($state) = @_;
	my $out = `ss -Htn state $state '( sport = :$port )' 2>/dev/null`;
	return scalar(grep { /\S/ } split /\n/, $out);
}

# ---- 40 truncated requests (fewer body bytes than Content-Length), each closed by the client
for my $i (1 .. 40)
{
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp') or die "connect: $!";
	print $s "POST /inbox/plain HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	  . "Content-Length: 100\r\n\r\n{\"id\":\"t$i\"";
	close $s;
}
qb_wait_for(sub { server_sockets('close-wait') == 0 },
	'the server side of every connection the peer closed mid-request is released (no CLOSE-WAIT left)', 30);
my $r = $http->post("$base/inbox/plain", { content => '{"id":"after-truncated"}' });
is($r->{status}, 202, 'a valid webhook right after them is answered');
is(qb_inbox_count($node), 1, 'only it was stored');

done_testing();
