// The scenarios of clients/SCENARIOS.md against @alternayte/queuebox-inbox, on a
// real PostgreSQL with the queuebox extension (QBI_TEST_PGHOST and
// QBI_TEST_PGPORT; TAP 033 starts the cluster).  Each scenario counts rows before and after.
import { test, beforeEach, after } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';

import { InboxWorker, fromPg, retryAfter, deadLetter, defaultRetryPolicy } from '../src/index.js';

// the cluster TAP 033 started: a socket directory and a port
const host = process.env.QBI_TEST_PGHOST;
if (!host) throw new Error('QBI_TEST_PGHOST and QBI_TEST_PGPORT are not set (TAP 033 runs these tests)');
const pool = new pg.Pool({ host, port: Number(process.env.QBI_TEST_PGPORT), database: 'postgres', max: 12 });
const q = async (sql, params) => (await pool.query(sql, params)).rows;
const one = async (sql, params) => Object.values((await q(sql, params))[0] ?? {})[0];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(sql, want, ms = 20000) {
  const until = Date.now() + ms;
  let got;
  while (Date.now() < until) {
    got = String(await one(sql));
    if (got === String(want)) return;
    await sleep(50);
  }
  assert.fail(`waited ${ms} ms for "${sql}" to be ${want}; it is ${got}`);
}

async function addRows(n, aggregates = 0) {
  await q(`INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption)
           SELECT 'jobs', 'j' || i, CASE WHEN $2 > 0 THEN 'a' || (i % $2) END, jsonb_build_object('n', i), 'pull'
           FROM generate_series(1, $1::int) i`, [n, aggregates]);
}

function start(options, handler) {
  const controller = new AbortController();
  const worker = new InboxWorker(fromPg(pool), { source: 'jobs', idleMs: 50, ...options });
  const done = worker.run(handler, controller.signal);
  return { worker, stop: async () => { controller.abort(); await done; return worker.counters; } };
}

const writeBiz = (tx, m) => tx.query('INSERT INTO biz VALUES ($1, $2)', [m.id, m.payload.n]);

beforeEach(async () => {
  await q('DELETE FROM queuebox.inbox');
  await q('DROP TABLE IF EXISTS biz');
  await q('CREATE TABLE biz (msg bigint, n int)');
});
after(() => pool.end());

test('the business write and the completion commit together; a failing handler leaves neither', async () => {
  await addRows(3);
  const w = start({ retryPolicy: () => retryAfter(600000) }, async (m, tx) => {
    await writeBiz(tx, m);
    if (m.payload.n === 2) throw new Error('message two always fails');
  });
  await waitFor("SELECT count(*) FROM queuebox.inbox WHERE state = 'processed' OR attempt > 0", 3);
  const c = await w.stop();
  assert.equal(await one('SELECT string_agg(n::text, \',\' ORDER BY n) FROM biz'), '1,3');
  assert.equal(await one("SELECT string_agg(state || ':' || attempt, ',' ORDER BY id) FROM queuebox.inbox"),
    'processed:0,pending:1,processed:0');
  assert.equal(await one("SELECT last_error FROM queuebox.inbox WHERE payload->>'n' = '2'"), 'message two always fails');
  assert.deepEqual([c.claimed, c.completed, c.retried], [3, 2, 1]);
});

test('a handler slower than three leases keeps its message', async () => {
  await addRows(1);
  let started = false;
  const w = start({ leaseMs: 600, batchSize: 1 }, async (m, tx, signal) => {
    started = true;
    for (let i = 0; i < 40 && !signal.aborted; i++) await sleep(50);
    if (signal.aborted) throw new Error('cancelled');
    await writeBiz(tx, m);
  });
  while (!started) await sleep(10);
  await sleep(1300);
  assert.equal(await one("SELECT count(*)::int FROM queuebox.inbox_claim('jobs', 5, 60000)"), 0);
  await waitFor('SELECT state FROM queuebox.inbox', 'processed');
  const c = await w.stop();
  assert.equal(c.leaseLost, 0);
  assert.equal(c.completed, 1);
  assert.equal(await one('SELECT count(*)::int FROM biz'), 1);
});

test('a lost lease aborts the handler and rolls its writes back', async () => {
  await addRows(1);
  let started = false;
  let sawAbort = false;
  const w = start({ leaseMs: 600, batchSize: 1 }, async (m, tx, signal) => {
    await writeBiz(tx, m);
    started = true;
    for (let i = 0; i < 200 && !signal.aborted; i++) await sleep(50);
    sawAbort = signal.aborted;
    throw new Error('cancelled');
  });
  while (!started) await sleep(10);
  await q("UPDATE queuebox.inbox SET lease_until = now() - interval '1 second'");
  assert.equal(await one("SELECT count(*)::int FROM queuebox.inbox_claim('jobs', 1, 60000)"), 1);
  while (w.worker.counters.leaseLost === 0) await sleep(50);
  const c = await w.stop();
  assert.ok(sawAbort, 'the handler saw its signal abort');
  assert.deepEqual([c.leaseLost, c.completed, c.retried + c.dead], [1, 0, 0]);
  assert.equal(await one('SELECT count(*)::int FROM biz'), 0);
  assert.equal(await one("SELECT state || ':' || attempt FROM queuebox.inbox"), 'processing:0');
});

test('retry then success; a custom policy sends a parse error straight to dead', async () => {
  await addRows(2);
  const w = start({ retryPolicy: (m, e) => (e.message.startsWith('parse error') ? deadLetter() : retryAfter(0)) },
    async (m, tx) => {
      if (m.payload.n === 2) throw new Error('parse error: field x');
      if (m.attempt === 0) throw new Error('temporary');
      await writeBiz(tx, m);
    });
  await waitFor("SELECT string_agg(state, ',' ORDER BY id) FROM queuebox.inbox", 'processed,dead');
  const c = await w.stop();
  assert.equal(await one("SELECT attempt FROM queuebox.inbox WHERE payload->>'n' = '1'"), 1);
  assert.equal(await one("SELECT last_error FROM queuebox.inbox WHERE state = 'dead'"), 'parse error: field x');
  assert.deepEqual([c.retried, c.dead, c.completed], [1, 1, 1]);
});

test('the default policy: backoff with jitter, dead on the fifth attempt', async () => {
  for (let a = 0; a < 4; a++) {
    for (let k = 0; k < 50; k++) {
      const d = defaultRetryPolicy({ attempt: a });
      assert.equal(d.dead, false);
      assert.ok(d.delayMs >= 1000 * 2 ** a * 0.8 && d.delayMs <= 1000 * 2 ** a * 1.2, `attempt ${a}: ${d.delayMs}`);
    }
  }
  assert.equal(defaultRetryPolicy({ attempt: 4 }).dead, true);
  await addRows(1);
  await q('UPDATE queuebox.inbox SET attempt = 4');
  const w = start({}, async () => { throw new Error('down'); });
  await waitFor('SELECT state FROM queuebox.inbox', 'dead');
  assert.equal((await w.stop()).dead, 1);
  assert.equal(await one('SELECT last_error FROM queuebox.inbox'), 'down');
});

test('shutdown: a running handler keeps the grace; past it nothing is completed, no attempt spent', async () => {
  await addRows(2);
  let started = false;
  let w = start({ batchSize: 1, shutdownGraceMs: 3000 }, async (m, tx) => {
    started = true;
    await sleep(500);
    await writeBiz(tx, m);
  });
  while (!started) await sleep(10);
  let c = await w.stop();
  assert.deepEqual([c.completed, c.claimed], [1, 1]);
  assert.equal(await one("SELECT string_agg(state, ',' ORDER BY id) FROM queuebox.inbox"), 'processed,pending');

  await q('DELETE FROM queuebox.inbox');
  await q('DELETE FROM biz');
  await addRows(1);
  started = false;
  w = start({ batchSize: 1, shutdownGraceMs: 300 }, async (m, tx, signal) => {
    await writeBiz(tx, m);
    started = true;
    while (!signal.aborted) await sleep(20);
    throw new Error('cancelled');
  });
  while (!started) await sleep(10);
  c = await w.stop();
  assert.equal(c.completed + c.retried + c.dead, 0);
  assert.equal(await one('SELECT count(*)::int FROM biz'), 0);
  assert.equal(await one("SELECT state || ':' || attempt FROM queuebox.inbox"), 'processing:0');
});

test('maxConcurrency 4 over 8 aggregates: parallel, never two of one aggregate, order kept', async () => {
  await addRows(40, 8);
  let runningNow = 0;
  let maxRunning = 0;
  const perAgg = new Map();
  const lastSeq = new Map();
  let overlap = false;
  let outOfOrder = false;
  const w = start({ maxConcurrency: 4, batchSize: 10 }, async (m, tx) => {
    runningNow++;
    maxRunning = Math.max(maxRunning, runningNow);
    if ((perAgg.get(m.aggregateId) ?? 0) > 0) overlap = true;
    perAgg.set(m.aggregateId, (perAgg.get(m.aggregateId) ?? 0) + 1);
    if (m.payload.n < (lastSeq.get(m.aggregateId) ?? 0)) outOfOrder = true;
    lastSeq.set(m.aggregateId, m.payload.n);
    await sleep(60);
    perAgg.set(m.aggregateId, perAgg.get(m.aggregateId) - 1);
    runningNow--;
    await writeBiz(tx, m);
  });
  await waitFor("SELECT count(*) FROM queuebox.inbox WHERE state = 'processed'", 40);
  const c = await w.stop();
  assert.equal(c.completed, 40);
  assert.equal(overlap, false);
  assert.equal(outOfOrder, false);
  assert.ok(maxRunning > 1 && maxRunning <= 4, `up to ${maxRunning} at once`);
  assert.equal(await one('SELECT count(*)::int FROM biz'), 40);
});

test('options are checked, saying which', () => {
  assert.throws(() => new InboxWorker(fromPg(pool), {}), /options.source/);
  assert.throws(() => new InboxWorker(fromPg(pool), { source: 's', leaseMs: 50 }), /options.leaseMs must be an integer from 100/);
  assert.throws(() => new InboxWorker({}, { source: 's' }), /fromPg\(pool\)/);
});
