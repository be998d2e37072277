// The scenarios of clients/SCENARIOS.md (1 to 7, and the option checks), once
// for both dialects: worker.test.js runs them on PostgreSQL, mssql.test.js on
// SQL Server.  A database is an adapter:
//   dialect()                 fromPg(pool) or fromMssql(pool)
//   reset()                   an empty inbox and an empty table biz (msg, n)
//   addRows(n, aggregates)    n pull rows of source "jobs", payload {"n": i} (1..n),
//                             aggregate "a" + (i % aggregates) when aggregates > 0
//   inbox()                   every inbox row by id: { state, attempt, lastError, n }
//   biz()                     the n of every biz row, ascending
//   writeBiz(tx, m)           the business write, through the handler's transaction
//   claimOther(batch, leaseMs)  a claim of "jobs" by someone else: how many rows it got
//   expireLeases()            every held lease ends a second ago
//   setAttempt(a)             every row's attempt
//   close()
// Each scenario counts rows before and after.
import { test, beforeEach, afterEach, after } from 'node:test';
import assert from 'node:assert/strict';

import { InboxWorker, retryAfter, deadLetter, defaultRetryPolicy } from '../src/index.js';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function scenarios(db) {
  async function waitFor(what, check, ms = 20000) {
    const until = Date.now() + ms;
    let rows;
    while (Date.now() < until) {
      rows = await db.inbox();
      if (check(rows)) return rows;
      await sleep(50);
    }
    assert.fail(`waited ${ms} ms for ${what}; the inbox is ${JSON.stringify(rows)}`);
  }
  const states = (rows) => rows.map((r) => r.state).join(',');
  const stateAttempts = (rows) => rows.map((r) => `${r.state}:${r.attempt}`).join(',');

  const live = new Set();   // workers a failed scenario did not stop: afterEach does
  function start(options, handler) {
    const controller = new AbortController();
    const worker = new InboxWorker(db.dialect(), { source: 'jobs', idleMs: 50, ...options });
    const done = worker.run(handler, controller.signal);
    const w = { worker, stop: async () => { controller.abort(); await done; live.delete(w); return worker.counters; } };
    live.add(w);
    return w;
  }

  beforeEach(() => db.reset());
  afterEach(() => Promise.all([...live].map((w) => w.stop())));
  after(() => db.close());

  test('the business write and the completion commit together; a failing handler leaves neither', async () => {
    await db.addRows(3);
    const w = start({ retryPolicy: () => retryAfter(600000) }, async (m, tx) => {
      await db.writeBiz(tx, m);
      if (m.payload.n === 2) throw new Error('message two always fails');
    });
    await waitFor('three rows processed or tried',
      (rows) => rows.filter((r) => r.state === 'processed' || r.attempt > 0).length === 3);
    const c = await w.stop();
    assert.deepEqual(await db.biz(), [1, 3]);
    const rows = await db.inbox();
    assert.equal(stateAttempts(rows), 'processed:0,pending:1,processed:0');
    assert.equal(rows.find((r) => r.n === 2).lastError, 'message two always fails');
    assert.deepEqual([c.claimed, c.completed, c.retried], [3, 2, 1]);
  });

  test('a handler slower than three leases keeps its message', async () => {
    await db.addRows(1);
    let started = false;
    const w = start({ leaseMs: 600, batchSize: 1 }, async (m, tx, signal) => {
      started = true;
      for (let i = 0; i < 40 && !signal.aborted; i++) await sleep(50);
      if (signal.aborted) throw new Error('cancelled');
      await db.writeBiz(tx, m);
    });
    while (!started) await sleep(10);
    await sleep(1300);
    assert.equal(await db.claimOther(5, 60000), 0);
    await waitFor('the message processed', (rows) => states(rows) === 'processed');
    const c = await w.stop();
    assert.equal(c.leaseLost, 0);
    assert.equal(c.completed, 1);
    assert.equal((await db.biz()).length, 1);
  });

  test('a lost lease aborts the handler and rolls its writes back', async () => {
    await db.addRows(1);
    let started = false;
    let sawAbort = false;
    const w = start({ leaseMs: 600, batchSize: 1 }, async (m, tx, signal) => {
      await db.writeBiz(tx, m);
      started = true;
      for (let i = 0; i < 200 && !signal.aborted; i++) await sleep(50);
      sawAbort = signal.aborted;
      throw new Error('cancelled');
    });
    while (!started) await sleep(10);
    await db.expireLeases();
    assert.equal(await db.claimOther(1, 60000), 1);
    while (w.worker.counters.leaseLost === 0) await sleep(50);
    const c = await w.stop();
    assert.ok(sawAbort, 'the handler saw its signal abort');
    assert.deepEqual([c.leaseLost, c.completed, c.retried + c.dead], [1, 0, 0]);
    assert.equal((await db.biz()).length, 0);
    assert.equal(stateAttempts(await db.inbox()), 'processing:0');
  });

  test('retry then success; a custom policy sends a parse error straight to dead', async () => {
    await db.addRows(2);
    const w = start({ retryPolicy: (m, e) => (e.message.startsWith('parse error') ? deadLetter() : retryAfter(0)) },
      async (m, tx) => {
        if (m.payload.n === 2) throw new Error('parse error: field x');
        if (m.attempt === 0) throw new Error('temporary');
        await db.writeBiz(tx, m);
      });
    await waitFor('one processed, one dead', (rows) => states(rows) === 'processed,dead');
    const c = await w.stop();
    const rows = await db.inbox();
    assert.equal(rows.find((r) => r.n === 1).attempt, 1);
    assert.equal(rows.find((r) => r.state === 'dead').lastError, 'parse error: field x');
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
    await db.addRows(1);
    await db.setAttempt(4);
    const w = start({}, async () => { throw new Error('down'); });
    await waitFor('the message dead', (rows) => states(rows) === 'dead');
    assert.equal((await w.stop()).dead, 1);
    assert.equal((await db.inbox())[0].lastError, 'down');
  });

  test('shutdown: a running handler keeps the grace; past it nothing is completed, no attempt spent', async () => {
    await db.addRows(2);
    let started = false;
    let w = start({ batchSize: 1, shutdownGraceMs: 3000 }, async (m, tx) => {
      started = true;
      await sleep(500);
      await db.writeBiz(tx, m);
    });
    while (!started) await sleep(10);
    let c = await w.stop();
    assert.deepEqual([c.completed, c.claimed], [1, 1]);
    assert.equal(states(await db.inbox()), 'processed,pending');

    await db.reset();
    await db.addRows(1);
    started = false;
    w = start({ batchSize: 1, shutdownGraceMs: 300 }, async (m, tx, signal) => {
      await db.writeBiz(tx, m);
      started = true;
      while (!signal.aborted) await sleep(20);
      throw new Error('cancelled');
    });
    while (!started) await sleep(10);
    c = await w.stop();
    assert.equal(c.completed + c.retried + c.dead, 0);
    assert.equal((await db.biz()).length, 0);
    assert.equal(stateAttempts(await db.inbox()), 'processing:0');
  });

  test('maxConcurrency 4 over 8 aggregates: parallel, never two of one aggregate, order kept', async () => {
    await db.addRows(40, 8);
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
      await db.writeBiz(tx, m);
    });
    await waitFor('40 processed', (rows) => rows.filter((r) => r.state === 'processed').length === 40);
    const c = await w.stop();
    assert.equal(c.completed, 40);
    assert.equal(overlap, false);
    assert.equal(outOfOrder, false);
    assert.ok(maxRunning > 1 && maxRunning <= 4, `up to ${maxRunning} at once`);
    assert.equal((await db.biz()).length, 40);
  });

  test('options are checked, saying which', () => {
    assert.throws(() => new InboxWorker(db.dialect(), {}), /options.source/);
    assert.throws(() => new InboxWorker(db.dialect(), { source: 's', leaseMs: 50 }), /options.leaseMs must be an integer from 100/);
    assert.throws(() => new InboxWorker({}, { source: 's' }), /fromPg\(pool\) or fromMssql\(pool\)/);
  });
}
