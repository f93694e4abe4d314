"""Hashes of what the network computes on each CPU backend, to show that a change to the executor, the plans
or a backend's table leaves every bit as it was.

    python tools/network_bits.py > after.txt      # on the change
    PYTHONPATH=/path/to/base python tools/network_bits.py > before.txt; diff before.txt after.txt

(the base: a worktree of the commit before, built in place with `python setup.py build_ext --inplace`). For
each CPU backend (reference, fast where built, bfloat16-storage, float16-storage), yolo26n with 80 classes
from seed 0: the head outputs, parameter gradients and BatchNorm statistics of a training forward and
backward at 64x64 and 96x96 (batch 2), the eval forward's outputs, and the gradients with the first 10 and
the first 22 layers frozen (parameters and running statistics), the latter with the image gradient too.
Each line: backend, case, the first 16 hex digits of a SHA-256.
"""
import hashlib
import os

import numpy as np

import ptl

BACKENDS = ["reference", "fast", "bfloat16-storage", "float16-storage"]


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a.numpy() if hasattr(a, "numpy") else a).tobytes())
    return h.hexdigest()[:16]


def outputs(out):
    return [t for branch in sorted(out) for t in out[branch]]


def output_grads(out):
    r = np.random.default_rng(1)
    return {b: tuple((r.standard_normal(t.shape) * 1e-2).astype(np.float32) for t in out[b]) for b in sorted(out)}


def frozen_names(model, layers):
    def layer(name):
        return int(name.split(".")[1])

    params = [n for n, _, _ in model.parameter_table() if layer(n) < layers]
    return params + [n for n in model.state_dict() if "running" in n and layer(n) < layers]


def run(kernels):
    os.environ["PTL_CPU_KERNELS"] = kernels
    lines = []
    model = ptl.Detector("yolo26n", num_classes=80, seed=0)
    model.train()
    for size in (64, 96):
        x = np.random.default_rng(size).random((2, 3, size, size)).astype(np.float32)
        out = model.forward(x)
        model.zero_grad()
        model.backward(output_grads(out))
        lines.append((f"train {size}", digest(*outputs(out), model.flat_gradients, model.flat_buffers)))
    model.eval()
    lines.append(("eval 96", digest(*outputs(model.forward(x)))))
    for layers in (10, 22):
        model = ptl.Detector("yolo26n", num_classes=80, seed=0)
        model.set_frozen(frozen_names(model, layers))
        model.train()
        out = model.forward(np.random.default_rng(3).random((2, 3, 64, 64)).astype(np.float32))
        model.zero_grad()
        d_images = model.backward(output_grads(out), input_grad=layers == 22)
        extra = [] if d_images is None else [d_images]
        lines.append((f"frozen {layers}", digest(model.flat_gradients, model.flat_buffers, *extra)))
    return lines


def main():
    for kernels in BACKENDS:
        if kernels == "fast" and not ptl._C.cpu_conv2d_available():
            print("fast -: built without oneDNN")
            continue
        for case, h in run(kernels):
            print(kernels, case, h)


if __name__ == "__main__":
    main()
