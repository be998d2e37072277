// InboxDbContextFactory: an Entity Framework Core context on the handler's
// connection and transaction, so its SaveChanges commits with the
// completion (a context of its own connection would commit on its own).
using System;
using System.Data.Common;
using Microsoft.EntityFrameworkCore;

namespace QueueBox.Inbox.DependencyInjection;

/// <summary>Builds Entity Framework Core contexts on a handler's transaction.</summary>
public static class InboxDbContextFactory
{
    /// <summary>A context of type <typeparamref name="TContext"/> on the connection of
    /// <paramref name="transaction"/>, enlisted in it: SaveChanges writes in the handler's transaction
    /// and commits with the completion (or rolls back with a failure). Dispose the context before the
    /// handler returns; it closes neither the connection nor the transaction.</summary>
    /// <typeparam name="TContext">The context; it needs a constructor taking <c>DbContextOptions&lt;TContext&gt;</c>
    /// unless <paramref name="create"/> is given.</typeparam>
    /// <param name="transaction">The handler's transaction.</param>
    /// <param name="useProvider">Picks the provider on the connection, for example
    /// <c>(options, connection) =&gt; options.UseNpgsql(connection)</c> or <c>.UseSqlServer(connection)</c>.</param>
    /// <param name="create">Makes the context from the options (default: its constructor).</param>
    /// <returns>The context.</returns>
    public static TContext CreateOn<TContext>(DbTransaction transaction,
        Action<DbContextOptionsBuilder<TContext>, DbConnection> useProvider,
        Func<DbContextOptions<TContext>, TContext>? create = null)
        where TContext : DbContext
    {
        ArgumentNullException.ThrowIfNull(transaction);
        ArgumentNullException.ThrowIfNull(useProvider);
        var connection = transaction.Connection
            ?? throw new InvalidOperationException("the transaction has ended: it has no connection any more");
        var builder = new DbContextOptionsBuilder<TContext>();
        useProvider(builder, connection);
        var context = create is not null
            ? create(builder.Options)
            : (TContext)(Activator.CreateInstance(typeof(TContext), builder.Options)
                ?? throw new InvalidOperationException($"{typeof(TContext)} could not be made from its options"));
        try
        {
            context.Database.UseTransaction(transaction);
        }
        catch
        {
            context.Dispose();
            throw;
        }
        return context;
    }
}
