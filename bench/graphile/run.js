#!/usr/bin/env node
/*
 * bench/graphile/run.js: the graphile-worker peer of bench/outbox-http (phase C).
 *
 *   node run.js CONNECTION_STRING N_JOBS [CONCURRENCY] [TIMEOUT_S] [MODE [SINK_URL N_KEYS]]
 *
 * MODE: noop (the default: jobs that do nothing, the anchor of earlier
 * runs), http (each job POSTs its payload to SINK_URL, as QueueBox's phase B
 * delivers an outbox row; a non-2xx answer fails the job), or http-keyed
 * (http, each job in the named queue of its row's key, 'k' || (g % N_KEYS):
 * graphile-worker runs the jobs of one queue one at a time, in order).  The
 * http modes take the payload from QB_BENCH_PAYLOAD_SQL, an SQL expression of
 * the series value g (bench/lib.sh's PAYLOAD_SQL, the outbox rows' payload).
 *
 * 1. runs graphile-worker's migrations in the database;
 * 2. queues N jobs with the bulk SQL API graphile_worker.add_jobs(),
 *    10,000 jobs per statement, before any worker runs;
 * 3. starts one worker with the configuration of graphile-worker's
 *    performance page (https://worker.graphile.org/docs/performance):
 *    concurrentJobs 24, maxPoolSize 25, localQueue { size: 500 },
 *    completeJobBatchDelay 0, failJobBatchDelay 0 (prepared statements are on
 *    by default);
 * 4. measures from just before run() to when graphile_worker._private_jobs
 *    is empty (completed jobs are deleted): it waits in-process for the N-th
 *    successful execution, then polls the table every 20 ms until the
 *    batched completions have landed;
 * 5. prints one JSON line: {"jobs": N, "elapsed_s": ..., "jobs_per_s": ...,
 *    "executed": ..., "failed_attempts": ..., "left": ...}.
 * Bounded: gives up after TIMEOUT_S seconds (default 900) and exits 1.
 */
"use strict";

const { run, runMigrations, Logger } = require("graphile-worker");
const { Client } = require("pg");
const { makePeerPoster, runPeer } = require("../peer-post");

const conn = process.argv[2];
const N = parseInt(process.argv[3] || "200000", 10);
const CONCURRENCY = parseInt(process.argv[4] || "24", 10);
const TIMEOUT_S = parseInt(process.argv[5] || "900", 10);
const MODE = process.argv[6] || "noop";
const SINK_URL = process.argv[7];
const N_KEYS = parseInt(process.argv[8] || "10000", 10);
const PAYLOAD_SQL = process.env.QB_BENCH_PAYLOAD_SQL;
const HTTP = MODE === "http" || MODE === "http-keyed";

if (!conn || !(N > 0) || !["noop", "http", "http-keyed"].includes(MODE) ||
    (HTTP && (!SINK_URL || !PAYLOAD_SQL || !(N_KEYS > 0)))) {
  console.error("usage: node run.js CONNECTION_STRING N_JOBS [CONCURRENCY] [TIMEOUT_S] [noop | http[-keyed] SINK_URL N_KEYS]");
  console.error("       (the http modes read the payload expression from QB_BENCH_PAYLOAD_SQL)");
  process.exit(2);
}

// Only warnings and errors: per-job logging would cost more than the job.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`graphile: ${level}: ${message}`);
});

const preset = {
  worker: {
    connectionString: conn,
    concurrentJobs: CONCURRENCY,
    maxPoolSize: CONCURRENCY + 1,
    pollInterval: 2000,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
    fileExtensions: [".js", ".cjs", ".mjs"],
    taskDirectory: __dirname + "/no-tasks",
    crontabFile: __dirname + "/no-crontab",
  },
};

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const deadline = Date.now() + TIMEOUT_S * 1000;
  await runMigrations({ preset, logger });

  const db = new Client({ connectionString: conn });
  await db.connect();
  await db.query("delete from graphile_worker._private_jobs");
  const CHUNK = 10000;
  const t0fill = process.hrtime.bigint();
  const payload = HTTP ? `(${PAYLOAD_SQL})::json` : "'{}'::json";
  const queue = MODE === "http-keyed" ? `'k' || (g % ${N_KEYS})` : "null";
  for (let done = 0; done < N; done += CHUNK) {
    const n = Math.min(CHUNK, N - done);
    await db.query(
      `select count(*) from graphile_worker.add_jobs(array(
         select ('${MODE === "noop" ? "noop" : "post"}', ${payload}, ${queue}, null, null, null, null, null)::graphile_worker.job_spec
         from generate_series($1::int, $2::int) g))`,
      [done + 1, done + n]
    );
  }
  const fillS = Number(process.hrtime.bigint() - t0fill) / 1e9;
  await db.query("vacuum analyze graphile_worker._private_jobs");
  await db.query("checkpoint");

  let executed = 0;
  let failedAttempts = 0;
  const post = HTTP ? makePeerPoster(SINK_URL, CONCURRENCY) : null;
  const taskList = {
    noop: async () => {
      executed++;
    },
    // One POST per job; a rejection (non-2xx, socket error) fails the job and
    // graphile-worker retries it later.
    post: async (payload, helpers) => {
      try {
        await post(JSON.stringify(payload), helpers.job.id);
      } catch (e) {
        failedAttempts++;
        throw e;
      }
      executed++;
    },
  };

  // The end is when the jobs table is empty (completed jobs are deleted;
  // completions are batched).  To keep the measurement off the database
  // while jobs run, wait in-process for the N-th execution first, then poll
  // the table every 20 ms.
  const t0 = process.hrtime.bigint();
  const runner = await run({ preset, logger, taskList, noHandleSignals: true });
  while (executed < N && Date.now() < deadline) await sleep(5);
  const execS = Number(process.hrtime.bigint() - t0) / 1e9;
  let left = -1;
  let elapsed = 0;
  for (;;) {
    const r = await db.query("select count(*)::int as n from graphile_worker._private_jobs");
    left = r.rows[0].n;
    elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
    if (left === 0 || Date.now() > deadline) break;
    await sleep(20);
  }
  await runner.stop();
  await db.end();
  const out = {
    jobs: N,
    elapsed_s: +elapsed.toFixed(3),
    jobs_per_s: Math.round(N / elapsed),
    executed,
    failed_attempts: failedAttempts,
    left,
    executed_s: +execS.toFixed(3),
    fill_s: +fillS.toFixed(3),
    concurrency: CONCURRENCY,
    mode: MODE,
  };
  console.log(JSON.stringify(out));
  process.exit(left === 0 ? 0 : 1);
}

runPeer("graphile", main, TIMEOUT_S);
