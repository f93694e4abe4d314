"""Where a fit's first second goes on the GPU (issue 21): the fit protocol's replay fit (yolo26n, batch 4,
640, bf16, 4 workers, RAM cache, validation on the protocol's 32 images), shortened to --epochs, with the
device synchronised around its phases: the loaders' scans, the Engine (model upload, the cache fill and
the conv plans made meanwhile on a second thread), the sanity check, the first training steps, and each
validation forward split into its prepare (buffers, conv plans: how many the device's plan cache had to
make) and its run. ``PTL_NUM_THREADS=1`` makes the plans on one thread, not warmed (the cache still fills
on ``workers`` threads).

``--first-launch`` (instead, in a fresh process): what a conv path costs at its first launch, a few
shapes' 1x1 (cuBLAS) and 3x3 (cuDNN) convolutions, first and second call of each direction, each plan
made by a single request (not warmed): what a step pays for a plan no plan-making thread warmed.

    python benchmarks/fit_startup.py [--epochs 2]
    python benchmarks/fit_startup.py --first-launch
"""
import argparse
import os
import sys
import tempfile
import time

import fit_protocol

T0 = time.perf_counter()


def first_launch(ptl, _C, np):
    sync = ptl.cuda.synchronize

    def dev(shape):
        return ptl.tensor(np.zeros(shape, np.float32), device="cuda").to(dtype="bfloat16")

    def ms(f):
        sync()
        t = time.perf_counter()
        f()
        sync()
        return 1e3 * (time.perf_counter() - t)
    dev((1, 1))
    print("first and second launch of each direction, ms (plans made by single requests, not warmed):")
    for n, h, w, cin, cout in ((8, 80, 84, 64, 64), (8, 84, 80, 64, 64), (8, 80, 88, 64, 128), (4, 160, 168, 32, 32)):
        for k in (1, 3):
            x, wt = dev((n, h, w, cin)), dev((cout, k, k, cin))
            p = _C.layer_conv2d_plan(x, wt, 1, 1)
            info = _C.layer_cuda_conv2d_plan_info(p)
            ws = dev((info["workspace"] // 2 + 1,))
            y, dw = dev((n, h, w, cout)), dev((cout, k, k, cin))
            t = {"forward": [ms(lambda: _C.layer_conv2d_forward(p, x, wt, None, y, ws)) for _ in range(2)],
                 "backward-input": [ms(lambda: _C.layer_conv2d_backward_input(p, y, wt, x, ws)) for _ in range(2)],
                 "backward-weight": [ms(lambda: _C.layer_conv2d_backward_weight(p, x, y, dw, ws)) for _ in range(2)]}
            print("  %-24s k%d %-12s %s" % ((n, h, w, cin, cout), k, info["path"],
                                            "  ".join("%s %.2f / %.2f" % (d, a, b) for d, (a, b) in t.items())))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--first-launch", action="store_true")
    args = ap.parse_args()
    global T0
    import numpy as np

    import ptl
    from ptl import _C, data as data_mod, engine, model as model_mod, report, trainer as trainer_mod
    sync = ptl.cuda.synchronize
    if args.first_launch:
        return first_launch(ptl, _C, np)

    def made():
        return _C.layer_cuda_conv2d_plan_cache(0)[1]

    def timed(obj, name, label, limit=None):
        f, calls = getattr(obj, name), [0]

        def g(*a, **k):
            calls[0] += 1
            if limit and calls[0] > limit:
                return f(*a, **k)
            sync()
            m0, t = made(), time.perf_counter()
            r = f(*a, **k)
            sync()
            print("%7.3f s  %-34s %8.1f ms  plans made %d" % (t - T0, label(a) if callable(label) else label,
                                                               1e3 * (time.perf_counter() - t), made() - m0))
            return r
        setattr(obj, name, g)

    forward, forwards = model_mod.Detector.forward, [0]

    def split_forward(self, images, *a, **k):
        forwards[0] += 1
        if forwards[0] > 10:
            return forward(self, images, *a, **k)
        b, h, w = images.shape[:3]
        sync()
        m0, t = made(), time.perf_counter()
        self.prepare(b, h, w)
        sync()
        t1 = time.perf_counter()
        r = forward(self, images, *a, **k)
        sync()
        print("%7.3f s  forward %-26s prepare %6.1f ms (plans made %d), run %6.1f ms" % (
            t - T0, (b, h, w), 1e3 * (t1 - t), made() - m0, 1e3 * (time.perf_counter() - t1)))
        return r
    model_mod.Detector.forward = split_forward
    timed(data_mod.DetectionData, "_loader", lambda a: "scan %s" % a[1])
    timed(engine.Engine, "__init__", "Engine")
    timed(engine.Engine, "train_step", lambda a: "train_step %d" % a[3], limit=3)
    timed(engine.Engine, "validate", "validation", limit=args.epochs + 1)
    for name in ("_sanity_check", "_write_hparams", "_write_args"):
        timed(trainer_mod.Trainer, name, name)
    timed(report, "print_fit_summary", "print_fit_summary")

    with tempfile.TemporaryDirectory(prefix="ptl-startup-") as root:
        data = ptl.DetectionData(fit_protocol.write_data_yaml(root), imgsz=640, batch_size=4, workers=4,
                                 cache="ram", seed=0)
        model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0)
        trainer = ptl.Trainer(max_epochs=args.epochs, precision="bf16-mixed", accelerator="cuda",
                              default_root_dir=root, enable_progress_bar=False, limit_val_batches=8, seed=0,
                              plots=False)
        sync()
        T0 = time.perf_counter()
        trainer.fit(model, data, capture_network=True)
        sync()
        print("Trainer.fit %.3f s" % (time.perf_counter() - T0))

    return 0


if __name__ == "__main__":
    sys.exit(main())
