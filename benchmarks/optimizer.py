"""One full optimizer step (clip + MuSGD + EMA) on yolo26n- and yolo26s-shaped parameter tables.

Times ptl's eager step on the GPU beside torchref's (clip_grad_norm_ + MuSGD.step + ModelEMA.update) in
the same run. Shapes come from torchref's model (torch needed); the result is one markdown row per scale
for benchmarks/RESULTS.md and a JSON file when --json is given.

    python benchmarks/optimizer.py [--scales n,s] [--iters 50] [--json out.json]
"""
import argparse
import json
import sys
import time

import numpy as np

from common import shared_dir  # noqa: E402
import ptl  # noqa: E402
from ptl import optim  # noqa: E402


def tables_from_torchref(scale):
    import torch
    from torchref import model as trm
    model = trm.build_model(scale, seed=0, device="cuda")
    table, off = [], 0
    for name, p in model.named_parameters():
        table.append((name, off, tuple(p.shape)))
        off += p.numel()
    bn_table, boff = [], 0
    for name, b in model.named_buffers():
        if b.dtype.is_floating_point:
            bn_table.append((name, boff, tuple(b.shape)))
            boff += b.numel()
    return model, table, off, bn_table, boff


def time_it(fn, sync, iters, warmup=5):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), float(np.min(times))


def bench(scale, iters):
    import torch
    from torchref import optim as tro
    model, table, n, bn_table, nb = tables_from_torchref(scale)
    named = dict(model.named_parameters())
    flat = torch.cat([named[k].detach().reshape(-1) for k, _, _ in table]).cpu().numpy()
    rng = np.random.default_rng(0)
    g0 = (rng.standard_normal(n) * 0.01).astype(np.float32)
    params = ptl.tensor(flat, device="cuda")
    grads = ptl.tensor(g0, device="cuda")
    bn = ptl.zeros((nb,), dtype="float32", device="cuda")
    sync = lambda: ptl.cuda.synchronize()
    timed = {}
    for replay in (False, True):
        opt = optim.FlatOptimizer(params, grads, table, "MuSGD", lr0=0.01, momentum=0.937, weight_decay=5e-4,
                                  max_norm=10.0, bn_buffers=bn, bn_table=bn_table, zero_grad=False,
                                  ns_replay=replay)
        timed[replay] = time_it(opt.step, sync, iters)
        if replay and opt.ns_replay_state != "replay":
            print("optimizer benchmark: NS replay not active (%s)" % opt.ns_replay_state)
    ours, replayed = timed[False], timed[True]

    ref = tro.build_musgd(model, lr0=0.01, momentum=0.937, weight_decay=5e-4, batch_size=16)
    ema = tro.ModelEMA(model)
    gt = torch.from_numpy(g0).cuda()
    off = 0
    for k, o, s in table:
        named[k].grad = gt[o:o + int(np.prod(s))].view(s).clone()

    def ref_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        ref.step()
        ema.update()

    theirs = time_it(ref_step, torch.cuda.synchronize, iters)
    plan = opt._plan
    return dict(scale=scale, params=n, tensors=len(table), muon=plan["nmuon"], ns_shapes=len(plan["sgtab"]),
                ptl_ms=ours[0], ptl_min_ms=ours[1], ptl_replay_ms=replayed[0], ptl_replay_min_ms=replayed[1],
                torchref_ms=theirs[0], torchref_min_ms=theirs[1], ratio=min(ours[0], replayed[0]) / theirs[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="n,s")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not ptl.cuda.is_available():
        print("optimizer benchmark: no CUDA device; nothing to time")
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("optimizer benchmark: torch not installed; the yolo26 shapes come from torchref")
        return 0
    sh = shared_dir("torchref")
    if sh is None:
        print("optimizer benchmark: ../shared/torchref not found (set PTL_SHARED)")
        return 1
    sys.path.insert(0, sh)
    rows = [bench(s, args.iters) for s in args.scales.split(",")]
    print("ptl step = clip + MuSGD + EMA (one call, no sync inside); torchref step = clip_grad_norm_ + "
          "MuSGD.step + ModelEMA.update; medians of %d steps, synchronised per step" % args.iters)
    print("| scale | params | tensors (muon) | NS shapes | ptl eager ms (min) | ptl NS replay ms (min) "
          "| torchref ms (min) | best ptl / torchref |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %d (%d) | %d | %.3f (%.3f) | %.3f (%.3f) | %.3f (%.3f) | %.3f |" % (
            r["scale"], r["params"], r["tensors"], r["muon"], r["ns_shapes"], r["ptl_ms"], r["ptl_min_ms"],
            r["ptl_replay_ms"], r["ptl_replay_min_ms"], r["torchref_ms"], r["torchref_min_ms"], r["ratio"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
