#!/usr/bin/perl
# bench/mssql/pull.pl: pull claimers against SQL Server, for bench/mssql/run.sh.
#
#   pull.pl fill URL SOURCE ROWS        ROWS pending pull rows of SOURCE
#   pull.pl outbox URL TOPIC ROWS [KEYS]
#                                       ROWS outbox rows in one transaction, over
#                                       KEYS keys k0, k1, ... (row i: k(i % KEYS))
#                                       when KEYS > 0, else none
#   pull.pl count URL SQL               the first value of SQL
#   pull.pl reset URL                   drop schema queuebox and what it holds
#   pull.pl run URL SOURCES CLIENTS SECONDS
#       CLIENTS processes, client i on source SOURCES[i % n] (a comma list),
#       each looping the statements of examples/pull/sql/sqlserver: claim
#       (batch 1) in its own transaction, then complete, for SECONDS; prints
#       "claims N busy B seconds S" (busy: claims that raised Msg 51000).
use strict;
use warnings;

use DBI;
use FindBin;
use POSIX ();
use Time::HiRes qw(time);

sub url_parts
{
	my ($url) = @_;
	$url =~ m{^sqlserver://([^:@/]+)(?::([^@/]*))?\@([^:/?]+)(?::(\d+))?/([^?]+)(?:\?(.*))?$}
	  or die "not a sqlserver:// URL\n";
	my ($user, $pw, $host, $port, $db, $q) = ($1, $2 // '', $3, $4 // 1433, $5, $6 // '');
	s/%([0-9A-Fa-f]{2})/chr(hex($1))/ge for $user, $pw, $db;
	my $enc = $q =~ /encrypt=(false|off)/ ? 'off' : $q =~ /encrypt=request/ ? 'request' : 'require';
	return ($user, $pw, $host, $port, $db, $enc);
}

sub connect_url
{
	my ($user, $pw, $host, $port, $db, $enc) = url_parts($_[0]);
	my ($driver) = grep { -e } ('/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so', '/usr/lib/aarch64-linux-gnu/odbc/libtdsodbc.so');
	return DBI->connect('dbi:ODBC:DRIVER=' . ($driver // '{FreeTDS}')
		  . ";SERVER=$host;PORT=$port;DATABASE=$db;TDS_Version=7.4;ClientCharset=UTF-8;Encryption=$enc",
		$user, $pw, { RaiseError => 1, PrintError => 0, AutoCommit => 1, LongReadLen => 1 << 20 });
}

sub statement
{
	my ($name) = @_;
	open(my $fh, '<', "$FindBin::RealBin/../../examples/pull/sql/sqlserver/$name.sql") or die "$name.sql: $!";
	local $/;
	my $t = <$fh>;
	$t =~ s/^--.*\n//mg;
	return $t;
}

my $cmd = shift // '';
if ($cmd eq 'fill')
{
	my ($url, $source, $rows) = @ARGV;
	my $dbh = connect_url($url);
	my $n = 0;
	while ($n < $rows)
	{
		my $k = $rows - $n > 500 ? 500 : $rows - $n;
		my $sql = 'INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption) VALUES '
		  . join(',', ('(?, ?, ?, N\'pull\')') x $k);
		$dbh->do($sql, undef, map { ($source, "$source-" . ($n + $_), qq({"n":) . ($n + $_) . '}') } 0 .. $k - 1);
		$n += $k;
	}
	print "filled $rows\n";
	exit 0;
}
if ($cmd eq 'outbox')
{
	my ($url, $topic, $rows, $keys) = @ARGV;
	my $dbh = connect_url($url);
	$keys //= 0;
	$dbh->begin_work;
	for (my $n = 0; $n < $rows; $n += 500)
	{
		my $k = $rows - $n > 500 ? 500 : $rows - $n;
		$dbh->do('INSERT INTO queuebox.outbox (topic, [key], payload) VALUES ' . join(',', ('(?, ?, ?)') x $k), undef,
			map { ($topic, $keys > 0 ? 'k' . (($n + $_) % $keys) : undef,
				qq({"seq":) . ($n + $_) . ',"type":"order.created","note":"padding padding padding"}') } 0 .. $k - 1);
	}
	$dbh->commit;
	exit 0;
}
if ($cmd eq 'reset')
{
	my $dbh = connect_url($ARGV[0]);
	# tables before functions: a column's default may call one (outbox_audit.done_by)
	for my $k ([ 'P', 'PROCEDURE' ], [ 'V', 'VIEW' ], [ 'U', 'TABLE' ], [ 'FN', 'FUNCTION' ],
		[ 'IF', 'FUNCTION' ], [ 'TF', 'FUNCTION' ])
	{
		my $names = $dbh->selectcol_arrayref(
			q{SELECT o.name FROM sys.objects o WHERE o.schema_id = SCHEMA_ID(N'queuebox') AND o.type = ?}, undef, $k->[0]);
		for my $n (@$names)
		{
			(my $q = $n) =~ s/\]/]]/g;
			$dbh->do("DROP $k->[1] queuebox.[$q]");
		}
	}
	$dbh->do('DROP SCHEMA queuebox') if $dbh->selectrow_array(q{SELECT SCHEMA_ID(N'queuebox')});
	exit 0;
}
if ($cmd eq 'count')
{
	my ($url, $sql) = @ARGV;
	my ($v) = connect_url($url)->selectrow_array($sql);
	print(($v // ''), "\n");
	exit 0;
}
die "usage: pull.pl fill|outbox|count|run ...\n" unless $cmd eq 'run';
my ($url, $sources, $clients, $seconds) = @ARGV;
my @src = split /,/, $sources;
my @kids;
pipe(my $r, my $w) or die "pipe: $!";
my $start = time + 1.0;    # every client connected before the clock starts
for my $i (0 .. $clients - 1)
{
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		close $r;
		my $dbh = connect_url($url);
		my $claim = $dbh->prepare(statement('claim'));
		my $complete = $dbh->prepare(statement('complete'));
		my ($n, $busy) = (0, 0);
		# the first call compiles the procedures on some engines: before the clock
		eval { $claim->execute($src[$i % @src], 1, 30000); $claim->fetchall_arrayref; };
		Time::HiRes::sleep($start - time) if $start > time;
		my $end = $start + $seconds;
		while (time < $end)
		{
			my $rows = eval { $claim->execute($src[$i % @src], 1, 30000); $claim->fetchall_arrayref };
			if (!defined $rows)
			{
				$busy++ if $@ =~ /51000/;
				die $@ unless $@ =~ /51000/;
				next;
			}
			last unless @$rows;    # out of rows: the fill was too small (the caller says so)
			$complete->execute($rows->[0][0], $rows->[0][1]);
			$complete->fetchall_arrayref;
			$n++;
		}
		syswrite($w, "$n $busy\n");
		POSIX::_exit(0);
	}
	push @kids, $pid;
}
close $w;
my ($total, $busy) = (0, 0);
while (my $l = <$r>)
{
	my ($n, $b) = split ' ', $l;
	$total += $n;
	$busy += $b;
}
waitpid($_, 0) for @kids;
print "claims $total busy $busy seconds $seconds\n";
