#!/usr/bin/env bash
# Everything the test suite needs beyond Cargo, each step idempotent: the Python venv with the
# official MCP client (tests/mcp/setup.sh), the Python venv with the Standard Webhooks verifier
# (tests/webhooks/setup.sh), headless Chromium + ChromeDriver for the browser
# tests (tests/browser/setup.sh) and Debian's PostgreSQL server binaries for the PostgreSQL store
# tests (tests/postgres/setup.sh: Debian's `postgresql` package; the tests start a throwaway
# server of their own with its initdb and pg_ctl) and Debian's pocketsphinx-testdata clips for the
# local speech-to-text tests (tests/speech/setup.sh). README.md's test command runs this, then `cargo test`.
set -euo pipefail
cd "$(dirname "$0")"
./mcp/setup.sh
./webhooks/setup.sh
./browser/setup.sh
./postgres/setup.sh
./speech/setup.sh
# The Smart Turn library and model, and the Whisper model (tests/speech/setup.sh, above), only
# when asked (the scripts print their paths).
if [ "${PATTERD_MODELS:-0}" = "1" ]; then
  ./models/setup.sh
fi
