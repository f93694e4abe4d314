"""Times the cuDNN convolutions (forward, backward data, backward filter), the fused BatchNorm+SiLU
kernels and SPPF's 5x5 max-pool at yolo26n shapes, 640x640, batch 4, on the GPU.

Each figure is the median (and min) over --samples wall-clock samples taken after --warmup calls; a
sample runs the call --inner times back to back and ends with ptl.cuda.synchronize(), and the figure
is per call. No CUDA events are used.

    python benchmarks/layers_cuda.py [--dtype bfloat16] [--batch 4] [--size 640] [--find] [--nondet]
                                     [--layers conv,bn,maxpool]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ptl  # noqa: E402

C = ptl._C

# name, input size divisor, cin, cout, k, stride, groups (yolo26n, spec section 2; and the s, m and l stems)
CONVS = [
    ("L0 stem 3->16 k3 s2", 1, 3, 16, 3, 2, 1),
    ("L0 stem 3->32 (s)", 1, 3, 32, 3, 2, 1),
    ("L0 stem 3->64 (m, l)", 1, 3, 64, 3, 2, 1),
    ("L1 16->32 k3 s2", 2, 16, 32, 3, 2, 1),
    ("L2 cv1 32->32 k1", 4, 32, 32, 1, 1, 1),
    ("L2 bottleneck 16->8 k3", 4, 16, 8, 3, 1, 1),
    ("L2 bottleneck 8->16 k3", 4, 8, 16, 3, 1, 1),
    ("L3 64->64 k3 s2", 4, 64, 64, 3, 2, 1),
    ("L5 128->128 k3 s2", 8, 128, 128, 3, 2, 1),
    ("L7 128->256 k3 s2", 16, 128, 256, 3, 2, 1),
    ("L8 256->256 k1", 32, 256, 256, 1, 1, 1),
    ("head P3 dw 64 k3", 8, 64, 64, 3, 1, 64),
    ("head P3 box 64->64 k3", 8, 64, 64, 3, 1, 1),
    ("head P3 cls 80->80 k1", 8, 80, 80, 1, 1, 1),
]

LAYER_KINDS = {"conv", "bn", "maxpool"}
# SPPF's max-pools: input size divisor, channels
MAXPOOLS = [("SPPF P5 (20x20x128)", 32, 128)]
BNS = [("P1 (320x320x16)", 2, 16), ("P2 (160x160x32)", 4, 32), ("P3 (80x80x64)", 8, 64), ("P5 (20x20x256)", 32, 256)]


def timeit(fn, warmup, samples, inner):
    for _ in range(warmup):
        fn()
    ptl.cuda.synchronize()
    ts = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        ptl.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / inner)
    return statistics.median(ts), min(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--find", action="store_true", help="choose algorithms by timing the candidates at plan time")
    ap.add_argument("--nondet", action="store_true", help="allow non-deterministic backward algorithms")
    ap.add_argument("--layers", default="conv,bn,maxpool", help="comma-separated: which of conv, bn, maxpool to time")
    a = ap.parse_args()
    layers = set(a.layers.split(","))
    if not layers <= LAYER_KINDS:
        ap.error("--layers: unknown %s (choose among %s)" % (", ".join(sorted(layers - LAYER_KINDS)),
                                                             ", ".join(sorted(LAYER_KINDS))))
    dt, n = a.dtype, a.batch
    rng = np.random.default_rng(0)
    print("device: %s, dtype %s, batch %d, %dx%d, median/min of %d samples x %d calls, microseconds per call"
          % (ptl.cuda.get_device_name(), dt, n, a.size, a.size, a.samples, a.inner))
    tiny = ptl.zeros((1,), dt, "cuda")
    t = timeit(lambda: C.layer_accumulate(tiny, tiny), a.warmup, a.samples, a.inner)
    print("floor (binding + one empty kernel launch): %.1f us per call" % (t[0] * 1e6))
    if "conv" in layers:
        time_convs(a, rng)
    if "bn" in layers:
        time_fwd_bwd(a, rng, "batchnorm+silu (train)", BNS, batchnorm_calls)
    if "maxpool" in layers:
        time_fwd_bwd(a, rng, "maxpool 5x5 (SPPF)", MAXPOOLS, maxpool_calls)


def device_normal(rng, shape, dt):
    return ptl.tensor(rng.standard_normal(shape, dtype=np.float32), device="cuda").to(dtype=dt)


def time_convs(a, rng):
    dt, n = a.dtype, a.batch
    print("%-26s %8s %8s %8s %8s %8s %8s  %-10s %s" % ("conv", "fwd", "min", "bwd_d", "min", "bwd_f", "min",
                                                      "algos", "workspace"))
    total = [0.0, 0.0, 0.0]
    for name, div, cin, cout, k, s, g in CONVS:
        hw = a.size // div
        x = device_normal(rng, (n, hw, hw, cin), dt)
        w = ptl.tensor(rng.standard_normal((cout, k, k, cin // g), dtype=np.float32) * 0.1,
                       device="cuda").to(dtype=dt)
        plan = C.layer_conv2d_plan(x, w, s, g, deterministic=not a.nondet, find=a.find)
        info = C.layer_cuda_conv2d_plan_info(plan)
        ws = ptl.empty((max(info["workspace"], 1),), "uint8", "cuda")
        y = ptl.empty(info["y_shape"], dt, "cuda")
        dy = device_normal(rng, info["y_shape"], dt)
        dx = ptl.empty(tuple(x.shape), dt, "cuda")
        dw = ptl.zeros(tuple(w.shape), dt, "cuda")
        f = timeit(lambda: C.layer_conv2d_forward(plan, x, w, None, y, ws), a.warmup, a.samples, a.inner)
        bd = timeit(lambda: C.layer_conv2d_backward_input(plan, dy, w, dx, ws), a.warmup, a.samples, a.inner)
        bf = timeit(lambda: C.layer_conv2d_backward_weight(plan, x, dy, dw, ws), a.warmup, a.samples, a.inner)
        for i, t in enumerate((f, bd, bf)):
            total[i] += t[0]
        print("%-26s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f  %-10s %d%s" % (
            name, f[0] * 1e6, f[1] * 1e6, bd[0] * 1e6, bd[1] * 1e6, bf[0] * 1e6, bf[1] * 1e6,
            "/".join(str(v) for v in info["algos"]), info["workspace"],
            " tc" if any(info["tensor_op"]) else ""))
    print("%-26s %8.1f %8s %8.1f %8s %8.1f" % ("sum of medians", total[0] * 1e6, "", total[1] * 1e6, "",
                                              total[2] * 1e6))
    print()


def time_fwd_bwd(a, rng, title, table, calls):
    """Each (name, size divisor, channels) of table: the forward and backward calls(x, dy) returns, on random
    maps of that shape."""
    print("%-26s %8s %8s %8s %8s" % (title, "fwd", "min", "bwd", "min"))
    for name, div, c in table:
        shape = (a.batch, a.size // div, a.size // div, c)
        x, dy = device_normal(rng, shape, a.dtype), device_normal(rng, shape, a.dtype)
        fwd, bwd = calls(x, dy)
        f = timeit(fwd, a.warmup, a.samples, a.inner)
        b = timeit(bwd, a.warmup, a.samples, a.inner)
        print("%-26s %8.1f %8.1f %8.1f %8.1f" % (name, f[0] * 1e6, f[1] * 1e6, b[0] * 1e6, b[1] * 1e6))
    print()


def batchnorm_calls(x, dy):
    c = x.shape[-1]
    ones = ptl.tensor(np.ones(c, np.float32), device="cuda")
    zeros = ptl.tensor(np.zeros(c, np.float32), device="cuda")
    rm, rv = ptl.tensor(np.zeros(c, np.float32), device="cuda"), ptl.tensor(np.ones(c, np.float32), device="cuda")
    dg, db = ptl.zeros((c,), "float32", "cuda"), ptl.zeros((c,), "float32", "cuda")
    dx = ptl.empty(tuple(x.shape), x.dtype, "cuda")
    _, sm, si = C.layer_batchnorm_forward(x, ones, zeros, rm, rv, True, "silu")
    # the forward binding allocates its outputs (a test binding): this times kernels plus that allocation
    return (lambda: C.layer_batchnorm_forward(x, ones, zeros, rm, rv, True, "silu"),
            lambda: C.layer_batchnorm_backward(x, dy, ones, zeros, sm, si, True, "silu", dx, dg, db))


def maxpool_calls(x, dy):
    dx = ptl.zeros(tuple(x.shape), x.dtype, "cuda")
    # the forward binding allocates its output, as BatchNorm's; the backward accumulates, as SPPF's do (each
    # pooled map's gradient also has the Concat's part)
    return lambda: C.layer_maxpool5_forward(x), lambda: C.layer_maxpool5_backward(x, dy, dx, True)


if __name__ == "__main__":
    main()
