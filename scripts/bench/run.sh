#!/usr/bin/env bash
# The whole benchmark of issue 7 in one command (about 8 minutes on a 2-core box after the
# release build, without idle waits):
#   1. builds patterd and patterd-loadgen (release),
#   2. runs the load sweep against patterd (N = 1 … 2000 concurrent calls),
#   3. creates a venv with getpatter 0.7.0 and runs the same load against Patter,
#   4. runs the criterion hot-path micro-benchmarks (last: compiling them loads the machine).
# Results go to bench-results/ (one JSON per run, markdown tables, server logs).
#
# `scripts/bench/run.sh targets` (issue 16) runs, instead of the patterd sweep, one run per
# target of issue 16 and writes bench-results/targets.md, one table each (then the Patter
# sweep and the criterion benches as usual; SKIP_PATTER=1 SKIP_CRITERION=1 to leave them out):
#   pinned-100, pinned-500   server on CPU 0, load generator on CPU 1: CPU per call with VAD
#                            on; at 500: late frames, underruns, added latency p99; idle RSS,
#                            RSS per call, cold start
#   unpinned-1000            1,000 calls, server and load generator sharing both cores
#   barge-500                500 calls pinned, each call's second turn barges in: onset → clear
#   cold start               COLD_RUNS (default 20) spawns of patterd to /readyz 200
#   TARGET_CALLS=100,500 TARGET_BIG=1000 TARGET_BARGE=500 change the sizes.
#
# Both servers get the same caller: a 1 s tone per turn, PAUSE_MS of silence after each reply
# (default 2000: Patter may keep its agent "speaking" for 1.5 s after playback ends -- its
# PATTER_TTS_TAIL_GRACE_MS -- and drops caller audio meanwhile; see docs/BENCHMARKS.md).
#
# Environment:
#   CALLS            patterd sweep (default 1,50,100,250,500,1000,2000)
#   PATTER_CALLS     Patter sweep (default 1,10,25,50,100)
#   RATE             calls started per second for patterd (default 200)
#   PATTER_RATE      the same for Patter (default 20: its STT sessions are matched to calls
#                    in order, which needs the calls spaced out; the steady window is the same)
#   HOLD_S           seconds all calls stay up after the last one started (default 10)
#   PAUSE_MS         caller's silence between a reply and its next turn (default 2000)
#   PIN=0            do not pin (default: server on CPU 0, load generator on CPU 1)
#   IDLE_LOAD=1.0    before each run, wait (checking every 30 s) until the 1-minute load
#   IDLE_UNTIL=HH:MM average is below IDLE_LOAD, but not past IDLE_UNTIL (UTC); off by default
#   STOP_AT=0.5      stop a sweep after a run where this share of calls/turns failed
#   BENCH_PATTER_VAD silero (default: Patter runs its Silero VAD) or none (the runs before
#                    2026-11-30 evening: no VAD); bench/patter/server.py
#   SKIP_PATTERD=1, SKIP_PATTER=1, SKIP_CRITERION=1
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench-results}
CALLS=${CALLS:-1,50,100,250,500,1000,2000}
PATTER_CALLS=${PATTER_CALLS:-1,10,25,50,100}
RATE=${RATE:-200}
PATTER_RATE=${PATTER_RATE:-20}
HOLD_S=${HOLD_S:-10}
PAUSE_MS=${PAUSE_MS:-2000}
STOP_AT=${STOP_AT:-0.5}
mkdir -p "$OUT/logs"
echo "== machine"
{ nproc; grep -m1 'model name' /proc/cpuinfo; free -h | head -2; uname -r; cat /proc/loadavg; } |
  tee "$OUT/machine.txt"

MODE=${1:-sweep}
cargo build --release -p patterd --bin patterd -p patterd-loadgen --bin patterd-loadgen
LG=(target/release/patterd-loadgen)
SRV_PIN=()
if [ "${PIN:-1}" = 1 ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  LG=(taskset -c 1 target/release/patterd-loadgen)
  SRV_PIN=(--server-cpus 0)
fi

wait_idle() {
  [ -n "${IDLE_LOAD:-}" ] || return 0
  local until=${IDLE_UNTIL:-23:59}
  while :; do
    local load now
    load=$(cut -d' ' -f1 /proc/loadavg)
    now=$(date -u +%H:%M)
    if awk -v l="$load" -v m="$IDLE_LOAD" 'BEGIN { exit !(l < m) }'; then
      echo "   load $load < $IDLE_LOAD at $now UTC"
      return 0
    fi
    if [[ "$now" > "$until" || "$now" == "$until" ]]; then
      echo "   still busy (load $load) at $now UTC; running anyway"
      return 0
    fi
    echo "   load $load at $now UTC; waiting"
    sleep 30
  done
}

# sweep LABEL CALLS RATE ARGS...: one load-generator process per N (so the idle wait can run
# before each), stops after a run past STOP_AT, then writes LABEL.json and LABEL.md.
sweep() {
  local label=$1 calls=$2 rate=$3
  shift 3
  local files=()
  for n in ${calls//,/ }; do
    wait_idle
    echo "   $label, $n calls: ${LG[*]} $* --calls $n --rate $rate --hold-s $HOLD_S --pause-ms $PAUSE_MS"
    "${LG[@]}" "$@" --label "$label" --calls "$n" --rate "$rate" --hold-s "$HOLD_S" \
      --pause-ms "$PAUSE_MS" --json "$OUT/$label-$n.json" --log-dir "$OUT/logs" ||
      { echo "   $label at $n calls failed; see $OUT/logs"; break; }
    files+=("$OUT/$label-$n.json")
    if jq -e --argjson s "$STOP_AT" '.[0] | (.failed_calls + .turns_missing)
        / ([.completed_calls + .failed_calls, 1] | max) + 0 >= $s' \
        "$OUT/$label-$n.json" >/dev/null; then
      echo "   $label is past its limit at $n calls; stopping its sweep"
      break
    fi
  done
  [ ${#files[@]} -gt 0 ] || return 0
  jq -s add "${files[@]}" >"$OUT/$label.json"
  target/release/patterd-loadgen --markdown-from "$OUT/$label.json" >"$OUT/$label.md"
}

# one_run NAME CALLS ARGS...: one load-generator run into $OUT/targets/NAME.json.
one_run() {
  local name=$1 n=$2
  shift 2
  wait_idle
  echo "   $name: $* --calls $n --rate $RATE --hold-s $HOLD_S --pause-ms $PAUSE_MS"
  "$@" --server target/release/patterd --label "$name" --calls "$n" --rate "$RATE" \
    --hold-s "$HOLD_S" --pause-ms "$PAUSE_MS" --json "$OUT/targets/$name.json" \
    --log-dir "$OUT/logs" --stop-at-failure 2 || echo "   $name failed; see $OUT/logs"
}

targets() {
  mkdir -p "$OUT/targets"
  local pin_lg=(taskset -c 1 target/release/patterd-loadgen) pin_srv=(--server-cpus 0)
  if [ "$(nproc)" -lt 2 ] || ! command -v taskset >/dev/null; then
    echo "   (fewer than 2 cores or no taskset: the pinned runs are not pinned)"
    pin_lg=(target/release/patterd-loadgen) pin_srv=()
  fi
  for n in ${TARGET_CALLS//,/ }; do
    one_run "pinned-$n" "$n" "${pin_lg[@]}" "${pin_srv[@]}"
  done
  one_run "unpinned-$TARGET_BIG" "$TARGET_BIG" target/release/patterd-loadgen
  one_run "barge-$TARGET_BARGE" "$TARGET_BARGE" "${pin_lg[@]}" "${pin_srv[@]}" --barge-in
  echo "   cold start: $COLD_RUNS spawns"
  target/release/patterd-loadgen --cold-start-runs "$COLD_RUNS" --server target/release/patterd \
    --json "$OUT/targets/cold.json" || echo "   cold start runs failed"
}

if [ "$MODE" = targets ]; then
  TARGET_CALLS=${TARGET_CALLS:-100,500}
  TARGET_BIG=${TARGET_BIG:-1000}
  TARGET_BARGE=${TARGET_BARGE:-500}
  COLD_RUNS=${COLD_RUNS:-20}
  echo "== issue 16 targets"
  targets
elif [ "${SKIP_PATTERD:-}" != 1 ]; then
  echo "== patterd: calls $CALLS"
  sweep patterd "$CALLS" "$RATE" --server target/release/patterd "${SRV_PIN[@]}"
fi

if [ "${SKIP_PATTER:-}" != 1 ]; then
  echo "== Patter (getpatter 0.7.0): calls $PATTER_CALLS"
  VENV=${PATTER_VENV:-$OUT/patter-venv}
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  # The silero extra (onnxruntime, numpy) gives Patter its Silero VAD (BENCH_PATTER_VAD,
  # default silero; bench/patter/server.py). Also added to a venv made before it was needed.
  if ! "$VENV/bin/python" -c 'import getpatter.providers.silero_vad' 2>/dev/null; then
    "$VENV/bin/pip" install -q "getpatter[silero]==0.7.0"
  fi
  sweep patter "$PATTER_CALLS" "$PATTER_RATE" \
    --server-cmd "exec $VENV/bin/python bench/patter/server.py" "${SRV_PIN[@]}" \
    --voice-path /webhooks/twilio/voice --health-path /health
fi
if [ "${SKIP_CRITERION:-}" != 1 ]; then
  echo "== criterion hot path"
  cargo bench --bench hot_path 2>&1 | grep -E '^[A-Za-z0-9_+]+ *$|time:' | tee "$OUT/criterion.txt"
fi

# The target tables last, so that Patter's figures (if it ran) are beside the first one.
if [ "$MODE" = targets ]; then
  scripts/bench/targets.sh "$OUT/targets" >"$OUT/targets.md"
fi
echo "== results"; cat "$OUT/patterd.md" "$OUT/patter.md" "$OUT/targets.md" 2>/dev/null || true
