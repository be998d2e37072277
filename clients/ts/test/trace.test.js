// The handler's span continues the trace a message arrived with
// (docs/observability.md, "Trace context"): an OpenTelemetry tracer given to
// the worker, spans recorded in memory, on a real PostgreSQL (TAP 033).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { context, trace } from '@opentelemetry/api';
import { AsyncHooksContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';

import { InboxWorker, fromPg, traceContextOf } from '../src/index.js';

const host = process.env.QBI_TEST_PGHOST;
if (!host) throw new Error('QBI_TEST_PGHOST and QBI_TEST_PGPORT are not set (TAP 033 runs these tests)');
const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';

test('traceContextOf reads the headers as the spec says', () => {
  assert.deepEqual(traceContextOf({ headers: { Traceparent: `00-${TRACE}-00f067aa0ba902b7-01`, tracestate: 'a=1' } }),
    { traceId: TRACE, spanId: '00f067aa0ba902b7', traceFlags: 1, traceState: 'a=1' });
  assert.equal(traceContextOf({ headers: {} }), null);
  assert.equal(traceContextOf({ headers: { traceparent: `00-${'0'.repeat(32)}-00f067aa0ba902b7-01` } }), null);
  assert.equal(traceContextOf({ headers: { traceparent: `ff-${TRACE}-00f067aa0ba902b7-01` } }), null);
  assert.equal(traceContextOf({ headers: { traceparent: `00-${TRACE.toUpperCase()}-00f067aa0ba902b7-01` } }), null);
});

test('the handler runs in a child span of the message\'s traceparent', async () => {
  context.setGlobalContextManager(new AsyncHooksContextManager().enable());
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const tracer = provider.getTracer('trace.test');
  const pool = new pg.Pool({ host, port: Number(process.env.QBI_TEST_PGPORT), database: 'postgres', max: 4 });
  try {
    await pool.query("DELETE FROM queuebox.inbox WHERE source = 'traced'");
    await pool.query(`INSERT INTO queuebox.inbox (source, idempotency_key, payload, headers, consumption)
      VALUES ('traced', 't1', '{}', $1, 'pull'), ('traced', 't2', '{}', '{}', 'pull')`,
    [{ traceparent: `00-${TRACE}-00f067aa0ba902b7-01`, tracestate: 'congo=1' }]);
    const worker = new InboxWorker(fromPg(pool), { source: 'traced', idleMs: 20, tracer });
    const inHandler = {};
    const stop = new AbortController();
    const run = worker.run(async (m) => {
      inHandler[m.idempotencyKey] = trace.getSpan(context.active())?.spanContext();
      if (Object.keys(inHandler).length === 2) stop.abort();
    }, stop.signal);
    await run;
    const spans = exporter.getFinishedSpans();
    assert.equal(spans.length, 2);
    const traced = spans.find((s) => s.spanContext().traceId === TRACE);
    assert.ok(traced, 'a span in the message\'s trace');
    assert.equal(traced.parentSpanId, '00f067aa0ba902b7');
    assert.notEqual(traced.spanContext().spanId, '00f067aa0ba902b7');
    assert.equal(traced.name, 'queuebox.inbox process');
    assert.equal(inHandler.t1.spanId, traced.spanContext().spanId, 'the handler sees its span as the active one');
    const root = spans.find((s) => s !== traced);
    assert.equal(root.parentSpanId, undefined, 'a message with no traceparent: a root span');
  } finally {
    await pool.end();
    await provider.shutdown();
  }
});
