# test/perl/QueueBoxOtlp.pm
#   An OTLP/HTTP receiver for the TAP tests (test/node/otlp_receiver.mjs):
#   it records every span it is sent, one JSON line each, and answers each
#   post with the status it was started with.
#
#   otlp_receiver($status)      a receiver on a free port: { pid, port, out, base };
#                               out is its spans file ($out.bad: a post it could not decode)
#   otlp_receiver_stop($r)      stop it (every receiver still running is stopped
#                               at the end, even when the test dies early)
#   otlp_spans($r)              the spans it holds, each a hash
package QueueBoxOtlp;

use strict;
use warnings;

use Exporter 'import';
use JSON::PP;
use POSIX ();
use PostgreSQL::Test::Utils;

use QueueBoxTest;

our @EXPORT = qw(otlp_receiver otlp_receiver_stop otlp_spans);

my $seq = 0;
my %live;    # pid => the process that started it (a forked child stops none)
END { kill 'TERM', grep { $live{$_} == $$ } keys %live; }

sub otlp_receiver
{
	my ($status) = @_;
	my $node_dir = qb_npm_dir('test/node');
	my $base = "$PostgreSQL::Test::Utils::tmp_check/otlp_${$}_" . ++$seq;
	unlink "$base.port";
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDOUT, '>>', "$base.log");
		open(STDERR, '>&', \*STDOUT);
		exec('node', "$node_dir/otlp_receiver.mjs", "$base.port", "$base.jsonl", $status // 200) or POSIX::_exit(127);
	}
	$live{$pid} = $$;
	qb_wait_for(sub { -s "$base.port" }, "an OTLP receiver listens (answering " . ($status // 200) . ')', timeout => 30);
	return { pid => $pid, port => slurp_file("$base.port"), out => "$base.jsonl", base => $base };
}

sub otlp_receiver_stop
{
	my ($r) = @_;
	kill 'TERM', $r->{pid};
	waitpid($r->{pid}, 0);
	delete $live{ $r->{pid} };
	return;
}

sub otlp_spans
{
	my ($r) = @_;
	return [] unless -e $r->{out};
	return [ map { decode_json($_) } grep { /\n\z/ } split /^/, slurp_file($r->{out}) ];
}

1;
