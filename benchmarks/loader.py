"""Data loader throughput: augmented training images per second (mosaic + affine + HSV + flip, from the
RAM cache) for several worker counts, and decode throughput (JPEG/PNG decode + load-time resize, measured
while filling the RAM cache).

    python benchmarks/loader.py [--data PATH/data.yaml] [--imgsz 640] [--batch 16] [--workers 1,2,4,8,16]
                                [--images 2048] [--repeat 1]

Targets (issue 6): >= 250 augmented images/s per worker thread, >= 1500 with 8 threads.
Prints one table row per worker count (the median of --repeat timed spans of --images images each, with
their min and max) and a final JSON line for benchmarks/RESULTS.md.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

from common import coco256_yaml  # noqa: E402
from ptl.data import DetectionData  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=coco256_yaml())
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", default="1,2,4,8,16")
    ap.add_argument("--images", type=int, default=2048, help="augmented images to time per worker count")
    ap.add_argument("--repeat", type=int, default=1, help="timed spans per worker count (median reported)")
    args = ap.parse_args()
    if not args.data:
        sys.exit("no dataset: pass --data or set PTL_SHARED")
    results = []
    print("%8s %14s %12s %16s %18s" % ("workers", "aug img/s", "per worker", "decode img/s", "aug min-max"))
    for w in [int(x) for x in args.workers.split(",")]:
        d = DetectionData(args.data, imgsz=args.imgsz, batch_size=args.batch, workers=w, cache="ram",
                          verbose=False)
        t0 = time.perf_counter()
        loader = d.train_loader()  # scans the files and fills the cache with w threads
        fill = time.perf_counter() - t0
        n_files = loader.num_images
        epoch = 0
        d.set_epoch(epoch)
        for b in loader:  # warm-up epoch (first-touch of the ring, thread start)
            pass
        rates = []
        for _ in range(max(1, args.repeat)):
            n, t0 = 0, time.perf_counter()
            while n < args.images:
                epoch += 1
                d.set_epoch(epoch)
                for b in loader:
                    n += len(b)
            rates.append(n / (time.perf_counter() - t0))
        med = statistics.median(rates)
        row = {"workers": w, "aug_images_per_s": med, "per_worker": med / w, "aug_min": min(rates),
               "aug_max": max(rates), "repeat": len(rates), "decode_images_per_s": n_files / fill}
        results.append(row)
        print("%8d %14.1f %12.1f %16.1f %18s" % (w, med, med / w, row["decode_images_per_s"],
                                                 "%.1f-%.1f" % (min(rates), max(rates))))
        del loader, d
    print(json.dumps({"bench": "loader", "imgsz": args.imgsz, "batch": args.batch, "cpus": os.cpu_count(),
                      "machine": platform.processor() or platform.machine(), "results": results}))


if __name__ == "__main__":
    main()
