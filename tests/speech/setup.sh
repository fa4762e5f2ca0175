#!/usr/bin/env bash
# Installs what the local speech-to-text tests need (`cargo test --features whisper`): Debian's
# pocketsphinx-testdata (public-domain real speech: LibriVox and CMU utterances, goforward.raw
# "go forward ten meters", under /usr/share/pocketsphinx/test/data), and, when
# PATTERD_MODELS=1, the Whisper model through scripts/setup/whisper.sh. Idempotent. Needs root
# or password-less sudo for apt; without either it says what to run and exits 0, and the tests
# then skip with a message — unless PATTERD_REQUIRE_LOCAL_SPEECH=1 (CI sets it), which makes
# this script and those tests fail instead.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -f /usr/share/pocketsphinx/test/data/goforward.raw ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
      echo "local speech tests: the clips are missing; install them with" >&2
      echo "  sudo apt-get install pocketsphinx-testdata" >&2
      [ "${PATTERD_REQUIRE_LOCAL_SPEECH:-}" = 1 ] && exit 1
      exit 0
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -qq --no-install-recommends pocketsphinx-testdata >/dev/null 2>&1 || {
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends pocketsphinx-testdata >/dev/null
  }
fi
echo "local speech tests: clips in /usr/share/pocketsphinx/test/data"
if [ "${PATTERD_MODELS:-0}" = "1" ]; then
  ../../scripts/setup/whisper.sh
fi
