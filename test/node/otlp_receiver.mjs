// An OTLP/HTTP trace receiver for test/t/observability/056_otlp.pl, built on OpenTelemetry's
// own protobuf definitions (@opentelemetry/otlp-transformer's generated
// ExportTraceServiceRequest): each POST /v1/traces body (OTLP JSON) is read
// as the OTLP JSON mapping says (trace and span ids in hex), decoded into the
// protobuf message, encoded and decoded again, and checked (ids of 16 and 8
// bytes, a name, times); each span becomes one JSON line of the output file.
// A body that does not decode is answered 400 and written to OUT.bad.
//
//   node otlp_receiver.mjs PORT_FILE OUT [STATUS]
// STATUS (default 200) is the answer to every valid post: 503 plays a
// receiver that is overloaded.
import { createRequire } from 'node:module';
import { appendFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';

const require = createRequire(import.meta.url);
const root = require('@opentelemetry/otlp-transformer/build/src/generated/root');
const Request = root.opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest;

const [portFile, out, statusArg] = process.argv.slice(2);
const status = Number(statusArg || 200);

const hexToB64 = (h) => Buffer.from(h, 'hex').toString('base64');
// an AnyValue's oneof names the field it holds; intValue decodes as a Long
const value = (v) => (v.value === 'intValue' ? Number(v.intValue.toString()) : v[v.value]);

function decode(text) {
  const json = JSON.parse(text);
  // the OTLP JSON mapping writes ids in hex; protobufjs reads bytes as base64
  for (const rs of json.resourceSpans || []) {
    for (const ss of rs.scopeSpans || []) {
      for (const s of ss.spans || []) {
        if (!/^[0-9a-f]{32}$/.test(s.traceId)) throw new Error(`traceId ${s.traceId}`);
        if (!/^[0-9a-f]{16}$/.test(s.spanId)) throw new Error(`spanId ${s.spanId}`);
        if (s.parentSpanId !== undefined && !/^[0-9a-f]{16}$/.test(s.parentSpanId)) throw new Error(`parentSpanId ${s.parentSpanId}`);
        s.traceId = hexToB64(s.traceId);
        s.spanId = hexToB64(s.spanId);
        if (s.parentSpanId !== undefined) s.parentSpanId = hexToB64(s.parentSpanId);
      }
    }
  }
  const parsed = Request.fromObject(json);
  const err = Request.verify(parsed);
  if (err) throw new Error(err);
  // through the wire format and back: what a collector would hold
  const msg = Request.decode(Request.encode(parsed).finish());
  const spans = [];
  for (const rs of msg.resourceSpans) {
    const resource = Object.fromEntries(rs.resource.attributes.map((a) => [a.key, value(a.value)]));
    for (const ss of rs.scopeSpans) {
      for (const s of ss.spans) {
        if (s.traceId.length !== 16 || s.spanId.length !== 8) throw new Error('bad id length');
        if (!s.name) throw new Error('a span without a name');
        const start = BigInt(s.startTimeUnixNano.toString());
        const end = BigInt(s.endTimeUnixNano.toString());
        if (start <= 0n || end < start) throw new Error(`times ${start} ${end}`);
        spans.push({
          resource,
          scope: ss.scope.name,
          traceId: Buffer.from(s.traceId).toString('hex'),
          spanId: Buffer.from(s.spanId).toString('hex'),
          parentSpanId: s.parentSpanId && s.parentSpanId.length ? Buffer.from(s.parentSpanId).toString('hex') : null,
          traceState: s.traceState || '',
          name: s.name,
          kind: s.kind,
          status: s.status ? { code: s.status.code, message: s.status.message || '' } : null,
          attributes: Object.fromEntries(s.attributes.map((a) => [a.key, value(a.value)])),
          durationNs: (end - start).toString(),
        });
      }
    }
  }
  return spans;
}

const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks).toString('utf8');
    if (req.method !== 'POST' || req.url !== '/v1/traces' ||
        !(req.headers['content-type'] || '').startsWith('application/json')) {
      appendFileSync(`${out}.bad`, `${req.method} ${req.url} ${req.headers['content-type']}\n`);
      res.writeHead(404).end();
      return;
    }
    let spans;
    try {
      spans = decode(body);
    } catch (e) {
      appendFileSync(`${out}.bad`, `${e.message}: ${body}\n`);
      res.writeHead(400, { 'content-type': 'application/json' }).end('{}');
      return;
    }
    if (status === 200) {
      appendFileSync(out, spans.map((s) => JSON.stringify({ ...s, headers: { 'x-api-key': req.headers['x-api-key'] || null } }) + '\n').join(''));
    }
    res.writeHead(status, { 'content-type': 'application/json' }).end('{}');
  });
});
server.listen(0, '127.0.0.1', () => {
  writeFileSync(portFile, String(server.address().port));
});
