// A worker process for the process scenarios (two workers on one source, kill
// -9 mid-handler): TAP 033's on PostgreSQL, as clients/c/test/qbi_test_worker.c
// is for TAP 032, and mssql.test.js's kill -9 on SQL Server.  Source "jobs"
// until SIGTERM, its handler idempotent (the effect keyed by source and
// idempotency key, so a message run twice applies once).
//   node process-worker.js NAME LEASE_MS HANDLER_MS [BATCH [SOURCE]]
//   PostgreSQL: QBI_TEST_PGHOST, QBI_TEST_PGPORT; QBI_TEST_PGDATABASE and QBI_TEST_PGUSER default to postgres
//   SQL Server: QBI_TEST_DIALECT=mssql and QUEUEBOX_TEST_MSSQL_URL
// HANDLER_MS -1: a no-op handler (bench/pull measures the library's own cost with it).
import { InboxWorker, fromPg, fromMssql } from '../src/index.js';

const [name, leaseMs, handlerMs, batch = '5', source = 'jobs'] = process.argv.slice(2);
const mssql = process.env.QBI_TEST_DIALECT === 'mssql';
let db;
let effect;
let end;
if (mssql) {
  const { default: sql } = await import('mssql');
  const { mssqlConfig } = await import('./mssql-config.js');
  const pool = await new sql.ConnectionPool({ ...mssqlConfig(), pool: { max: 4 } }).connect();
  db = fromMssql(pool);
  effect = (tx, m) => new sql.Request(tx).input('s', sql.NVarChar(200), m.source).input('k', sql.NVarChar(400), m.idempotencyKey)
    .input('w', sql.NVarChar(50), name)
    .query('IF NOT EXISTS (SELECT 1 FROM dbo.effects WITH (UPDLOCK, HOLDLOCK) WHERE source = @s AND idempotency_key = @k)' +
      ' INSERT INTO dbo.effects (source, idempotency_key, worker) VALUES (@s, @k, @w)');
  end = () => pool.close();
} else {
  const { default: pg } = await import('pg');
  const pool = new pg.Pool({ host: process.env.QBI_TEST_PGHOST, port: Number(process.env.QBI_TEST_PGPORT),
    database: process.env.QBI_TEST_PGDATABASE ?? 'postgres', user: process.env.QBI_TEST_PGUSER ?? 'postgres', max: 4 });
  db = fromPg(pool);
  effect = (tx, m) => tx.query('INSERT INTO effects (source, idempotency_key, worker) VALUES ($1, $2, $3)' +
    ' ON CONFLICT (source, idempotency_key) DO NOTHING', [m.source, m.idempotencyKey, name]);
  end = () => pool.end();
}
// a worker that cannot claim says so (the library prints nothing by default)
const logger = { warn: (m) => console.error(m) };
const worker = new InboxWorker(db, { source, batchSize: Number(batch), leaseMs: Number(leaseMs), idleMs: 50,
  shutdownGraceMs: 5000, logger });
const stop = new AbortController();
process.on('SIGTERM', () => stop.abort());
console.log('ready');
await worker.run(async (m, tx, signal) => {
  if (Number(handlerMs) < 0) return;
  // the effect first, then the slow part: a kill in between leaves it uncommitted
  await effect(tx, m);
  if (Number(handlerMs) >= 1000) console.log(`effect ${m.idempotencyKey} written`);   // a slow handler says so: kill it now
  for (let t = 0; t < Number(handlerMs) && !signal.aborted; t += 10) await new Promise((r) => setTimeout(r, 10));
  if (signal.aborted) throw signal.reason;
}, stop.signal);
const c = worker.counters;
console.log(`${name}: claimed ${c.claimed} completed ${c.completed} retried ${c.retried} dead ${c.dead} lease_lost ${c.leaseLost}`);
await end();
