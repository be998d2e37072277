// The scenarios 1 to 7 of clients/SCENARIOS.md on one backend (the
// PostgreSQL and SQL Server classes run them); each counts rows before and
// after.  8 and 9 need worker processes: TAP 039 runs them with
// QueueBox.Inbox.TestWorker.
using System;
using System.Collections.Generic;
using System.Data.Common;
using System.Diagnostics;
using System.Text.Json;
using System.Text.Json.Serialization;
using System.Threading;
using System.Threading.Tasks;
using QueueBox.Inbox;
using Xunit;

namespace QueueBox.Inbox.Tests;

public static class Scenarios
{
    public sealed record Numbered([property: JsonPropertyName("n")] int N);

    public static int PayloadN(InboxMessage message) => message.Payload.GetProperty("n").GetInt32();

    /// <summary>The business write of a handler, through its transaction.</summary>
    public static async Task WriteBiz(Backend b, DbTransaction transaction, InboxMessage message, CancellationToken cancellationToken)
    {
        await using var command = transaction.CreateCommand();
        command.CommandText = b.Q("INSERT INTO {biz} (msg, n) VALUES (@msg, @n)");
        command.WithParameter("@msg", message.Id).WithParameter("@n", PayloadN(message));
        await command.ExecuteNonQueryAsync(cancellationToken);
    }

    internal sealed class Always(InboxFailureAction action) : IInboxRetryPolicy
    {
        public InboxFailureAction Decide(InboxMessage message, Exception failure) => action;
    }

    // 1. the business write and the completion commit together; a failing handler leaves neither
    public static async Task CommitTogether(Backend b)
    {
        await b.AddRows(3, 0);
        await using var w = b.Start(new InboxOptions { RetryPolicy = new Always(InboxFailureAction.Retry(TimeSpan.FromMinutes(10))) },
            async (m, tx, ct) =>
            {
                await WriteBiz(b, tx, m, ct);
                if (PayloadN(m) == 2)
                {
                    throw new InvalidOperationException("message two always fails");
                }
            });
        await b.WaitFor("SELECT count(*) FROM {inbox} WHERE state = 'processed' OR attempt > 0", "3");
        var c = await w.Stop();
        Assert.Equal("1,3", await b.Rows("SELECT n FROM {biz} ORDER BY n"));
        Assert.Equal("processed:0,pending:1,processed:0", await b.Rows("SELECT state, attempt FROM {inbox} ORDER BY id"));
        Assert.Equal("message two always fails", await b.Rows("SELECT last_error FROM {inbox} WHERE idempotency_key = 'j2'"));
        Assert.Equal((3L, 2L, 1L), (c.Claimed, c.Completed, c.Retried));
    }

    // 2. a handler slower than three leases keeps its message
    public static async Task SlowHandlerKeeps(Backend b)
    {
        await b.AddRows(1, 0);
        var lease = TimeSpan.FromMilliseconds(b.Lease);
        var begun = 0;
        await using var w = b.Start(new InboxOptions { LeaseMs = b.Lease, BatchSize = 1 }, async (m, tx, ct) =>
        {
            Volatile.Write(ref begun, 1);
            await Task.Delay(lease * 10 / 3, ct);
            await WriteBiz(b, tx, m, ct);
        });
        await Until.True("the handler", () => Volatile.Read(ref begun) == 1);
        await Task.Delay(lease * 13 / 6);
        Assert.Equal(0, await b.ClaimOther(5)); // another claimer past two leases gets nothing
        await b.WaitFor("SELECT state FROM {inbox}", "processed");
        var c = await w.Stop();
        Assert.Equal((0L, 1L), (c.LeaseLost, c.Completed));
        Assert.Equal("1", await b.Rows("SELECT count(*) FROM {biz}"));
    }

    // 3. a lost lease cancels the handler and rolls its writes back
    public static async Task LostLease(Backend b)
    {
        await b.AddRows(1, 0);
        var begun = 0;
        var sawCancel = 0;
        await using var w = b.Start(new InboxOptions { LeaseMs = b.Lease, BatchSize = 1 }, async (m, tx, ct) =>
        {
            await WriteBiz(b, tx, m, ct);
            Volatile.Write(ref begun, 1);
            try
            {
                await Task.Delay(TimeSpan.FromMinutes(1), ct);
            }
            catch (OperationCanceledException)
            {
                Volatile.Write(ref sawCancel, 1);
                throw;
            }
            throw new InvalidOperationException("never cancelled");
        });
        await Until.True("the handler", () => Volatile.Read(ref begun) == 1);
        // the lease expired behind the worker's back, and another claimer took the message
        Assert.Equal(1, await b.ClaimOther(1, expireFirst: true));
        await Until.True("the lease to be seen lost", () => w.Worker.Counters.LeaseLost > 0);
        var c = await w.Stop();
        Assert.Equal(1, Volatile.Read(ref sawCancel));
        await SameLostLease(b, c);
    }

    /// <summary>A run that lost its lease counted it, completed nothing, wrote nothing, and left the
    /// row to the claimer that took it over.</summary>
    private static async Task SameLostLease(Backend b, InboxCounters c)
    {
        Assert.Equal((1L, 0L, 0L), (c.LeaseLost, c.Completed, c.Retried + c.Dead));
        Assert.Equal("0", await b.Rows("SELECT count(*) FROM {biz}"));
        Assert.Equal("processing:0", await b.Rows("SELECT state, attempt FROM {inbox}"));
    }

    // 3b. the lease lost where no renewal saw it: the completion changes no row, all is rolled back
    public static async Task LostAtCompletion(Backend b)
    {
        await b.AddRows(1, 0);
        var got = -1;
        await using var w = b.Start(new InboxOptions { LeaseMs = 60_000, BatchSize = 1 }, async (m, tx, ct) =>
        {
            await WriteBiz(b, tx, m, ct);
            got = await b.ClaimOther(1, expireFirst: true);
        });
        await Until.True("the completion to be seen lost", () => w.Worker.Counters.LeaseLost > 0);
        var c = await w.Stop();
        Assert.Equal(1, got);
        await SameLostLease(b, c);
    }

    private sealed class ParseErrorsDie : IInboxRetryPolicy
    {
        public InboxFailureAction Decide(InboxMessage message, Exception failure) =>
            failure is JsonException ? InboxFailureAction.DeadLetter() : InboxFailureAction.Retry(TimeSpan.Zero);
    }

    // 4. retry then success; a custom policy sends a parse error straight to dead
    public static async Task RetryAndPolicy(Backend b)
    {
        await b.AddRows(2, 0);
        await b.Exec($"UPDATE queuebox.inbox SET payload = {b.JsonCast} WHERE {{mine}} AND idempotency_key = 'j2'",
            ("@payload", "{\"n\": \"two\"}"));
        await using var w = b.Start(new InboxOptions { RetryPolicy = new ParseErrorsDie() }, async (m, tx, ct) =>
        {
            var order = m.Payload.Deserialize<Numbered>();
            if (m.Attempt == 0)
            {
                throw new InvalidOperationException("temporary");
            }
            await WriteBiz(b, tx, m, ct);
            Assert.NotNull(order);
        });
        await b.WaitFor("SELECT state FROM {inbox} ORDER BY id", "processed,dead");
        var c = await w.Stop();
        Assert.Equal("1", await b.Rows("SELECT attempt FROM {inbox} WHERE idempotency_key = 'j1'"));
        var dead = await b.Rows("SELECT idempotency_key, last_error FROM {inbox} WHERE state = 'dead'");
        Assert.StartsWith("j2:The JSON value could not be converted", dead, StringComparison.Ordinal);
        Assert.Contains("Path: $.n", dead, StringComparison.Ordinal);
        Assert.Equal((1L, 1L, 1L), (c.Retried, c.Dead, c.Completed));
    }

    // 5. the default policy: dead on the fifth attempt (the backoff: UnitTests.DefaultPolicyBackoff)
    public static async Task DefaultPolicy(Backend b)
    {
        await b.AddRows(1, 0);
        await b.Exec("UPDATE queuebox.inbox SET attempt = 4 WHERE {mine}");
        await using var w = b.Start(new InboxOptions(), (m, tx, ct) => throw new InvalidOperationException("down"));
        await b.WaitFor("SELECT state FROM {inbox}", "dead");
        Assert.Equal(1L, (await w.Stop()).Dead);
        Assert.Equal("down", await b.Rows("SELECT last_error FROM {inbox}"));
    }

    // 6. shutdown: a running handler keeps the grace; past it nothing is completed, no attempt spent
    public static async Task ShutdownGrace(Backend b)
    {
        await b.AddRows(2, 0);
        var begun = 0;
        var w = b.Start(new InboxOptions { BatchSize = 1, ShutdownGrace = TimeSpan.FromSeconds(5) }, async (m, tx, ct) =>
        {
            Volatile.Write(ref begun, 1);
            await Task.Delay(500, CancellationToken.None);
            await WriteBiz(b, tx, m, ct);
        });
        await using (w)
        {
            await Until.True("the handler", () => Volatile.Read(ref begun) == 1);
            var c = await w.Stop();
            // the running one finished within the grace; no second claim after the stop
            Assert.Equal((1L, 1L), (c.Completed, c.Claimed));
            Assert.Equal("processed,pending", await b.Rows("SELECT state FROM {inbox} ORDER BY id"));
            Assert.Equal("1", await b.Rows("SELECT count(*) FROM {biz}"));
        }

        await b.Exec(b.Reset);
        await b.AddRows(1, 0);
        begun = 0;
        await using var w2 = b.Start(new InboxOptions { BatchSize = 1, ShutdownGrace = TimeSpan.FromMilliseconds(300) }, async (m, tx, ct) =>
        {
            await WriteBiz(b, tx, m, ct);
            Volatile.Write(ref begun, 1);
            await Task.Delay(Timeout.Infinite, ct);
        });
        await Until.True("the handler", () => Volatile.Read(ref begun) == 1);
        var clock = Stopwatch.StartNew();
        var c2 = await w2.Stop();
        Assert.True(clock.Elapsed >= TimeSpan.FromMilliseconds(290), $"the stop took {clock.Elapsed}; the grace is 300 ms");
        Assert.Equal(0L, c2.Completed + c2.Retried + c2.Dead);
        Assert.Equal("0", await b.Rows("SELECT count(*) FROM {biz}"));
        // left to its lease: still processing, no attempt spent
        Assert.Equal("processing:0", await b.Rows("SELECT state, attempt FROM {inbox}"));
    }

    // 7. MaxConcurrency 4 over 8 aggregates: parallel, never two of one aggregate, order kept
    public static async Task MaxConcurrency(Backend b)
    {
        await b.AddRows(40, 8);
        var gate = new object();
        int running = 0, maxRunning = 0;
        var perAggregate = new Dictionary<string, int>();
        var last = new Dictionary<string, int>();
        bool overlap = false, outOfOrder = false;
        await using var w = b.Start(new InboxOptions { MaxConcurrency = 4, BatchSize = 10 }, async (m, tx, ct) =>
        {
            var n = PayloadN(m);
            var aggregate = m.AggregateId!;
            lock (gate)
            {
                running++;
                maxRunning = Math.Max(maxRunning, running);
                overlap |= perAggregate.GetValueOrDefault(aggregate) > 0;
                perAggregate[aggregate] = perAggregate.GetValueOrDefault(aggregate) + 1;
                outOfOrder |= n < last.GetValueOrDefault(aggregate);
                last[aggregate] = n;
            }
            await Task.Delay(60, CancellationToken.None);
            lock (gate)
            {
                perAggregate[aggregate]--;
                running--;
            }
            await WriteBiz(b, tx, m, ct);
        });
        await b.WaitFor("SELECT count(*) FROM {inbox} WHERE state = 'processed'", "40");
        var c = await w.Stop();
        Assert.Equal(40L, c.Completed);
        Assert.False(overlap, "two of one aggregate at once");
        Assert.False(outOfOrder, "out of order within an aggregate");
        Assert.InRange(maxRunning, 2, 4);
        Assert.Equal("40", await b.Rows("SELECT count(*) FROM {biz}"));
    }
}
