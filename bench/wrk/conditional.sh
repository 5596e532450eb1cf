#!/usr/bin/env bash
# HTTP conditional appends from wrk (64 connections, one wrk thread), against `annals serve`
# of the given build on a fresh data directory, D3, beside the fdatasync floor of the same
# directory measured in the same run. Prints one JSON line: the floor, each run's wrk figures,
# and the median run's ratio to the floor.
#
#   bench/wrk/conditional.sh ANNALS_BIN ANNALS_BENCH_BIN DIR [RUNS] [SECONDS]
set -euo pipefail
annals="$1" bench="$2" dir="$3" runs="${4:-3}" seconds="${5:-10}"
here="$(cd "$(dirname "$0")" && pwd)"
command -v wrk >/dev/null || { echo "wrk is not installed: run scripts/setup" >&2; exit 1; }
mkdir -p "$dir"
floor=$("$bench" fsync --dir "$dir" | tail -1)
results=()
for _ in $(seq "$runs"); do
  rm -rf "$dir/data"
  port=$((20000 + RANDOM % 20000))
  "$annals" serve --data-dir "$dir/data" --http "127.0.0.1:$port" --grpc off --no-console \
    >"$dir/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do
    grep -q "annals: listening" "$dir/serve.log" && break
    sleep 0.1
  done
  # One second of warm-up, then the measured run.
  wrk -t1 -c64 -d1s -s "$here/conditional.lua" "http://127.0.0.1:$port" >/dev/null
  results+=("$(wrk -t1 -c64 -d"${seconds}s" -s "$here/conditional.lua" \
    "http://127.0.0.1:$port" | tail -1)")
  kill -TERM "$server"
  wait "$server" || true
done
python3 - "$floor" "${results[@]}" <<'PY'
import json, sys
floor = json.loads(sys.argv[1])
runs = [json.loads(r) for r in sys.argv[2:]]
rate = floor["fsync_floor_per_sec"]
median = sorted(runs, key=lambda r: r["appends_per_second"])[len(runs) // 2]
print(json.dumps({"benchmark": "wrk_http_conditional", "durability": "d3", "connections": 64,
                  "floor": floor, "runs": runs, "median": median,
                  "x_floor": round(median["appends_per_second"] / rate, 2) if rate else None}))
PY
