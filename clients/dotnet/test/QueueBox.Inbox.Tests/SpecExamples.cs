// The C# examples of "Consume the inbox" (the spec) and docs/pull.md, as
// they are written there (TAP 039 checks that each block of docs/pull.md's
// C# section is in this file, character for character, and that the
// worker's block is in clients/dotnet/README.md's Program.cs), run on
// PostgreSQL and, when QUEUEBOX_TEST_MSSQL_URL is set, on SQL Server.
using System;
using System.Data.Common;
using System.Text.Json;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.Data.SqlClient;
using Npgsql;
using QueueBox.Inbox;
using Xunit;

namespace QueueBox.Inbox.Tests;

// ---- the spec's retry policy, as written
public sealed class OrdersRetryPolicy : IInboxRetryPolicy
{
    public InboxFailureAction Decide(InboxMessage message, Exception failure) => failure switch
    {
        JsonException => InboxFailureAction.DeadLetter(),
        _ when message.Attempt >= 5 => InboxFailureAction.DeadLetter(),
        _ => InboxFailureAction.Retry(TimeSpan.FromSeconds(Math.Pow(2, message.Attempt))),
    };
}

public sealed class SpecExamples
{
    /// <summary>The spec's worker, as written, on the data source given.</summary>
    private static async Task RunTheExample(DbDataSource dataSource, CancellationTokenSource stopping)
    {
        // ---- the spec's example, as written
var worker = new InboxWorker(
    InboxConnections.From(dataSource),
    new InboxOptions { Source = "orders", BatchSize = 10, LeaseMs = 30_000 });

await worker.RunAsync(async (message, transaction, cancellationToken) =>
{
    await using var command = transaction.CreateCommand();

    command.CommandText = "INSERT INTO orders (id, total) VALUES (@id, @total)";
    command
        .WithParameter("@id", message.Payload.GetProperty("id").GetString())
        .WithParameter("@total", message.Payload.GetProperty("total").GetInt32());

    await command.ExecuteNonQueryAsync(cancellationToken);
}, stopping.Token);
        // ---- end of the example
    }

    private static async Task ExampleWritesEachOrderOnce(Backend b, string createOrders, string insertMessage)
    {
        await b.Exec("DELETE FROM queuebox.inbox WHERE source = 'orders'");
        // the example's table, as it names it: one left by an earlier run goes first
        await b.Exec(b.Dialect == InboxDialect.SqlServer
            ? "IF OBJECT_ID(N'orders') IS NOT NULL DROP TABLE orders"
            : "DROP TABLE IF EXISTS orders");
        await b.Exec(createOrders);
        try
        {
            for (var g = 1; g <= 5; g++)
            {
                await b.Exec(insertMessage, ("@key", $"o-{g}"), ("@agg", $"c{g % 2}"), ("@payload", $"{{\"id\": \"o-{g}\", \"total\": {10 * g}}}"));
            }
            using var stopping = new CancellationTokenSource();
            var run = RunTheExample(b.DataSource, stopping);
            await b.WaitFor("SELECT count(*) FROM queuebox.inbox WHERE source = 'orders' AND state = 'processed'", "5");
            await stopping.CancelAsync();
            await run;
            Assert.Equal("o-1:10,o-2:20,o-3:30,o-4:40,o-5:50", await b.Rows("SELECT id, total FROM orders ORDER BY id"));
        }
        finally
        {
            await b.Exec("DELETE FROM queuebox.inbox WHERE source = 'orders'");
            await b.Exec("DROP TABLE orders");
        }
    }

    [PgFact]
    public async Task TheWorkerExampleRunsOnPostgreSql()
    {
        var b = Databases.PostgreSql();
        await ExampleWritesEachOrderOnce(b, "CREATE TABLE orders (id text PRIMARY KEY, total int)",
            "INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)"
            + " VALUES ('orders', @key, @agg, CAST(@payload AS jsonb), 'pull')");
        await b.DataSource.DisposeAsync();
    }

    [MssqlFact]
    public async Task TheWorkerExampleRunsOnSqlServer()
    {
        var b = Databases.SqlServer();
        Assert.IsType<SqlConnection>(b.DataSource.CreateConnection());
        await ExampleWritesEachOrderOnce(b, "CREATE TABLE orders (id NVARCHAR(100) PRIMARY KEY, total INT)",
            "INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)"
            + " VALUES ('orders', @key, @agg, @payload, 'pull')");
        await b.DataSource.DisposeAsync();
    }

    [Fact]
    public void TheRetryPolicyExample()
    {
        // ---- the spec's options, as written
var options = new InboxOptions { Source = "orders", RetryPolicy = new OrdersRetryPolicy() };
        // ---- end of the example
        var message = new InboxMessage(1, Guid.NewGuid(), "orders", "o-1", null, null,
            InboxMessage.ParsePayload("{}"), InboxMessage.ParseHeaders(null), 2, DateTimeOffset.UtcNow);
        Assert.True(options.RetryPolicy.Decide(message, new JsonException("bad")).IsDeadLetter);
        Assert.Equal(InboxFailureAction.Retry(TimeSpan.FromSeconds(4)), options.RetryPolicy.Decide(message, new InvalidOperationException()));
    }
}
