#!/usr/bin/env bash
# Everything the test suite needs beyond Cargo, each step idempotent: the Python venv with the
# official MCP client (tests/mcp/setup.sh) and headless Chromium + ChromeDriver for the browser
# tests (tests/browser/setup.sh). README.md's test command runs this, then `cargo test`.
set -euo pipefail
cd "$(dirname "$0")"
./mcp/setup.sh
./browser/setup.sh
