// OutboxSaveChanges: Entity Framework Core's SaveChanges writes the outbox
// messages added to a context (context.Enqueue) in its own transaction,
// through a SaveChanges interceptor (UseQueueBoxOutbox).
//
// Vocabulary: pending messages are those Enqueue added since the last
// SaveChanges began; they live in the context's own scoped service
// (OutboxPending, in EF's internal service provider), so a pooled context
// drops them when it goes back to the pool (IResettableService).  An owned
// transaction is one the interceptor began because the context had none
// (EF then runs its writes in it instead of one of its own), committed
// after EF's writes succeed.
//
// The rule: a message commits with the business writes of the SaveChanges
// that took it, or not at all.  Every SaveChanges takes all the pending
// messages: written with it when it succeeds, dropped when it fails, is
// cancelled, or its commit fails (the caller enqueues again with the
// writes it retries).  Kept pending, they would ride on the next
// SaveChanges, whose writes may be unrelated (after ChangeTracker.Clear(),
// or the next user of a pooled context), and a commit that failed may have
// committed them already.
//
// Why an interceptor: the application keeps its one SaveChanges call, and
// an Enqueue without it is refused at once (a forgotten explicit call
// would lose the messages silently).  Why not an entity mapped on
// queuebox.outbox: EF reads store-made values back (OUTPUT on SQL Server,
// which a table with a trigger refuses), and would send the client's clock
// as scheduled_at.  In the application's own transaction the messages go
// under a savepoint, which a failed SaveChanges rolls back (EF's own
// savepoint is taken after our writes, so it would keep them); where the
// transaction has none (SqlClient with MARS) the interceptor refuses
// before writing anything, since a failed SaveChanges could not take the
// messages back out of the application's transaction.
using System;
using System.Collections.Generic;
using System.Text.Json;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.EntityFrameworkCore;
using Microsoft.EntityFrameworkCore.Diagnostics;
using Microsoft.EntityFrameworkCore.Infrastructure;
using Microsoft.EntityFrameworkCore.Storage;
using Microsoft.Extensions.DependencyInjection;

namespace QueueBox.Inbox.DependencyInjection;

/// <summary>Outbox messages written by a context's SaveChanges, in its transaction.</summary>
public static class OutboxDbContextExtensions
{
    /// <summary>Adds the interceptor that writes the messages of <see cref="Enqueue{TPayload}"/> in SaveChanges.</summary>
    /// <param name="options">The context's options.</param>
    /// <returns>The options, for the next call.</returns>
    public static DbContextOptionsBuilder UseQueueBoxOutbox(this DbContextOptionsBuilder options)
    {
        ArgumentNullException.ThrowIfNull(options);
        ((IDbContextOptionsBuilderInfrastructure)options).AddOrUpdateExtension(new OutboxOptionsExtension());
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
        ((IDbContextOptionsBuilderInfrastructure)options).AddOrUpdateExtension(new OutboxOptionsExtension());
        return options.AddInterceptors(OutboxSaveChangesInterceptor.Instance);
    }

    /// <summary>Adds a message that the context's next SaveChanges writes into <c>queuebox.outbox</c>, in the
    /// transaction of its business writes (the arguments: <see cref="OutboxMessage.Create{TPayload}"/>; the trace
    /// context is the activity current here).  That SaveChanges takes it whatever happens: a SaveChanges that
    /// fails drops it, and the caller enqueues it again with the writes it retries.</summary>
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
        var pending = Of(context);
        if (pending is null || interceptors is null
            || !System.Linq.Enumerable.Contains(interceptors, OutboxSaveChangesInterceptor.Instance))
        {
            throw new InvalidOperationException(
                $"{context.GetType().Name}: its options lack UseQueueBoxOutbox(), so SaveChanges would not write the message");
        }
        var message = OutboxMessage.Create(topic, payload, key, headers, notBefore, jsonOptions);
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
        if (Of(context) is not { } pending)
        {
            return [];
        }
        lock (pending)
        {
            return [.. pending.Messages];
        }
    }

    /// <summary>The context's pending messages, or null when its options lack UseQueueBoxOutbox.</summary>
    internal static OutboxPending? Of(DbContext? context) =>
        context is null ? null : ((IInfrastructure<IServiceProvider>)context).Instance.GetService<OutboxPending>();
}

/// <summary>The messages a context's next SaveChanges takes, and that SaveChanges' state: one per context
/// (scoped in EF's internal service provider), emptied when a pooled context is reset.</summary>
internal sealed class OutboxPending : IResettableService
{
    internal List<OutboxMessage> Messages { get; } = [];

    internal bool Writing { get; set; }

    internal IDbContextTransaction? Owned { get; set; }

    internal bool UnderSavepoint { get; set; }

    /// <summary>A pooled context goes back to the pool: its messages must not ride on the next user's
    /// writes (a SaveChanges in progress has ended by then).</summary>
    public void ResetState()
    {
        lock (this)
        {
            Messages.Clear();
        }
        (Writing, Owned, UnderSavepoint) = (false, null, false);
    }

    public Task ResetStateAsync(CancellationToken cancellationToken = default)
    {
        ResetState();
        return Task.CompletedTask;
    }
}

/// <summary>What UseQueueBoxOutbox adds to EF's internal service provider: the pending messages of each
/// context, reset with a pooled context.</summary>
internal sealed class OutboxOptionsExtension : IDbContextOptionsExtension
{
    public DbContextOptionsExtensionInfo Info => field ??= new ExtensionInfo(this);

    public void ApplyServices(IServiceCollection services)
    {
        services.AddScoped<OutboxPending>();
        services.AddScoped<IResettableService>(p => p.GetRequiredService<OutboxPending>());
    }

    public void Validate(IDbContextOptions options)
    {
    }

    private sealed class ExtensionInfo(IDbContextOptionsExtension extension) : DbContextOptionsExtensionInfo(extension)
    {
        public override bool IsDatabaseProvider => false;

        public override string LogFragment => "UseQueueBoxOutbox ";

        public override int GetServiceProviderHashCode() => 0;

        public override bool ShouldUseSameServiceProvider(DbContextOptionsExtensionInfo other) => other is ExtensionInfo;

        public override void PopulateDebugInfo(IDictionary<string, string> debugInfo) => debugInfo["QueueBox:Outbox"] = "1";
    }
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

    /// <summary>Before EF's writes: the pending messages, taken off the list, in the context's transaction (one
    /// begun here when it has none; under a savepoint in the application's, refused without savepoints).</summary>
    private static async ValueTask WriteAsync(DbContext? context, bool async, CancellationToken cancellationToken)
    {
        var pending = OutboxDbContextExtensions.Of(context);
        if (pending is null)
        {
            return;
        }
        List<OutboxMessage> messages;
        lock (pending)
        {
            if (pending.Messages.Count == 0)
            {
                return;
            }
            // this SaveChanges takes them, whatever comes of it
            messages = [.. pending.Messages];
            pending.Messages.Clear();
        }
        var database = context!.Database;
        var transaction = database.CurrentTransaction;
        if (transaction is { SupportsSavepoints: false })
        {
            throw new InvalidOperationException(
                $"{context.GetType().Name}.SaveChanges with {messages.Count} outbox message(s), in a transaction of yours that has no "
                + "savepoints (SqlClient has none with MultipleActiveResultSets=True): a failed SaveChanges could not take the messages "
                + "back out of it, and your commit would write them without the business writes. Nothing was written and the "
                + "messages are dropped. Turn MultipleActiveResultSets off, or call SaveChanges outside a transaction of yours (the "
                + "outbox begins and commits one), or write the messages yourself with "
                + "Database.CurrentTransaction.GetDbTransaction().EnqueueBatchAsync(...) and roll back when SaveChanges fails; "
                + "then enqueue them again.");
        }
        pending.Writing = true;
        try
        {
            if (transaction is null)
            {
                pending.Owned = transaction = async
                    ? await database.BeginTransactionAsync(cancellationToken).ConfigureAwait(false)
                    : database.BeginTransaction();
            }
            else
            {
                await (async ? transaction.CreateSavepointAsync(Savepoint, cancellationToken)
                    : Run(() => transaction.CreateSavepoint(Savepoint))).ConfigureAwait(false);
                pending.UnderSavepoint = true;
            }
            await (async ? transaction.GetDbTransaction().EnqueueBatchAsync(messages, cancellationToken)
                : Run(() => transaction.GetDbTransaction().EnqueueBatch(messages))).ConfigureAwait(false);
        }
        catch
        {
            await EndAsync(context, commit: false, async, CancellationToken.None).ConfigureAwait(false);
            throw;
        }
    }

    /// <summary>After EF's writes: on success an owned transaction commits; on failure it rolls back, or the
    /// savepoint does.  The messages left the pending list when they were written: a failure, of the writes or
    /// of the commit, drops them.</summary>
    private static async ValueTask EndAsync(DbContext? context, bool commit, bool async, CancellationToken cancellationToken)
    {
        var pending = OutboxDbContextExtensions.Of(context);
        if (pending is not { Writing: true })
        {
            return;
        }
        var owned = pending.Owned;
        var savepoint = pending.UnderSavepoint;
        (pending.Writing, pending.Owned, pending.UnderSavepoint) = (false, null, false);
        try
        {
            if (owned is not null)
            {
                await (commit ? (async ? owned.CommitAsync(cancellationToken) : Run(owned.Commit))
                    : (async ? owned.RollbackAsync(cancellationToken) : Run(owned.Rollback))).ConfigureAwait(false);
            }
            else if (!commit && savepoint && context!.Database.CurrentTransaction is { } transaction)
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
