#!/usr/bin/env python3
"""Writes models/silero/expected_book_table.txt: the ORIGINAL `silero_vad.onnx` (from the wheel)
run in onnxruntime at 8 kHz over tests/fixtures/speech/book_table.ulaw preceded by 0.5 s and
followed by 1 s of silence, in windows of 256 new samples plus the previous 32 as context (as
`audio::silero` feeds it), one speech probability per line. The feature-gated test compares
tract on the derived model against these.

    python3 models/silero/expected.py silero_vad-6.2.3-py3-none-any.whl
"""

import audioop
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

root = Path(__file__).resolve().parents[2]
with zipfile.ZipFile(sys.argv[1]) as z:
    original = z.read("silero_vad/data/silero_vad.onnx")
ulaw = (root / "tests/fixtures/speech/book_table.ulaw").read_bytes()
pcm = np.frombuffer(audioop.ulaw2lin(ulaw, 2), dtype=np.int16).astype(np.float32) / 32768.0
x = np.concatenate([np.zeros(4000, np.float32), pcm, np.zeros(8000, np.float32)])
x = x[: len(x) // 256 * 256]
sess = ort.InferenceSession(original, providers=["CPUExecutionProvider"])
state = np.zeros((2, 1, 128), dtype=np.float32)
context = np.zeros(32, dtype=np.float32)
probs = []
for i in range(0, len(x), 256):
    chunk = x[i : i + 256]
    inp = np.concatenate([context, chunk])[None, :]
    p, state = sess.run(None, {"input": inp, "state": state, "sr": np.array(8000, dtype=np.int64)})
    probs.append(float(p.reshape(-1)[0]))
    context = chunk[-32:]
out = root / "models/silero/expected_book_table.txt"
out.write_text("".join(f"{p:.6f}\n" for p in probs))
print(f"{len(probs)} windows, max {max(probs):.3f}, written to {out}")
