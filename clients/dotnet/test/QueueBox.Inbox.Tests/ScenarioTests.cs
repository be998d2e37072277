// The scenarios on PostgreSQL and, when QUEUEBOX_TEST_MSSQL_URL is set, on
// SQL Server (with Msg 51000 as a temporary failure there).
using System;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.Data.SqlClient;
using QueueBox.Inbox;
using Xunit;

namespace QueueBox.Inbox.Tests;

public sealed class PostgreSqlScenarios(PostgreSqlFixture fixture) : IClassFixture<PostgreSqlFixture>
{
    private async Task Run(Func<Backend, Task> scenario)
    {
        await fixture.Backend.Exec(fixture.Backend.Reset);
        await scenario(fixture.Backend);
    }

    [PgFact] public Task S1_CommitTogether() => Run(Scenarios.CommitTogether);
    [PgFact] public Task S2_SlowHandlerKeeps() => Run(Scenarios.SlowHandlerKeeps);
    [PgFact] public Task S3_LostLease() => Run(Scenarios.LostLease);
    [PgFact] public Task S3b_LostAtCompletion() => Run(Scenarios.LostAtCompletion);
    [PgFact] public Task S4_RetryAndPolicy() => Run(Scenarios.RetryAndPolicy);
    [PgFact] public Task S5_DefaultPolicy() => Run(Scenarios.DefaultPolicy);
    [PgFact] public Task S6_ShutdownGrace() => Run(Scenarios.ShutdownGrace);
    [PgFact] public Task S7_MaxConcurrency() => Run(Scenarios.MaxConcurrency);

    // the handler's activity continues the trace the message arrived with
    [PgFact]
    public Task S11_HandlerSpanIsAChildOfTheMessage() => Run(async b =>
    {
        const string traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
        await b.Exec("INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers, consumption) " +
            "VALUES ({source}, 'traced-1', '{}', '{\"Traceparent\": \"00-" + traceId + "-00f067aa0ba902b7-01\", \"tracestate\": \"congo=1\"}', 'pull')");
        var seen = new System.Collections.Concurrent.ConcurrentQueue<System.Diagnostics.Activity>();
        using var listener = new System.Diagnostics.ActivityListener
        {
            ShouldListenTo = source => source.Name == InboxTelemetry.Name,
            Sample = (ref System.Diagnostics.ActivityCreationOptions<System.Diagnostics.ActivityContext> _) =>
                System.Diagnostics.ActivitySamplingResult.AllDataAndRecorded,
            ActivityStopped = seen.Enqueue,
        };
        System.Diagnostics.ActivitySource.AddActivityListener(listener);
        string? inHandler = null;
        await using (var run = b.Start(new InboxOptions { Source = b.Source, PollInterval = TimeSpan.FromMilliseconds(50) },
            (m, tx, ct) => { inHandler = System.Diagnostics.Activity.Current?.TraceId.ToString(); return Task.CompletedTask; }))
        {
            await b.WaitFor("SELECT state FROM {inbox}", "processed");
        }
        var span = Assert.Single(seen);
        Assert.Equal(traceId, span.TraceId.ToString());
        Assert.Equal("00f067aa0ba902b7", span.ParentSpanId.ToString());
        Assert.NotEqual("00f067aa0ba902b7", span.SpanId.ToString());
        Assert.Equal("congo=1", span.TraceStateString);
        Assert.Equal(traceId, inHandler);
    });

    [PgFact]
    public void DetectsPostgreSql()
    {
        var worker = new InboxWorker(InboxConnections.From(fixture.Backend.DataSource), new InboxOptions { Source = "x" });
        Assert.Equal(InboxDialect.PostgreSql, worker.Dialect);
    }
}

public sealed class SqlServerScenarios(SqlServerFixture fixture) : IClassFixture<SqlServerFixture>
{
    private async Task Run(Func<Backend, Task> scenario)
    {
        await fixture.Backend.Exec(fixture.Backend.Reset);
        await scenario(fixture.Backend);
    }

    [MssqlFact] public Task S1_CommitTogether() => Run(Scenarios.CommitTogether);
    [MssqlFact] public Task S2_SlowHandlerKeeps() => Run(Scenarios.SlowHandlerKeeps);
    [MssqlFact] public Task S3_LostLease() => Run(Scenarios.LostLease);
    [MssqlFact] public Task S3b_LostAtCompletion() => Run(Scenarios.LostAtCompletion);
    [MssqlFact] public Task S4_RetryAndPolicy() => Run(Scenarios.RetryAndPolicy);
    [MssqlFact] public Task S5_DefaultPolicy() => Run(Scenarios.DefaultPolicy);
    [MssqlFact] public Task S6_ShutdownGrace() => Run(Scenarios.ShutdownGrace);
    [MssqlFact] public Task S7_MaxConcurrency() => Run(Scenarios.MaxConcurrency);

    [MssqlFact]
    public void DetectsSqlServer()
    {
        var worker = new InboxWorker(InboxConnections.From(fixture.Backend.DataSource), new InboxOptions { Source = "x" });
        Assert.Equal(InboxDialect.SqlServer, worker.Dialect);
    }

    // 10. a claim behind a held lock answers Msg 51000: the worker says so and claims again
    [MssqlFact]
    public Task S10_Msg51000IsTemporary() => Run(async b =>
    {
        await b.AddRows(1, 0);
        var log = new ListLogger();
        // the claim's application lock, held by another session for longer than the claim waits
        await using var holder = new SqlConnection(Databases.SqlServerConnectionString());
        await holder.OpenAsync();
        await using var transaction = (SqlTransaction)await holder.BeginTransactionAsync();
        await using (var take = holder.CreateCommand())
        {
            take.Transaction = transaction;
            take.CommandText = "DECLARE @r INT; EXEC @r = sp_getapplock @Resource = @res, @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 1000; SELECT @r";
            take.Parameters.AddWithValue("@res", "queuebox.inbox_claim:" + b.Source);
            Assert.True((int)(await take.ExecuteScalarAsync())! >= 0, "the test holds the claim's lock");
        }
        var handled = 0;
        var worker = new InboxWorker(InboxConnections.From(b.DataSource),
            new InboxOptions { Source = b.Source, PollInterval = TimeSpan.FromMilliseconds(50) }, log);
        using var stop = new CancellationTokenSource();
        var run = worker.RunAsync((m, tx, ct) =>
        {
            Interlocked.Increment(ref handled);
            return Task.CompletedTask;
        }, stop.Token);
        await Until.True("Msg 51000 to be logged", () => log.Contains(
            $"Information: claim: another claim of source {b.Source} held its lock for 10 s (Msg 51000, temporary)"), seconds: 40);
        Assert.Equal(0, Volatile.Read(ref handled));
        Assert.Equal("pending", await b.Rows("SELECT state FROM {inbox}"));
        await transaction.RollbackAsync();
        await b.WaitFor("SELECT state FROM {inbox}", "processed");
        await stop.CancelAsync();
        await run;
        Assert.Equal(1L, worker.Counters.Completed);
    });
}
