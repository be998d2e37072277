// verify_standard_webhooks.js
//   Checks requests logged by the test sink (test/sink/qb_sink --log) as a
//   Standard Webhooks receiver would, with the spec's own JavaScript library:
//   new Webhook(secret).verify(body, headers).
//
// Usage: node verify_standard_webhooks.js LOG.jsonl PATH SECRET...
//   Every logged request to PATH is verified under each SECRET alone, and
//   once more with its body tampered (one character appended), which must
//   fail.  Prints one JSON object:
//     {"requests": n, "verified": [per secret], "tampered_rejected": [per secret],
//      "errors": ["...", ...]}
//   and exits 1 when any request fails a check (0 requests is a failure too).
"use strict";

const fs = require("fs");
const { Webhook } = require("standardwebhooks");

const [logPath, path, ...secrets] = process.argv.slice(2);
if (!logPath || !path || secrets.length === 0) {
  console.error("usage: node verify_standard_webhooks.js LOG.jsonl PATH SECRET...");
  process.exit(2);
}

const requests = fs
  .readFileSync(logPath, "utf8")
  .split("\n")
  .filter((line) => line.trim() !== "")
  .map((line) => JSON.parse(line))
  .filter((r) => r.path === path);

const result = {
  requests: requests.length,
  verified: secrets.map(() => 0),
  tampered_rejected: secrets.map(() => 0),
  errors: [],
};

for (const r of requests) {
  const id = r.headers["webhook-id"];
  secrets.forEach((secret, i) => {
    const wh = new Webhook(secret);
    try {
      wh.verify(r.body, r.headers);
      result.verified[i]++;
    } catch (e) {
      result.errors.push(`${id}: secret ${i}: ${e.message}`);
    }
    try {
      wh.verify(r.body + " ", r.headers);
      result.errors.push(`${id}: secret ${i}: a tampered body verified`);
    } catch (e) {
      result.tampered_rejected[i]++;
    }
  });
}

console.log(JSON.stringify(result));
process.exit(result.errors.length === 0 && requests.length > 0 ? 0 : 1);
