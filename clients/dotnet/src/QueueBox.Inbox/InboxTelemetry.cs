// The worker's counters (what InboxWorker.Counters returns) and their
// System.Diagnostics twins: the meter "QueueBox.Inbox" and an activity
// source of the same name, one span per handled message, the child of the
// trace context the message arrived with.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Diagnostics.Metrics;
using System.Threading;

namespace QueueBox.Inbox;

/// <summary>What a worker did since it was made.</summary>
/// <param name="Claimed">Messages claimed.</param>
/// <param name="Completed">Messages completed (their transaction committed).</param>
/// <param name="Retried">Failed messages given back for another attempt.</param>
/// <param name="Dead">Failed messages moved to dead.</param>
/// <param name="LeaseLost">Messages whose lease another worker took: their writes rolled back.</param>
public readonly record struct InboxCounters(long Claimed, long Completed, long Retried, long Dead, long LeaseLost);

/// <summary>The names under which the library reports through System.Diagnostics.</summary>
public static class InboxTelemetry
{
    /// <summary>The meter's and the activity source's name.</summary>
    public const string Name = "QueueBox.Inbox";

    internal static readonly ActivitySource Activities = new(Name, "0.1.0");
    private static readonly Meter Meter = new(Name, "0.1.0");
    private static readonly Counter<long> ClaimedCounter = Meter.CreateCounter<long>("queuebox.inbox.claimed", "{message}", "Messages claimed");
    private static readonly Counter<long> CompletedCounter = Meter.CreateCounter<long>("queuebox.inbox.completed", "{message}", "Messages completed");
    private static readonly Counter<long> RetriedCounter = Meter.CreateCounter<long>("queuebox.inbox.retried", "{message}", "Failed messages retried");
    private static readonly Counter<long> DeadCounter = Meter.CreateCounter<long>("queuebox.inbox.dead", "{message}", "Failed messages moved to dead");
    private static readonly Counter<long> LeaseLostCounter = Meter.CreateCounter<long>("queuebox.inbox.lease_lost", "{message}", "Messages whose lease was lost");

    /// <summary>
    /// The trace context a message arrived with: its <c>traceparent</c> header (any letter
    /// case) and <c>tracestate</c>, as QueueBox stores them (docs/observability.md); false
    /// when it has none or the spec says to ignore it.
    /// </summary>
    public static bool TryGetParent(InboxMessage message, out ActivityContext parent)
    {
        string? traceparent = null, tracestate = null;
        foreach (var (name, value) in message.Headers)
        {
            if (string.Equals(name, "traceparent", StringComparison.OrdinalIgnoreCase))
            {
                traceparent = value;
            }
            else if (string.Equals(name, "tracestate", StringComparison.OrdinalIgnoreCase))
            {
                tracestate = value;
            }
        }
        parent = default;
        return traceparent is not null && ActivityContext.TryParse(traceparent, tracestate, isRemote: true, out parent);
    }

    /// <summary>One worker's counts, added to the meter as they change.</summary>
    internal sealed class Counts
    {
        private readonly KeyValuePair<string, object?> _source;
        private long _claimed, _completed, _retried, _dead, _leaseLost;

        internal Counts(string source) => _source = new("queuebox.source", source);

        internal void Claimed(int n) => Add(ref _claimed, ClaimedCounter, n);

        internal void Completed() => Add(ref _completed, CompletedCounter, 1);

        internal void Retried() => Add(ref _retried, RetriedCounter, 1);

        internal void Dead() => Add(ref _dead, DeadCounter, 1);

        internal void LeaseLost() => Add(ref _leaseLost, LeaseLostCounter, 1);

        private void Add(ref long count, Counter<long> instrument, int n)
        {
            Interlocked.Add(ref count, n);
            instrument.Add(n, _source);
        }

        internal InboxCounters Snapshot() => new(Interlocked.Read(ref _claimed), Interlocked.Read(ref _completed),
            Interlocked.Read(ref _retried), Interlocked.Read(ref _dead), Interlocked.Read(ref _leaseLost));
    }
}
