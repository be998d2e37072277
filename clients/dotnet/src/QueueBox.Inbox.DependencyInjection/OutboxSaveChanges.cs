// OutboxSaveChanges: Entity Framework Core's SaveChanges writes the outbox
// messages added to a context (context.Enqueue) in its own transaction,
// through a SaveChanges interceptor (UseQueueBoxOutbox).
//
// Vocabulary: pending messages are those Enqueue added since the last
// SaveChanges that succeeded; an owned transaction is one the interceptor
// began because the context had none (EF then runs its writes in it
// instead of one of its own), committed after EF's writes succeed.
//
// Why an interceptor: the application keeps its one SaveChanges call, and
// an Enqueue without it is refused at once (a forgotten explicit call
// would lose the messages silently).  Why not an entity mapped on
// queuebox.outbox: EF reads store-made values back (OUTPUT on SQL Server,
// which a table with a trigger refuses), and would send the client's clock
// as scheduled_at.  In the application's own transaction the messages go
// under a savepoint, so a SaveChanges that fails and is called again does
// not write them twice.
using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Text.Json;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.EntityFrameworkCore;
using Microsoft.EntityFrameworkCore.Diagnostics;
using Microsoft.EntityFrameworkCore.Infrastructure;
using Microsoft.EntityFrameworkCore.Storage;

namespace QueueBox.Inbox.DependencyInjection;

/// <summary>Outbox messages written by a context's SaveChanges, in its transaction.</summary>
public static class OutboxDbContextExtensions
{
    private static readonly ConditionalWeakTable<DbContext, OutboxSaveChangesInterceptor.Pending> PendingOf = [];

    /// <summary>Adds the interceptor that writes the messages of <see cref="Enqueue{TPayload}"/> in SaveChanges.</summary>
    /// <param name="options">The context's options.</param>
    /// <returns>The options, for the next call.</returns>
    public static DbContextOptionsBuilder UseQueueBoxOutbox(this DbContextOptionsBuilder options)
    {
        ArgumentNullException.ThrowIfNull(options);
        return options.AddInterceptors(OutboxSaveChangesInterceptor.Instance);
    }

    /// <summary>Adds the interceptor that writes the messages of <see cref="Enqueue{TPayload}"/> in SaveChanges.</summary>
    /// <typeparam name="TContext">The context.</typeparam>
    /// <param name="options">The context's options.</param>
    /// <returns>The options, for the next call.</returns>
    public static DbContextOptionsBuilder<TContext> UseQueueBoxOutbox<TContext>(this DbContextOptionsBuilder<TContext> options)
        where TContext : DbContext
    {
        ArgumentNullException.ThrowIfNull(options);
        return options.AddInterceptors(OutboxSaveChangesInterceptor.Instance);
    }

    /// <summary>Adds a message that the context's next SaveChanges writes into <c>queuebox.outbox</c>, in the
    /// transaction of its business writes (the arguments: <see cref="OutboxMessage.Create{TPayload}"/>; the trace
    /// context is the activity current here).</summary>
    /// <typeparam name="TPayload">The payload's type (System.Text.Json).</typeparam>
    /// <param name="context">A context whose options have <see cref="UseQueueBoxOutbox"/>.</param>
    /// <param name="topic">The topic.</param>
    /// <param name="payload">The payload.</param>
    /// <param name="key">The ordering key, or null.</param>
    /// <param name="headers">Headers for the row.</param>
    /// <param name="notBefore">Not delivered before this time, or null.</param>
    /// <param name="jsonOptions">The serializer's options.</param>
    /// <returns>The message (its <see cref="OutboxMessage.MessageId"/> is the row's).</returns>
    /// <exception cref="InvalidOperationException">The context's options lack <see cref="UseQueueBoxOutbox"/>.</exception>
    public static OutboxMessage Enqueue<TPayload>(this DbContext context, string topic, TPayload payload, string? key = null,
        IReadOnlyDictionary<string, string>? headers = null, DateTimeOffset? notBefore = null,
        JsonSerializerOptions? jsonOptions = null)
    {
        ArgumentNullException.ThrowIfNull(context);
        var interceptors = context.GetService<IDbContextOptions>().FindExtension<CoreOptionsExtension>()?.Interceptors;
        if (interceptors is null || !System.Linq.Enumerable.Contains(interceptors, OutboxSaveChangesInterceptor.Instance))
        {
            throw new InvalidOperationException(
                $"{context.GetType().Name}: its options lack UseQueueBoxOutbox(), so SaveChanges would not write the message");
        }
        var message = OutboxMessage.Create(topic, payload, key, headers, notBefore, jsonOptions);
        var pending = PendingOf.GetOrCreateValue(context);
        lock (pending)
        {
            pending.Messages.Add(message);
        }
        return message;
    }

    /// <summary>The messages the next SaveChanges writes.</summary>
    /// <param name="context">The context.</param>
    /// <returns>A copy of the list.</returns>
    public static IReadOnlyList<OutboxMessage> PendingOutboxMessages(this DbContext context)
    {
        ArgumentNullException.ThrowIfNull(context);
        if (!PendingOf.TryGetValue(context, out var pending))
        {
            return [];
        }
        lock (pending)
        {
            return [.. pending.Messages];
        }
    }

    internal static OutboxSaveChangesInterceptor.Pending? Of(DbContext? context) =>
        context is not null && PendingOf.TryGetValue(context, out var pending) ? pending : null;
}

/// <summary>Writes a context's pending outbox messages in SaveChanges' transaction (add it with
/// <see cref="OutboxDbContextExtensions.UseQueueBoxOutbox"/>).</summary>
public sealed class OutboxSaveChangesInterceptor : SaveChangesInterceptor
{
    private const string Savepoint = "queuebox_outbox";

    /// <summary>The one instance (it keeps no state of its own).</summary>
    public static readonly OutboxSaveChangesInterceptor Instance = new();

    private OutboxSaveChangesInterceptor()
    {
    }

    internal sealed class Pending
    {
        internal List<OutboxMessage> Messages { get; } = [];

        internal List<OutboxMessage>? Writing { get; set; }

        internal IDbContextTransaction? Owned { get; set; }

        internal bool UnderSavepoint { get; set; }
    }

    /// <inheritdoc />
    public override InterceptionResult<int> SavingChanges(DbContextEventData eventData, InterceptionResult<int> result)
    {
        ArgumentNullException.ThrowIfNull(eventData);
        WriteAsync(eventData.Context, async: false, CancellationToken.None).AsTask().GetAwaiter().GetResult();
        return result;
    }

    /// <inheritdoc />
    public override async ValueTask<InterceptionResult<int>> SavingChangesAsync(DbContextEventData eventData,
        InterceptionResult<int> result, CancellationToken cancellationToken = default)
    {
        ArgumentNullException.ThrowIfNull(eventData);
        await WriteAsync(eventData.Context, async: true, cancellationToken).ConfigureAwait(false);
        return result;
    }

    /// <inheritdoc />
    public override int SavedChanges(SaveChangesCompletedEventData eventData, int result)
    {
        ArgumentNullException.ThrowIfNull(eventData);
        EndAsync(eventData.Context, commit: true, async: false, CancellationToken.None).AsTask().GetAwaiter().GetResult();
        return result;
    }

    /// <inheritdoc />
    public override async ValueTask<int> SavedChangesAsync(SaveChangesCompletedEventData eventData, int result,
        CancellationToken cancellationToken = default)
    {
        ArgumentNullException.ThrowIfNull(eventData);
        await EndAsync(eventData.Context, commit: true, async: true, cancellationToken).ConfigureAwait(false);
        return result;
    }

    /// <inheritdoc />
    public override void SaveChangesFailed(DbContextErrorEventData eventData)
    {
        ArgumentNullException.ThrowIfNull(eventData);
        EndAsync(eventData.Context, commit: false, async: false, CancellationToken.None).AsTask().GetAwaiter().GetResult();
    }

    /// <inheritdoc />
    public override Task SaveChangesFailedAsync(DbContextErrorEventData eventData, CancellationToken cancellationToken = default)
    {
        ArgumentNullException.ThrowIfNull(eventData);
        return EndAsync(eventData.Context, commit: false, async: true, cancellationToken).AsTask();
    }

    /// <inheritdoc />
    public override void SaveChangesCanceled(DbContextEventData eventData)
    {
        ArgumentNullException.ThrowIfNull(eventData);
        EndAsync(eventData.Context, commit: false, async: false, CancellationToken.None).AsTask().GetAwaiter().GetResult();
    }

    /// <inheritdoc />
    public override Task SaveChangesCanceledAsync(DbContextEventData eventData, CancellationToken cancellationToken = default)
    {
        ArgumentNullException.ThrowIfNull(eventData);
        // the token is cancelled: the rollback must not take it
        return EndAsync(eventData.Context, commit: false, async: true, CancellationToken.None).AsTask();
    }

    /// <summary>Before EF's writes: the pending messages, in the context's transaction (one begun here when
    /// it has none; under a savepoint in the application's).</summary>
    private static async ValueTask WriteAsync(DbContext? context, bool async, CancellationToken cancellationToken)
    {
        var pending = OutboxDbContextExtensions.Of(context);
        List<OutboxMessage> messages;
        lock (pending ?? new Pending())
        {
            if (pending is null || pending.Messages.Count == 0)
            {
                return;
            }
            messages = [.. pending.Messages];
        }
        var database = context!.Database;
        var transaction = database.CurrentTransaction;
        if (transaction is null)
        {
            pending.Owned = transaction = async
                ? await database.BeginTransactionAsync(cancellationToken).ConfigureAwait(false)
                : database.BeginTransaction();
        }
        else if (transaction.SupportsSavepoints)
        {
            if (async)
            {
                await transaction.CreateSavepointAsync(Savepoint, cancellationToken).ConfigureAwait(false);
            }
            else
            {
                transaction.CreateSavepoint(Savepoint);
            }
            pending.UnderSavepoint = true;
        }
        pending.Writing = messages;
        try
        {
            if (async)
            {
                await transaction.GetDbTransaction().EnqueueBatchAsync(messages, cancellationToken).ConfigureAwait(false);
            }
            else
            {
                transaction.GetDbTransaction().EnqueueBatch(messages);
            }
        }
        catch
        {
            await EndAsync(context, commit: false, async, CancellationToken.None).ConfigureAwait(false);
            throw;
        }
    }

    /// <summary>After EF's writes: on success the written messages leave the pending list and an owned
    /// transaction commits; on failure it rolls back (or the savepoint does), and they stay pending.</summary>
    private static async ValueTask EndAsync(DbContext? context, bool commit, bool async, CancellationToken cancellationToken)
    {
        var pending = OutboxDbContextExtensions.Of(context);
        if (pending?.Writing is null)
        {
            return;
        }
        var owned = pending.Owned;
        var savepoint = pending.UnderSavepoint;
        var written = pending.Writing;
        pending.Owned = null;
        pending.UnderSavepoint = false;
        pending.Writing = null;
        try
        {
            if (commit)
            {
                if (owned is not null)
                {
                    await (async ? owned.CommitAsync(cancellationToken) : Run(owned.Commit)).ConfigureAwait(false);
                }
                lock (pending)
                {
                    pending.Messages.RemoveAll(written.Contains);
                }
            }
            else if (owned is not null)
            {
                await (async ? owned.RollbackAsync(cancellationToken) : Run(owned.Rollback)).ConfigureAwait(false);
            }
            else if (savepoint && context!.Database.CurrentTransaction is { } transaction)
            {
                await (async ? transaction.RollbackToSavepointAsync(Savepoint, cancellationToken)
                    : Run(() => transaction.RollbackToSavepoint(Savepoint))).ConfigureAwait(false);
            }
        }
        finally
        {
            if (owned is not null)
            {
                await owned.DisposeAsync().ConfigureAwait(false);
            }
        }
    }

    private static Task Run(Action action)
    {
        action();
        return Task.CompletedTask;
    }
}
