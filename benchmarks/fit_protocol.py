"""The seed's fit benchmark, by the seed's protocol (issue 21): does replaying the network's CUDA graphs
shorten a complete short fit, with identical results, and how does the fit compare with Ultralytics'
own trainer on the same work?

Workload: all 256 coco256 images (``images/train2017`` + ``images/val2017``) as the training set;
validation on the fixed 32-image subset ``benchmarks/data/coco256_val32.txt`` of those training images
(8 batches of 4); yolo26n, batch 4, 640, ``bf16-mixed``, 4 loader workers, RAM cache, 6 epochs = 384
steps, MuSGD with warm-up and decay, EMA, validation and checkpoints every epoch; no plots (``plots=False``,
as the peer's ``plots=False``).

Timing: ``Trainer.fit`` alone, synchronised, measured inside each fresh process (imports, model and
data-module construction are outside; cache filling, conv plans and recording are inside). Two
discarded warm-up fits (one per arm), then ``--pairs`` alternating pairs (eager, ``capture_network=True``).
Each arm: median (min-max) and the ratio of medians. Each run's SHA256 digests (losses, model,
optimizer, schedule, EMA, metrics) must be identical across arms and runs. Peak allocated / reserved
device memory per run. The timeline callback records host timestamps at the trainer's hooks (no extra
synchronisation) for the per-phase breakdown of the first and a steady epoch.

Peer (``--peer N``): Ultralytics' trainer on the same data and epochs (``YOLO("yolo26n.yaml").train(
data=..., epochs=6, batch=4, imgsz=640, workers=4, cache="ram", amp=True, pretrained=False)``), its
``train()`` timed the same way in fresh processes, N runs after one discarded warm-up.

    python benchmarks/fit_protocol.py [--pairs 5] [--peer 3] [--device cuda] [--json out.json]
    python benchmarks/fit_protocol.py --device cpu --epochs 1 --imgsz 64 --pairs 1 --warmups 0   # dry run
    python benchmarks/fit_protocol.py --pairs 1 --warmups 0 --profile prof/   # where the time goes (cProfile)

On the CPU only the eager arm runs (replay needs CUDA).
"""
import argparse
import cProfile
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

T_START = time.perf_counter()  # the child's process start, for the import -> first-step time

from common import HERE, shared_dir  # noqa: E402

VAL_LIST = os.path.join(HERE, "data", "coco256_val32.txt")


def coco256_root():
    root = shared_dir(os.path.join("data", "coco256", "data.yaml"))
    if root is None:
        sys.exit("coco256 not found: set PTL_SHARED or keep ../shared beside the checkout")
    return os.path.join(root, "data", "coco256")


def write_data_yaml(folder):
    """The protocol's data.yaml: every coco256 image trains, the 32 listed ones validate. Names are read
    from coco256's own data.yaml."""
    import yaml
    root = coco256_root()
    with open(os.path.join(root, "data.yaml")) as f:
        names = yaml.safe_load(f)["names"]
    val = os.path.join(folder, "val32.txt")
    with open(VAL_LIST) as f, open(val, "w") as g:
        for line in f:
            if line.strip():
                g.write(os.path.join(root, line.strip()) + "\n")
    path = os.path.join(folder, "coco256_all.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"path": root, "train": ["images/train2017", "images/val2017"], "val": val,
                        "names": names}, f, sort_keys=False)
    return path


# --------------------------------------------------------------------------------------------- child
def _timeline_callback(ptl, stamps, sync):
    class Timeline(ptl.Callback):
        """Host timestamps at the trainer's hooks (first batch, epoch ends, validation, checkpoints)."""

        epoch = 0  # the trainer counts an epoch done before its validation and end hooks run

        def _mark(self, what, trainer):
            if sync:
                sync()
            stamps.append((what, self.epoch, time.perf_counter()))

        def on_train_epoch_start(self, trainer, pl_module):
            self.epoch = trainer.current_epoch
            self._mark("epoch_start", trainer)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx < 3:
                self._mark("batch%d_start" % batch_idx, trainer)

        def on_validation_start(self, trainer, pl_module):
            self._mark("val_start", trainer)

        def on_validation_end(self, trainer, pl_module):
            self._mark("val_end", trainer)

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            self._mark("ckpt", trainer)

        def on_train_epoch_end(self, trainer, pl_module):
            self._mark("epoch_end", trainer)
    return Timeline()


def child_ptl(args, mode):
    t_import = time.perf_counter()
    import ptl
    t_imported = time.perf_counter()
    cuda = args.device != "cpu"
    data = ptl.DetectionData(args.data, imgsz=args.imgsz, batch_size=args.batch, workers=args.workers,
                             cache="ram" if args.cache == "ram" else None, seed=0)
    model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0)
    stamps = []
    sync = ptl.cuda.synchronize if cuda and args.sync_phases else None
    with tempfile.TemporaryDirectory(prefix="ptl-fitp-") as root:
        trainer = ptl.Trainer(max_epochs=args.epochs, precision=args.precision if cuda else "32-true",
                              accelerator="cuda" if cuda else "cpu", default_root_dir=root,
                              enable_progress_bar=False, limit_val_batches=8, seed=0, plots=False,
                              callbacks=[_timeline_callback(ptl, stamps, sync)])
        if cuda:
            ptl.cuda.synchronize()
            ptl.cuda.reset_peak_memory_stats()
        prof = cProfile.Profile() if args.profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        trainer.fit(model, data, capture_network=mode == "replay")
        if cuda:
            ptl.cuda.synchronize()
        t1 = time.perf_counter()
        if prof:
            prof.disable()
            prof.dump_stats(os.path.join(args.profile, "%s_%d.prof" % (mode, os.getpid())))
        mem = {"peak_allocated": ptl.cuda.max_memory_allocated(), "peak_reserved": ptl.cuda.max_memory_reserved()} \
            if cuda else {}
        digest = trainer.digest()
    first_step = next(t for w, e, t in stamps if w == "batch0_start")
    return {"fit_s": t1 - t0, "digest": digest, "memory": mem, "stamps": [(w, e, t - t0) for w, e, t in stamps],
            "import_s": t_imported - t_import, "process_to_first_step_s": first_step - T_START,
            "import_to_first_step_s": first_step - t_import}


def child_ultralytics(args):
    t_import = time.perf_counter()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO
    import ultralytics.engine.trainer
    t_imported = time.perf_counter()
    import torch
    # The GPU machine is offline: the AMP check would try to download yolo26n.pt. Answer it as it answers
    # on an H200 (AMP on), so amp=True trains in mixed precision as it would online.
    ultralytics.engine.trainer.check_amp = lambda model, *a, **k: True
    model = YOLO("yolo26n.yaml")
    with tempfile.TemporaryDirectory(prefix="ul-fitp-") as root:
        cuda = args.device != "cpu"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        model.train(data=args.data, epochs=args.epochs, batch=args.batch, imgsz=args.imgsz, workers=args.workers,
                    cache="ram" if args.cache == "ram" else False, amp=cuda, pretrained=False,
                    device=0 if cuda else "cpu", project=root, name="peer", plots=False, verbose=False, seed=0)
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        mem = {"peak_allocated": torch.cuda.max_memory_allocated(),
               "peak_reserved": torch.cuda.max_memory_reserved()} if cuda else {}
    return {"fit_s": t1 - t0, "memory": mem, "import_s": t_imported - t_import}


# -------------------------------------------------------------------------------------------- parent
def spawn(args, mode, log_dir):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--data", args.data, "--epochs",
           str(args.epochs), "--batch", str(args.batch), "--imgsz", str(args.imgsz), "--precision", args.precision,
           "--workers", str(args.workers), "--cache", args.cache, "--device", args.device]
    if args.sync_phases:
        cmd.append("--sync-phases")
    if args.profile:
        cmd += ["--profile", os.path.abspath(args.profile)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..")] + sys.path),
               NCCL_NVLS_ENABLE="0", PYTHONFAULTHANDLER="1")
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.run_timeout)
    wall = time.perf_counter() - t0
    if log_dir:
        with open(os.path.join(log_dir, "%s_%d.log" % (mode, int(t0 * 1000) % 10 ** 8)), "w") as f:
            f.write(r.stderr)
    if r.returncode != 0:
        sys.exit("%s run failed (exit %d):\n%s" % (mode, r.returncode, r.stderr[-6000:]))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process_wall_s"] = wall
    print("%-11s fit %.2f s (process %.1f s)%s" % (mode, out["fit_s"], wall, "  peak reserved %.0f MiB" % (
        out["memory"]["peak_reserved"] / 2 ** 20) if out.get("memory") else ""), flush=True)
    return out


def phases(run):
    """Per-phase seconds of the first and of the last (steady) epoch from a run's timeline."""
    st = run["stamps"]

    def at(what, epoch, after=None):
        return next((t for w, e, t in st if w == what and e == epoch and (after is None or t >= after)), None)
    out = {}
    last = max(e for _, e, _ in st)
    for name, ep in (("first", 0), ("steady", last)):
        s, b0, b1, b2 = at("epoch_start", ep), at("batch0_start", ep), at("batch1_start", ep), at("batch2_start", ep)
        # the epoch's validation, not the sanity check's before its first batch
        vs, ve, ee = at("val_start", ep, b0), at("val_end", ep, b0), at("epoch_end", ep)
        ck = at("ckpt", ep)
        out[name] = {"to_first_batch": b0 - s, "first_step": (b1 - b0) if b1 else None,
                     "second_step": (b2 - b1) if b2 and b1 else None, "steps": (vs or ee) - b0,
                     "validation": (ve - vs) if vs is not None and ve is not None else None,
                     "checkpoint_and_rest": (ee - ve) if ve is not None else None, "epoch": ee - s,
                     "checkpoint_at": ck}
    out["before_first_epoch"] = at("epoch_start", 0)
    return out


def _rounded(obj):
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    return round(obj, 3) if isinstance(obj, float) else obj


def summary(name, runs):
    fits = [r["fit_s"] for r in runs]
    line = "| %s | %.2f (%.2f-%.2f) | %d |" % (name, statistics.median(fits), min(fits), max(fits), len(fits))
    mem = [r["memory"] for r in runs if r.get("memory")]
    if mem:
        a = [m["peak_allocated"] / 2 ** 20 for m in mem]
        b = [m["peak_reserved"] / 2 ** 20 for m in mem]
        line += " %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) |" % (statistics.median(a), min(a), max(a),
                                                          statistics.median(b), min(b), max(b))
    else:
        line += " - | - |"
    return line, statistics.median(fits)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help="data.yaml (default: the protocol's, written to a temp folder)")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--precision", default="bf16-mixed")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--cache", default="ram", choices=["ram", "none"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--warmups", type=int, default=1, help="discarded warm-up fits per arm (1: two in all)")
    ap.add_argument("--peer", type=int, default=0, help="Ultralytics train() runs after one warm-up (0: none)")
    ap.add_argument("--sync-phases", action="store_true", help="synchronise the device at every timeline mark")
    ap.add_argument("--profile", default=None, help="cProfile each ptl fit into this folder (<arm>_<pid>.prof; "
                    "the profiler slows the fit: not for timing)")
    ap.add_argument("--run-timeout", type=float, default=None)
    ap.add_argument("--logs", default=None, help="keep each run's stderr in this folder")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.child:
        out = child_ultralytics(args) if args.child == "ultralytics" else child_ptl(args, args.child)
        print(json.dumps(out))
        return 0
    with tempfile.TemporaryDirectory(prefix="ptl-fitp-data-") as tmp:
        if args.data is None:
            args.data = write_data_yaml(tmp)
        for folder in (args.logs, args.profile):
            if folder:
                os.makedirs(folder, exist_ok=True)
        arms = [] if args.pairs == 0 else ["eager"] if args.device == "cpu" else ["eager", "replay"]
        for _ in range(args.warmups):
            for m in arms:
                spawn(args, m, args.logs)
        runs = {m: [] for m in arms}
        for p in range(args.pairs):
            for m in (arms if p % 2 == 0 else arms[::-1]):
                runs[m].append(spawn(args, m, args.logs))
        peer = []
        if args.peer:
            spawn(args, "ultralytics", args.logs)
            peer = [spawn(args, "ultralytics", args.logs) for _ in range(args.peer)]
    print("\n| arm | Trainer.fit s median (min-max) | runs | peak allocated MiB | peak reserved MiB |")
    print("|---|---|---|---|---|")
    med = {}
    for m in arms:
        line, med[m] = summary(m, runs[m])
        print(line)
    if peer:
        line, med["ultralytics"] = summary("ultralytics train()", peer)
        print(line)
    if "replay" in med:
        print("replay / eager (medians): %.3f" % (med["replay"] / med["eager"]))
    if "ultralytics" in med and arms:
        best = min(med[m] for m in arms)
        print("ultralytics / ptl best arm (medians): %.2fx" % (med["ultralytics"] / best))
    digests = [r["digest"] for m in arms for r in runs[m]]
    same = all(d == digests[0] for d in digests)
    if digests:
        print("digests identical across %d runs: %s" % (len(digests), "yes" if same else "NO"))
    for m in arms:
        ph = phases(runs[m][0])
        print("%s phases (first run), s: %s" % (m, json.dumps(_rounded(ph))))
        print("%s import ptl -> first step: %.2f s (median)" % (
            m, statistics.median(r["import_to_first_step_s"] for r in runs[m])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "peer": peer}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
