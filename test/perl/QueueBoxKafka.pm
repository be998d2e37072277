# QueueBoxKafka.pm
#   TAP helpers for the Kafka destination and source (test/t/delivery/011_kafka.pl,
#   test/t/inbox/014_kafka_source.pl): a Kafka cluster in a helper process
#   (test/brokers/kafka_mock, librdkafka's mock cluster on loopback TCP),
#   driven through its stdin.
#
#   - qb_kafka_start:    start it with topics (and topics it must not know);
#                        returns { bootstrap, ... } once it listens
#   - qb_kafka_cmd:      one command (errors, down, up, coordinator,
#                        leader), its answer
#   - qb_kafka_consume:  every message of a topic, each a hash with
#                        partition, offset, key, value, headers
#   - qb_kafka_produce:  send one message (topic, value, key, headers,
#                        partition); returns its "topic/partition/offset"
#   - qb_kafka_committed: a group's committed offsets on a topic, one a
#                        partition (-1: none)
#   - qb_kafka_stop:     quit and reap it
#
# Every wait is bounded and says what it waited for when it gives up.

package QueueBoxKafka;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use QueueBoxTest qw(qb_test_binary);

our @EXPORT = qw(qb_kafka_start qb_kafka_cmd qb_kafka_consume qb_kafka_produce qb_kafka_committed qb_kafka_stop);

my @live;

# the helper as the installcheck copy built it (TESTDIR), else this tree's

# qb_kafka_start(topics => ['events:3'], missing => ['nowhere'], brokers => 1)
sub qb_kafka_start
{
	my (%o) = @_;
	my $dir = $PostgreSQL::Test::Utils::tmp_check;
	my $file = "$dir/kafka_mock_$$." . (scalar(@live) + 1) . '.bootstrap';
	my @cmd = (qb_test_binary('test/brokers/kafka_mock'), '--bootstrap-file', $file, '--brokers', $o{brokers} // 1);
	push @cmd, '--topic', $_ for @{ $o{topics} // [] };
	push @cmd, '--missing', $_ for @{ $o{missing} // [] };
	unlink $file;

	my $k = { in => '', out => '', err => '', file => $file };
	$k->{h} = IPC::Run::start(\@cmd, '<', \$k->{in}, '>', \$k->{out}, '2>', \$k->{err});
	push @live, $k;
	my $deadline = time + 30;
	while (!-s $file && time < $deadline)
	{
		die "kafka_mock exited: $k->{err}" unless $k->{h}->pumpable;
		$k->{h}->pump_nb;
		usleep(20_000);
	}
	die "kafka_mock wrote no bootstrap file within 30 s: $k->{err}" unless -s $file;
	($k->{bootstrap}) = slurp_file($file) =~ /^(\S+)/;
	note "kafka mock cluster at $k->{bootstrap}";
	return $k;
}

# qb_kafka_cmd($k, 'down 1'): the lines answered, up to and including the
# last one ("ok ...", "error ..." or "end N ...").
sub qb_kafka_cmd
{
	my ($k, $cmd, %o) = @_;
	$k->{out} = '';
	$k->{in} .= "$cmd\n";
	my $deadline = time + ($o{timeout} // 60);
	while ($k->{out} !~ /^(ok.*|error.*|end \d+.*)\n\z/m && time < $deadline)
	{
		$k->{h}->pump_nb;
		usleep(20_000);
	}
	die "kafka_mock did not answer \"$cmd\" within the timeout; said: $k->{out} $k->{err}"
	  unless $k->{out} =~ /^(ok.*|error.*|end \d+.*)\n\z/m;
	return $k->{out};
}

# qb_kafka_consume($k, $topic): [ {partition, offset, key, value, headers} ]
# in partition then offset order.
sub qb_kafka_consume
{
	my ($k, $topic) = @_;
	my $out = qb_kafka_cmd($k, "consume $topic");
	die "consume $topic: $out" unless $out =~ /^end (\d+)\n\z/m;
	my @msgs = map { decode_json($_) } grep { /^\{/ } split /\n/, $out;
	return [ sort { $a->{partition} <=> $b->{partition} || $a->{offset} <=> $b->{offset} } @msgs ];
}

# qb_kafka_produce($k, topic => 't', value => '{"a":1}', key => 'k',
#   headers => { 'message-id' => 'm-1' }, partition => 0): "t/P/O" once the
# cluster has it (the helper flushes before it answers)
sub qb_kafka_produce
{
	my ($k, %m) = @_;
	my %msg = (topic => $m{topic}, value => $m{value});
	$msg{key} = $m{key} if defined $m{key};
	$msg{headers} = $m{headers} if $m{headers};
	$msg{partition} = $m{partition} + 0 if defined $m{partition};
	my $out = qb_kafka_cmd($k, 'produce ' . JSON::PP->new->utf8->canonical->encode(\%msg));
	die "produce to $m{topic}: $out" unless $out =~ /^ok (\d+) (\d+)\n\z/;
	return "$m{topic}/$1/$2";
}

# qb_kafka_committed($k, $group, $topic): [ offset of partition 0, 1, ... ]
sub qb_kafka_committed
{
	my ($k, $group, $topic) = @_;
	my $out = qb_kafka_cmd($k, "committed $group $topic");
	die "committed $group $topic: $out" unless $out =~ /^ok((?: -?\d+)+)\n\z/;
	return [ map { $_ + 0 } split ' ', $1 ];
}

sub qb_kafka_stop
{
	my ($k) = @_;
	return unless $k->{h};
	$k->{in} .= "quit\n";
	eval { $k->{h}->finish; };
	$k->{h}->kill_kill if $@;
	@live = grep { $_ != $k } @live;
	delete $k->{h};
	return;
}

END
{
	for my $k (@live)
	{
		eval { $k->{h}->kill_kill; } if $k->{h};
	}
}

1;
