// @alternayte/queuebox-inbox: a pull worker for the QueueBox inbox.
//
// The library holds the claim, the lease renewal, the completion, the retry
// and the dead letter (docs/pull.md, "The five statements"); the application
// writes only the handler:
//   - a claim takes up to batchSize messages of one source in a transaction
//     of its own, committed before any handler starts;
//   - the handler gets the message, a client in an open transaction and an
//     AbortSignal; on return the message is completed in that transaction and
//     committed; a completion that changes no row (another worker owns the
//     message) rolls the whole transaction back;
//   - every third of the lease each held message is renewed on another
//     connection of the pool; a renewal that changes no row aborts the
//     handler's signal, and its writes are rolled back;
//   - on an error the transaction is rolled back and the retry policy
//     decides: retryAfter(ms) or deadLetter(); the default is exponential
//     backoff with jitter from 1 s, dead on the fifth attempt;
//   - maxConcurrency handlers at once (default 1), never two messages of one
//     aggregate (the claim gives one open message per aggregate);
//   - when the run's signal aborts: no more claims; running handlers keep
//     shutdownGraceMs, past it their signal aborts, nothing is completed and
//     no attempt spent (the lease expires).
//
// Two dialects give the worker the same five operations (claim, renew,
// retry, dead, inTransaction): fromPg(pool) over pg, fromMssql(pool) over
// mssql (SQL Server, with its two rules: a request timeout of 30 s or more,
// checked when the dialect is made, and Msg 51000 from the claim as a
// temporary failure).  The run's signal reaches the claim, so that a stop
// cancels a claim waiting for SQL Server's claim lock.

import { mssqlTypes } from './mssql-module.js';

/** The policy's answer: retry after a delay. */
export function retryAfter(ms) {
  return { dead: false, delayMs: Math.max(0, Math.floor(ms)) };
}

/** The policy's answer: move the message to dead. */
export function deadLetter() {
  return { dead: true, delayMs: 0 };
}

/** Exponential backoff with ±20 % jitter from 1 s (at most 5 minutes); dead on the fifth attempt. */
export function defaultRetryPolicy(message) {
  if (message.attempt + 1 >= 5) return deadLetter();
  const base = Math.min(1000 * 2 ** message.attempt, 300000);
  return retryAfter(base * (0.8 + 0.4 * Math.random()));
}

/** Thrown into a handler's transaction when its message is no longer this worker's. */
export class LeaseLostError extends Error {
  constructor(id) {
    super(`message ${id}: the lease was lost (another worker owns the message); its writes were rolled back`);
    this.name = 'LeaseLostError';
  }
}

/**
 * Thrown by a dialect's claim when the claim could not run this time and
 * will on a later try (on SQL Server: Msg 51000, another claim of the source
 * held its lock for 10 s).  The worker logs it and claims again.
 */
export class ClaimBusyError extends Error {
  constructor(msg, cause) {
    super(msg, { cause });
    this.name = 'ClaimBusyError';
    this.temporary = true;
  }
}

function message(row) {
  return {
    id: String(row.id),
    claimToken: row.claim_token,
    source: row.source,
    idempotencyKey: row.idempotency_key,
    eventType: row.event_type ?? null,
    aggregateId: row.aggregate_id ?? null,
    payload: row.payload,
    headers: row.headers ?? {},
    attempt: Number(row.attempt),
    createdAt: row.created_at instanceof Date ? row.created_at : new Date(row.created_at),
    /** The payload as a typed value (a parse hook: pass a function that checks it). */
    json(check) {
      return check ? check(this.payload) : this.payload;
    },
  };
}

/**
 * The PostgreSQL dialect over a pg.Pool: the five statements of
 * examples/pull/sql/postgresql, with bound parameters.
 */
export function fromPg(pool) {
  async function one(sql, params) {
    const r = await pool.query(sql, params);
    return r.rows[0]?.ok === true;
  }
  return {
    dialect: 'postgresql',
    async claim(source, batchSize, leaseMs) {
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        const r = await c.query(
          'SELECT id, claim_token, source, idempotency_key, event_type, aggregate_id, payload, headers, attempt, created_at' +
            ' FROM queuebox.inbox_claim($1, $2, $3)',
          [source, batchSize, leaseMs]);
        await c.query('COMMIT');
        return r.rows.map(message);
      } catch (e) {
        await c.query('ROLLBACK').catch(() => {});
        throw e;
      } finally {
        c.release();
      }
    },
    renew: (m, leaseMs) => one('SELECT queuebox.inbox_renew($1, $2, $3) AS ok', [m.id, m.claimToken, leaseMs]),
    retry: (m, delayMs, error) =>
      one('SELECT queuebox.inbox_retry($1, $2, $3, $4) AS ok', [m.id, m.claimToken, delayMs, error]),
    dead: (m, error) => one('SELECT queuebox.inbox_dead($1, $2, $3) AS ok', [m.id, m.claimToken, error]),
    async inTransaction(m, work) {
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        await work(c);
        // named: prepared once per connection, then only bound and run
        const r = await c.query({ name: 'queuebox.inbox_complete', text: 'SELECT queuebox.inbox_complete($1, $2) AS ok',
          values: [m.id, m.claimToken] });
        if (r.rows[0]?.ok !== true) throw new LeaseLostError(m.id);
        await c.query('COMMIT');
      } catch (e) {
        await c.query('ROLLBACK').catch(() => {});
        throw e;
      } finally {
        c.release();
      }
    },
  };
}

// ---- SQL Server: mssql (over tedious)

/** The mssql default request timeout (ms), used when the pool's config sets none. */
const MSSQL_DEFAULT_REQUEST_TIMEOUT = 15000;
/** @delay_ms is an INT: a longer delay (about 24.8 days) is cut to it. */
const MSSQL_INT_MAX = 2147483647;
/** The claim waits up to 10 s for its application lock: a request must be allowed longer. */
export const MSSQL_MIN_REQUEST_TIMEOUT = 30000;

/** Whether err (an mssql RequestError, or what it wraps) is SQL Server's Msg 51000, the claim's lock timeout. */
export function isClaimLockTimeout(err) {
  const seen = new Set();
  const walk = (e) => {
    if (!e || typeof e !== 'object' || seen.has(e)) return false;
    seen.add(e);
    if (e.number === 51000 || e.info?.number === 51000) return true;
    return walk(e.originalError) || walk(e.cause) || (Array.isArray(e.precedingErrors) && e.precedingErrors.some(walk));
  };
  return walk(err);
}

// roll back, unless the server has already (XACT_ABORT, an aborted transaction)
const rollback = (tx) => tx.rollback().catch(() => {});

/**
 * The SQL Server dialect over an mssql ConnectionPool: the five procedures of
 * examples/pull/sql/sqlserver, called with bound, typed parameters.  The
 * handler's transaction is an mssql Transaction: write through
 * new sql.Request(tx) (or tx.request()), never commit or roll it back.
 *
 * The pool's requestTimeout must be 30000 ms or more (or 0, none): the claim
 * waits up to 10 s for its lock, and a request timed out first leaves the
 * lock held until the connection resets.  mssql's default is 15000 ms, which
 * is refused here with what to set.
 */
export function fromMssql(pool) {
  if (!pool || typeof pool.request !== 'function' || typeof pool.transaction !== 'function')
    throw new TypeError('fromMssql: pass an mssql ConnectionPool (new sql.ConnectionPool(config))');
  const set = pool.config?.requestTimeout;
  const timeout = set ?? MSSQL_DEFAULT_REQUEST_TIMEOUT;
  if (timeout !== 0 && !(timeout >= MSSQL_MIN_REQUEST_TIMEOUT))
    throw new RangeError(`fromMssql: the pool's requestTimeout is ${timeout} ms${set == null ? ' (the mssql default, none set)' : ''};` +
      ` the claim waits up to 10 s for its lock and a shorter timeout aborts it first, leaving the lock held:` +
      ` set requestTimeout: ${MSSQL_MIN_REQUEST_TIMEOUT} or more in the pool's config`);
  // useUTC: false makes tedious read DATETIME2 as local time; the column is UTC
  const utc = (d) => (pool.config?.options?.useUTC === false && d instanceof Date
    ? new Date(d.getTime() - d.getTimezoneOffset() * 60000) : d);
  const json = (text, otherwise) => (text == null ? otherwise : typeof text === 'string' ? JSON.parse(text) : text);
  const held = (sql, req, m) => req.input('id', sql.BigInt, m.id).input('claim_token', sql.UniqueIdentifier, m.claimToken);
  // one row, one column: true when exactly one row changed
  const changed = (r, column) => {
    const v = r.recordset?.[0]?.[column];
    return v === true || v === 1;
  };
  async function one(proc, column, bind) {
    const sql = await mssqlTypes('fromMssql');
    return changed(await bind(sql, pool.request()).execute(proc), column);
  }
  return {
    dialect: 'sqlserver',
    // signal: the run's; a stop cancels a claim waiting for its lock (up to 10 s), nothing claimed
    async claim(source, batchSize, leaseMs, signal) {
      const sql = await mssqlTypes('fromMssql');
      const tx = pool.transaction();
      await tx.begin();
      if (signal?.aborted) {   // stopped while the transaction began
        await rollback(tx);
        return [];
      }
      const req = tx.request();
      const cancel = () => req.cancel();
      signal?.addEventListener('abort', cancel, { once: true });
      try {
        const r = await req
          .input('source', sql.NVarChar(200), source)
          .input('batch_size', sql.Int, batchSize)
          .input('lease_ms', sql.Int, leaseMs)
          .execute('queuebox.inbox_claim')
          .finally(() => signal?.removeEventListener('abort', cancel));
        await tx.commit();
        return (r.recordset ?? []).map((row) => message({
          ...row, payload: json(row.payload), headers: json(row.headers, {}), created_at: utc(row.created_at) }));
      } catch (e) {
        await rollback(tx);
        if (isClaimLockTimeout(e))
          throw new ClaimBusyError(`another claim of source ${source} held its lock for 10 s (Msg 51000); temporary`, e);
        throw e;
      }
    },
    renew: (m, leaseMs) => one('queuebox.inbox_renew', 'renewed',
      (sql, req) => held(sql, req, m).input('lease_ms', sql.Int, leaseMs)),
    retry: (m, delayMs, error) => one('queuebox.inbox_retry', 'retried', (sql, req) => held(sql, req, m)
      .input('delay_ms', sql.Int, Math.min(delayMs, MSSQL_INT_MAX)).input('error', sql.NVarChar(sql.MAX), error)),
    dead: (m, error) => one('queuebox.inbox_dead', 'dead',
      (sql, req) => held(sql, req, m).input('error', sql.NVarChar(sql.MAX), error)),
    async inTransaction(m, work) {
      const sql = await mssqlTypes('fromMssql');
      const tx = pool.transaction();
      await tx.begin();
      try {
        await work(tx);
        const r = await held(sql, tx.request(), m).execute('queuebox.inbox_complete');
        if (!changed(r, 'completed')) throw new LeaseLostError(m.id);
        await tx.commit();
      } catch (e) {
        await rollback(tx);
        throw e;
      }
    },
  };
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });

/**
 * The W3C trace context a message arrived with (its traceparent and
 * tracestate headers, any letter case), or null when it has none or the spec
 * says to ignore it: { traceId, spanId, traceFlags, traceState }.
 */
export function traceContextOf(message) {
  let tp = null;
  let ts;
  for (const [k, v] of Object.entries(message.headers ?? {})) {
    if (k.toLowerCase() === 'traceparent') tp = v;
    else if (k.toLowerCase() === 'tracestate') ts = v;
  }
  const m = typeof tp === 'string' && /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/.exec(tp);
  if (!m || m[1] === 'ff' || (m[1] === '00' && m[5]) || /^0+$/.test(m[2]) || /^0+$/.test(m[3])) return null;
  return { traceId: m[2], spanId: m[3], traceFlags: parseInt(m[4], 16), traceState: ts };
}

export class InboxWorker {
  /**
   * @param db fromPg(pool) or fromMssql(pool)
   * @param options { source, batchSize = 10, leaseMs = 30000, maxConcurrency = 1,
   *   shutdownGraceMs = 30000, idleMs = 500, retryPolicy, logger, tracer }
   *   tracer: an OpenTelemetry Tracer (@opentelemetry/api): each handler runs in a
   *   span "queuebox.inbox process" (kind CONSUMER), the child of the message's
   *   traceparent header when it has one
   */
  constructor(db, options = {}) {
    if (!db || typeof db.claim !== 'function') throw new TypeError('InboxWorker: pass fromPg(pool) or fromMssql(pool) as the first argument');
    if (!options.source) throw new TypeError('InboxWorker: options.source (the pull source) is required');
    const o = { batchSize: 10, leaseMs: 30000, maxConcurrency: 1, shutdownGraceMs: 30000, idleMs: 500, ...options };
    for (const [k, min, max] of [['batchSize', 1, 10000], ['leaseMs', 100, 86400000], ['maxConcurrency', 1, 256],
      ['shutdownGraceMs', 0, 86400000], ['idleMs', 1, 3600000]]) {
      if (!Number.isInteger(o[k]) || o[k] < min || o[k] > max)
        throw new RangeError(`InboxWorker: options.${k} must be an integer from ${min} to ${max}, got ${o[k]}`);
    }
    this.db = db;
    this.options = o;
    this.policy = o.retryPolicy ?? defaultRetryPolicy;
    this.logger = o.logger ?? null;
    this.tracer = o.tracer ?? null;
    this.counters = { claimed: 0, completed: 0, retried: 0, dead: 0, leaseLost: 0 };
  }

  /**
   * The handler, in a span that continues the message's trace when a tracer
   * was given: @opentelemetry/api is loaded only then (an optional peer).
   */
  async traced(m, run) {
    if (!this.tracer) return run();
    const api = await import('@opentelemetry/api');
    const parent = traceContextOf(m);
    const ctx = parent ? api.trace.setSpanContext(api.context.active(), { ...parent, isRemote: true })
      : api.context.active();
    return this.tracer.startActiveSpan('queuebox.inbox process', {
      kind: api.SpanKind.CONSUMER,
      attributes: { 'queuebox.source': m.source, 'queuebox.message.id': String(m.id),
        'queuebox.message.attempt': m.attempt },
    }, ctx, async (span) => {
      try {
        return await run();
      } catch (e) {
        span.setStatus({ code: api.SpanStatusCode.ERROR, message: e?.message ?? String(e) });
        throw e;
      } finally {
        span.end();
      }
    });
  }

  log(level, msg) {
    this.logger?.[level]?.(msg);
  }

  /** Claim and handle messages until signal aborts; resolves once every running handler ended. */
  async run(handler, signal) {
    const o = this.options;
    const held = new Map();   // id -> { message, controller, lost }: claimed, not finished
    const queue = [];         // of them, not started yet, in claim order
    const lanes = new Set();  // each runs queued messages one after another
    let stopping = false;
    let wake = null;          // a lane ended or took a message
    const changed = () => new Promise((resolve) => { wake = resolve; });
    // resolves when the run is asked to stop; no timer, so nothing outlives the run
    const aborted = new Promise((resolve) => {
      if (signal?.aborted) resolve();
      else signal?.addEventListener('abort', () => resolve(), { once: true });
    });
    const renewer = setInterval(() => this.renewAll(held), Math.floor(o.leaseMs / 3));
    // a stop starts no new message: the queued ones are left to their lease
    const lane = async () => {
      while (queue.length > 0 && !signal?.aborted) {
        const h = queue.shift();
        wake?.();
        await this.handleOne(h, handler, () => stopping);
        held.delete(h.message.id);
      }
    };
    try {
      while (!signal?.aborted) {
        // claim when every claimed message was taken and a lane is free; a
        // claim never holds a message of an aggregate still running, so
        // lanes in parallel never run two of one aggregate
        if (queue.length > 0 || lanes.size >= o.maxConcurrency) {
          await Promise.race([changed(), aborted]);
          continue;
        }
        let batch;
        try {
          batch = await this.db.claim(o.source, o.batchSize, o.leaseMs, signal);
        } catch (e) {
          if (signal?.aborted) break;   // a claim the stop cancelled: nothing was claimed
          if (e?.temporary) this.log('info', `claim: ${e.message}; claiming again in ${o.idleMs} ms`);
          else this.log('warn', `claim failed: ${e.message}; claiming again in ${o.idleMs} ms`);
          await sleep(o.idleMs, signal);
          continue;
        }
        this.counters.claimed += batch.length;
        if (batch.length === 0) {
          await sleep(o.idleMs, signal);
          continue;
        }
        for (const m of batch) {
          const h = { message: m, controller: new AbortController(), lost: false };
          held.set(m.id, h);
          queue.push(h);
        }
        // one lane: the batch in claim order; several: as they free up
        while (lanes.size < o.maxConcurrency && queue.length > 0) {
          const p = lane().finally(() => {
            lanes.delete(p);
            wake?.();
          });
          lanes.add(p);
        }
      }
    } finally {
      stopping = true;
      for (const h of queue.splice(0)) held.delete(h.message.id);
      if (lanes.size > 0) {
        let timer;
        const grace = new Promise((resolve) => { timer = setTimeout(() => resolve('late'), o.shutdownGraceMs); });
        const all = Promise.allSettled([...lanes]);
        const outcome = await Promise.race([all.then(() => 'done'), grace]);
        clearTimeout(timer);
        if (outcome === 'late') {
          for (const h of held.values()) h.controller.abort(new Error('the shutdown grace ran out'));
          await all;
        }
      }
      clearInterval(renewer);
    }
  }

  async renewAll(held) {
    for (const h of held.values()) {
      if (h.lost || h.controller.signal.aborted) continue;
      try {
        if (!(await this.db.renew(h.message, this.options.leaseMs))) {
          h.lost = true;
          h.controller.abort(new LeaseLostError(h.message.id));
        }
      } catch (e) {
        this.log('warn', `renewal of message ${h.message.id} failed: ${e.message}; trying again`);
      }
    }
  }

  async handleOne(h, handler, stopping) {
    const m = h.message;
    if (h.lost) {
      this.counters.leaseLost++;
      return;
    }
    try {
      await this.traced(m, () => this.db.inTransaction(m, async (tx) => {
        await handler(m, tx, h.controller.signal);
        if (h.controller.signal.aborted) throw h.controller.signal.reason ?? new Error('cancelled');
      }));
      this.counters.completed++;
    } catch (e) {
      if (h.lost || e instanceof LeaseLostError) {
        h.lost = true;
        this.counters.leaseLost++;
        this.log('warn', `message ${m.id}: the lease was lost; rolled back`);
        return;
      }
      if (stopping() && h.controller.signal.aborted) {
        this.log('warn', `message ${m.id}: the shutdown grace ran out; rolled back, no attempt spent`);
        return;
      }
      const error = e?.message ?? String(e);
      const d = this.policy(m, e) ?? defaultRetryPolicy(m);
      const what = d.dead ? 'dead letter' : 'retry';
      let ok;
      try {
        ok = d.dead ? await this.db.dead(m, error) : await this.db.retry(m, d.delayMs, error);
      } catch (f) {
        // the database failed too: the message stays held until its lease ends, then is claimed again
        this.log('warn', `message ${m.id}: the ${what} failed: ${f?.message ?? f}; the message is claimed again after its lease`);
        return;
      }
      if (ok) this.counters[d.dead ? 'dead' : 'retried']++;
      else this.log('warn', `message ${m.id}: the ${what} changed no row (the lease was lost)`);
    }
  }
}

// ---- the outbox: enqueue in the application's transaction (src/outbox.js)
export { enqueue, enqueueBatch, currentTraceHeaders, isTraceparent, TRACEPARENT_FORMAT } from './outbox.js';
