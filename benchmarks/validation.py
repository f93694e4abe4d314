"""Validation cost on the GPU: how long the network takes to prepare a new batch shape (conv plans and
buffers; plans come from the device's plan cache after the first pass), what one cuDNN conv plan costs,
and how long ``Trainer.validate`` takes over coco256's val split (rectangular batches, so one
shape per batch), each pass run --repeat times in one process (later passes see every shape again).

    python benchmarks/validation.py [--imgsz 640] [--batch 8] [--dtype bfloat16] [--repeat 3]
"""
import argparse
import statistics
import time

from common import coco256_yaml  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import ptl
    from ptl.model import Detector

    import numpy as np
    from ptl import _C
    # one plan of each kind of conv the network makes through cuDNN: made on the first request, from the
    # device's plan cache on the second
    for n, h, w, cin, cout, k, s, g in ((args.batch, 80, 80, 64, 64, 3, 1, 1), (args.batch, 80, 80, 64, 128, 3, 2, 1),
                                         (args.batch, 40, 40, 128, 128, 3, 1, 128)):
        x = ptl.tensor(np.zeros((n, h, w, cin), np.float32), device="cuda").to(dtype=args.dtype)
        wt = ptl.tensor(np.zeros((cout, k, k, cin // g), np.float32), device="cuda").to(dtype=args.dtype)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            _C.layer_conv2d_plan(x, wt, s, g)
            times.append(1e3 * (time.perf_counter() - t0))
        print("one conv plan (%dx%dx%dx%d, %d->%d, k%d s%d g%d): made %.1f ms, from the cache %.3f ms" % (
            n, h, w, cin, cin, cout, k, s, g, times[0], times[1]), flush=True)
    net = Detector("yolo26n", num_classes=80).to("cuda", dtype=args.dtype)
    shapes = [(args.batch, args.imgsz, args.imgsz - 32 * k) for k in range(1, 4)]
    for rnd in range(args.repeat):
        times = []
        for s in shapes:
            t0 = time.perf_counter()
            net.prepare(*s)
            ptl.cuda.synchronize()
            times.append(1e3 * (time.perf_counter() - t0))
        print("prepare pass %d over %d shapes: median %.1f ms (%.1f-%.1f); plans made so far %d" % (
            rnd, len(shapes), statistics.median(times), min(times), max(times),
            _C.layer_cuda_conv2d_plan_cache(0)[1]), flush=True)
    data = ptl.DetectionData(coco256_yaml(), imgsz=args.imgsz, batch_size=args.batch // 2, workers=4, cache="ram",
                             verbose=False)
    tr = ptl.Trainer(precision="bf16-mixed" if args.dtype == "bfloat16" else "32-true", accelerator="cuda",
                     enable_progress_bar=False, logger=False)
    model = ptl.Detector("yolo26n")
    for rnd in range(args.repeat):
        t0 = time.perf_counter()
        tr.validate(model, data)
        print("validate pass %d: %.2f s over %d val batches" % (rnd, time.perf_counter() - t0,
                                                                  len(data.val_loader())), flush=True)


if __name__ == "__main__":
    main()
