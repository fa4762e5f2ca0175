#!/usr/bin/env python3
"""Derives models/silero/silero_vad_8k.onnx from the MIT `silero-vad` 6.2.3 PyPI wheel.

The shipped `silero_vad.onnx` serves 8 and 16 kHz through `If` nodes whose branches tract
cannot type (their outputs differ in rank). For patterd's use (sr = 8000, batch 1, windows of
256 samples plus 32 of context) every condition is a constant, so each `If` is evaluated once
with onnxruntime and replaced by the nodes of the branch it takes; the pass repeats until no
`If` is left (branches hold nested `If`s). Dead nodes and the now unused `sr` input are
dropped. The result is checked to give the same outputs as the original in onnxruntime.

Usage (needs `pip install onnx onnxruntime numpy` and the wheel from
`pip download --no-deps silero-vad==6.2.3`):

    python3 models/silero/derive.py silero_vad-6.2.3-py3-none-any.whl models/silero
"""

import hashlib
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

WINDOW = 256 + 32  # 8 kHz: 256 new samples and 32 of context


def feeds(model: onnx.ModelProto, x: np.ndarray, state: np.ndarray) -> dict:
    names = {i.name for i in model.graph.input}
    f = {"input": x, "state": state}
    if "sr" in names:
        f["sr"] = np.array(8000, dtype=np.int64)
    return f


def condition_values(model: onnx.ModelProto, conds: list[str]) -> dict[str, bool]:
    """Runs the model once with every `If` condition exposed as an output."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for c in conds:
        probe.graph.output.append(helper.make_tensor_value_info(c, onnx.TensorProto.BOOL, None))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.zeros((1, WINDOW), dtype=np.float32)
    state = np.zeros((2, 1, 128), dtype=np.float32)
    out = sess.run(conds, feeds(model, x, state))
    return {c: bool(np.asarray(v).reshape(-1)[0]) for c, v in zip(conds, out)}


def inline(model: onnx.ModelProto, pass_no: int) -> int:
    """Replaces every `If` of the main graph by its taken branch; returns how many."""
    g = model.graph
    ifs = [n for n in g.node if n.op_type == "If"]
    if not ifs:
        return 0
    values = condition_values(model, [n.input[0] for n in ifs])
    new_nodes = []
    for k, n in enumerate(g.node):
        if n.op_type != "If":
            new_nodes.append(n)
            continue
        branch_name = "then_branch" if values[n.input[0]] else "else_branch"
        branch = next(a.g for a in n.attribute if a.name == branch_name)
        # ONNX names are unique across a graph and its subgraphs (SSA), so the branch's nodes
        # and initializers move up unchanged; nested `If`s keep referring to them.
        g.initializer.extend(branch.initializer)
        new_nodes.extend(branch.node)
        # The If's outputs become Identity of the branch's outputs.
        for if_out, br_out in zip(n.output, branch.output):
            new_nodes.append(
                helper.make_node("Identity", [br_out.name], [if_out],
                                 name=f"p{pass_no}_if{k}_out_{if_out}")
            )
    del g.node[:]
    g.node.extend(new_nodes)
    return len(ifs)


def prune(model: onnx.ModelProto) -> None:
    """Drops nodes, initializers and inputs no graph output depends on."""
    g = model.graph
    needed = {o.name for o in g.output}
    keep = []
    for n in reversed(list(g.node)):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(n.input)
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    inits = [i for i in g.initializer if i.name in needed]
    del g.initializer[:]
    g.initializer.extend(inits)
    inputs = [i for i in g.input if i.name in needed]
    del g.input[:]
    g.input.extend(inputs)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    wheel, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        original = z.read("silero_vad/data/silero_vad.onnx")
        licence = z.read("silero_vad-6.2.3.dist-info/licenses/LICENSE")
    (out_dir / "LICENSE").write_bytes(licence)
    model = onnx.load_from_string(original)
    total, passes = 0, 0
    while True:
        n = inline(model, passes)
        if n == 0:
            break
        total += n
        passes += 1
    prune(model)
    assert not any(n.op_type == "If" for n in model.graph.node)
    onnx.checker.check_model(model)
    dst = out_dir / "silero_vad_8k.onnx"
    onnx.save(model, str(dst))

    # Same outputs as the original on random windows, carrying the state.
    a = ort.InferenceSession(original, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    sa = sb = np.zeros((2, 1, 128), dtype=np.float32)
    worst = 0.0
    for _ in range(50):
        x = (rng.standard_normal((1, WINDOW)) * 0.1).astype(np.float32)
        pa, sa = a.run(None, {"input": x, "state": sa, "sr": np.array(8000, dtype=np.int64)})
        pb, sb = b.run(None, feeds(model, x, sb))
        worst = max(worst, float(np.abs(pa - pb).max()), float(np.abs(sa - sb).max()))
    print(f"{total} If nodes replaced in {passes} passes; max difference to the original {worst}")
    print(f"source wheel sha256   {sha256(wheel)}")
    print(f"silero_vad.onnx sha256 {hashlib.sha256(original).hexdigest()}")
    print(f"derived sha256        {sha256(dst)}  ({dst.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
