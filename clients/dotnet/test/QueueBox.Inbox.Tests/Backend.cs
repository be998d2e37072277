// Backend: one database the scenarios run on (PostgreSQL 15 with the
// extension, or SQL Server with queuebox-mssqld's schema): this process's
// own pull source and business table, and the statements the scenarios
// use to look, written once with {tokens} and @named parameters.
using System;
using System.Collections.Generic;
using System.Data.Common;
using System.Globalization;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.Extensions.Logging;
using QueueBox.Inbox;
using Xunit;

namespace QueueBox.Inbox.Tests;

public sealed class Backend
{
    public required DbDataSource DataSource { get; init; }
    public required InboxDialect Dialect { get; init; }
    public string Source { get; } = $"dotnet-{Environment.ProcessId}";
    public string Biz { get; } = $"biz_dotnet_{Environment.ProcessId}";
    public required string Reset { get; init; }
    public required string Expire { get; init; }
    public required string JsonCast { get; init; } // how an insert turns text into the payload column
    public int Lease { get; init; } = 600;
    public TimeSpan Wait { get; init; } = TimeSpan.FromSeconds(20);

    public string Q(string sql) => sql
        .Replace("{inbox}", $"(SELECT * FROM queuebox.inbox WHERE source = '{Source}') i", StringComparison.Ordinal)
        .Replace("{mine}", $"source = '{Source}'", StringComparison.Ordinal)
        .Replace("{source}", $"'{Source}'", StringComparison.Ordinal)
        .Replace("{biz}", Biz, StringComparison.Ordinal);

    private DbCommand Command(DbConnection connection, string sql, (string Name, object? Value)[] parameters)
    {
        var command = connection.CreateCommand();
        command.CommandText = Q(sql);
        foreach (var (name, value) in parameters)
        {
            command.WithParameter(name, value);
        }
        return command;
    }

    public async Task Exec(string sql, params (string, object?)[] parameters)
    {
        await using var connection = await DataSource.OpenConnectionAsync();
        await using var command = Command(connection, sql, parameters);
        await command.ExecuteNonQueryAsync();
    }

    /// <summary>The answer as text: columns joined by ':', rows by ','.</summary>
    public async Task<string> Rows(string sql, params (string, object?)[] parameters)
    {
        await using var connection = await DataSource.OpenConnectionAsync();
        await using var command = Command(connection, sql, parameters);
        await using var reader = await command.ExecuteReaderAsync();
        var rows = new List<string>();
        while (await reader.ReadAsync())
        {
            var fields = new string[reader.FieldCount];
            for (var i = 0; i < fields.Length; i++)
            {
                fields[i] = reader.IsDBNull(i) ? "" : Convert.ToString(reader.GetValue(i), CultureInfo.InvariantCulture)!;
            }
            rows.Add(string.Join(':', fields));
        }
        return string.Join(',', rows);
    }

    public async Task WaitFor(string sql, string want)
    {
        var until = DateTime.UtcNow + Wait;
        var got = "";
        while (DateTime.UtcNow < until)
        {
            if ((got = await Rows(sql)) == want)
            {
                return;
            }
            await Task.Delay(50);
        }
        Assert.Fail($"waited {Wait} for {sql} to be {want}; it is {got} (the rows: "
            + $"{await Rows("SELECT id, idempotency_key, state, attempt FROM {inbox} ORDER BY id")})");
    }

    /// <summary>n pull messages: key jI, payload {"n": I}, and with aggregates above 0 aggregate a(I % aggregates).</summary>
    public async Task AddRows(int n, int aggregates)
    {
        for (var i = 1; i <= n; i++)
        {
            await Exec("INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)"
                + $" VALUES ({{source}}, @key, @agg, {JsonCast}, 'pull')",
                ("@key", $"j{i}"), ("@agg", aggregates > 0 ? $"a{i % aggregates}" : null), ("@payload", $"{{\"n\": {i}}}"));
        }
    }

    /// <summary>Another worker's claim, straight through the claim statement in a transaction: how many
    /// it got. With <paramref name="expireFirst"/> every lease of the source expires first, in the same
    /// transaction, so no renewal can come in between (a TDS engine's first call of the claim in a
    /// session can take longer than a renewal round).</summary>
    public async Task<int> ClaimOther(int n, bool expireFirst = false)
    {
        await using var connection = await DataSource.OpenConnectionAsync();
        await using var transaction = await connection.BeginTransactionAsync();
        if (expireFirst)
        {
            await using var expire = transaction.CreateCommand();
            expire.CommandText = Q(Expire);
            await expire.ExecuteNonQueryAsync();
        }
        await using var command = transaction.CreateCommand();
        command.CommandText = Dialect == InboxDialect.SqlServer
            ? "EXEC queuebox.inbox_claim @source = @s, @batch_size = @n, @lease_ms = 60000"
            : "SELECT id FROM queuebox.inbox_claim(@s, @n, 60000)";
        command.WithParameter("@s", Source).WithParameter("@n", n);
        var got = 0;
        await using (var reader = await command.ExecuteReaderAsync())
        {
            while (await reader.ReadAsync())
            {
                got++;
            }
        }
        await transaction.CommitAsync();
        return got;
    }

    public Started Start(InboxOptions options, InboxHandler handler, ILogger? logger = null)
    {
        options.Source = Source;
        if (options.PollInterval == TimeSpan.FromMilliseconds(500))
        {
            options.PollInterval = TimeSpan.FromMilliseconds(50);
        }
        var worker = new InboxWorker(InboxConnections.From(DataSource), options, logger);
        return new Started(worker, handler);
    }
}

/// <summary>A worker running in the background until Stop.</summary>
public sealed class Started : IAsyncDisposable
{
    private readonly CancellationTokenSource _stop = new();
    private readonly Task _run;

    public Started(InboxWorker worker, InboxHandler handler)
    {
        Worker = worker;
        _run = Task.Run(() => worker.RunAsync(handler, _stop.Token));
    }

    public InboxWorker Worker { get; }

    public async Task<InboxCounters> Stop()
    {
        await _stop.CancelAsync();
        await _run;
        return Worker.Counters;
    }

    public async ValueTask DisposeAsync()
    {
        // a scenario that fails half-way leaves no worker behind
        if (!_run.IsCompleted)
        {
            await Stop();
        }
        _stop.Dispose();
    }
}

public static class Until
{
    public static async Task True(string what, Func<bool> condition, int seconds = 12)
    {
        for (var i = 0; i < seconds * 100 && !condition(); i++)
        {
            await Task.Delay(10);
        }
        Assert.True(condition(), $"waited {seconds} s for {what}");
    }
}
