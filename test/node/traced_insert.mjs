// test/node/traced_insert.mjs: an application's traced write through the pg
// driver, as sqlcommenter leaves it: the statement ends with a comment of
// URL-encoded key='value' pairs, keys sorted (db_driver, traceparent,
// tracestate). TAP 055 runs it; the outbox row must take that context.
//
//   node traced_insert.mjs TOPIC TRACEPARENT TRACESTATE   (PG* variables: the server)
import pg from 'pg';

const [topic, traceparent, tracestate] = process.argv.slice(2);
const comment = [
  `db_driver='${encodeURIComponent('node-postgres')}'`,
  `traceparent='${encodeURIComponent(traceparent)}'`,
  `tracestate='${encodeURIComponent(tracestate)}'`,
].join(',');
const client = new pg.Client();
await client.connect();
try {
  await client.query('BEGIN');
  const r = await client.query(
    `INSERT INTO queuebox.outbox (topic, payload) VALUES ($1, $2) RETURNING id /*${comment}*/`,
    [topic, { traced: true }]);
  await client.query('COMMIT');
  console.log(r.rows[0].id);
} finally {
  await client.end();
}
