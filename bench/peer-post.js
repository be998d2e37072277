/*
 * bench/peer-post.js: the POST the peers of bench/outbox-http (phase C) make
 * for each job, shared by bench/graphile/run.js and bench/pgboss/run.js.
 *
 *   const { makePeerPoster } = require("../peer-post");
 *   const post = makePeerPoster("http://127.0.0.1:PORT/events", 64);
 *   await post(bodyString, messageId);   // rejects unless the answer is 2xx
 *
 * The request is the one QueueBox's HTTP destination sends for an outbox row
 * of the benchmark: POST of the row's JSON payload with Content-Type
 * application/json, the row's header X-Correlation-Id (every benchmark row
 * has {"X-Correlation-Id": "c"}) and X-Message-Id (QueueBox sends the row's
 * message id; a peer sends its job id).
 *
 * Client: node:http with one http.Agent({keepAlive: true, maxSockets}).
 * Node 20's built-in fetch (undici) keeps connections alive too, but its
 * global dispatcher cannot be given a connection limit without the undici
 * package, and it costs the client far more CPU per request: against
 * qb_sink, 50,000 POSTs, 64 at a time, from one Node 20.20 process, node:http
 * with the agent did 11.8-12.7k requests/s and fetch 2.1-2.6k (2026-12-02,
 * this machine, two runs each), so fetch alone would cap a peer near the
 * 1.8k jobs/s first measured by hand with it.  The peers get the cheaper
 * client.
 *
 *   node bench/peer-post.js URL COUNT CONCURRENCY [agent|fetch]
 * posts COUNT bodies, CONCURRENCY at a time, and prints requests/s: the
 * measurement behind that choice.
 */
"use strict";

const http = require("node:http");

const REQUEST_TIMEOUT_MS = 30000;

function makePoster(url, maxSockets) {
  const u = new URL(url);
  const agent = new http.Agent({ keepAlive: true, maxSockets });
  return function post(body, messageId) {
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          host: u.hostname,
          port: u.port,
          path: u.pathname,
          method: "POST",
          agent,
          headers: {
            "Content-Type": "application/json",
            "Content-Length": Buffer.byteLength(body),
            "X-Correlation-Id": "c",
            "X-Message-Id": messageId,
          },
        },
        (res) => {
          res.resume(); // the sink's {"ok":true}; read to keep the socket reusable
          res.on("end", () => {
            if (res.statusCode >= 200 && res.statusCode < 300) resolve();
            else reject(new Error(`sink answered ${res.statusCode}`));
          });
          res.on("error", reject);
        }
      );
      req.setTimeout(REQUEST_TIMEOUT_MS, () => req.destroy(new Error("POST timed out")));
      req.on("error", reject);
      req.end(body);
    });
  };
}

function makeFetchPoster(url) {
  return async function post(body, messageId) {
    const res = await fetch(url, {
      method: "POST",
      body,
      headers: {
        "Content-Type": "application/json",
        "X-Correlation-Id": "c",
        "X-Message-Id": messageId,
      },
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    await res.arrayBuffer();
    if (!res.ok) throw new Error(`sink answered ${res.status}`);
  };
}

// QB_BENCH_PEER_CLIENT=fetch: the peers post with fetch instead (how the
// first peer figures were measured by hand, before this file)
function makePeerPoster(url, maxSockets) {
  return process.env.QB_BENCH_PEER_CLIENT === "fetch" ? makeFetchPoster(url) : makePoster(url, maxSockets);
}

// runPeer NAME MAIN TIMEOUT_S: run a peer's main(); a hard stop a minute
// after its own timeout, and a stack and exit 1 on any error
function runPeer(name, main, timeoutS) {
  const hard = setTimeout(() => {
    console.error(`${name}: timeout`);
    process.exit(1);
  }, (timeoutS + 60) * 1000);
  hard.unref();
  main().catch((e) => {
    console.error(`${name}:`, e && e.stack ? e.stack : e);
    process.exit(1);
  });
}

module.exports = { makePeerPoster, runPeer };

if (require.main === module) {
  const [url, countS, concS, kind = "agent"] = process.argv.slice(2);
  const count = parseInt(countS, 10);
  const conc = parseInt(concS, 10);
  if (!url || !(count > 0) || !(conc > 0)) {
    console.error("usage: node peer-post.js URL COUNT CONCURRENCY [agent|fetch]");
    process.exit(2);
  }
  const post = kind === "fetch" ? makeFetchPoster(url) : makePoster(url, conc);
  const body = JSON.stringify({ seq: 1, note: "x".repeat(280) });
  let next = 0;
  const lane = async () => {
    while (next < count) await post(body, String(next++));
  };
  const t0 = process.hrtime.bigint();
  Promise.all(Array.from({ length: conc }, lane)).then(() => {
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(JSON.stringify({ client: kind, requests: count, elapsed_s: +s.toFixed(3), req_per_s: Math.round(count / s) }));
  }, (e) => {
    console.error(e);
    process.exit(1);
  });
}
