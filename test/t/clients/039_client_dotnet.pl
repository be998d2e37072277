# 039_client_dotnet.pl
#   QueueBox.Inbox and QueueBox.Inbox.DependencyInjection (clients/dotnet),
#   the C# pull worker, on a real cluster with the extension: the solution
#   built with warnings as errors, then its xunit tests through dotnet test:
#   the scenarios 1 to 7 of clients/SCENARIOS.md (with a lease lost at the
#   completion), an EF Core context on the handler's transaction, the
#   generic host's start and stop (inside and past the grace), the spec's C#
#   examples as written, a failing handler logged with no logger configured
#   (standard error) and under the host (its logger), and the unit tests;
#   on SQL Server too when QUEUEBOX_TEST_MSSQL_URL is set (the same, and
#   Msg 51000; the schema migrated by queuebox-mssqld), else those are
#   skipped, saying why.  The outbox's enqueue (issue 40) in the same run:
#   topics dotnet.** routed to a real sink (qb_sink), delivered by the
#   extension's workers and, on SQL Server, by a queuebox-mssqld started
#   here on a schema reset and migrated; OutboxTests and OutboxExamples
#   (the README's outbox examples, each found in OutboxExamples.cs as
#   written).  Then
#   as processes: two workers on one source divide the work, and a worker
#   killed with -9 mid-handler loses nothing and applies nothing twice.
#   Then clients/dotnet/README.md as written, from a HOME outside the
#   repository: its dotnet pack commands (0.1.0, the README inside, a
#   deterministic build), its application commands (a console application
#   whose nuget.config lists the packed folder; both packages restored from
#   there), its Program.cs built and run until the README's message lands
#   in its table orders, a failure shown on its standard error; then the
#   same application consumes a message through AddQueueBoxInbox.
#   NuGet restores offline, from clients/dotnet/packages (scripts/setup.sh
#   fills it); HOME and the CLI's home are the test's own (TAP runs as
#   postgres).  Without dotnet the whole file is skipped, saying what to
#   install.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;
use Cwd qw(abs_path);
use Digest::SHA qw(sha256_hex);
use File::Path qw(make_path);
use File::Temp;

use FindBin;
use lib "$FindBin::RealBin/../../perl";
use QueueBoxTest;
use QueueBoxDaemon;

if (system('command -v dotnet >/dev/null 2>&1') != 0)
{
	plan skip_all => 'the C# tests (clients/dotnet) are skipped: dotnet is not installed;'
	  . ' install the .NET 10 SDK (package dotnet-sdk-10.0 from packages.microsoft.com, or https://dot.net/v1/dotnet-install.sh),'
	  . ' then run scripts/setup.sh';
}

my $dir = abs_path("$FindBin::RealBin/../../../clients/dotnet");
my $tmp = $PostgreSQL::Test::Utils::tmp_check;
my $feed = "$dir/packages";
BAIL_OUT("$feed is missing: run scripts/setup.sh (it restores clients/dotnet's NuGet packages there)")
  unless -d $feed;

# the CLI's home, HOME and NuGet's folders: the test's own or the tree's (TAP runs as postgres)
local $ENV{HOME} = $tmp;
local $ENV{DOTNET_CLI_HOME} = "$tmp/dotnet-home";
local $ENV{NUGET_PACKAGES} = $feed;
local $ENV{NUGET_HTTP_CACHE_PATH} = "$tmp/nuget-http";
local $ENV{DOTNET_NOLOGO} = '1';
local $ENV{DOTNET_CLI_TELEMETRY_OPTOUT} = '1';
local $ENV{DOTNET_SKIP_FIRST_TIME_EXPERIENCE} = '1';
local $ENV{DOTNET_CLI_WORKLOAD_UPDATE_NOTIFY_DISABLE} = '1';
local $ENV{MSBUILDDISABLENODEREUSE} = '1';
# offline: the only source is the folder scripts/setup.sh filled
my $config = "$tmp/nuget.config";
sub nuget_config
{
	my ($file, @sources) = @_;
	open(my $fh, '>', $file) or die "$file: $!";
	print $fh "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<configuration>\n  <packageSources>\n    <clear />\n";
	printf $fh "    <add key=\"local%d\" value=\"%s\" />\n", $_, $sources[$_] for 0 .. $#sources;
	print $fh "  </packageSources>\n</configuration>\n";
	close $fh;
	return;
}
nuget_config($config, $feed);

# dotnet ARGS...: runs it in clients/dotnet; the exit code and the output
sub dotnet
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'dotnet', @_ ], '>', \$out, '2>', \$err, init => sub { chdir $dir or die "$dir: $!" });
	return ($? >> 8, "$out$err");
}

my ($rc, $out) = dotnet('restore', 'QueueBox.Inbox.slnx', '--configfile', $config);
is($rc, 0, 'the solution restores offline from clients/dotnet/packages') or diag $out;
($rc, $out) = dotnet('build', 'QueueBox.Inbox.slnx', '--no-restore', '-c', 'Release', '--disable-build-servers');
is($rc, 0, 'the solution builds (warnings are errors, nullable, XML docs)') or diag $out;
like($out, qr/^\s*0 Warning\(s\)/m, 'with no warning');
like($out, qr{QueueBox\.Inbox -> .*/net8\.0/QueueBox\.Inbox\.dll}, 'QueueBox.Inbox builds for net8.0 too');

my $node = qb_node('client_dotnet');
my $mssql = qb_mssql_alone();
# the outbox tests' deliveries: topics dotnet.** to the sink, by the
# extension's workers and, on SQL Server, by a daemon on a fresh schema
my $sink = qb_sink_start(name => 'dotnet');
my $routes = qb_config_yaml(
	destinations => { sink => { type => 'http', baseUrl => $sink->{url}, path => '/events', timeoutMs => 3000 } },
	routes => [ { topicPattern => 'dotnet.**', destination => 'sink' } ]);
qb_configure($node, $routes);
my $daemon;
if ($mssql)
{
	require QueueBoxMssql;
	QueueBoxMssql::mssql_reset(QueueBoxMssql::mssql_connect($ENV{QUEUEBOX_TEST_MSSQL_URL}));
	my $yaml = $routes . qb_config_yaml(outbox => undef,
		database => { url => $ENV{QUEUEBOX_TEST_MSSQL_URL}, connectTimeoutMs => 3000, idlePollMaxMs => 500 },
		daemon => { outboxWorkers => 1, shutdownGraceMs => 5000 });
	my $conf = "$tmp/dotnet-mssqld.yaml";
	open(my $fh, '>', $conf) or die "$conf: $!";
	print $fh $yaml;
	close $fh;
	my $m = qbd_run('--config', $conf, '--migrate');
	is($m->[0], 0, 'SQL Server: queuebox-mssqld --migrate makes the schema') or diag "$m->[1]$m->[2]";
	$daemon = qbd_start(undef, undef, conf => $conf, name => 'dotnet_mssqld');
	qbd_wait_daemon_log($daemon, qr/outbox \d\[\d+\]: started/);
}
{
	local $ENV{QBI_TEST_PGHOST} = $node->host;
	local $ENV{QBI_TEST_PGPORT} = $node->port;
	local $ENV{QBI_TEST_MSSQLD} = qb_test_binary('queuebox-mssqld') if $mssql;
	local $ENV{QBI_TEST_SINK_LOG} = $sink->{log};
	($rc, $out) = dotnet('test', 'QueueBox.Inbox.slnx', '--no-build', '-c', 'Release',
		'--logger', 'console;verbosity=detailed');
}
if ($daemon)
{
	qbd_signal($daemon, 'TERM');
	is(qbd_wait_exit($daemon, 30), 0, 'SQL Server: the outbox tests\' daemon stops cleanly');
}
note $out;
is($rc, 0, 'dotnet test passes') or diag $out;
# each failed test on one line of its own, first: a log cut to its tail still names it
diag "dotnet test failed: $1: $2" while $out =~ /^\s+Failed (QueueBox\.\S+) \[[^\]]*\]\n\s+Error Message:\n\s*(.*)$/mg;
my ($total) = $out =~ /^Total tests: (\d+)$/m;
my ($passed) = $out =~ /^\s+Passed: (\d+)$/m;
my ($skipped) = $out =~ /^\s+Skipped: (\d+)$/m;
unlike($out, qr/^\s+Failed: [1-9]/m, 'no test failed');
is($total, 57, 'fifty-seven tests ran');
my @pg = $out =~ /^\s+Passed QueueBox\.Inbox\.Tests\.PostgreSqlScenarios\.(\w+)/mg;
is(scalar(@pg), 10, 'PostgreSQL: the scenarios 1 to 7 (eight tests), the dialect and the handler\'s span passed') or diag "@pg";
ok(scalar(grep { $_ eq 'S11_HandlerSpanIsAChildOfTheMessage' } @pg), 'the handler\'s activity is a child of the message\'s traceparent');
like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.EfCoreTests\.PostgreSqlContextCommitsWithTheCompletion/m,
	'EF Core: a context on the handler transaction commits with the completion, not with a failure');
like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.HostTests\.TheHostsStopDrivesTheGrace/m,
	'the generic host: AddQueueBoxInbox, the stop inside and past the grace');
like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.SpecExamples\.TheWorkerExampleRunsOnPostgreSql/m,
	'the spec\'s worker example runs as written');
like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.LoggingTests\.WithoutALoggerAFailureGoesToStandardError/m,
	'no logger: a failing handler is written to standard error (NullLogger.Instance: nothing)');
like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.LoggingTests\.TheHostsLoggerGetsTheFailures/m,
	'AddQueueBoxInbox: a failing handler is logged to the host\'s logger');
my @pgo = $out =~ /^\s+Passed QueueBox\.Inbox\.Tests\.PostgreSqlOutbox\.(\w+)/mg;
is(scalar(@pgo), 6, 'PostgreSQL outbox: together, the trace at the sink, the caller\'s traceparent, batch, delayed, EF Core')
  or diag "@pgo";
like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.OutboxExamples\.TheTransactionExamplesRunOnPostgreSql/m,
	'the README\'s outbox examples run as written');
like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.OutboxExamples\.TheEfCoreExampleRunsOnPostgreSql/m,
	'the README\'s EF Core outbox example runs as written');
if ($mssql)
{
	is($skipped // 0, 0, 'SQL Server: nothing skipped');
	my @ms = $out =~ /^\s+Passed QueueBox\.Inbox\.Tests\.SqlServerScenarios\.(\w+)/mg;
	is(scalar(@ms), 10, 'SQL Server: the scenarios 1 to 7, the dialect and Msg 51000 passed') or diag "@ms";
	like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.EfCoreTests\.SqlServerContextCommitsWithTheCompletion/m,
		'SQL Server: EF Core on the handler transaction');
	like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.SpecExamples\.TheWorkerExampleRunsOnSqlServer/m,
		'SQL Server: the spec\'s worker example as written');
	my @mso = $out =~ /^\s+Passed QueueBox\.Inbox\.Tests\.SqlServerOutbox\.(\w+)/mg;
	is(scalar(@mso), 6, 'SQL Server outbox: the same six, delivered by queuebox-mssqld') or diag "@mso";
	like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.OutboxExamples\.TheTransactionExamplesRunOnSqlServer/m,
		'SQL Server: the README\'s outbox examples as written');
	is($passed, 57, 'all passed');
}
else
{
	is($skipped, 19, 'SQL Server: its nineteen tests are skipped');
	like($out, qr/Skipped QueueBox\.Inbox\.Tests\.SqlServerScenarios\.S1_CommitTogether.*\n.*\n\s+QUEUEBOX_TEST_MSSQL_URL is not set/,
		'SQL Server: skipped, saying why');
	is($passed, 38, 'the other thirty-eight passed');
}
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');

# ---- docs/pull.md's C# example is the one the tests run
my @pull_blocks;
{
	my $tests = slurp_file("$dir/test/QueueBox.Inbox.Tests/SpecExamples.cs");
	my ($section) = slurp_file("$FindBin::RealBin/../../../docs/pull.md") =~ /^#### C#\n(.*?)^###? /ms;
	@pull_blocks = ($section // '') =~ /^```csharp\n(.*?)^```$/msg;
	ok(@pull_blocks >= 2, 'docs/pull.md has the C# examples');
	for my $block (@pull_blocks)
	{
		ok(index($tests, $block) >= 0, 'a C# block of docs/pull.md is in SpecExamples.cs as written')
		  or diag $block;
	}
}

# ---- the README's outbox examples are the ones the tests run
{
	my $tests = slurp_file("$dir/test/QueueBox.Inbox.Tests/OutboxExamples.cs");
	my ($section) = slurp_file("$dir/README.md") =~ /^## Enqueue into the outbox\n(.*?)^## /ms;
	my @blocks = ($section // '') =~ /^```csharp\n(.*?)^```$/msg;
	is(scalar(@blocks), 3, 'the README\'s outbox section has its three C# examples');
	my ($csharp) = slurp_file("$FindBin::RealBin/../../../docs/enqueue.md") =~ /^## C#\n(.*?)(?:^## |\z)/ms;
	my @doc_blocks = ($csharp // '') =~ /^```csharp\n(.*?)^```$/msg;
	is(scalar(@doc_blocks), 1, 'docs/enqueue.md\'s C# section has its example');
	for my $block (@blocks, @doc_blocks)
	{
		ok(index($tests, $block) >= 0, 'a C# block of the README\'s outbox section or docs/enqueue.md is in OutboxExamples.cs as written')
		  or diag $block;
	}
}

# ---- worker processes: two on one source, and kill -9 mid-handler
my $worker = "$tmp/dotnet-testworker";
($rc, $out) = dotnet('build', 'test/QueueBox.Inbox.TestWorker', '--no-restore', '-c', 'Release', '-o', $worker,
	'--disable-build-servers');
is($rc, 0, 'the test worker builds') or BAIL_OUT("the test worker: $out");
{
	local $ENV{QBI_TEST_PGHOST} = $node->host;
	local $ENV{QBI_TEST_PGPORT} = $node->port;
	qb_pull_process_scenarios($node, sub { [ "$worker/QueueBox.Inbox.TestWorker", @_ ] });
}

# ---- clients/dotnet/README.md as written: its install commands from a HOME
# outside the repository, its table, its Program.cs built and run
#
# A README fence is run when the line before it is <!-- doc-test: KIND ARG ... -->:
#   sh repository    bash -e, in the repository's root
#   sh application   bash -e, in the HOME (the block makes and enters the application)
#   sql DB           psql on the node (its database postgres: the extension is there)
#   file Program.cs  the application's Program.cs
my %readme;
{
	my $text = slurp_file("$dir/README.md");
	while ($text =~ /^<!-- doc-test: (\S+) (\S+)[^\n]*-->\n```[^\n]*\n(.*?)^```$/msg)
	{
		push @{ $readme{"$1 $2"} }, $3;
	}
}
my ($pack_sh, $app_sh, $program) =
  map { ($readme{$_} // [''])->[0] } ('sh repository', 'sh application', 'file Program.cs');
my @readme_sql = @{ $readme{'sql app'} // [] };
ok($pack_sh ne '' && $app_sh ne '' && $program ne '' && @readme_sql == 2,
	'the README marks its two install blocks, the table and the message of "Use", and its Program.cs')
  or diag join(', ', sort keys %readme);
ok(@pull_blocks && index($program, $pull_blocks[0]) >= 0,
	'the README\'s Program.cs holds docs/pull.md\'s worker example (and so SpecExamples.cs\'s) as written');

# a HOME outside the repository, as an application's developer has; NuGet is
# offline here, so this HOME's own NuGet.Config, which a developer's lists
# nuget.org in, lists clients/dotnet/packages (NuGet takes its home from
# DOTNET_CLI_HOME when that is set)
my $home = File::Temp::tempdir('qb-dotnet-home-XXXX', TMPDIR => 1, CLEANUP => 1);
make_path("$home/.nuget/NuGet");
nuget_config("$home/.nuget/NuGet/NuGet.Config", $feed);
my $root = abs_path("$dir/../..");
# bash -e SCRIPT in CWD with HOME and the CLI's home $home, NuGet's packages
# folder PACKAGES (undef: the HOME's own, ~/.nuget/packages): exit code, output
sub readme_sh
{
	my ($cwd, $packages, $script) = @_;
	my ($o, $e) = ('', '');
	local $ENV{HOME} = $home;
	local $ENV{DOTNET_CLI_HOME} = $home;
	local $ENV{NUGET_PACKAGES} = $packages;
	delete $ENV{NUGET_PACKAGES} unless defined $packages;
	local $ENV{QB_FEED} = $feed;
	IPC::Run::run([ 'bash', '-e', '-c', $script ], '>', \$o, '2>', \$e, init => sub { chdir $cwd or die "$cwd: $!" });
	return ($? >> 8, "$o$e");
}

# the packs, in the repository (the tree's packages folder: nothing is fetched)
($rc, $out) = readme_sh($root, $feed, $pack_sh);
is($rc, 0, 'the README\'s dotnet pack commands run in the repository') or diag $out;
my $packed = "$home/queuebox-feed";
for my $project ('QueueBox.Inbox', 'QueueBox.Inbox.DependencyInjection')
{
	my $nupkg = "$packed/$project.0.1.0.nupkg";
	ok(-f $nupkg, "$project.0.1.0.nupkg is made in ~/queuebox-feed");
	my $list = `unzip -l '$nupkg'`;
	like($list, qr/\sREADME\.md$/m, "$project: the README is inside");
	like($list, qr{\slib/net10\.0/$project\.dll$}m, "$project: net10.0");
	like($list, qr{\slib/net10\.0/$project\.xml$}m, "$project: its XML docs");
}
like(`unzip -l '$packed/QueueBox.Inbox.0.1.0.nupkg'`, qr{\slib/net8\.0/QueueBox\.Inbox\.dll$}m, 'QueueBox.Inbox: net8.0');
{
	# deterministic: a rebuild from scratch makes the same assembly
	my $dll = "$dir/src/QueueBox.Inbox/bin/Release/net10.0/QueueBox.Inbox.dll";
	my $before = sha256_hex(slurp_file($dll));
	($rc, $out) = dotnet('build', 'src/QueueBox.Inbox', '--no-restore', '--no-incremental', '-c', 'Release',
		'-f', 'net10.0', '--disable-build-servers');
	is($rc, 0, 'QueueBox.Inbox rebuilds') or diag $out;
	is(sha256_hex(slurp_file($dll)), $before, 'the rebuild is byte for byte the same assembly (deterministic)');
}

# the application: the block as written, but for nuget.org in the nuget.config
# that dotnet new nugetconfig writes (offline, clients/dotnet/packages stands
# for it); its packages go to the HOME's own folder, not the tree's
($rc, $out) = readme_sh($home, undef, <<'EOS' . $app_sh);
dotnet() {
	command dotnet "$@" || return
	if [ "$1 $2" = "new nugetconfig" ]; then sed -i "s|https://api.nuget.org/v3/index.json|$QB_FEED|" nuget.config; fi
}
EOS
is($rc, 0, 'the README\'s application commands run: a console application, its nuget.config, both packages added')
  or diag $out;
my $app = "$home/Orders";
like(-f "$app/nuget.config" ? slurp_file("$app/nuget.config") : '', qr{<add key="queuebox" value="\Q$packed\E" />},
	'the nuget.config lists ~/queuebox-feed by its absolute path');
for my $project ('QueueBox.Inbox', 'QueueBox.Inbox.DependencyInjection')
{
	my $got = sprintf('%s/.nuget/packages/%s/0.1.0/%s.0.1.0.nupkg', $home, lc $project, lc $project);
	ok(-f $got && sha256_hex(slurp_file($got)) eq sha256_hex(slurp_file("$packed/$project.0.1.0.nupkg")),
		"$project 0.1.0 is restored, the package packed into ~/queuebox-feed");
}

# "Use": the table, the Program.cs, then the message; it lands in orders
$node->safe_psql('postgres', $readme_sql[0] // '');
is($node->safe_psql('postgres', 'SELECT count(*) FROM orders'), '0', 'the README\'s table orders is empty');
open(my $fh, '>', "$app/Program.cs") or die "$app/Program.cs: $!";
print $fh $program;
close $fh;
($rc, $out) = readme_sh($app, undef, 'dotnet build --no-restore -warnaserror -o ~/orders-bin --disable-build-servers');
is($rc, 0, 'the README\'s Program.cs builds against the packed package, with no warning') or diag $out;
{
	local $ENV{ORDERS_DB} = sprintf('Host=%s;Port=%d;Database=postgres;Username=postgres', $node->host, $node->port);
	my ($o, $e) = ('', '');
	# SIGINT as a terminal gives it: a suite started in the background
	# inherits SIGINT ignored, and .NET keeps an ignored SIGINT ignored
	my $h = IPC::Run::start([ 'dotnet', "$home/orders-bin/Orders.dll" ], '<', \undef, '>', \$o, '2>', \$e,
		init => sub { $SIG{INT} = 'DEFAULT' });
	$node->safe_psql('postgres', $readme_sql[1] // '');
	qb_wait_query($node, 'SELECT count(*) FROM orders', '1', 'the README\'s program consumes the README\'s message',
		timeout => 60);
	is($node->safe_psql('postgres', 'SELECT id, total FROM orders'), '1001|250', 'the order is written as the payload says');
	is($node->safe_psql('postgres', q{SELECT state FROM queuebox.inbox WHERE idempotency_key = 'order-1001'}),
		'processed', 'and the message is processed');
	# a message it cannot handle (no total): without a logger the failure shows on stderr
	$node->safe_psql('postgres', q{
		INSERT INTO queuebox.inbox (source, idempotency_key, consumption, payload)
		VALUES ('orders', 'order-1002', 'pull', '{"id": "1002"}');
	});
	qb_wait_for(sub { $h->pump_nb; $e =~ /^warn: QueueBox\.Inbox\.orders: message \d+: failed \(.*\); retried after/m },
		'a failing handler shows on standard error with no logger configured', timeout => 30) or diag "$o$e";
	like($e, qr/^System\.Collections\.Generic\.KeyNotFoundException: [^\n]*\n(?:\s+at [^\n]*\n)*?\s+at [^\n]*Program\.cs:line \d+/m,
		'with the exception and where in Program.cs it was thrown') or diag $e;
	$h->signal('INT');
	$h->finish;
	is($h->result(0), 0, 'Ctrl+C (SIGINT) stops the program, exit code 0') or diag "$o$e";
	note "the README's program wrote:\n$o$e";
	is($node->safe_psql('postgres', 'SELECT string_agg(id, \',\') FROM orders'), '1001', 'the failed message wrote nothing');
}

# the DI package from the same folder: AddQueueBoxInbox in the generic host
{
	($rc, $out) = readme_sh($app, undef, 'dotnet add package Microsoft.Extensions.Hosting --version 10.0.0');
	is($rc, 0, 'the application adds Microsoft.Extensions.Hosting') or diag $out;
	open($fh, '>', "$app/Program.cs") or die $!;
	print $fh <<'EOC';
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Hosting;
using Npgsql;
using QueueBox.Inbox;
using QueueBox.Inbox.DependencyInjection;

var builder = Host.CreateApplicationBuilder(args);
builder.Services.AddSingleton(NpgsqlDataSource.Create(args[0]));
builder.Services.AddQueueBoxInbox(
    sp => InboxConnections.From(sp.GetRequiredService<NpgsqlDataSource>()),
    options => options.Source = "app",
    sp => async (message, transaction, cancellationToken) =>
    {
        await using var command = transaction.CreateCommand();
        command.CommandText = "INSERT INTO app_effects (key) VALUES (@key)";
        command.WithParameter("@key", message.IdempotencyKey);
        await command.ExecuteNonQueryAsync(cancellationToken);
        sp.GetRequiredService<IHostApplicationLifetime>().StopApplication();
    });
await builder.Build().RunAsync();
EOC
	close $fh;
	$node->safe_psql('postgres', q{
		CREATE TABLE app_effects (key text PRIMARY KEY);
		INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption) VALUES ('app', 'a-1', '{}', 'pull');
	});
	my $cs = sprintf('Host=%s;Port=%d;Database=postgres;Username=postgres', $node->host, $node->port);
	($rc, $out) = readme_sh($app, undef, qq{dotnet run --no-restore -- '$cs'});
	is($rc, 0, 'the application builds and runs') or diag $out;
	is($node->safe_psql('postgres', q{SELECT state FROM queuebox.inbox WHERE source = 'app'}), 'processed',
		'it consumed the message through AddQueueBoxInbox');
	is($node->safe_psql('postgres', q{SELECT string_agg(key, ',') FROM app_effects}), 'a-1', 'its effect is written once');
}
done_testing();
