// enqueue and enqueueBatch (src/outbox.js, docs/enqueue.md) on a real database
// whose outbox delivers topics enq.** to the real HTTP sink (TAP 064 starts
// both): on PostgreSQL (QBI_TEST_PGHOST, QBI_TEST_PGPORT), or on SQL Server
// when QBI_TEST_DIALECT=mssql (QUEUEBOX_TEST_MSSQL_URL, queuebox-mssqld
// delivering).  QBI_TEST_SINK_LOG: the sink's JSONL log.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, existsSync } from 'node:fs';
import pg from 'pg';
import sql from 'mssql';
import { context, trace } from '@opentelemetry/api';
import { AsyncHooksContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider } from '@opentelemetry/sdk-trace-base';

import { enqueue, enqueueBatch } from '../src/index.js';
import { mssqlConfig } from './mssql-config.js';

const sinkLog = process.env.QBI_TEST_SINK_LOG;
if (!sinkLog) throw new Error('QBI_TEST_SINK_LOG is not set (TAP 064 runs these tests)');
const onMssql = process.env.QBI_TEST_DIALECT === 'mssql';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// the database: a transaction helper, a query and its placeholders
const db = onMssql ? await (async () => {
  const pool = await new sql.ConnectionPool(mssqlConfig()).connect();
  const q = async (text, ...args) => {
    const r = pool.request();
    args.forEach((a, i) => r.input(`p${i + 1}`, a));
    return (await r.query(text)).recordset ?? [];
  };
  await q("IF OBJECT_ID(N'dbo.enq_biz') IS NULL CREATE TABLE dbo.enq_biz (n INT NOT NULL)");
  return {
    q, biz: 'dbo.enq_biz', close: () => pool.close(),
    async inTx(work, commit = true) {
      const tx = pool.transaction();
      await tx.begin();
      try {
        await work(tx, (n) => new sql.Request(tx).input('n', sql.Int, n).query('INSERT INTO dbo.enq_biz (n) VALUES (@n)'));
        if (commit) await tx.commit(); else await tx.rollback();
      } catch (e) {
        await tx.rollback().catch(() => {});
        throw e;
      }
    },
    // SQL Server writes a UNIQUEIDENTIFIER in capitals, the sink's x-message-id is in small letters
    row: async (id) => (await q(`SELECT LOWER(CAST(message_id AS NVARCHAR(36))) AS mid, state, attempt, [key] AS k, headers,
      CONVERT(NVARCHAR(30), scheduled_at, 126) AS at FROM queuebox.outbox WHERE id = @p1`, Number(id)))[0],
    makeDue: (id) => q('UPDATE queuebox.outbox SET scheduled_at = SYSUTCDATETIME() WHERE id = @p1', Number(id)),
  };
})() : await (async () => {
  const pool = new pg.Pool({ host: process.env.QBI_TEST_PGHOST, port: Number(process.env.QBI_TEST_PGPORT), database: 'postgres' });
  const q = async (text, ...args) => (await pool.query(text.replace(/@p(\d+)/g, '$$$1'), args)).rows;
  await q('CREATE TABLE IF NOT EXISTS enq_biz (n int NOT NULL)');
  return {
    q, biz: 'enq_biz', close: () => pool.end(),
    async inTx(work, commit = true) {
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        await work(c, (n) => c.query('INSERT INTO enq_biz (n) VALUES ($1)', [n]));
        await c.query(commit ? 'COMMIT' : 'ROLLBACK');
      } catch (e) {
        await c.query('ROLLBACK').catch(() => {});
        throw e;
      } finally {
        c.release();
      }
    },
    row: async (id) => (await q(`SELECT message_id::text AS mid, state, attempt, key AS k, headers::text AS headers,
      to_char(scheduled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS') AS at FROM queuebox.outbox WHERE id = @p1`, id))[0],
    makeDue: (id) => q('UPDATE queuebox.outbox SET scheduled_at = now() WHERE id = @p1', id),
  };
})();
after(() => db.close());

const count = async (table) => Number((await db.q(`SELECT COUNT(*) AS n FROM ${table}`))[0].n);
const outboxCount = () => count('queuebox.outbox');

// the sink's requests for a message id, in log order
function requestsOf(mid) {
  if (!existsSync(sinkLog)) return [];
  return readFileSync(sinkLog, 'utf8').split('\n').filter((l) => l.endsWith('}'))
    .map((l) => JSON.parse(l)).filter((r) => r.headers['x-message-id'] === mid);
}

// waits for the row to be sent (a deadline, not a timed assertion: 120 s is "never")
async function sent(id) {
  for (let i = 0; i < 1200; i++) {
    const r = await db.row(id);
    if (r.state === 'sent') return r;
    if (r.state === 'dead') assert.fail(`row ${id} went dead`);
    await sleep(100);
  }
  assert.fail(`row ${id} was not delivered`);
}

context.setGlobalContextManager(new AsyncHooksContextManager().enable());
const tracer = new BasicTracerProvider().getTracer('enqueue.test');

test('a business write and an enqueue commit together and roll back together', async () => {
  const [biz0, out0] = [await count(db.biz), await outboxCount()];
  await db.inTx(async (tx, write) => {
    await write(1);
    await enqueue(tx, { topic: 'enq.ts.together', key: 'k-together', payload: { n: 1 } });
  }, false);
  assert.deepEqual([await count(db.biz), await outboxCount()], [biz0, out0], 'rolled back: neither row');
  let id;
  await db.inTx(async (tx, write) => {
    await write(2);
    id = await enqueue(tx, { topic: 'enq.ts.together', key: 'k-together', payload: { n: 2 } });
  });
  assert.deepEqual([await count(db.biz), await outboxCount()], [biz0 + 1, out0 + 1], 'committed: both rows');
  const r = await sent(id);
  assert.equal(requestsOf(r.mid).length, 1, 'the sink got it');
  assert.equal(JSON.parse(requestsOf(r.mid)[0].body).n, 2, 'with its payload');
});

test('the row carries the active span; the delivery is its child', async () => {
  let id;
  let span;
  await tracer.startActiveSpan('place order', async (s) => {
    span = s.spanContext();
    await db.inTx(async (tx) => {
      id = await enqueue(tx, { topic: 'enq.ts.traced', payload: { traced: true } });
    });
    s.end();
  });
  const r = await sent(id);
  assert.equal(JSON.parse(r.headers).traceparent, `00-${span.traceId}-${span.spanId}-01`, 'the row: the span current at enqueue');
  const [req] = requestsOf(r.mid);
  const m = /^00-([0-9a-f]{32})-([0-9a-f]{16})-01$/.exec(req.headers.traceparent ?? '');
  assert.ok(m, `the sink got a traceparent: ${req.headers.traceparent}`);
  assert.equal(m[1], span.traceId, 'in the span\'s trace');
  assert.notEqual(m[2], span.spanId, 'a child: a span of its own');

  // a traceparent the caller set wins; a malformed one is refused, naming the format
  const own = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
  await tracer.startActiveSpan('other', async (s) => {
    await db.inTx(async (tx) => {
      id = await enqueue(tx, { topic: 'enq.ts.traced', payload: {}, headers: { TraceParent: own } });
      await assert.rejects(enqueue(tx, { topic: 'enq.ts.traced', payload: {}, headers: { traceparent: '00-xyz-01' } }),
        /traceparent header "00-xyz-01" is malformed: a traceparent is 00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>/);
    });
    s.end();
  });
  const h = JSON.parse((await db.row(id)).headers);
  assert.deepEqual([h.TraceParent, h.traceparent], [own, undefined], 'the caller\'s traceparent is kept, no other added');
  // no traceparent of the caller's: its tracestate (any letter case) gives way to the span's
  await tracer.startActiveSpan('third', async (s) => {
    span = s.spanContext();
    await db.inTx(async (tx) => {
      id = await enqueue(tx, { topic: 'enq.ts.traced', payload: {}, headers: { TraceState: 'caller=1', 'x-other': 'kept' } });
    });
    s.end();
  });
  assert.deepEqual(JSON.parse((await db.row(id)).headers),
    { traceparent: `00-${span.traceId}-${span.spanId}-01`, 'x-other': 'kept' },
    'the caller\'s TraceState is dropped (the span has none), never stored beside the span\'s');
  // no active span: no trace headers
  await db.inTx(async (tx) => { id = await enqueue(tx, { topic: 'enq.ts.traced', payload: {} }); });
  assert.deepEqual(JSON.parse((await db.row(id)).headers), {}, 'no span: no header');
});

test('a batch is one statement; its rows keep their order and are delivered in it', async () => {
  const out0 = await outboxCount();
  let ids;
  await db.inTx(async (tx) => {
    ids = await enqueueBatch(tx, [1, 2, 3, 4, 5].map((n) => ({ topic: 'enq.ts.batch', key: 'k-batch', payload: { n } })));
  });
  assert.equal(ids.length, 5);
  assert.deepEqual([...ids].sort((a, b) => Number(a) - Number(b)), ids, 'ids in the order given');
  assert.equal(await outboxCount(), out0 + 5);
  const mids = [];
  for (const id of ids) mids.push((await sent(id)).mid);
  const order = readFileSync(sinkLog, 'utf8').split('\n').filter((l) => l.endsWith('}')).map((l) => JSON.parse(l))
    .filter((r) => mids.includes(r.headers['x-message-id'])).map((r) => JSON.parse(r.body).n);
  assert.deepEqual(order, [1, 2, 3, 4, 5], 'the sink got them in the batch\'s order');
  // a bad message refuses the whole batch: nothing written
  await db.inTx(async (tx) => {
    await assert.rejects(enqueueBatch(tx, [{ topic: 'enq.ts.batch', payload: 1 }, { topic: '', payload: 2 }]), /message 1: topic/);
  });
  assert.equal(await outboxCount(), out0 + 5);
  if (onMssql) {
    // SQL Server's [key] is NVARCHAR(400): a longer one refuses the batch before anything is sent
    await db.inTx(async (tx) => {
      await assert.rejects(enqueueBatch(tx, [{ topic: 'enq.ts.batch', payload: 1 }, { topic: 'enq.ts.batch', key: 'k'.repeat(401), payload: 2 }]),
        /message 1: key is 401 characters, SQL Server takes at most 400/);
      assert.equal(Number((await new sql.Request(tx).query('SELECT COUNT(*) AS n FROM queuebox.outbox')).recordset[0].n), out0 + 5,
        'nothing written, the transaction still usable');
    });
  } else {
    // a pg.Pool would commit the row on a connection of its own
    const pool = new pg.Pool({ host: process.env.QBI_TEST_PGHOST, port: Number(process.env.QBI_TEST_PGPORT), database: 'postgres' });
    await assert.rejects(enqueue(pool, { topic: 'enq.ts.batch', payload: 1 }),
      { name: 'TypeError', message: /pass the client from pool\.connect\(\) after BEGIN/ });
    await pool.end();
  }
  assert.equal(await outboxCount(), out0 + 5);
});

test('a delayed message is not claimed before its time', async () => {
  const at = new Date(Date.now() + 3600 * 1000);
  let delayed;
  let marker;
  await db.inTx(async (tx) => {
    delayed = await enqueue(tx, { topic: 'enq.ts.delayed', payload: { later: true }, scheduledAt: at });
    marker = await enqueue(tx, { topic: 'enq.ts.delayed', payload: { now: true } });
  });
  await sent(marker);   // written after it, delivered: the outbox has passed the delayed row
  const r = await db.row(delayed);
  assert.deepEqual([r.state, Number(r.attempt)], ['pending', 0], 'still pending, never attempted');
  // compared as instants: Babelfish's style 126 puts a space where SQL Server
  // puts the T and drops a fraction's trailing zeros (.52 for .520)
  assert.equal(new Date(r.at.replace(' ', 'T') + 'Z').getTime(), at.getTime(), 'scheduled_at is the time given');
  assert.equal(requestsOf(r.mid).length, 0, 'the sink has not seen it');
  await db.makeDue(delayed);
  await sent(delayed);
});
