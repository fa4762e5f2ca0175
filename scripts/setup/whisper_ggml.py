#!/usr/bin/env python3
"""Convert a CTranslate2 Whisper model (model.bin + vocabulary.txt) to whisper.cpp's ggml file.

Usage: whisper_ggml.py CT2_MODEL_DIR OUT.bin

The CTranslate2 file (binary version 6) is a list of named tensors; this maps them to the names
whisper.cpp's loader asks for (those of OpenAI's PyTorch checkpoint), splits the fused attention
projections (self-attention Q|K|V, cross-attention K|V) back into separate matrices, and writes
whisper.cpp's format: the magic, eleven hyper-parameters, the 80 Slaney mel filters of a 400-point
FFT at 16 kHz (computed here, as librosa.filters.mel(sr=16000, n_fft=400, n_mels=80) does), the
byte-level vocabulary (GPT-2's byte-to-unicode mapping undone) and the tensors: matrices and
convolution kernels in float16 as stored, vectors, biases and positional embeddings in float32.

The output is deterministic: the mel frequencies use Python's math (not numpy's vectorised
transcendental functions, whose last bit may depend on the CPU), everything else is IEEE
arithmetic or a copy of the stored half floats, so its sha256 can be pinned.
Needs numpy only.
"""

import math
import re
import struct
import sys
from pathlib import Path

import numpy as np

GGML_MAGIC = 0x67676D6C
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
SAMPLE_RATE = 16000
N_FFT = 400


def read_ct2(path):
    """The variables of a CTranslate2 model.bin as {name: ndarray}, aliases resolved."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return vals

    def string():
        nonlocal pos
        (n,) = take("<H")
        s = data[pos : pos + n].rstrip(b"\0").decode()
        pos += n
        return s

    (version,) = take("<I")
    if version != 6:
        sys.exit(f"{path}: CTranslate2 binary version {version}, this converter reads version 6")
    spec = string()
    if spec != "WhisperSpec":
        sys.exit(f"{path}: a {spec}, not a Whisper model")
    take("<I")  # spec revision
    (count,) = take("<I")
    out = {}
    for _ in range(count):
        name = string()
        (rank,) = take("<B")
        dims = take(f"<{rank}I") if rank else ()
        (dtype,) = take("<B")
        (nbytes,) = take("<I")
        if dtype not in CT2_DTYPES:
            sys.exit(f"{path}: {name} has data type {dtype}, which this converter does not read")
        arr = np.frombuffer(data, dtype=CT2_DTYPES[dtype], count=nbytes // np.dtype(CT2_DTYPES[dtype]).itemsize, offset=pos)
        pos += nbytes
        out[name] = arr.reshape(dims) if rank else arr
    (aliases,) = take("<I")
    for _ in range(aliases):
        alias, target = string(), string()
        out[alias] = out[target]
    return out


def hz_to_mel(f):
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    if f < min_log_hz:
        return f / f_sp
    return min_log_hz / f_sp + math.log(f / min_log_hz) / (math.log(6.4) / 27.0)


def mel_to_hz(m):
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    if m < min_log_mel:
        return f_sp * m
    return min_log_hz * math.exp(math.log(6.4) / 27.0 * (m - min_log_mel))


def mel_filters(n_mels):
    """librosa.filters.mel(sr=16000, n_fft=400, n_mels) with htk=False, norm="slaney"."""
    fmax = SAMPLE_RATE / 2
    lo, hi = hz_to_mel(0.0), hz_to_mel(fmax)
    step = (hi - lo) / (n_mels + 1)
    # np.linspace(lo, hi, n_mels + 2): i * step + lo, the last point exactly hi.
    mels = [i * step + lo for i in range(n_mels + 1)] + [hi]
    mel_f = np.array([mel_to_hz(m) for m in mels], dtype=np.float64)
    fftfreqs = np.arange(N_FFT // 2 + 1, dtype=np.float64) * (SAMPLE_RATE / N_FFT)
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    weights = np.zeros((n_mels, N_FFT // 2 + 1), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0.0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    return (weights * enorm[:, None]).astype(np.float32)


def byte_decoder():
    """GPT-2's byte-to-unicode table, inverted: printable character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tensors(v, n_audio_layer, n_text_layer):
    """(whisper.cpp name, array) in the order OpenAI's checkpoint lists them."""
    def ln(prefix):
        return v[prefix + "/gamma"], v[prefix + "/beta"]

    def split(arr, parts):
        return np.split(arr, parts, axis=0)

    out = []
    out.append(("encoder.positional_embedding", v["encoder/position_encodings/encodings"]))
    out.append(("encoder.conv1.weight", v["encoder/conv1/weight"]))
    out.append(("encoder.conv1.bias", v["encoder/conv1/bias"].reshape(-1, 1)))
    out.append(("encoder.conv2.weight", v["encoder/conv2/weight"]))
    out.append(("encoder.conv2.bias", v["encoder/conv2/bias"].reshape(-1, 1)))

    def self_attn(dst, src):
        q, _k, val = split(v[src + "/linear_0/weight"], 3)
        qb, _kb, vb = split(v[src + "/linear_0/bias"], 3)
        g, b = ln(src + "/layer_norm")
        return [
            (dst + ".query.weight", q), (dst + ".query.bias", qb),
            (dst + ".key.weight", _k),
            (dst + ".value.weight", val), (dst + ".value.bias", vb),
            (dst + ".out.weight", v[src + "/linear_1/weight"]), (dst + ".out.bias", v[src + "/linear_1/bias"]),
        ], (g, b)

    def mlp(dst, src):
        g, b = ln(src + "/layer_norm")
        return [
            (dst + "_ln.weight", g), (dst + "_ln.bias", b),
            (dst + ".0.weight", v[src + "/linear_0/weight"]), (dst + ".0.bias", v[src + "/linear_0/bias"]),
            (dst + ".2.weight", v[src + "/linear_1/weight"]), (dst + ".2.bias", v[src + "/linear_1/bias"]),
        ]

    for i in range(n_audio_layer):
        p, s = f"encoder.blocks.{i}", f"encoder/layer_{i}"
        attn, (g, b) = self_attn(p + ".attn", s + "/self_attention")
        out += attn + [(p + ".attn_ln.weight", g), (p + ".attn_ln.bias", b)]
        out += mlp(p + ".mlp", s + "/ffn")
    g, b = ln("encoder/layer_norm")
    out += [("encoder.ln_post.weight", g), ("encoder.ln_post.bias", b)]

    out.append(("decoder.positional_embedding", v["decoder/position_encodings/encodings"]))
    out.append(("decoder.token_embedding.weight", v["decoder/embeddings/weight"]))
    for i in range(n_text_layer):
        p, s = f"decoder.blocks.{i}", f"decoder/layer_{i}"
        attn, (g, b) = self_attn(p + ".attn", s + "/self_attention")
        out += attn + [(p + ".attn_ln.weight", g), (p + ".attn_ln.bias", b)]
        c = s + "/attention"
        k, val = split(v[c + "/linear_1/weight"], 2)
        _kb, vb = split(v[c + "/linear_1/bias"], 2)
        g, b = ln(c + "/layer_norm")
        out += [
            (p + ".cross_attn.query.weight", v[c + "/linear_0/weight"]), (p + ".cross_attn.query.bias", v[c + "/linear_0/bias"]),
            (p + ".cross_attn.key.weight", k),
            (p + ".cross_attn.value.weight", val), (p + ".cross_attn.value.bias", vb),
            (p + ".cross_attn.out.weight", v[c + "/linear_2/weight"]), (p + ".cross_attn.out.bias", v[c + "/linear_2/bias"]),
            (p + ".cross_attn_ln.weight", g), (p + ".cross_attn_ln.bias", b),
        ]
        out += mlp(p + ".mlp", s + "/ffn")
    g, b = ln("decoder/layer_norm")
    out += [("decoder.ln.weight", g), ("decoder.ln.bias", b)]
    return out


def layers(v, part):
    """How many `{part}/layer_N/` blocks the model has."""
    return len({k.split("/")[1] for k in v if re.fullmatch(part + r"/layer_\d+/.*", k)})


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: whisper_ggml.py CT2_MODEL_DIR OUT.bin")
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    v = read_ct2(src / "model.bin")
    n_vocab, n_state = v["decoder/embeddings/weight"].shape
    n_audio_ctx = v["encoder/position_encodings/encodings"].shape[0]
    n_text_ctx = v["decoder/position_encodings/encodings"].shape[0]
    n_mels = v["encoder/conv1/weight"].shape[1]
    n_audio_layer = layers(v, "encoder")
    n_text_layer = layers(v, "decoder")
    n_audio_head = int(v["encoder/num_heads"][0])
    n_text_head = int(v["decoder/num_heads"][0])

    # The byte-level tokens before <|endoftext|>; whisper.cpp names the special ones itself.
    words = (src / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    eot = words.index("<|endoftext|>")
    decode = byte_decoder()
    vocab = [bytes(decode[ch] for ch in w) for w in words[:eot]]

    tmp = dst.with_name(dst.name + ".part")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<I", GGML_MAGIC))
        f.write(struct.pack("<11i", n_vocab, n_audio_ctx, n_state, n_audio_head, n_audio_layer,
                            n_text_ctx, n_state, n_text_head, n_text_layer, n_mels, 1))
        filters = mel_filters(n_mels)
        f.write(struct.pack("<ii", *filters.shape))
        f.write(filters.astype("<f4").tobytes())
        f.write(struct.pack("<i", len(vocab)))
        for w in vocab:
            f.write(struct.pack("<i", len(w)))
            f.write(w)
        for name, arr in tensors(v, n_audio_layer, n_text_layer):
            half = arr.ndim >= 2 and name not in (
                "encoder.conv1.bias", "encoder.conv2.bias",
                "encoder.positional_embedding", "decoder.positional_embedding")
            data = arr.astype("<f2" if half else "<f4")
            encoded = name.encode()
            f.write(struct.pack("<iii", data.ndim, len(encoded), 1 if half else 0))
            f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
            f.write(encoded)
            f.write(np.ascontiguousarray(data).tobytes())
    tmp.replace(dst)


if __name__ == "__main__":
    main()
