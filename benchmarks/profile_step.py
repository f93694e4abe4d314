"""Where a GPU step's time goes: host enqueue time, GPU kernel time and launch count, per kernel and per
runtime call, for the network's forward + backward (``--what network``) or one whole training step
through the Trainer's engine (``--what step``: upload, forward, objective, backward, optimizer, EMA;
``--capture`` replays the recorded network as ``fit(..., capture_network=True)`` does; ``--comm after|graph``
gives the step a one-rank NCCL communicator, so that it all-reduces and broadcasts as a data-parallel rank
does, after the replayed backward or recorded with it (``Trainer(all_reduce_in_graph=True)``)).

Kernels and CUDA API calls are recorded with torch.profiler (CUPTI traces every kernel in the process,
ptl's included), so this needs torch on the GPU machine. Prints, per iteration: wall time with a
synchronisation, host time to enqueue, summed kernel time, kernel count; then the top kernels and API
calls, the peak allocated and reserved device memory of ptl's allocator (for ``--what step``, with the
network's own share, and how long each back-to-back step waited for its batch: with too few ``--workers``
the loader bounds the step, but a step the GPU bounds waits there too, as the workers wait for the batch
slots the GPU frees once it has copied their pixels; compare two worker counts), the calls relaunched as
graphs (``ptl.cuda.call_graphs``) and the device memory in use by the driver's count. ``--trace FILE``
keeps the Chrome trace (``benchmarks/step_timeline.py`` reads it).

    python benchmarks/profile_step.py [--what network|step] [--capture] [--batch 4] [--dtype bfloat16]
                                      [--tf32] [--find] [--comm none|after|graph] [--accumulate N]
                                      [--optimizer auto|MuSGD|SGD|AdamW] [--workers 4] [--iters 20] [--no-profile]
"""
import argparse
import collections
import ctypes
import gzip
import json
import os
import sys
import tempfile
import time

import numpy as np

from common import coco256_yaml, network_case  # noqa: E402
import ptl  # noqa: E402


def network_step(args):
    net, img, grads = network_case(args.batch, args.imgsz, args.dtype)

    def step():
        net.forward(img)
        net.backward(grads)
    return step


def train_step(args):
    """The Trainer's own step over real coco256 batches (the loader runs ahead in its threads)."""
    from ptl.engine import Engine as _Engine
    prec = {"bfloat16": "bf16-mixed", "float32": "32-true"}[args.dtype]
    trainer = ptl.Trainer(max_epochs=100, precision=prec, accelerator="cuda", enable_progress_bar=False,
                          float32_matmul_precision="high" if args.tf32 else "highest",
                          accumulate_grad_batches=args.accumulate, all_reduce_in_graph=args.comm == "graph",
                          benchmark=args.find,
                          enable_checkpointing=False, logger=False,
                          default_root_dir=tempfile.mkdtemp(prefix="ptl-prof-"))
    if not coco256_yaml():
        sys.exit("coco256 not found: set PTL_SHARED")
    data = ptl.DetectionData(coco256_yaml(), imgsz=args.imgsz, batch_size=args.batch, workers=args.workers,
                             cache="ram", verbose=False)
    model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0, hparams={"optimizer": args.optimizer})
    trainer.datamodule = data
    trainer.capture_network = args.capture
    eng = _Engine(trainer, model, data)
    trainer._engine = eng
    if args.comm != "none":  # a one-rank job's communication: what a rank adds to its step, less the wire
        eng.comm = ptl._C.nccl_comm(ptl._C.nccl_unique_id(), 1, 0, 0, 60.0)
    def batches():
        epoch = 0
        while True:
            data.set_epoch(epoch)
            yield from eng.train_loader
            epoch += 1
    it = batches()
    state = {"i": 0}

    def step():
        i = state["i"]
        state["i"] += 1
        t0 = time.perf_counter()
        batch = next(it)
        step.loader_wait.append(time.perf_counter() - t0)
        eng.train_step(batch, 1, i)
    step.model = model
    step.loader_wait = []  # host seconds each step waited for its batch
    return step


def device_in_use():
    """Bytes of device memory in use by the driver's count (cuMemGetInfo in the thread's current context: the
    caching allocator's reservations, cuDNN's and cuBLAS's own, graphs, the context itself); None if unknown."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) != 0:
            return None
        return total.value - free.value
    except OSError:
        return None


def analyse(trace_path, iters):
    with (gzip.open if trace_path.endswith(".gz") else open)(trace_path, "rt") as f:  # --trace F.json.gz
        ev = json.load(f)["traceEvents"]
    kern = collections.defaultdict(lambda: [0, 0.0])
    api = collections.defaultdict(lambda: [0, 0.0])
    ktotal, kcount, kfirst, klast = 0.0, 0, None, None
    for e in ev:
        cat = e.get("cat", "")
        if e.get("ph") != "X":
            continue
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            k = kern[e["name"][:90]]
            k[0] += 1
            k[1] += e["dur"]
            ktotal += e["dur"]
            kcount += 1
            kfirst = e["ts"] if kfirst is None else min(kfirst, e["ts"])
            klast = e["ts"] + e["dur"] if klast is None else max(klast, e["ts"] + e["dur"])
        elif cat in ("cuda_runtime", "cuda_driver"):
            a = api[e["name"]]
            a[0] += 1
            a[1] += e["dur"]
    print(f"GPU busy (kernels+copies+memsets) per iteration: {ktotal / iters / 1e3:.3f} ms over {kcount / iters:.0f} "
          f"launches; span first..last per iteration {(klast - kfirst) / iters / 1e3:.3f} ms")
    print("\ntop device work (per iteration): count, ms, name")
    for name, (c, d) in sorted(kern.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"{c / iters:7.1f} {d / iters / 1e3:8.3f}  {name}")
    print("\nAPI calls (per iteration): count, host ms, name")
    for name, (c, d) in sorted(api.items(), key=lambda kv: -kv[1][1])[:20]:
        print(f"{c / iters:7.1f} {d / iters / 1e3:8.3f}  {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", choices=["network", "step"], default="network")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--workers", type=int, default=4, help="step: the loader's worker threads")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--no-profile", action="store_true", help="timings only")
    ap.add_argument("--capture", action="store_true", help="step: replay the recorded network (capture_network)")
    ap.add_argument("--tf32", action="store_true", help="step, float32: float32_matmul_precision='high' (TF32 convs)")
    ap.add_argument("--find", action="store_true",
                    help="step: Trainer(benchmark=True), conv plans pick the fastest of cuDNN's deterministic "
                         "candidates by timing them")
    ap.add_argument("--comm", choices=["none", "after", "graph"], default="none",
                    help="step: a one-rank NCCL communicator; all-reduce after the replayed backward or in its graph")
    ap.add_argument("--optimizer", default="auto", choices=["auto", "MuSGD", "SGD", "AdamW"],
                    help="step: the model's optimizer (auto: AdamW for runs as short as this one, as 8.4.190)")
    ap.add_argument("--accumulate", type=int, default=None,
                    help="step: batches per optimizer step (default: the nominal-batch rule, 16 at batch 4)")
    args = ap.parse_args()
    if args.comm == "graph" and not args.capture:
        sys.exit("--comm graph records the all-reduce in the network's graphs: it needs --capture")
    if not ptl.cuda.is_available():
        sys.exit("benchmarks/profile_step.py needs a CUDA device")
    step = network_step(args) if args.what == "network" else train_step(args)
    t0 = time.perf_counter()
    for _ in range(5):
        step()
    ptl.cuda.synchronize()
    warmup = time.perf_counter() - t0  # the shape's plans (timed with --find) and the recording among them
    wall, enq = [], []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        ptl.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        enq.append((t1 - t0) * 1e3)
    waits = getattr(step, "loader_wait", None)
    if waits is not None:
        waits.clear()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    ptl.cuda.synchronize()
    b2b = (time.perf_counter() - t0) * 1e3 / args.iters
    what = args.what + (" capture" if args.capture else "") + ("" if args.comm == "none" else " comm " + args.comm)
    what += "" if args.accumulate is None else " accumulate %d" % args.accumulate
    what += "" if args.optimizer == "auto" else " " + args.optimizer
    print(f"{what} batch {args.batch} {args.dtype} {args.imgsz}: wall {np.median(wall):.2f} ms median "
          f"({np.min(wall):.2f}-{np.max(wall):.2f}), mean {np.mean(wall):.2f} over {args.iters}; host enqueue "
          f"{np.median(enq):.2f} ms median; back to back {b2b:.3f} ms per step; early launch "
          f"{'on' if ptl.cuda.early_launch() else 'off'}; the first 5 steps {warmup:.2f} s")
    if waits:
        # the loader's bound, or the GPU's seen through the loader's slots (the module docstring)
        print(f"back to back, waiting for the loader's batch ({args.workers} workers): "
              f"{np.sum(waits) * 1e3 / len(waits):.2f} ms per step")
    mib = 1 << 20
    print(f"device memory (ptl's allocator, since the process began): peak allocated "
          f"{ptl.cuda.max_memory_allocated() / mib:.0f} MiB, peak reserved {ptl.cuda.max_memory_reserved() / mib:.0f} MiB")
    in_use = device_in_use()
    on, made, held = ptl.cuda.call_graphs()
    print(f"calls relaunched as graphs: {'on' if on else 'off'}, {made} made, {held} held; device memory in use "
          f"(the driver's count, every allocation): " + (f"{in_use / mib:.0f} MiB" if in_use is not None else "unknown"))
    if hasattr(step, "model"):
        info = step.model.info()
        print(f"the network's share: fixed {info['fixed_bytes'] / mib:.0f} MiB; per training shape "
              f"{info['shape_bytes'] / mib:.0f} MiB, of which the arena of activations, gradients and scratch "
              f"{info['arena_bytes'] / mib:.0f} MiB; conv workspaces (main, weight-gradient, detached and attached branch queues) "
              f"{', '.join(f'{b / mib:.1f}' for b in info['workspace_bytes'])} MiB; in the arena for their steps "
              f"(queue limit {info['queue_workspace_limit'] / mib:.1f} MiB): "
              f"{', '.join(f'op {op} {max(d, pg) / mib:.1f}' for op, d, pg, _, a in info['conv_workspaces'] if a) or 'none'}")
    if args.no_profile:
        return
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        print("torch not importable: no kernel breakdown")
        return
    torch.cuda.init()
    trace = args.trace or os.path.join(tempfile.mkdtemp(), "trace.json")
    n = 5
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        ptl.cuda.synchronize()
    prof.export_chrome_trace(trace)
    analyse(trace, n)


if __name__ == "__main__":
    main()
