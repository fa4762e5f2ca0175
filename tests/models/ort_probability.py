"""Smart Turn's probability from Python onnxruntime for features patterd computed.

Usage: ort_probability.py MODEL FEATURES
FEATURES is a file of little-endian f32, a whole number of [80][800] feature blocks (one per
judgement). Prints one probability per block, one per line, with the session options patterd
uses (full graph optimisation, one intra- and one inter-op thread), so the two runs differ only
in the binding, never in the kernels this CPU selects.
"""

import sys

import numpy as np
import onnxruntime as ort


def main() -> None:
    model, features = sys.argv[1], sys.argv[2]
    blocks = np.fromfile(features, dtype="<f4").reshape(-1, 1, 80, 800)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    for block in blocks:
        (logits,) = session.run(["logits"], {"input_features": block})
        print(f"{float(np.asarray(logits).reshape(-1)[0]):.9g}")


if __name__ == "__main__":
    main()
