// A failing handler is seen without configuring anything: a worker made
// without a logger writes the failure, with its exception, to standard
// error (NullLogger.Instance silences it), and AddQueueBoxInbox's worker
// logs to the host's logger instead.  Standard error is captured per test
// (the tests of this assembly run one at a time).
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading.Tasks;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Logging.Abstractions;
using Npgsql;
using QueueBox.Inbox;
using QueueBox.Inbox.DependencyInjection;
using Xunit;

namespace QueueBox.Inbox.Tests;

public sealed class LoggingTests(PostgreSqlFixture pg) : IClassFixture<PostgreSqlFixture>
{
    private const string Boom = "the handler failed on purpose";

    // one retry, recorded, then no other attempt while the test looks
    private static readonly IInboxRetryPolicy Later = new Scenarios.Always(InboxFailureAction.Retry(TimeSpan.FromMinutes(10)));

    private static Task Fail(InboxMessage message, System.Data.Common.DbTransaction transaction, System.Threading.CancellationToken cancellationToken) =>
        throw new InvalidOperationException(Boom);

    /// <summary>What <paramref name="work"/> wrote to standard error.</summary>
    private static async Task<string> StandardError(Func<Task> work)
    {
        var before = Console.Error;
        using var captured = new StringWriter();
        Console.SetError(TextWriter.Synchronized(captured));
        try
        {
            await work();
        }
        finally
        {
            Console.SetError(before);
        }
        return captured.ToString();
    }

    [PgFact]
    public async Task WithoutALoggerAFailureGoesToStandardError()
    {
        var b = pg.Backend;
        await b.Exec(b.Reset);
        await b.AddRows(1, 0);
        var written = await StandardError(async () =>
        {
            await using var w = b.Start(new InboxOptions { RetryPolicy = Later }, Fail);
            await b.WaitFor("SELECT attempt FROM {inbox}", "1");
            await w.Stop();
        });
        Assert.Contains($"warn: QueueBox.Inbox.{b.Source}: message ", written, StringComparison.Ordinal);
        Assert.Contains($"failed ({Boom}); retried after 00:10:00", written, StringComparison.Ordinal);
        // the exception with its stack: where the handler threw
        Assert.Contains($"System.InvalidOperationException: {Boom}", written, StringComparison.Ordinal);
        Assert.Contains($"at {typeof(LoggingTests).FullName}.{nameof(Fail)}", written, StringComparison.Ordinal);

        // NullLogger.Instance: nothing at all
        await b.Exec(b.Reset);
        await b.AddRows(1, 0);
        written = await StandardError(async () =>
        {
            await using var w = b.Start(new InboxOptions { RetryPolicy = Later }, Fail, NullLogger.Instance);
            await b.WaitFor("SELECT attempt FROM {inbox}", "1");
            await w.Stop();
        });
        Assert.Equal("", written);
    }

    [PgFact]
    public async Task TheHostsLoggerGetsTheFailures()
    {
        var b = pg.Backend;
        await b.Exec(b.Reset);
        await b.AddRows(1, 0);
        var logged = new ListLoggerProvider();
        var written = await StandardError(async () =>
        {
            var builder = Host.CreateApplicationBuilder();
            builder.Logging.ClearProviders();
            builder.Logging.AddProvider(logged);
            builder.Services.AddSingleton((NpgsqlDataSource)b.DataSource);
            builder.Services.AddQueueBoxInbox(
                sp => InboxConnections.From(sp.GetRequiredService<NpgsqlDataSource>()),
                o =>
                {
                    o.Source = b.Source;
                    o.PollInterval = TimeSpan.FromMilliseconds(50);
                    o.RetryPolicy = Later;
                },
                sp => Fail);
            using var host = builder.Build();
            await host.StartAsync();
            await b.WaitFor("SELECT attempt FROM {inbox}", "1");
            await host.StopAsync();
        });
        var failure = Assert.Single(logged.Entries, e => e.Exception?.Message == Boom);
        Assert.Equal(($"QueueBox.Inbox.{b.Source}", LogLevel.Warning), (failure.Category, failure.Level));
        Assert.EndsWith($"failed ({Boom}); retried after 00:10:00", failure.Message, StringComparison.Ordinal);
        // the host's logger instead of the default, not as well
        Assert.Equal("", written);
    }
}

/// <summary>A logger provider that keeps every entry of every category.</summary>
public sealed class ListLoggerProvider : ILoggerProvider
{
    public sealed record Entry(string Category, LogLevel Level, string Message, Exception? Exception);

    private readonly List<Entry> _entries = [];

    public IReadOnlyList<Entry> Entries
    {
        get
        {
            lock (_entries)
            {
                return _entries.ToList();
            }
        }
    }

    public ILogger CreateLogger(string categoryName) => new Logger(this, categoryName);

    public void Dispose()
    {
    }

    private sealed class Logger(ListLoggerProvider provider, string category) : ILogger
    {
        public IDisposable? BeginScope<TState>(TState state) where TState : notnull => null;

        public bool IsEnabled(LogLevel logLevel) => true;

        public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
        {
            lock (provider._entries)
            {
                provider._entries.Add(new Entry(category, logLevel, formatter(state, exception), exception));
            }
        }
    }
}
