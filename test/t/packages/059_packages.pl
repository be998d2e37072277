# 059_packages.pl
#   The Debian packages of `make deb` (build/deb/) installed on this machine,
#   used as their users would, and removed, leaving the machine as it was:
#   - before: neither package is installed (dpkg -L says so); the system's
#     QueueBox files (make install's, in PostgreSQL's directories and
#     /usr/local) and every path the packages hold are checksummed
#     (content, mode, owner, time; a link's target), and those the packages
#     will overwrite are kept aside;
#   - apt-get install ./build/deb/postgresql-NN-queuebox_*.deb (NN: the
#     major this test's cluster runs) ./build/deb/queuebox-daemon_*.deb, as
#     docs/getting-started.md shows (nothing else: what they depend on is
#     installed here, by scripts/setup.sh): dpkg -L
#     lists the library, the SQL, the daemon, its unit and the conffile
#     /etc/queuebox/queuebox.yaml, dpkg --verify finds them intact, the unit
#     passes systemd-analyze verify, and the system user queuebox exists and
#     may read the configuration (root:queuebox 0640);
#   - the extension: a temp cluster of that major, shared_preload_libraries
#     = 'queuebox', loads the package's library; CREATE EXTENSION queuebox;
#     a row delivered to the loopback sink;
#   - the daemon as its unit runs it (no systemd here): the unit's
#     ExecStartPre and ExecStart command lines, as its User= and Group=,
#     with its UMask=, NoNewPrivileges=, no capabilities, systemd's
#     environment and its EnvironmentFile=.  On the configuration as shipped
#     (comments only) the check says only what to fill in (database.url),
#     and its example, uncommented, passes --check; then the conffile is
#     edited as an administrator would, pointed at a database of the test
#     cluster: a row delivered, and SIGTERM ends the daemon with 0;
#   - apt-get purge: dpkg -L says neither is installed, every file they held
#     is gone, and the files of make install they had overwritten are back
#     (the checksums before and after are equal, path by path); the user
#     queuebox stays, as Debian keeps system users on purge, and the test
#     deletes it when it made it.
#   Rows and requests are counted before and after each delivery.
#   First, and as any user, META.json (PGXN): the keys the PGXN Meta Spec
#   1.0.0 requires and the values it allows, and one version everywhere
#   (the Makefile, queuebox.control, META.json, debian/changelog).
#
#   Installing needs root, and initdb and the server refuse it.  make installcheck
#   runs the TAP tests as postgres: there this test skips the packages, and
#   scripts/test.sh runs it again as root, alone (prove on this file).  As
#   root it splits in two processes, no sudo: this one stays root and serves
#   a fixed list of requests over a socket pair (state, install, the unit's
#   commands, the conffile, remove), and its child, the postgres user, is
#   the test: the cluster, the sink, every check.  Whatever the child did,
#   the root half stops the daemon, purges the packages and puts the
#   system's files back before it exits.  It holds /tmp/qb-install.lock
#   (every install into the system's PostgreSQL holds it) from the first
#   checksum to the last; when a caller holds it already (flock
#   /tmp/qb-install.lock ... make installcheck), through a descriptor this
#   process inherited, it uses that one.
use strict;
use warnings;

use Digest::SHA;
use Fcntl qw(:flock F_GETFD F_SETFD FD_CLOEXEC);
use File::Find ();
use File::Temp ();
use JSON::PP;
use POSIX ();
use Socket;

# set at compile time: the root half runs from a BEGIN block
my ($J, $LOCK, @PKG_GLOBS);
BEGIN
{
	$J = JSON::PP->new->latin1->canonical;
	$LOCK = '/tmp/qb-install.lock';
	# the system's QueueBox paths besides the packages' own
	@PKG_GLOBS = (
		'/usr/lib/postgresql/*/lib/queuebox.so', '/usr/lib/postgresql/*/lib/bitcode/queuebox.index.bc',
		'/usr/lib/postgresql/*/lib/bitcode/queuebox', '/usr/share/postgresql/*/extension/queuebox*',
		'/usr/local/bin/queuebox-*', '/usr/local/lib/systemd/system/queuebox-mssqld.service',
		'/usr/local/share/doc/queuebox', '/etc/queuebox',
		'/var/lib/systemd/deb-systemd-helper-enabled/*queuebox*',
		'/var/lib/systemd/deb-systemd-helper-masked/*queuebox*');
}

# ------------------------------------------------------------ the root half

# run_cmd(@cmd): [exit code, stdout and stderr], in the C locale
sub run_cmd
{
	my (@cmd) = @_;
	my $pid = open(my $fh, '-|') // die "fork: $!";
	if (!$pid)
	{
		open(STDERR, '>&', \*STDOUT);
		@ENV{qw(LC_ALL DEBIAN_FRONTEND)} = ('C', 'noninteractive');
		exec(@cmd) or POSIX::_exit(127);
	}
	local $/;
	my $out = <$fh> // '';
	close $fh;
	return [ $? >> 8, $out ];
}

# one line per path: a file's sha256, mode and owner; a link's target; a
# directory's mode and owner (not its time: dpkg adds and removes entries)
sub describe
{
	my ($p) = @_;
	return "link -> " . readlink($p) if -l $p;
	my @st = lstat($p) or return undef;
	my $who = sprintf('%04o %s:%s', $st[2] & 07777, scalar getpwuid($st[4]) // $st[4],
		scalar getgrgid($st[5]) // $st[5]);
	return "dir $who" if -d _;
	open(my $fh, '<', $p) or return "unreadable $who";
	binmode $fh;
	return 'file ' . Digest::SHA->new(256)->addfile($fh)->hexdigest . " $who mtime $st[9]";
}

# every path the packages hold (their directories too)
sub deb_paths
{
	my ($debs) = @_;
	my @paths;
	for my $deb (@$debs)
	{
		open(my $tar, '-|', 'bash', '-c', 'set -o pipefail; dpkg-deb --fsys-tarfile "$1" | tar -t', 'sh', $deb) or die $!;
		while (my $l = <$tar>)
		{
			chomp $l;
			$l =~ s{^\./}{/};
			$l =~ s{/$}{};
			push @paths, $l if $l ne '';
		}
		close $tar or die "dpkg-deb --fsys-tarfile $deb failed";
	}
	return @paths;
}

# the paths of the packages and of make install, with what is there now
sub snapshot
{
	my ($debs) = @_;
	my %paths = map { $_ => 1 } deb_paths($debs);
	for my $g (@PKG_GLOBS)
	{
		for my $top (glob $g)
		{
			File::Find::find({ no_chdir => 1, wanted => sub { $paths{$File::Find::name} = 1 } }, $top)
			  if -e $top || -l $top;
		}
	}
	my %snap = map { $_ => describe($_) } keys %paths;
	return \%snap;
}

# The unit, as systemd reads it: [Service]'s keys, each a list of values
sub unit_of
{
	my ($path) = @_;
	open(my $fh, '<', $path) or die "$path: $!";
	my ($section, %u) = ('');
	while (<$fh>)
	{
		next if /^\s*[#;]/ || /^\s*$/;
		if (/^\[(\w+)\]/) { $section = $1; next; }
		push @{ $u{$1} }, $2 if $section eq 'Service' && /^(\w+)=(.*?)\s*$/;
	}
	return \%u;
}

# run one of the unit's command lines as the unit would: its User= and
# Group= (setpriv), NoNewPrivileges=, CapabilityBoundingSet= (none), UMask=,
# working directory /, systemd's environment plus EnvironmentFile=; in a
# session of its own, output to $log (or captured)
sub unit_spawn
{
	my ($u, $line, $log) = @_;
	my ($user, $group) = ($u->{User}[-1], $u->{Group}[-1]);
	die "the unit has no User=" unless $user;
	my %env = (PATH => '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
		USER => $user, LOGNAME => $user, HOME => (getpwnam($user))[7], SHELL => (getpwnam($user))[8]);
	for my $f (@{ $u->{EnvironmentFile} // [] })
	{
		(my $p = $f) =~ s/^-//;
		next if $f =~ /^-/ && !-e $p;
		open(my $fh, '<', $p) or die "EnvironmentFile $p: $!";
		while (<$fh>) { $env{$1} = $2 if /^\s*([A-Za-z_][A-Za-z0-9_]*)=(.*?)\s*$/; }
	}
	my @cmd = ('setpriv', "--reuid=$user", "--regid=$group", '--init-groups', '--no-new-privs',
		'--bounding-set=-all', '--inh-caps=-all', '--', split(' ', $line));
	my ($r, $w);
	if (!$log) { pipe($r, $w) or die "pipe: $!"; }
	my $pid = fork() // die "fork: $!";
	if (!$pid)
	{
		POSIX::setsid();
		$SIG{$_} = 'DEFAULT' for qw(INT TERM HUP);
		chdir '/';
		umask(oct($u->{UMask}[-1] // '0022'));
		%ENV = %env;
		open(STDIN, '<', '/dev/null');
		if ($log) { open(STDOUT, '>>', $log) or POSIX::_exit(126); }
		else { close $r; open(STDOUT, '>&', $w) or POSIX::_exit(126); }
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		exec(@cmd) or POSIX::_exit(127);
	}
	return { pid => $pid } if $log;
	close $w;
	local $/;
	my $out = <$r> // '';
	waitpid($pid, 0);
	return { rc => $? >> 8, out => $out, cmd => "@cmd" };
}

sub root_main
{
	my $testdir = $ENV{TESTDIR} // '.';
	my $tmp_check = "$testdir/tmp_check";
	my @pw = getpwnam('postgres') or die "no user postgres: install postgresql (scripts/setup.sh)";
	my ($uid, $gid) = @pw[ 2, 3 ];

	# the lock: one this process inherited from a caller that holds it, or ours
	my $lock;
	opendir(my $fds, '/proc/self/fd') or die "/proc/self/fd: $!";
	for my $fd (grep { /^\d+$/ } readdir $fds)
	{
		my $l = readlink("/proc/self/fd/$fd") // '';
		open($lock, '<&=', $fd) and last if $l eq $LOCK;
	}
	closedir $fds;
	if (!$lock)
	{
		open($lock, '>>', $LOCK) or die "$LOCK: $!";
		chmod 0666, $LOCK;
	}
	print STDERR "059_packages: waiting for $LOCK\n";
	flock($lock, LOCK_EX) or die "flock $LOCK: $!";

	mkdir $tmp_check;
	system('chown', '-R', "$uid:$gid", $tmp_check) == 0 or die "chown $tmp_check failed";
	socketpair(my $mine, my $theirs, AF_UNIX, SOCK_STREAM, 0) or die "socketpair: $!";
	my $child = fork() // die "fork: $!";
	if (!$child)
	{
		close $mine;
		fcntl($theirs, F_SETFD, fcntl($theirs, F_GETFD, 0) & ~FD_CLOEXEC);
		$ENV{QB_PKG_FD} = fileno($theirs);
		$ENV{HOME} = $pw[7];
		$ENV{USER} = $ENV{LOGNAME} = 'postgres';
		POSIX::setgid($gid) or die "setgid: $!";
		$) = "$gid $gid";
		POSIX::setuid($uid) or die "setuid: $!";
		exec($^X, (map { "-I$_" } grep { !ref } @INC), $0, @ARGV) or die "exec: $!";
	}
	close $theirs;
	select((select($mine), $| = 1)[0]);
	# an interrupt ends the child, and this half still cleans up after it
	$SIG{$_} = 'IGNORE' for qw(INT TERM HUP);

	my %st = (installed => [], daemon => undef, backup => undef, user_before => defined getpwnam('queuebox'));
	my $remove = sub {
		my $r = run_cmd('apt-get', 'purge', '-y', '-q', reverse @{ $st{installed} });
		$st{installed} = [] if $r->[0] == 0;
		my $b = $st{backup};
		if ($b && @{ $b->{files} })
		{
			my $c = run_cmd('sh', '-c', 'cd "$1" && shift && cp -a --parents "$@" /', 'sh', $b->{dir}, @{ $b->{files} });
			$r->[1] .= "restoring the system's files: cp exited $c->[0]: $c->[1]" if $c->[0];
			$r->[0] ||= $c->[0];
		}
		if ($b && $r->[0] == 0)
		{
			run_cmd('rm', '-rf', $b->{dir});
			$st{backup} = undef;
		}
		elsif ($b)
		{
			$r->[1] .= "\nthe system's files stay kept aside in $b->{dir}";
		}
		return $r;
	};
	my $stop = sub {
		my $d = $st{daemon} or return { status => undef };
		kill 'TERM', $d->{pid};
		my $deadline = time + 30;    # TimeoutStopSec=30
		my $status;
		while (time < $deadline)
		{
			if (waitpid($d->{pid}, POSIX::WNOHANG()) == $d->{pid}) { $status = $?; last; }
			select(undef, undef, undef, 0.05);
		}
		kill 'KILL', -$d->{pid};    # KillMode=mixed: what is left of its session
		waitpid($d->{pid}, 0) unless defined $status;
		$st{daemon} = undef;
		return { status => $status, left => (kill(0, -$d->{pid}) ? 1 : 0) };
	};

	# the user and group queuebox, when the package made them
	my $deluser = sub {
		return { done => 0 } if $st{user_before} || !defined getpwnam('queuebox');
		my $r = run_cmd('deluser', '--system', '--quiet', 'queuebox');
		my $g = getgrnam('queuebox') ? run_cmd('delgroup', '--system', '--quiet', 'queuebox') : [ 0, '' ];
		return { done => 1, rc => $r->[0] || $g->[0], out => $r->[1] . $g->[1] };
	};

	my %ops = (
		state => sub { return { snap => snapshot($_[0]{debs}), user => defined getpwnam('queuebox') ? 1 : 0 } },
		install => sub {
			my ($a) = @_;
			# never over packages installed already: purging them would take
			# what is not this test's
			for my $p (@{ $a->{packages} })
			{
				return { rc => 1, out => "$p is installed already: this test installs and purges it; apt purge $p first" }
				  if run_cmd('dpkg-query', '-W', '-f', '${Status}', $p)->[1] =~ /installed/;
			}
			# as docs/getting-started.md does, with nothing to fetch: what they
			# depend on is installed here (scripts/setup.sh); apt-get's
			# --no-download cannot take a file, so a simulation says first
			my $sim = run_cmd('apt-get', 'install', '-s', @{ $a->{debs} });
			my %ours = map { $_ => 1 } @{ $a->{packages} };
			my @more = grep { !$ours{$_} } $sim->[1] =~ /^Inst (\S+)/mg;
			return { rc => 1, out => "apt-get would install @more too: run scripts/setup.sh first\n$sim->[1]" }
			  if @more || $sim->[0];
			# what dpkg will overwrite: the files of make install at the packages' paths
			my $dir = File::Temp::tempdir('qb-pkg-backup.XXXXXX', TMPDIR => 1, CLEANUP => 0);
			my @files = sort map { substr($_, 1) } grep { !-d $_ && (-e $_ || -l $_) } deb_paths($a->{debs});
			if (@files)
			{
				my $c = run_cmd('sh', '-c', 'cd / && cp -a --parents "$@" "$0"', $dir, @files);
				return { rc => $c->[0], out => "keeping the system's files aside failed: $c->[1]" } if $c->[0];
			}
			$st{backup} = { dir => $dir, files => \@files };
			my $r = run_cmd('apt-get', 'install', '-y', '-q', @{ $a->{debs} });
			push @{ $st{installed} }, @{ $a->{packages} };
			return { rc => $r->[0], out => $r->[1], kept => \@files };
		},
		verify => sub { my $r = run_cmd('dpkg', '--verify', @{ $_[0]{packages} }); return { rc => $r->[0], out => $r->[1] } },
		conffile => sub { open(my $fh, '<', $_[0]{path}) or return { err => "$!" }; local $/; return { text => scalar <$fh> } },
		edit_conffile => sub {
			open(my $fh, '>', $_[0]{path}) or return { err => "$!" };    # its owner and mode stay
			print $fh $_[0]{text};
			close $fh;
			return {};
		},
		unit_check => sub {
			my $u = unit_of($_[0]{unit});
			return unit_spawn($u, $u->{ExecStartPre}[0]);
		},
		unit_start => sub {
			my ($a) = @_;
			my $u = unit_of($a->{unit});
			my $pre = unit_spawn($u, $u->{ExecStartPre}[0]);
			return { pre => $pre } if $pre->{rc} != 0;
			open(my $fh, '>', $a->{log}) or die "$a->{log}: $!";
			close $fh;
			chown $uid, $gid, $a->{log};
			$st{daemon} = unit_spawn($u, $u->{ExecStart}[0], $a->{log});
			return { pre => $pre, pid => $st{daemon}{pid} };
		},
		unit_stop => sub { return $stop->() },
		remove => sub { my $r = $remove->(); return { rc => $r->[0], out => $r->[1] } },
		deluser => sub { return $deluser->() });

	while (my $line = <$mine>)
	{
		my $req = $J->decode($line);
		my $op = $ops{ $req->{op} } // sub { return { err => "no such request: $_[0]{op}" } };
		my $rep = eval { $op->($req) } // { err => "$@" };
		print $mine $J->encode($rep), "\n";
	}
	waitpid($child, 0);
	my $status = $?;

	# whatever the child did: nothing of the packages stays
	my @left;
	push @left, 'stopped the daemon' if $st{daemon} && $stop->();
	if (@{ $st{installed} } || $st{backup})
	{
		my $r = $remove->();
		push @left, "purged the packages and put the system's files back: " . ($r->[0] ? "FAILED: $r->[1]" : 'done');
		$status ||= 1 << 8 if $r->[0];
	}
	if (!@{ $st{installed} } && (my $d = $deluser->())->{done})
	{
		push @left, 'deleted the user queuebox the package made: ' . ($d->{rc} ? "FAILED: $d->{out}" : 'done');
	}
	print STDERR "059_packages: the test left the machine changed, so its root half " . join('; ', @left) . "\n" if @left;
	exit($status >> 8 || ($status & 127 ? 1 : 0));
}

BEGIN
{
	root_main() if $> == 0 && !defined $ENV{QB_PKG_FD};
}

# ------------------------------------------------------------ the test (postgres)

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;

my $src = "$FindBin::RealBin/../../..";

# ---- META.json, for PGXN: the keys of the PGXN Meta Spec 1.0.0
# (https://pgxn.org/meta/spec.txt), and the versions of the Makefile, the
# control file and debian/changelog, one and the same
{
	my $meta = decode_json(slurp_file("$src/META.json"));
	my ($extversion) = slurp_file("$src/Makefile") =~ /^EXTVERSION\s*=\s*(\S+)/m;
	my ($comment) = slurp_file("$src/queuebox.control") =~ /^comment\s*=\s*'([^']*)'/m;
	my $semver = qr/^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$/;
	my $term = qr/^[^\/\\\s[:cntrl:]]{2,}$/;
	my @required = qw(name version abstract maintainer license provides meta-spec);
	my %known = map { $_ => 1 } @required,
	  qw(description generated_by tags no_index prereqs release_status resources);
	is(join(' ', grep { !exists $meta->{$_} } @required), '', 'META.json has every key the spec requires');
	is(join(' ', grep { !$known{$_} && !/^[xX]_./ } sort keys %$meta), '', 'and no key the spec does not know (x_ keys aside)');
	like($meta->{'meta-spec'}{version} // '', qr/^1\.0\.\d+$/, 'meta-spec: version 1.0.x');
	is($meta->{name}, 'queuebox', 'name: queuebox');
	like($meta->{name}, $term, 'the name is a Term (two characters or more, no slash, space or control)');
	is($meta->{version}, $extversion, "version: the Makefile's EXTVERSION ($extversion)");
	is($meta->{version}, $QB_LATEST, "and queuebox.control's default_version");
	like($meta->{version}, $semver, 'a semantic version');
	is($meta->{abstract}, $comment, "abstract: queuebox.control's comment");
	ok(!ref $meta->{maintainer} && $meta->{maintainer} =~ /^[^<]+ <[^@>]+@[^>]+>$/, 'maintainer: name <address>');
	like($meta->{license}, qr/^(agpl_3|apache_1_1|apache_2_0|artistic_1|artistic_2|bsd|freebsd|gfdl_1_2|gfdl_1_3|gpl_1|gpl_2|gpl_3|lgpl_2_1|lgpl_3_0|mit|mozilla_1_0|mozilla_1_1|openssl|perl_5|postgresql|qpl_1_0|ssleay|sun|zlib|open_source|restricted|unrestricted|unknown)$/,
		"license: one of the spec's names ($meta->{license})");
	my $p = $meta->{provides}{queuebox} // {};
	is(join(' ', sort keys %{ $meta->{provides} }), 'queuebox', 'provides: the extension queuebox');
	is($p->{version}, $extversion, 'at the same version');
	ok($p->{file} && -f "$src/$p->{file}", "its file is in the distribution ($p->{file})");
	ok($p->{docfile} && -f "$src/$p->{docfile}", "and its docfile ($p->{docfile})");
	is($meta->{prereqs}{runtime}{requires}{PostgreSQL}, '15.0.0', 'prereqs: PostgreSQL 15 or later at runtime');
	my ($pgv) = grep { !/^#/ && /\S/ } split /\n/, slurp_file("$src/debian/pgversions");
	is($pgv, '15+', 'as debian/pgversions says (15+)');
	is(join(' ', sort grep { !/^[xX]_/ } keys %{ $meta->{resources} }), 'bugtracker homepage repository',
		'resources: homepage, bugtracker, repository');
	is($meta->{resources}{repository}{type}, 'git', 'the repository is git');
	like($meta->{release_status}, qr/^(stable|testing|unstable)$/, 'release_status is one the spec knows');
	my ($cl) = slurp_file("$src/debian/changelog") =~ /^queuebox \(([^)]+)\)/;
	is($cl, $extversion, 'debian/changelog is at the same version');
}

if (!defined $ENV{QB_PKG_FD})
{
  SKIP:
	{
		skip 'the packages: installing them needs root; scripts/test.sh runs this test as root after make installcheck '
		  . '(make deb, then make installcheck PROVE_TESTS=test/t/packages/059_packages.pl as root)', 1;
	}
	done_testing();
	exit 0;
}
open(my $root, '+<&=', $ENV{QB_PKG_FD}) or die "the root half's socket: $!";
select((select($root), $| = 1)[0]);

sub root
{
	my ($op, %a) = @_;
	print $root $J->encode({ op => $op, %a }), "\n";
	my $line = <$root>;
	BAIL_OUT("the root half did not answer $op") unless defined $line;
	my $rep = $J->decode($line);
	BAIL_OUT("the root half failed $op: $rep->{err}") if defined $rep->{err};
	return $rep;
}

sub dpkg_L
{
	my ($pkg) = @_;
	my ($out, $err) = run_command([ 'dpkg', '-L', $pkg ]);
	return $out . $err;
}

# ---- the packages: the major of this test's server, this tree's version
my ($major) = `pg_config --version` =~ /PostgreSQL (\d+)/ or die 'pg_config --version';
my $version = $QB_LATEST;
my $debdir = "$ENV{TESTDIR}/build/deb";
my %deb = (
	"postgresql-$major-queuebox" => (glob "$debdir/postgresql-$major-queuebox_${version}_*.deb")[0],
	'queuebox-daemon' => (glob "$debdir/queuebox-daemon_${version}_*.deb")[0]);
for my $p (sort keys %deb)
{
	BAIL_OUT("no $p $version in $debdir: run make deb first (scripts/test.sh does)") unless $deb{$p};
}
my @pkgs = ("postgresql-$major-queuebox", 'queuebox-daemon');
my @debs = @deb{@pkgs};
note "packages: @debs";

# ---- before
like(dpkg_L($_), qr/package '\Q$_\E' is not installed/, "before: dpkg -L says $_ is not installed") for @pkgs;
my $before = root('state', debs => \@debs);
my @made = grep { /^\/usr\/lib\/postgresql\/$major\/lib\/queuebox\.so$|extension\/queuebox\.control$/ && defined $before->{snap}{$_} }
  keys %{ $before->{snap} };
note 'before: ' . scalar(grep { defined } values %{ $before->{snap} }) . ' QueueBox paths on the system, '
  . (@made ? 'make install\'s among them' : 'no make install');

# ---- install
my $t0 = time;
my $inst = root('install', debs => \@debs, packages => \@pkgs);
is($inst->{rc}, 0, 'apt-get install ./build/deb/...deb installs both packages') or diag $inst->{out};
note "apt-get install took " . (time - $t0) . " s; it overwrote " . scalar(@{ $inst->{kept} }) . " files of make install, kept aside";
my %listed;
for my $p (@pkgs)
{
	my $l = dpkg_L($p);
	unlike($l, qr/is not installed/, "dpkg -L lists $p");
	$listed{$p} = [ grep { $_ ne '/.' } split /\n/, $l ];
}
my %has = map { $_ => 1 } map { @$_ } values %listed;
my $libdir = `pg_config --pkglibdir`;
my $extdir = `pg_config --sharedir`;
chomp($libdir, $extdir);
$extdir .= '/extension';
for my $f ("$libdir/queuebox.so", "$extdir/queuebox.control", "$extdir/queuebox--$version.sql",
	'/usr/bin/queuebox-mssqld', '/etc/queuebox/queuebox.yaml')
{
	ok($has{$f}, "the packages hold $f");
}
my ($unit) = grep { m{/systemd/system/queuebox-mssqld\.service$} } @{ $listed{'queuebox-daemon'} };
ok($unit, "queuebox-daemon holds the unit queuebox-mssqld.service ($unit)");
my $ver = root('verify', packages => \@pkgs);
is("$ver->{rc} $ver->{out}", '0 ', 'dpkg --verify: every file as the packages shipped it');
like(`dpkg -S $libdir/queuebox.so 2>&1`, qr/^postgresql-$major-queuebox: /, "the server's queuebox.so is the package's");

my @qb = getpwnam('queuebox');
ok(@qb, 'the package made the system user queuebox');
ok($qb[2] < 1000, "queuebox is a system user (uid $qb[2])") if @qb;
is($qb[8], '/usr/sbin/nologin', 'queuebox cannot log in') if @qb;
my @cst = stat('/etc/queuebox/queuebox.yaml');
is(sprintf('%04o %s:%s', $cst[2] & 07777, scalar getpwuid($cst[4]), scalar getgrgid($cst[5])), '0640 root:queuebox',
	'the configuration is root:queuebox, mode 0640: readable by the daemon, not by others');

my $ut = slurp_file($unit);
like($ut, qr/^User=queuebox$/m, 'the unit runs as User=queuebox');
unlike($ut, qr/^DynamicUser=/m, 'the unit has no DynamicUser');
like($ut, qr{^ExecStart=/usr/bin/queuebox-mssqld --config /etc/queuebox/queuebox\.yaml$}m,
	'ExecStart runs the packaged binary on the packaged configuration');
SKIP:
{
	skip 'systemd-analyze is not installed', 1 unless -x '/usr/bin/systemd-analyze';
	my ($o, $e) = run_command([ '/usr/bin/systemd-analyze', 'verify', $unit ]);
	is("$o$e", '', 'systemd-analyze verify finds nothing wrong with the packaged unit');
}

# ---- the extension, on a temp cluster of this major
my $node = qb_node('pkg', create_extension => 0, conf => "listen_addresses = '127.0.0.1'\n");
my ($v) = $node->safe_psql('postgres', 'SHOW server_version') =~ /^(\d+)/;
is($v, $major, "the test cluster runs PostgreSQL $major");
$node->safe_psql('postgres', 'CREATE EXTENSION queuebox');
is(qb_version($node), $version, "CREATE EXTENSION queuebox installs $version from the package");
my $sink = qb_sink_start(name => 'pkg');
qb_configure($node, qb_config_yaml(
	destinations => { sink => { type => 'http', baseUrl => $sink->{url}, path => '/ext' } },
	routes => [ { topicPattern => 'orders.**', destination => 'sink' } ]));
is(qb_outbox_count($node), 0, 'extension: no outbox row before');
is(scalar @{ qb_sink_requests($sink) }, 0, 'the sink has had no request before');
$node->safe_psql('postgres', q{INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('orders.created', 'k1', '{"via": "extension"}')});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'}, '1', 'extension: the row is sent');
is(qb_outbox_count($node), 1, 'extension: one outbox row after');
my $reqs = qb_sink_requests($sink);
is(scalar @$reqs, 1, 'the sink received one request');
is($reqs->[0]{path} . ' ' . $reqs->[0]{body}, '/ext {"via": "extension"}', 'it is the row, from the extension');

# ---- the daemon, as its unit runs it: first on the configuration as shipped
my $shipped = root('conffile', path => '/etc/queuebox/queuebox.yaml')->{text};
is($shipped, slurp_file("$src/packaging/queuebox.yaml"),
	'/etc/queuebox/queuebox.yaml is packaging/queuebox.yaml');
my $chk = root('unit_check', unit => $unit);
is($chk->{rc}, 1, "the unit's ExecStartPre (--check) refuses the configuration as shipped");
like($chk->{out}, qr/\A[^\n]*configuration test failed: [^\n]*database\.url: queuebox-mssqld needs the database it serves[^\n]*\n\z/,
	'and says only what to fill in: database.url (and it could read the file as queuebox)')
  or diag "$chk->{cmd}: $chk->{out}";
like($shipped, qr/^#database:$/m, 'the shipped file holds its example, from "#database:" on');
# from "#database:" on, less the first "#" of each line, as the file's sed does
my $example = substr($shipped, index($shipped, "\n#database:") + 1);
$example =~ s/^#//mg;
my $exf = "$PostgreSQL::Test::Utils::tmp_check/example.yaml";
PostgreSQL::Test::Utils::append_to_file($exf, $example);
{
	local @ENV{qw(PGPASSWORD BILLING_TOKEN)} = ('x', 'y');
	my ($o, $e) = run_command([ '/usr/bin/queuebox-mssqld', '--config', $exf, '--check' ]);
	like($o, qr/is valid: 1 destination, 1 route/, "the shipped example, uncommented, passes --check") or diag $e;
}

# then edited as an administrator would: a database of the test cluster
$node->safe_psql('postgres', q{CREATE ROLE queuebox LOGIN; CREATE DATABASE daemondb;
	GRANT CREATE ON DATABASE daemondb TO queuebox});
root('edit_conffile', path => '/etc/queuebox/queuebox.yaml', text => qb_config_yaml(
	database => { url => 'postgres://queuebox@127.0.0.1:' . $node->port . '/daemondb' },
	daemon => { outboxWorkers => 1, shutdownGraceMs => 5000 },
	destinations => { sink => { type => 'http', baseUrl => $sink->{url}, path => '/daemon' } },
	routes => [ { topicPattern => 'orders.**', destination => 'sink' } ]));
my $dlog = "$PostgreSQL::Test::Utils::tmp_check/daemon_pkg.log";
my $st = root('unit_start', unit => $unit, log => $dlog);
is($st->{pre}{rc}, 0, "ExecStartPre passes on the edited configuration") or diag $st->{pre}{out};
ok($st->{pid}, "ExecStart runs (pid " . ($st->{pid} // '') . ')');
qb_wait_for(sub { $node->safe_psql('daemondb', q{SELECT count(*) FROM pg_namespace WHERE nspname = 'queuebox'}) eq '1' },
	'the daemon made its schema in daemondb') or diag slurp_file($dlog);
my $duid = (stat("/proc/$st->{pid}"))[4];
is(scalar getpwuid($duid // -1), 'queuebox', 'the daemon runs as queuebox');
like(slurp_file("/proc/$st->{pid}/status"), qr/^NoNewPrivs:\s+1$/m, 'with no new privileges');
like(slurp_file("/proc/$st->{pid}/status"), qr/^CapBnd:\s+0+$/m, 'and no capability');
is(qb_outbox_count($node, 'daemondb'), 0, 'daemon: no outbox row before');
$node->safe_psql('daemondb', q{INSERT INTO queuebox.outbox (topic, key, payload) VALUES ('orders.created', 'k1', '{"via": "daemon"}')});
qb_wait_query($node, q{SELECT count(*) FROM queuebox.outbox WHERE state = 'sent'}, '1', 'daemon: the row is sent',
	db => 'daemondb') or diag slurp_file($dlog);
is(qb_outbox_count($node, 'daemondb'), 1, 'daemon: one outbox row after');
$reqs = qb_sink_requests($sink);
is(scalar @$reqs, 2, 'the sink received two requests in all');
is($reqs->[1]{path} . ' ' . $reqs->[1]{body}, '/daemon {"via": "daemon"}', 'the second is the row, from the daemon');
my $stop = root('unit_stop');
is($stop->{status}, 0, 'SIGTERM (systemctl stop) ends the daemon with 0') or diag slurp_file($dlog);
ok(!$stop->{left}, 'no process of the daemon is left');
$node->stop;

# ---- remove
$t0 = time;
my $rm = root('remove');
is($rm->{rc}, 0, 'apt-get purge removes both packages') or diag $rm->{out};
note "apt-get purge and the restore took " . (time - $t0) . " s";
like(dpkg_L($_), qr/package '\Q$_\E' is not installed/, "after: dpkg -L says $_ is not installed") for @pkgs;
my $after = root('state', debs => \@debs);
my @gone = grep { !$before->{snap}{$_} && ($after->{snap}{$_} // '') ne '' } map { @$_ } values %listed;
is("@gone", '', 'every path the packages added is gone');
my @diff = grep { ($before->{snap}{$_} // 'absent') ne ($after->{snap}{$_} // 'absent') }
  sort keys %{ { %{ $before->{snap} }, %{ $after->{snap} } } };
is(join("\n", map { "$_: " . ($before->{snap}{$_} // 'absent') . ' -> ' . ($after->{snap}{$_} // 'absent') } @diff), '',
	'the system\'s QueueBox files and every path of the packages are as before (sha256, mode, owner, time)');
note scalar(@{ $inst->{kept} }) . ' files of make install that the packages had overwritten are back';
ok(defined getpwnam('queuebox'), 'the user queuebox stays after the purge, as Debian keeps system users');
my $du = root('deluser');
if ($du->{done})
{
	is($du->{rc}, 0, 'the test deletes the user and group queuebox it made') or diag $du->{out};
	ok(!defined getpwnam('queuebox') && !defined getgrnam('queuebox'), 'no user or group queuebox is left');
}

done_testing();
