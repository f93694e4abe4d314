"""The run folder's own files: ``args.yaml`` (every resolved argument, flat: what ``ptl train
cfg=args.yaml`` reads back), ``results.csv`` (Ultralytics' columns, one row per epoch, appended) and the
atomic file writes every report uses. The loggers (``metrics.csv``, ``hparams.yaml``, event files) are
:mod:`ptl.loggers`; the plots :mod:`ptl.plots`."""
import contextlib
import os

from .errors import ConfigError

# results.csv as Ultralytics 8.4.190 writes it (engine/trainer.py save_metrics), then one lr/pg<i> per
# parameter group; ptl's L1 box term stands in Ultralytics' dfl column (spec: reg_max 1)
RESULTS_COLUMNS = ("epoch", "time", "train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)",
                   "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)", "val/box_loss", "val/cls_loss",
                   "val/dfl_loss")
_RESULTS_SOURCE = {"train/box_loss": "train/box_loss", "train/cls_loss": "train/cls_loss",
                   "train/dfl_loss": "train/l1_loss", "metrics/precision(B)": "metrics/precision",
                   "metrics/recall(B)": "metrics/recall", "metrics/mAP50(B)": "metrics/mAP50",
                   "metrics/mAP50-95(B)": "metrics/mAP50-95", "val/box_loss": "val/box_loss",
                   "val/cls_loss": "val/cls_loss", "val/dfl_loss": "val/l1_loss"}


def check_run_name(name):
    """A run name is one folder name under ``runs/``: not empty, no path separator, not '.' or '..'."""
    if not isinstance(name, str) or not name or name in (".", "..") or "\0" in name or "/" in name \
            or (os.altsep and os.altsep in name) or os.sep in name:
        raise ConfigError("name: expected a folder name (no '/', not empty, '.' or '..'), got %r" % (name,))
    return name


def make_run_dir(root, name, versioned):
    """``root/runs/name/version_N`` (the next free N) when ``versioned``, else ``root``; created (the
    folders of ``Trainer.predict``; a fit's run folder is its first logger's, ptl.loggers)."""
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


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary name beside ``path``; renamed to ``path`` when the block ends without error,
    removed otherwise: readers see the old file or the whole new one."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_atomic(path, data):
    """Writes bytes to ``path`` atomically (temporary file, fsync, rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def append_fsynced(path, text):
    """Appends text to an existing file with one write, then fsyncs: a crash keeps what was written before."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _fmt(v):
    return "" if v is None else "%.6g" % v


class ResultsCSV:
    """``results.csv``: Ultralytics' header and number format (``%.6g``, 1-based ``epoch``, ``time`` the
    seconds of training and validation so far), one row per epoch. ``start`` writes the file anew
    (atomically) with the rows so far (those of a resumed checkpoint too); ``append`` adds the new rows
    with one fsynced write each, so a crash keeps every finished epoch. A value the epoch did not
    measure (no validation) is left empty."""

    def __init__(self, path, groups):
        self.path = path
        self.columns = RESULTS_COLUMNS + tuple("lr/pg%d" % i for i in range(len(groups)))
        self._done = 0

    def line(self, rows, k):
        """The CSV line of epoch row ``rows[k]`` (its time counts the epochs before it)."""
        row = rows[k]
        elapsed = sum(float(r.get("time", 0.0)) for r in rows[:k + 1])
        lrs = {int(key[len("lr/pg"):].split("_")[0]): v for key, v in row.items() if key.startswith("lr/pg")}
        values = [row["epoch"] + 1, elapsed] + [row.get(_RESULTS_SOURCE[c]) for c in RESULTS_COLUMNS[2:]]
        values += [lrs.get(i) for i in range(len(self.columns) - len(RESULTS_COLUMNS))]
        return ",".join(_fmt(v) for v in values) + "\n"

    def start(self, rows):
        text = ",".join(self.columns) + "\n" + "".join(self.line(rows, k) for k in range(len(rows)))
        write_atomic(self.path, text.encode())
        self._done = len(rows)

    def append(self, rows):
        append_fsynced(self.path, "".join(self.line(rows, k) for k in range(self._done, len(rows))))
        self._done = len(rows)


def write_args(log_dir, args):
    """``args.yaml``: one ``key: value`` line per argument (:func:`ptl.arguments.resolved_args`)."""
    import yaml
    from .checkpoint import jsonable
    text = yaml.safe_dump(jsonable(args), sort_keys=False, default_flow_style=False, width=1 << 16)
    write_atomic(os.path.join(log_dir, "args.yaml"), text.encode())
