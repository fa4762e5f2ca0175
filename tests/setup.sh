#!/usr/bin/env bash
# Everything the test suite needs beyond Cargo, each step idempotent: the Python venv with the
# official MCP client (tests/mcp/setup.sh), the Python venv with the Standard Webhooks verifier
# (tests/webhooks/setup.sh), headless Chromium + ChromeDriver for the browser
# tests (tests/browser/setup.sh) and Debian's PostgreSQL server binaries for the PostgreSQL store
# tests (tests/postgres/setup.sh: Debian's `postgresql` package; the tests start a throwaway
# server of their own with its initdb and pg_ctl). README.md's test command runs this, then `cargo test`.
set -euo pipefail
cd "$(dirname "$0")"
./mcp/setup.sh
./webhooks/setup.sh
./browser/setup.sh
./postgres/setup.sh
# The Smart Turn library and model only when asked (tests/models/setup.sh prints their paths).
if [ "${PATTERD_MODELS:-0}" = "1" ]; then
  ./models/setup.sh
fi
