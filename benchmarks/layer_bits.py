"""Digests of the CUDA layers' outputs on fixed inputs, to show that a change to a kernel left its bits alone.

Run it on two builds on the same GPU and compare the printed lines (e.g. `diff`): a change meant to make a
kernel faster without changing its arithmetic (loads batched, indices narrowed) must leave every line equal.
Covers BatchNorm training forward and backward (with and without SiLU, the packed and the scalar paths) and
the depthwise 3x3 convolution's gradients, in float32 and bfloat16.

    python benchmarks/layer_bits.py [--device cuda] [--dtypes float32,bfloat16]
"""
import argparse
import hashlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ptl  # noqa: E402
from ptl import _C as C  # noqa: E402

# (n, h, w, c): channels a multiple of 8 take the packed passes; 20 and 3 the scalar ones
BN_SHAPES = [(4, 40, 40, 64), (2, 160, 160, 16), (2, 20, 20, 256), (3, 17, 11, 20), (2, 9, 9, 3)]
DW_SHAPES = [(4, 40, 40, 64, 1), (2, 80, 80, 32, 2), (2, 20, 20, 256, 1)]


DEVICE = "cuda"


def dev(a, dt):
    return ptl.tensor(np.asarray(a, np.float32), device=DEVICE).to(dtype=dt)


def digest(*tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(np.ascontiguousarray(t.to(device="cpu").to(dtype="float32").numpy()).tobytes())
    return h.hexdigest()[:16]


def batchnorm(shape, dt, act, rng):
    c = shape[-1]
    x, dy = dev(rng.standard_normal(shape) * 2 + 0.5, dt), dev(rng.standard_normal(shape), dt)
    gamma, beta = dev(rng.standard_normal(c), "float32"), dev(rng.standard_normal(c), "float32")
    rm, rv = dev(np.zeros(c), "float32"), dev(np.ones(c), "float32")
    y, sm, si = C.layer_batchnorm_forward(x, gamma, beta, rm, rv, True, act)
    dx = ptl.empty(shape, dt, DEVICE)
    dg, db = dev(rng.standard_normal(c), "float32"), dev(rng.standard_normal(c), "float32")
    C.layer_batchnorm_backward(x, dy, gamma, beta, sm, si, True, act, dx, dg, db)
    return digest(y, sm, si, rm, rv), digest(dx, dg, db)


def depthwise(shape, dt, rng):
    n, h, w, c, s = shape
    x = dev(rng.standard_normal((n, h, w, c)), dt)
    wt = dev(rng.standard_normal((c, 3, 3, 1)) / 3, dt)
    plan = C.layer_conv2d_plan(x, wt, s, c)
    ho, wo = (h - 1) // s + 1, (w - 1) // s + 1
    ws = None
    if DEVICE == "cuda":
        info = C.layer_cuda_conv2d_plan_info(plan)
        ws = ptl.empty((info["workspace"],), "uint8", DEVICE) if info["workspace"] else None
    y = ptl.empty((n, ho, wo, c), dt, DEVICE)
    C.layer_conv2d_forward(plan, x, wt, None, y, ws)
    dy = dev(rng.standard_normal((n, ho, wo, c)), dt)
    dx = ptl.empty((n, h, w, c), dt, DEVICE)
    C.layer_conv2d_backward_input(plan, dy, wt, dx, ws)
    dw, db = ptl.zeros((c, 3, 3, 1), dt, DEVICE), ptl.zeros((c,), dt, DEVICE)
    C.layer_conv2d_backward_weight(plan, x, dy, dw, ws)
    C.layer_conv2d_backward_bias(plan, dy, db, ws)
    return digest(y), digest(dx), digest(dw, db)


def main():
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    args = ap.parse_args()
    DEVICE = args.device
    for dt in args.dtypes.split(","):
        for shape in BN_SHAPES:
            for act in (None, "silu"):
                fwd, bwd = batchnorm(shape, dt, act, np.random.default_rng(list(shape)))
                print("batchnorm %-9s %-18s %-5s forward %s backward %s" % (dt, shape, act, fwd, bwd))
        for shape in DW_SHAPES:
            y, dx, dw = depthwise(shape, dt, np.random.default_rng(list(shape)))
            print("depthwise %-9s %-22s forward %s input %s weight+bias %s" % (dt, shape, y, dx, dw))


if __name__ == "__main__":
    main()
