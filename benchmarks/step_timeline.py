"""Where a step's GPU time goes along its timeline, from a Chrome trace written by
``profile_step.py --trace FILE`` (its profiled steps run back to back): the span from the first kernel to
the last, the time no kernel runs (idle: launch gaps, waits on the host), by the length of the gaps, and
per kind of kernel (BatchNorm, convolution libraries, depthwise, copies, objective, optimizer, ...) its
count, its summed time and its time alone on the GPU (when no other kernel runs: the part of the span it
accounts for by itself), all per step; with ``--names N``, the same for the N kernels (by name, without
arguments) with the most time alone.

    python benchmarks/step_timeline.py TRACE.json[.gz] [--steps 5] [--names 30]
"""
import argparse
import collections
import gzip
import json
import re

KINDS = [  # (kind, pattern on the kernel's name), first match wins
    ("batchnorm partial sums", r"colsum_partials<bn_"),
    ("batchnorm finish", r"bn_(fwd|bwd)_finish|bn_eval_stats"),
    ("batchnorm apply", r"bn_(bwd_)?apply"),
    ("depthwise", r"dw_|ptl_colsum_partials<dw_grad"),
    ("bias", r"bias_"),
    ("concat/copies", r"channel_copy|accumulate_kernel|Memcpy|Memset|memcpy"),
    ("cuDNN", r"cudnn|xmma|cutlass|convolve|implicit_gemm|convertTensor"),
    ("cuBLAS", r"nvjet|gemm|splitK|cublas|Kernel2"),
    ("objective", r"obj_|head_grad|tal_|dfl"),
    ("optimizer/EMA", r"musgd|adamw|ema|newton|ns_|grad_clip|sgd"),
    ("attention", r"attn|attention|softmax"),
    ("max-pool/upsample", r"maxpool|upsample"),
    ("activation/elementwise", r"silu|act|add_|elementwise|scale"),
]
GAPS = [1, 2, 5, 10, 30]  # us: the upper ends of the idle gaps' bins


def kind_of(name):
    for kind, pat in KINDS:
        if re.search(pat, name):
            return kind
    return "other"


def load(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        ev = json.load(f)["traceEvents"]
    return sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), kind_of(e["name"]), re.sub(r"\(.*", "", e["name"]))
                  for e in ev if e.get("ph") == "X" and e.get("cat", "") in ("kernel", "gpu_memcpy", "gpu_memset"))


def sweep(kernels, label=2):
    """Idle gaps and each label's (kernels[i][label]: kind or name) time alone, from the kernels' start and end
    events."""
    events = sorted([(k[0], 1, k[label]) for k in kernels] + [(k[1], -1, k[label]) for k in kernels])
    running = collections.Counter()
    alone = collections.Counter()
    gaps = []
    last = None
    for t, d, k in events:
        if last is not None and t > last:
            live = +running
            if not live:
                gaps.append(t - last)
            elif sum(live.values()) == 1:
                alone[next(iter(live))] += t - last
        running[k] += d
        last = t
    return gaps, alone


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=5, help="steps in the trace (profile_step.py profiles 5)")
    ap.add_argument("--names", type=int, default=0, help="also list the N kernels with the most time alone")
    args = ap.parse_args()
    kernels = load(args.trace)
    if not kernels:
        raise SystemExit("no kernels in the trace")
    n = args.steps
    span = max(k[1] for k in kernels) - kernels[0][0]
    gaps, alone = sweep(kernels)
    idle = sum(gaps)
    per_kind = collections.defaultdict(lambda: [0, 0.0])
    for s, e, k, _ in kernels:
        per_kind[k][0] += 1
        per_kind[k][1] += e - s
    ms = 1e3 * n
    print(f"per step: span {span / ms:.3f} ms, kernels {len(kernels) / n:.0f} summing {sum(k[1] - k[0] for k in kernels) / ms:.3f}"
          f" ms, idle {idle / ms:.3f} ms, one kernel alone {sum(alone.values()) / ms:.3f} ms, several at once "
          f"{(span - idle - sum(alone.values())) / ms:.3f} ms")
    bins, lo = [], 0
    for hi in GAPS + [None]:
        sel = [g for g in gaps if g >= lo and (hi is None or g < hi)]
        bins.append(f"{lo}-{hi if hi else ''} us: {len(sel) / n:.0f} gaps, {sum(sel) / ms:.3f} ms")
        lo = hi
    print("idle gaps per step by length: " + "; ".join(bins))
    print("\nper kind, per step: kernels, summed ms, ms alone on the GPU")
    for kind, (c, t) in sorted(per_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:<24} {c / n:7.1f} {t / ms:8.3f} {alone[kind] / ms:8.3f}")
    if args.names:
        _, alone_by_name = sweep(kernels, label=3)
        per_name = collections.defaultdict(lambda: [0, 0.0])
        for s, e, _, name in kernels:
            per_name[name][0] += 1
            per_name[name][1] += e - s
        print(f"\nthe {args.names} kernels with the most time alone, per step: kernels, summed ms, ms alone")
        for name, a in alone_by_name.most_common(args.names):
            c, t = per_name[name]
            print(f"  {c / n:7.1f} {t / ms:8.3f} {a / ms:8.3f}  {name[:110]}")


if __name__ == "__main__":
    main()
