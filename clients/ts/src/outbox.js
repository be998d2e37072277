// The outbox side: enqueue messages in the application's own transaction.
//
// Wording (docs/enqueue.md):
//   - a message: { topic, key?, payload, headers?, scheduledAt?, maxAttempts? },
//     one row of queuebox.outbox; payload is any JSON value (JSON.stringify);
//   - the transaction: a pg client between BEGIN and COMMIT, or an mssql
//     Transaction; the rows commit and roll back with the business writes,
//     and this module never commits, rolls back or releases it;
//   - the trace rule: a message whose headers carry no traceparent (any
//     letter case) gets the active span's of @opentelemetry/api (an optional
//     peer, loaded only when installed), as 00-<trace-id>-<span-id>-<flags>,
//     and its tracestate; a traceparent the caller set is kept, and refused
//     when it is malformed.
//
// A batch is one round trip: on PostgreSQL one statement with one
// parameter, a JSON array read by jsonb_array_elements, whatever its size;
// on SQL Server one batch of single-row INSERTs per 300 messages.  The ids
// follow the order given, so rows of one key are delivered in that order.

import { createRequire } from 'node:module';

import { mssqlTypes } from './mssql-module.js';

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;
export const TRACEPARENT_FORMAT =
  '00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>, in small letters, the ids not all zeros';

/** Whether text is a traceparent the W3C spec lets a receiver use. */
export function isTraceparent(text) {
  const m = typeof text === 'string' && TRACEPARENT.exec(text);
  return Boolean(m) && m[1] !== 'ff' && !(m[1] === '00' && m[5]) && !/^0+$/.test(m[2]) && !/^0+$/.test(m[3]);
}

let otel;   // undefined: not looked for yet; null: not installed
function otelApi() {
  if (otel === undefined) {
    try {
      // synchronous, so the active context is read before any await
      otel = createRequire(import.meta.url)('@opentelemetry/api');
    } catch {
      otel = null;
    }
  }
  return otel;
}

/** The active span's context as { traceparent, tracestate? }, or null (no span, or no @opentelemetry/api). */
export function currentTraceHeaders() {
  const api = otelApi();
  const sc = api?.trace.getSpanContext(api.context.active());
  if (!sc || !api.isSpanContextValid(sc)) return null;
  const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, '0');
  const state = sc.traceState?.serialize();
  return { traceparent: `00-${sc.traceId}-${sc.spanId}-${flags}`, ...(state ? { tracestate: state } : {}) };
}

// one message as the statement reads it; trace: the active span's headers or null
function row(m, i, trace) {
  const where = `enqueue: message ${i}`;
  if (!m || typeof m !== 'object') throw new TypeError(`${where}: not an object`);
  if (typeof m.topic !== 'string' || m.topic === '') throw new TypeError(`${where}: topic must be a non-empty string`);
  if (m.key != null && typeof m.key !== 'string') throw new TypeError(`${where}: key must be a string or null`);
  if (m.payload === undefined) throw new TypeError(`${where}: payload is required (any JSON value)`);
  const headers = { ...(m.headers ?? {}) };
  for (const [k, v] of Object.entries(headers))
    if (typeof v !== 'string') throw new TypeError(`${where}: header ${k} must be a string`);
  const own = Object.keys(headers).find((k) => k.toLowerCase() === 'traceparent');
  if (own !== undefined && !isTraceparent(headers[own]))
    throw new TypeError(`${where}: the traceparent header "${headers[own]}" is malformed: a traceparent is ${TRACEPARENT_FORMAT}`);
  if (own === undefined && trace) {
    // the span's tracestate goes with the span's traceparent: a caller's
    // tracestate (any letter case) without a traceparent is dropped
    for (const k of Object.keys(headers)) if (k.toLowerCase() === 'tracestate') delete headers[k];
    Object.assign(headers, trace);
  }
  let at = null;
  if (m.scheduledAt != null) {
    if (!(m.scheduledAt instanceof Date) || Number.isNaN(m.scheduledAt.getTime()))
      throw new TypeError(`${where}: scheduledAt must be a valid Date`);
    at = m.scheduledAt.toISOString();
  }
  if (m.maxAttempts != null && !(Number.isInteger(m.maxAttempts) && m.maxAttempts >= 1 && m.maxAttempts <= 2147483647))
    throw new RangeError(`${where}: maxAttempts must be an integer of 1 or more`);
  return { where, topic: m.topic, key: m.key ?? null, payload: JSON.stringify(m.payload), headers,
    scheduledAt: at, maxAttempts: m.maxAttempts ?? null };
}

const PG_INSERT =
  'INSERT INTO queuebox.outbox (topic, key, payload, headers, scheduled_at, max_attempts)' +
  " SELECT m->>'topic', m->>'key', (m->>'payload')::jsonb, m->'headers'," +
  " coalesce((m->>'scheduledAt')::timestamptz, now()), (m->>'maxAttempts')::int" +
  ' FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS r(m, n) ORDER BY n RETURNING id';

// SQL Server: one single-row INSERT per message, in one batch (one round
// trip per MSSQL_PER_BATCH messages: 6 parameters each, under SQL Server's
// 2100), so the ids follow the statements' order.  Not OPENJSON: Babelfish
// reads its strings still escaped and cuts them at 4000 characters; not
// INSERT ... SELECT ... ORDER BY with OUTPUT INTO: Babelfish refuses the pair.
// OUTPUT INTO a table variable: OUTPUT without INTO is refused on a table
// with a trigger.
const MSSQL_PER_BATCH = 300;
// topic and [key] are NVARCHAR(400) on SQL Server (in UTF-16 units, as a
// JavaScript string's length)
const MSSQL_TEXT_MAX = 400;

function mssqlCheck(r) {
  for (const [name, v] of [['topic', r.topic], ['key', r.key]])
    if (v != null && v.length > MSSQL_TEXT_MAX)
      throw new RangeError(`${r.where}: ${name} is ${v.length} characters, SQL Server takes at most ${MSSQL_TEXT_MAX}`);
}

// (no SET XACT_ABORT: it would outlive the call on the caller's connection
// and change how its later statements fail; a failed call is rolled back by
// the caller, README)
function mssqlBatch(sql, req, rows) {
  let text = 'SET NOCOUNT ON;\nDECLARE @ids TABLE (id BIGINT NOT NULL);\n';
  rows.forEach((r, i) => {
    req.input(`t${i}`, sql.NVarChar(400), r.topic).input(`k${i}`, sql.NVarChar(400), r.key)
      .input(`p${i}`, sql.NVarChar(sql.MAX), r.payload).input(`h${i}`, sql.NVarChar(sql.MAX), JSON.stringify(r.headers))
      // DATETIME2 has no zone: UTC, as SYSUTCDATETIME()
      .input(`s${i}`, sql.NVarChar(30), r.scheduledAt?.replace('Z', '') ?? null).input(`m${i}`, sql.Int, r.maxAttempts);
    text += 'INSERT INTO queuebox.outbox (topic, [key], payload, headers, scheduled_at, max_attempts) OUTPUT inserted.id INTO @ids' +
      ` VALUES (@t${i}, @k${i}, @p${i}, @h${i}, ISNULL(CAST(@s${i} AS DATETIME2(6)), SYSUTCDATETIME()), @m${i});\n`;
  });
  return `${text}SELECT id FROM @ids ORDER BY id;`;
}

/**
 * Writes messages into queuebox.outbox in tx, in one round trip; resolves to
 * their ids (bigint as text), in the order given.  tx: a pg client in a
 * transaction (BEGIN sent) or an mssql Transaction (begun).
 */
export async function enqueueBatch(tx, messages) {
  if (!Array.isArray(messages)) throw new TypeError('enqueueBatch: pass an array of messages');
  // read before the first await: the caller's active context
  const trace = currentTraceHeaders();
  const rows = messages.map((m, i) => row(m, i, trace));
  if (rows.length === 0) return [];
  if (tx && typeof tx.request === 'function' && typeof tx.commit === 'function') {
    rows.forEach(mssqlCheck);
    const sql = await mssqlTypes('enqueue');
    const ids = [];
    for (let i = 0; i < rows.length; i += MSSQL_PER_BATCH) {
      const req = tx.request();
      const res = await req.query(mssqlBatch(sql, req, rows.slice(i, i + MSSQL_PER_BATCH)));
      ids.push(...res.recordset.map((r) => String(r.id)));
    }
    return ids;
  }
  if (tx && typeof tx.query === 'function') {
    // a pg.Pool would run the INSERT on a connection of its own, committed at once
    if (typeof tx.connect === 'function' && typeof tx.totalCount === 'number')
      throw new TypeError('enqueue: a pg.Pool commits the row on its own connection, apart from your writes: ' +
        'pass the client from pool.connect() after BEGIN');
    const res = await tx.query(PG_INSERT, [JSON.stringify(rows.map(({ where, ...r }) => r))]);
    return res.rows.map((r) => String(r.id)).sort((a, b) => (BigInt(a) < BigInt(b) ? -1 : 1));
  }
  throw new TypeError('enqueue: pass a pg client in a transaction or an mssql Transaction');
}

/** One message: enqueueBatch(tx, [message]); resolves to its id. */
export async function enqueue(tx, message) {
  return (await enqueueBatch(tx, [message]))[0];
}
