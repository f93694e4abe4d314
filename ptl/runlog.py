"""The run folder's files: ``runs/<name>/version_N``, ``hparams.yaml``, ``metrics.csv`` (one row per
epoch, rewritten atomically) and ``results.png`` (its curves, when matplotlib is installed)."""
import csv
import os
import sys

from .checkpoint import jsonable
from .errors import ConfigError


def check_run_name(name):
    """A run name is one folder name under ``runs/``: not empty, no path separator, not '.' or '..'."""
    if not isinstance(name, str) or not name or name in (".", "..") or "\0" in name or "/" in name \
            or (os.altsep and os.altsep in name) or os.sep in name:
        raise ConfigError("name: expected a folder name (no '/', not empty, '.' or '..'), got %r" % (name,))
    return name


def make_run_dir(root, name, versioned):
    """``root/runs/name/version_N`` (the next free N) when ``versioned``, else ``root``; created."""
    if versioned:
        base = os.path.join(root, "runs", name)
        os.makedirs(base, exist_ok=True)
        taken = [int(d.split("_")[1]) for d in os.listdir(base)
                 if d.startswith("version_") and d.split("_")[1].isdigit()]
        path = os.path.join(base, "version_%d" % (max(taken) + 1 if taken else 0))
    else:
        path = root
    os.makedirs(path, exist_ok=True)
    return path


def remove_if_empty(path):
    """Removes the run folder ``path`` when nothing was written to it (a fit that failed before it began)."""
    try:
        os.rmdir(path)
    except OSError:
        pass


def write_hparams(log_dir, hparams):
    import yaml
    with open(os.path.join(log_dir, "hparams.yaml"), "w") as f:
        yaml.safe_dump(jsonable(hparams), f, sort_keys=False)


def write_metrics(log_dir, rows):
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    path = os.path.join(log_dir, "metrics.csv")
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("%.6g" % v if isinstance(v, float) else v) for k, v in r.items()})
    os.replace(tmp, path)
    plot_results(path, os.path.join(log_dir, "results.png"))


def plot_results(csv_path, png_path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if not getattr(plot_results, "warned", False):
            print("ptl: matplotlib is not installed; results.png skipped", file=sys.stderr)
            plot_results.warned = True
        return
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    keys = [k for k in rows[0] if k not in ("epoch", "step", "time")]
    n = len(keys)
    cols = min(5, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(3.2 * cols, 2.6 * ((n + cols - 1) // cols)),
                             squeeze=False)
    x = [int(r["epoch"]) for r in rows]
    for ax, k in zip(axes.flat, keys):
        y = [float(r[k]) if r.get(k) not in (None, "") else float("nan") for r in rows]
        ax.plot(x, y, marker=".")
        ax.set_title(k, fontsize=9)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    tmp = png_path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, png_path)
