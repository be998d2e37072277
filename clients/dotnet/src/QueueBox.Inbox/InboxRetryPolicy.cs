// What a failed message does: the policy's answer (a retry after a delay or
// a dead letter), the interface an application implements, and the default.
using System;

namespace QueueBox.Inbox;

/// <summary>A retry policy's answer for a failed message:
/// <see cref="Retry(TimeSpan)"/> or <see cref="DeadLetter"/>.</summary>
public readonly struct InboxFailureAction : IEquatable<InboxFailureAction>
{
    private InboxFailureAction(bool isDeadLetter, TimeSpan delay)
    {
        IsDeadLetter = isDeadLetter;
        Delay = delay;
    }

    /// <summary>True for a dead letter.</summary>
    public bool IsDeadLetter { get; }

    /// <summary>The retry's delay (zero for a dead letter).</summary>
    public TimeSpan Delay { get; }

    /// <summary>Gives the message back for another attempt, due after <paramref name="delay"/>
    /// (a negative delay is zero); its attempt goes up by one.</summary>
    /// <param name="delay">How long the message waits before the next claim may take it.</param>
    /// <returns>The action.</returns>
    public static InboxFailureAction Retry(TimeSpan delay) =>
        new(false, delay < TimeSpan.Zero ? TimeSpan.Zero : delay);

    /// <summary>Moves the message to dead: no worker claims it again until an operator requeues it.</summary>
    /// <returns>The action.</returns>
    public static InboxFailureAction DeadLetter() => new(true, TimeSpan.Zero);

    /// <inheritdoc />
    public bool Equals(InboxFailureAction other) => IsDeadLetter == other.IsDeadLetter && Delay == other.Delay;

    /// <inheritdoc />
    public override bool Equals(object? obj) => obj is InboxFailureAction other && Equals(other);

    /// <inheritdoc />
    public override int GetHashCode() => HashCode.Combine(IsDeadLetter, Delay);

    /// <summary>Compares two actions.</summary>
    /// <param name="left">One action.</param>
    /// <param name="right">The other.</param>
    /// <returns>Whether they are the same.</returns>
    public static bool operator ==(InboxFailureAction left, InboxFailureAction right) => left.Equals(right);

    /// <summary>Compares two actions.</summary>
    /// <param name="left">One action.</param>
    /// <param name="right">The other.</param>
    /// <returns>Whether they differ.</returns>
    public static bool operator !=(InboxFailureAction left, InboxFailureAction right) => !left.Equals(right);

    /// <inheritdoc />
    public override string ToString() => IsDeadLetter ? "dead letter" : $"retry after {Delay}";
}

/// <summary>Decides what a failure does.</summary>
public interface IInboxRetryPolicy
{
    /// <summary>The action for a failed message. <see cref="InboxMessage.Attempt"/> counts the
    /// attempts before this one; <paramref name="failure"/> is what the handler threw.</summary>
    /// <param name="message">The message that failed.</param>
    /// <param name="failure">The handler's exception.</param>
    /// <returns>A retry or a dead letter.</returns>
    InboxFailureAction Decide(InboxMessage message, Exception failure);
}

/// <summary>The default policy: an exponential backoff from 1 s (1 s × 2^attempt, at most
/// 5 minutes) with ±20 % jitter, and dead on the fifth attempt.</summary>
public sealed class InboxRetryPolicy : IInboxRetryPolicy
{
    /// <summary>The default policy.</summary>
    public static IInboxRetryPolicy Default { get; } = new InboxRetryPolicy();

    private InboxRetryPolicy()
    {
    }

    /// <inheritdoc />
    public InboxFailureAction Decide(InboxMessage message, Exception failure)
    {
        ArgumentNullException.ThrowIfNull(message);
        return Backoff(message.Attempt, Random.Shared.NextDouble());
    }

    /// <summary>The default's answer for an attempt and a draw from [0, 1).</summary>
    internal static InboxFailureAction Backoff(int attempt, double draw)
    {
        if (attempt + 1 >= 5)
        {
            return InboxFailureAction.DeadLetter();
        }
        var limit = TimeSpan.FromMinutes(5);
        var basis = TimeSpan.FromSeconds(1);
        for (var i = 0; i < attempt && basis < limit; i++)
        {
            basis *= 2;
        }
        if (basis > limit)
        {
            basis = limit;
        }
        // ±20 %: a burst of failures does not come back as one burst
        return InboxFailureAction.Retry(basis * (0.8 + (0.4 * draw)));
    }
}
