"""Pipecat's Smart Turn path on the suite clips: the reference for tests/calls/smart_turn_reference.rs.

Each clip of tests/fixtures/suite (8 kHz mu-law) is laid out as the call's audio ring sees it:
LEAD_MS of silence (the greeting), the clip in 20 ms frames (the last one padded with silence),
then TRAIL_MS of silence (what our detector has heard when it says the caller stopped: its
vad_stop_ms is 160). The stream is decoded (G.711 table), resampled 8 -> 16 kHz with soxr
"HQ" exactly as pipecat 1.14.0's LocalSmartTurnAnalyzerV3._resample_to_model_rate does, the
last HELD_BACK output samples dropped (patterd's streaming resampler has not emitted them yet
when the model is asked; the Rust test checks the count), cut/zero-padded at the front to 8 s,
turned into features by pipecat's vendored Whisper extractor
(pipecat/audio/turn/smart_turn/_whisper_features.py, read from the wheel) and judged by
smart-turn-v3.2-cpu.onnx in Python onnxruntime 1.32.0, one thread.

Writes tests/fixtures/smart_turn/suite_reference.json: every clip's probability for each
trailing silence, and for the CHECKED clips two feature summaries over the last TAIL_FRAMES
frames (per mel bin mean; per frame mean over the bins) and the probabilities with soxr's
"VHQ" and "MQ" filters instead of "HQ" (the model's spread over equally valid resamplers).

Run (any venv with numpy, soxr and onnxruntime==1.32.0; tests/models/setup.sh first):
  python3 -m venv /tmp/st && /tmp/st/bin/pip install numpy soxr onnxruntime==1.32.0
  /tmp/st/bin/python tests/models/smart_turn_reference.py
"""

import json
import os
import pathlib
import sys
import zipfile

import numpy as np
import onnxruntime as ort
import soxr

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests/fixtures/suite"
OUT = ROOT / "tests/fixtures/smart_turn/suite_reference.json"
MODELS = pathlib.Path(os.environ.get("PATTERD_MODELS_DIR", pathlib.Path.home() / ".cache/patterd-models"))
WHEEL = MODELS / "wheels/pipecat_ai-1.14.0-py3-none-any.whl"
LEAD_MS = 1000
TRAILS_MS = [0, 160, 500, 1000]
HELD_BACK = 160  # 10 ms: patterd's resampler delay, checked by the Rust test
TAIL_FRAMES = 100
CHECKED = [
    ("done_can_you_repeat_that_1", 160),
    ("done_i_would_like_a_table_for_0", 160),
    ("head_i_need_to_0", 160),
    ("head_eight_of_spades_five_of__1", 160),
    ("real_selfish", 160),
    ("real_ten_clubs", 500),
]
FAMILIES = ("done_", "head_", "tail_", "real_")

with zipfile.ZipFile(WHEEL) as z:
    src = z.read("pipecat/audio/turn/smart_turn/_whisper_features.py").decode()
ns = {}
exec(compile(src, "_whisper_features.py", "exec"), ns)
features_of = ns["compute_whisper_log_mel_features"]

so = ort.SessionOptions()
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
sess = ort.InferenceSession(str(MODELS / "smart-turn-v3.2-cpu.onnx"), sess_options=so)


def ulaw_decode(b):
    u = ~np.frombuffer(b, np.uint8).astype(np.int32) & 0xFF
    sign, exp, man = u & 0x80, (u >> 4) & 7, u & 0x0F
    s = (((man << 3) + 0x84) << exp) - 0x84
    return np.where(sign != 0, -s, s).astype(np.int16)


def stream(clip, trail_ms):
    frames = -(-len(clip) // 160)
    body = clip + b"\xff" * (frames * 160 - len(clip))
    return b"\xff" * (8 * LEAD_MS) + body + b"\xff" * (8 * trail_ms)


def features(ulaw, quality="HQ"):
    pcm = ulaw_decode(ulaw).astype(np.float32) / 32768.0
    x = soxr.resample(pcm, 8000, 16000, quality=quality).astype(np.float32)
    if HELD_BACK:
        x = x[:-HELD_BACK]
    n = 16000 * 8
    x = x[-n:]
    x = np.pad(x, (n - x.size, 0))
    return features_of(x, do_normalize=True)


def probability(f):
    return float(sess.run(None, {"input_features": f[None, :, :]})[0][0][0])


entries = []
names = sorted(p.stem for p in SUITE.glob("*.ulaw") if p.stem.startswith(FAMILIES))
for name in names:
    clip = (SUITE / f"{name}.ulaw").read_bytes()
    for trail in TRAILS_MS:
        f = features(stream(clip, trail))
        e = {"clip": name, "trail_ms": trail, "probability": round(probability(f), 6)}
        if (name, trail) in CHECKED:
            tail = f[:, -TAIL_FRAMES:]
            e["mel_means"] = [round(float(v), 6) for v in tail.mean(axis=1)]
            e["frame_means"] = [round(float(v), 6) for v in tail.mean(axis=0)]
            # The same with soxr's other band-limiting filters: how much the model moves
            # with an equally valid 8 -> 16 kHz resampler (patterd's is rubato's FFT one).
            e["other_resamplers"] = [
                round(probability(features(stream(clip, trail), q)), 6) for q in ("VHQ", "MQ")
            ]
        entries.append(e)
        print(f"{name:34s} +{trail:4d} ms  p={e['probability']:.3f}", file=sys.stderr)

OUT.write_text(
    json.dumps(
        {
            "how": "tests/models/smart_turn_reference.py: pipecat 1.14.0 (soxr HQ, vendored Whisper "
            "features), onnxruntime 1.32.0 (Python), smart-turn-v3.2-cpu.onnx",
            "numpy": np.__version__,
            "soxr": soxr.__version__,
            "onnxruntime": ort.__version__,
            "lead_ms": LEAD_MS,
            "held_back": HELD_BACK,
            "tail_frames": TAIL_FRAMES,
            "entries": entries,
        },
        indent=0,
    )
    + "\n"
)
