#!/usr/bin/env bash
# Installs what the PostgreSQL store tests need: Debian's PostgreSQL server binaries (package
# `postgresql`: initdb, pg_ctl, postgres, psql). Idempotent. The tests start their own
# throwaway server from these binaries (crates/patterd-sim/src/postgres.rs) unless
# PATTERD_TEST_DATABASE_URL names one, and each test creates and drops its own database. Needs
# root or password-less sudo to install; without either it says what to run and exits 0, and the
# PostgreSQL tests then skip with a message — unless PATTERD_REQUIRE_POSTGRES=1 (CI sets it),
# which makes this script and those tests fail instead.
set -euo pipefail
have_server() {
  command -v initdb >/dev/null 2>&1 && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}
if have_server && command -v psql >/dev/null 2>&1; then
  echo "PostgreSQL tests ready: $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || command -v initdb)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "PostgreSQL tests: the server is missing; install it with" >&2
    echo "  sudo apt-get install postgresql" >&2
    [ "${PATTERD_REQUIRE_POSTGRES:-}" = 1 ] && exit 1
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
# Debian starts a cluster of its own on install; the tests do not use it.
echo "PostgreSQL tests ready: $(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
