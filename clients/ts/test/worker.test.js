// The scenarios of clients/SCENARIOS.md (test/scenarios.js) against
// @alternayte/queuebox-inbox's PostgreSQL dialect, on a real PostgreSQL with the
// queuebox extension (QBI_TEST_PGHOST and QBI_TEST_PGPORT; TAP 033 starts the cluster).
import pg from 'pg';

import { fromPg } from '../src/index.js';
import { scenarios } from './scenarios.js';

// the cluster TAP 033 started: a socket directory and a port
const host = process.env.QBI_TEST_PGHOST;
if (!host) throw new Error('QBI_TEST_PGHOST and QBI_TEST_PGPORT are not set (TAP 033 runs these tests)');
const pool = new pg.Pool({ host, port: Number(process.env.QBI_TEST_PGPORT), database: 'postgres', max: 12 });
const q = async (sql, params) => (await pool.query(sql, params)).rows;

scenarios({
  dialect: () => fromPg(pool),
  async reset() {
    await q('DELETE FROM queuebox.inbox');
    await q('DROP TABLE IF EXISTS biz');
    await q('CREATE TABLE biz (msg bigint, n int)');
  },
  addRows: (n, aggregates = 0) =>
    q(`INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)
       SELECT 'jobs', 'j' || i, CASE WHEN $2 > 0 THEN 'a' || (i % $2) END, jsonb_build_object('n', i), 'pull'
       FROM generate_series(1, $1::int) i`, [n, aggregates]),
  inbox: async () => (await q(`SELECT state, attempt, last_error AS "lastError", (payload->>'n')::int AS n
                               FROM queuebox.inbox ORDER BY id`)),
  biz: async () => (await q('SELECT n FROM biz ORDER BY n')).map((r) => r.n),
  writeBiz: (tx, m) => tx.query('INSERT INTO biz VALUES ($1, $2)', [m.id, m.payload.n]),
  claimOther: async (batch, leaseMs) =>
    (await q("SELECT count(*)::int AS n FROM queuebox.inbox_claim('jobs', $1, $2)", [batch, leaseMs]))[0].n,
  expireLeases: () => q("UPDATE queuebox.inbox SET lease_until = now() - interval '1 second' WHERE state = 'processing'"),
  setAttempt: (a) => q('UPDATE queuebox.inbox SET attempt = $1', [a]),
  close: () => pool.end(),
});
