// OutboxTransactionExtensions: the outbox rows of OutboxMessage written on
// the application's DbTransaction (Npgsql or Microsoft.Data.SqlClient), so
// they commit and roll back with its business writes.
//
// Vocabulary: a statement is one multi-row INSERT; a batch is every
// message of one call.  A batch of up to RowsPerStatement rows is one
// statement, one round trip; a larger one is one statement per chunk, all
// in one DbBatch (one round trip) where the provider has DbBatch.  The
// limit is the parameters of a statement: 2100 on SQL Server, 65535 on
// PostgreSQL, seven per row.  scheduled_at without a not-before time is
// the server's now, as the column's default: a client clock never delays
// a row.
using System;
using System.Collections.Generic;
using System.Data;
using System.Data.Common;
using System.Globalization;
using System.Text;
using System.Text.Json;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.Data.SqlClient;
using Npgsql;

namespace QueueBox.Inbox;

/// <summary>Enqueue outbox messages in the application's transaction.</summary>
public static class OutboxTransactionExtensions
{
    private const int Columns = 7;

    /// <summary>Writes one message into <c>queuebox.outbox</c> in <paramref name="transaction"/>: it is
    /// delivered once the transaction commits, and never if it rolls back.</summary>
    /// <typeparam name="TPayload">The payload's type (serialized by System.Text.Json).</typeparam>
    /// <param name="transaction">The application's transaction (Npgsql or SqlClient).</param>
    /// <param name="topic">The topic the routes match.</param>
    /// <param name="payload">The payload.</param>
    /// <param name="key">The ordering key, or null.</param>
    /// <param name="headers">Headers for the row; the trace context is added unless they carry a
    /// <c>traceparent</c> (<see cref="OutboxMessage.Create{TPayload}"/>).</param>
    /// <param name="notBefore">Not delivered before this time, or null.</param>
    /// <param name="cancellationToken">Cancels the statement.</param>
    /// <returns>The row's <c>message_id</c>.</returns>
    public static async Task<Guid> EnqueueAsync<TPayload>(this DbTransaction transaction, string topic, TPayload payload,
        string? key = null, IReadOnlyDictionary<string, string>? headers = null, DateTimeOffset? notBefore = null,
        CancellationToken cancellationToken = default)
    {
        var message = OutboxMessage.Create(topic, payload, key, headers, notBefore);
        await WriteAsync(transaction, [message], async: true, cancellationToken).ConfigureAwait(false);
        return message.MessageId;
    }

    /// <summary>Writes <paramref name="messages"/> into <c>queuebox.outbox</c> in <paramref name="transaction"/>,
    /// in their order (their ids ascend so), in one round trip.</summary>
    /// <param name="transaction">The application's transaction (Npgsql or SqlClient).</param>
    /// <param name="messages">The messages (<see cref="OutboxMessage.Create{TPayload}"/>).</param>
    /// <param name="cancellationToken">Cancels the statement.</param>
    /// <returns>A task that completes when the rows are written.</returns>
    public static Task EnqueueBatchAsync(this DbTransaction transaction, IEnumerable<OutboxMessage> messages,
        CancellationToken cancellationToken = default)
    {
        ArgumentNullException.ThrowIfNull(messages);
        return WriteAsync(transaction, [.. messages], async: true, cancellationToken).AsTask();
    }

    /// <summary>The synchronous <see cref="EnqueueBatchAsync"/>.</summary>
    /// <param name="transaction">The application's transaction (Npgsql or SqlClient).</param>
    /// <param name="messages">The messages.</param>
    public static void EnqueueBatch(this DbTransaction transaction, IEnumerable<OutboxMessage> messages)
    {
        ArgumentNullException.ThrowIfNull(messages);
        // synchronous all the way down (the commands' sync calls): the task has completed
        WriteAsync(transaction, [.. messages], async: false, CancellationToken.None).AsTask().GetAwaiter().GetResult();
    }

    /// <summary>The rows of one statement at most, for the dialect.</summary>
    internal static int RowsPerStatement(InboxDialect dialect) => dialect == InboxDialect.SqlServer ? 250 : 5000;

    internal static async ValueTask WriteAsync(DbTransaction transaction, IReadOnlyList<OutboxMessage> messages, bool async,
        CancellationToken cancellationToken)
    {
        ArgumentNullException.ThrowIfNull(transaction);
        if (messages.Count == 0)
        {
            return;
        }
        var connection = transaction.Connection
            ?? throw new InvalidOperationException("the transaction has ended: it has no connection any more");
        var dialect = connection switch
        {
            NpgsqlConnection => InboxDialect.PostgreSql,
            SqlConnection => InboxDialect.SqlServer,
            _ => throw new ArgumentException($"a transaction of {connection.GetType()}: the outbox is written through Npgsql or Microsoft.Data.SqlClient",
                nameof(transaction)),
        };
        if (dialect == InboxDialect.SqlServer)
        {
            CheckSqlServerLengths(messages);
        }
        var per = RowsPerStatement(dialect);
        if (messages.Count <= per || !connection.CanCreateBatch)
        {
            for (var start = 0; start < messages.Count; start += per)
            {
                await using var command = connection.CreateCommand();
                command.Transaction = transaction;
                command.CommandText = Insert(dialect, Math.Min(per, messages.Count - start));
                Fill(command.Parameters, command.CreateParameter, dialect, messages, start);
                _ = async ? await command.ExecuteNonQueryAsync(cancellationToken).ConfigureAwait(false) : command.ExecuteNonQuery();
            }
            return;
        }
        await using var batch = connection.CreateBatch();
        batch.Transaction = transaction;
        for (var start = 0; start < messages.Count; start += per)
        {
            var command = batch.CreateBatchCommand();
            command.CommandText = Insert(dialect, Math.Min(per, messages.Count - start));
            Fill(command.Parameters, command.CreateParameter, dialect, messages, start);
            batch.BatchCommands.Add(command);
        }
        _ = async ? await batch.ExecuteNonQueryAsync(cancellationToken).ConfigureAwait(false) : batch.ExecuteNonQuery();
    }

    /// <summary>SQL Server's topic and key hold 400 characters: a longer one is refused before anything is sent,
    /// naming the message, rather than by the server in the middle of a batch.</summary>
    private static void CheckSqlServerLengths(IReadOnlyList<OutboxMessage> messages)
    {
        for (var i = 0; i < messages.Count; i++)
        {
            var m = messages[i] ?? throw new ArgumentException("a message of the batch is null", nameof(messages));
            foreach (var (what, value) in new[] { ("topic", m.Topic), ("key", m.Key) })
            {
                if (value is { Length: > 400 })
                {
                    throw new ArgumentException(string.Create(CultureInfo.InvariantCulture,
                        $"message {i} of the batch: its {what} is {value.Length} characters, and SQL Server's queuebox.outbox holds at most 400; nothing was written"),
                        nameof(messages));
                }
            }
        }
    }

    /// <summary>INSERT ... VALUES with <paramref name="rows"/> rows of parameters: $n on PostgreSQL (Npgsql's
    /// own placeholders, which its batches need), @pn on SQL Server.  No SET XACT_ABORT: it would outlive the
    /// call on the application's connection and change how its later statements fail (EF Core's savepoints
    /// among them); after a failed call the application rolls back.</summary>
    internal static string Insert(InboxDialect dialect, int rows)
    {
        var sql = new StringBuilder(dialect == InboxDialect.SqlServer
            ? "INSERT INTO queuebox.outbox (message_id, topic, [key], payload, headers, scheduled_at, max_attempts) VALUES "
            : "INSERT INTO queuebox.outbox (message_id, topic, key, payload, headers, scheduled_at, max_attempts) VALUES ");
        for (var r = 0; r < rows; r++)
        {
            var p = new string[Columns];
            for (var c = 0; c < Columns; c++)
            {
                p[c] = dialect == InboxDialect.SqlServer
                    ? string.Create(CultureInfo.InvariantCulture, $"@p{r * Columns + c}")
                    : string.Create(CultureInfo.InvariantCulture, $"${r * Columns + c + 1}");
            }
            sql.Append(r == 0 ? "(" : ", (");
            sql.Append(dialect == InboxDialect.SqlServer
                ? $"{p[0]}, {p[1]}, {p[2]}, {p[3]}, {p[4]}, COALESCE({p[5]}, SYSUTCDATETIME()), {p[6]})"
                : $"{p[0]}, {p[1]}, {p[2]}, CAST({p[3]} AS jsonb), CAST({p[4]} AS jsonb), COALESCE({p[5]}, now()), {p[6]})");
        }
        return sql.ToString();
    }

    private static void Fill(DbParameterCollection parameters, Func<DbParameter> create, InboxDialect dialect,
        IReadOnlyList<OutboxMessage> messages, int start)
    {
        var rows = Math.Min(RowsPerStatement(dialect), messages.Count - start);
        for (var r = 0; r < rows; r++)
        {
            var m = messages[start + r] ?? throw new ArgumentException("a message of the batch is null", nameof(messages));
            var n = r * Columns;
            Add(parameters, create, dialect, n, DbType.Guid, m.MessageId);
            Add(parameters, create, dialect, n + 1, DbType.String, m.Topic);
            Add(parameters, create, dialect, n + 2, DbType.String, m.Key);
            Add(parameters, create, dialect, n + 3, DbType.String, m.Payload);
            Add(parameters, create, dialect, n + 4, DbType.String, JsonSerializer.Serialize(m.Headers));
            // scheduled_at, in whole microseconds (both columns' precision) rounded up, so neither store's own
            // rounding makes a row due before its time: timestamptz takes a UTC instant; SQL Server's DATETIME2
            // holds UTC without an offset
            DateTime? due = m.NotBefore is { } t ? new DateTime((t.UtcTicks + 9) / 10 * 10, DateTimeKind.Utc) : null;
            if (dialect == InboxDialect.SqlServer)
            {
                Add(parameters, create, dialect, n + 5, DbType.DateTime2, due);
            }
            else
            {
                Add(parameters, create, dialect, n + 5, DbType.DateTimeOffset, due is { } d ? new DateTimeOffset(d) : null);
            }
            Add(parameters, create, dialect, n + 6, DbType.Int32, m.MaxAttempts);
        }
    }

    private static void Add(DbParameterCollection parameters, Func<DbParameter> create, InboxDialect dialect, int n,
        DbType type, object? value)
    {
        var parameter = create();
        if (dialect == InboxDialect.SqlServer)
        {
            parameter.ParameterName = string.Create(CultureInfo.InvariantCulture, $"@p{n}");
        }
        parameter.DbType = type;
        parameter.Value = value ?? DBNull.Value;
        parameters.Add(parameter);
    }
}
