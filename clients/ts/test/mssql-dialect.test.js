// fromMssql(pool) without a server: the request-timeout check, the Msg 51000
// classification, and the worker claiming again after one, over a small
// hand-made stand-in for an mssql ConnectionPool (pool.request(),
// pool.transaction(), tx.request(); request.input(name, type, value).execute(proc)).
// These test our code, not mssql: the scenarios on a server are mssql.test.js.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import sql from 'mssql';

import { InboxWorker, fromMssql, isClaimLockTimeout, ClaimBusyError, LeaseLostError, retryAfter } from '../src/index.js';

// answer(proc, inputs, where) -> recordset, or throws; every call, begin, commit and rollback in pool.log
function fakePool(answer, config = { requestTimeout: 30000 }) {
  const log = [];
  const request = (where) => {
    const inputs = {};
    let cancelled;
    const r = {
      input(name, type, value) { inputs[name] = { type, value }; return r; },
      // answer may hang (a claim waiting for its lock): cancel() ends it as mssql does
      execute(proc) {
        log.push({ where, proc, inputs });
        return new Promise((resolve, reject) => {
          cancelled = () => reject(Object.assign(new Error('Canceled.'), { name: 'RequestError', code: 'ECANCEL' }));
          Promise.resolve().then(() => answer(proc, inputs, where)).then((recordset) => resolve({ recordset }), reject);
        });
      },
      cancel() {
        log.push('cancel');
        cancelled?.();
      },
    };
    return r;
  };
  return {
    config, log,
    request: () => request('pool'),
    transaction: () => ({
      async begin() { log.push('begin'); },
      async commit() { log.push('commit'); },
      async rollback() { log.push('rollback'); },
      request: () => request('tx'),
    }),
  };
}

// what mssql throws for a THROW 51000 from a procedure (as seen from tedious)
function msg51000() {
  const e = new Error('queuebox.inbox_claim: another claim of this source held its lock for 10 s; this is temporary');
  e.name = 'RequestError';
  e.code = 'EREQUEST';
  e.originalError = Object.assign(new Error(e.message), { info: { number: 51000, class: 16 } });
  e.precedingErrors = [];
  return e;
}

const row = (id, n) => ({
  id: String(id), claim_token: '889E67E5-F3D8-430D-839B-69D65450D475', source: 'jobs', idempotency_key: `k${id}`,
  event_type: null, aggregate_id: 'a1', payload: JSON.stringify({ n }), headers: '{"h":"v"}', attempt: 0,
  created_at: new Date('2026-01-02T03:04:05.678Z'),
});

test('the request timeout: the mssql default (15 s) and anything under 30 s are refused, saying what to set', () => {
  assert.throws(() => fromMssql(fakePool(() => [], {})),
    { name: 'RangeError', message: /requestTimeout is 15000 ms \(the mssql default, none set\).*set requestTimeout: 30000 or more/ });
  assert.throws(() => fromMssql(fakePool(() => [], { requestTimeout: 29999 })), /requestTimeout is 29999 ms;/);
  assert.equal(fromMssql(fakePool(() => [], { requestTimeout: 30000 })).dialect, 'sqlserver');
  assert.equal(fromMssql(fakePool(() => [], { requestTimeout: 0 })).dialect, 'sqlserver', '0: no timeout at all');
  // the real pool keeps what it was given in pool.config
  assert.throws(() => fromMssql(new sql.ConnectionPool({ server: 'localhost' })), /the mssql default/);
  assert.ok(fromMssql(new sql.ConnectionPool({ server: 'localhost', requestTimeout: 60000 })));
  // a connection string is parsed when the pool is made
  assert.ok(fromMssql(new sql.ConnectionPool('Server=localhost;Database=d;Request Timeout=30000')));
  assert.throws(() => fromMssql(new sql.ConnectionPool('Server=localhost;Database=d;Request Timeout=20000')), /is 20000 ms;/);
  assert.throws(() => fromMssql({ query() {} }), /an mssql ConnectionPool/);
});

test('Msg 51000 is recognised where mssql puts it, and nothing else is', () => {
  assert.ok(isClaimLockTimeout(msg51000()));
  assert.ok(isClaimLockTimeout({ number: 51000 }));
  assert.ok(isClaimLockTimeout({ number: 3903, precedingErrors: [{ number: 51000 }] }));
  assert.ok(isClaimLockTimeout(new Error('wrapped', { cause: { originalError: { number: 51000 } } })));
  assert.ok(!isClaimLockTimeout({ number: 1205 }));
  assert.ok(!isClaimLockTimeout({ number: 50022, originalError: { info: { number: 50022 } } }));
  assert.ok(!isClaimLockTimeout(null));
  const loop = { number: 1 };
  loop.originalError = loop;
  assert.ok(!isClaimLockTimeout(loop));
});

test('the claim: its own transaction, committed; typed bound parameters; the message fields', async () => {
  const pool = fakePool((proc) => (proc === 'queuebox.inbox_claim' ? [row(7, 1)] : []));
  const [m] = await fromMssql(pool).claim('jobs', 5, 30000);
  assert.deepEqual(pool.log.map((l) => l.proc ?? l), ['begin', 'queuebox.inbox_claim', 'commit']);
  const { inputs, where } = pool.log[1];
  assert.equal(where, 'tx');
  assert.deepEqual(Object.fromEntries(Object.entries(inputs).map(([k, v]) => [k, v.value])),
    { source: 'jobs', batch_size: 5, lease_ms: 30000 });
  assert.equal(inputs.source.type.type, sql.NVarChar);
  assert.equal(inputs.batch_size.type, sql.Int);
  assert.equal(m.id, '7');
  assert.equal(m.claimToken, '889E67E5-F3D8-430D-839B-69D65450D475');
  assert.deepEqual(m.payload, { n: 1 });
  assert.deepEqual(m.headers, { h: 'v' });
  assert.equal(m.createdAt.toISOString(), '2026-01-02T03:04:05.678Z');
  assert.equal(m.aggregateId, 'a1');
});

test('a claim answering Msg 51000: rolled back, a ClaimBusyError; the worker logs it and claims again', async () => {
  let claims = 0;
  const pool = fakePool((proc, inputs) => {
    if (proc === 'queuebox.inbox_claim') {
      claims++;
      if (claims === 1) throw msg51000();
      return claims === 2 ? [row(1, 1)] : [];
    }
    if (proc === 'queuebox.inbox_complete') {
      assert.equal(inputs.id.type, sql.BigInt);
      assert.equal(inputs.claim_token.type, sql.UniqueIdentifier);
      return [{ completed: true }];
    }
    return [{}];
  });
  await assert.rejects(fromMssql(fakePool(() => { throw msg51000(); })).claim('jobs', 1, 1000),
    (e) => e instanceof ClaimBusyError && e.temporary && isClaimLockTimeout(e.cause));
  const logged = [];
  const worker = new InboxWorker(fromMssql(pool), { source: 'jobs', idleMs: 20,
    logger: { info: (t) => logged.push(`info ${t}`), warn: (t) => logged.push(`warn ${t}`) } });
  const stop = new AbortController();
  const seen = [];
  const run = worker.run(async (m, tx) => {
    seen.push(m.id);
    assert.equal(typeof tx.request, 'function', 'the handler gets the transaction');
    stop.abort();
  }, stop.signal);
  await run;
  assert.deepEqual(seen, ['1']);
  assert.equal(worker.counters.completed, 1);
  assert.match(logged[0], /^info claim: another claim of source jobs held its lock for 10 s \(Msg 51000\); temporary; claiming again in 20 ms/);
  assert.deepEqual(pool.log.slice(0, 3), ['begin', pool.log[1], 'rollback'], 'the failed claim is rolled back');
});

test('after Msg 51000 the wait before the next claim ends when the run is stopped', async () => {
  let claims = 0;
  const pool = fakePool(() => { claims++; throw msg51000(); });
  const worker = new InboxWorker(fromMssql(pool), { source: 'jobs', idleMs: 600000 });
  const stop = new AbortController();
  const run = worker.run(async () => {}, stop.signal);
  while (claims === 0) await new Promise((r) => setTimeout(r, 5));
  const t0 = Date.now();
  stop.abort();
  await run;
  assert.ok(Date.now() - t0 < 1000, 'the run ended without waiting out idleMs');
  assert.equal(claims, 1);
});

test('a stop cancels a claim waiting for its lock: rolled back, nothing claimed, no warning', async () => {
  const pool = fakePool(() => new Promise(() => {}));   // the lock never comes
  const logged = [];
  const worker = new InboxWorker(fromMssql(pool), { source: 'jobs', logger: { warn: (t) => logged.push(t) } });
  const stop = new AbortController();
  const run = worker.run(async () => {}, stop.signal);
  while (!pool.log.some((l) => l.proc)) await new Promise((r) => setTimeout(r, 5));
  stop.abort();
  await run;
  assert.deepEqual(pool.log.map((l) => l.proc ?? l), ['begin', 'queuebox.inbox_claim', 'cancel', 'rollback']);
  assert.deepEqual(logged, []);
  assert.equal(worker.counters.claimed, 0);
});

test('a stop while the claim\'s transaction begins: rolled back, no claim sent', async () => {
  const pool = fakePool(() => assert.fail('no claim is sent'));
  const stop = new AbortController();
  const tx = pool.transaction;
  pool.transaction = () => ({ ...tx(), async begin() { pool.log.push('begin'); stop.abort(); } });
  assert.deepEqual(await fromMssql(pool).claim('jobs', 1, 1000, stop.signal), []);
  assert.deepEqual(pool.log, ['begin', 'rollback']);
});

test('createdAt is UTC, also when the pool reads DATETIME2 as local time (useUTC: false)', async () => {
  const tz = process.env.TZ;
  process.env.TZ = 'America/New_York';
  try {
    const local = row(1, 1);
    local.created_at = new Date(2026, 0, 2, 3, 4, 5, 678);   // what tedious gives with useUTC: false
    const pool = fakePool(() => [local], { requestTimeout: 30000, options: { useUTC: false } });
    const [m] = await fromMssql(pool).claim('jobs', 1, 1000);
    assert.equal(m.createdAt.toISOString(), '2026-01-02T03:04:05.678Z');
  } finally {
    if (tz === undefined) delete process.env.TZ;
    else process.env.TZ = tz;
  }
});

test('a retry the database refuses is logged; the worker goes on, the message waits for its lease', async () => {
  let claims = 0;
  const delays = [];
  const pool = fakePool((proc, inputs) => {
    if (proc === 'queuebox.inbox_claim') return ++claims === 1 ? [row(1, 1)] : [];
    if (proc === 'queuebox.inbox_retry') {
      delays.push(inputs.delay_ms.value);
      throw Object.assign(new Error('Connection lost'), { code: 'ESOCKET' });
    }
    return [];
  });
  const logged = [];
  const worker = new InboxWorker(fromMssql(pool), { source: 'jobs', idleMs: 10, retryPolicy: () => retryAfter(1e12),
    logger: { warn: (t) => logged.push(t) } });
  const stop = new AbortController();
  const run = worker.run(async () => { throw new Error('handler failed'); }, stop.signal);
  while (claims < 3) await new Promise((r) => setTimeout(r, 5));
  stop.abort();
  await run;
  assert.deepEqual(delays, [2147483647], 'a delay past an INT is cut to it');
  assert.deepEqual(logged, ['message 1: the retry failed: Connection lost; the message is claimed again after its lease']);
  assert.deepEqual([worker.counters.retried, worker.counters.dead], [0, 0]);
});

test('a completion that changes no row rolls the handler\'s transaction back: a lost lease, no retry', async () => {
  const pool = fakePool((proc) => {
    if (proc === 'queuebox.inbox_complete') return [{ completed: false }];
    if (proc === 'queuebox.inbox_retry') return [{ retried: true }];
    return [];
  });
  const db = fromMssql(pool);
  const m = (await fromMssql(fakePool(() => [row(3, 3)])).claim('jobs', 1, 1000))[0];
  await assert.rejects(db.inTransaction(m, async () => {}), LeaseLostError);
  assert.deepEqual(pool.log.map((l) => l.proc ?? l), ['begin', 'queuebox.inbox_complete', 'rollback']);
  // the other four answer true only for exactly one changed row
  const ok = fromMssql(fakePool((proc) => [{ renewed: true, retried: true, dead: 1 }]));
  assert.equal(await ok.renew(m, 1000), true);
  assert.equal(await ok.retry(m, 0, 'e'), true);
  assert.equal(await ok.dead(m, 'e'), true);
  const lost = fromMssql(fakePool(() => [{ renewed: false, retried: false, dead: false }]));
  assert.deepEqual([await lost.renew(m, 1000), await lost.retry(m, 0, 'e'), await lost.dead(m, 'e')], [false, false, false]);
  assert.equal(retryAfter(5).delayMs, 5);
});
