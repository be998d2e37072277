# QueueBoxNetns.pm
#   Network namespaces for the fault tests: a test runs in a user and network
#   namespace of its own (unshare --user --net: no root needed, nothing of
#   the host's network touched), with child namespaces joined to it by veth
#   pairs, and faults made by nftables rules inside one of them.
#
#   - qbn_enter:        in the test's BEGIN block: skip_all with the reason
#                       when a namespace, a veth pair or an nftables table
#                       cannot be made here, else exec the test again inside
#                       unshare --user --net (once: QB_NETNS_INNER marks it).
#                       qbn_enter(optional => 1): return false instead of
#                       skipping (the reason in $QueueBoxNetns::why), true
#                       inside the namespace
#   - qbn_sh:           run a command, die with its output when it fails
#   - qbn_ns_new /      a child namespace held by a sleeping process; the
#     qbn_in_ns         command prefix (nsenter) that runs inside it
#   - qbn_veth:         a veth pair between this namespace and a child
#   - qbn_fault_on /    table inet qbfault in a child namespace: input and
#     qbn_fault_off     output chains dropping what the matches take (a
#                       partition: "ip saddr X"; loss: $QBN_LOSS); off
#                       deletes it and returns the packets it dropped
#
# The child namespaces are killed when the test exits.

package QueueBoxNetns;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(qbn_enter qbn_sh qbn_ns_new qbn_in_ns qbn_veth qbn_fault_on qbn_fault_off $QBN_LOSS);

# 10 % of the packets, both ways, at random (nft numgen)
our $QBN_LOSS = 'numgen random mod 100 < 10';

my %ns;    # child namespace name => pid of the process that holds it

# qbn_enter(): call from BEGIN, before PostgreSQL::Test::Utils is loaded
# (its INIT must run inside the namespace, not in the process replaced)
our $why = '';

sub qbn_enter
{
	my (%o) = @_;
	my $gid = (split ' ', $()[0];
	my @unshare = ('unshare', '--user', "--map-user=$<", "--map-group=$gid", '--net', '--keep-caps', '--');
	return 1 if $ENV{QB_NETNS_INNER};
	# can this process make what the test needs?
	my $probe = 'ip link set lo up && ip link add qbprobe0 type veth peer name qbprobe1 '
	  . '&& nft add table inet qbprobe && unshare --net true';
	my $out = `@unshare sh -c '$probe' 2>&1`;
	if ($? != 0)
	{
		$out =~ s/\s+$//;
		$why = "network namespaces, veth pairs or nftables cannot be made here "
		  . "(unshare --user --net, ip, nft; scripts/setup.sh installs nftables): $out";
		return 0 if $o{optional};
		plan skip_all => $why;
	}
	$ENV{QB_NETNS_INNER} = 1;
	exec(@unshare, $^X, (map { "-I$_" } grep { !ref } @INC), $0, @ARGV)
	  or die "exec unshare: $!";
}

sub qbn_sh
{
	my (@cmd) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run(\@cmd, '>', \$out, '2>', \$err)
	  or die "@cmd failed: $err$out";
	return $out;
}

# qbn_in_ns($name, @cmd): @cmd run inside child namespace $name
sub qbn_in_ns
{
	my ($name, @cmd) = @_;
	return ('nsenter', "--net=/proc/$ns{$name}/ns/net", '--', @cmd);
}

# qbn_ns_new($name): a network namespace held by a sleeping child, its
# loopback up
sub qbn_ns_new
{
	my ($name) = @_;
	my $mine = readlink('/proc/self/ns/net');
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		exec('unshare', '--net', '--', 'sleep', '100000') or POSIX::_exit(127);
	}
	my $deadline = time + 10;
	while (time < $deadline)
	{
		my $l = readlink("/proc/$pid/ns/net") // '';
		last if $l ne '' && $l ne $mine;
		usleep(10_000);
	}
	$ns{$name} = $pid;
	qbn_sh(qbn_in_ns($name, qw(ip link set lo up)));
	return $pid;
}

# qbn_veth($name, $here, $there, [addresses here], $address there): a veth
# pair, $here in this namespace, $there in child namespace $name (/24s)
sub qbn_veth
{
	my ($name, $here, $there, $here_addrs, $there_addr) = @_;
	qbn_sh('ip', 'link', 'add', $here, 'type', 'veth', 'peer', 'name', $there, 'netns', $ns{$name});
	qbn_sh('ip', 'addr', 'add', "$_/24", 'dev', $here) for @$here_addrs;
	qbn_sh('ip', 'link', 'set', $here, 'up');
	qbn_sh(qbn_in_ns($name, 'ip', 'addr', 'add', "$there_addr/24", 'dev', $there));
	qbn_sh(qbn_in_ns($name, 'ip', 'link', 'set', $there, 'up'));
}

# qbn_fault_on($name, $in_rule, $out_rule): table inet qbfault in child
# namespace $name, its input and output chains dropping (and counting)
# what the rules match.  Returns the time it took effect.
sub qbn_fault_on
{
	my ($name, $in_rule, $out_rule) = @_;
	my $file = "$PostgreSQL::Test::Utils::tmp_check/nft_${name}_" . int(time * 1000) . '.nft';
	open(my $fh, '>', $file) or die "$file: $!";
	print $fh "table inet qbfault {\n"
	  . "  chain in { type filter hook input priority 0; policy accept; $in_rule counter drop; }\n"
	  . "  chain out { type filter hook output priority 0; policy accept; $out_rule counter drop; }\n}\n";
	close $fh;
	qbn_sh(qbn_in_ns($name, 'nft', '-f', $file));
	return time;
}

# qbn_fault_off($name): the table deleted; returns (the time it ended, the
# packets it dropped)
sub qbn_fault_off
{
	my ($name) = @_;
	my $t = time;
	my $rules = qbn_sh(qbn_in_ns($name, qw(nft list table inet qbfault)));
	qbn_sh(qbn_in_ns($name, qw(nft delete table inet qbfault)));
	my $dropped = 0;
	$dropped += $1 while $rules =~ /counter packets (\d+)/g;
	return ($t, $dropped);
}

END
{
	local $?;
	kill 'KILL', $_ for values %ns;
}

1;
