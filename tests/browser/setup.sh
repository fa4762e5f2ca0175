#!/usr/bin/env bash
# Installs what the browser tests drive: Debian's headless Chromium and its ChromeDriver
# (packages `chromium` and `chromium-driver`). Idempotent. Needs root or password-less sudo to
# install; without either it says what to run and exits 0, and the browser tests then skip with a
# message — unless PATTERD_REQUIRE_BROWSER=1 (CI sets it), which makes this script and those
# tests fail instead.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "browser tests ready: $(chromium --version 2>/dev/null | head -1), $(chromedriver --version | head -1)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "browser tests: chromium/chromedriver missing; install them with" >&2
    echo "  sudo apt-get install chromium chromium-driver" >&2
    [ "${PATTERD_REQUIRE_BROWSER:-}" = 1 ] && exit 1
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
echo "browser tests ready: $(chromium --version 2>/dev/null | head -1), $(chromedriver --version | head -1)"
