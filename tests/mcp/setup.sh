#!/usr/bin/env bash
# Creates the Python virtual environment the MCP interop tests use (tests/control/mcp.rs drives the
# official Python `mcp` client against patterd's /mcp endpoint and `patterd mcp --stdio`).
# Idempotent: re-running only installs what is missing. Override the location with
# PATTERD_MCP_VENV (default: tests/mcp/.venv).
set -euo pipefail
cd "$(dirname "$0")"
VENV="${PATTERD_MCP_VENV:-.venv}"
MCP_VERSION="1.26.0"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import mcp, sys; from importlib.metadata import version; sys.exit(version('mcp') != '$MCP_VERSION')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "mcp==$MCP_VERSION"
fi
echo "MCP test venv ready: $(cd "$VENV" && pwd) (mcp $MCP_VERSION)"
