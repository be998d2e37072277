// The test database of the SQL Server dialect's tests (mssql.test.js, process-worker.js).

/** An mssql config from sqlserver://user:password@host:port/database?encrypt=false. */
export function mssqlConfig(text = process.env.QUEUEBOX_TEST_MSSQL_URL) {
  const u = new URL(text);
  if (u.protocol !== 'sqlserver:' || !u.pathname.slice(1))
    throw new Error(`QUEUEBOX_TEST_MSSQL_URL: not sqlserver://user:password@host:port/database: ${text}`);
  const encrypt = !['false', 'off'].includes(u.searchParams.get('encrypt') ?? 'true');
  return {
    server: u.hostname, port: Number(u.port || 1433), database: decodeURIComponent(u.pathname.slice(1)),
    user: decodeURIComponent(u.username), password: decodeURIComponent(u.password),
    options: { encrypt, trustServerCertificate: true },
    requestTimeout: 30000,
    // connections kept: a Babelfish session compiles each procedure on its first call (a second or two)
    pool: { max: 12, idleTimeoutMillis: 600000 },
  };
}
