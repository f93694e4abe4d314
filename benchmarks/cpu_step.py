"""One CPU training step, ptl against PyTorch (issue 20), and the convolutions inside it.

Step (``--what step``): yolo26n, batch 4, imgsz 320, on the same 8 augmented coco256 batches (made once by
ptl's loader and saved, so no loader runs while steps are timed), forward + objective + backward + gradient
clipping (max norm 10) + optimizer + EMA, the optimizer stepping every batch:
- ``ptl-ref``: ptl's fused CPU step (``Engine.train_step``: one C call), reference kernels
  (``PTL_CPU_KERNELS=reference``);
- ``ptl-fast``: the same on the executor's fast CPU backend, ptl's default (oneDNN convolutions;
  csrc/cpu's BatchNorm+SiLU, attention, max-pool, upsample, add, accumulate, channel copies; the
  weight-layout conversions and the head's reshapes stay the reference's), with its per-kernel times;
- ``torch``: Ultralytics' own model and loss, ``YOLO("yolo26n.yaml").model`` with ``model.loss(batch)``
  (E2ELoss), its ``BaseTrainer.build_optimizer`` (AdamW or MuSGD, the same parameter groups and
  hyperparameters as its trainer), ``clip_grad_norm_(10)``, ``optimizer.step``, ``ModelEMA.update``;
  float32 NCHW as Ultralytics trains on the CPU, ``torch.set_num_threads`` = ptl's thread count.
Every arm runs in its own fresh process (no two OpenMP runtimes share one), ``--warmup`` steps discarded,
then ``--steps`` timed; arms alternate within each of ``--rounds`` rounds; per arm: median (min-max) of the
rounds' medians.

Convolutions (``--what convs``): every distinct convolution shape of yolo26n at batch 4, 320 (read from
the Ultralytics model), forward, input gradient and weight gradient timed for the ptl reference kernels
(``layer_conv2d_*``), the fast plans (``cpu_conv2d_plan``, run by the same ``layer_conv2d_*``) and torch (``F.conv2d``,
``aten.convolution_backward``), each direction's median over ``--reps`` calls; totals weighted by how often
each shape occurs in the network.

Load (``--load on|both``): as many busy processes as this process may use CPUs run beside the measured one
(``both``: every round measured quiet and then loaded); the slowdown is loaded / quiet per arm.

``--print-conv-shapes`` writes the shapes for benchmarks/cpu_conv_libs.c (oneDNN against im2col + BLAS).

``--spin N ...`` (ptl arms only): the libgomp spin counts to compare (GOMP_SPINCOUNT in the child's
environment; ptl's default is ptl/_openmp.py's SPIN_COUNT).

    python benchmarks/cpu_step.py [--what step|convs|all] [--optimizers AdamW MuSGD] [--arms ptl-ref ptl-fast torch]
                                  [--rounds 3] [--steps 8] [--warmup 2] [--load off|on|both] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import HERE, coco256_yaml

IMGSZ, BATCH, NBATCHES = 320, 4, 8


def cpu_seconds():
    """CPU time of this process so far (every thread, user + system)."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------------------------- children
def child_ptl_step(args):
    import numpy as np

    import ptl
    from ptl.data import Batch
    from ptl.engine import Engine
    saved = np.load(args.batches)
    batches = [Batch(saved[f"images{i}"], saved[f"targets{i}"], np.arange(BATCH), np.zeros((BATCH, 6)), 0, i)
               for i in range(NBATCHES)]
    root = tempfile.mkdtemp(prefix="ptl-cpu-step-")
    data = ptl.DetectionData(args.data, imgsz=IMGSZ, batch_size=BATCH, workers=1, verbose=False)
    model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0, hparams={"optimizer": args.optimizer})
    trainer = ptl.Trainer(max_epochs=10, accelerator="cpu", accumulate_grad_batches=1, gradient_clip_val=10.0,
                          enable_progress_bar=False, enable_checkpointing=False, logger=False, default_root_dir=root)
    trainer.datamodule = data
    eng = Engine(trainer, model, data)
    trainer._engine = eng
    fast = ptl._C.executor_info(model._exec)["backend"] == "cpu-fast"
    times, cpu = [], []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            ptl._C.cpu_kernel_stats(reset=True)
        t0, c0 = time.perf_counter(), cpu_seconds()
        losses = eng.train_step(batches[i % NBATCHES], 1, i)
        np.asarray(losses.numpy() if hasattr(losses, "numpy") else losses)
        times.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds() - c0)
    kernels = {k: v[0] / args.steps for k, v in ptl._C.cpu_kernel_stats().items()} if fast else {}
    return {"times": times[args.warmup:], "cpu": cpu[args.warmup:], "threads": ptl._C.cpu_threads(),
            "kernels": kernels,
            "loss": [float(v) for v in np.asarray(losses.numpy() if hasattr(losses, "numpy") else losses).ravel()]}


def torch_batch(torch, images, targets):
    t = torch.from_numpy(targets)
    return {"img": torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().float() / 255,
            "batch_idx": t[:, 0], "cls": t[:, 1:2], "bboxes": t[:, 2:6]}


def child_torch_step(args):
    import numpy as np
    import torch
    from ultralytics import YOLO
    from ultralytics.cfg import get_cfg
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.utils.torch_utils import ModelEMA
    torch.set_num_threads(args.threads)
    saved = np.load(args.batches)
    batches = [torch_batch(torch, saved[f"images{i}"], saved[f"targets{i}"]) for i in range(NBATCHES)]
    model = YOLO("yolo26n.yaml").model
    model.args = get_cfg()
    model.train()
    # the hyperparameters ptl's optimizer resolves for the same request (lr0 0.01, momentum 0.937 for
    # MuSGD; AdamW with its fitted lr); they do not change the step's cost
    lr = 0.01 if args.optimizer == "MuSGD" else round(0.002 * 5 / (4 + 80), 6)
    opt = BaseTrainer.build_optimizer(None, model, args.optimizer, lr=lr, momentum=0.937, decay=5e-4)
    ema = ModelEMA(model)
    times, cpu = [], []
    for i in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), cpu_seconds()
        loss, _ = model.loss(batches[i % NBATCHES])
        loss.sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        opt.step()
        opt.zero_grad()
        ema.update(model)
        times.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds() - c0)
    return {"times": times[args.warmup:], "cpu": cpu[args.warmup:], "threads": torch.get_num_threads(),
            "loss": [float(v) for v in loss.detach()]}


def conv_shapes():
    """[(n, h, w, cin, cout, k, stride, groups, count)] of yolo26n's convolutions at batch 4, 320."""
    import torch
    from ultralytics import YOLO
    model = YOLO("yolo26n.yaml").model
    seen = {}

    def hook(mod, inp, out):
        x = inp[0]
        key = (BATCH, x.shape[2], x.shape[3], mod.in_channels, mod.out_channels, mod.kernel_size[0], mod.stride[0],
               mod.groups)
        seen[key] = seen.get(key, 0) + 1

    for mod in model.modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_hook(hook)
    model.train()
    with torch.no_grad():
        model(torch.rand(BATCH, 3, IMGSZ, IMGSZ))
    return [list(k) + [c] for k, c in seen.items()]


def median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def child_ptl_convs(args):
    import numpy as np

    import ptl
    C = ptl._C
    rng = np.random.default_rng(0)
    T = lambda a: ptl.tensor(np.ascontiguousarray(a, np.float32))  # noqa: E731
    out = []
    for n, h, w, cin, cout, k, s, g, _ in json.load(open(args.shapes)):
        ho, wo = (h + 2 * (k // 2) - k) // s + 1, (w + 2 * (k // 2) - k) // s + 1
        x, dx = T(rng.standard_normal((n, h, w, cin))), T(np.zeros((n, h, w, cin)))
        wt, dw = T(rng.standard_normal((cout, k, k, cin // g))), T(np.zeros((cout, k, k, cin // g)))
        dy, y = T(rng.standard_normal((n, ho, wo, cout))), T(np.zeros((n, ho, wo, cout)))
        rp = C.layer_conv2d_plan(x, wt, s, g)
        row = {"ref": [median_time(lambda: C.layer_conv2d_forward(rp, x, wt, None, y), args.reps),
                       median_time(lambda: C.layer_conv2d_backward_input(rp, dy, wt, dx), args.reps),
                       median_time(lambda: C.layer_conv2d_backward_weight(rp, x, dy, dw), args.reps)]}
        if C.cpu_conv2d_available():
            p = C.cpu_conv2d_plan(n, h, w, cin, cout, k, s, g)
            row["fast"] = [median_time(lambda: C.layer_conv2d_forward(p, x, wt, None, y), args.reps),
                           median_time(lambda: C.layer_conv2d_backward_input(p, dy, wt, dx), args.reps),
                           median_time(lambda: C.layer_conv2d_backward_weight(p, x, dy, dw), args.reps)]
        out.append(row)
    return {"rows": out, "threads": C.cpu_threads()}


def child_torch_convs(args):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    out = []
    for n, h, w, cin, cout, k, s, g, _ in json.load(open(args.shapes)):
        x = torch.randn(n, cin, h, w)
        wt = torch.randn(cout, cin // g, k, k)
        y = F.conv2d(x, wt, None, s, k // 2, 1, g)
        dy = torch.randn_like(y)

        def grad(mask):
            return torch.ops.aten.convolution_backward(dy, x, wt, None, [s, s], [k // 2, k // 2], [1, 1], False,
                                                       [0, 0], g, mask)
        out.append({"torch": [median_time(lambda: F.conv2d(x, wt, None, s, k // 2, 1, g), args.reps),
                              median_time(lambda: grad([True, False, False]), args.reps),
                              median_time(lambda: grad([False, True, False]), args.reps)]})
    return {"rows": out, "threads": torch.get_num_threads()}


CHILDREN = {"ptl-step": child_ptl_step, "torch-step": child_torch_step, "ptl-convs": child_ptl_convs,
            "torch-convs": child_torch_convs}


# --------------------------------------------------------------------------------------------- parent
def make_batches(folder):
    """8 augmented training batches of the first 32 coco256 training images (ptl's loader, epoch 0), saved
    to an .npz; also the data.yaml the ptl children build their data module from."""
    import numpy as np
    import yaml

    import ptl
    src = coco256_yaml()
    if src is None:
        sys.exit("coco256 not found: set PTL_SHARED or keep ../shared beside the checkout")
    root = os.path.dirname(src)
    with open(src) as f:
        cfg = yaml.safe_load(f)
    images = sorted(os.listdir(os.path.join(root, "images", "train2017")))[:BATCH * NBATCHES]
    listing = os.path.join(folder, "train32.txt")
    with open(listing, "w") as f:
        f.writelines(os.path.join(root, "images", "train2017", name) + "\n" for name in images)
    data_yaml = os.path.join(folder, "data.yaml")
    with open(data_yaml, "w") as f:
        yaml.safe_dump({"path": root, "train": listing, "val": listing, "names": cfg["names"]}, f)
    data = ptl.DetectionData(data_yaml, imgsz=IMGSZ, batch_size=BATCH, workers=2, verbose=False)
    data.set_epoch(0)
    arrays = {}
    for i, b in enumerate(data.train_loader()):
        arrays[f"images{i}"], arrays[f"targets{i}"] = np.array(b.images), np.array(b.targets)
    path = os.path.join(folder, "batches.npz")
    np.savez(path, **arrays)
    return data_yaml, path


def run_child(kind, extra, env=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind] + extra
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=os.path.join(HERE, ".."))
    if r.returncode != 0:
        sys.exit("child %s failed:\n%s" % (" ".join(cmd), r.stderr[-4000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


# A busy loop that also ends when its parent is gone (this script killed) or after 20 minutes.
BUSY = "import os, time\nparent, end = os.getppid(), time.time() + 1200\nwhile os.getppid() == parent and time.time() < end: pass"


class Load:
    """Busy processes on every CPU this process may use (started and stopped by pid)."""

    def __init__(self, on):
        self.procs = []
        if on:
            for _ in range(len(os.sched_getaffinity(0))):
                self.procs.append(subprocess.Popen([sys.executable, "-c", BUSY]))
            time.sleep(0.5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


def fmt(xs):
    return "%.3f (%.3f-%.3f)" % (statistics.median(xs), min(xs), max(xs))


def bench_steps(args, results):
    tmp = tempfile.mkdtemp(prefix="ptl-cpu-step-")
    data_yaml, batches = make_batches(tmp)
    threads = len(os.sched_getaffinity(0))
    arms = []
    for opt in args.optimizers:
        for arm in args.arms:
            spins = args.spin if arm.startswith("ptl") and args.spin else [None]
            for spin in spins:
                arms.append((opt, arm, spin))
    loads = {"off": [False], "on": [True], "both": [False, True]}[args.load]
    per, cpu, kernels = {}, {}, {}
    for r in range(args.rounds):
        for opt, arm, spin in arms:
            for loaded in loads:
                env = dict(os.environ)
                if spin is not None:
                    env["GOMP_SPINCOUNT"] = str(spin)
                extra = ["--optimizer", opt, "--batches", batches, "--data", data_yaml, "--steps", str(args.steps),
                         "--warmup", str(args.warmup), "--threads", str(threads)]
                if arm.startswith("ptl"):
                    env["PTL_CPU_KERNELS"] = "fast" if arm == "ptl-fast" else "reference"
                with Load(loaded):
                    res = run_child("ptl-step" if arm.startswith("ptl") else "torch-step", extra, env)
                key = (opt, arm, spin, loaded)
                per.setdefault(key, []).append(statistics.median(res["times"]))
                cpu.setdefault(key, []).append(statistics.median(res["cpu"]))
                if res.get("kernels"):
                    kernels[key] = res["kernels"]
                print("round %d %-6s %-8s spin=%-6s load=%-5s median %.3f s, cpu %.3f s (threads %d, load avg %.1f)"
                      % (r, opt, arm, spin, loaded, per[key][-1], cpu[key][-1], res["threads"], os.getloadavg()[0]),
                      flush=True)
    print("\nstep wall seconds, median (min-max) over %d rounds of %d-step medians, and the CPU seconds of the "
          "step (all threads); machine load avg now %.2f" % (args.rounds, args.steps, os.getloadavg()[0]))
    for key, xs in per.items():
        opt, arm, spin, loaded = key
        line = "%-6s %-8s spin=%-6s %s %s cpu %.3f" % (opt, arm, spin, "loaded" if loaded else "quiet ", fmt(xs),
                                                      statistics.median(cpu[key]))
        torch_key = (opt, "torch", None, loaded)
        if arm != "torch" and torch_key in per:
            line += "  x torch %.2f" % (statistics.median(xs) / statistics.median(per[torch_key]))
        if loaded and (opt, arm, spin, False) in per:
            line += "  slowdown %.2f" % (statistics.median(xs) / statistics.median(per[(opt, arm, spin, False)]))
        print(line)
    for key, ks in kernels.items():
        print("%s %s spin=%s %s, last round, ms per step in the fast kernels (wall): %s; total %.1f" % (
            key[0], key[1], key[2], "loaded" if key[3] else "quiet", ", ".join(
                "%s %.1f" % (k, 1e3 * v) for k, v in ks.items() if v), 1e3 * sum(ks.values())))
    results["step"] = [{"optimizer": k[0], "arm": k[1], "spin": k[2], "loaded": k[3], "round_medians": v,
                        "cpu_round_medians": cpu[k], "kernels_last_round": kernels.get(k)} for k, v in per.items()]


def bench_convs(args, results):
    tmp = tempfile.mkdtemp(prefix="ptl-cpu-convs-")
    threads = len(os.sched_getaffinity(0))
    shapes_path = os.path.join(tmp, "shapes.json")
    shapes = run_child("torch-convs", ["--shapes-out", shapes_path, "--threads", str(threads)])["shapes"]
    acc = {}
    for r in range(args.rounds):
        for kind in ("ptl-convs", "torch-convs"):
            res = run_child(kind, ["--shapes", shapes_path, "--reps", str(args.reps), "--threads", str(threads)])
            for i, row in enumerate(res["rows"]):
                for impl, t in row.items():
                    acc.setdefault((i, impl), []).append(t)
    print("\nconvolutions of yolo26n at batch %d, %d: ms per call (median over %d rounds), fwd / dx / dw" % (
        BATCH, IMGSZ, args.rounds))
    impls = ["ref", "fast", "torch"]
    totals = {impl: [0.0, 0.0, 0.0] for impl in impls}
    rows = []
    for i, (n, h, w, cin, cout, k, s, g, count) in enumerate(shapes):
        cells, row = [], {"shape": [n, h, w, cin, cout, k, s, g], "count": count}
        for impl in impls:
            if (i, impl) not in acc:
                cells.append("%-23s" % "-")
                continue
            t = [statistics.median(x[d] for x in acc[(i, impl)]) for d in range(3)]
            row[impl] = t
            for d in range(3):
                totals[impl][d] += count * t[d]
            cells.append("%6.2f %6.2f %6.2f   " % tuple(1e3 * v for v in t))
        rows.append(row)
        print("%3dx%-3d %3d->%-3d k%d s%d g%-3d x%-2d | %s" % (h, w, cin, cout, k, s, g, count, " | ".join(cells)))
    print("totals over the network (ms, fwd / dx / dw / sum):")
    for impl in impls:
        t = totals[impl]
        print("  %-5s %7.1f %7.1f %7.1f %8.1f" % (impl, 1e3 * t[0], 1e3 * t[1], 1e3 * t[2], 1e3 * sum(t)))
    results["convs"] = {"rows": rows, "totals_s": totals}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", choices=["step", "convs", "all"], default="all")
    ap.add_argument("--optimizers", nargs="+", default=["AdamW", "MuSGD"], choices=["AdamW", "MuSGD"])
    ap.add_argument("--arms", nargs="+", default=["ptl-ref", "ptl-fast", "torch"],
                    choices=["ptl-ref", "ptl-fast", "torch"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15, help="convs: calls per direction and shape")
    ap.add_argument("--load", choices=["off", "on", "both"], default="off")
    ap.add_argument("--spin", type=int, nargs="*", default=None, help="GOMP_SPINCOUNT values for the ptl arms")
    ap.add_argument("--json", default=None)
    ap.add_argument("--print-conv-shapes", action="store_true",
                    help="print the convolution shapes (n h w cin cout k stride groups count) for cpu_conv_libs.c")
    # child arguments
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--optimizer", help=argparse.SUPPRESS)
    ap.add_argument("--batches", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--shapes", help=argparse.SUPPRESS)
    ap.add_argument("--shapes-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.shapes_out:
            shapes = conv_shapes()
            with open(args.shapes_out, "w") as f:
                json.dump(shapes, f)
            print(json.dumps({"shapes": shapes}))
            return
        print(json.dumps(CHILDREN[args.child](args)))
        return
    if args.print_conv_shapes:
        for row in conv_shapes():
            print(*row)
        return
    print("machine: %s, %d CPUs for this process, load avg %.2f" % (
        os.uname().nodename, len(os.sched_getaffinity(0)), os.getloadavg()[0]))
    results = {"args": {k: v for k, v in vars(args).items() if not k.startswith("child")}}
    if args.what in ("step", "all"):
        bench_steps(args, results)
    if args.what in ("convs", "all"):
        bench_convs(args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
