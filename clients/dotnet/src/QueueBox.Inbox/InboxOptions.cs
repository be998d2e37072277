// InboxOptions: what a worker consumes and how; Validate checks them once,
// at construction, naming the option that is wrong and what it may be.
using System;

namespace QueueBox.Inbox;

/// <summary>The database a worker talks to.</summary>
public enum InboxDialect
{
    /// <summary>Taken from the data source's connection type: Npgsql is PostgreSQL,
    /// Microsoft.Data.SqlClient is SQL Server.</summary>
    Detect = 0,

    /// <summary>PostgreSQL with the queuebox extension: its five functions.</summary>
    PostgreSql = 1,

    /// <summary>SQL Server with the schema of queuebox-mssqld: its five procedures.</summary>
    SqlServer = 2,
}

/// <summary>Configures an <see cref="InboxWorker"/>. <see cref="Source"/> is required.</summary>
public sealed class InboxOptions
{
    /// <summary>The pull source to consume (required).</summary>
    public string Source { get; set; } = "";

    /// <summary>How many messages one claim takes (default 10, 1 to 10000). With
    /// <see cref="MaxConcurrency"/> above 1 a claim takes no more than the handlers free to start them.</summary>
    public int BatchSize { get; set; } = 10;

    /// <summary>The lease of a claimed message in milliseconds (default 30000, 100 to 86400000);
    /// the worker renews it every third of it.</summary>
    public int LeaseMs { get; set; } = 30_000;

    /// <summary>How many handlers run at once (default 1, at most 256). Never two messages of
    /// one aggregate: the claim gives one open message per (source, aggregate).</summary>
    public int MaxConcurrency { get; set; } = 1;

    /// <summary>How long running handlers may go on after the stop (default 30 s; zero: none).
    /// Past it their tokens are cancelled, nothing is completed and no attempt is spent: the
    /// lease expires and another worker takes the message.</summary>
    public TimeSpan ShutdownGrace { get; set; } = TimeSpan.FromSeconds(30);

    /// <summary>The wait after a claim that found nothing or failed (default 500 ms).</summary>
    public TimeSpan PollInterval { get; set; } = TimeSpan.FromMilliseconds(500);

    /// <summary>The command timeout of the worker's own statements (claim, renew, complete,
    /// retry, dead); default 60 s, at least 30 s: the SQL Server claim waits up to 10 s for its
    /// lock, and a call aborted earlier leaves the lock held until the connection resets.</summary>
    public TimeSpan CommandTimeout { get; set; } = TimeSpan.FromSeconds(60);

    /// <summary>Decides what a failed message does (default <see cref="InboxRetryPolicy.Default"/>).</summary>
    public IInboxRetryPolicy RetryPolicy { get; set; } = InboxRetryPolicy.Default;

    /// <summary>PostgreSQL or SQL Server (default: from the data source).</summary>
    public InboxDialect Dialect { get; set; } = InboxDialect.Detect;

    /// <summary>A copy, so a worker's options do not change under it.</summary>
    internal InboxOptions Copy() => (InboxOptions)MemberwiseClone();

    /// <summary>Throws an <see cref="ArgumentException"/> naming the first option out of range.</summary>
    internal void Validate()
    {
        if (string.IsNullOrEmpty(Source))
        {
            throw new ArgumentException("InboxOptions.Source (the pull source to consume) is required", nameof(Source));
        }
        Range(nameof(BatchSize), BatchSize, 1, 10_000, 10);
        Range(nameof(LeaseMs), LeaseMs, 100, 86_400_000, 30_000);
        Range(nameof(MaxConcurrency), MaxConcurrency, 1, 256, 1);
        if (ShutdownGrace < TimeSpan.Zero)
        {
            throw new ArgumentException($"InboxOptions.ShutdownGrace must not be negative, got {ShutdownGrace}", nameof(ShutdownGrace));
        }
        if (PollInterval < TimeSpan.Zero)
        {
            throw new ArgumentException($"InboxOptions.PollInterval must not be negative, got {PollInterval}", nameof(PollInterval));
        }
        if (CommandTimeout < TimeSpan.FromSeconds(30))
        {
            throw new ArgumentException(
                $"InboxOptions.CommandTimeout is {CommandTimeout}, the command timeout of the worker's own statements; "
                + "it must be at least 30 s: the SQL Server claim waits up to 10 s for its lock, and a call aborted "
                + "earlier leaves the lock held until the connection resets. Set InboxOptions.CommandTimeout to 30 s or more "
                + "(the default is 60 s)", nameof(CommandTimeout));
        }
        if (RetryPolicy is null)
        {
            throw new ArgumentException("InboxOptions.RetryPolicy must not be null (leave it for InboxRetryPolicy.Default)", nameof(RetryPolicy));
        }
        if (!Enum.IsDefined(Dialect))
        {
            throw new ArgumentException($"InboxOptions.Dialect is {Dialect}: use InboxDialect.PostgreSql or InboxDialect.SqlServer", nameof(Dialect));
        }
    }

    private static void Range(string name, int value, int min, int max, int standard)
    {
        if (value < min || value > max)
        {
            throw new ArgumentException($"InboxOptions.{name} must be from {min} to {max} (default {standard}), got {value}", name);
        }
    }
}
