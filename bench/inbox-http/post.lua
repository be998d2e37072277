-- bench/inbox-http/post.lua: wrk script for the ingress benchmark.
--
-- POSTs a ~200-byte JSON body with a unique X-Id header per request
-- (thread number, run tag and a per-thread counter), counts the answers by
-- status in each thread and prints them from done():
--   QB_STATUS 202=.. 200=.. 4xx=.. 503=.. other=..
--   QB_ERRORS connect=.. read=.. write=.. timeout=..
--   QB_LAT p50=<ms> p99=<ms> max=<ms>
--   QB_DURATION_S <seconds>
-- The run tag comes from the environment (QB_RUN_TAG) so that keys stay
-- unique across runs even without a TRUNCATE.

local threads = {}
local nthreads = 0

function setup(thread)
	nthreads = nthreads + 1
	thread:set("tid", nthreads)
	table.insert(threads, thread)
end

local counter = 0
local tag = os.getenv("QB_RUN_TAG") or "r"
local pad = string.rep("x", 175)

-- per-thread counters, plain numbers so that done() can read them with
-- thread:get (wrk copies numbers and strings between Lua states, not tables)
c200, c202, c4xx, c503, cother = 0, 0, 0, 0, 0

function init(args)
	wrk.method = "POST"
	wrk.headers["Content-Type"] = "application/json"
end

function request()
	counter = counter + 1
	local body = string.format('{"n":%d,"tid":%d,"pad":"%s"}', counter, tid, pad)
	wrk.headers["X-Id"] = string.format("%s-%d-%d", tag, tid, counter)
	return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
	if status == 202 then c202 = c202 + 1
	elseif status == 200 then c200 = c200 + 1
	elseif status == 503 then c503 = c503 + 1
	elseif status >= 400 and status < 500 then c4xx = c4xx + 1
	else cother = cother + 1 end
end

function done(summary, latency, requests)
	local names = {"c200", "c202", "c4xx", "c503", "cother"}
	local total = {}
	for _, n in ipairs(names) do total[n] = 0 end
	for _, t in ipairs(threads) do
		for _, n in ipairs(names) do total[n] = total[n] + (t:get(n) or 0) end
	end
	io.write(string.format("QB_STATUS 202=%d 200=%d 4xx=%d 503=%d other=%d\n",
		total.c202, total.c200, total.c4xx, total.c503, total.cother))
	local e = summary.errors
	io.write(string.format("QB_ERRORS connect=%d read=%d write=%d status=%d timeout=%d\n",
		e.connect, e.read, e.write, e.status, e.timeout))
	io.write(string.format("QB_LAT p50=%.3f p99=%.3f max=%.3f\n",
		latency:percentile(50) / 1000.0, latency:percentile(99) / 1000.0, latency.max / 1000.0))
	io.write(string.format("QB_DURATION_S %.3f\n", summary.duration / 1e6))
	io.write(string.format("QB_REQUESTS %d\n", summary.requests))
end
