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
#   skipped, saying why.  Then
#   as processes: two workers on one source divide the work, and a worker
#   killed with -9 mid-handler loses nothing and applies nothing twice.
#   Then the two NuGet packages: dotnet pack (0.1.0, the README inside, a
#   deterministic build), and an application that restores them from a
#   local folder and consumes a message through AddQueueBoxInbox.
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

use FindBin;
use lib "$FindBin::RealBin/../perl";
use QueueBoxTest;

if (system('command -v dotnet >/dev/null 2>&1') != 0)
{
	plan skip_all => 'the C# tests (clients/dotnet) are skipped: dotnet is not installed;'
	  . ' install the .NET 10 SDK (package dotnet-sdk-10.0 from packages.microsoft.com, or https://dot.net/v1/dotnet-install.sh),'
	  . ' then run scripts/setup.sh';
}

my $dir = abs_path("$FindBin::RealBin/../../clients/dotnet");
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
my $mssql = defined $ENV{QUEUEBOX_TEST_MSSQL_URL} && $ENV{QUEUEBOX_TEST_MSSQL_URL} ne '';
{
	local $ENV{QBI_TEST_PGHOST} = $node->host;
	local $ENV{QBI_TEST_PGPORT} = $node->port;
	local $ENV{QBI_TEST_MSSQLD} = qb_test_binary('queuebox-mssqld') if $mssql;
	($rc, $out) = dotnet('test', 'QueueBox.Inbox.slnx', '--no-build', '-c', 'Release',
		'--logger', 'console;verbosity=detailed');
}
note $out;
is($rc, 0, 'dotnet test passes') or diag $out;
my ($total) = $out =~ /^Total tests: (\d+)$/m;
my ($passed) = $out =~ /^\s+Passed: (\d+)$/m;
my ($skipped) = $out =~ /^\s+Skipped: (\d+)$/m;
unlike($out, qr/^\s+Failed: [1-9]/m, 'no test failed');
is($total, 41, 'forty-one tests ran');
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
if ($mssql)
{
	is($skipped // 0, 0, 'SQL Server: nothing skipped');
	my @ms = $out =~ /^\s+Passed QueueBox\.Inbox\.Tests\.SqlServerScenarios\.(\w+)/mg;
	is(scalar(@ms), 10, 'SQL Server: the scenarios 1 to 7, the dialect and Msg 51000 passed') or diag "@ms";
	like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.EfCoreTests\.SqlServerContextCommitsWithTheCompletion/m,
		'SQL Server: EF Core on the handler transaction');
	like($out, qr/^\s+Passed QueueBox\.Inbox\.Tests\.SpecExamples\.TheWorkerExampleRunsOnSqlServer/m,
		'SQL Server: the spec\'s worker example as written');
	is($passed, 41, 'all passed');
}
else
{
	is($skipped, 12, 'SQL Server: its twelve tests are skipped');
	like($out, qr/Skipped QueueBox\.Inbox\.Tests\.SqlServerScenarios\.S1_CommitTogether.*\n.*\n\s+QUEUEBOX_TEST_MSSQL_URL is not set/,
		'SQL Server: skipped, saying why');
	is($passed, 29, 'the other twenty-nine passed');
}
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'}), '0',
	'no transaction is left open');

# ---- docs/pull.md's C# example is the one the tests run
{
	my $tests = slurp_file("$dir/test/QueueBox.Inbox.Tests/SpecExamples.cs");
	my ($section) = slurp_file("$FindBin::RealBin/../../docs/pull.md") =~ /^#### C#\n(.*?)^###? /ms;
	my @blocks = ($section // '') =~ /^```csharp\n(.*?)^```$/msg;
	ok(@blocks >= 2, 'docs/pull.md has the C# examples');
	for my $block (@blocks)
	{
		ok(index($tests, $block) >= 0, 'a C# block of docs/pull.md is in SpecExamples.cs as written')
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

# ---- the packages: dotnet pack, and an application that restores them from a folder
my $packed = "$tmp/dotnet-feed";
for my $project ('QueueBox.Inbox', 'QueueBox.Inbox.DependencyInjection')
{
	($rc, $out) = dotnet('pack', "src/$project", '--no-restore', '--no-build', '-c', 'Release', '-o', $packed);
	is($rc, 0, "dotnet pack $project") or diag $out;
	my $nupkg = "$packed/$project.0.1.0.nupkg";
	ok(-f $nupkg, "$project.0.1.0.nupkg is made");
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
{
	my $app = "$tmp/dotnet-app";
	mkdir $app;
	nuget_config("$app/nuget.config", $packed, $feed);
	open(my $fh, '>', "$app/App.csproj") or die $!;
	print $fh <<'EOC';
<Project Sdk="Microsoft.NET.Sdk">
  <PropertyGroup>
    <OutputType>Exe</OutputType>
    <TargetFramework>net10.0</TargetFramework>
    <Nullable>enable</Nullable>
    <ImplicitUsings>enable</ImplicitUsings>
    <TreatWarningsAsErrors>true</TreatWarningsAsErrors>
  </PropertyGroup>
  <ItemGroup>
    <PackageReference Include="QueueBox.Inbox" Version="0.1.0" />
    <PackageReference Include="QueueBox.Inbox.DependencyInjection" Version="0.1.0" />
    <PackageReference Include="Microsoft.Extensions.Hosting" Version="10.0.0" />
  </ItemGroup>
</Project>
EOC
	close $fh;
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
	my ($o, $e) = ('', '');
	# its own package folder: the packed copies do not land in the tree's
	local $ENV{NUGET_PACKAGES} = "$app/packages";
	IPC::Run::run([ 'dotnet', 'restore', '--configfile', "$app/nuget.config" ], '>', \$o, '2>', \$e,
		init => sub { chdir $app or die $! });
	is($? >> 8, 0, 'an application restores QueueBox.Inbox and QueueBox.Inbox.DependencyInjection 0.1.0 from a folder')
	  or diag "$o$e";
	ok(-f "$app/packages/queuebox.inbox.dependencyinjection/0.1.0/queuebox.inbox.dependencyinjection.0.1.0.nupkg",
		'from the packed folder') or diag "$o$e";
	my $cs = sprintf('Host=%s;Port=%d;Database=postgres;Username=postgres', $node->host, $node->port);
	IPC::Run::run([ 'dotnet', 'run', '--no-restore', '--', $cs ], '>', \$o, '2>', \$e,
		init => sub { chdir $app or die $! });
	is($? >> 8, 0, 'the application builds and runs') or diag "$o$e";
	is($node->safe_psql('postgres', q{SELECT state FROM queuebox.inbox WHERE source = 'app'}), 'processed',
		'it consumed the message through AddQueueBoxInbox');
	is($node->safe_psql('postgres', q{SELECT string_agg(key, ',') FROM app_effects}), 'a-1', 'its effect is written once');
}
done_testing();
