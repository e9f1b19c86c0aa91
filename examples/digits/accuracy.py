"""Accuracy of the float model (onnxruntime if installed, else our numpy host interpreter)
and of the saved outputs of compiled designs, on labelled test data.

    python accuracy.py MODEL X.npy LABELS.npy Y1.npy [Y2.npy ...]
"""

import sys

import numpy as np


def float_outputs(model, x):
    try:
        import onnxruntime as ort
    except ImportError:
        from onnx2fpga.frontend.load import load_model
        from onnx2fpga.frontend.resolve import resolve_geometry
        from onnx2fpga.sim import host
        g = resolve_geometry(load_model(model))
        return np.stack([host.run_nodes(g.nodes, {g.inputs[0]: s[None]}, g.constants)
                         [g.outputs[0]][0] for s in x])
    sess = ort.InferenceSession(model)
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def main(argv):
    model, xs, labels, *results = argv
    x, y = np.load(xs), np.load(labels)
    acc = np.mean(np.argmax(float_outputs(model, x), -1) == y)
    print(f"float model:  {acc * 100:6.2f} % of {len(y)} test digits")
    for path in results:
        out = np.load(path)
        acc = np.mean(np.argmax(out.reshape(len(out), -1), -1) == y[: len(out)])
        print(f"{path}: {acc * 100:6.2f} % of {len(out)}")


if __name__ == "__main__":
    main(sys.argv[1:])
