// Without a database: the default policy's backoff, the options' checks,
// the dialect from the data source's type, the command helpers, Msg 51000's
// classification, the meter's names.
using System;
using System.Collections.Generic;
using System.Data.Common;
using System.Diagnostics.Metrics;
using System.Linq;
using System.Threading;
using Microsoft.Data.SqlClient;
using Microsoft.Extensions.Logging;
using Npgsql;
using QueueBox.Inbox;
using Xunit;

namespace QueueBox.Inbox.Tests;

public sealed class UnitTests
{
    [Fact]
    public void DefaultPolicyBackoff()
    {
        // 1 s × 2^attempt, ±20 %
        for (var attempt = 0; attempt < 4; attempt++)
        {
            var basis = TimeSpan.FromSeconds(Math.Pow(2, attempt));
            Assert.Equal(basis * 0.8, InboxRetryPolicy.Backoff(attempt, 0).Delay);
            Assert.Equal(basis * 1.2, InboxRetryPolicy.Backoff(attempt, 1).Delay);
            Assert.False(InboxRetryPolicy.Backoff(attempt, 0.5).IsDeadLetter);
        }
        // dead on the fifth attempt
        Assert.True(InboxRetryPolicy.Backoff(4, 0.5).IsDeadLetter);
        Assert.True(InboxRetryPolicy.Backoff(9, 0.5).IsDeadLetter);
        Assert.Equal(InboxFailureAction.Retry(TimeSpan.Zero), InboxFailureAction.Retry(TimeSpan.FromSeconds(-1)));
    }

    [Theory]
    [InlineData("Source", "InboxOptions.Source (the pull source to consume) is required")]
    [InlineData("BatchSize", "InboxOptions.BatchSize must be from 1 to 10000 (default 10), got 0")]
    [InlineData("LeaseMs", "InboxOptions.LeaseMs must be from 100 to 86400000 (default 30000), got 99")]
    [InlineData("MaxConcurrency", "InboxOptions.MaxConcurrency must be from 1 to 256 (default 1), got 257")]
    [InlineData("CommandTimeout", "InboxOptions.CommandTimeout is 00:00:15, the command timeout of the worker's own statements; it must be at least 30 s")]
    public void BadOptionsAreRefused(string option, string says)
    {
        var options = new InboxOptions { Source = "orders" };
        switch (option)
        {
            case "Source": options.Source = ""; break;
            case "BatchSize": options.BatchSize = 0; break;
            case "LeaseMs": options.LeaseMs = 99; break;
            case "MaxConcurrency": options.MaxConcurrency = 257; break;
            case "CommandTimeout": options.CommandTimeout = TimeSpan.FromSeconds(15); break;
        }
        using var dataSource = NpgsqlDataSource.Create("Host=localhost");
        var e = Assert.Throws<ArgumentException>(() => new InboxWorker(InboxConnections.From(dataSource), options));
        Assert.StartsWith(says, e.Message, StringComparison.Ordinal);
        Assert.Equal(option, e.ParamName);
    }

    [Fact]
    public void SqlServerCommandTimeoutSaysWhatToSet()
    {
        var e = Assert.Throws<ArgumentException>(() => new InboxWorker(InboxConnections.FromSqlServer("Server=localhost"),
            new InboxOptions { Source = "orders", CommandTimeout = TimeSpan.FromSeconds(29) }));
        Assert.Contains("Set InboxOptions.CommandTimeout to 30 s or more", e.Message, StringComparison.Ordinal);
    }

    [Fact]
    public void DialectFromTheDataSource()
    {
        using var pg = NpgsqlDataSource.Create("Host=localhost");
        Assert.Equal(InboxDialect.PostgreSql, InboxConnections.From(pg).Dialect);
        using var ms = SqlClientFactory.Instance.CreateDataSource("Server=localhost");
        Assert.Equal(InboxDialect.SqlServer, InboxConnections.From(ms).Dialect);
        Assert.Equal(InboxDialect.SqlServer,
            new InboxWorker(InboxConnections.From(ms), new InboxOptions { Source = "orders" }).Dialect);
        // set by the option, whatever the data source
        Assert.Equal(InboxDialect.SqlServer,
            new InboxWorker(InboxConnections.From(pg), new InboxOptions { Source = "o", Dialect = InboxDialect.SqlServer }).Dialect);
    }

    [Fact]
    public void CommandHelpers()
    {
        using var connection = new SqlConnection("Server=localhost");
        using var command = connection.CreateCommand();
        Assert.Same(command, command.WithParameter("@id", "o-1").WithParameter("@total", null));
        Assert.Equal("@id", command.Parameters[0].ParameterName);
        Assert.Equal("o-1", command.Parameters[0].Value);
        Assert.Equal(DBNull.Value, command.Parameters[1].Value);
    }

    [Fact]
    public void HeadersAndPayload()
    {
        var headers = InboxMessage.ParseHeaders("{\"a\": \"x\", \"n\": 1, \"o\": {\"k\": true}}");
        Assert.Equal("x", headers["a"]);
        Assert.Equal("1", headers["n"]);
        Assert.Equal("{\"k\": true}", headers["o"]);
        Assert.Empty(InboxMessage.ParseHeaders(null));
        Assert.Equal("o-1", InboxMessage.ParsePayload("{\"id\": \"o-1\"}").GetProperty("id").GetString());
    }

    [Fact]
    public void OutboxTracestateGoesWithItsTraceparent()
    {
        using var span = new System.Diagnostics.Activity("place order")
            .SetIdFormat(System.Diagnostics.ActivityIdFormat.W3C).Start();
        span.TraceStateString = "congo=t61rcWkgMzE";
        var spans = $"00-{span.TraceId.ToHexString()}-{span.SpanId.ToHexString()}-00";
        // no traceparent of the caller: the caller's tracestate (any letter case) goes, the span's pair comes
        foreach (var name in new[] { "tracestate", "TraceState", "TRACESTATE" })
        {
            var headers = OutboxTraceContext.Headers(new Dictionary<string, string> { [name] = "rojo=00f067aa0ba902b7", ["x"] = "1" },
                span);
            Assert.Equal(new Dictionary<string, string> { ["traceparent"] = spans, ["tracestate"] = "congo=t61rcWkgMzE", ["x"] = "1" },
                headers);
        }
        // no activity either: no tracestate at all
        Assert.Equal(new Dictionary<string, string> { ["x"] = "1" },
            OutboxTraceContext.Headers(new Dictionary<string, string> { ["TraceState"] = "rojo=1", ["x"] = "1" }, null));
        // the span has no tracestate: none is stored, not the caller's
        span.TraceStateString = null;
        Assert.Equal(new Dictionary<string, string> { ["traceparent"] = spans },
            OutboxTraceContext.Headers(new Dictionary<string, string> { ["tracestate"] = "rojo=1" }, span));
        // the caller's traceparent keeps the caller's tracestate, and the span adds nothing
        const string mine = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        span.TraceStateString = "congo=t61rcWkgMzE";
        Assert.Equal(new Dictionary<string, string> { ["TraceParent"] = mine, ["TraceState"] = "rojo=1" },
            OutboxTraceContext.Headers(new Dictionary<string, string> { ["TraceParent"] = mine, ["TraceState"] = "rojo=1" }, span));
    }

    [Fact]
    public void Msg51000ByItsWords()
    {
        Assert.True(InboxStatements.IsClaimLockTimeout(new InvalidOperationException("x",
            new InvalidOperationException("queuebox.inbox_claim: another claim of this source held its lock for 10 s"))));
        Assert.False(InboxStatements.IsClaimLockTimeout(new InvalidOperationException("deadlock")));
    }

    [Fact]
    public void TheMeterAndItsInstruments()
    {
        var names = new List<string>();
        using var listener = new MeterListener();
        listener.InstrumentPublished = (instrument, l) =>
        {
            if (instrument.Meter.Name == InboxTelemetry.Name)
            {
                lock (names)
                {
                    names.Add(instrument.Name);
                }
            }
        };
        listener.Start();
        // the instruments exist once a worker counted through them
        new InboxTelemetry.Counts("unit").Claimed(0);
        Assert.Equal(new[] { "queuebox.inbox.claimed", "queuebox.inbox.completed", "queuebox.inbox.dead", "queuebox.inbox.lease_lost", "queuebox.inbox.retried" },
            names.Distinct().OrderBy(n => n, StringComparer.Ordinal));
    }
}

/// <summary>A logger that keeps what it was told, as "Level: message".</summary>
public sealed class ListLogger : ILogger
{
    private readonly List<string> _lines = [];

    public IDisposable? BeginScope<TState>(TState state) where TState : notnull => null;

    public bool IsEnabled(LogLevel logLevel) => true;

    public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
    {
        lock (_lines)
        {
            _lines.Add($"{logLevel}: {formatter(state, exception)}");
        }
    }

    public bool Contains(string start)
    {
        lock (_lines)
        {
            return _lines.Any(l => l.StartsWith(start, StringComparison.Ordinal));
        }
    }

    public override string ToString()
    {
        lock (_lines)
        {
            return string.Join('\n', _lines);
        }
    }
}
