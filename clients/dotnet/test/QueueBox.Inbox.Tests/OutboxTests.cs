// The outbox from application code (issue 40) on PostgreSQL with the
// extension and, when QUEUEBOX_TEST_MSSQL_URL is set, on SQL Server: a
// business write and its enqueue commit together and roll back together
// (rows counted before and after); the trace context of the current
// Activity reaches the real sink (test/sink/qb_sink, whose JSONL log
// QBI_TEST_SINK_LOG names) as the parent of the delivery's traceparent;
// a caller's traceparent is kept, a malformed one refused and nothing
// written; a batch is one round trip (the driver's own telemetry counts
// them); a delayed row stays pending while a later row is sent, and is
// delivered at or after its time; EF Core's SaveChanges writes the
// messages in its transaction.  TAP 039 routes topics dotnet.** to the
// sink: the extension's workers deliver on PostgreSQL, a queuebox-mssqld
// it starts on SQL Server.
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Data.Common;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Text.Json;
using System.Threading.Tasks;
using Microsoft.EntityFrameworkCore;
using QueueBox.Inbox;
using QueueBox.Inbox.DependencyInjection;
using Xunit;

namespace QueueBox.Inbox.Tests;

/// <summary>The round trips a driver makes, from its own telemetry: Npgsql's activity source (one activity per
/// command or batch it sends) and SqlClient's diagnostic listener (one WriteCommandBefore per command).</summary>
public sealed class RoundTrips : IDisposable, IObserver<DiagnosticListener>, IObserver<KeyValuePair<string, object?>>
{
    private readonly ActivityListener _npgsql;
    private readonly IDisposable _all;
    private readonly List<IDisposable> _subscriptions = [];
    private int _count;

    public RoundTrips()
    {
        _npgsql = new ActivityListener
        {
            ShouldListenTo = s => s.Name == "Npgsql",
            Sample = (ref ActivityCreationOptions<ActivityContext> _) => ActivitySamplingResult.AllData,
            ActivityStarted = _ => System.Threading.Interlocked.Increment(ref _count),
        };
        ActivitySource.AddActivityListener(_npgsql);
        _all = DiagnosticListener.AllListeners.Subscribe(this);
    }

    public int Count => System.Threading.Volatile.Read(ref _count);

    public void OnNext(DiagnosticListener value)
    {
        if (value.Name == "SqlClientDiagnosticListener")
        {
            lock (_subscriptions)
            {
                _subscriptions.Add(value.Subscribe(this));
            }
        }
    }

    public void OnNext(KeyValuePair<string, object?> value)
    {
        if (value.Key == "Microsoft.Data.SqlClient.WriteCommandBefore")
        {
            System.Threading.Interlocked.Increment(ref _count);
        }
    }

    public void OnCompleted()
    {
    }

    public void OnError(Exception error)
    {
    }

    public void Dispose()
    {
        _npgsql.Dispose();
        _all.Dispose();
        lock (_subscriptions)
        {
            _subscriptions.ForEach(s => s.Dispose());
        }
    }
}

/// <summary>The requests the sink answered, from its JSONL log.</summary>
public static class Sink
{
    public static string? Log => Environment.GetEnvironmentVariable("QBI_TEST_SINK_LOG");

    /// <summary>The requests of the message (its X-Message-Id): each request's headers and t_us.</summary>
    public static List<(Dictionary<string, string> Headers, long TimeUs)> Requests(Guid messageId)
    {
        var found = new List<(Dictionary<string, string>, long)>();
        if (!File.Exists(Log))
        {
            return found;
        }
        using var stream = new FileStream(Log!, FileMode.Open, FileAccess.Read, FileShare.ReadWrite);
        using var reader = new StreamReader(stream);
        while (reader.ReadLine() is { } line)
        {
            using var doc = JsonDocument.Parse(line);
            var headers = doc.RootElement.GetProperty("headers").EnumerateObject()
                .ToDictionary(p => p.Name, p => p.Value.GetString() ?? "");
            if (headers.TryGetValue("x-message-id", out var id) && Guid.Parse(id) == messageId)
            {
                found.Add((headers, doc.RootElement.GetProperty("t_us").GetInt64()));
            }
        }
        return found;
    }
}

public static class OutboxScenarios
{
    public static string Topic(string what) => $"dotnet.{Environment.ProcessId}.{what}";

    /// <summary>The business table anew. The outbox rows stay: their topics are this process's own, and a
    /// DELETE of rows the relay is delivering can deadlock with its settle.</summary>
    public static Task Reset(Backend b) => b.Exec(b.Reset);

    public static Task<string> Count(Backend b, string what) =>
        b.Rows("SELECT count(*) FROM queuebox.outbox WHERE topic = @t", ("@t", Topic(what)));

    /// <summary>The row's state, attempt and headers.</summary>
    public static async Task<(string State, int Attempt, Dictionary<string, string> Headers)> Row(Backend b, Guid id)
    {
        await using var connection = await b.DataSource.OpenConnectionAsync();
        await using var command = connection.CreateCommand();
        command.CommandText = b.Dialect == InboxDialect.SqlServer
            ? "SELECT state, attempt, headers FROM queuebox.outbox WHERE message_id = @m"
            : "SELECT state, attempt, headers::text FROM queuebox.outbox WHERE message_id = @m";
        command.WithParameter("@m", id);
        await using var reader = await command.ExecuteReaderAsync();
        Assert.True(await reader.ReadAsync(), $"no outbox row of message_id {id}");
        var headers = JsonSerializer.Deserialize<Dictionary<string, string>>(reader.GetString(2))!;
        return (reader.GetString(0), reader.GetInt32(1), headers);
    }

    public static Task WaitState(Backend b, Guid id, string state) =>
        b.WaitFor($"SELECT state FROM queuebox.outbox WHERE message_id = '{id}'", state);

    /// <summary>A business row and a message in one transaction: committed, both are there; rolled back,
    /// neither (counted before and after).</summary>
    public static async Task CommitAndRollBackTogether(Backend b)
    {
        await Reset(b);
        Assert.Equal(("0", "0"), (await b.Rows("SELECT count(*) FROM {biz}"), await Count(b, "paid")));
        foreach (var commit in new[] { true, false })
        {
            await using var connection = await b.DataSource.OpenConnectionAsync();
            await using var transaction = await connection.BeginTransactionAsync();
            await using (var insert = transaction.CreateCommand())
            {
                insert.CommandText = b.Q("INSERT INTO {biz} (msg, n) VALUES (42, 250)");
                await insert.ExecuteNonQueryAsync();
            }
            await transaction.EnqueueAsync(Topic("paid"), new { OrderId = 42, Total = 250 }, key: "order-42");
            if (commit)
            {
                await transaction.CommitAsync();
            }
            else
            {
                await transaction.RollbackAsync();
            }
        }
        Assert.Equal(("1", "1"), (await b.Rows("SELECT count(*) FROM {biz}"), await Count(b, "paid")));
        // System.Text.Json's web defaults: camelCase names
        Assert.Equal("order-42:42:250", await b.Rows(b.Dialect == InboxDialect.SqlServer
            ? "SELECT [key], JSON_VALUE(payload, '$.orderId'), JSON_VALUE(payload, '$.total') FROM queuebox.outbox WHERE topic = @t"
            : "SELECT key, payload->>'orderId', payload->>'total' FROM queuebox.outbox WHERE topic = @t", ("@t", Topic("paid"))));
    }

    /// <summary>The current activity's context is stored and delivered: the sink's traceparent is a child of
    /// the span that enqueued (same trace, a span of its own, the tracestate along).</summary>
    public static async Task TraceFromTheCurrentActivity(Backend b)
    {
        await Reset(b);
        using var source = new ActivitySource("QueueBox.Tests.Outbox");
        using var listener = new ActivityListener
        {
            ShouldListenTo = s => s.Name == source.Name,
            Sample = (ref ActivityCreationOptions<ActivityContext> _) => ActivitySamplingResult.AllDataAndRecorded,
        };
        ActivitySource.AddActivityListener(listener);
        Guid id;
        string traceId, spanId;
        using (var span = source.StartActivity("place order")!)
        {
            span.TraceStateString = "congo=t61rcWkgMzE";
            (traceId, spanId) = (span.TraceId.ToHexString(), span.SpanId.ToHexString());
            await using var connection = await b.DataSource.OpenConnectionAsync();
            await using var transaction = await connection.BeginTransactionAsync();
            id = await transaction.EnqueueAsync(Topic("traced"), new { OrderId = 7 });
            await transaction.CommitAsync();
        }
        var row = await Row(b, id);
        Assert.Equal($"00-{traceId}-{spanId}-01", row.Headers["traceparent"]);
        Assert.Equal("congo=t61rcWkgMzE", row.Headers["tracestate"]);
        await WaitState(b, id, "sent");
        var request = Assert.Single(Sink.Requests(id));
        var sent = request.Headers["traceparent"].Split('-');
        Assert.Equal(("00", traceId, "01"), (sent[0], sent[1], sent[3]));
        Assert.Matches("^[0-9a-f]{16}$", sent[2]);
        Assert.NotEqual(spanId, sent[2]);
        Assert.Equal("congo=t61rcWkgMzE", request.Headers["tracestate"]);
    }

    /// <summary>A caller's traceparent wins over the current activity; a malformed one is refused, naming it and
    /// the format, and nothing is written.</summary>
    public static async Task CallersTraceparent(Backend b)
    {
        await Reset(b);
        using var source = new ActivitySource("QueueBox.Tests.Outbox");
        using var listener = new ActivityListener
        {
            ShouldListenTo = s => s.Name == source.Name,
            Sample = (ref ActivityCreationOptions<ActivityContext> _) => ActivitySamplingResult.AllDataAndRecorded,
        };
        ActivitySource.AddActivityListener(listener);
        using var span = source.StartActivity("place order")!;
        await using var connection = await b.DataSource.OpenConnectionAsync();
        await using var transaction = await connection.BeginTransactionAsync();
        const string mine = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        var id = await transaction.EnqueueAsync(Topic("own"), new { }, headers: new Dictionary<string, string>
        {
            ["TraceParent"] = mine,
            ["x-tenant"] = "acme",
        });
        foreach (var bad in new[] { "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", "trace-me" })
        {
            var e = await Assert.ThrowsAsync<ArgumentException>(() => transaction.EnqueueAsync(Topic("own"), new { },
                headers: new Dictionary<string, string> { ["traceparent"] = bad }));
            Assert.Contains($"\"{bad}\"", e.Message, StringComparison.Ordinal);
            Assert.Contains("00-<trace-id: 32 lowercase hex>-<parent-id: 16 lowercase hex>-<flags: 2 lowercase hex>", e.Message,
                StringComparison.Ordinal);
        }
        await transaction.CommitAsync();
        Assert.Equal("1", await Count(b, "own"));
        var row = await Row(b, id);
        Assert.Equal(mine, row.Headers["TraceParent"]);
        Assert.Equal("acme", row.Headers["x-tenant"]);
        Assert.False(row.Headers.ContainsKey("traceparent") || row.Headers.ContainsKey("tracestate"));
    }

    /// <summary>A batch of 100 is one round trip, its rows in order; one larger than a statement takes
    /// (chunks in one DbBatch) is written whole too.</summary>
    public static async Task Batch(Backend b)
    {
        await Reset(b);
        var messages = Enumerable.Range(1, 100)
            .Select(i => OutboxMessage.Create(Topic("batch"), new { Seq = i }, key: $"k{i % 5}"))
            .ToList();
        await using (var connection = await b.DataSource.OpenConnectionAsync())
        {
            await using var transaction = await connection.BeginTransactionAsync();
            using var trips = new RoundTrips();
            await transaction.EnqueueBatchAsync(messages);
            Assert.Equal(1, trips.Count);
            await transaction.CommitAsync();
        }
        Assert.Equal("100", await Count(b, "batch"));
        var order = await b.Rows(b.Dialect == InboxDialect.SqlServer
            ? "SELECT JSON_VALUE(payload, '$.seq') FROM queuebox.outbox WHERE topic = @t ORDER BY id"
            : "SELECT payload->>'seq' FROM queuebox.outbox WHERE topic = @t ORDER BY id", ("@t", Topic("batch")));
        Assert.Equal(string.Join(',', Enumerable.Range(1, 100)), order);

        var many = Enumerable.Range(1, 1200).Select(i => OutboxMessage.Create(Topic("big"), new { Seq = i })).ToList();
        await using (var connection = await b.DataSource.OpenConnectionAsync())
        {
            await using var transaction = await connection.BeginTransactionAsync();
            using var trips = new RoundTrips();
            await transaction.EnqueueBatchAsync(many);
            Assert.Equal(1, trips.Count);
            await transaction.CommitAsync();
        }
        Assert.Equal("1200", await Count(b, "big"));
        Assert.Equal("1200", await b.Rows(b.Dialect == InboxDialect.SqlServer
            ? "SELECT count(DISTINCT JSON_VALUE(payload, '$.seq')) FROM queuebox.outbox WHERE topic = @t"
            : "SELECT count(DISTINCT payload->>'seq') FROM queuebox.outbox WHERE topic = @t", ("@t", Topic("big"))));

        if (b.Dialect == InboxDialect.SqlServer)
        {
            // a key SQL Server cannot hold: refused before anything is sent, naming the message
            var bad = new[] { OutboxMessage.Create(Topic("long"), new { Seq = 1 }), OutboxMessage.Create(Topic("long"), new { Seq = 2 }, key: new string('k', 401)) };
            await using var connection = await b.DataSource.OpenConnectionAsync();
            await using var transaction = await connection.BeginTransactionAsync();
            var e = await Assert.ThrowsAsync<ArgumentException>(() => transaction.EnqueueBatchAsync(bad));
            Assert.Contains("message 1 of the batch: its key is 401 characters", e.Message, StringComparison.Ordinal);
            await transaction.CommitAsync();
            Assert.Equal("0", await Count(b, "long"));
        }
    }

    /// <summary>Delayed: a row an hour ahead stays pending (no attempt, its time kept, nothing at the sink)
    /// while a later row of the same batch is sent; a row seconds ahead is delivered at or after its time.</summary>
    public static async Task Delayed(Backend b)
    {
        await Reset(b);
        var hour = DateTimeOffset.UtcNow.AddHours(1);
        var soon = DateTimeOffset.UtcNow.AddSeconds(3);
        var later = OutboxMessage.Create(Topic("later"), new { Seq = 1 }, notBefore: hour);
        var now = OutboxMessage.Create(Topic("now"), new { Seq = 2 });
        var shortly = OutboxMessage.Create(Topic("soon"), new { Seq = 3 }, notBefore: soon);
        await using (var connection = await b.DataSource.OpenConnectionAsync())
        {
            await using var transaction = await connection.BeginTransactionAsync();
            await transaction.EnqueueBatchAsync([later, now, shortly]);
            await transaction.CommitAsync();
        }
        await WaitState(b, now.MessageId, "sent");
        await WaitState(b, shortly.MessageId, "sent");
        var row = await Row(b, later.MessageId);
        Assert.Equal(("pending", 0), (row.State, row.Attempt));
        Assert.Empty(Sink.Requests(later.MessageId));
        Assert.Equal(Micro(hour), await ScheduledAt(b, later.MessageId));
        var delivered = Assert.Single(Sink.Requests(shortly.MessageId));
        var due = await ScheduledAt(b, shortly.MessageId);
        Assert.Equal(Micro(soon), due);
        Assert.True(delivered.TimeUs >= (due - DateTime.UnixEpoch).Ticks / 10,
            $"the row due at {due:O} was delivered at {DateTime.UnixEpoch.AddTicks(delivered.TimeUs * 10):O}");
    }

    // the time the row holds: microseconds, rounded up (never due before the time asked)
    private static DateTime Micro(DateTimeOffset t) => new((t.UtcTicks + 9) / 10 * 10, DateTimeKind.Utc);

    private static async Task<DateTime> ScheduledAt(Backend b, Guid id)
    {
        await using var connection = await b.DataSource.OpenConnectionAsync();
        await using var command = connection.CreateCommand();
        command.CommandText = "SELECT scheduled_at FROM queuebox.outbox WHERE message_id = @m";
        command.WithParameter("@m", id);
        var value = (DateTime)(await command.ExecuteScalarAsync())!;
        return DateTime.SpecifyKind(value, DateTimeKind.Utc); // DATETIME2 holds UTC with no kind
    }

    /// <summary>EF Core: an order and its message in one SaveChanges; a SaveChanges that fails writes neither
    /// and drops the message, which then rides on no later write (after ChangeTracker.Clear()) until enqueued
    /// again; on PostgreSQL the same when the commit the outbox owns fails (a deferred unique check); a pooled
    /// context reset drops its messages; the application's own transaction rolled back writes neither, a failed
    /// SaveChanges in it rolls back to the savepoint; on SQL Server a transaction without savepoints (MARS) is
    /// refused before anything is written; a context without UseQueueBoxOutbox refuses Enqueue.  Rows counted
    /// before and after each.</summary>
    public static async Task EfCoreSaveChanges(Backend b, Action<DbContextOptionsBuilder<OrdersContext>, DbConnection> useProvider)
    {
        await Reset(b);
        var table = OrdersContext.Table;
        await b.Exec(b.Dialect == InboxDialect.SqlServer
            ? $"IF OBJECT_ID(N'{table}') IS NOT NULL DROP TABLE {table}; CREATE TABLE {table} (id NVARCHAR(50) PRIMARY KEY, total INT NOT NULL)"
            : $"DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id text PRIMARY KEY, total int NOT NULL,"
                + " UNIQUE (total) DEFERRABLE INITIALLY DEFERRED)");
        try
        {
            await using var connection = b.DataSource.CreateConnection();
            DbContextOptions<OrdersContext> Options(bool outbox)
            {
                var options = new DbContextOptionsBuilder<OrdersContext>();
                useProvider(options, connection);
                if (outbox)
                {
                    options.UseQueueBoxOutbox();
                }
                return options.Options;
            }
            OrdersContext Context(bool outbox) => new(Options(outbox));
            async Task<(string, string)> Counts() => (await b.Rows($"SELECT count(*) FROM {table}"), await Count(b, "ef"));

            await using (var db = Context(outbox: true))
            {
                db.Orders.Add(new Order { Id = "1001", Total = 250 });
                var m = db.Enqueue(Topic("ef"), new { OrderId = "1001" }, key: "order-1001");
                Assert.Equal(("0", "0"), await Counts());
                await db.SaveChangesAsync();
                Assert.Equal(("1", "1"), await Counts());
                Assert.Empty(db.PendingOutboxMessages());
                Assert.Equal("order-1001", await b.Rows(b.Dialect == InboxDialect.SqlServer
                    ? "SELECT [key] FROM queuebox.outbox WHERE message_id = @m" : "SELECT key FROM queuebox.outbox WHERE message_id = @m",
                    ("@m", m.MessageId)));
            }
            // the order's key exists: SaveChanges fails, writes neither and drops the message
            await using (var db = Context(outbox: true))
            {
                db.Orders.Add(new Order { Id = "1001", Total = 1 });
                db.Enqueue(Topic("ef"), new { OrderId = "dup" });
                await Assert.ThrowsAsync<DbUpdateException>(() => db.SaveChangesAsync());
                Assert.Equal(("1", "1"), await Counts());
                Assert.Empty(db.PendingOutboxMessages());
                // cleared, and an unrelated order saved: the message does not ride on it
                db.ChangeTracker.Clear();
                db.Orders.Add(new Order { Id = "1002", Total = 2 });
                await db.SaveChangesAsync();
                Assert.Equal(("2", "1"), await Counts());
                // the write retried with its message enqueued again: written once
                db.Orders.Add(new Order { Id = "1003", Total = 3 });
                db.Enqueue(Topic("ef"), new { OrderId = "1003" });
                await db.SaveChangesAsync();
                Assert.Equal(("3", "2"), await Counts());
            }
            if (b.Dialect == InboxDialect.PostgreSql)
            {
                // the commit the outbox began fails (the deferred unique total): neither is there, and the message
                // does not ride on the next write
                await using var db = Context(outbox: true);
                db.Orders.Add(new Order { Id = "1004", Total = 250 });
                db.Enqueue(Topic("ef"), new { OrderId = "1004" });
                var e = await Assert.ThrowsAsync<Npgsql.PostgresException>(() => db.SaveChangesAsync());
                Assert.Equal("23505", e.SqlState);
                Assert.Equal(("3", "2"), await Counts());
                Assert.Empty(db.PendingOutboxMessages());
                db.ChangeTracker.Clear();
                db.Orders.Add(new Order { Id = "1004", Total = 4 });
                await db.SaveChangesAsync();
                Assert.Equal(("4", "2"), await Counts());
            }
            else
            {
                await b.Exec($"INSERT INTO {table} (id, total) VALUES ('1004', 4)");
            }
            // a pooled context enqueues and goes back to the pool unsaved: its next user's write carries nothing
            var pool = new Microsoft.EntityFrameworkCore.Infrastructure.PooledDbContextFactory<OrdersContext>(Options(outbox: true), 1);
            var first = pool.CreateDbContext();
            first.Enqueue(Topic("ef"), new { OrderId = "abandoned" });
            await first.DisposeAsync();
            await using (var db = pool.CreateDbContext())
            {
                Assert.Same(first, db);
                Assert.Empty(db.PendingOutboxMessages());
                db.Orders.Add(new Order { Id = "1005", Total = 5 });
                await db.SaveChangesAsync();
                Assert.Equal(("5", "2"), await Counts());
            }
            // the application's transaction: its rollback takes the order and the message
            await using (var db = Context(outbox: true))
            {
                await using var transaction = await db.Database.BeginTransactionAsync();
                db.Orders.Add(new Order { Id = "1006", Total = 6 });
                db.Enqueue(Topic("ef"), new { OrderId = "1006" });
                await db.SaveChangesAsync();
                await transaction.RollbackAsync();
                Assert.Equal(("5", "2"), await Counts());
            }
            // in the application's transaction a failed SaveChanges rolls back to the savepoint and drops the
            // message: saved again with it enqueued again and committed, the message is there once
            await using (var db = Context(outbox: true))
            {
                await using var transaction = await db.Database.BeginTransactionAsync();
                db.Orders.Add(new Order { Id = "1001", Total = 7 });
                db.Enqueue(Topic("ef"), new { OrderId = "1007" });
                await Assert.ThrowsAsync<DbUpdateException>(() => db.SaveChangesAsync());
                Assert.Empty(db.PendingOutboxMessages());
                db.ChangeTracker.Clear();
                db.Orders.Add(new Order { Id = "1007", Total = 7 });
                db.Enqueue(Topic("ef"), new { OrderId = "1007" });
                await db.SaveChangesAsync();
                await transaction.CommitAsync();
                Assert.Equal(("6", "3"), await Counts());
            }
            if (b.Dialect == InboxDialect.SqlServer)
            {
                // MARS: the application's transaction has no savepoints, so SaveChanges refuses before writing
                var mars = new Microsoft.Data.SqlClient.SqlConnectionStringBuilder(Databases.SqlServerConnectionString())
                {
                    MultipleActiveResultSets = true,
                };
                await using var marsConnection = new Microsoft.Data.SqlClient.SqlConnection(mars.ConnectionString);
                await using var db = new OrdersContext(new DbContextOptionsBuilder<OrdersContext>()
                    .UseSqlServer(marsConnection).UseQueueBoxOutbox().Options);
                await using var transaction = await db.Database.BeginTransactionAsync();
                db.Orders.Add(new Order { Id = "1008", Total = 8 });
                db.Enqueue(Topic("ef"), new { OrderId = "1008" });
                var e = await Assert.ThrowsAsync<InvalidOperationException>(() => db.SaveChangesAsync());
                Assert.Contains("no savepoints", e.Message, StringComparison.Ordinal);
                Assert.Contains("MultipleActiveResultSets", e.Message, StringComparison.Ordinal);
                Assert.Empty(db.PendingOutboxMessages());
                await transaction.CommitAsync();
                Assert.Equal(("6", "3"), await Counts());
            }
            await using (var db = Context(outbox: false))
            {
                var e = Assert.Throws<InvalidOperationException>(() => db.Enqueue(Topic("ef"), new { }));
                Assert.Contains("UseQueueBoxOutbox()", e.Message, StringComparison.Ordinal);
            }
        }
        finally
        {
            await b.Exec($"DROP TABLE {table}");
        }
    }
}

public sealed class PostgreSqlOutbox(PostgreSqlFixture fixture) : IClassFixture<PostgreSqlFixture>
{
    [PgFact] public Task O1_CommitAndRollBackTogether() => OutboxScenarios.CommitAndRollBackTogether(fixture.Backend);
    [SinkFact(SqlServer = false)] public Task O2_TraceFromTheCurrentActivity() => OutboxScenarios.TraceFromTheCurrentActivity(fixture.Backend);
    [PgFact] public Task O3_CallersTraceparent() => OutboxScenarios.CallersTraceparent(fixture.Backend);
    [PgFact] public Task O4_Batch() => OutboxScenarios.Batch(fixture.Backend);
    [SinkFact(SqlServer = false)] public Task O5_Delayed() => OutboxScenarios.Delayed(fixture.Backend);

    [PgFact]
    public Task O6_EfCoreSaveChanges() => OutboxScenarios.EfCoreSaveChanges(fixture.Backend,
        (options, connection) => options.UseNpgsql(connection));
}

public sealed class SqlServerOutbox(SqlServerFixture fixture) : IClassFixture<SqlServerFixture>
{
    [MssqlFact] public Task O1_CommitAndRollBackTogether() => OutboxScenarios.CommitAndRollBackTogether(fixture.Backend);
    [SinkFact(SqlServer = true)] public Task O2_TraceFromTheCurrentActivity() => OutboxScenarios.TraceFromTheCurrentActivity(fixture.Backend);
    [MssqlFact] public Task O3_CallersTraceparent() => OutboxScenarios.CallersTraceparent(fixture.Backend);
    [MssqlFact] public Task O4_Batch() => OutboxScenarios.Batch(fixture.Backend);
    [SinkFact(SqlServer = true)] public Task O5_Delayed() => OutboxScenarios.Delayed(fixture.Backend);

    [MssqlFact]
    public Task O6_EfCoreSaveChanges() => OutboxScenarios.EfCoreSaveChanges(fixture.Backend,
        (options, connection) => options.UseSqlServer(connection));
}

/// <summary>A test that needs its database and the sink (QBI_TEST_SINK_LOG) the outbox delivers to: TAP 039 routes
/// dotnet.** there, through the extension's workers and, on SQL Server, a queuebox-mssqld it starts.</summary>
public sealed class SinkFactAttribute : FactAttribute
{
    public bool SqlServer
    {
        get => field;
        set
        {
            field = value;
            Skip = (value ? new MssqlFactAttribute().Skip : new PgFactAttribute().Skip)
                ?? (Sink.Log is null ? "QBI_TEST_SINK_LOG is not set: no sink the outbox delivers to (TAP 039 starts one)" : null);
        }
    }
}
