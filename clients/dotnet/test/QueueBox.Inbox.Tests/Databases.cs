// The databases the tests run on, from the environment: PostgreSQL 15 with
// the extension (QBI_TEST_PGHOST, QBI_TEST_PGPORT: TAP 039 starts the
// cluster) and SQL Server (QUEUEBOX_TEST_MSSQL_URL, its schema migrated by
// queuebox-mssqld when QBI_TEST_MSSQLD names it).  A test whose database is
// not given is skipped, saying why.
using System;
using System.Data.Common;
using System.Diagnostics;
using System.IO;
using System.Threading;
using Microsoft.Data.SqlClient;
using Npgsql;
using QueueBox.Inbox;
using Xunit;

[assembly: CollectionBehavior(DisableTestParallelization = true)]

namespace QueueBox.Inbox.Tests;

public static class Databases
{
    public static string? PostgreSqlConnectionString()
    {
        var host = Environment.GetEnvironmentVariable("QBI_TEST_PGHOST");
        if (string.IsNullOrEmpty(host))
        {
            return null;
        }
        return new NpgsqlConnectionStringBuilder
        {
            Host = host,
            Port = int.Parse(Environment.GetEnvironmentVariable("QBI_TEST_PGPORT") ?? "5432", System.Globalization.CultureInfo.InvariantCulture),
            Database = Environment.GetEnvironmentVariable("QBI_TEST_PGDATABASE") ?? "postgres",
            Username = Environment.GetEnvironmentVariable("QBI_TEST_PGUSER") ?? "postgres",
        }.ConnectionString;
    }

    public const string NoPostgreSql =
        "QBI_TEST_PGHOST and QBI_TEST_PGPORT are not set: no PostgreSQL to run against (TAP 039 starts one)";

    public const string NoSqlServer =
        "QUEUEBOX_TEST_MSSQL_URL is not set: no SQL Server to run against (set it to sqlserver://user:password@host:port/database?encrypt=false)";

    public static Backend PostgreSql() => new()
    {
        DataSource = NpgsqlDataSource.Create(PostgreSqlConnectionString()!),
        Dialect = InboxDialect.PostgreSql,
        Reset = "DELETE FROM queuebox.inbox WHERE {mine}; DROP TABLE IF EXISTS {biz}; CREATE TABLE {biz} (msg bigint, n int)",
        Expire = "UPDATE queuebox.inbox SET lease_until = now() - interval '1 second' WHERE {mine}",
        JsonCast = "CAST(@payload AS jsonb)",
        // scenario 2 fails if one renewal round is late by more than a lease: on
        // CI's two loaded cores 600 ms was once not enough
        Lease = 1500,
    };

    /// <summary>The project's URL (sqlserver://user:password@host:port/database?encrypt=false) as a
    /// SqlClient connection string.</summary>
    public static string? SqlServerConnectionString()
    {
        var raw = Environment.GetEnvironmentVariable("QUEUEBOX_TEST_MSSQL_URL");
        if (string.IsNullOrEmpty(raw))
        {
            return null;
        }
        var url = new Uri(raw);
        if (url.Scheme != "sqlserver")
        {
            throw new InvalidOperationException("QUEUEBOX_TEST_MSSQL_URL: not sqlserver://user:password@host:port/database");
        }
        var user = url.UserInfo.Split(':', 2);
        var builder = new SqlConnectionStringBuilder
        {
            DataSource = $"{url.Host},{(url.Port > 0 ? url.Port : 1433)}",
            InitialCatalog = url.AbsolutePath.Trim('/'),
            UserID = Uri.UnescapeDataString(user[0]),
            Password = user.Length > 1 ? Uri.UnescapeDataString(user[1]) : "",
            Encrypt = SqlConnectionEncryptOption.Optional,
            TrustServerCertificate = true,
            CommandTimeout = 60,
        };
        if (url.Query.Contains("encrypt=true", StringComparison.OrdinalIgnoreCase))
        {
            builder.Encrypt = SqlConnectionEncryptOption.Mandatory;
        }
        Migrate(raw);
        return builder.ConnectionString;
    }

    private static int _migrated;

    /// <summary>The schema, by queuebox-mssqld --migrate (idempotent), once, when QBI_TEST_MSSQLD names it.</summary>
    private static void Migrate(string url)
    {
        var daemon = Environment.GetEnvironmentVariable("QBI_TEST_MSSQLD");
        if (string.IsNullOrEmpty(daemon) || Interlocked.Exchange(ref _migrated, 1) == 1)
        {
            return;
        }
        var dir = Directory.CreateTempSubdirectory("qb-dotnet-mssql");
        try
        {
            var config = Path.Combine(dir.FullName, "migrate.yaml");
            File.WriteAllText(config, $"database:\n  url: \"{url.Replace("\\", "\\\\", StringComparison.Ordinal).Replace("\"", "\\\"", StringComparison.Ordinal)}\"\n");
            var start = new ProcessStartInfo(daemon, ["--config", config, "--migrate"])
            {
                RedirectStandardOutput = true,
                RedirectStandardError = true,
            };
            using var process = Process.Start(start)!;
            var output = process.StandardOutput.ReadToEnd() + process.StandardError.ReadToEnd();
            process.WaitForExit();
            // (a newer schema has the same five procedures: the tests run on it)
            if (process.ExitCode != 0 && !output.Contains("a newer daemon migrated it", StringComparison.Ordinal))
            {
                throw new InvalidOperationException($"{daemon} --migrate: exit {process.ExitCode}\n{output}");
            }
        }
        finally
        {
            dir.Delete(true);
        }
    }

    public static Backend SqlServer() => new()
    {
        DataSource = SqlClientFactory.Instance.CreateDataSource(SqlServerConnectionString()!),
        Dialect = InboxDialect.SqlServer,
        Reset = "DELETE FROM queuebox.inbox WHERE {mine}; IF OBJECT_ID(N'{biz}') IS NOT NULL DROP TABLE {biz};"
            + " CREATE TABLE {biz} (msg BIGINT, n INT)",
        Expire = "UPDATE queuebox.inbox SET lease_until = DATEADD(second, -1, SYSUTCDATETIME()) WHERE {mine}",
        JsonCast = "@payload",
        // a TDS engine can take seconds for a session's first call of a procedure
        Lease = 3000,
        Wait = TimeSpan.FromSeconds(60),
    };
}

/// <summary>A test that needs PostgreSQL: skipped, saying why, when none is given.</summary>
public sealed class PgFactAttribute : FactAttribute
{
    public PgFactAttribute()
    {
        if (Databases.PostgreSqlConnectionString() is null)
        {
            Skip = Databases.NoPostgreSql;
        }
    }
}

/// <summary>A test that needs SQL Server: skipped, saying why, when none is given.</summary>
public sealed class MssqlFactAttribute : FactAttribute
{
    public MssqlFactAttribute()
    {
        if (string.IsNullOrEmpty(Environment.GetEnvironmentVariable("QUEUEBOX_TEST_MSSQL_URL")))
        {
            Skip = Databases.NoSqlServer;
        }
    }
}

/// <summary>One backend per test class, its source emptied after the class.</summary>
public abstract class BackendFixture : IAsyncLifetime
{
    private Backend? _backend;

    public Backend Backend => _backend ?? throw new InvalidOperationException("no database given");

    protected abstract Backend? Make();

    public System.Threading.Tasks.Task InitializeAsync()
    {
        _backend = Make();
        return System.Threading.Tasks.Task.CompletedTask;
    }

    public async System.Threading.Tasks.Task DisposeAsync()
    {
        if (_backend is not null)
        {
            await _backend.Exec("DELETE FROM queuebox.inbox WHERE {mine}");
            await _backend.Exec(_backend.Dialect == InboxDialect.SqlServer
                ? "IF OBJECT_ID(N'{biz}') IS NOT NULL DROP TABLE {biz}"
                : "DROP TABLE IF EXISTS {biz}");
            await _backend.DataSource.DisposeAsync();
        }
    }
}

public sealed class PostgreSqlFixture : BackendFixture
{
    protected override Backend? Make() => Databases.PostgreSqlConnectionString() is null ? null : Databases.PostgreSql();
}

public sealed class SqlServerFixture : BackendFixture
{
    protected override Backend? Make() =>
        string.IsNullOrEmpty(Environment.GetEnvironmentVariable("QUEUEBOX_TEST_MSSQL_URL")) ? null : Databases.SqlServer();
}
