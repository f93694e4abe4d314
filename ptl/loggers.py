"""Experiment loggers with Lightning's names and folders, and what a fit writes through them.

``Trainer(logger=...)`` takes ``True`` or ``None`` (a :class:`CSVLogger` under
``<default_root_dir>/runs/<name>``, a new ``version_N`` for every fit), ``False`` (no logger: checkpoints
go to ``default_root_dir/checkpoints``, no other file is written), a :class:`Logger` (:class:`CSVLogger`,
:class:`TensorBoardLogger` or a subclass of your own) or a list of them; anything else is a TypeError.
The first logger's ``log_dir`` is the run folder: the checkpoints, weights, ``results.csv`` and the plots
go there.

What is logged (``log_metrics(metrics, step)``), ``step`` being the number of training batches done
in the fit (optimizer steps differ from it under gradient accumulation):

* every ``log_every_n_steps`` training batches: ``train/box_loss_step``, ``train/cls_loss_step``,
  ``train/l1_loss_step`` (that batch's one-to-one loss items) and ``epoch``;
* at each epoch's end: the epoch's means ``train/box_loss``, ``train/cls_loss``, ``train/l1_loss``,
  ``lr/pg<i>_<group>``, and after a validation ``val/*``, ``metrics/*`` and ``fitness``, with ``epoch``
  (0-based, as Lightning counts).

Only rank 0 writes (``trainer.is_global_zero``; a trainer without the attribute is rank 0).
"""
import csv
import io
import os
import time

from .checkpoint import jsonable
from .engine import ITEM
from .runlog import ResultsCSV, append_fsynced, write_atomic

__all__ = ["Logger", "CSVLogger", "TensorBoardLogger"]

STEP_LOSSES = ("train/box_loss_step", "train/cls_loss_step", "train/l1_loss_step")


def _next_version(root):
    """The next free N of ``root/version_N`` (0 when root does not exist)."""
    if not os.path.isdir(root):
        return 0
    taken = [int(d[len("version_"):]) for d in os.listdir(root)
             if d.startswith("version_") and d[len("version_"):].isdigit() and os.path.isdir(os.path.join(root, d))]
    return max(taken) + 1 if taken else 0


class Logger:
    """Base class (Lightning's ``Logger`` interface): ``log_dir`` is ``save_dir/name/version_N``, or
    ``save_dir/name/<version>`` for a string version. ``version=None`` takes the next free N when the fit
    starts. Subclasses implement ``log_metrics`` and may implement ``log_hyperparams``, ``save`` and
    ``finalize``."""

    def __init__(self, save_dir, name="lightning_logs", version=None):
        try:
            save_dir = os.fspath(save_dir)
        except TypeError:
            raise TypeError("save_dir: expected a folder path, got %r" % (save_dir,)) from None
        if not isinstance(name, str) or not name or os.sep in name or name in (".", ".."):
            raise ValueError("name: expected a folder name, got %r" % (name,))
        if not (version is None or (isinstance(version, int) and not isinstance(version, bool) and version >= 0)
                or (isinstance(version, str) and version and os.sep not in version and version not in (".", ".."))):
            raise ValueError("version: expected None, an int >= 0 or a folder name, got %r" % (version,))
        self._save_dir, self._name, self._version = save_dir, name, version

    @property
    def save_dir(self):
        return self._save_dir

    @property
    def name(self):
        return self._name

    @property
    def root_dir(self):
        return os.path.join(self._save_dir, self._name)

    @property
    def version(self):
        """The version (an int or the given string); resolved to the next free number on first use."""
        if self._version is None:
            self._version = _next_version(self.root_dir)
        return self._version

    @property
    def log_dir(self):
        v = self.version
        return os.path.join(self.root_dir, v if isinstance(v, str) else "version_%d" % v)

    def log_hyperparams(self, params):
        pass

    def log_metrics(self, metrics, step):
        raise NotImplementedError

    def save(self):
        pass

    def finalize(self, status):
        self.save()


def _write_hparams_yaml(log_dir, params):
    import yaml
    write_atomic(os.path.join(log_dir, "hparams.yaml"),
                     yaml.safe_dump(jsonable(params), sort_keys=False).encode())


class CSVLogger(Logger):
    """Lightning's CSVLogger: ``hparams.yaml`` and ``metrics.csv`` in ``log_dir``; one CSV row per
    ``log_metrics`` call (columns: ``epoch``, ``step``, then every metric name met so far; a metric not
    logged in a row is left empty). New rows are appended at each ``save`` (every epoch end); a new
    column rewrites the file (atomically)."""

    def __init__(self, save_dir, name="lightning_logs", version=None):
        super().__init__(save_dir, name, version)
        self._rows, self._keys, self._written, self._header = [], [], 0, None

    def log_hyperparams(self, params):
        os.makedirs(self.log_dir, exist_ok=True)
        _write_hparams_yaml(self.log_dir, params)

    def log_metrics(self, metrics, step):
        row = {"step": int(step), **{k: v for k, v in metrics.items()}}
        for k in row:
            if k not in self._keys:
                self._keys.append(k)
        self._rows.append(row)

    def _header_keys(self):
        front = [k for k in ("epoch", "step") if k in self._keys]
        return front + [k for k in self._keys if k not in front]

    def save(self):
        if len(self._rows) == self._written:
            return
        os.makedirs(self.log_dir, exist_ok=True)
        path = os.path.join(self.log_dir, "metrics.csv")
        keys = self._header_keys()
        if keys != self._header:  # first save, or a new column: the whole file again
            write_atomic(path, _csv_text(keys, self._rows, header=True).encode())
            self._header = keys
        else:
            append_fsynced(path, _csv_text(keys, self._rows[self._written:], header=False))
        self._written = len(self._rows)


def _cell(v):
    if isinstance(v, float):
        return "%.6g" % v
    return v


def _csv_text(keys, rows, header):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    if header:
        w.writeheader()
    for r in rows:
        w.writerow({k: _cell(v) for k, v in r.items()})
    return buf.getvalue()


def _flat(params, prefix=""):
    """Nested hyperparameters as {"a/b": bool, int, float or str} (TensorBoard's hparams take no others)."""
    out = {}
    for k, v in params.items():
        key = "%s/%s" % (prefix, k) if prefix else str(k)
        if isinstance(v, dict):
            out.update(_flat(v, key))
        elif isinstance(v, (bool, int, float, str)):
            out[key] = v
        else:
            out[key] = str(v)
    return out


class TensorBoardLogger(Logger):
    """Lightning's TensorBoardLogger: event files in ``log_dir`` through the ``tensorboard`` package's own
    writer (no torch or TensorFlow needed): one scalar per logged value at its step, the hyperparameters
    for TensorBoard's HParams tab (flattened as ``trainer/max_epochs``, ...) and ``hparams.yaml``.
    Raises ImportError when ``tensorboard`` is not installed (``pip install tensorboard``)."""

    def __init__(self, save_dir, name="lightning_logs", version=None, flush_secs=120):
        super().__init__(save_dir, name, version)
        try:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: F401
        except ImportError:
            raise ImportError("TensorBoardLogger needs the tensorboard package: pip install tensorboard") from None
        self.flush_secs = flush_secs
        self._writer = None
        self._metric_names = []

    @property
    def experiment(self):
        """The ``EventFileWriter`` (made on first use)."""
        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = EventFileWriter(self.log_dir, flush_secs=self.flush_secs)
        return self._writer

    def _add(self, summary, step):
        from tensorboard.compat.proto.event_pb2 import Event
        self.experiment.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))

    def log_hyperparams(self, params):
        from tensorboard.plugins.hparams import summary_v2 as hp
        flat = _flat(jsonable(params))
        os.makedirs(self.log_dir, exist_ok=True)
        _write_hparams_yaml(self.log_dir, params)
        metrics = [hp.Metric(tag) for tag in ("metrics/mAP50-95", "metrics/mAP50", "metrics/precision",
                                               "metrics/recall", "fitness")]
        self._add(hp.hparams_config_pb(hparams=[hp.HParam(k) for k in flat], metrics=metrics), 0)
        self._add(hp.hparams_pb(flat), 0)

    def log_metrics(self, metrics, step):
        from tensorboard.compat.proto.summary_pb2 import Summary
        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        self._add(Summary(value=values), step)

    def save(self):
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status):
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def resolve(logger):
    """The list of loggers ``Trainer(logger=...)`` stands for; None for the default (True or None, as in
    Lightning: a CSVLogger). Raises TypeError naming what is accepted."""
    if logger is True or logger is None:
        return None
    if logger is False:
        return []
    items = list(logger) if isinstance(logger, (list, tuple)) else [logger]
    for lg in items:
        if not isinstance(lg, Logger):
            raise TypeError("logger: expected True, False, a ptl.CSVLogger, a ptl.TensorBoardLogger (any "
                            "ptl.loggers.Logger) or a list of them, got %s" % type(lg).__name__)
    return items


class LoggerConnector:
    """A trainer's loggers and the run folder's ``results.csv`` (:mod:`ptl.runlog`); the trainer calls it at
    the fit's start, per settled training batch, at each epoch's end and at the fit's end. ``logger=True``
    stands for a CSVLogger under ``root/runs/name``, a fresh version for every fit."""

    def __init__(self, logger, log_every_n_steps, root, name):
        given = resolve(logger)
        self._default = (os.path.join(root, "runs"), name) if given is None else None
        self.loggers = [CSVLogger(*self._default)] if self._default else given
        self.log_every_n_steps = log_every_n_steps
        self._root = root
        self.results, self._writer = None, False

    def setup(self, writer=True):
        """The run folder: the first logger's ``log_dir`` (every logger's version resolved before any folder
        is made, so loggers sharing save_dir and name share it), or the trainer's root without loggers (as
        Lightning's checkpoints go to default_root_dir). Made when ``writer`` (rank 0)."""
        if self._default and self.loggers[0]._version is not None:  # an earlier fit's: a new version
            self.loggers = [CSVLogger(*self._default)]
        for lg in self.loggers:
            lg.version  # noqa: B018 (resolves it)
        self.results, self._writer = None, writer
        log_dir = self.loggers[0].log_dir if self.loggers else self._root
        if writer:
            os.makedirs(log_dir, exist_ok=True)
        return log_dir

    def log_hyperparams(self, params):
        if self._writer:
            for lg in self.loggers:
                lg.log_hyperparams(params)

    def log_step(self, trainer, losses, batches_done):
        """One settled training batch (its losses vector, objective.LOSS_NAMES order)."""
        if not (self._writer and self.loggers) or batches_done % self.log_every_n_steps:
            return
        metrics = dict(zip(STEP_LOSSES, (float(x) for x in losses[ITEM])))
        metrics["epoch"] = trainer.current_epoch
        for lg in self.loggers:
            lg.log_metrics(metrics, batches_done)

    def log_epoch(self, trainer, rows, batches_done, log_dir):
        """The epoch that just ended (``rows[-1]``; earlier rows are those of the checkpoint a fit resumed
        from): every logger gets its values and saves; ``results.csv`` gets its row."""
        if not (self._writer and self.loggers):
            return
        row = rows[-1]
        metrics = dict(trainer.logged_metrics)  # what callbacks logged (LearningRateMonitor, COCO) too
        metrics.update({k: float(v) for k, v in row.items() if k not in ("epoch", "step", "time")})
        metrics["epoch"] = row["epoch"]
        for lg in self.loggers:
            lg.log_metrics(metrics, batches_done)
            lg.save()
        if self.results is None:
            self.results = ResultsCSV(os.path.join(log_dir, "results.csv"), trainer.group_schedule())
            self.results.start(rows)
        else:
            self.results.append(rows)

    def finalize(self, status):
        if self._writer:
            for lg in self.loggers:
                lg.finalize(status)
