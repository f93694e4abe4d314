"""The fit benchmark: the same training run eagerly and with the recorded network replayed
(``--capture-network``), each in a fresh process of ``python -m ptl.train``, in pairs; reports wall time
and per-epoch time of each, and whether the two runs' digests (losses, model, optimizer, schedule, EMA,
metrics) are identical, as they must be.

    python benchmarks/fit.py [--data coco256/data.yaml] [--epochs 6] [--batch 4] [--imgsz 640]
                             [--precision bf16-mixed] [--workers 4] [--cache ram] [--pairs 1] [--device cuda]
                             [--logs DIR] [-- extra ptl.train arguments]

With ``--device cpu`` only the eager run is made (replay needs CUDA). ``--logs DIR`` keeps each run's folder
and its stderr (``DIR/pairP/MODE.log``) there, so a run that stalls can be inspected; one line per finished
run is printed as it ends.

    python benchmarks/fit.py --protocol [fit_protocol.py's options]

runs the seed's protocol instead (issue 21: ``Trainer.fit`` timed inside fresh processes, 256 training
images, 32 validation images, five alternating pairs, the Ultralytics peer): benchmarks/fit_protocol.py.
"""
import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from common import HERE, coco256_yaml  # noqa: E402


def run(mode, args, extra, root, run_timeout=None):
    cmd = [sys.executable, "-m", "ptl.train", "--data", args.data, "--model", "yolo26n", "--epochs", str(args.epochs),
           "--batch", str(args.batch), "--imgsz", str(args.imgsz), "--precision", args.precision, "--workers",
           str(args.workers), "--cache", args.cache, "--device", args.device, "--project", root, "--name", mode,
           "--digest", "--progress-bar", "false", "--checkpointing", "false"] + extra
    if mode == "replay":
        cmd.append("--capture-network")
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..")] + sys.path))
    os.makedirs(root, exist_ok=True)
    log = os.path.join(root, mode + ".log")
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        try:
            out, _ = proc.communicate(timeout=run_timeout)
        except subprocess.TimeoutExpired:
            # a stalled run: its Python stacks (faulthandler, on SIGABRT) and, where gdb exists, its C stacks
            if shutil.which("gdb"):
                subprocess.run(["gdb", "-p", str(proc.pid), "-batch", "-ex", "thread apply all bt"], stdout=err,
                               stderr=subprocess.STDOUT, timeout=120)
            proc.send_signal(signal.SIGABRT)
            out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    with open(log) as f:
        stderr = f.read()
    if proc.returncode != 0:
        sys.exit("%s run failed (exit %d) after %.0f s:\n%s" % (mode, proc.returncode, wall, stderr[-6000:]))
    run_dir = [ln.split("run folder ", 1)[1].strip() for ln in stderr.splitlines() if "run folder " in ln][-1]
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        epochs = [float(row["time"]) for row in csv.DictReader(f)]
    print("%s: %.1f s wall, epochs %s s" % (mode, wall, " ".join("%.2f" % e for e in epochs)), flush=True)
    return {"wall_s": wall, "epoch_s": epochs, "digest": json.loads(out)}


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=coco256_yaml())
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--precision", default="bf16-mixed")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--cache", default="ram", choices=["ram", "none"])
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    ap.add_argument("--run-timeout", type=float, default=None, help="seconds one run may take before its stacks "
                    "are dumped and it is stopped")
    ap.add_argument("--logs", default=None, help="keep run folders and logs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    if not args.data:
        sys.exit("no dataset: pass --data or set PTL_SHARED")
    modes = ["eager"] if args.device == "cpu" else ["eager", "replay"]
    results = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="ptl-fit-") as tmp:
        root = args.logs or tmp
        for p in range(args.pairs):
            for m in (modes if p % 2 == 0 else modes[::-1]):  # alternate the order within pairs
                results[m].append(run(m, args, extra, os.path.join(root, "pair%d" % p), args.run_timeout))
    print("| mode | wall s median (min-max) | epoch s median (min-max) |")
    print("|---|---|---|")
    for m in modes:
        walls = [r["wall_s"] for r in results[m]]
        eps = [e for r in results[m] for e in r["epoch_s"]]
        print("| %s | %.1f (%.1f-%.1f) | %.2f (%.2f-%.2f) |" % (m, statistics.median(walls), min(walls), max(walls),
                                                           statistics.median(eps), min(eps), max(eps)))
    digests = [r["digest"] for m in modes for r in results[m]]
    same = all(d == digests[0] for d in digests)
    print("digests identical across %d runs: %s" % (len(digests), "yes" if same else "NO"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "extra": extra, "results": results}, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    if "--protocol" in sys.argv[1:]:
        sys.argv.remove("--protocol")
        import fit_protocol
        sys.exit(fit_protocol.main())
    sys.exit(main())
