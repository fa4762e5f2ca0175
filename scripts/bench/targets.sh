#!/usr/bin/env bash
# Issue 16's target tables from the runs `scripts/bench/run.sh targets` wrote into DIR
# (default bench-results/targets): one markdown table per target, measured figure beside the
# target. Needs jq. Usage: scripts/bench/targets.sh [DIR]
set -euo pipefail
DIR=${1:-bench-results/targets}
r() { jq -r "$2" "$DIR/$1.json" 2>/dev/null || echo "(no run)"; }
runs() { for f in "$DIR"/$1; do [ -e "$f" ] && echo "$f"; done; }
met() { awk -v v="$1" -v t="$2" 'BEGIN { print (v + 0 <= t + 0 ? "met" : "not met") }'; }

echo "## CPU per call, VAD on, server pinned to one core (target ≤ 0.12 % of a core)"
echo
echo "| calls | ok / failed | turns answered | CPU % core | CPU % core / call | target | loadgen CPU % (callers + fakes) | loadgen ÷ server | load avg |"
echo "|---:|---:|---:|---:|---:|---|---:|---:|---:|"
for f in $(runs 'pinned-*.json'); do
  jq -r '.[0] | [.calls, "\(.completed_calls) / \(.failed_calls)", "\(.turns_answered) / \(.turns)",
    (.server.cpu_pct_steady*10|round/10), (.server.cpu_pct_per_call*1000|round/1000),
    (if .server.cpu_pct_per_call <= 0.12 and .failed_calls == 0 and .turns_missing == 0
     then "met" else "not met (or calls failed)" end),
    "\(.loadgen_cpu_pct_steady|round) (\(.loadgen_callers_cpu_pct_steady|round) + \(.loadgen_fakes_cpu_pct_steady|round))",
    (.loadgen_cpu_pct_steady / ([.server.cpu_pct_steady, 0.01]|max) * 100|round/100), .loadavg_start]
    | "| " + (map(tostring) | join(" | ")) + " |"' "$f"
done
if [ -e "$DIR/../patter.json" ]; then
  echo
  echo "Patter (same fakes, run.sh's Patter sweep), CPU % core / call:" \
    "$(jq -r 'map("\(.calls) calls: \(.server.cpu_pct_per_call*100|round/100)") | join(", ")' "$DIR/../patter.json")"
fi
echo

B=$(for f in $(runs 'pinned-*.json'); do
  n=$(basename "$f" .json); echo "${n#pinned-} $f"; done | sort -n | tail -1 | cut -d' ' -f2)
echo "## The largest pinned run, 500 calls by default (targets: 0 late frames, 0 underruns, patterd's own added latency p99 ≤ 10 ms)"
echo
echo "(patterd's own: from the STT's end of utterance to the reply's first frame, less the brain's"
echo "and the TTS's time, from patterd's histograms; the callers' added latency includes the fakes'.)"
echo
echo "| calls | late gaps > 40 ms | underruns | malformed | patterd's own p50 / p99 ms (bucket ≤), % ≤ 10 ms | callers' added p50 / p99 / max ms | speech end → reply p50 / p99 ms | verdict |"
echo "|---:|---:|---:|---:|---:|---:|---:|---|"
if [ -n "$B" ]; then
  jq -r '.[0] | [.calls, .late_gaps, .underruns, .malformed_messages,
    "\(.patterd_own.p50_le_ms) / \(.patterd_own.p99_le_ms), \(.patterd_own.within_10ms_pct*10|round/10) %",
    "\(.added_ms.p50*100|round/100) / \(.added_ms.p99*100|round/100) / \(.added_ms.max*10|round/10)",
    "\(.e2e_ms.p50|round) / \(.e2e_ms.p99|round)",
    (if .late_gaps == 0 and .underruns == 0 and .patterd_own.p99_le_ms != null
        and .patterd_own.p99_le_ms <= 10 and .failed_calls == 0
     then "met" else "not met" end)] | "| " + (map(tostring) | join(" | ")) + " |"' "$B"
else
  echo "| (no run) | | | | | | | |"
fi
echo

echo "## 1,000 calls unpinned on the 2-core box, load generator included (targets: every call connected, every turn answered, 0 late frames)"
echo
echo "| calls | ok / failed | turns answered | late gaps > 40 ms | underruns | server CPU % of one core | loadgen CPU % | lagged loadgen ticks | added p50 / p99 ms | verdict |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for f in $(runs 'unpinned-*.json'); do
  jq -r '.[0] | [.calls, "\(.completed_calls) / \(.failed_calls)", "\(.turns_answered) / \(.turns)",
    .late_gaps, .underruns, (.server.cpu_pct_steady|round), (.loadgen_cpu_pct_steady|round),
    .loadgen_lag_ticks, "\(.added_ms.p50*10|round/10) / \(.added_ms.p99*10|round/10)",
    (if .failed_calls == 0 and .turns_missing == 0 and .late_gaps == 0 then "met" else "not met" end)]
    | "| " + (map(tostring) | join(" | ")) + " |"' "$f"
done
echo

echo "## Memory and cold start (targets: idle RSS ≤ 20 MiB, ≤ 150 KiB per call, cold start ≤ 50 ms)"
echo
echo "| run | idle RSS MiB | RSS MiB (all up) | RSS KiB / call |"
echo "|---|---:|---:|---:|"
for f in $(runs 'pinned-*.json') $(runs 'unpinned-*.json'); do
  jq -r '.[0] | "| \(.label) | \(.server.idle_rss_mib*10|round/10) | \(.server.steady_rss_mib*10|round/10) | \(.server.rss_per_call_kib|round) |"' "$f"
done
echo
if [ -e "$DIR/cold.json" ]; then
  echo "Cold start, exec → first /readyz 200 over $(r cold '.runs') spawns:" \
    "min $(r cold '.min_ms*10|round/10') ms, median $(r cold '.p50_ms*10|round/10') ms," \
    "p90 $(r cold '.p90_ms*10|round/10') ms, max $(r cold '.max_ms*10|round/10') ms" \
    "($(met "$(r cold '.p50_ms')" 50) on the median)."
  echo
fi

echo "## Barge-in under load (target: onset → clear p90 ≤ 250 ms at 500 calls)"
echo
echo "| calls | barge-ins | with a clear | onset → clear p50 / p90 / p99 ms | speech end → clear p50 / p90 ms | late gaps | verdict |"
echo "|---:|---:|---:|---:|---:|---:|---|"
for f in $(runs 'barge-*.json'); do
  jq -r '.[0] | [.calls, .barge_ins, .barge_in_onset_clear_ms.n,
    "\(.barge_in_onset_clear_ms.p50|round) / \(.barge_in_onset_clear_ms.p90|round) / \(.barge_in_onset_clear_ms.p99|round)",
    "\(.barge_in_clear_ms.p50|round) / \(.barge_in_clear_ms.p90|round)", .late_gaps,
    (if .barge_in_onset_clear_ms.n > 0 and .barge_in_onset_clear_ms.p90 <= 250 then "met" else "not met" end)]
    | "| " + (map(tostring) | join(" | ")) + " |"' "$f"
done
