#!/usr/bin/env bash
# The robustness suite of docs/ROBUSTNESS.md, in one command.
#
#   scripts/robustness.sh          fixed-seed parser properties (3,628 cases), the tests of
#                                  issue 11's holes 4 and 5, every fault test, the small
#                                  forged-webhook flood (debug build)
#   scripts/robustness.sh --long   the parser properties only, 200,000 cases a target with a
#                                  random seed, release build (PROPTEST_CASES and
#                                  PROPTEST_RNG_SEED override; a failure prints its seed)
#   FLOOD=1 scripts/robustness.sh
#                                  the floods of docs/ROBUSTNESS.md while 50 simulated calls
#                                  are live (patterd-loadgen --flood-*, release build, ~2.5 min;
#                                  2+ cores: patterd pinned to CPU 0, the load generator to 1)
#
# `cargo test` (and so .ci/run) runs the fixed-seed parts too.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--long" ]; then
  export PROPTEST_CASES="${PROPTEST_CASES:-200000}"
  exec cargo test --release --test wire parsers::
fi

if [ "${FLOOD:-}" = "1" ]; then
  cargo build --release -p patterd --bin patterd -p patterd-loadgen --bin patterd-loadgen
  T="${CARGO_TARGET_DIR:-target}/release"
  exec taskset -c 1 "$T/patterd-loadgen" --server "$T/patterd" --server-cpus 0 \
    --calls 50 --hold-s 60 --flood-after-s 10 \
    --flood-webhooks 10000 --flood-idle-ws 1000 --flood-oversized 300 --flood-slowloris 200
fi

echo "== parsers under random input (fixed seed), Plivo signatures and vectors"
cargo test --test wire -- parsers:: plivo_signature:: carrier_vectors::plivo
echo "== outbound caps under a race"
cargo test --test control outbound_caps::
echo "== the daemon under SIGTERM and SIGKILL"
cargo test --test control daemon::
echo "== faulty peers during calls, forged-webhook flood"
cargo test --test calls -- faults:: flood:: twilio:: caller_hanging_up_mid_reply malformed_frames forged_signatures media_socket_with_bad_token
echo "== provider clients against failing fakes"
cargo test --test wire providers::
