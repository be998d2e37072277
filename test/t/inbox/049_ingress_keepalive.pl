# 049_ingress_keepalive.pl
#   Bursts of webhooks on many kept-alive connections: every request is
#   answered on its connection and stored once.  libmicrohttpd 0.9.75 in
#   epoll mode left whole bursts of 128 requests or more unread (the test
#   sink's stall of TAP 020, test/sink/README); this is the same burst
#   against the ingress.  Rows are counted before and after; the waits are
#   bounded, nothing is timed.
use strict;
use warnings;

use IO::Select;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Test::More;
use Time::HiRes qw(time);

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $conns = 256;
my $rounds = 20;
my $node = qb_node('keepalive', workers => 0, conf => "queuebox.relay_worker = off\n");
my $port = qb_free_port();
qb_configure($node, <<"EOY");
http: { listen: "127.0.0.1:$port", maxConnections: 1000 }
sources:
  burst: { type: http, path: /burst, idempotencyKeyHeader: X-Id, consumption: pull }
EOY
qb_wait_for(sub { IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp') },
	'the ingress listens');
is(qb_inbox_count($node), '0', 'the inbox is empty before the bursts');

sub connect_one
{
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp')
	  or die "connect: $!";
	setsockopt($s, IPPROTO_TCP, TCP_NODELAY, 1);
	return $s;
}

# Each round: a POST on every connection at once, then every answer read
# (each connection waits at most 30 s for its own); answers are counted by
# status, and a connection left without one is counted and reopened.
my @socks = map { connect_one() } 1 .. $conns;
my (%status, $unanswered, $sent);
for my $round (1 .. $rounds)
{
	my (%buf, %left);
	for my $i (0 .. $#socks)
	{
		my $key = "r$round-c$i";
		my $body = '{"round": ' . $round . ', "conn": ' . $i . ', "pad": "' . ('x' x 150) . '"}';
		my $req = "POST /inbox/burst HTTP/1.1\r\nHost: qb\r\nContent-Type: application/json\r\n"
		  . "X-Id: $key\r\nContent-Length: " . length($body) . "\r\n\r\n$body";
		syswrite($socks[$i], $req) == length($req) or die "write: $!";
		$sent++;
		$left{ fileno $socks[$i] } = $i;
		$buf{$i} = '';
	}
	my $sel = IO::Select->new(@socks);
	my $deadline = time + 30;
	while (%left && time < $deadline)
	{
		for my $s ($sel->can_read($deadline - time))
		{
			my $i = $left{ fileno $s };
			my $n = sysread($s, my $chunk, 65536);
			if (!$n)
			{
				$sel->remove($s);
				next;
			}
			$buf{$i} .= $chunk;
			next unless $buf{$i} =~ /\A HTTP\/1\.1 \s (\d{3}) .*? \r\n\r\n/sx;
			my ($st, $head) = ($1, $+[0]);
			my ($len) = substr($buf{$i}, 0, $head) =~ /^content-length:\s*(\d+)/mi;
			next if length($buf{$i}) < $head + ($len // 0);
			$status{$st}++;
			$status{example} //= $buf{$i} if $st ne '202';
			delete $left{ fileno $s };
			$sel->remove($s);
		}
	}
	for my $i (values %left)
	{
		$unanswered++;
		close $socks[$i];
		$socks[$i] = connect_one();
	}
}
close $_ for @socks;
$unanswered //= 0;
diag 'an answer other than 202: ' . delete $status{example} if exists $status{example};
note "sent $sent; answers " . join(', ', map { "$_: $status{$_}" } sort keys %status) . "; unanswered $unanswered";

is($sent, $conns * $rounds, "$rounds bursts of $conns requests, one on each kept-alive connection");
is($unanswered, 0, 'every request is answered on its connection');
is($status{202} // 0, $sent, 'every answer is 202 (stored)');
is(qb_inbox_count($node, "source = 'burst'"), $sent, 'the inbox holds one row per request');
is($node->safe_psql('postgres', "SELECT count(DISTINCT idempotency_key) FROM queuebox.inbox WHERE source = 'burst'"),
	$sent, 'each key is stored once');

$node->stop;
done_testing();
