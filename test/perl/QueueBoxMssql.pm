# test/perl/QueueBoxMssql.pm
#   The SQL Server TAP helpers: the server QUEUEBOX_TEST_MSSQL_URL names
#   (SQL Server 2019 or later, or a TDS engine), reached through DBD::ODBC
#   and FreeTDS with bound parameters, and a TCP proxy in front of it that a
#   test can cut, to take the server away from the daemon and give it back.
#
#   mssql_url()                         the URL, or undef (then skip)
#   mssql_skip_unless_url()             skip_all, saying why, when it is unset (call in BEGIN)
#   mssql_connect($url)                 a DBI handle, autocommit on
#   mssql_reset($dbh)                   drop schema queuebox and what it holds
#   mssql_value($dbh, $sql, @bind)      the first column of the first row
#   mssql_rows($dbh, $sql, @bind)       every row, as array refs
#   mssql_do($dbh, $sql, @bind)         rows changed
#   mssql_wait($dbh, $sql, \@bind, $expected, $what, timeout => 60)   an ok()
#   mssql_insert_keyed($dbh, $topic, $n, $nkeys, $prefix)  rows with {"seq": i}
#   mssql_key_order($dbh, $sinks, $where)   qb_key_order on SQL Server
#   mssql_login_add($dbh, $url, $name, $role) -> $url of a new login and user
#                                       of that name, a member of $role
#   mssql_login_drop($dbh, $name)       its user and login, once the server
#                                       has ended the login's sessions
#   mssql_proxy_start($url) -> { port, url }, mssql_proxy_cut($p), mssql_proxy_stop($p)
package QueueBoxMssql;

use strict;
use warnings;

use DBI;
use Exporter 'import';
use IO::Select;
use IO::Socket::INET;
use POSIX ();
use Test::More;
use Time::HiRes qw(usleep);

use QueueBoxTest;

our @EXPORT = qw(mssql_url mssql_skip_unless_url mssql_connect mssql_reset mssql_value mssql_rows mssql_do
  mssql_wait mssql_insert_keyed mssql_key_order mssql_parse_url mssql_login_add mssql_login_drop
  mssql_proxy_start mssql_proxy_cut mssql_proxy_stop);

my @live_proxies;

sub mssql_url
{
	my $u = $ENV{QUEUEBOX_TEST_MSSQL_URL};
	return defined $u && $u ne '' ? $u : undef;
}

sub mssql_skip_unless_url
{
	return if mssql_url();
	plan skip_all => 'QUEUEBOX_TEST_MSSQL_URL is not set: no SQL Server to run against '
	  . '(set it to sqlserver://user:password@host:port/database?encrypt=false, '
	  . 'a database this suite may drop schema queuebox in)';
}

sub _unescape
{
	my ($s) = @_;
	$s =~ s/%([0-9A-Fa-f]{2})/chr(hex($1))/ge;
	return $s;
}

# { user, password, host, port, database, encrypt }
sub mssql_parse_url
{
	my ($url) = @_;
	$url =~ m{^sqlserver://([^:@/]+)(?::([^@/]*))?\@([^:/?]+)(?::(\d+))?/([^?]+)(?:\?(.*))?$}
	  or die "QUEUEBOX_TEST_MSSQL_URL: not sqlserver://user:password\@host:port/database: $url\n";
	my %q = map { my ($k, $v) = split /=/, $_, 2; ($k => _unescape($v // '')) } split /&/, ($6 // '');
	return { user => _unescape($1), password => _unescape($2 // ''), host => $3, port => $4 // 1433,
		database => _unescape($5), encrypt => $q{encrypt} // 'true' };
}

sub mssql_connect
{
	my ($url) = @_;
	my $u = mssql_parse_url($url);
	my ($driver) = grep { -e $_ } ('/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so',
		'/usr/lib/aarch64-linux-gnu/odbc/libtdsodbc.so');
	my $enc = { true => 'require', require => 'require', request => 'request', false => 'off', off => 'off' }
	  ->{ $u->{encrypt} } // 'require';
	my $cs = 'dbi:ODBC:DRIVER=' . ($driver // '{FreeTDS}')
	  . ";SERVER=$u->{host};PORT=$u->{port};DATABASE=$u->{database};TDS_Version=7.4;ClientCharset=UTF-8;Encryption=$enc";
	my $dbh = DBI->connect($cs, $u->{user}, $u->{password},
		{ RaiseError => 1, PrintError => 0, AutoCommit => 1, LongReadLen => 16 * 1024 * 1024,
		  LongTruncOk => 0, odbc_utf8_on => 1 })
	  or die "cannot connect to $u->{host}:$u->{port}/$u->{database}: $DBI::errstr\n";
	return $dbh;
}

sub mssql_rows
{
	my ($dbh, $sql, @bind) = @_;
	my $sth = $dbh->prepare($sql);
	$sth->execute(@bind);
	my @rows;
	do { while (my $r = $sth->fetchrow_arrayref) { push @rows, [@$r] } }
	  while ($sth->{odbc_more_results});
	return \@rows;
}

sub mssql_value
{
	my ($dbh, $sql, @bind) = @_;
	my $rows = mssql_rows($dbh, $sql, @bind);
	return @$rows ? $rows->[0][0] : undef;
}

sub mssql_do
{
	my ($dbh, $sql, @bind) = @_;
	return $dbh->do($sql, undef, @bind);
}

# every object of schema queuebox, then the schema: each test starts from nothing
sub mssql_reset
{
	my ($dbh) = @_;
	# tables before functions: a column's default may call one (outbox_audit.done_by)
	for my $kind ([ 'P', 'PROCEDURE' ], [ 'V', 'VIEW' ], [ 'U', 'TABLE' ], [ 'FN', 'FUNCTION' ],
		[ 'IF', 'FUNCTION' ], [ 'TF', 'FUNCTION' ])
	{
		my $names = mssql_rows($dbh,
			q{SELECT o.name FROM sys.objects o WHERE o.schema_id = SCHEMA_ID(N'queuebox') AND o.type = ?},
			$kind->[0]);
		for my $n (@$names)
		{
			# our own object names, quoted: DDL takes no parameter
			(my $q = $n->[0]) =~ s/\]/]]/g;
			$dbh->do("DROP $kind->[1] queuebox.[$q]");
		}
	}
	$dbh->do('DROP SCHEMA queuebox') if mssql_value($dbh, q{SELECT SCHEMA_ID(N'queuebox')});
	return;
}

sub mssql_wait
{
	my ($dbh, $sql, $bind, $expected, $what, %o) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $deadline = time + ($o{timeout} // 60);
	my $t0 = time;
	my $v;
	while (1)
	{
		$v = eval { mssql_value($dbh, $sql, @$bind) };
		last if defined $v && $v eq $expected;
		last if time >= $deadline;
		usleep(100_000);
	}
	note sprintf('%s: %.1f s', $what, time - $t0);
	return is($v, $expected, $what);
}

# $n rows of $topic in one transaction, row i with key $prefix . (i % $nkeys)
sub mssql_insert_keyed
{
	my ($dbh, $topic, $n, $nkeys, $prefix) = @_;
	$dbh->begin_work;
	my $sth = $dbh->prepare(q{INSERT INTO queuebox.outbox (topic, [key], payload) VALUES (?, ?, ?)});
	$sth->execute($topic, $prefix . ($_ % $nkeys), qq({"seq":$_})) for 0 .. $n - 1;
	$dbh->commit;
	return;
}

sub mssql_key_order
{
	my ($dbh, $sinks, $where, @bind) = @_;
	my $rows = mssql_rows($dbh,
		q{SELECT LOWER(CONVERT(NVARCHAR(36), message_id)), id, ISNULL([key], N'') FROM queuebox.outbox}
		  . ($where ? " WHERE $where" : '') . ' ORDER BY id', @bind);
	return qb_key_order_of($rows, $sinks);
}

# ---- a TCP proxy the test can cut

# mssql_login_add: a login of its own (left over from an earlier run: made
# anew), its user in the database, a member of $role; returns $url with that
# login and its random password
sub mssql_login_add
{
	my ($dbh, $url, $name, $role) = @_;
	my $pw = "Qb-$name-" . int(rand(1e9));
	mssql_do($dbh, qq{IF DATABASE_PRINCIPAL_ID(N'$name') IS NOT NULL DROP USER $name});
	mssql_do($dbh, qq{IF SUSER_ID(N'$name') IS NOT NULL DROP LOGIN $name});
	mssql_do($dbh, qq{CREATE LOGIN $name WITH PASSWORD = '$pw'});
	mssql_do($dbh, qq{CREATE USER $name FOR LOGIN $name});
	mssql_do($dbh, qq{ALTER ROLE $role ADD MEMBER $name});
	(my $u = $url) =~ s{^sqlserver://[^@/]+\@}{sqlserver://$name:$pw\@};
	return $u;
}

# mssql_login_drop: the server ends a session a moment after its client
# disconnected; until then its login cannot be dropped ("is currently
# logged in"), so the drop is tried again for up to 30 s
sub mssql_login_drop
{
	my ($dbh, $name) = @_;
	mssql_do($dbh, qq{DROP USER $name});
	my $deadline = Time::HiRes::time() + 30;
	until (eval { mssql_do($dbh, qq{DROP LOGIN $name}); 1 })
	{
		die $@ if Time::HiRes::time() > $deadline || $@ !~ /currently logged in/;
		usleep(100_000);
	}
	return;
}

sub _proxy_child
{
	my ($listen, $host, $port) = @_;
	$SIG{CHLD} = 'IGNORE';
	while (my $c = $listen->accept)
	{
		my $pid = fork();
		next unless defined $pid;
		if ($pid)
		{
			close $c;
			next;
		}
		my $s = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Proto => 'tcp')
		  or POSIX::_exit(1);
		my $sel = IO::Select->new($c, $s);
		while (my @r = $sel->can_read)
		{
			for my $fh (@r)
			{
				my $n = sysread($fh, my $buf, 65536);
				POSIX::_exit(0) unless $n;
				syswrite($fh == $c ? $s : $c, $buf) // POSIX::_exit(0);
			}
		}
		POSIX::_exit(0);
	}
	POSIX::_exit(0);
}

# a proxy on a free loopback port; { port, url (the same URL through it) }
sub mssql_proxy_start
{
	my ($url, %o) = @_;
	my $u = mssql_parse_url($url);
	my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $o{port} // 0,
		Listen => 64, ReuseAddr => 1, Proto => 'tcp') or die "proxy listen: $!";
	my $port = $listen->sockport;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		POSIX::setpgid(0, 0);
		_proxy_child($listen, $u->{host}, $u->{port});
	}
	close $listen;
	(my $purl = $url) =~ s{\@[^/?]+}{\@127.0.0.1:$port};
	my $p = { pid => $pid, port => $port, url => $purl, target => $url };
	push @live_proxies, $p;
	note "proxy to $u->{host}:$u->{port} on 127.0.0.1:$port (pid $pid)";
	return $p;
}

# cut every connection through the proxy and stop listening
sub mssql_proxy_cut
{
	my ($p) = @_;
	return unless $p->{pid};
	kill 'KILL', -$p->{pid};
	waitpid($p->{pid}, 0);
	$p->{pid} = undef;
	return;
}

sub mssql_proxy_stop { mssql_proxy_cut(@_); @live_proxies = grep { $_ != $_[0] } @live_proxies; return; }

END
{
	local $?;
	for my $p (@live_proxies)
	{
		next unless $p->{pid};
		kill 'KILL', -$p->{pid};
		waitpid($p->{pid}, 0);
	}
}

1;
