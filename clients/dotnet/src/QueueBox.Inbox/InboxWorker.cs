// InboxWorker: the pull worker contract of docs/pull.md for one source.
// The claim runs alone in a transaction of its own; a renewer renews every
// held message every third of the lease on a connection of its own; each
// handler runs in a transaction with the completion; a failure goes to the
// retry policy, then a retry or a dead letter in a statement of its own.  A
// stop claims nothing more, gives running handlers the grace, then cancels
// them and completes nothing (the lease brings the message back).
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Data.Common;
using System.Diagnostics;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Logging.Abstractions;

namespace QueueBox.Inbox;

/// <summary>Handles one message. Write every business row through <paramref name="transaction"/> and
/// neither commit nor roll it back: when the handler returns, the worker completes the message in
/// that transaction and commits. Throw to fail the message (the retry policy decides).</summary>
/// <param name="message">The claimed message.</param>
/// <param name="transaction">An open transaction on a connection of the handler's own.</param>
/// <param name="cancellationToken">Cancelled when the lease is lost or the shutdown grace ran out;
/// the transaction is then rolled back.</param>
/// <returns>The handler's work.</returns>
public delegate Task InboxHandler(InboxMessage message, DbTransaction transaction, CancellationToken cancellationToken);

/// <summary>Consumes one pull source. Run it once at a time.</summary>
public sealed class InboxWorker
{
    private readonly InboxConnections _connections;
    private readonly InboxOptions _options;
    private readonly InboxStatements _statements;
    private readonly ILogger _logger;
    private readonly InboxTelemetry.Counts _counts;
    private int _running;

    /// <summary>Checks the options and makes a worker on <paramref name="connections"/>.</summary>
    /// <param name="connections">The application's data source, from <see cref="InboxConnections.From"/>.</param>
    /// <param name="options">The source and the settings; copied, so later changes do not reach the worker.</param>
    /// <param name="logger">Receives what the worker has to say. Without one, warnings and errors
    /// (a handler's failure with its exception, a claim that failed, a lost lease) go to standard
    /// error; pass <see cref="NullLogger.Instance"/> for no output at all.</param>
    /// <exception cref="ArgumentException">An option is out of range, or the dialect is unknown:
    /// the message names the option and what to set.</exception>
    public InboxWorker(InboxConnections connections, InboxOptions options, ILogger? logger = null)
    {
        ArgumentNullException.ThrowIfNull(connections);
        ArgumentNullException.ThrowIfNull(options);
        _options = options.Copy();
        _options.Validate();
        if (_options.Dialect == InboxDialect.Detect)
        {
            _options.Dialect = connections.Dialect;
        }
        if (_options.Dialect == InboxDialect.Detect)
        {
            throw new ArgumentException(
                $"cannot tell the dialect from the data source {connections.DataSource.GetType()}: set InboxOptions.Dialect "
                + "to InboxDialect.PostgreSql or InboxDialect.SqlServer", nameof(options));
        }
        _connections = connections;
        _statements = new InboxStatements(_options.Dialect, _options.CommandTimeout);
        _logger = logger ?? new InboxStandardErrorLogger(_options.Source);
        _counts = new InboxTelemetry.Counts(_options.Source);
    }

    /// <summary>The dialect the worker speaks (detected or set).</summary>
    public InboxDialect Dialect => _options.Dialect;

    /// <summary>The worker's counters now.</summary>
    public InboxCounters Counters => _counts.Snapshot();

    /// <summary>Claims and handles messages until <paramref name="stoppingToken"/> is cancelled, then
    /// starts no claim and no handler (a claim under way finishes; what it took is left to its lease)
    /// and returns when every running handler has returned: they keep
    /// <see cref="InboxOptions.ShutdownGrace"/>, then their tokens are cancelled. Claims, renewals and
    /// completions that fail are logged and tried again.</summary>
    /// <param name="handler">The application's handler.</param>
    /// <param name="stoppingToken">Cancel it to stop the worker.</param>
    /// <returns>A task that ends after the stop.</returns>
    /// <exception cref="InvalidOperationException">The worker is running already, or the database
    /// cannot be reached at the start.</exception>
    public async Task RunAsync(InboxHandler handler, CancellationToken stoppingToken)
    {
        ArgumentNullException.ThrowIfNull(handler);
        if (Interlocked.CompareExchange(ref _running, 1, 0) != 0)
        {
            throw new InvalidOperationException("this worker is running already; make another InboxWorker");
        }
        try
        {
            try
            {
                await using var connection = await _connections.DataSource.OpenConnectionAsync(stoppingToken).ConfigureAwait(false);
            }
            catch (OperationCanceledException) when (stoppingToken.IsCancellationRequested)
            {
                return; // stopped before the first claim
            }
            catch (Exception e) when (e is DbException or InvalidOperationException or System.Net.Sockets.SocketException)
            {
                throw new InvalidOperationException($"QueueBox.Inbox: cannot reach the database: {e.Message}", e);
            }
            using var run = new Run(this, handler);
            await run.RunAsync(stoppingToken).ConfigureAwait(false);
        }
        finally
        {
            Volatile.Write(ref _running, 0);
        }
    }

    /// <summary>A claimed message not finished yet.</summary>
    private sealed class Held : IDisposable
    {
        internal Held(InboxMessage message, CancellationToken hard)
        {
            Message = message;
            Cancel = CancellationTokenSource.CreateLinkedTokenSource(hard);
        }

        internal InboxMessage Message { get; }

        internal CancellationTokenSource Cancel { get; }

        /// <summary>A renewal changed no row: another worker owns the message.</summary>
        internal bool Lost => Volatile.Read(ref _lost);

        private bool _lost;

        internal void MarkLost()
        {
            Volatile.Write(ref _lost, true);
            try
            {
                Cancel.Cancel();
            }
            catch (ObjectDisposedException)
            {
                // finished meanwhile
            }
        }

        public void Dispose() => Cancel.Dispose();
    }

    /// <summary>The connection a handler slot runs its transactions on: opened from the data source
    /// when first needed, kept from one completed message to the next (a pooled connection closed
    /// and opened again costs Npgsql a session reset), closed after a failure.</summary>
    private sealed class HandlerConnection(DbDataSource dataSource) : IAsyncDisposable
    {
        private DbConnection? _connection;

        internal async ValueTask<DbConnection> OpenAsync(CancellationToken cancellationToken)
        {
            if (_connection is { State: System.Data.ConnectionState.Open })
            {
                return _connection;
            }
            await DisposeAsync().ConfigureAwait(false);
            _connection = await dataSource.OpenConnectionAsync(cancellationToken).ConfigureAwait(false);
            return _connection;
        }

        public async ValueTask DisposeAsync()
        {
            if (_connection is not null)
            {
                var connection = _connection;
                _connection = null;
                await connection.DisposeAsync().ConfigureAwait(false);
            }
        }
    }

    private enum Outcome
    {
        Completed,
        Failed, // the handler's exception: the retry policy decides
        Lost, // another worker owns the message
        LeftToLease, // not completed, no attempt spent: it comes back after its lease
    }

    /// <summary>The state of one RunAsync.</summary>
    private sealed class Run : IDisposable
    {
        private readonly InboxWorker _w;
        private readonly InboxHandler _handler;
        private readonly CancellationTokenSource _hard = new(); // the handlers': cancelled past the grace
        private readonly ConcurrentDictionary<Held, byte> _held = new();
        private readonly ConcurrentDictionary<Task, byte> _handlers = new();
        private readonly SemaphoreSlim _slots; // one per handler that may run: outlives the claim loop

        internal Run(InboxWorker worker, InboxHandler handler)
        {
            _w = worker;
            _handler = handler;
            _slots = new SemaphoreSlim(worker._options.MaxConcurrency, worker._options.MaxConcurrency);
        }

        private InboxOptions O => _w._options;

        public void Dispose()
        {
            _hard.Dispose();
            _slots.Dispose();
        }

        internal async Task RunAsync(CancellationToken stop)
        {
            using var renewStop = new CancellationTokenSource();
            var renewer = Task.Run(() => RenewLoopAsync(renewStop.Token), CancellationToken.None);
            await ClaimLoopAsync(stop).ConfigureAwait(false);

            var all = Task.WhenAll(_handlers.Keys.ToArray());
            if (!all.IsCompleted)
            {
                var grace = Task.Delay(O.ShutdownGrace, CancellationToken.None);
                if (await Task.WhenAny(all, grace).ConfigureAwait(false) != all)
                {
                    _w._logger.LogWarning("the shutdown grace ({Grace}) ran out: cancelling the running handlers", O.ShutdownGrace);
                    await _hard.CancelAsync().ConfigureAwait(false);
                }
            }
            await all.ConfigureAwait(false);
            await renewStop.CancelAsync().ConfigureAwait(false);
            await renewer.ConfigureAwait(false);
        }

        /// <summary>Claims while <paramref name="stop"/> lives: one slot takes a whole batch and runs it
        /// in claim order; several slots claim no more than they can start.</summary>
        private async Task ClaimLoopAsync(CancellationToken stop)
        {
            var max = O.MaxConcurrency;
            var slots = _slots;
            while (!stop.IsCancellationRequested)
            {
                try
                {
                    await slots.WaitAsync(stop).ConfigureAwait(false);
                }
                catch (OperationCanceledException)
                {
                    return;
                }
                var free = 1;
                while (free < max && free < O.BatchSize && slots.Wait(0, CancellationToken.None))
                {
                    free++;
                }
                if (stop.IsCancellationRequested)
                {
                    slots.Release(free);
                    return;
                }
                List<InboxMessage> batch;
                try
                {
                    batch = await _w._statements.ClaimAsync(_w._connections.DataSource, O.Source,
                        max == 1 ? O.BatchSize : free, O.LeaseMs).ConfigureAwait(false);
                }
                catch (Exception e) when (e is not OutOfMemoryException)
                {
                    if (InboxStatements.IsClaimLockTimeout(e))
                    {
                        _w._logger.LogInformation("claim: another claim of source {Source} held its lock for 10 s (Msg 51000, temporary); claiming again in {Poll}",
                            O.Source, O.PollInterval);
                    }
                    else
                    {
                        _w._logger.LogWarning(e, "claim failed: {Error}; claiming again in {Poll}", e.Message, O.PollInterval);
                    }
                    batch = [];
                }
                if (batch.Count == 0)
                {
                    slots.Release(free);
                    await PauseAsync(O.PollInterval, stop).ConfigureAwait(false);
                    continue;
                }
                _w._counts.Claimed(batch.Count);
                _w._logger.LogDebug("claimed {Count} messages of source {Source}", batch.Count, O.Source);
                var holds = batch.Select(m => Hold(m)).ToList();
                if (stop.IsCancellationRequested)
                {
                    // the stop came during the claim: none starts, each is left to its lease
                    holds.ForEach(Drop);
                    slots.Release(free);
                    return;
                }
                if (max == 1)
                {
                    var held = holds;
                    Track(async () =>
                    {
                        // one connection for the batch's transactions, one after another
                        await using var connection = new HandlerConnection(_w._connections.DataSource);
                        try
                        {
                            for (var i = 0; i < held.Count; i++)
                            {
                                if (stop.IsCancellationRequested)
                                {
                                    // not started: left to its lease, no attempt spent
                                    held.Skip(i).ToList().ForEach(Drop);
                                    return;
                                }
                                await HandleAsync(held[i], connection).ConfigureAwait(false);
                            }
                        }
                        finally
                        {
                            slots.Release(free);
                        }
                    });
                    continue;
                }
                if (free > holds.Count)
                {
                    slots.Release(free - holds.Count);
                }
                foreach (var h in holds)
                {
                    Track(async () =>
                    {
                        await using var connection = new HandlerConnection(_w._connections.DataSource);
                        try
                        {
                            await HandleAsync(h, connection).ConfigureAwait(false);
                        }
                        finally
                        {
                            slots.Release();
                        }
                    });
                }
            }
        }

        private void Track(Func<Task> work)
        {
            var task = Task.Run(work, CancellationToken.None);
            _handlers[task] = 0;
            task.ContinueWith(t => _handlers.TryRemove(t, out _), CancellationToken.None,
                TaskContinuationOptions.ExecuteSynchronously, TaskScheduler.Default);
        }

        private static async Task PauseAsync(TimeSpan wait, CancellationToken stop)
        {
            try
            {
                await Task.Delay(wait, stop).ConfigureAwait(false);
            }
            catch (OperationCanceledException)
            {
                // the stop: the loop ends
            }
        }

        private Held Hold(InboxMessage message)
        {
            var h = new Held(message, _hard.Token);
            _held[h] = 0;
            return h;
        }

        /// <summary>Finished (or never to start): no longer renewed.</summary>
        private void Drop(Held h)
        {
            _held.TryRemove(h, out _);
            h.Dispose();
        }

        /// <summary>Renews every held message every third of the lease, on a connection of its own (the
        /// handlers hold theirs in a transaction). A renewal that changes no row marks the message lost
        /// and cancels its handler's token; one that fails is tried again next round.</summary>
        private async Task RenewLoopAsync(CancellationToken stop)
        {
            var every = TimeSpan.FromMilliseconds(O.LeaseMs / 3.0);
            using var timer = new PeriodicTimer(every);
            try
            {
                while (await timer.WaitForNextTickAsync(stop).ConfigureAwait(false))
                {
                    var round = _held.Keys.Where(h => !h.Lost).ToList();
                    if (round.Count == 0)
                    {
                        continue;
                    }
                    try
                    {
                        await using var connection = await _w._connections.DataSource.OpenConnectionAsync(CancellationToken.None).ConfigureAwait(false);
                        foreach (var h in round)
                        {
                            if (!_held.ContainsKey(h))
                            {
                                continue; // finished meanwhile
                            }
                            if (!await _w._statements.RenewAsync(connection, h.Message, O.LeaseMs).ConfigureAwait(false))
                            {
                                h.MarkLost();
                            }
                        }
                    }
                    catch (Exception e) when (e is not OutOfMemoryException)
                    {
                        _w._logger.LogWarning(e, "lease renewal failed: {Error}; trying again in {Every}", e.Message, every);
                    }
                }
            }
            catch (OperationCanceledException)
            {
                // the run ended
            }
        }

        private async Task HandleAsync(Held h, HandlerConnection connection)
        {
            var m = h.Message;
            try
            {
                if (h.Lost)
                {
                    _w._counts.LeaseLost();
                    _w._logger.LogWarning("message {Id}: the lease was lost before its handler started", m.Id);
                    return;
                }
                // a child of the context the message arrived with (W3C traceparent), when it has one
                using var activity = InboxTelemetry.TryGetParent(m, out var parent)
                    ? InboxTelemetry.Activities.StartActivity("queuebox.inbox process", ActivityKind.Consumer, parent)
                    : InboxTelemetry.Activities.StartActivity("queuebox.inbox process", ActivityKind.Consumer);
                activity?.SetTag("queuebox.source", m.Source);
                activity?.SetTag("queuebox.message.id", m.Id);
                activity?.SetTag("queuebox.message.attempt", m.Attempt);
                var (outcome, error) = await InTransactionAsync(h, connection).ConfigureAwait(false);
                activity?.SetTag("queuebox.outcome", outcome.ToString());
                switch (outcome)
                {
                    case Outcome.Completed:
                        _w._counts.Completed();
                        break;
                    case Outcome.Lost:
                        _w._counts.LeaseLost();
                        _w._logger.LogWarning("message {Id}: the lease was lost (another worker owns the message); rolled back", m.Id);
                        activity?.SetStatus(ActivityStatusCode.Error, "lease lost");
                        break;
                    case Outcome.LeftToLease:
                        _w._logger.LogWarning("message {Id}: {Error}; rolled back, no attempt spent: it comes back after its lease", m.Id, error?.Message);
                        activity?.SetStatus(ActivityStatusCode.Error, error?.Message);
                        break;
                    case Outcome.Failed:
                        activity?.SetStatus(ActivityStatusCode.Error, error!.Message);
                        await FailAsync(h, error!).ConfigureAwait(false);
                        break;
                }
            }
            catch (Exception e) when (e is not OutOfMemoryException)
            {
                _w._logger.LogError(e, "message {Id}: {Error}; it comes back after its lease", m.Id, e.Message);
            }
            finally
            {
                Drop(h);
            }
        }

        /// <summary>The handler and the completion in one transaction, on <paramref name="lease"/>'s
        /// connection; after anything but a completion that connection is closed, so the next
        /// message starts on a clean one.</summary>
        private async Task<(Outcome, Exception?)> InTransactionAsync(Held h, HandlerConnection lease)
        {
            var token = h.Cancel.Token;
            DbTransaction? transaction = null;
            var keep = false;
            try
            {
                try
                {
                    var connection = await lease.OpenAsync(token).ConfigureAwait(false);
                    transaction = await connection.BeginTransactionAsync(token).ConfigureAwait(false);
                }
                catch (Exception e) when (e is not OutOfMemoryException)
                {
                    return Ended(h, new InvalidOperationException($"could not begin: {e.Message}", e), false);
                }
                try
                {
                    await _handler(h.Message, transaction, token).ConfigureAwait(false);
                }
                catch (Exception e) when (e is not OutOfMemoryException)
                {
                    await RollbackAsync(transaction).ConfigureAwait(false);
                    return Ended(h, e, true);
                }
                if (token.IsCancellationRequested)
                {
                    await RollbackAsync(transaction).ConfigureAwait(false);
                    return Ended(h, new OperationCanceledException(token), false);
                }
                bool completed;
                try
                {
                    completed = await _w._statements.CompleteAsync(transaction, h.Message, token).ConfigureAwait(false);
                    if (completed)
                    {
                        await transaction.CommitAsync(CancellationToken.None).ConfigureAwait(false);
                    }
                }
                catch (Exception e) when (e is not OutOfMemoryException)
                {
                    await RollbackAsync(transaction).ConfigureAwait(false);
                    return Ended(h, new InvalidOperationException($"the completion failed: {e.Message}", e), false);
                }
                if (!completed)
                {
                    await RollbackAsync(transaction).ConfigureAwait(false);
                    return (Outcome.Lost, null);
                }
                keep = true;
                return (Outcome.Completed, null);
            }
            finally
            {
                if (transaction is not null)
                {
                    await transaction.DisposeAsync().ConfigureAwait(false);
                }
                if (!keep)
                {
                    await lease.DisposeAsync().ConfigureAwait(false);
                }
            }
        }

        private static async Task RollbackAsync(DbTransaction transaction)
        {
            try
            {
                await transaction.RollbackAsync(CancellationToken.None).ConfigureAwait(false);
            }
            catch (Exception e) when (e is DbException or InvalidOperationException)
            {
                // a broken connection: the server rolls back when it goes
            }
        }

        /// <summary>Why a transaction ended early: the lease lost, the grace run out, or else the
        /// handler's failure (the policy decides) or the library's (left to the lease).</summary>
        private (Outcome, Exception?) Ended(Held h, Exception error, bool handlers)
        {
            if (h.Lost)
            {
                return (Outcome.Lost, error);
            }
            if (_hard.IsCancellationRequested)
            {
                return (Outcome.LeftToLease, new OperationCanceledException("the shutdown grace ran out", error));
            }
            return handlers ? (Outcome.Failed, error) : (Outcome.LeftToLease, error);
        }

        /// <summary>Asks the policy, then retries or dead-letters in a statement of its own.</summary>
        private async Task FailAsync(Held h, Exception failure)
        {
            var m = h.Message;
            InboxFailureAction action;
            try
            {
                action = O.RetryPolicy.Decide(m, failure);
            }
            catch (Exception e) when (e is not OutOfMemoryException)
            {
                _w._logger.LogError(e, "message {Id}: the retry policy threw; the default policy decides", m.Id);
                action = InboxRetryPolicy.Default.Decide(m, failure);
            }
            var text = string.IsNullOrEmpty(failure.Message) ? "the handler failed" : failure.Message;
            var what = action.IsDeadLetter ? "dead letter" : "retry";
            try
            {
                await using var connection = await _w._connections.DataSource.OpenConnectionAsync(CancellationToken.None).ConfigureAwait(false);
                var delay = (int)Math.Min(int.MaxValue, Math.Round(action.Delay.TotalMilliseconds));
                var changed = action.IsDeadLetter
                    ? await _w._statements.DeadAsync(connection, m, text).ConfigureAwait(false)
                    : await _w._statements.RetryAsync(connection, m, delay, text).ConfigureAwait(false);
                if (!changed)
                {
                    _w._logger.LogWarning("message {Id}: the {What} changed no row (the lease was lost)", m.Id, what);
                }
                else if (action.IsDeadLetter)
                {
                    _w._counts.Dead();
                    _w._logger.LogWarning(failure, "message {Id}: moved to dead: {Error}", m.Id, text);
                }
                else
                {
                    _w._counts.Retried();
                    // a warning, with the exception: a handler failing on every attempt is seen at once
                    _w._logger.LogWarning(failure, "message {Id}: failed ({Error}); retried after {Delay}", m.Id, text, action.Delay);
                }
            }
            catch (Exception e) when (e is not OutOfMemoryException)
            {
                _w._logger.LogError(e, "message {Id}: the {What} failed: {Error}; it comes back after its lease", m.Id, what, e.Message);
            }
        }
    }
}
