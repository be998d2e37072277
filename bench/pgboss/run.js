#!/usr/bin/env node
/*
 * bench/pgboss/run.js: the pg-boss peer of bench/outbox-http (phase C).
 *
 *   node run.js CONNECTION_STRING N_JOBS SINK_URL [WORKERS] [BATCH] [SOCKETS] [TIMEOUT_S]
 *
 * Each job POSTs its payload to SINK_URL, as QueueBox's phase B delivers an
 * outbox row (bench/peer-post.js); a non-2xx answer fails that job.  The
 * payload is QB_BENCH_PAYLOAD_SQL, an SQL expression of the series value g
 * (bench/lib.sh's PAYLOAD_SQL, the outbox rows' payload).
 *
 * 1. boss.start() (creates the pgboss schema), createQueue('post') (policy
 *    standard);
 * 2. queues N jobs with boss.insert(), 10,000 per call, the payloads read
 *    from SQL, before any worker runs;
 * 3. starts WORKERS (default 4) workers with boss.work('post', {batchSize:
 *    BATCH (default 1000), pollingIntervalSeconds: 0.5}, handler): pg-boss
 *    10 has no per-worker concurrency option, so throughput comes from
 *    several work() calls and batchSize, as its docs say.  0.5 s is the
 *    shortest polling interval it accepts, and a worker waits out the
 *    interval after each batch that took less: 8 x 100 ran at its ceiling of
 *    1,600 jobs/s; 8 x 500, 16 x 250, 2 x 1000, 4 x 1000, 2 x 2000 and
 *    4 x 2000 at 2.3-4.2k/s on a shared machine, 2 x 1000 and 4 x 1000 the
 *    best, equal within the noise.  The handler POSTs its batch's jobs at once
 *    (at most SOCKETS, default 64, connections shared by the workers), fails
 *    the jobs whose POST failed (boss.fail) and returns: pg-boss then
 *    completes the batch's other jobs;
 * 4. measures from just before the first work() to when no job of the queue
 *    is created, retry or active (polls pgboss.job every 20 ms; completions
 *    are written by pg-boss after each handler returns);
 * 5. prints one JSON line: {"jobs": N, "elapsed_s": ..., "jobs_per_s": ...,
 *    "completed": ..., "failed_attempts": ..., "left": ...}.
 * Bounded: gives up after TIMEOUT_S seconds (default 900) and exits 1.
 */
"use strict";

const PgBoss = require("pg-boss");
const { Client } = require("pg");
const { makePeerPoster, runPeer } = require("../peer-post");

const [conn, nS, SINK_URL, workersS, batchS, socketsS, timeoutS] = process.argv.slice(2);
const N = parseInt(nS || "0", 10);
const WORKERS = parseInt(workersS || "4", 10);
const BATCH = parseInt(batchS || "1000", 10);
const SOCKETS = parseInt(socketsS || "64", 10);
const TIMEOUT_S = parseInt(timeoutS || "900", 10);
const PAYLOAD_SQL = process.env.QB_BENCH_PAYLOAD_SQL;
const QUEUE = "post";

if (!conn || !(N > 0) || !SINK_URL || !PAYLOAD_SQL || !(WORKERS > 0) || !(BATCH > 0) || !(SOCKETS > 0)) {
  console.error("usage: node run.js CONNECTION_STRING N_JOBS SINK_URL [WORKERS] [BATCH] [SOCKETS] [TIMEOUT_S]");
  console.error("       (the payload expression is read from QB_BENCH_PAYLOAD_SQL)");
  process.exit(2);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const deadline = Date.now() + TIMEOUT_S * 1000;
  // pool: a fetch and a completion per worker can be in flight at once
  const boss = new PgBoss({ connectionString: conn, max: 2 * WORKERS + 2 });
  boss.on("error", (e) => console.error("pgboss: error:", e && e.message ? e.message : e));
  await boss.start();
  await boss.createQueue(QUEUE);

  const db = new Client({ connectionString: conn });
  await db.connect();
  const CHUNK = 10000;
  const t0fill = process.hrtime.bigint();
  for (let done = 0; done < N; done += CHUNK) {
    const n = Math.min(CHUNK, N - done);
    const r = await db.query(`select ${PAYLOAD_SQL} as p from generate_series($1::int, $2::int) g`, [done + 1, done + n]);
    await boss.insert(r.rows.map((row) => ({ name: QUEUE, data: row.p })));
  }
  const fillS = Number(process.hrtime.bigint() - t0fill) / 1e9;
  const queued = (await db.query("select count(*)::int as n from pgboss.job where name = $1", [QUEUE])).rows[0].n;
  if (queued !== N) throw new Error(`queued ${queued} jobs, not ${N}`);
  await db.query("vacuum analyze pgboss.job");
  await db.query("checkpoint");

  const post = makePeerPoster(SINK_URL, SOCKETS);
  let posted = 0;
  let failedAttempts = 0;
  const handler = async (jobs) => {
    const results = await Promise.allSettled(jobs.map((j) => post(JSON.stringify(j.data), j.id)));
    const failed = jobs.filter((_, i) => results[i].status === "rejected").map((j) => j.id);
    posted += jobs.length - failed.length;
    if (failed.length) {
      failedAttempts += failed.length;
      // these leave the active state; pg-boss's completion of the batch
      // (all ids, state = 'active' only) then leaves them alone
      await boss.fail(QUEUE, failed, { message: "POST failed" });
    }
  };

  const t0 = process.hrtime.bigint();
  for (let i = 0; i < WORKERS; i++) {
    await boss.work(QUEUE, { batchSize: BATCH, pollingIntervalSeconds: 0.5 }, handler);
  }
  let left = -1;
  let elapsed = 0;
  for (;;) {
    const r = await db.query(
      "select count(*)::int as n from pgboss.job where name = $1 and state in ('created', 'retry', 'active')",
      [QUEUE]
    );
    left = r.rows[0].n;
    elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
    if (left === 0 || Date.now() > deadline) break;
    await sleep(20);
  }
  const states = (await db.query(
    "select state::text, count(*)::int as n from pgboss.job where name = $1 group by 1 order by 1", [QUEUE]
  )).rows;
  await boss.stop({ graceful: false, wait: false });
  await db.end();
  const completed = (states.find((s) => s.state === "completed") || { n: 0 }).n;
  const out = {
    jobs: N,
    elapsed_s: +elapsed.toFixed(3),
    jobs_per_s: Math.round(N / elapsed),
    completed,
    posted,
    failed_attempts: failedAttempts,
    left,
    states: Object.fromEntries(states.map((s) => [s.state, s.n])),
    fill_s: +fillS.toFixed(3),
    workers: WORKERS,
    batch_size: BATCH,
    sockets: SOCKETS,
  };
  console.log(JSON.stringify(out));
  process.exit(left === 0 && completed === N ? 0 : 1);
}

runPeer("pgboss", main, TIMEOUT_S);
