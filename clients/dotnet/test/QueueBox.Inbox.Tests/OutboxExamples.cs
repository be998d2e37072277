// The C# examples of clients/dotnet/README.md's "Enqueue into the outbox",
// as they are written there (TAP 039 checks that each csharp block of that
// section is in this file, character for character), run on PostgreSQL
// and, when QUEUEBOX_TEST_MSSQL_URL is set, on SQL Server (the EF Core one,
// written with UseNpgsql, on PostgreSQL; OutboxTests runs EF Core on both).
using System;
using System.Data.Common;
using System.Threading.Tasks;
using Microsoft.Data.SqlClient;
using Microsoft.EntityFrameworkCore;
using Npgsql;
using QueueBox.Inbox;
using QueueBox.Inbox.DependencyInjection;
using Xunit;

namespace QueueBox.Inbox.Tests;

public sealed class ShopOrder
{
    public int Id { get; set; }
    public string Status { get; set; } = "";
    public int Total { get; set; }
}

public sealed class ShopContext(DbContextOptions<ShopContext> options) : DbContext(options)
{
    public DbSet<ShopOrder> Orders => Set<ShopOrder>();

    protected override void OnModelCreating(ModelBuilder modelBuilder) => modelBuilder.Entity<ShopOrder>(e =>
    {
        e.ToTable("shop_orders");
        e.Property(o => o.Id).HasColumnName("id").ValueGeneratedNever();
        e.Property(o => o.Status).HasColumnName("status");
        e.Property(o => o.Total).HasColumnName("total");
    });
}

public sealed class OutboxExamples
{
    // the examples' rows: those after the last row before them (a DELETE of rows the relay is claiming can
    // deadlock with it, so none is deleted)
    private const string Topics = "topic IN ('orders.paid', 'invoices.issued', 'orders.review-reminder') AND id > @since";

    private static async Task<long> Since(Backend b) =>
        long.Parse(await b.Rows("SELECT COALESCE(MAX(id), 0) FROM queuebox.outbox"), System.Globalization.CultureInfo.InvariantCulture);

    /// <summary>The README's transaction example, then its batch, on the data source given.</summary>
    private static async Task RunTheExamples(DbDataSource dataSource)
    {
        {
            // ---- the README's example, as written
await using var connection = await dataSource.OpenConnectionAsync();
await using var transaction = await connection.BeginTransactionAsync();

await using (var command = transaction.CreateCommand())
{
    command.CommandText = "UPDATE shop_orders SET status = 'paid' WHERE id = @id";
    command.WithParameter("@id", 42);
    await command.ExecuteNonQueryAsync();
}
await transaction.EnqueueAsync("orders.paid", new { OrderId = 42, Total = 250 }, key: "order-42");

await transaction.CommitAsync();
            // ---- end of the example
        }
        {
            await using var connection = await dataSource.OpenConnectionAsync();
            await using var transaction = await connection.BeginTransactionAsync();
            // ---- the README's batch, as written
var reminder = DateTimeOffset.UtcNow.AddDays(3);
await transaction.EnqueueBatchAsync([
    OutboxMessage.Create("orders.paid", new { OrderId = 43 }, key: "order-43"),
    OutboxMessage.Create("invoices.issued", new { OrderId = 43, Invoice = "INV-43" }, key: "order-43"),
    OutboxMessage.Create("orders.review-reminder", new { OrderId = 43 }, notBefore: reminder),
]);
            // ---- end of the example
            await transaction.CommitAsync();
        }
    }

    private static async Task Check(Backend b, bool sqlServer)
    {
        var drop = sqlServer ? "IF OBJECT_ID(N'shop_orders') IS NOT NULL DROP TABLE shop_orders" : "DROP TABLE IF EXISTS shop_orders";
        await b.Exec(drop);
        var since = await Since(b);
        await b.Exec("CREATE TABLE shop_orders (id INT PRIMARY KEY, status VARCHAR(20) NOT NULL, total INT NOT NULL)");
        await b.Exec("INSERT INTO shop_orders VALUES (42, 'new', 250)");
        try
        {
            await RunTheExamples(b.DataSource);
            Assert.Equal("paid", await b.Rows("SELECT status FROM shop_orders"));
            Assert.Equal("orders.paid:order-42,orders.paid:order-43,invoices.issued:order-43,orders.review-reminder:",
                await b.Rows((sqlServer ? "SELECT topic, [key]" : "SELECT topic, key") + " FROM queuebox.outbox WHERE " + Topics + " ORDER BY id",
                    ("@since", since)));
            // the reminder waits three days (no route matches these topics here: the rows go dead at their claim)
            Assert.Equal("1", await b.Rows("SELECT count(*) FROM queuebox.outbox WHERE id > @since AND topic = 'orders.review-reminder' AND "
                + (sqlServer ? "scheduled_at > DATEADD(day, 2, created_at)" : "scheduled_at > created_at + interval '2 days'"), ("@since", since)));
        }
        finally
        {
            await b.Exec(drop);
        }
    }

    [PgFact]
    public async Task TheTransactionExamplesRunOnPostgreSql()
    {
        await using var dataSource = NpgsqlDataSource.Create(Databases.PostgreSqlConnectionString()!);
        await Check(new Backend { DataSource = dataSource, Dialect = InboxDialect.PostgreSql, Reset = "", Expire = "", JsonCast = "" }, sqlServer: false);
    }

    [MssqlFact]
    public async Task TheTransactionExamplesRunOnSqlServer()
    {
        await using var dataSource = SqlClientFactory.Instance.CreateDataSource(Databases.SqlServerConnectionString()!);
        await Check(new Backend { DataSource = dataSource, Dialect = InboxDialect.SqlServer, Reset = "", Expire = "", JsonCast = "" }, sqlServer: true);
    }

    [PgFact]
    public async Task TheEfCoreExampleRunsOnPostgreSql()
    {
        var connectionString = Databases.PostgreSqlConnectionString()!;
        await using var dataSource = NpgsqlDataSource.Create(connectionString);
        var b = new Backend { DataSource = dataSource, Dialect = InboxDialect.PostgreSql, Reset = "", Expire = "", JsonCast = "" };
        await b.Exec("DROP TABLE IF EXISTS shop_orders");
        var since = await Since(b);
        await b.Exec("CREATE TABLE shop_orders (id int PRIMARY KEY, status text NOT NULL, total int NOT NULL)");
        await b.Exec("INSERT INTO shop_orders VALUES (42, 'new', 250)");
        try
        {
            // ---- the README's EF Core example, as written
var options = new DbContextOptionsBuilder<ShopContext>()
    .UseNpgsql(connectionString)
    .UseQueueBoxOutbox()
    .Options;

await using var db = new ShopContext(options);
var order = await db.Orders.FindAsync(42) ?? throw new InvalidOperationException("no order 42");
order.Status = "paid";
db.Enqueue("orders.paid", new { OrderId = order.Id, order.Total }, key: $"order-{order.Id}");
await db.SaveChangesAsync();
            // ---- end of the example
            Assert.Equal("paid", await b.Rows("SELECT status FROM shop_orders"));
            Assert.Equal("order-42:42:250", await b.Rows(
                "SELECT key, payload->>'orderId', payload->>'total' FROM queuebox.outbox WHERE " + Topics, ("@since", since)));
        }
        finally
        {
            await b.Exec("DROP TABLE shop_orders");
        }
    }
}
