# test/perl/QueueBoxDaemon.pm
#   The daemon's TAP helpers: a plain cluster (no shared_preload_libraries,
#   no extension, TCP on loopback), a role that logs in with a password or
#   none, and queuebox-mssqld started, signalled and read like a server.
#
#   qbd_node($name, conf => '...', init => { allows_streaming => 1 })
#                                        the cluster; role qbd (CREATE on
#                                        the database, no superuser); a
#                                        standby may stream from its socket
#   qbd_url($node, user => 'qbd', password => undef, db => 'postgres')
#   qbd_start($node, $yaml, name => 'd1', args => [], wrap => [])   -> daemon handle
#   qbd_signal($d, 'HUP'|'TERM'|'KILL'), qbd_wait_exit($d, $timeout)
#   qbd_log($d), qbd_wait_daemon_log($d, qr/.../, $offset, timeout => 30)
#   qbd_role_pids($d)                    { 'outbox 0' => pid, ... } from ps
#   qbd_run(@args)                       [exit code, stdout, stderr]
#   qbd_upgrade_test($name, $from, fill => sub, snapshot => sub,
#                    upgraded => sub)    the daemon's --migrate from a
#                                        frozen fixture, checked (below)
package QueueBoxDaemon;

use strict;
use warnings;

use POSIX qw(WNOHANG);
use Time::HiRes qw(usleep);
use Exporter 'import';
use IPC::Run;
use Test::More;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use QueueBoxTest;

our @EXPORT = qw(qbd_node qbd_url qbd_start qbd_signal qbd_wait_exit qbd_log
  qbd_wait_daemon_log qbd_role_pids qbd_kill9 qbd_run qbd_binary qbd_write_conf
  qbd_install_fixture qbd_migrate qbd_upgrade_test);

# test/fixtures, found from this file (at load: a test may chdir later)
my $FIXTURES = dirname(abs_path(__FILE__)) . '/../fixtures';

my @live;
my $seq = 0;

sub qbd_binary
{
	return qb_test_binary('queuebox-mssqld');
}

# A cluster as a managed PostgreSQL gives it: no preload, nothing of
# QueueBox installed, a login role that may create a schema in the database.
sub qbd_node
{
	my ($name, %o) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%{ $o{init} // {} });
	$node->append_conf('postgresql.conf', <<"EOC");
listen_addresses = '127.0.0.1'
log_min_messages = warning
password_encryption = 'scram-sha-256'
EOC
	$node->append_conf('postgresql.conf', $o{conf}) if defined $o{conf};
	# the password role first: pg_hba takes the first line that matches
	open(my $fh, '>', $node->data_dir . '/pg_hba.conf') or die $!;
	print $fh "local all all trust\n"
	  . "local replication all trust\n"
	  . "host all qbdpw 127.0.0.1/32 scram-sha-256\n"
	  . "host all all 127.0.0.1/32 trust\n";
	close $fh;
	$node->start;
	$node->safe_psql('postgres', q{
		CREATE ROLE qbd LOGIN;
		GRANT CREATE ON DATABASE postgres TO qbd;
		CREATE ROLE qbdpw LOGIN PASSWORD 'right-password';
		GRANT CREATE ON DATABASE postgres TO qbdpw;
	});
	return $node;
}

sub qbd_url
{
	my ($node, %o) = @_;
	my $user = $o{user} // 'qbd';
	my $auth = defined $o{password} ? "$user:$o{password}" : $user;
	my $host = $o{host} // '127.0.0.1';
	my $port = $o{port} // $node->port;
	return "postgres://$auth\@$host:$port/" . ($o{db} // 'postgres');
}

sub qbd_write_conf
{
	my ($yaml, $name) = @_;
	my $path = "$PostgreSQL::Test::Utils::tmp_check/${name}_" . $$ . '_' . (++$seq) . '.yaml';
	open(my $fh, '>', $path) or die "$path: $!";
	print $fh $yaml;
	close $fh;
	return $path;
}

# qbd_start($node, $yaml, name => 'd1', args => [], env => {}, wrap => []):
# the daemon in the background (run by the wrap command when given: nsenter
# into a network namespace), its stderr in a log file.  Returns { pid, log,
# conf }.
sub qbd_start
{
	my ($node, $yaml, %o) = @_;
	my $name = $o{name} // 'daemon';
	my $conf = $o{conf} // qbd_write_conf($yaml, $name);
	my $log = "$PostgreSQL::Test::Utils::tmp_check/${name}_" . $$ . '_' . (++$seq) . '.log';
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		$ENV{$_} = $o{env}{$_} for keys %{ $o{env} // {} };
		open(STDOUT, '>>', $log) or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		exec(@{ $o{wrap} // [] }, qbd_binary(), '--config', $conf, @{ $o{args} // [] }) or POSIX::_exit(127);
	}
	my $d = { pid => $pid, log => $log, conf => $conf, name => $name };
	push @live, $d;
	note "queuebox-mssqld $name started: pid $pid, log $log";
	return $d;
}

sub qbd_signal
{
	my ($d, $sig) = @_;
	kill($sig, $d->{pid}) if $d->{pid};
}

# qbd_wait_exit($d, $timeout): the exit status, or undef if still running
sub qbd_wait_exit
{
	my ($d, $timeout) = @_;
	my $deadline = time + ($timeout // 30);
	while (time < $deadline)
	{
		if (waitpid($d->{pid}, WNOHANG) == $d->{pid})
		{
			my $st = $?;
			$d->{pid} = undef;
			@live = grep { $_ != $d } @live;
			return $st;
		}
		usleep(50_000);
	}
	return undef;
}

sub qbd_log
{
	my ($d, $offset) = @_;
	return -e $d->{log} ? slurp_file($d->{log}, $offset // 0) : '';
}

sub qbd_wait_daemon_log
{
	my ($d, $re, $offset, %o) = @_;
	my $deadline = time + ($o{timeout} // 30);
	my $text = '';
	while (1)
	{
		$text = qbd_log($d, $offset);
		last if $text =~ $re || time >= $deadline;
		usleep(100_000);
	}
	return $text;
}

# the daemon's role processes, by role name ("outbox 0"), from their
# children of the supervisor and their process names ("qb outbox 0")
sub qbd_role_pids
{
	my ($d) = @_;
	my %pids;
	return \%pids unless $d->{pid};
	for my $l (split /\n/, `ps -o pid=,comm= --ppid $d->{pid}`)
	{
		$pids{$2} = $1 if $l =~ /^\s*(\d+)\s+qb (.+?)\s*$/;
	}
	return \%pids;
}

# qbd_kill9($d, $what): a daemon killed as a crash would: its supervisor
# stopped first (a role that outlived it would release its rows as on a
# stop, PR_SET_PDEATHSIG), every role killed -9, then the supervisor;
# returns once every one is gone (one assertion, named after $what), with
# the roles' pids by name.
sub qbd_kill9
{
	my ($d, $what) = @_;
	my $roles = qbd_role_pids($d);
	kill 'STOP', $d->{pid};
	kill 'KILL', values %$roles;
	kill 'KILL', $d->{pid};
	qbd_wait_exit($d, 10);
	qb_wait_for(sub { !grep { kill(0, $_) } values %$roles }, "$what: every role process is gone");
	return $roles;
}

sub qbd_run
{
	my (@args) = @_;
	my ($stdout, $stderr) = ('', '');
	my $ok = IPC::Run::run([ qbd_binary(), @args ], '>', \$stdout, '2>', \$stderr);
	return [ $? >> 8, $stdout, $stderr ];
}

# qbd_install_fixture($node, $version): the schema the daemon of that
# release installed (test/fixtures/daemon-<version>-postgresql.sql), as its
# role, in one transaction, with its schema_version row, as that daemon did;
# returns psql's stderr
sub qbd_install_fixture
{
	my ($node, $version) = @_;
	my $fixture = "$FIXTURES/daemon-$version-postgresql.sql";
	my ($out, $err) = PostgreSQL::Test::Utils::run_command([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-1',
		'-f', $fixture, '-c', "INSERT INTO queuebox.schema_version (version) VALUES ('$version')",
		'-d', $node->connstr('postgres') . ' user=qbd' ]);
	return $err;
}

# qbd_migrate($node, $db): queuebox-mssqld --migrate on that database
sub qbd_migrate
{
	my ($node, $db) = @_;
	return qbd_run('--config',
		qbd_write_conf(QueueBoxTest::qb_config_yaml(database => { url => qbd_url($node, db => $db) }), "migrate-$db"),
		'--migrate');
}

# qbd_upgrade_test($name, $from, fill => sub ($node, $db), snapshot =>
# sub ($node, $db) -> $state, upgraded => sub ($node, $db, $what, $state)):
# a cluster with the schema the $from daemon installed, filled, migrated;
# --migrate says so and records both versions, upgraded() checks the rows
# against the snapshot from before, a second --migrate changes nothing,
# and the result equals a fresh install.  Stops the cluster.
sub qbd_upgrade_test
{
	my ($name, $from, %o) = @_;
	my $latest = $QueueBoxTest::QB_LATEST;
	my $dn = qbd_node($name);
	my $err = qbd_install_fixture($dn, $from);
	is($dn->safe_psql('postgres', 'SELECT queuebox._schema_version()'), $from, "the daemon's $from schema is installed")
	  or diag $err;
	$o{fill}->($dn, 'postgres');
	my $before = $o{snapshot}->($dn, 'postgres');
	my $r = qbd_migrate($dn, 'postgres');
	is($r->[0], 0, "--migrate on the $from schema exits 0") or diag $r->[2];
	like($r->[2], qr/upgraded the QueueBox schema from \Q$from\E to \Q$latest\E/, "--migrate says it upgraded from $from");
	like($dn->safe_psql('postgres', 'SELECT string_agg(version, \',\' ORDER BY applied_at, version) FROM queuebox.schema_version'),
		qr/^\Q$from\E,(.*,)?\Q$latest\E$/, "schema_version records $from and every step to the latest");
	is($dn->safe_psql('postgres', 'SELECT queuebox._schema_version()'), $latest, "_schema_version() says $latest");
	$o{upgraded}->($dn, 'postgres', 'daemon', $before);
	$r = qbd_migrate($dn, 'postgres');
	is($r->[0], 0, 'a second --migrate exits 0');
	unlike($r->[2], qr/upgraded|created/, 'a second --migrate changes nothing');
	$dn->safe_psql('postgres', 'CREATE DATABASE fresh OWNER qbd');
	$r = qbd_migrate($dn, 'fresh');
	is($r->[0], 0, '--migrate makes a fresh schema') or diag $r->[2];
	is(qb_schema_description($dn, 'postgres'), qb_schema_description($dn, 'fresh'),
		'the upgraded daemon schema equals a fresh install');
	$dn->stop;
	return;
}

END
{
	# waitpid sets $?, which END would make the test's exit status
	local $?;
	for my $d (@live)
	{
		next unless $d->{pid};
		kill 'KILL', $d->{pid};
		waitpid($d->{pid}, 0);
	}
}

1;
