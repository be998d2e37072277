// The five statements of examples/pull/sql in one dialect: PostgreSQL's
// functions with positional parameters, SQL Server's procedures with named
// ones; how a claim's row is read; and what counts as Msg 51000.
using System;
using System.Collections.Generic;
using System.Data;
using System.Data.Common;
using System.Threading;
using System.Threading.Tasks;
using Microsoft.Data.SqlClient;

namespace QueueBox.Inbox;

/// <summary>The five statements as one dialect sends them.</summary>
internal sealed class InboxStatements
{
    private readonly bool _sqlServer;
    private readonly int _timeoutSeconds;

    internal InboxStatements(InboxDialect dialect, TimeSpan commandTimeout)
    {
        _sqlServer = dialect == InboxDialect.SqlServer;
        _timeoutSeconds = (int)Math.Ceiling(commandTimeout.TotalSeconds);
    }

    /// <summary>Claims up to <paramref name="batchSize"/> messages in a transaction of its own,
    /// committed before it returns. Never cancelled: a stop lets a claim under way finish, and what
    /// it took is left to its lease.</summary>
    internal async Task<List<InboxMessage>> ClaimAsync(DbDataSource dataSource, string source, int batchSize, int leaseMs)
    {
        await using var connection = await dataSource.OpenConnectionAsync(CancellationToken.None).ConfigureAwait(false);
        await using var transaction = await connection.BeginTransactionAsync(CancellationToken.None).ConfigureAwait(false);
        var messages = new List<InboxMessage>(batchSize);
        await using (var command = Command(connection, transaction, _sqlServer
            ? "queuebox.inbox_claim"
            : "SELECT id, claim_token, source, idempotency_key, event_type, aggregate_id, payload, headers, attempt, created_at"
              + " FROM queuebox.inbox_claim($1, $2, $3)",
            ("@source", source), ("@batch_size", batchSize), ("@lease_ms", leaseMs)))
        {
            if (!_sqlServer)
            {
                await command.PrepareAsync(CancellationToken.None).ConfigureAwait(false);
            }
            await using var reader = await command.ExecuteReaderAsync(CancellationToken.None).ConfigureAwait(false);
            while (await reader.ReadAsync(CancellationToken.None).ConfigureAwait(false))
            {
                messages.Add(Read(reader));
            }
        }
        await transaction.CommitAsync(CancellationToken.None).ConfigureAwait(false);
        return messages;
    }

    private static InboxMessage Read(DbDataReader reader)
    {
        var id = reader.GetInt64(0);
        var created = reader.GetValue(9) switch
        {
            DateTimeOffset offset => offset,
            // PostgreSQL's timestamptz comes as UTC; SQL Server's created_at is UTC by the schema
            DateTime time => new DateTimeOffset(DateTime.SpecifyKind(time, DateTimeKind.Utc)),
            var other => throw new InvalidOperationException($"message {id}: created_at is a {other.GetType()}"),
        };
        try
        {
            return new InboxMessage(
                id,
                reader.GetGuid(1),
                reader.GetString(2),
                reader.GetString(3),
                reader.IsDBNull(4) ? null : reader.GetString(4),
                reader.IsDBNull(5) ? null : reader.GetString(5),
                InboxMessage.ParsePayload(reader.GetString(6)),
                InboxMessage.ParseHeaders(reader.IsDBNull(7) ? null : reader.GetString(7)),
                reader.GetInt32(8),
                created);
        }
        catch (System.Text.Json.JsonException e)
        {
            throw new InvalidOperationException($"message {id}: its payload or headers are not JSON: {e.Message}", e);
        }
    }

    /// <summary>The completion, in the handler's transaction: whether it changed a row.</summary>
    internal async Task<bool> CompleteAsync(DbTransaction transaction, InboxMessage message, CancellationToken cancellationToken)
    {
        await using var command = Command(transaction.Connection!, transaction, _sqlServer
            ? "queuebox.inbox_complete"
            : "SELECT queuebox.inbox_complete($1, $2)",
            ("@id", message.Id), ("@claim_token", message.ClaimToken));
        if (!_sqlServer)
        {
            // kept prepared on each physical connection: one round trip, not two
            await command.PrepareAsync(cancellationToken).ConfigureAwait(false);
        }
        return Flag(await command.ExecuteScalarAsync(cancellationToken).ConfigureAwait(false));
    }

    /// <summary>A renewal on <paramref name="connection"/> (no transaction): whether this claim still holds.</summary>
    internal Task<bool> RenewAsync(DbConnection connection, InboxMessage message, int leaseMs) =>
        FlagAsync(connection, _sqlServer ? "queuebox.inbox_renew" : "SELECT queuebox.inbox_renew($1, $2, $3)",
            ("@id", message.Id), ("@claim_token", message.ClaimToken), ("@lease_ms", leaseMs));

    /// <summary>A retry in a statement of its own: whether it changed a row.</summary>
    internal Task<bool> RetryAsync(DbConnection connection, InboxMessage message, int delayMs, string error) =>
        FlagAsync(connection, _sqlServer ? "queuebox.inbox_retry" : "SELECT queuebox.inbox_retry($1, $2, $3, $4)",
            ("@id", message.Id), ("@claim_token", message.ClaimToken), ("@delay_ms", delayMs), ("@error", error));

    /// <summary>A dead letter in a statement of its own: whether it changed a row.</summary>
    internal Task<bool> DeadAsync(DbConnection connection, InboxMessage message, string error) =>
        FlagAsync(connection, _sqlServer ? "queuebox.inbox_dead" : "SELECT queuebox.inbox_dead($1, $2, $3)",
            ("@id", message.Id), ("@claim_token", message.ClaimToken), ("@error", error));

    private async Task<bool> FlagAsync(DbConnection connection, string text, params (string Name, object Value)[] parameters)
    {
        await using var command = Command(connection, null, text, parameters);
        return Flag(await command.ExecuteScalarAsync(CancellationToken.None).ConfigureAwait(false));
    }

    private static bool Flag(object? value) => value switch
    {
        bool b => b,
        null or DBNull => false,
        var other => Convert.ToInt64(other, System.Globalization.CultureInfo.InvariantCulture) != 0,
    };

    private DbCommand Command(DbConnection connection, DbTransaction? transaction, string text,
        params (string Name, object Value)[] parameters)
    {
        var command = connection.CreateCommand();
        command.Transaction = transaction;
        command.CommandText = text;
        command.CommandTimeout = _timeoutSeconds;
        if (_sqlServer)
        {
            command.CommandType = CommandType.StoredProcedure;
        }
        foreach (var (name, value) in parameters)
        {
            var parameter = command.CreateParameter();
            // PostgreSQL: positional ($1, $2, ...), so no name
            if (_sqlServer)
            {
                parameter.ParameterName = name;
            }
            parameter.Value = value;
            command.Parameters.Add(parameter);
        }
        return command;
    }

    /// <summary>Msg 51000 from the SQL Server claim: another claim of the source held its
    /// application lock for 10 s, a temporary failure.</summary>
    internal static bool IsClaimLockTimeout(Exception failure)
    {
        for (var e = (Exception?)failure; e is not null; e = e.InnerException)
        {
            if (e is SqlException sql)
            {
                foreach (SqlError error in sql.Errors)
                {
                    if (error.Number == 51000)
                    {
                        return true;
                    }
                }
            }
            // an engine that numbers its errors otherwise: the procedure's own words
            if (e.Message.Contains("another claim of this source held its lock", StringComparison.Ordinal))
            {
                return true;
            }
        }
        return false;
    }
}
