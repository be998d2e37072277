// InboxConnections: where a worker gets its connections (the application's
// data source: a pool) and which dialect they speak.
using System;
using System.Data.Common;
using Microsoft.Data.SqlClient;
using Npgsql;

namespace QueueBox.Inbox;

/// <summary>The connections of a worker: the application's <see cref="DbDataSource"/>. The worker
/// needs up to MaxConcurrency + 2 of its connections at once (one per running handler, the claim,
/// the lease renewal).</summary>
public sealed class InboxConnections
{
    private InboxConnections(DbDataSource dataSource, InboxDialect dialect)
    {
        DataSource = dataSource;
        Dialect = dialect;
    }

    /// <summary>The data source the worker opens its connections from.</summary>
    public DbDataSource DataSource { get; }

    /// <summary>The dialect the data source's type tells, or <see cref="InboxDialect.Detect"/> when it
    /// tells none (then <see cref="InboxOptions.Dialect"/> must say it).</summary>
    public InboxDialect Dialect { get; }

    /// <summary>The connections of <paramref name="dataSource"/>: an <c>NpgsqlDataSource</c> for
    /// PostgreSQL, or for SQL Server <c>SqlClientFactory.Instance.CreateDataSource(connectionString)</c>.</summary>
    /// <param name="dataSource">The application's data source.</param>
    /// <returns>The connections.</returns>
    public static InboxConnections From(DbDataSource dataSource)
    {
        ArgumentNullException.ThrowIfNull(dataSource);
        return new InboxConnections(dataSource, Detect(dataSource));
    }

    /// <summary>A SQL Server data source on <paramref name="connectionString"/> (Microsoft.Data.SqlClient).</summary>
    /// <param name="connectionString">The SqlClient connection string.</param>
    /// <returns>The connections.</returns>
    public static InboxConnections FromSqlServer(string connectionString)
    {
        ArgumentException.ThrowIfNullOrEmpty(connectionString);
        return new InboxConnections(SqlClientFactory.Instance.CreateDataSource(connectionString), InboxDialect.SqlServer);
    }

    private static InboxDialect Detect(DbDataSource dataSource)
    {
        if (dataSource is NpgsqlDataSource)
        {
            return InboxDialect.PostgreSql;
        }
        // DbProviderFactory.CreateDataSource's data source: the connection tells
        using var connection = dataSource.CreateConnection();
        return connection switch
        {
            NpgsqlConnection => InboxDialect.PostgreSql,
            SqlConnection => InboxDialect.SqlServer,
            _ => InboxDialect.Detect,
        };
    }
}
