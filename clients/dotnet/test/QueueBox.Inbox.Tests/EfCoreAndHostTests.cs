// QueueBox.Inbox.DependencyInjection: an EF Core context made by
// InboxDbContextFactory.CreateOn writes in the handler's transaction (its
// row commits with the completion and disappears with a failing handler),
// and AddQueueBoxInbox runs a worker in the generic host, whose stop drives
// the shutdown grace.
using System;
using System.Data.Common;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.EntityFrameworkCore;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;
using Npgsql;
using QueueBox.Inbox;
using QueueBox.Inbox.DependencyInjection;
using Xunit;

namespace QueueBox.Inbox.Tests;

public sealed class Order
{
    public string Id { get; set; } = "";
    public int Total { get; set; }
}

public sealed class OrdersContext(DbContextOptions<OrdersContext> options) : DbContext(options)
{
    public static readonly string Table = $"ef_orders_{Environment.ProcessId}";

    public DbSet<Order> Orders => Set<Order>();

    protected override void OnModelCreating(ModelBuilder modelBuilder) => modelBuilder.Entity<Order>(e =>
    {
        e.ToTable(Table);
        e.HasKey(o => o.Id);
        e.Property(o => o.Id).HasColumnName("id");
        e.Property(o => o.Total).HasColumnName("total");
    });
}

public static class EfScenario
{
    private static readonly IInboxRetryPolicy Later = new Scenarios.Always(InboxFailureAction.Retry(TimeSpan.FromMinutes(10)));

    /// <summary>Three messages; the handler saves an order through EF on its transaction, and
    /// message two fails after SaveChanges: its order must not exist.</summary>
    public static async Task Run(Backend b, Action<DbContextOptionsBuilder<OrdersContext>, DbConnection> useProvider, string createTable)
    {
        await b.Exec(b.Reset);
        await b.Exec(createTable);
        try
        {
            await b.AddRows(3, 0);
            // the retry waits ten minutes: on a slow server the default backoff (under a
            // second) let j2 be claimed again before Stop, and its state read 'processing'
            await using var w = b.Start(new InboxOptions { RetryPolicy = Later }, async (m, tx, ct) =>
            {
                await using var db = InboxDbContextFactory.CreateOn(tx, useProvider);
                db.Orders.Add(new Order { Id = m.IdempotencyKey, Total = Scenarios.PayloadN(m) * 10 });
                await db.SaveChangesAsync(ct);
                if (m.IdempotencyKey == "j2")
                {
                    throw new InvalidOperationException("after SaveChanges");
                }
            });
            await b.WaitFor("SELECT count(*) FROM {inbox} WHERE state = 'processed' OR attempt > 0", "3");
            var c = await w.Stop();
            Assert.Equal((2L, 1L), (c.Completed, c.Retried));
            Assert.Equal("j1:10,j3:30", await b.Rows($"SELECT id, total FROM {OrdersContext.Table} ORDER BY id"));
            Assert.Equal("processed,pending,processed", await b.Rows("SELECT state FROM {inbox} ORDER BY id"));
        }
        finally
        {
            await b.Exec($"DROP TABLE {OrdersContext.Table}");
        }
    }
}

public sealed class EfCoreTests(PostgreSqlFixture pg, SqlServerFixture ms) : IClassFixture<PostgreSqlFixture>, IClassFixture<SqlServerFixture>
{
    [PgFact]
    public Task PostgreSqlContextCommitsWithTheCompletion() => EfScenario.Run(pg.Backend,
        (options, connection) => options.UseNpgsql(connection),
        $"CREATE TABLE {OrdersContext.Table} (id text PRIMARY KEY, total int NOT NULL)");

    [MssqlFact]
    public Task SqlServerContextCommitsWithTheCompletion() => EfScenario.Run(ms.Backend,
        (options, connection) => options.UseSqlServer(connection),
        $"CREATE TABLE {OrdersContext.Table} (id NVARCHAR(100) PRIMARY KEY, total INT NOT NULL)");
}

/// <summary>The handler the host resolves per message: the business write.</summary>
public sealed class BizHandler(Backend backend) : IInboxHandler
{
    public Task HandleAsync(InboxMessage message, DbTransaction transaction, CancellationToken cancellationToken) =>
        Scenarios.WriteBiz(backend, transaction, message, cancellationToken);
}

public sealed class HostTests(PostgreSqlFixture pg) : IClassFixture<PostgreSqlFixture>
{
    private IHost Host(Action<IServiceCollection> add)
    {
        var builder = Microsoft.Extensions.Hosting.Host.CreateApplicationBuilder();
        builder.Logging.ClearProviders();
        builder.Services.AddSingleton(pg.Backend);
        builder.Services.AddSingleton((NpgsqlDataSource)pg.Backend.DataSource);
        add(builder.Services);
        return builder.Build();
    }

    /// <summary>A host whose worker takes one message a claim, with the grace and the handler given.</summary>
    private IHost GraceHost(TimeSpan grace, InboxHandler handler) => Host(services => services.AddQueueBoxInbox(
        sp => InboxConnections.From(sp.GetRequiredService<NpgsqlDataSource>()),
        o =>
        {
            o.Source = pg.Backend.Source;
            o.BatchSize = 1;
            o.PollInterval = TimeSpan.FromMilliseconds(50);
            o.ShutdownGrace = grace;
        },
        sp => handler));

    [PgFact]
    public async Task AddQueueBoxInboxHandlesMessages()
    {
        var b = pg.Backend;
        await b.Exec(b.Reset);
        await b.AddRows(3, 0);
        using var host = Host(services => services.AddQueueBoxInbox<BizHandler>(
            sp => InboxConnections.From(sp.GetRequiredService<NpgsqlDataSource>()),
            o =>
            {
                o.Source = b.Source;
                o.PollInterval = TimeSpan.FromMilliseconds(50);
            }));
        await host.StartAsync();
        await b.WaitFor("SELECT count(*) FROM {inbox} WHERE state = 'processed'", "3");
        await host.StopAsync();
        Assert.Equal("1,2,3", await b.Rows("SELECT n FROM {biz} ORDER BY n"));
        var service = Assert.IsType<InboxHostedService>(Assert.Single(host.Services.GetServices<IHostedService>(),
            s => s is InboxHostedService));
        Assert.Equal(3L, service.Worker.Counters.Completed);
    }

    [PgFact]
    public async Task TheHostsStopDrivesTheGrace()
    {
        var b = pg.Backend;
        // inside the grace: the running handler completes, nothing more is claimed
        await b.Exec(b.Reset);
        await b.AddRows(2, 0);
        var begun = 0;
        using (var host = GraceHost(TimeSpan.FromSeconds(5), async (m, tx, ct) =>
            {
                Volatile.Write(ref begun, 1);
                await Task.Delay(500, CancellationToken.None);
                await Scenarios.WriteBiz(b, tx, m, ct);
            }))
        {
            await host.StartAsync();
            await Until.True("the handler", () => Volatile.Read(ref begun) == 1);
            await host.StopAsync();
        }
        Assert.Equal("processed,pending", await b.Rows("SELECT state FROM {inbox} ORDER BY id"));
        Assert.Equal("1", await b.Rows("SELECT count(*) FROM {biz}"));

        // past the grace: cancelled, nothing completed, no attempt spent
        await b.Exec(b.Reset);
        await b.AddRows(1, 0);
        begun = 0;
        using (var host = GraceHost(TimeSpan.FromMilliseconds(300), async (m, tx, ct) =>
            {
                await Scenarios.WriteBiz(b, tx, m, ct);
                Volatile.Write(ref begun, 1);
                await Task.Delay(Timeout.Infinite, ct);
            }))
        {
            await host.StartAsync();
            await Until.True("the handler", () => Volatile.Read(ref begun) == 1);
            var clock = Stopwatch.StartNew();
            await host.StopAsync();
            Assert.True(clock.Elapsed >= TimeSpan.FromMilliseconds(290), $"the host stopped in {clock.Elapsed}; the grace is 300 ms");
        }
        Assert.Equal("0", await b.Rows("SELECT count(*) FROM {biz}"));
        Assert.Equal("processing:0", await b.Rows("SELECT state, attempt FROM {inbox}"));
    }
}
