// The two helpers the spec's handler uses: a command in the handler's
// transaction, and a parameter added in one expression.
using System;
using System.Data.Common;

namespace QueueBox.Inbox;

/// <summary>Commands in the handler's transaction.</summary>
public static class InboxCommandExtensions
{
    /// <summary>A command on the transaction's connection, enlisted in the transaction.</summary>
    /// <param name="transaction">The handler's transaction.</param>
    /// <returns>The command; dispose it.</returns>
    public static DbCommand CreateCommand(this DbTransaction transaction)
    {
        ArgumentNullException.ThrowIfNull(transaction);
        var connection = transaction.Connection
            ?? throw new InvalidOperationException("the transaction has ended: it has no connection any more");
        var command = connection.CreateCommand();
        command.Transaction = transaction;
        return command;
    }

    /// <summary>Adds a parameter named <paramref name="name"/> with <paramref name="value"/> (null is
    /// DBNull). Write it in the command text as <c>@name</c>: SQL Server binds it so, and Npgsql
    /// rewrites named <c>@name</c> placeholders to its own.</summary>
    /// <param name="command">The command.</param>
    /// <param name="name">The parameter's name, with or without the <c>@</c>.</param>
    /// <param name="value">Its value.</param>
    /// <returns>The command, for the next call.</returns>
    public static DbCommand WithParameter(this DbCommand command, string name, object? value)
    {
        ArgumentNullException.ThrowIfNull(command);
        ArgumentException.ThrowIfNullOrEmpty(name);
        var parameter = command.CreateParameter();
        parameter.ParameterName = name;
        parameter.Value = value ?? DBNull.Value;
        command.Parameters.Add(parameter);
        return command;
    }
}
