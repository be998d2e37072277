// AddQueueBoxInbox: a pull worker as a hosted service of the generic host.
// The host's start starts it, the host's stop is the worker's stop (the
// shutdown grace runs inside the host's StopAsync).
using System;
using System.Data.Common;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.DependencyInjection.Extensions;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;

namespace QueueBox.Inbox.DependencyInjection;

/// <summary>A handler resolved from a dependency injection scope, one scope per message.</summary>
public interface IInboxHandler
{
    /// <summary>Handles one message, as <see cref="InboxHandler"/> does.</summary>
    /// <param name="message">The claimed message.</param>
    /// <param name="transaction">The open transaction to write through; do not commit it.</param>
    /// <param name="cancellationToken">Cancelled when the lease is lost or the shutdown grace ran out.</param>
    /// <returns>The handler's work.</returns>
    Task HandleAsync(InboxMessage message, DbTransaction transaction, CancellationToken cancellationToken);
}

/// <summary>Registers pull workers in an <see cref="IServiceCollection"/>.</summary>
public static class InboxServiceCollectionExtensions
{
    /// <summary>Runs a worker as an <see cref="IHostedService"/>: <typeparamref name="THandler"/> is
    /// resolved in a new scope for each message. Call it once per source.</summary>
    /// <typeparam name="THandler">The handler; registered as scoped unless it is registered already.</typeparam>
    /// <param name="services">The services.</param>
    /// <param name="connections">The worker's connections, from the services (for example
    /// <c>sp =&gt; InboxConnections.From(sp.GetRequiredService&lt;NpgsqlDataSource&gt;())</c>).</param>
    /// <param name="configure">Sets the options (Source at least).</param>
    /// <returns>The services.</returns>
    public static IServiceCollection AddQueueBoxInbox<THandler>(this IServiceCollection services,
        Func<IServiceProvider, InboxConnections> connections, Action<InboxOptions> configure)
        where THandler : class, IInboxHandler
    {
        ArgumentNullException.ThrowIfNull(services);
        services.TryAddScoped<THandler>();
        return services.AddQueueBoxInbox(connections, configure, sp => async (message, transaction, cancellationToken) =>
        {
            var scope = sp.CreateAsyncScope();
            await using (scope.ConfigureAwait(false))
            {
                var handler = scope.ServiceProvider.GetRequiredService<THandler>();
                await handler.HandleAsync(message, transaction, cancellationToken).ConfigureAwait(false);
            }
        });
    }

    /// <summary>Runs a worker as an <see cref="IHostedService"/> with a handler made from the services.
    /// Call it once per source. The worker logs to the services' <see cref="ILoggerFactory"/> (the
    /// host's), category <c>QueueBox.Inbox.&lt;source&gt;</c>; without one, to standard error.</summary>
    /// <param name="services">The services.</param>
    /// <param name="connections">The worker's connections, from the services.</param>
    /// <param name="configure">Sets the options (Source at least).</param>
    /// <param name="handler">Makes the handler, once, when the host starts.</param>
    /// <returns>The services.</returns>
    public static IServiceCollection AddQueueBoxInbox(this IServiceCollection services,
        Func<IServiceProvider, InboxConnections> connections, Action<InboxOptions> configure,
        Func<IServiceProvider, InboxHandler> handler)
    {
        ArgumentNullException.ThrowIfNull(services);
        ArgumentNullException.ThrowIfNull(connections);
        ArgumentNullException.ThrowIfNull(configure);
        ArgumentNullException.ThrowIfNull(handler);
        services.AddSingleton<IHostedService>(sp =>
        {
            var options = new InboxOptions();
            configure(options);
            var logger = sp.GetService<ILoggerFactory>()?.CreateLogger("QueueBox.Inbox." + options.Source);
            var worker = new InboxWorker(connections(sp), options, logger);
            return new InboxHostedService(worker, handler(sp));
        });
        return services;
    }
}

/// <summary>A worker run by the generic host: started by its start, stopped by its stop. The stop
/// returns once the running handlers returned (they keep <see cref="InboxOptions.ShutdownGrace"/>);
/// keep the host's <c>HostOptions.ShutdownTimeout</c> above the grace, or the host gives up waiting first.</summary>
public sealed class InboxHostedService : IHostedService, IDisposable
{
    private readonly InboxHandler _handler;
    private readonly CancellationTokenSource _stopping = new();
    private Task? _run;

    /// <summary>A hosted service for <paramref name="worker"/> and <paramref name="handler"/>.</summary>
    /// <param name="worker">The worker.</param>
    /// <param name="handler">Its handler.</param>
    public InboxHostedService(InboxWorker worker, InboxHandler handler)
    {
        Worker = worker ?? throw new ArgumentNullException(nameof(worker));
        _handler = handler ?? throw new ArgumentNullException(nameof(handler));
    }

    /// <summary>The worker (its counters, its dialect).</summary>
    public InboxWorker Worker { get; }

    /// <inheritdoc />
    public Task StartAsync(CancellationToken cancellationToken)
    {
        _run = Task.Run(() => Worker.RunAsync(_handler, _stopping.Token), CancellationToken.None);
        return Task.CompletedTask;
    }

    /// <inheritdoc />
    public async Task StopAsync(CancellationToken cancellationToken)
    {
        if (_run is null)
        {
            return;
        }
        await _stopping.CancelAsync().ConfigureAwait(false);
        await _run.WaitAsync(cancellationToken).ConfigureAwait(false);
    }

    /// <inheritdoc />
    public void Dispose() => _stopping.Dispose();
}
