"""Forward + backward of the whole YOLO26 network (scale n, 640x640) on the GPU: ptl's CUDA executor
beside torchref's PyTorch eager model for the same work, measured in the same run when torch imports.

One iteration = forward of a fixed batch (training-mode BatchNorm) and backward of fixed output
gradients (parameter gradients accumulate; nothing else). ptl: bf16 = bfloat16 compute with float32
master weights (the weight cast is inside every forward), fp32 = strict float32 (no TF32). torch:
bf16 = autocast bfloat16, fp32 = float32 with torch's defaults (cuDNN TF32 on), cudnn.benchmark on.
Per iteration wall time with a synchronisation after each (median/min/max over --iters after
--warmup), plus the back-to-back mean (iterations queued without synchronising). "replay" = the same
forward + backward recorded once and replayed as one CUDA graph.

    python benchmarks/network.py [--batches 4,16] [--precisions bf16,fp32] [--iters 100] [--find] [--tf32]
                                 [--json out.json]
"""
import argparse
import json
import sys
import time

import numpy as np

from common import network_case, shared_dir  # noqa: E402
import ptl  # noqa: E402

IMG = 640


def _time(step, sync, iters, warmup):
    for _ in range(warmup):
        step()
    sync()
    per = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        sync()
        per.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    b2b = (time.perf_counter() - t0) * 1e3 / iters
    return {"median_ms": float(np.median(per)), "min_ms": float(np.min(per)), "max_ms": float(np.max(per)),
            "back_to_back_ms": b2b, "iters": iters}


def bench_ptl(batch, prec, iters, warmup, tf32, find):
    dtype = {"bf16": "bfloat16", "fp32": "float32"}[prec]
    net, img, grads = network_case(batch, IMG, dtype)
    if tf32 or find:
        net.set_conv_options(allow_tf32=tf32, find=find)  # new plans at the next forward

    def step():
        net.forward(img)
        net.backward(grads)

    res = _time(step, ptl.cuda.synchronize, iters, warmup)
    res["memory"] = net.info()
    # the same work recorded once and replayed as one CUDA graph (the recorder's network part)
    net.record(img, grads)
    res["replay"] = _time(net.replay, ptl.cuda.synchronize, iters, warmup)
    return res


def bench_torch(batch, prec, iters, warmup):
    import torch
    from torchref import model as tm

    torch.backends.cudnn.benchmark = True
    model = tm.build_model("n", seed=0, device="cuda").train()
    x = torch.rand(batch, 3, IMG, IMG, generator=torch.Generator().manual_seed(7)).to("cuda")

    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
            return model(x)

    outs = fwd()
    grads = [torch.full_like(o, 1e-3) for o in outs]
    del outs

    def step():
        torch.autograd.backward(fwd(), grads)

    return _time(step, torch.cuda.synchronize, iters, warmup)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="4,16")
    ap.add_argument("--precisions", default="bf16,fp32")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--tf32", action="store_true", help="let ptl's float32 convs use TF32 too")
    ap.add_argument("--find", action="store_true", help="time cuDNN's candidates once per conv (cudnnFind) at prepare")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not ptl.cuda.is_available():
        sys.exit("benchmarks/network.py needs a CUDA device")
    have_torch = False
    if not args.no_torch:
        shared = shared_dir("torchref")
        try:
            import torch  # noqa: F401
            if shared:
                sys.path.insert(0, shared)
                have_torch = True
            else:
                print("torchref not found (set PTL_SHARED): ptl only", file=sys.stderr)
        except ImportError:
            print("torch not importable: ptl only", file=sys.stderr)
    rows = []
    print("| batch | prec | ptl ms median (min-max) | ptl b2b ms | ptl replay ms median (min-max) | replay b2b ms "
          "| torch eager ms median (min-max) | torch b2b ms | ptl/torch (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in [int(v) for v in args.batches.split(",")]:
        for prec in args.precisions.split(","):
            r = {"batch": b, "precision": prec,
                 "ptl": bench_ptl(b, prec, args.iters, args.warmup, args.tf32, args.find)}
            if have_torch:
                r["torch"] = bench_torch(b, prec, args.iters, args.warmup)
            rows.append(r)
            p = r["ptl"]
            t = r.get("torch")
            tcol = (f"{t['median_ms']:.2f} ({t['min_ms']:.2f}-{t['max_ms']:.2f}) | {t['back_to_back_ms']:.2f} | "
                    f"{p['median_ms'] / t['median_ms']:.2f}") if t else "- | - | -"
            rp = p["replay"]
            print(f"| {b} | {prec} | {p['median_ms']:.2f} ({p['min_ms']:.2f}-{p['max_ms']:.2f}) | "
                  f"{p['back_to_back_ms']:.2f} | {rp['median_ms']:.2f} ({rp['min_ms']:.2f}-{rp['max_ms']:.2f}) | "
                  f"{rp['back_to_back_ms']:.2f} | {tcol} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
