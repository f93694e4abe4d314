"""CUDA objective time (assignment + losses + gradients of both branches) at 640x640, batch 4 and 16,
with the boxes of coco256, beside torchref's E2ELoss forward + backward on the same inputs when torch
imports. Each timed call is followed by a device synchronisation (wall clock per call, host target
preparation and upload included); medians, minima and maxima in milliseconds.

    python benchmarks/objective.py [--iters 50] [--warmup 5] [--batches 4 16] [--json out.json]
"""
import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ptl  # noqa: E402
import ptl.objective  # noqa: E402,F401

O = sys.modules["ptl.objective"]


def shared_dir():
    for cand in (os.environ.get("PTL_SHARED"), REPO.parent / "shared", REPO / ".device"):
        if cand and (pathlib.Path(cand) / "data" / "coco256").is_dir():
            return pathlib.Path(cand)
    sys.exit("coco256 not found (set PTL_SHARED)")


def coco_rows(shared, bsz, start):
    files = sorted((shared / "data" / "coco256" / "labels").rglob("*.txt"))
    rows = []
    for b in range(bsz):
        lab = np.loadtxt(files[(start + b) % len(files)], ndmin=2).reshape(-1, 5)
        rows.append(np.column_stack([np.full(len(lab), b), lab]))
    return np.concatenate(rows).astype(np.float32)


def synthetic_rows(rng, bsz, n, nc):
    wh = np.exp(rng.uniform(np.log(4 / 640), np.log(0.5), (bsz * n, 2)))
    c = wh / 2 + rng.uniform(0, 1, (bsz * n, 2)) * (1 - wh)
    return np.column_stack([np.repeat(np.arange(bsz), n), rng.integers(0, nc, bsz * n), c, wh]).astype(np.float32)


def fake_outputs(rng, bsz, na, nc):
    """Head outputs of the initialised network's kind: box distances near 2 cells, logits near the
    class-bias prior (the assigner then does the work of an early training step)."""
    outs = []
    for _ in range(2):
        outs.append(rng.uniform(0.5, 4.0, (bsz, na, 4)).astype(np.float32))
        outs.append(rng.normal(-9.0, 2.0, (bsz, na, nc)).astype(np.float32))
    return outs


def stats(ts):
    ts = np.asarray(ts) * 1e3
    return {"median_ms": float(np.median(ts)), "min_ms": float(ts.min()), "max_ms": float(ts.max())}


def time_ptl(outs, rows, iters, warmup, img):
    dev = [ptl.tensor(o, device="cuda") for o in outs]
    grads = tuple(ptl.empty(tuple(o.shape), dtype="float32", device="cuda") for o in outs)
    ts = []
    for i in range(warmup + iters):
        ptl.cuda.synchronize()
        t0 = time.perf_counter()
        O.objective(dev, rows, img_size=img, grads=grads)
        ptl.cuda.synchronize()
        if i >= warmup:
            ts.append(time.perf_counter() - t0)
    return stats(ts)


def time_torchref(shared, outs, rows, iters, warmup, img):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    sys.path.insert(0, str(shared))
    from torchref.loss import E2ELoss, pad_targets
    from torchref.model import anchors_for

    bsz, nc = outs[1].shape[0], outs[1].shape[2]
    leaves = [torch.tensor(o, device="cuda", requires_grad=True) for o in outs]
    crit = E2ELoss(nc=nc)
    anc, st = anchors_for(img, device="cuda")
    ts = []
    for i in range(warmup + iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        t = torch.tensor(rows).cuda(non_blocking=True)
        gl, gb, mg = pad_targets(t[:, 0], t[:, 1], t[:, 2:], bsz, img)
        for x in leaves:
            x.grad = None
        total = crit(tuple(x.transpose(1, 2) for x in leaves), anc, st, gl, gb, mg, img)[0]
        total.backward()
        torch.cuda.synchronize()
        if i >= warmup:
            ts.append(time.perf_counter() - t0)
    return stats(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--json", default=None)
    ap.add_argument("--synthetic", type=int, default=0,
                    help="also time N random boxes per image (a stress case for the assigner)")
    args = ap.parse_args()
    if not ptl.cuda.is_available():
        sys.exit("no CUDA device")
    shared = shared_dir()
    img, nc = (640, 640), 80
    na = O.num_anchors(img)
    rng = np.random.default_rng(0)
    results = []
    cases = [(bsz, "coco256") for bsz in args.batches]
    if args.synthetic:
        cases += [(bsz, "synthetic") for bsz in args.batches]
    for bsz, kind in cases:
        rows = coco_rows(shared, bsz, 0) if kind == "coco256" else synthetic_rows(rng, bsz, args.synthetic, nc)
        outs = fake_outputs(rng, bsz, na, nc)
        r = {"batch": bsz, "targets": kind, "boxes": int(len(rows)),
             "ptl": time_ptl(outs, rows, args.iters, args.warmup, img),
             "torchref": time_torchref(shared, outs, rows, args.iters, args.warmup, img)}
        results.append(r)
        line = "%-9s batch %2d, %4d boxes: ptl %.3f ms (min %.3f, max %.3f)" % (
            kind, bsz, r["boxes"], r["ptl"]["median_ms"], r["ptl"]["min_ms"], r["ptl"]["max_ms"])
        if r["torchref"]:
            t = r["torchref"]
            line += "; torchref %.3f ms (min %.3f, max %.3f); ratio %.2f" % (
                t["median_ms"], t["min_ms"], t["max_ms"], r["ptl"]["median_ms"] / t["median_ms"])
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ptl.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
