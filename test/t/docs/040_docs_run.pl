# 040_docs_run.pl
#   The shell and SQL of docs/getting-started.md and docs/pull.md run as
#   written and print what the pages show.  So do the marked blocks of
#   docs/configuration.md, docs/receiving-webhooks.md, docs/http-api.md,
#   docs/daemon.md, docs/operations.md and docs/observability.md, whose
#   unmarked fences are YAML (TAP 038) or need what one test cannot set up
#   (brokers, a second server, a signing secret, systemd).
#
#   A marker on the line before a fence says what it is:
#     <!-- doc-test: sh [wait] -->          bash, in one shell for the page
#     <!-- doc-test: sql DB [wait] [vary=COL,...] -->   psql -d DB, stdin
#     <!-- doc-test: psql DB -->            a psql session: the lines after
#                                           a DB=# / DB-# / DB=*# prompt are
#                                           typed, the others are its output
#     <!-- doc-test: skip (why) -->         cannot run here (apt-get, make
#                                           install, an illustration)
#   A fence right after an sh or sql fence is what that fence prints; a
#   ```yaml fence is TAP 038's.  On the first two pages any other fence
#   fails, so a new block is either run or skipped with its reason.
#
#   The shell blocks of a page share one shell: each runs in bash -e (from
#   the repository root for getting-started, a folder of this test for the
#   others) with the variables the blocks before it set.  Only what must
#   differ here is replaced: the pages' paths and ports, and PostgreSQL's
#   bin directory.  getting-started makes its own cluster, with the server
#   of this installation; the other pages run on nodes of this test, whose
#   host and port their shell is given.  Outputs are compared cell by cell
#   (column widths follow the values); uuids, timestamps and HTTP dates are
#   normalised, and the columns a marker names in vary=.  "wait" blocks,
#   which only read, are repeated until they match (or 60 s).  A uuid the
#   page shows (a claim token) stands for the one this run printed at the
#   same place, in the blocks after it.
use strict;
use warnings;

use Cwd qw(abs_path);
use IO::Socket::INET;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

use File::Basename ();
use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

my $root = abs_path("$FindBin::RealBin/../../..");
my $uuid_re = qr/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/;

# ------------------------------------------------------------ the pages

# The fences of $file in order: { line, info, body, marker, end, follows }
# (follows: the fence starts on the line after the previous one ends)
sub fences
{
	my ($file) = @_;
	my $text = slurp_file($file);
	my @out;
	while ($text =~ /^```([^\n]*)\n(.*?)^```[ \t]*$/msg)
	{
		my ($info, $body, $start, $end) = ($1, $2, $-[0], $+[0]);
		my $line = 1 + (() = substr($text, 0, $start) =~ /\n/g);
		my $before = substr($text, 0, $start);
		my ($marker) = $before =~ /<!-- doc-test: ([^\n]*?) -->\n\z/;
		my $prev_end = @out ? $out[-1]{end} : -1;
		push @out, { line => $line, info => $info, body => $body, marker => $marker,
			end => $end, follows => ($start == $prev_end + 1) };
	}
	return @out;
}

# The blocks of a page to run, with their expected output; dies on a fence
# that is neither marked, an output, nor YAML.
sub plan_page
{
	my ($file) = @_;
	my (@run, %count);
	my @f = fences($file);
	for (my $i = 0; $i < @f; $i++)
	{
		my $f = $f[$i];
		my $where = "$file:$f->{line}";
		if (defined $f->{marker})
		{
			my ($kind, @attrs) = split ' ', $f->{marker};
			$count{$kind}++;
			next if $kind eq 'skip';
			die "$where: unknown doc-test kind '$kind'" unless $kind =~ /^(sh|sql|psql)$/;
			my %b = (where => $where, kind => $kind, body => $f->{body});
			$b{db} = shift @attrs if $kind ne 'sh';
			for (@attrs)
			{
				if ($_ eq 'wait') { $b{wait} = 1 }
				elsif (/^vary=(.*)$/) { $b{vary} = [ split /,/, $1 ] }
				else { die "$where: unknown doc-test attribute '$_'" }
			}
			if ($kind ne 'psql' && $i + 1 < @f && $f[ $i + 1 ]{follows} && !defined $f[ $i + 1 ]{marker})
			{
				$b{expect} = $f[ ++$i ]{body};
				$count{output}++;
			}
			push @run, \%b;
		}
		elsif ($f->{info} =~ /^yaml\b/) { $count{yaml}++ }
		else { push @{ $count{unmarked} }, $where }
	}
	return (\@run, \%count);
}

# ------------------------------------------------------------ comparing

# One output as lines of trimmed cells; uuids, timestamps and the vary
# columns replaced.
sub normalise
{
	my ($text, $vary) = @_;
	my @lines = grep { $_ ne '' } map { s/\s+$//r } split /\n/, $text;
	my @vary_idx;
	my @out;
	for my $l (@lines)
	{
		if ($l =~ /^-+(\+-+)*$/) { push @out, '---'; next }
		my @cells = map { s/^\s+|\s+$//gr } split /\|/, $l, -1;
		if (!@vary_idx && $vary && @cells > 1)
		{
			for my $c (@$vary)
			{
				my ($ix) = grep { $cells[$_] eq $c } 0 .. $#cells;
				push @vary_idx, $ix if defined $ix;
			}
		}
		elsif (@vary_idx && $l !~ /^\(\d+ rows?\)$/)
		{
			$cells[$_] = '*' for grep { $_ < @cells } @vary_idx;
		}
		my $n = join(' | ', @cells);
		$n =~ s/$uuid_re/<uuid>/g;
		$n =~ s/\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d(:\d\d)?|Z)?/<timestamp>/g;
		$n =~ s/"t_us":\d+/"t_us":<us>/g;
		# the release a page was written with: a version bump changes no page
		$n =~ s{queuebox/\d+\.\d+\.\d+}{queuebox/<version>}g;
		$n =~ s/^Date: .*/Date: <http-date>/;
		push @out, $n;
	}
	return join("\n", @out) . "\n";
}

# ------------------------------------------------------------ running

my $tmp = PostgreSQL::Test::Utils::tempdir('docs');
my @background;    # pids the blocks left running

# bash -e of one block, with the page's shell state (variables) before and
# after; stdout and stderr together, as a terminal shows them
sub run_shell
{
	my ($page, $script) = @_;
	my $state = "$tmp/$page->{name}.state";
	my $file = "$tmp/$page->{name}.block.sh";
	my $out = "$tmp/$page->{name}.out";
	open(my $fh, '>', $file) or die "$file: $!";
	my $cwd = $page->{cwd} // $root;
	print $fh "set -e\n[ -f '$state' ] && . '$state'\ncd '$cwd'\n", $script, "\n",
	  "[ -n \"\$!\" ] && echo \$! >> '$tmp/background.pids'\n",
	  "for __v in \$(compgen -v); do case \$__v in BASH*|EUID|PPID|UID|SHELLOPTS|FUNCNAME|GROUPS|PIPESTATUS|RANDOM|SRANDOM|SECONDS|LINENO|EPOCH*|HIST*|DIRSTACK|COMP*|PWD|OLDPWD|SHLVL|IFS|OPT*|PS*|_|__v) continue;; esac; declare -p \$__v; done > '$state.new' 2>/dev/null\n",
	  "mv '$state.new' '$state'\n";
	close $fh;
	my $rc = system("bash '$file' > '$out' 2>&1 </dev/null") >> 8;
	return ($rc, slurp_file($out));
}

# the text a block runs as the page's shell
sub shell_of
{
	my ($b) = @_;
	return $b->{body} if $b->{kind} eq 'sh';
	return "psql -X -v ON_ERROR_STOP=1 -d $b->{db} <<'DOCTEST_SQL'\n$b->{body}DOCTEST_SQL";
}

sub subst
{
	my ($page, $text) = @_;
	for my $s (@{ $page->{subst} }) { $text =~ s/\Q$s->[0]\E/$s->[1]/g }
	return $text;
}

# pairs the uuids the page shows with those this run printed, for the blocks after
sub learn_uuids
{
	my ($page, $expect, $got) = @_;
	my @e = $expect =~ /($uuid_re)/g;
	my @g = $got =~ /($uuid_re)/g;
	return unless @e == @g;
	push @{ $page->{subst} }, [ $e[$_], $g[$_] ] for 0 .. $#e;
}

# A psql session: one psql, each statement typed after the output of the
# one before it was read, so a token it printed can be typed.
sub run_session
{
	my ($page, $b) = @_;
	my $db = $b->{db};
	my @steps;    # [ input, expected output ]
	for my $l (split /\n/, $b->{body})
	{
		# app=# a statement, app=*# one in a transaction, app-# or app*# its next line
		if ($l =~ /^\Q$db\E(=\*?|-|\*)# ?(.*)$/)
		{
			if ($1 eq '-' || $1 eq '*') { $steps[-1][0] .= "$2\n" }
			else { push @steps, [ "$2\n", '' ] }
		}
		elsif (@steps) { $steps[-1][1] .= "$l\n" }
	}
	my ($in, $out, $err) = ('', '', '');
	my $h = IPC::Run::start([ 'bash', '-c', ". '$tmp/$page->{name}.state' 2>/dev/null; exec psql -X -d $db" ],
		'<', \$in, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	my $n = 0;
	for my $s (@steps)
	{
		$n++;
		my $mark = "doc-test-step-$n";
		$in .= subst($page, $s->[0]) . "\\echo $mark\n";
		$h->pump until $out =~ /^\Q$mark\E$/m;
		(my $got = $out) =~ s/^\Q$mark\E\n//m;
		$out = '';
		$got = $err . $got;
		$err = '';
		my $expect = subst($page, $s->[1]);
		is(normalise($got), normalise($expect), "$b->{where}: step $n ($s->[0]) prints what the page shows")
		  or diag "got:\n$got";
		learn_uuids($page, $expect, $got);
	}
	$in .= "\\q\n";
	$h->finish;
}

sub run_page
{
	my ($page) = @_;
	my ($blocks, $count) = plan_page("$root/docs/$page->{name}");
	my $unmarked = delete $count->{unmarked} // [];
	$unmarked = [] if $page->{marked_only};
	is_deeply($unmarked, [], "$page->{name}: every fence is run, an output, YAML, or skipped with a reason")
	  or diag "mark each with <!-- doc-test: sh|sql DB|psql DB --> or <!-- doc-test: skip (why) -->";
	note "$page->{name}: " . join(', ', map { "$count->{$_} $_" } sort keys %$count);
	cmp_ok(($count->{sh} // 0) + ($count->{sql} // 0) + ($count->{psql} // 0), '>', 0, "$page->{name}: blocks to run");
	for my $b (@$blocks)
	{
		if ($b->{kind} eq 'psql') { run_session($page, $b); next }
		my $script = subst($page, shell_of($b));
		my $expect = defined $b->{expect} ? subst($page, $b->{expect}) : undef;
		my $deadline = time + 60;
		my ($rc, $got);
		for (;;)
		{
			($rc, $got) = run_shell($page, $script);
			last unless $b->{wait} && defined $expect;
			last if $rc == 0 && normalise($got, $b->{vary}) eq normalise($expect, $b->{vary});
			last if time > $deadline;
			usleep(200_000);
		}
		is($rc, 0, "$b->{where}: runs") or diag $got;
		if (defined $expect)
		{
			is(normalise($got, $b->{vary}), normalise($expect, $b->{vary}), "$b->{where}: prints what the page shows")
			  or diag "got:\n$got";
			learn_uuids($page, $expect, $got);
		}
	}
}

# ------------------------------------------------------------ the pages

my $bindir = `pg_config --bindir`;
chomp $bindir;

# getting-started: the page makes its own cluster, with the server of the
# pg_config on PATH (this installation's: prove's PATH starts with its
# bindir, whichever major), in this test's folder, on free ports
{
	my $pg_port = qb_free_port();
	my $sink_port = qb_free_port();
	$sink_port = qb_free_port() while $sink_port == $pg_port;
	my $page = { name => 'getting-started.md', subst => [
		[ '/tmp/qb-data', "$tmp/qb-data" ],
		[ '/tmp/sink.log', "$tmp/sink.log" ],
		[ '5496', $pg_port ],
		[ '9000', $sink_port ] ] };
	run_page($page);
	# what the page's last block did not stop, when a block failed
	system("$bindir/pg_ctl -D '$tmp/qb-data' -m immediate stop >/dev/null 2>&1") if -d "$tmp/qb-data";
}

# configuration.md (its marked blocks; TAP 038 validates its YAML) and
# pull.md: on a node of this test, in a folder of this test
{
	my $node = qb_node('pull_doc', database => 'app', conf => "queuebox.relay_worker = off\n");
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	$node->safe_psql('app', 'CREATE EXTENSION queuebox');
	my ($host, $port) = ($node->host, $node->port);
	mkdir "$tmp/work";
	for my $page ({ name => 'configuration.md', marked_only => 1 }, { name => 'pull.md' })
	{
		# "From a file" reads the queuebox.yaml its first block wrote
		@$page{qw(subst cwd)} = ([ [ '/etc/queuebox/queuebox.yaml', "$tmp/work/queuebox.yaml" ] ], "$tmp/work");
		open(my $fh, '>', "$tmp/$page->{name}.state") or die $!;
		print $fh "export PGHOST='$host' PGPORT=$port PGUSER=\$(id -un)\nexport PATH='$bindir':\$PATH\n";
		close $fh;
		run_page($page);
		next unless $page->{name} eq 'configuration.md';
		qb_wait_query($node, q{SELECT source || ' ' || path || ' ' || (last_error IS NULL) FROM queuebox.config_source()},
			"file $tmp/work/queuebox.yaml true", 'configuration.md "From a file": the workers read the file its ALTER SYSTEM names',
			db => 'app');
		# pull.md stores documents with configure(): the file is the page's only
		$node->safe_psql('app', 'ALTER SYSTEM RESET queuebox.config_file; SELECT pg_reload_conf()');
		qb_wait_query($node, q{SELECT current_setting('queuebox.config_file')}, '', 'and is reset for pull.md', db => 'app');
	}
	$node->stop;
}

# receiving-webhooks.md (its marked blocks): a node of its own, the page's
# listener on a free port
{
	my $node = qb_node('webhooks_doc', database => 'app');
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	$node->safe_psql('app', 'CREATE EXTENSION queuebox');
	my $page = { name => 'receiving-webhooks.md', marked_only => 1, cwd => "$tmp/work",
		subst => [ [ '8080', qb_free_port() ] ] };
	my ($host, $port) = ($node->host, $node->port);
	open(my $fh, '>', "$tmp/receiving-webhooks.md.state") or die $!;
	print $fh "export PGHOST='$host' PGPORT=$port PGUSER=\$(id -un)\nexport PATH='$bindir':\$PATH\n";
	close $fh;
	run_page($page);
	max_connections_wait($node);
	$node->stop;
}

# receiving-webhooks.md, Limits: over http.maxConnections a connection waits
# in the listen backlog and is served when a slot frees (it was documented as
# closed at once).  One connection holds the only slot (a keep-alive request
# answered), a second sends a webhook; once the first closes, the second is
# answered 202 and its row stored.
sub max_connections_wait
{
	my ($node) = @_;
	# a port of its own: what answers there is the listener with the new limit
	my $listen = qb_free_port();
	$node->safe_psql('app', "SELECT queuebox.configure(\$y\$
http: { listen: $listen, maxConnections: 1 }
sources:
  shop: { type: http, path: /shop, idempotencyKeyPath: \$.id, consumption: pull }
\$y\$)");
	my $req = sub {
		my ($id, $close) = @_;
		my $body = qq({"id":"$id"});
		return "POST /inbox/shop HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
		  . "Content-Length: " . length($body) . "\r\n" . ($close ? "Connection: close\r\n" : '') . "\r\n$body";
	};
	my $rows_before = $node->safe_psql('app', "SELECT count(*) FROM queuebox.inbox WHERE source = 'shop'");
	my $first;
	qb_wait_for(sub {
		$first = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $listen, Timeout => 5) or return 0;
		print $first $req->('limit-1', 0);
		my $answer = '';
		$first->recv($answer, 4096);
		return 1 if $answer =~ m{^HTTP/1.1 202 };
		close $first;
		return 0;
	}, 'the listener with maxConnections: 1 answers, and the connection stays open', timeout => 30);
	my $second = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $listen, Timeout => 5)
	  or die "connect: $!";
	print $second $req->('limit-2', 1);
	close $first;
	my $answer = '';
	$second->recv($answer, 4096);
	like($answer, qr{^HTTP/1.1 202 }, 'receiving-webhooks.md Limits: over http.maxConnections a connection waits and is served when a slot frees')
	  or diag "got: '$answer' (an empty answer: the connection was closed)";
	is($node->safe_psql('app', "SELECT count(*) FROM queuebox.inbox WHERE source = 'shop'"), $rows_before + 2,
		'both webhooks stored');
}

# http-api.md (its marked blocks): a node whose server has ADMIN_TOKEN, with
# a sink for the page's destination and a free port for its listener
{
	my $token = 'doc-test-admin-token-0123456789abcdef';
	local $ENV{ADMIN_TOKEN} = $token;
	my $node = qb_node('http_doc', database => 'app');
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	$node->safe_psql('app', 'CREATE EXTENSION queuebox');
	my $sink = qb_sink_start(name => 'http_doc');
	my $listen = qb_free_port();
	$listen = qb_free_port() while $listen == $sink->{port};
	# the page's secret file, in the home of the server's user there
	my $page = { name => 'http-api.md', marked_only => 1, cwd => "$tmp/work",
		subst => [ [ '8080', $listen ], [ '9000', $sink->{port} ],
			[ '/var/lib/postgresql/secrets', "$tmp/secrets" ] ] };
	my ($host, $port) = ($node->host, $node->port);
	open(my $fh, '>', "$tmp/http-api.md.state") or die $!;
	print $fh "export PGHOST='$host' PGPORT=$port PGUSER=\$(id -un) ADMIN_TOKEN='$token'\n",
	  "export PATH='$bindir':\$PATH\n";
	close $fh;
	run_page($page);
	qb_sink_stop($sink);
	$node->stop;
}

# daemon.md (its marked blocks): the managed-PostgreSQL steps on a plain
# cluster (qbd_node: no preload, no extension) with a database app.  Step
# 1 makes the daemon's role; the page's own YAML (step 2) is the file, with
# what must differ here: database.url reaches this cluster through its Unix
# socket (percent-encoded in the host's place, the password still
# ${PGPASSWORD}), billing is a sink of this test, the listener a free port.
# Step 3 migrates, step 4 starts the daemon (in the background: the page
# runs it in the foreground), step 5 inserts a row and waits for it sent.
{
	my $node = qbd_node('daemon_doc');
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	my $sink = qb_sink_start(name => 'daemon_doc');
	my $listen = qb_free_port();
	$listen = qb_free_port() while $listen == $sink->{port};
	my ($host, $port) = ($node->host, $node->port);
	(my $enc = $host) =~ s/([^A-Za-z0-9._~-])/sprintf('%%%02X', ord $1)/ge;
	my ($yaml) = grep { $_->{info} =~ /^yaml/ && $_->{body} =~ /^database:/m } fences("$root/docs/daemon.md");
	my $conf = "$tmp/work/queuebox.yaml";
	my $text = $yaml->{body};
	$text =~ s{url: "postgres://[^"]*"}{url: "postgres://queuebox:\${PGPASSWORD}\@$enc:$port/app"} or die 'daemon.md: no database.url in the YAML';
	$text =~ s{https://billing\.internal}{$sink->{url}} or die 'daemon.md: no billing destination in the YAML';
	$text =~ s{127\.0\.0\.1:8080}{127.0.0.1:$listen} or die 'daemon.md: no http.listen in the YAML';
	open(my $fh, '>', $conf) or die "$conf: $!";
	print $fh $text;
	close $fh;
	my $page = { name => 'daemon.md', marked_only => 1, cwd => "$tmp/work", subst => [
		[ "queuebox-mssqld --config /etc/queuebox/queuebox.yaml\n",
		  "queuebox-mssqld --config $conf >> '$tmp/daemon_doc.log' 2>&1 &\n" ],
		[ '/etc/queuebox/queuebox.yaml', $conf ] ] };
	my $bin = File::Basename::dirname(qbd_binary());
	open($fh, '>', "$tmp/daemon.md.state") or die $!;
	print $fh "export PGHOST='$host' PGPORT=$port PGUSER=\$(id -un) PGPASSWORD='...'\n",
	  "export PATH='$bin':'$bindir':\$PATH\n";
	close $fh;
	my $pids_before = -e "$tmp/background.pids" ? slurp_file("$tmp/background.pids") : '';
	run_page($page);
	my $req = [ grep { $_->{path} eq '/events' } @{ qb_sink_requests($sink) } ];
	is(scalar(@$req), 1, 'daemon.md step 5: billing (the sink) received the row once');
	like(slurp_file("$tmp/daemon_doc.log"), qr/LOG outbox 0\[\d+\]: configuration loaded: 1 destination, 1 route$/m,
		'daemon.md step 4: the log counts 1 destination, 1 route');
	# the daemon step 4 started: the pid its block left
	my ($daemon) = (slurp_file("$tmp/background.pids") =~ s/^\Q$pids_before\E//r) =~ /^(\d+)$/m;
	if ($daemon)
	{
		kill 'TERM', $daemon;
		qb_wait_for(sub { !kill(0, $daemon) }, 'daemon.md: the daemon stops on SIGTERM');
	}
	qb_sink_stop($sink);
	$node->stop;
}

# operations.md and observability.md (their marked blocks): a node of their
# own, no configuration (the rows they write wait)
{
	my $node = qb_node('ops_doc', database => 'app', workers => 0,
		conf => "queuebox.relay_worker = off\nqueuebox.ingress_worker = off\n");
	$node->safe_psql('postgres', 'CREATE DATABASE app');
	$node->safe_psql('app', 'CREATE EXTENSION queuebox');
	my ($host, $port) = ($node->host, $node->port);
	for my $name ('operations.md', 'observability.md')
	{
		my $page = { name => $name, marked_only => 1, cwd => "$tmp/work", subst => [] };
		open(my $fh, '>', "$tmp/$name.state") or die $!;
		print $fh "export PGHOST='$host' PGPORT=$port PGUSER=\$(id -un)\nexport PATH='$bindir':\$PATH\n";
		close $fh;
		run_page($page);
	}
	$node->stop;
}

if (-e "$tmp/background.pids")
{
	for my $pid (split /\n/, slurp_file("$tmp/background.pids"))
	{
		kill 'TERM', $pid if $pid =~ /^\d+$/ && kill(0, $pid);
	}
}
done_testing();
