// The scenarios of clients/SCENARIOS.md (test/scenarios.js) against
// @alternayte/queuebox-inbox's SQL Server dialect, fromMssql(pool), on the
// server QUEUEBOX_TEST_MSSQL_URL names (sqlserver://user:password@host:port/database?encrypt=false)
// with schema queuebox migrated there (queuebox-mssqld --migrate; TAP 035 does both).
// The tests empty queuebox.inbox and use a table dbo.biz they drop at the end: give them a
// database of their own.
// Unset: skipped, saying why.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import sql from 'mssql';

import { InboxWorker, fromMssql } from '../src/index.js';
import { mssqlConfig } from './mssql-config.js';
import { scenarios, sleep } from './scenarios.js';

const url = process.env.QUEUEBOX_TEST_MSSQL_URL;

if (!url) {
  test('the SQL Server scenarios', { skip: 'QUEUEBOX_TEST_MSSQL_URL is not set: no SQL Server to run against' +
    ' (set it to sqlserver://user:password@host:port/database?encrypt=false, with queuebox-mssqld --migrate run there)' }, () => {});
} else {
  const pool = new sql.ConnectionPool(mssqlConfig(url));
  await pool.connect();
  const q = async (text, bind = {}) => {
    const r = pool.request();
    for (const [k, [type, v]] of Object.entries(bind)) r.input(k, type, v);
    return (await r.query(text)).recordset ?? [];
  };
  const claim = (req, batch, leaseMs, source = 'jobs') => req.input('source', sql.NVarChar(200), source)
    .input('batch_size', sql.Int, batch).input('lease_ms', sql.Int, leaseMs).execute('queuebox.inbox_claim');
  if ((await q("SELECT OBJECT_ID(N'queuebox.inbox_claim') AS p"))[0].p == null)
    throw new Error(`no queuebox.inbox_claim in ${pool.config.database}: run queuebox-mssqld --migrate against it first`);

  // A Babelfish engine compiles a procedure on its first call in each session
  // (a second or two, longer than a 600 ms lease): every connection of the pool
  // calls each one once, changing nothing, before the scenarios.
  const babelfish = (await q("SELECT CAST(SERVERPROPERTY('BabelfishVersion') AS NVARCHAR(20)) AS v"))[0].v != null;
  if (babelfish) {
    const none = (req) => req.input('id', sql.BigInt, '0').input('claim_token', sql.UniqueIdentifier, '00000000-0000-0000-0000-000000000000');
    await Promise.all(Array.from({ length: pool.config.pool.max }, async (_, i) => {
      const tx = pool.transaction();
      await tx.begin();
      try {
        await claim(tx.request(), 1, 1000, `warm-up ${i}`);   // a source each: no lock between them
        await none(tx.request()).input('lease_ms', sql.Int, 1000).execute('queuebox.inbox_renew');
        await none(tx.request()).execute('queuebox.inbox_complete');
        await none(tx.request()).input('error', sql.NVarChar(sql.MAX), '').execute('queuebox.inbox_dead');
        await none(tx.request()).input('delay_ms', sql.Int, 0).input('error', sql.NVarChar(sql.MAX), '').execute('queuebox.inbox_retry');
      } finally {
        await tx.rollback().catch(() => {});
      }
    }));
  }

  const db = {
    dialect: () => fromMssql(pool),
    async reset() {
      await q('DELETE FROM queuebox.inbox');
      await q("IF OBJECT_ID(N'dbo.biz') IS NOT NULL DROP TABLE dbo.biz");
      await q('CREATE TABLE dbo.biz (msg BIGINT, n INT)');
    },
    async addRows(n, aggregates = 0) {
      const tx = pool.transaction();
      await tx.begin();
      for (let i = 1; i <= n; i++) {
        await tx.request().input('k', sql.NVarChar(400), `j${i}`)
          .input('a', sql.NVarChar(400), aggregates > 0 ? `a${i % aggregates}` : null)
          .input('p', sql.NVarChar(sql.MAX), JSON.stringify({ n: i }))
          .query("INSERT INTO queuebox.inbox (source, idempotency_key, aggregate_id, payload, consumption) VALUES (N'jobs', @k, @a, @p, N'pull')");
      }
      await tx.commit();
    },
    inbox: async () => (await q('SELECT state, attempt, last_error, payload FROM queuebox.inbox ORDER BY id'))
      .map((r) => ({ state: r.state, attempt: r.attempt, lastError: r.last_error, n: JSON.parse(r.payload).n })),
    biz: async () => (await q('SELECT n FROM dbo.biz ORDER BY n')).map((r) => r.n),
    // the handler's transaction is an mssql Transaction
    writeBiz: (tx, m) => new sql.Request(tx).input('msg', sql.BigInt, m.id).input('n', sql.Int, m.payload.n)
      .query('INSERT INTO dbo.biz (msg, n) VALUES (@msg, @n)'),
    claimOther: async (batch, leaseMs) => (await claim(pool.request(), batch, leaseMs)).recordset.length,
    expireLeases: () => q("UPDATE queuebox.inbox SET lease_until = DATEADD(second, -1, SYSUTCDATETIME()) WHERE state = N'processing'"),
    setAttempt: (a) => q('UPDATE queuebox.inbox SET attempt = @a', { a: [sql.Int, a] }),
    async close() {
      await q("IF OBJECT_ID(N'dbo.biz') IS NOT NULL DROP TABLE dbo.biz");
      await q("IF OBJECT_ID(N'dbo.effects') IS NOT NULL DROP TABLE dbo.effects");
      await pool.close();
    },
  };
  scenarios(db);

  // another claimer's lock on source jobs, as the claim takes it: a transaction to roll back
  async function holdClaimLock() {
    const holder = pool.transaction();
    await holder.begin();
    await new sql.Request(holder).query("DECLARE @r INT; EXEC @r = sp_getapplock @Resource = N'queuebox.inbox_claim:jobs'," +
      " @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 1000; IF @r < 0 THROW 50000, N'no lock', 1;");
    return holder;
  }

  test('Msg 51000: a claim behind a held lock is a temporary failure, the worker claims again', async () => {
    await db.addRows(1);
    const holder = await holdClaimLock();
    const logged = [];
    const logger = { info: (t) => logged.push(`info ${t}`), warn: (t) => logged.push(`warn ${t}`) };
    const stop = new AbortController();
    const worker = new InboxWorker(fromMssql(pool), { source: 'jobs', idleMs: 50, logger });
    const run = worker.run((m, tx) => new sql.Request(tx).input('msg', sql.BigInt, m.id).input('n', sql.Int, m.payload.n)
      .query('INSERT INTO dbo.biz (msg, n) VALUES (@msg, @n)'), stop.signal);
    try {
      const until = Date.now() + 25000;
      while (!logged.some((t) => /Msg 51000/.test(t)) && Date.now() < until) await sleep(100);
    } finally {
      await holder.rollback();
    }
    while (worker.counters.completed === 0 && logged.length < 50) await sleep(50);
    stop.abort();
    await run;
    assert.match(logged[0], /^info claim: another claim of source jobs held its lock for 10 s \(Msg 51000\); temporary/);
    assert.equal(logged.filter((t) => t.startsWith('warn')).length, 0, logged.join('\n'));
    assert.equal(worker.counters.completed, 1);
    assert.deepEqual((await q('SELECT n FROM dbo.biz')).map((r) => r.n), [1]);
    assert.equal((await q('SELECT state FROM queuebox.inbox'))[0].state, 'processed');
  });

  // Two workers on one source, their handlers completing while the other claims: the
  // completion of a row races the claim that parks the next row of its aggregate.  On a
  // Babelfish engine, which ignores the lock that race relies on, the claim re-checks its
  // parks after it made them (schema 0.3.3); before that, rows stayed parked for good.
  test('two workers on one source: every row processed, never two of one aggregate at once, order kept', async () => {
    await db.addRows(60, 6);
    const perAgg = new Map();
    const lastSeq = new Map();
    let overlap = false;
    let outOfOrder = false;
    const stops = [new AbortController(), new AbortController()];
    const workers = stops.map(() => new InboxWorker(fromMssql(pool), { source: 'jobs', idleMs: 20, maxConcurrency: 4, batchSize: 5 }));
    const runs = workers.map((w, i) => w.run(async (m, tx) => {
      if ((perAgg.get(m.aggregateId) ?? 0) > 0) overlap = true;
      perAgg.set(m.aggregateId, (perAgg.get(m.aggregateId) ?? 0) + 1);
      if (m.payload.n < (lastSeq.get(m.aggregateId) ?? 0)) outOfOrder = true;
      lastSeq.set(m.aggregateId, m.payload.n);
      await sleep(20);
      perAgg.set(m.aggregateId, perAgg.get(m.aggregateId) - 1);
      await db.writeBiz(tx, m);
    }, stops[i].signal));
    try {
      const until = Date.now() + 120000;
      let rows = await db.inbox();
      while (rows.filter((r) => r.state === 'processed').length < 60 && Date.now() < until) {
        await sleep(200);
        rows = await db.inbox();
      }
      assert.equal(rows.filter((r) => r.state === 'processed').length, 60,
        `every row processed (left: ${JSON.stringify(await q("SELECT id, state, hold FROM queuebox.inbox WHERE state <> N'processed'"))})`);
    } finally {
      for (const c of stops) c.abort();
      await Promise.all(runs);
    }
    assert.equal(workers[0].counters.completed + workers[1].counters.completed, 60);
    assert.ok(workers[0].counters.completed > 0 && workers[1].counters.completed > 0,
      `both workers took rows (${workers[0].counters.completed}, ${workers[1].counters.completed})`);
    assert.equal(overlap, false);
    assert.equal(outOfOrder, false);
    assert.equal((await db.biz()).length, 60);
    assert.equal((await q("SELECT COUNT(*) AS n FROM queuebox.inbox WHERE hold IS NOT NULL"))[0].n, 0, 'none is left parked');
  });

  // test/process-worker.js over fromMssql: { child, output(), exited }, once it said ready
  async function workerProcess(name, leaseMs, handlerMs) {
    const child = spawn(process.execPath, [fileURLToPath(new URL('process-worker.js', import.meta.url)), name,
      String(leaseMs), String(handlerMs), '1'], { env: { ...process.env, QBI_TEST_DIALECT: 'mssql' } });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    const exited = new Promise((resolve) => child.on('exit', resolve));
    const until = Date.now() + 20000;
    while (!out.includes('ready') && Date.now() < until) await sleep(20);
    assert.match(out, /ready/, `worker ${name} started`);
    return { child, output: () => out, exited };
  }

  test('kill -9 of a worker process mid-handler: taken over after the lease, its effect applied once', async () => {
    await q("IF OBJECT_ID(N'dbo.effects') IS NOT NULL DROP TABLE dbo.effects");
    await q('CREATE TABLE dbo.effects (source NVARCHAR(200), idempotency_key NVARCHAR(400), worker NVARCHAR(50),' +
      ' PRIMARY KEY (source, idempotency_key))');
    await q("INSERT INTO queuebox.inbox (source, idempotency_key, payload, consumption) VALUES (N'jobs', N'killed', N'{\"n\": 0}', N'pull')");
    const victim = await workerProcess('victim', 1000, 60000);
    const until = Date.now() + 20000;
    while (!victim.output().includes('effect killed written') && Date.now() < until) await sleep(20);
    assert.match(victim.output(), /effect killed written/, 'the handler wrote its effect, uncommitted, and waits');
    assert.equal((await db.inbox())[0].state, 'processing');
    victim.child.kill('SIGKILL');
    await victim.exited;
    assert.equal((await q('SELECT COUNT(*) AS n FROM dbo.effects'))[0].n, 0, "the killed handler's write was never committed");
    const rescuer = await workerProcess('rescuer', 1000, 5);
    await waitState('processed');
    rescuer.child.kill('SIGTERM');
    await rescuer.exited;
    assert.match(rescuer.output(), /rescuer: claimed 1 completed 1 retried 0 dead 0 lease_lost 0/);
    assert.deepEqual(await q('SELECT worker FROM dbo.effects'), [{ worker: 'rescuer' }], 'applied once, by the rescuer');
  });

  async function waitState(state, ms = 30000) {
    const until = Date.now() + ms;
    let rows;
    while (Date.now() < until) {
      rows = await db.inbox();
      if (rows.length === 1 && rows[0].state === state) return;
      await sleep(50);
    }
    assert.fail(`waited ${ms} ms for the message to be ${state}: ${JSON.stringify(rows)}`);
  }

  test('a stop while the claim waits for the lock ends the run without waiting out the lock, nothing claimed', async () => {
    await db.addRows(1);
    const holder = await holdClaimLock();
    const logged = [];
    const stop = new AbortController();
    const worker = new InboxWorker(fromMssql(pool), { source: 'jobs', idleMs: 50, logger: { warn: (t) => logged.push(t) } });
    const run = worker.run(async () => assert.fail('nothing is claimed'), stop.signal);
    let t0;
    try {
      await sleep(1500);   // the claim is waiting for the lock
      t0 = Date.now();
      stop.abort();
      await run;
    } finally {
      await holder.rollback();
    }
    // SQL Server ends a lock wait on the cancel (an attention); Babelfish does not answer
    // the attention while sp_getapplock waits, so tedious gives up after its cancelTimeout
    // (5 s) and closes that connection, which ends the claim's transaction just the same
    const bound = babelfish ? 7000 : 3000;
    assert.ok(Date.now() - t0 < bound, `the run ended ${Date.now() - t0} ms after the stop (at most ${bound}), not after the lock's 10 s`);
    assert.deepEqual(logged, []);
    assert.equal(worker.counters.claimed, 0);
    assert.deepEqual(await db.inbox(), [{ state: 'pending', attempt: 0, lastError: null, n: 1 }]);
    assert.equal(await db.claimOther(1, 1000), 1, 'the lock is free: a claim right after takes the message');
  });
}
