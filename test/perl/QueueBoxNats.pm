# QueueBoxNats.pm
#   NATS helpers of the QueueBox TAP tests (test/t/delivery/012_nats.pl).
#
#   - nats_start / nats_stop: a real nats-server -js on a free loopback port
#     with its store in the test's temp dir; a restarted server keeps its
#     port and store (pass the old server to nats_start).  Every server still
#     running is stopped when the test ends, even when it fails.
#   - nats_add_stream / nats_delete_stream / nats_count / nats_stream /
#     nats_dump: test/brokers/nats_tool (a cnats client; the nats CLI is not
#     installed): create or delete a stream, count its messages, read its
#     settings, read the
#     messages back as hashes (seq, subject, data, headers).
#   - nats_publish / nats_consumer / nats_ack_wait (test/t/inbox/015_nats_source.pl):
#     JetStream publishes with headers, a durable consumer's state
#     (delivered, ack_floor, num_ack_pending, num_redelivered, num_pending,
#     max_ack_pending, ack_wait_ms), and its AckWait changed in place.
#   - nats_thread_masks: a worker's other threads (cnats's) and those that
#     do not block the signals the worker must get itself.
#
# Waits are bounded; nothing here asserts on elapsed time.

package QueueBoxNats;

use strict;
use warnings;

use Carp;
use Exporter 'import';
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use POSIX qw(WNOHANG);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use QueueBoxTest qw(qb_free_port qb_test_binary);

our @EXPORT = qw(nats_start nats_stop nats_add_stream nats_delete_stream nats_count nats_stream nats_dump nats_publish nats_consumer nats_add_consumer nats_ack_wait nats_thread_masks);

my $SERVER = '/usr/sbin/nats-server';
my %live;    # pid -> server


# nats_start(name => 'n1'[, again => $old_server]): start nats-server -js;
# with again, on the old one's port and store.  Returns
# { pid, port, url, dir, log, name }.
sub nats_start
{
	my (%o) = @_;
	my $old = $o{again};
	my $name = $old ? $old->{name} : $o{name} // 'nats';
	my $port = $old ? $old->{port} : qb_free_port();
	my $dir = $old ? $old->{dir} : "${PostgreSQL::Test::Utils::tmp_check}/nats_$name";
	my $log = "$dir.log";
	mkdir $dir unless -d $dir;
	BAIL_OUT("$SERVER is not installed") unless -x $SERVER;

	my $pid = fork();
	croak "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDOUT, '>>', $log or die "cannot open $log: $!";
		open STDERR, '>&', \*STDOUT or die;
		exec $SERVER, '-js', '-a', '127.0.0.1', '-p', $port, '-sd', $dir
		  or die "exec $SERVER: $!";
	}
	my $s = { pid => $pid, port => $port, url => "nats://127.0.0.1:$port",
		dir => $dir, log => $log, name => $name };
	$live{$pid} = $s;

	# ready when JetStream answers (a stream lookup gets "not found")
	my $deadline = time + 30;
	while (time < $deadline)
	{
		croak "nats-server exited at start; see $log" if waitpid($pid, WNOHANG) == $pid;
		my ($rc, $out, $err) = tool($s, 'count', '__probe__');
		return $s if $err =~ /10059|not found/i;
		usleep(100_000);
	}
	nats_stop($s, 'KILL');
	croak "nats-server did not become ready within 30 s; see $log";
}

# nats_stop($server[, 'TERM' | 'KILL']): stop it and reap it (bounded).
sub nats_stop
{
	my ($s, $sig) = @_;
	return unless $s && $live{ $s->{pid} };
	kill $sig // 'TERM', $s->{pid};
	my $deadline = time + 30;
	while (waitpid($s->{pid}, WNOHANG) == 0)
	{
		if (time >= $deadline)
		{
			kill 'KILL', $s->{pid};
			waitpid($s->{pid}, 0);
			last;
		}
		usleep(50_000);
	}
	delete $live{ $s->{pid} };
}

END
{
	my $rc = $?;
	nats_stop($_, 'KILL') for values %live;
	$? = $rc;
}

# tool($server, @args) -> (exit status, stdout, stderr)
sub tool
{
	my ($s, @args) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ qb_test_binary('test/brokers/nats_tool'), $s->{url}, @args ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

# nats_add_stream($server, $name, @subjects[, { dup_window_ms => MS }])
sub nats_add_stream
{
	my ($s, $name, @subjects) = @_;
	my $o = ref $subjects[-1] eq 'HASH' ? pop @subjects : {};
	push @subjects, '-w', $o->{dup_window_ms} if $o->{dup_window_ms};
	my ($rc, $out, $err) = tool($s, 'add-stream', $name, @subjects);
	croak "add-stream $name: $err" if $rc != 0;
	return 1;
}

# The stream's message count; undef when it does not exist.
sub nats_count
{
	my ($s, $name) = @_;
	my ($rc, $out, $err) = tool($s, 'count', $name);
	return undef if $rc != 0;
	chomp $out;
	return $out;
}

# nats_delete_stream($server, $name): dies when it cannot
sub nats_delete_stream
{
	my ($s, $name) = @_;
	my ($rc, $out, $err) = tool($s, 'delete-stream', $name);
	croak "delete-stream $name: $err" if $rc != 0;
	return 1;
}

# The stream's settings {subjects, retention, storage, description}; undef
# when it does not exist.
sub nats_stream
{
	my ($s, $name) = @_;
	my ($rc, $out, $err) = tool($s, 'stream', $name);
	return undef if $rc != 0;
	return decode_json($out);
}

# Every message of the stream, in stream order: [{seq, subject, data, headers,
# time_us (when the stream stored it)}].
sub nats_dump
{
	my ($s, $name) = @_;
	my ($rc, $out, $err) = tool($s, 'dump', $name);
	croak "dump $name: $err" if $rc != 0;
	return [ map { decode_json($_) } grep { $_ ne '' } split /\n/, $out ];
}

# nats_publish($server, $subject, $data, n => N, headers => { name => value })
# publishes N times (default 1); "{i}" in data and header values becomes
# 1..N.  Returns [{seq, duplicate}] (duplicate: the stream dropped it).
sub nats_publish
{
	my ($s, $subject, $data, %o) = @_;
	my @args = ('publish', $subject, $data);
	push @args, '-n', $o{n} if $o{n};
	push @args, map { "$_:$o{headers}{$_}" } sort keys %{ $o{headers} // {} };
	my ($rc, $out, $err) = tool($s, @args);
	croak "publish to $subject: $err" if $rc != 0;
	return [ map { decode_json($_) } grep { $_ ne '' } split /\n/, $out ];
}

# nats_add_consumer($server, $stream, $durable, $subject, $max_ack_pending,
# 'explicit' | 'none'): a durable pull consumer made by hand; dies on failure
sub nats_add_consumer
{
	my ($s, @args) = @_;
	my ($rc, $out, $err) = tool($s, 'add-consumer', @args);
	die "nats_tool add-consumer @args: $err" if $rc != 0;
	return 1;
}

# nats_ack_wait($server, $stream, $durable, $ms): the durable's AckWait set
# to $ms, its other settings kept; dies on failure
sub nats_ack_wait
{
	my ($s, @args) = @_;
	my ($rc, $out, $err) = tool($s, 'ack-wait', @args);
	die "nats_tool ack-wait @args: $err" if $rc != 0;
	return 1;
}

# A durable consumer's state as a hash (ack_wait_ms among it); undef when it
# does not exist.
sub nats_consumer
{
	my ($s, $stream, $durable) = @_;
	my ($rc, $out, $err) = tool($s, 'consumer', $stream, $durable);
	return undef if $rc != 0;
	return decode_json($out);
}

# nats_thread_masks($pid) -> (number of threads besides the main one,
# "tid:SigBlk" of each that lets SIGHUP, SIGINT, SIGUSR1, SIGTERM or SIGURG
# (the latch) through)
sub nats_thread_masks
{
	my ($pid) = @_;
	my @tasks = grep { $_ != $pid } map { m{/(\d+)$} ? $1 : () } glob("/proc/$pid/task/*");
	my @unmasked;
	for my $tid (@tasks)
	{
		my ($blk) = slurp_file("/proc/$pid/task/$tid/status") =~ /^SigBlk:\s*([0-9a-f]+)/m;
		my $mask = hex($blk // '0');
		push @unmasked, "$tid:$blk" if grep { !($mask & (1 << ($_ - 1))) } 1, 2, 10, 15, 23;
	}
	return (scalar @tasks, @unmasked);
}

1;
