// A worker process for TAP 039's process scenarios (two workers on one
// source, kill -9 mid-handler) and bench/pull, as clients/go's
// internal/testworker is for TAP 034: it runs QueueBox.Inbox on a source
// until SIGTERM, its handler idempotent as the spec says (the effect keyed
// by source and idempotency key, so a message run twice applies once).
//
//   QueueBox.Inbox.TestWorker NAME LEASE_MS HANDLER_MS [BATCH [SOURCE]]
//
// The database: QBI_TEST_PGHOST, QBI_TEST_PGPORT; QBI_TEST_PGDATABASE and
// QBI_TEST_PGUSER default to postgres.  HANDLER_MS -1: a no-op handler
// (bench/pull measures the library's own cost with it).
using System;
using System.Runtime.InteropServices;
using System.Threading;
using System.Threading.Tasks;
using Npgsql;
using QueueBox.Inbox;

if (args.Length is < 3 or > 5)
{
    await Console.Error.WriteLineAsync("usage: QueueBox.Inbox.TestWorker NAME LEASE_MS HANDLER_MS [BATCH [SOURCE]]");
    return 2;
}
var name = args[0];
var lease = int.Parse(args[1]);
var handlerMs = int.Parse(args[2]);
var batch = args.Length > 3 ? int.Parse(args[3]) : 5;
var source = args.Length > 4 ? args[4] : "jobs";
string Env(string variable, string standard) => Environment.GetEnvironmentVariable(variable) is { Length: > 0 } v ? v : standard;
var connectionString = new NpgsqlConnectionStringBuilder
{
    Host = Env("QBI_TEST_PGHOST", "/tmp"),
    Port = int.Parse(Env("QBI_TEST_PGPORT", "5432")),
    Database = Env("QBI_TEST_PGDATABASE", "postgres"),
    Username = Env("QBI_TEST_PGUSER", "postgres"),
    MaxPoolSize = 4,
}.ConnectionString;
await using var dataSource = NpgsqlDataSource.Create(connectionString);

// no logger: the library's default writes warnings and errors (a claim that failed) to stderr
var worker = new InboxWorker(InboxConnections.From(dataSource), new InboxOptions
{
    Source = source,
    BatchSize = batch,
    LeaseMs = lease,
    PollInterval = TimeSpan.FromMilliseconds(50),
    ShutdownGrace = TimeSpan.FromSeconds(5),
});

using var stopping = new CancellationTokenSource();
using var term = PosixSignalRegistration.Create(PosixSignal.SIGTERM, context =>
{
    context.Cancel = true;
    stopping.Cancel();
});
using var interrupt = PosixSignalRegistration.Create(PosixSignal.SIGINT, context =>
{
    context.Cancel = true;
    stopping.Cancel();
});
Console.WriteLine("ready");
Console.Out.Flush();
await worker.RunAsync(async (message, transaction, cancellationToken) =>
{
    if (handlerMs < 0)
    {
        return;
    }
    // the effect first, then the slow part: a kill in between leaves it uncommitted
    await using var command = transaction.CreateCommand();
    command.CommandText = "INSERT INTO effects (source, idempotency_key, worker) VALUES (@source, @key, @worker)"
        + " ON CONFLICT (source, idempotency_key) DO NOTHING";
    command.WithParameter("@source", message.Source).WithParameter("@key", message.IdempotencyKey).WithParameter("@worker", name);
    await command.ExecuteNonQueryAsync(cancellationToken);
    await Task.Delay(handlerMs, cancellationToken);
}, stopping.Token);
var c = worker.Counters;
Console.WriteLine($"{name}: claimed {c.Claimed} completed {c.Completed} retried {c.Retried} dead {c.Dead} lease_lost {c.LeaseLost}");
return 0;
