# QueueBoxRabbit.pm
#   A private RabbitMQ broker for the TAP tests, and a client to look into it.
#
#   - rmq_start:    start Debian's rabbitmq-server on loopback as the current
#                   user, with everything of its own under the test's temp
#                   dir: node qbtest@localhost, AMQP, distribution and epmd
#                   ports picked free, mnesia, logs, config, an empty
#                   enabled-plugins file, an Erlang cookie under a private
#                   HOME.  Waits for the log's "Server startup complete" and
#                   an AMQP answer (no rabbitmqctl: each call boots an
#                   Erlang VM, CPU the broker's own boot needs).  Calling it
#                   again with the same handle restarts the broker on the
#                   same ports and data (durable queues and persistent
#                   messages survive).  tls => 1 adds an amqps listener
#                   ($r->{tls_port}) with a certificate for localhost signed
#                   by a test CA ($r->{ca}).
#   - rmq_stop:     `rabbitmqctl stop` (a graceful shutdown: clients get
#                   connection.close 320), then waits for the process;
#                   rmq_kill: SIGKILL to the Erlang VM (an abrupt loss).
#                   Both also stop the private epmd.  An END block stops
#                   every broker still running, whatever happened.
#   - rmq_tool:     run test/brokers/amqp_tool (declare, bind, publish with
#                   confirms, count, get);
#                   rmq_count, rmq_get: a queue's ready messages, and every
#                   message taken off it (decoded JSON lines).
#   - rmq_consume:  a process consuming a queue into a file as messages
#                   arrive, across broker restarts (TAP 061's record).
#
# Every wait is bounded and dies with what it waited for.

package QueueBoxRabbit;

use strict;
use warnings;

use Carp;
use Exporter 'import';
use File::Path qw(make_path);
use IPC::Run;
use JSON::PP;
use POSIX qw(WNOHANG setsid);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use QueueBoxTest qw(qb_free_port qb_test_binary);

our @EXPORT = qw(
  rmq_start rmq_stop rmq_kill rmq_running rmq_ctl
  rmq_tool rmq_count rmq_get rmq_consume
);

my $SERVER = '/usr/lib/rabbitmq/bin/rabbitmq-server';
my $CTL = '/usr/lib/rabbitmq/bin/rabbitmqctl';
my @live;


# The environment every rabbitmq-server and rabbitmqctl of this broker runs in.
sub broker_env
{
	my ($r) = @_;
	my $d = $r->{dir};
	return (
		HOME => "$d/home",
		RABBITMQ_NODENAME => $r->{node},
		RABBITMQ_NODE_IP_ADDRESS => '127.0.0.1',
		RABBITMQ_NODE_PORT => $r->{port},
		RABBITMQ_DIST_PORT => $r->{dist_port},
		ERL_EPMD_PORT => $r->{epmd_port},
		ERL_EPMD_ADDRESS => '127.0.0.1',
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS =>
		  '-kernel inet_dist_use_interface {127,0,0,1}',
		RABBITMQ_MNESIA_BASE => "$d/mnesia",
		RABBITMQ_LOG_BASE => "$d/log",
		RABBITMQ_CONFIG_FILE => "$d/rabbitmq.conf",
		RABBITMQ_ENABLED_PLUGINS_FILE => "$d/enabled_plugins",
		RABBITMQ_CONF_ENV_FILE => "$d/rabbitmq-env.conf",
		RABBITMQ_PID_FILE => "$d/rabbitmq.pid",
		RABBITMQ_ALLOW_INPUT => '',
		LANG => 'C.UTF-8',
		LC_ALL => 'C.UTF-8');
}

# run_env($r, \@cmd, $timeout_s): run a command in the broker's environment;
# returns (exit status, output).
sub run_env
{
	my ($r, $cmd, $timeout) = @_;
	my %env = broker_env($r);
	local @ENV{ keys %env } = values %env;
	my $out = '';
	my $h = IPC::Run::start($cmd, '<', \undef, '>&', \$out,
		IPC::Run::timeout($timeout // 60));
	my $ok = eval { $h->finish; 1 };
	if (!$ok)
	{
		$h->kill_kill;
		return (-1, "$out\n(timed out after " . ($timeout // 60) . " s)");
	}
	return ($h->result(0), $out);
}

# rmq_ctl($r, @args): rabbitmqctl against this broker; dies on failure.
sub rmq_ctl
{
	my ($r, @args) = @_;
	my ($rc, $out) = run_env($r, [ $CTL, '-n', $r->{node}, @args ], 60);
	die "rabbitmqctl @args failed ($rc): $out" if $rc != 0;
	return $out;
}

sub rmq_running
{
	my ($r) = @_;
	return $r->{pid} && kill(0, $r->{pid});
}

# rmq_start(name => 'mq') or rmq_start($r) to start a stopped broker again.
sub rmq_start
{
	my $r;
	if (@_ == 1 && ref $_[0])
	{
		$r = shift;
	}
	else
	{
		my (%o) = @_;
		die "rabbitmq-server is not installed ($SERVER missing); scripts/setup.sh installs it"
		  unless -x $SERVER && -x $CTL;
		my $name = $o{name} // 'rmq';
		my $dir = "$PostgreSQL::Test::Utils::tmp_check/rabbitmq_${name}_$$";
		$r = {
			name => $name,
			dir => $dir,
			node => 'qbtest@localhost',
			port => qb_free_port(),
			dist_port => qb_free_port(),
			epmd_port => qb_free_port(),
		};
		make_path("$dir/home", "$dir/mnesia", "$dir/log");
		chmod 0700, "$dir/home";
		# a private cookie: the CLI and the node read it from HOME
		my @c = ('A' .. 'Z');
		open(my $ck, '>', "$dir/home/.erlang.cookie") or die "cookie: $!";
		print $ck join('', map { $c[ int(rand(@c)) ] } 1 .. 20);
		close $ck;
		chmod 0400, "$dir/home/.erlang.cookie";
		for my $f ('enabled_plugins', 'rabbitmq-env.conf')
		{
			open(my $fh, '>', "$dir/$f") or die "$f: $!";
			close $fh;
		}
		open(my $cf, '>', "$dir/rabbitmq.conf") or die "rabbitmq.conf: $!";
		print $cf <<"EOC";
listeners.tcp.default = 127.0.0.1:$r->{port}
# a test machine's disk may be small: never block publishers for it
disk_free_limit.absolute = 1MB
log.console = false
log.file.level = info
EOC
		if ($o{tls})
		{
			make_certs($dir);
			$r->{tls_port} = qb_free_port();
			$r->{ca} = "$dir/tls/ca.pem";
			print $cf <<"EOC";
listeners.ssl.default = 127.0.0.1:$r->{tls_port}
ssl_options.cacertfile = $dir/tls/ca.pem
ssl_options.certfile = $dir/tls/server.pem
ssl_options.keyfile = $dir/tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
EOC
		}
		close $cf;
		$r->{url} = "amqp://guest:guest\@127.0.0.1:$r->{port}/";
		push @live, $r;
	}
	die "broker $r->{name} is already running" if rmq_running($r);

	my $t0 = time;
	my %env = broker_env($r);
	# the broker's own log, appended to at each start: its "Server startup
	# complete" line from here on is this start's
	my $log = "$r->{dir}/log/$r->{node}.log";
	my $log_from = (-s $log) || 0;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		setsid();
		@ENV{ keys %env } = values %env;
		open(STDIN, '<', '/dev/null');
		open(STDOUT, '>>', "$r->{dir}/server.out") or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		exec($SERVER) or POSIX::_exit(127);
	}
	$r->{pid} = $pid;

	# Started: the log says the boot is complete (the event rabbitmqctl
	# await_startup waits for) and the AMQP listener answers.  Both are
	# read cheaply every 100 ms: a rabbitmqctl call starts an Erlang VM of
	# its own, and a loop of them took the CPU the broker boots on.
	my $deadline = time + 120;
	my $booted = 0;
	my $tout = '';
	while (1)
	{
		$booted ||= -e $log && slurp_file($log, $log_from) =~ /Server startup complete/;
		if ($booted)
		{
			my $trc;
			($trc, $tout) = tool_run($r, 'ping');
			last if $trc == 0;
		}
		if (waitpid($pid, WNOHANG) == $pid)
		{
			$r->{pid} = undef;
			die "rabbitmq-server exited during start-up (status $?); see $r->{dir}/server.out and $r->{dir}/log:\n"
			  . tail_file("$r->{dir}/server.out");
		}
		die 'rabbitmq-server did not start within 120 s: '
		  . ($booted ? "booted, but AMQP on port $r->{port} does not answer: $tout\n" : "no \"Server startup complete\" in $log\n")
		  . tail_file("$r->{dir}/server.out")
		  if time > $deadline;
		usleep(100_000);
	}
	note sprintf('rabbitmq %s started: port %d, pid %d, in %.1f s',
		$r->{name}, $r->{port}, $pid, time - $t0);
	return $r;
}

# make_certs($dir): a CA and a server certificate for localhost under
# $dir/tls (openssl CLI).
sub make_certs
{
	my ($dir) = @_;
	my $t = "$dir/tls";
	make_path($t);
	open(my $ext, '>', "$t/ext.cnf") or die "ext.cnf: $!";
	print $ext "subjectAltName=DNS:localhost\n";
	close $ext;
	for my $cmd (
		[ qw(openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=queuebox-test-ca),
			'-keyout', "$t/ca.key", '-out', "$t/ca.pem" ],
		[ qw(openssl req -newkey rsa:2048 -nodes -subj /CN=localhost),
			'-keyout', "$t/server.key", '-out', "$t/server.csr" ],
		[ qw(openssl x509 -req -days 2 -CAcreateserial),
			'-in', "$t/server.csr", '-CA', "$t/ca.pem", '-CAkey', "$t/ca.key",
			'-extfile', "$t/ext.cnf", '-out', "$t/server.pem" ])
	{
		my ($out, $err) = ('', '');
		IPC::Run::run($cmd, '<', \undef, '>', \$out, '2>', \$err)
		  or die "@$cmd failed: $err";
	}
	return;
}

sub tail_file
{
	my ($f) = @_;
	return '' unless -e $f;
	my $t = slurp_file($f);
	my @l = split /\n/, $t;
	splice(@l, 0, @l - 30) if @l > 30;
	return join("\n", @l) . "\n";
}

sub wait_gone
{
	my ($r, $timeout) = @_;
	my $deadline = time + $timeout;
	while (time < $deadline)
	{
		return 1 if waitpid($r->{pid}, WNOHANG) == $r->{pid};
		usleep(50_000);
	}
	return 0;
}

sub stop_epmd
{
	my ($r) = @_;
	my $epmd = '/usr/lib/erlang/bin/epmd';
	$epmd = 'epmd' unless -x $epmd;
	run_env($r, [ $epmd, '-port', $r->{epmd_port}, '-kill' ], 10);
	return;
}

# rmq_stop($r): a graceful shutdown, then the process group if it lingers.
sub rmq_stop
{
	my ($r) = @_;
	return unless $r->{pid};
	my $t0 = time;
	my ($rc, $out) = run_env($r, [ $CTL, '-n', $r->{node}, 'stop' ], 60);
	note "rabbitmqctl stop: $out" if $rc != 0;
	if (!wait_gone($r, 60))
	{
		diag "rabbitmq $r->{name} did not stop within 60 s; killing it";
		kill 'KILL', -$r->{pid};
		waitpid($r->{pid}, 0);
	}
	$r->{pid} = undef;
	stop_epmd($r);
	note sprintf('rabbitmq %s stopped in %.1f s', $r->{name}, time - $t0);
	return;
}

# rmq_kill($r): SIGKILL to the whole broker (the Erlang VM and its shell).
sub rmq_kill
{
	my ($r) = @_;
	return unless $r->{pid};
	kill 'KILL', -$r->{pid};
	waitpid($r->{pid}, 0);
	$r->{pid} = undef;
	# erl_child_setup and epmd left their group: the cookie dir is ours
	stop_epmd($r);
	note "rabbitmq $r->{name} killed";
	return;
}

END
{
	my $status = $?;
	for my $r (@live)
	{
		next unless $r->{pid};
		eval { rmq_stop($r); 1 } or do
		{
			kill 'KILL', -$r->{pid} if $r->{pid};
		};
	}
	$? = $status;
}

sub tool_run
{
	my ($r, @args) = @_;
	my $out = '';
	my $err = '';
	my $h = IPC::Run::start([ qb_test_binary('test/brokers/amqp_tool'), $r->{url}, @args ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	my $ok = eval { $h->finish; 1 };
	if (!$ok)
	{
		$h->kill_kill;
		return (-1, "amqp_tool @args timed out: $err");
	}
	return ($h->result(0), $h->result(0) == 0 ? $out : $err);
}

# rmq_tool($r, @commands): amqp_tool's output; dies on failure.
sub rmq_tool
{
	my ($r, @args) = @_;
	my ($rc, $out) = tool_run($r, @args);
	die "amqp_tool @args failed: $out" if $rc != 0;
	return $out;
}

sub rmq_count
{
	my ($r, $queue) = @_;
	my $n = rmq_tool($r, 'count', $queue);
	chomp $n;
	return $n;
}

# rmq_get($r, $queue): take every message off the queue; each a hash with
# exchange, routing_key, redelivered, message_id, correlation_id,
# content_type, delivery_mode, headers, header_kinds, body.
sub rmq_get
{
	my ($r, $queue) = @_;
	my @m = map { decode_json($_) } grep { /\S/ } split /\n/,
	  rmq_tool($r, 'get', $queue);
	return \@m;
}

# rmq_consume($r, $queue, $out, $stop): a process consuming $queue into the
# file $out (amqp_tool consume: a JSON line per message, flushed before its
# ack), connecting again 200 ms after each loss (a broker restart), until
# the file $stop exists and the queue was quiet for a second, or the test
# is gone.  Returns its pid: create $stop, then wait for it.
sub rmq_consume
{
	my ($r, $queue, $out, $stop) = @_;
	my $tool = qb_test_binary('test/brokers/amqp_tool');
	my $parent = $$;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	return $pid if $pid;
	while (getppid() == $parent)
	{
		my $err = '';
		eval { IPC::Run::run([ $tool, $r->{url}, 'consume', $queue, $stop ], '<', \undef, '>>', $out, '2>', \$err) };
		POSIX::_exit(0) if !$@ && $? == 0;
		usleep(200_000);
	}
	POSIX::_exit(1);
}

1;
