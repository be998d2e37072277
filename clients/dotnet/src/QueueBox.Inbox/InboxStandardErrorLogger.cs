// The logger of a worker made without one: warnings and errors on standard
// error.  A handler that fails on every attempt must not be silent (its
// only trace would be last_error in the table); pass NullLogger.Instance
// to the worker for no output at all.
using System;
using Microsoft.Extensions.Logging;

namespace QueueBox.Inbox;

/// <summary>Warnings and errors to <see cref="Console.Error"/>, one entry per write (entries of
/// handlers running at once do not interleave), under the category the generic host would give.</summary>
internal sealed class InboxStandardErrorLogger(string source) : ILogger
{
    private readonly string _category = "QueueBox.Inbox." + source;

    public IDisposable? BeginScope<TState>(TState state) where TState : notnull => null;

    public bool IsEnabled(LogLevel logLevel) => logLevel is >= LogLevel.Warning and < LogLevel.None;

    public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception,
        Func<TState, Exception?, string> formatter)
    {
        if (!IsEnabled(logLevel))
        {
            return;
        }
        ArgumentNullException.ThrowIfNull(formatter);
        var level = logLevel switch
        {
            LogLevel.Warning => "warn",
            LogLevel.Error => "fail",
            _ => "crit",
        };
        var entry = $"{level}: {_category}: {formatter(state, exception)}";
        if (exception is not null)
        {
            // the stack says where the handler threw
            entry += Environment.NewLine + exception;
        }
        // read each time: an application may redirect standard error after making the worker
        Console.Error.WriteLine(entry);
    }
}
