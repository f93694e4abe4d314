"""Times a Conv layer's training forward at yolo26n shapes (640x640, batch 4) on the GPU, kernel by kernel: the
convolution through its plan (cuDNN or cuBLAS) followed by BatchNorm's three launches, against the fused pass of
csrc/cuda/conv2d_bn.cu (the convolution with the statistics in its epilogue, then BatchNorm's finish and apply).

Kernel durations come from CUPTI through torch.profiler (so PyTorch must be installed), medians over --reps calls,
with programmatic dependent launch off (PTL_PDL=0: an early-started kernel's duration would include its wait), and
the fusion on (PTL_CONV_BN=1).

    python benchmarks/conv_bn.py [--dtype bfloat16] [--batch 4] [--size 640] [--reps 20]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

os.environ["PTL_PDL"] = "0"
os.environ["PTL_CONV_BN"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np  # noqa: E402

import ptl  # noqa: E402

C = ptl._C

# name, input size divisor, cin, cout, k, stride (yolo26n's Conv layers with BatchNorm, spec section 2)
CONVS = [
    ("L1 16->32 k3 s2", 2, 16, 32, 3, 2),
    ("L2 cv1 32->32 k1", 4, 32, 32, 1, 1),
    ("L2 bottleneck 8->16 k3", 4, 8, 16, 3, 1),
    ("L3 64->64 k3 s2", 4, 64, 64, 3, 2),
    ("P3 64->64 k3", 8, 64, 64, 3, 1),
    ("P3 128->64 k1", 8, 128, 64, 1, 1),
    ("L5 128->128 k3 s2", 8, 128, 128, 3, 2),
    ("P4 64->64 k3", 16, 64, 64, 3, 1),
    ("P4 128->128 k1", 16, 128, 128, 1, 1),
    ("L7 128->256 k3 s2", 16, 128, 256, 3, 2),
    ("P5 128->128 k3", 32, 128, 128, 3, 1),
    ("L8 256->256 k1", 32, 256, 256, 1, 1),
]


def kernel_times(fn, reps):
    """{kernel name: median microseconds} of the kernels fn launches, over reps calls."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    ptl.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        ptl.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    by = {}
    for e in events:
        if e.get("cat") == "kernel":
            by.setdefault(e["name"], []).append(e["dur"])
    return {n: statistics.median(d) * len(d) / reps for n, d in by.items()}


def short(name):
    for k in ("conv_bn_stats", "bn_fwd_finish_chunks", "bn_fwd_finish", "bn_stat_op", "bn_apply"):
        if k in name:
            return k
    return "conv"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=640)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    dt, n = a.dtype, a.batch
    print("device: %s, dtype %s, batch %d, %dx%d; microseconds on the GPU per call (medians of %d), PTL_PDL=0"
          % (ptl.cuda.get_device_name(), dt, n, a.size, a.size, a.reps))
    print("%-24s | %7s %7s %7s %7s %7s | %7s %7s %7s %7s" % ("layer", "conv", "sums", "finish", "apply", "total",
                                                            "fused", "finish", "apply", "total"))
    tot = [0.0, 0.0]
    for name, div, cin, cout, k, s in CONVS:
        hw = a.size // div
        x = ptl.tensor(rng.standard_normal((n, hw, hw, cin), dtype=np.float32), device="cuda").to(dtype=dt)
        w = ptl.tensor(rng.standard_normal((cout, k, k, cin), dtype=np.float32) / np.sqrt(k * k * cin),
                       device="cuda").to(dtype=dt)
        plan = C.layer_conv2d_plan(x, w, s, 1)
        info = C.layer_cuda_conv2d_plan_info(plan)
        ws = ptl.empty((max(info["workspace"], 1),), "uint8", "cuda")
        z = ptl.empty(info["y_shape"], dt, "cuda")
        par = [ptl.tensor(v.astype(np.float32), device="cuda")
               for v in (np.ones(cout), np.zeros(cout), np.zeros(cout), np.ones(cout))]

        def unfused():
            C.layer_conv2d_forward(plan, x, w, None, z, ws)
            C.layer_batchnorm_forward(z, *par, True, "silu")

        def fused():
            C.layer_conv2d_batchnorm_forward(plan, x, w, *par, "silu", ws)

        u, f = {}, {}
        for times, fn in ((u, unfused), (f, fused)):
            for kname, us in kernel_times(fn, a.reps).items():
                times[short(kname)] = times.get(short(kname), 0.0) + us
        tu, tf = sum(u.values()), sum(f.values())
        tot[0] += tu
        tot[1] += tf
        print("%-24s | %7.1f %7.1f %7.1f %7.1f %7.1f | %7.1f %7.1f %7.1f %7.1f%s" % (
            name, u.get("conv", 0), u.get("bn_stat_op", 0), u.get("bn_fwd_finish", 0), u.get("bn_apply", 0), tu,
            f.get("conv_bn_stats", 0), f.get("bn_fwd_finish_chunks", 0), f.get("bn_apply", 0), tf,
            "" if info["conv_bn_fused"] else "  (not fused)"))
    print("%-24s | %39.1f | %31.1f" % ("sum", tot[0], tot[1]))


if __name__ == "__main__":
    main()
