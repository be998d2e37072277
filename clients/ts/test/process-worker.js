// A worker process for TAP 033's process scenarios (two workers on one
// source, kill -9 mid-handler), as clients/c/test/qbi_test_worker.c is for
// TAP 032: source "jobs" until SIGTERM, its handler idempotent (the effect
// keyed by source and idempotency key, so a message run twice applies once).
//   node process-worker.js NAME LEASE_MS HANDLER_MS [BATCH [SOURCE]]
//   (QBI_TEST_PGHOST, QBI_TEST_PGPORT; QBI_TEST_PGDATABASE and QBI_TEST_PGUSER default to postgres)
// HANDLER_MS -1: a no-op handler (bench/pull measures the library's own cost with it).
import pg from 'pg';
import { InboxWorker, fromPg } from '../src/index.js';

const [name, leaseMs, handlerMs, batch = '5', source = 'jobs'] = process.argv.slice(2);
const pool = new pg.Pool({ host: process.env.QBI_TEST_PGHOST, port: Number(process.env.QBI_TEST_PGPORT),
  database: process.env.QBI_TEST_PGDATABASE ?? 'postgres', user: process.env.QBI_TEST_PGUSER ?? 'postgres', max: 4 });
// a worker that cannot claim says so (the library prints nothing by default)
const logger = { warn: (m) => console.error(m) };
const worker = new InboxWorker(fromPg(pool), { source, batchSize: Number(batch), leaseMs: Number(leaseMs), idleMs: 50,
  shutdownGraceMs: 5000, logger });
const stop = new AbortController();
process.on('SIGTERM', () => stop.abort());
console.log('ready');
await worker.run(async (m, tx, signal) => {
  if (Number(handlerMs) < 0) return;
  // the effect first, then the slow part: a kill in between leaves it uncommitted
  await tx.query('INSERT INTO effects (source, idempotency_key, worker) VALUES ($1, $2, $3)' +
    ' ON CONFLICT (source, idempotency_key) DO NOTHING', [m.source, m.idempotencyKey, name]);
  for (let t = 0; t < Number(handlerMs) && !signal.aborted; t += 10) await new Promise((r) => setTimeout(r, 10));
  if (signal.aborted) throw signal.reason;
}, stop.signal);
const c = worker.counters;
console.log(`${name}: claimed ${c.claimed} completed ${c.completed} retried ${c.retried} dead ${c.dead} lease_lost ${c.leaseLost}`);
await pool.end();
