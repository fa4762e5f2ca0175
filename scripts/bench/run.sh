#!/usr/bin/env bash
# The whole benchmark of issue 7 in one command (under ten minutes on a 2-core box):
#   1. builds patterd and patterd-loadgen (release),
#   2. runs the load sweep against patterd (N = 1 … 2000 concurrent calls),
#   3. runs the criterion hot-path micro-benchmarks,
#   4. creates a venv with getpatter 0.7.0 and runs the same load against Patter.
# Results go to bench-results/ (JSON, markdown tables, server logs).
# Environment: CALLS (patterd sweep), PATTER_CALLS, RATE, HOLD_S, SKIP_PATTER=1, SKIP_CRITERION=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench-results}
CALLS=${CALLS:-1,50,100,250,500,1000,2000}
PATTER_CALLS=${PATTER_CALLS:-1,50,100,250}
RATE=${RATE:-200}
HOLD_S=${HOLD_S:-10}
mkdir -p "$OUT/logs"
echo "== machine"; { nproc; grep -m1 'model name' /proc/cpuinfo; free -h | head -2; cat /proc/loadavg; } | tee "$OUT/machine.txt"

cargo build --release --bin patterd --bin patterd-loadgen
LG=target/release/patterd-loadgen

echo "== patterd: calls $CALLS"
"$LG" --server target/release/patterd --label patterd --calls "$CALLS" --rate "$RATE" \
  --hold-s "$HOLD_S" --json "$OUT/patterd.json" --markdown "$OUT/patterd.md" --log-dir "$OUT/logs"

if [ "${SKIP_CRITERION:-}" != 1 ]; then
  echo "== criterion hot path"
  cargo bench --bench hot_path 2>&1 | grep -E '^[a-z_+]+ *$|time:' | tee "$OUT/criterion.txt"
fi

if [ "${SKIP_PATTER:-}" != 1 ]; then
  echo "== Patter (getpatter 0.7.0): calls $PATTER_CALLS"
  VENV=${PATTER_VENV:-$OUT/patter-venv}
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q getpatter==0.7.0
  fi
  "$LG" --server-cmd "exec $VENV/bin/python bench/patter/server.py" --label patter \
    --voice-path /webhooks/twilio/voice --health-path /health --calls "$PATTER_CALLS" \
    --rate "$RATE" --hold-s "$HOLD_S" --json "$OUT/patter.json" --markdown "$OUT/patter.md" \
    --log-dir "$OUT/logs" || echo "Patter run failed; see $OUT/logs"
fi
echo "== results"; cat "$OUT/patterd.md" "$OUT/patter.md" 2>/dev/null || true
