#!/usr/bin/env bash
# Creates the Python virtual environment the webhook tests verify deliveries with: the Standard
# Webhooks library from PyPI (`standardwebhooks`, pinned by hash in requirements.txt and
# installed with --require-hashes). tests/calls/webhooks.rs runs tests/webhooks/verify.py with
# it on what the daemon really sent. Idempotent. The venv lives under the Cargo target directory
# (override with PATTERD_WEBHOOKS_VENV); without it those tests skip with a message, unless
# PATTERD_REQUIRE_WEBHOOKS_VENV=1 (CI), which makes them fail.
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$(cd ../.. && pwd)"
VENV="${PATTERD_WEBHOOKS_VENV:-${CARGO_TARGET_DIR:-$ROOT/target}/webhooks-venv}"
VERSION="1.1.0"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import standardwebhooks, sys; from importlib.metadata import version; sys.exit(version('standardwebhooks') != '$VERSION')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes \
    --no-deps -r requirements.txt
fi
echo "webhooks test venv ready: $(cd "$VENV" && pwd) (standardwebhooks $VERSION)"
