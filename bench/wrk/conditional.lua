-- Conditional appends of one event over HTTP/1.1, the body annals-bench's own client sends for
-- `--workload conditional`: each event carries a tag of its own and a condition on it, checked
-- and never failing, and an `account:N` tag among 10,000. Run by bench/wrk/conditional.sh.

local data = string.rep("x", 256)
local threads = 0

function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end

local n = 0

function request()
  n = n + 1
  local key = "key:wrk-" .. id .. "-" .. n
  local body = '{"events":[{"type":"BenchEvent","tags":["' .. key .. '","account:'
    .. (n * 7919 % 10000) .. '"],"data":"' .. data .. '"}],'
    .. '"condition":{"failIfEventsMatch":{"items":[{"tags":["' .. key .. '"]}]}}}'
  return wrk.format("POST", "/v1/append", { ["Content-Type"] = "application/json" }, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"appends_per_second":%.1f,"p50_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d,'
      .. '"non_2xx":%d,"socket_errors":%d}\n',
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max,
    e.status, e.connect + e.read + e.write + e.timeout))
end
