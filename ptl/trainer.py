"""``ptl.Trainer``: Lightning-style fit / validate / predict loops for :class:`ptl.Detector`.

The step loop follows spec §9: per batch the warm-up / schedule update, forward, objective (both
branches), backward, and an optimizer step (clip, MuSGD/SGD/AdamW, EMA) whenever the nominal-batch
accumulation says so; per epoch the o2m/o2o weight update, validation of the EMA weights, logging and
checkpoints. Callbacks run between steps, never inside one. The machinery of one fit is
:class:`ptl.engine.Engine`; checkpoints are :mod:`ptl.checkpoint`; the run folder's files :mod:`ptl.runlog`.
Messages go through the ``ptl.trainer`` logger (the library adds no handler; the command line shows INFO).
"""
import datetime
import functools
import hashlib
import json
import logging
import math
import numbers
import os
import struct
import time
import warnings

import numpy as np

from . import callbacks as cb
from . import checkpoint as _checkpoint
from . import cuda as _cuda
from . import distributed as _distributed
from . import loggers as _loggers
from . import random as _random
from . import report, runlog
from .plots import Plots
from .errors import ConfigError, DivergenceError
from .hparams_check import check_bool, check_float, check_int
from .optim import choose_optimizer
from .runlog import check_run_name
from .objective import LOSS_NAMES
from .engine import FLOAT32_MATMUL_PRECISIONS, ITEM, PRECISIONS, Engine, LossValue, _limit, _PendingLosses

log = logging.getLogger(__name__)

MAX_EPOCHS = 100  # max_epochs=None trains this many epochs: Ultralytics' default (Lightning's None means 1000)
NUM_SANITY_VAL_STEPS = 2  # num_sanity_val_steps=None: Lightning's default
_clock = time.perf_counter  # the time budget's clock (a test replaces it)


class _TrainerState:
    """Lightning's ``trainer.state``: ``fn`` is the entry point running ("fit", "validate") or None."""

    def __init__(self):
        self.fn = None


class _FitState:
    """What a checkpoint must restore besides tensors."""

    def __init__(self):
        self.epoch = 0             # next epoch to run
        self.global_step = 0       # optimizer steps taken
        self.batches_seen = 0      # training batches consumed (ni of the next batch, across epochs)


def parse_max_time(value):
    """Lightning's ``max_time``: ``"DD:HH:MM:SS"``, a ``datetime.timedelta``, a dict of timedelta's keywords
    (``{"hours": 1, "minutes": 30}``) or None; returns a positive timedelta or None."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        out = value
    elif isinstance(value, dict):
        try:
            out = datetime.timedelta(**value)
        except TypeError as e:
            raise ConfigError("max_time: %s in %r" % (e, value)) from None
    elif isinstance(value, str):
        parts = value.split(":")
        try:
            days, hours, minutes, seconds = (float(p) for p in parts) if len(parts) == 4 else (None,) * 4
        except ValueError:
            days = None
        if days is None:
            raise ConfigError("max_time: expected 'DD:HH:MM:SS', a timedelta or a dict, got %r" % (value,))
        out = datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    else:
        raise ConfigError("max_time: expected 'DD:HH:MM:SS', a timedelta or a dict, got %r" % (value,))
    if not out.total_seconds() > 0:
        raise ConfigError("max_time: expected a positive duration, got %r" % (value,))
    return out


def format_max_time(td):
    """A timedelta as ``"DD:HH:MM:SS"`` (seconds with a fraction when there is one)."""
    seconds = td.total_seconds()
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, sec = divmod(rest, 60)
    return "%02d:%02d:%02d:%s" % (days, hours, minutes, ("%02d" % sec) if sec == int(sec) else ("%09.6f" % sec))


def _check_freeze(freeze):
    """Ultralytics' ``freeze``: None, N (the first N layers, model.0 .. model.N-1) or a list of layer
    indices and parameter-name prefixes."""
    if freeze is None or (isinstance(freeze, numbers.Integral) and not isinstance(freeze, bool) and freeze >= 0):
        return freeze
    if isinstance(freeze, (list, tuple)) and all(
            (isinstance(f, numbers.Integral) and not isinstance(f, bool) and f >= 0) or (isinstance(f, str) and f)
            for f in freeze):
        return list(freeze)
    raise ConfigError("freeze: expected None, a layer count >= 0, or a list of layer indices and parameter-name "
                      "prefixes, got %r" % (freeze,))


def frozen_parameter_names(freeze, names):
    """The parameter names ``freeze`` selects out of ``names``: N freezes layers ``model.0.`` ..
    ``model.{N-1}.``; in a list, an int i freezes ``model.{i}.`` and a string is a name prefix (as given).
    YOLO26 has no DFL layer (reg_max 1), so Ultralytics' always-frozen ``.dfl`` selects nothing here."""
    if freeze is None:
        return []
    items = range(freeze) if isinstance(freeze, numbers.Integral) else freeze
    prefixes = [f if isinstance(f, str) else "model.%d." % f for f in items]
    return [n for n in names if any(n.startswith(p) for p in prefixes)]


def frozen_buffer_names(freeze, names):
    """The BatchNorm statistics (``<module>.running_mean`` / ``.running_var`` out of ``names``) of the
    modules ``freeze`` selects whole: 8.4.190 puts a BatchNorm in eval mode for the fit when a frozen
    layer's name (``model.{i}.``) is in the module's name, so its running statistics are used and never
    updated. A name prefix selects a module when it selects every name under it (``model.3.`` and
    ``model.3.bn`` do, ``model.3.bn.weight`` does not)."""
    if freeze is None:
        return []
    items = range(freeze) if isinstance(freeze, numbers.Integral) else freeze
    prefixes = [f if isinstance(f, str) else "model.%d." % f for f in items]
    return [n for n in names if any((n.rsplit(".", 1)[0] + ".").startswith(p) for p in prefixes)]


def _recorded_best(path):
    """The best checkpoint that the ModelCheckpoint state in checkpoint ``path`` names, read from the file's
    header alone; None when there is none or the header cannot be read (the caller looks further)."""
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(min(n, 1 << 26)))
        state = json.loads(header["__metadata__"][_checkpoint.HEADER_KEY])
        return state["callbacks"][cb.ModelCheckpoint.__qualname__]["best_model_path"] or None
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


class Trainer:
    """Fits a :class:`ptl.Detector` on :class:`ptl.DetectionData`, with Lightning 2.6's argument names and,
    where the meaning is the same, its defaults (keyword arguments only, as in Lightning).

    Detector hyperparameters (optimizer, lr0, lrf, momentum, weight_decay, warmup_*, EMA, cos_lr) come from
    ``model.hparams`` (spec §10 defaults). Where ptl keeps Ultralytics' default instead of Lightning's:

    - ``accumulate_grad_batches=None`` (Lightning: 1) follows the nominal batch of 64 (``nbs``) with its
      warm-up ramp; an int fixes the number of batches per optimizer step.
    - ``gradient_clip_val=10.0`` (Lightning: None): gradients are clipped to norm 10 (0 or None: no clipping).
    - ``max_epochs=None`` trains 100 epochs (Lightning: 1000); ``max_steps`` (-1: no limit) stops earlier.
    - ``precision=None`` (or ``"auto"``; Lightning: "32-true") resolves at fit time to ``"bf16-mixed"`` on a GPU
      of compute capability >= 8.0, ``"16-mixed"`` on an older GPU and ``"32-true"`` on the CPU
      (:func:`ptl.cuda.default_precision`), as Ultralytics trains with AMP; a fit logs the choice and
      ``trainer.precision`` returns it.
    - ``deterministic``: ptl is always deterministic (the same inputs give bit-identical results, on the CPU
      and on a GPU); None/True/"warn" say so, ``False`` warns that it changes nothing.

    Lightning's other shared arguments: ``accelerator`` ("auto", "cpu", "cuda"/"gpu"); ``devices`` (an int,
    a list of GPU ordinals, ``"0,1"`` or ``"auto"``; on the CPU a number of processes; ``[i]`` trains on GPU
    i, ``trainer.device`` is then ``"cuda:i"``), ``num_nodes`` and ``strategy="ddp"`` (``"auto"``: ddp when
    there is more than one device) (:mod:`ptl.distributed`: data-parallel, the fused step all-reduces the
    gradients); ``logger`` (True/None: the run folder ``runs/<name>/version_N``; False: none);
    ``fast_dev_run`` (True or n: n batches of training and validation in one epoch; no sanity check,
    checkpoint, log file or run folder; early stopping and the LR monitor off); ``max_time`` ("DD:HH:MM:SS",
    timedelta or dict: see below); ``limit_train_batches`` / ``limit_val_batches`` (count or fraction; 0
    val batches: no validation); ``overfit_batches`` (count or fraction: the same first batches every epoch,
    epoch 0's images and augmentation, and as many validation batches); ``val_check_interval`` (None/1.0:
    at the epoch end; a fraction f: also every f of the epoch; an int n: also every n training batches);
    ``check_val_every_n_epoch``; ``num_sanity_val_steps`` (None: 2 validation batches before the first
    training batch, so a broken validation set fails at once; -1: all; 0: none); ``enable_checkpointing``
    and ``enable_progress_bar`` (None: True); ``default_root_dir`` (None: the current folder).

    ptl's own: ``timeout`` (seconds any wait of a distributed job may take; default ``PTL_DIST_TIMEOUT`` or
    ``ptl.distributed.DEFAULT_TIMEOUT_S``; rank 0 alone prints, logs and writes files, and ``global_rank``,
    ``local_rank``, ``node_rank``, ``world_size`` and ``is_global_zero`` say where a process stands),
    ``name`` (the run folder's name), ``seed`` (seeds ptl's global generator; the model's and
    data's seeds are their own), ``patience`` (Ultralytics: stop when ``fitness`` has not improved for N
    validations, an EarlyStopping on fitness; None or 0: off) and ``freeze`` (Ultralytics: N layers or a
    list of layer indices / parameter-name prefixes; recorded in hparams and args.yaml, the parameter
    names in ``trainer.frozen_parameters``, the BatchNorm statistics of the modules it selects whole in
    ``trainer.frozen_buffers``): frozen parameters get no gradient and no update, and those BatchNorms
    run in eval mode, as 8.4.190 (docs/training.md).

    A time budget (``max_time``; ``time=H`` hours on the command line) works as Ultralytics' ``time``: the
    fit stops after the optimizer step that passes it (then validates and checkpoints as at an epoch's
    end, so ``last.ckpt`` holds the stopped run), and after every epoch the planned number of epochs is
    re-estimated as ``ceil(budget / mean epoch time)`` (at most an explicit ``max_epochs``), which sets the
    learning-rate schedule's length, close_mosaic and the o2m/o2o weights for the following epochs. A run
    with a time budget depends on timing, so its digests do not repeat.

    ``end2end`` chooses what validation measures, as 8.4.190's ``nms`` does: False (the default, its
    ``nms=None``) the one-to-many head with class-aware NMS; True (its ``nms=False``) the one-to-one
    head's top-300 without NMS. It is recorded in ``hparams()["trainer"]``.

    ``float32_matmul_precision`` is PyTorch's setting of that name for a ``"32-true"`` fit on a GPU:
    ``"highest"`` (the default) keeps the convolutions in strict float32; ``"high"`` or ``"medium"`` let cuDNN
    use TF32 tensor cores (a 10-bit mantissa for the products, float32 sums), faster and still deterministic
    but not bit-identical to ``"highest"``. It changes nothing on the CPU or in a mixed-precision fit (their
    convolutions do not run in float32), and is recorded in ``hparams()["trainer"]``.

    ``all_reduce_in_graph`` (a data-parallel fit on GPUs with ``fit(..., capture_network=True)``): the
    gradient all-reduce and the BatchNorm broadcast are recorded with the backward in one CUDA graph that
    the optimizer's steps replay, instead of being called after the replayed backward; the same NCCL calls
    in the same order, so the same bits (docs/training.md). One process has nothing to all-reduce: there
    it changes nothing.

    ``benchmark`` is Lightning's flag of that name (PyTorch's ``cudnn.benchmark``): True times cuDNN's deterministic
    candidates for every convolution of a batch shape when that shape is first prepared on a GPU, and keeps the
    fastest. Each run stays deterministic (replay equals eager, and steps repeat bit for bit within the run), but
    timings decide the algorithms, and another run, a resumed one too, may choose others and so differ in the
    last bits. False (the default) takes cuDNN's heuristic choice, which is the same every run. It changes nothing
    on the CPU, and is recorded in ``hparams()["trainer"]``.
    """

    def __init__(self, *, accelerator="auto", strategy="auto", devices="auto", num_nodes=1, precision=None,
                 logger=None, callbacks=None, fast_dev_run=False, max_epochs=None, max_steps=-1, max_time=None,
                 limit_train_batches=None, limit_val_batches=None, overfit_batches=0.0, val_check_interval=None,
                 check_val_every_n_epoch=1, num_sanity_val_steps=None, enable_checkpointing=None,
                 enable_progress_bar=None, accumulate_grad_batches=None, gradient_clip_val=10.0, deterministic=None,
                 default_root_dir=None, name="train", seed=None, patience=None, freeze=None, timeout=None,
                 end2end=False, log_every_n_steps=50, enable_model_summary=True, plots=True, coco_eval=False,
                 float32_matmul_precision="highest", all_reduce_in_graph=False, benchmark=False):
        check_int("max_epochs", max_epochs, 1, none_ok=True)
        if check_int("max_steps", max_steps, -1) == 0:
            raise ConfigError("max_steps: expected -1 (no limit) or an int >= 1, got 0")
        if precision is not None and (not isinstance(precision, (str, int)) or isinstance(precision, bool)
                                      or (precision not in PRECISIONS and precision != "auto")):
            raise ConfigError("precision: expected None/'auto', '32-true', '16-mixed' or 'bf16-mixed', got %r"
                              % (precision,))
        check_int("accumulate_grad_batches", accumulate_grad_batches, 1, none_ok=True)
        check_float("gradient_clip_val", gradient_clip_val, 0.0, none_ok=True)
        check_int("check_val_every_n_epoch", check_val_every_n_epoch, 1)
        if accelerator not in ("auto", "cpu", "cuda", "gpu"):
            raise ConfigError("accelerator: expected 'cpu', 'cuda' or 'auto', got %r" % (accelerator,))
        if strategy not in _distributed.STRATEGIES:
            raise ConfigError("strategy: expected one of %s, got %r" % (", ".join(map(repr, _distributed.STRATEGIES)),
                                                                      strategy))
        check_int("num_nodes", num_nodes, 1)
        try:
            if accelerator == "cpu" or (accelerator == "auto" and not _cuda.is_available()):
                _distributed.parse_devices(devices, "cpu")
            elif devices != "auto":
                _distributed.parse_devices(devices, "cuda", available=max(_cuda.device_count(), 1 << 16))
            timeout = _distributed.timeout_seconds(timeout)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for what, value in (("limit_train_batches", limit_train_batches), ("limit_val_batches", limit_val_batches),
                            ("overfit_batches", overfit_batches)):
            _limit(value, 1, what)
        if limit_train_batches is not None and not isinstance(limit_train_batches, bool) and limit_train_batches == 0:
            raise ConfigError("limit_train_batches: 0 leaves no training batch to run")
        if val_check_interval is not None:
            if isinstance(val_check_interval, bool) or not isinstance(val_check_interval, numbers.Real):
                raise ConfigError("val_check_interval: expected None, a fraction in (0, 1] or a batch count >= 1, "
                                  "got %r" % (val_check_interval,))
            if isinstance(val_check_interval, numbers.Integral):
                check_int("val_check_interval", val_check_interval, 1)
            else:
                check_float("val_check_interval", val_check_interval, 0.0, 1.0, lo_open=True)
        check_int("num_sanity_val_steps", num_sanity_val_steps, -1, none_ok=True)
        if isinstance(fast_dev_run, bool):
            dev_batches = int(fast_dev_run)
        else:
            dev_batches = check_int("fast_dev_run", fast_dev_run, 0)
        if accelerator == "cpu" and precision not in (None, "auto") and PRECISIONS[precision] != "float32":
            raise ConfigError("precision: %r needs CUDA; the CPU trains in '32-true'" % (precision,))
        check_bool("end2end", end2end)
        if float32_matmul_precision not in FLOAT32_MATMUL_PRECISIONS:
            raise ConfigError("float32_matmul_precision: expected one of %s, got %r"
                              % (", ".join(map(repr, FLOAT32_MATMUL_PRECISIONS)), float32_matmul_precision))
        for flag, value in (("enable_model_summary", enable_model_summary), ("plots", plots),
                            ("coco_eval", coco_eval), ("all_reduce_in_graph", all_reduce_in_graph),
                            ("benchmark", benchmark)):
            check_bool(flag, value)
        check_int("log_every_n_steps", log_every_n_steps, 1)
        for flag, value in (("enable_progress_bar", enable_progress_bar),
                            ("enable_checkpointing", enable_checkpointing)):
            if value is not None:
                check_bool(flag, value)
        if not (deterministic is None or isinstance(deterministic, bool) or deterministic == "warn"):
            raise ConfigError("deterministic: expected None, True, 'warn' or False, got %r" % (deterministic,))
        if deterministic is False:
            warnings.warn("deterministic=False changes nothing: ptl always computes deterministically (the same "
                          "inputs give bit-identical results)", UserWarning, stacklevel=2)
        if default_root_dir is not None:
            try:
                default_root_dir = os.fspath(default_root_dir)
            except TypeError:
                raise ConfigError("default_root_dir: expected a folder path, got %r" % (default_root_dir,)) from None
            if os.path.exists(default_root_dir) and not os.path.isdir(default_root_dir):
                raise ConfigError("default_root_dir: %s exists and is not a folder" % default_root_dir)
        check_run_name(name)
        check_int("seed", seed, 0, 2 ** 64 - 1, none_ok=True)
        check_int("patience", patience, 0, none_ok=True)
        if isinstance(callbacks, cb.Callback):
            callbacks = [callbacks]
        elif callbacks is not None and not isinstance(callbacks, (list, tuple)):
            raise ConfigError("callbacks: expected a list of ptl.Callback instances, got %s" % type(callbacks).__name__)
        self.max_time = parse_max_time(max_time)
        self.freeze = _check_freeze(freeze)
        self.overfit_batches = overfit_batches
        if overfit_batches:  # the same first batches every epoch, and as many validation batches
            limit_train_batches = limit_val_batches = overfit_batches
        self.fast_dev_run = dev_batches or False
        if self.fast_dev_run:  # Lightning's meaning: n batches of each, one epoch, nothing written
            limit_train_batches = limit_val_batches = dev_batches
            max_epochs, max_steps, num_sanity_val_steps, val_check_interval = 1, -1, 0, None
            logger = False
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self._precision = precision
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val = gradient_clip_val
        self.limit_train_batches = limit_train_batches
        self.limit_val_batches = limit_val_batches
        self.val_check_interval = 1.0 if val_check_interval is None else val_check_interval
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.num_sanity_val_steps = NUM_SANITY_VAL_STEPS if num_sanity_val_steps is None else num_sanity_val_steps
        self.enable_checkpointing = enable_checkpointing is not False
        self.enable_progress_bar = enable_progress_bar is not False
        self.deterministic = deterministic
        self.default_root_dir = default_root_dir if default_root_dir is not None else os.getcwd()
        self.accelerator = "cuda" if accelerator == "gpu" else accelerator
        self.devices, self.num_nodes, self.strategy, self.timeout = devices, num_nodes, strategy, timeout
        self.end2end = end2end
        self.float32_matmul_precision = float32_matmul_precision
        self.all_reduce_in_graph = all_reduce_in_graph
        self.benchmark = benchmark
        self._dist = _distributed.Context()  # one process until fit() joins a job
        # the loggers (a TypeError for anything else) and results.csv: ptl.loggers
        self._logging = _loggers.LoggerConnector(logger, log_every_n_steps, self.default_root_dir, name)
        self.loggers = self._logging.loggers
        self.log_every_n_steps = log_every_n_steps
        self.enable_model_summary = enable_model_summary
        self.name = name
        self.seed = seed
        self.patience = patience
        self.callbacks = list(callbacks or [])
        for c in self.callbacks:
            if not isinstance(c, cb.Callback):
                raise TypeError("callbacks: expected ptl.Callback instances, got %s" % type(c).__name__)
        if patience:
            self.callbacks.append(cb.EarlyStopping("fitness", patience=patience, mode="max"))
        if self.enable_checkpointing and not any(isinstance(c, cb.ModelCheckpoint) for c in self.callbacks):
            self.callbacks.append(cb.ModelCheckpoint(filename="best", monitor="fitness", mode="max", save_last=True,
                                                     monitor_optional=True))
        if self.enable_progress_bar and not any(isinstance(c, cb.ProgressBar) for c in self.callbacks):
            self.callbacks.append(cb.ProgressBar())
        self.plots, self.coco_eval = plots, coco_eval
        if plots and not any(isinstance(c, Plots) for c in self.callbacks):
            self.callbacks.append(Plots())
        if coco_eval:
            from .coco_eval import COCOEvaluator  # needs faster-coco-eval or pycocotools
            self.callbacks.append(COCOEvaluator())
        self.callback_metrics = {}
        self.logged_metrics = {}
        self.should_stop = False
        self.sanity_checking = False
        self.validating_mid_epoch = False  # a val_check_interval validation inside an epoch (no checkpoint)
        self.state = _TrainerState()
        self.validated_this_epoch = False
        self.current_epoch_completed = 0
        self.num_training_batches = 0
        self.num_val_batches = 0
        self.loss_history = []  # per training batch: the objective's losses vector (float32, LOSS_NAMES)
        self._resumed_from = None  # the checkpoint this fit resumed from (named when a fit diverges)
        self._last_batch = (0, 0, 0)  # epoch, batch index and optimizer steps after the latest training batch
        self.val_history = []
        self.ap_per_class = {}  # class name -> AP50-95 of the last validation
        self.frozen_parameters = []  # the parameter names ``freeze`` selects (set when a fit starts)
        self.frozen_buffers = []  # the BatchNorm statistics of the modules it selects whole (eval-mode BN)
        self.run_args = {}  # flat arguments args.yaml records beyond the objects' own (the CLI's weights file)
        self.datamodule = None
        self.model = None
        self.log_dir = None
        self._state = _FitState()
        self._engine = None
        self._epoch_rows = []
        self._planned_epochs = None  # a time budget's estimate of the fit's length
        self._train_start = None
        self.capture_network = False

    # -------------------------------------------------------------------------------- properties
    @property
    def current_epoch(self):
        return self._state.epoch

    @property
    def global_step(self):
        return self._state.global_step

    @property
    def global_rank(self):
        return self._dist.rank

    @property
    def local_rank(self):
        return self._dist.local_rank

    @property
    def node_rank(self):
        return self._dist.node_rank

    @property
    def world_size(self):
        return self._dist.world_size

    @property
    def is_global_zero(self):
        return self._dist.is_global_zero

    @property
    def max_epochs_effective(self):
        """The fit's planned length: max_epochs (None: 100), or a time budget's estimate once it has one."""
        if self._planned_epochs is not None:
            return self._planned_epochs
        return self.max_epochs if self.max_epochs is not None else MAX_EPOCHS

    @property
    def precision(self):
        """The precision the fit computes in: as given, or for None / "auto" the device's default
        (:func:`ptl.cuda.default_precision`)."""
        if self._precision in (None, "auto"):
            return _cuda.default_precision(self.device)
        return self._precision

    @property
    def device(self):
        """``"cpu"`` or ``"cuda:N"``: this rank's GPU once a fit has joined its job, else the first GPU that
        ``devices`` names (``[N]``, ``"N,"``; GPU 0 for "auto" or a count)."""
        if self.accelerator == "cpu":
            return "cpu"
        if not _cuda.is_available():
            if self.accelerator == "cuda":
                raise ConfigError("accelerator: 'cuda' requested but no CUDA device is available")
            return "cpu"
        if self._dist.device is not None:
            return "cuda:%d" % self._dist.device
        try:
            ids = _distributed.parse_devices(1 if self.devices == "auto" else self.devices, "cuda")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return "cuda:%d" % ids[0]

    @property
    def logger(self):
        """The first logger (None without one), as Lightning's ``trainer.logger``."""
        return self.loggers[0] if self.loggers else None

    def log_dict(self, values):
        for k, v in values.items():
            self.logged_metrics[k] = float(v)
            self.callback_metrics[k] = float(v)

    def group_schedule(self):
        """[(group name, lr, momentum, weight decay)] of the optimizer's parameter groups, as last set."""
        if self._engine is None:
            return []
        return [("pg%d_%s" % (i, g["param_group"]), float(g["lr"]), float(g["momentum"]), float(g["weight_decay"]))
                for i, g in enumerate(self._engine.opt.param_groups)]

    def progress_metrics(self):
        return {k: v for k, v in self.callback_metrics.items() if k.startswith("train/")}

    # ------------------------------------------------------------------------------------ hooks
    def _call(self, hook, *args):
        for c in self.callbacks:
            getattr(c, hook)(self, self.model, *args)

    # -------------------------------------------------------------------------------------- fit
    def _check_precision(self, device):
        """Says which precision None / "auto" chose; a low precision on the CPU is an error."""
        if self._precision in (None, "auto"):
            log.info("precision: %s (the default on %s)", self.precision, device)
        if device == "cpu" and PRECISIONS[self.precision] != "float32":
            raise ConfigError("precision: %r needs CUDA; the CPU trains in '32-true'" % (self.precision,))
        if self.float32_matmul_precision != "highest" and (device == "cpu" or PRECISIONS[self.precision] != "float32"):
            log.info("float32_matmul_precision=%r changes nothing here: only float32 convolutions on a GPU use TF32",
                     self.float32_matmul_precision)

    def fit(self, model, datamodule, ckpt_path=None, capture_network=False):
        """Trains ``model`` on ``datamodule``; ``ckpt_path`` resumes from a checkpoint of this trainer: a
        path, or ``"last"`` / ``"best"`` as in Lightning (the ModelCheckpoint callback's last / best file
        of an earlier fit of this trainer; for a fresh trainer, the newest run folder
        ``<default_root_dir>/runs/<name>/version_N`` holding one: its ``checkpoints/last.ckpt``, or the best
        checkpoint that file records, else ``checkpoints/best.ckpt``). ``capture_network=True`` (CUDA): the
        first full-size step runs eagerly, then the network's forward and backward are recorded as CUDA
        graphs and replayed on every full-size step after it (the objective, optimizer and EMA stay eager);
        the replayed network computes the bits of the eager one, so the fit's results are those of an
        eager fit (docs/training.md).

        Resuming (docs/training.md): the whole checkpoint is read and checked against the model, the data
        and the run before anything changes; a bad one raises :class:`ptl.CheckpointError`. A checkpoint
        that has done ``max_epochs`` epochs already gives a :class:`ptl.ResumeWarning` and returns without
        training; another batch size or image size is an error; another max_epochs or other training
        settings give a ResumeWarning (the result differs from an uninterrupted run)."""
        if not all(hasattr(model, a) for a in ("num_classes", "parameter_table", "state_dict")):
            raise TypeError("model: expected a ptl.Detector, got %s" % type(model).__name__)
        if not all(hasattr(datamodule, a) for a in ("num_classes", "train_loader", "batch_size", "imgsz")):
            raise TypeError("datamodule: expected a ptl.DetectionData, got %s" % type(datamodule).__name__)
        self._join_job()
        try:
            return self._fit(model, datamodule, ckpt_path, capture_network)
        except BaseException as exc:
            self._dist.close(exc)  # a failed fit ends the job: every rank is told why, started ranks stop
            raise

    def _fit(self, model, datamodule, ckpt_path, capture_network):
        device = self.device  # accelerator='cuda' without a device fails here, before any work
        if capture_network and device == "cpu":
            raise ConfigError("capture_network=True: graph replay needs accelerator='cuda'")
        if self.all_reduce_in_graph and not capture_network:
            raise ConfigError("all_reduce_in_graph=True records the gradient all-reduce in the network's CUDA "
                              "graphs: it needs fit(..., capture_network=True)")
        if datamodule.num_classes != model.num_classes:
            raise ConfigError("datamodule: %d classes in %s but the model has %d" % (
                datamodule.num_classes, getattr(datamodule, "cfg", {}).get("yaml", "data.yaml"), model.num_classes))
        names = [n for n, _, _ in model.parameter_table()]
        frozen = frozen_parameter_names(self.freeze, names)
        if self.freeze is not None and len(frozen) == len(names):
            raise ConfigError("freeze=%r freezes every parameter of the model: nothing would train" % (self.freeze,))
        self._check_precision(device)
        self._planned_epochs = None  # a time budget re-plans each fit
        ckpt_path = self._resolve_ckpt_path(ckpt_path)
        resume = self._resumed_from = None
        if ckpt_path is not None:
            if self.world_size > 1:  # every rank resumes from the same bytes
                try:
                    _distributed.check_same_file(self._dist.group, ckpt_path)
                except ValueError as exc:
                    raise _checkpoint.CheckpointError(str(exc)) from None
            resume = _checkpoint.read(ckpt_path)
            self._resumed_from = resume.path
            _checkpoint.check_model(resume, model)
            if not _checkpoint.plan_resume(resume, self, datamodule):
                st = self._state
                st.epoch, st.global_step = resume.epochs_done, resume.header["global_step"]
                st.batches_seen = resume.header["batches_seen"]
                self.current_epoch_completed = st.epoch
                return self
        self.capture_network = bool(capture_network)
        self.model, self.datamodule = model, datamodule
        self.frozen_parameters = frozen
        self.frozen_buffers = frozen_buffer_names(self.freeze, [n for n, _, _ in model.buffer_table()])
        self.should_stop = False
        self.state.fn = "fit"
        self._configure_run_dir()
        if self.seed is not None:
            _random.seed_everything(self.seed)

        def run():
            self._call("setup", "fit")
            self._engine = Engine(self, model, datamodule)
            if resume is not None:
                _checkpoint.restore(self, resume)
            self._start_messages(ckpt_path)
            self._write_hparams()
            self._write_args(ckpt_path)
            if self.enable_model_summary:
                report.print_fit_summary(self)
            self._call("on_fit_start")
            self._sanity_check()
            self._train_start = _clock()
            self._call("on_train_start")
            self._fit_loop()
            self._engine.adopt_ema()  # the model now holds what validation and the best checkpoint measured
            self._call("on_train_end")
            self._call("on_fit_end")
        try:
            self._guarded("fit", model, run)
        except _checkpoint.CheckpointError:
            if self.loggers and self.is_global_zero:  # the fresh version_N folder: the failed resume wrote nothing there
                runlog.remove_if_empty(self.log_dir)
            raise
        return self

    def _join_job(self):
        """This process's place in its job (:func:`ptl.distributed.job`): one device, or with devices *
        num_nodes > 1 (``devices="auto"``: every visible GPU, as in Lightning) or a launcher's world size > 1,
        one rank of a data-parallel job, whose other ranks this process starts when no launcher did. The job
        outlives the fit (later fits and validations of the process take part in it); a failed fit ends it."""
        acc = "cpu" if self.accelerator == "cpu" or not _cuda.is_available() else "cuda"
        try:
            self._dist = _distributed.job(acc, self.devices, self.num_nodes, self.strategy, self.timeout)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _start_messages(self, ckpt_path):
        """What the fit does that the user may not expect: ignored hyperparameters, a freeze."""
        hp = dict(getattr(self.model, "hparams", None) or {})
        ignored = [k for k in ("lr0", "momentum", "warmup_bias_lr") if k in hp]
        if str(hp.get("optimizer", "auto")).lower() == "auto" and ignored:
            name, lr0, momentum, _ = choose_optimizer(self._engine.cfg)
            warnings.warn("optimizer=auto found, ignoring %s: auto chose %s with lr0=%g, momentum=%g (pass "
                          "optimizer='SGD', 'MuSGD' or 'AdamW' to use them)" % (
                              ", ".join("%s=%r" % (k, hp[k]) for k in ignored), name, lr0, momentum),
                          UserWarning, stacklevel=4)
        if self.frozen_parameters:
            log.info("freeze=%r: %d parameter tensors frozen, %d BatchNorm layers in eval mode", self.freeze,
                     len(self.frozen_parameters), len(self.frozen_buffers) // 2)
        if ckpt_path is not None:
            log.info("resuming from %s at epoch %d", ckpt_path, self._state.epoch)
        if self.max_time is not None:
            log.info("time budget %s: the planned epochs are re-estimated after each epoch",
                     format_max_time(self.max_time))

    def _resolve_ckpt_path(self, ckpt_path):
        """``"last"`` / ``"best"`` to a file (see :meth:`fit`); any other value is returned as it is."""
        if not isinstance(ckpt_path, str) or ckpt_path not in ("last", "best"):
            return ckpt_path
        checkpointers = [c for c in self.callbacks if isinstance(c, cb.ModelCheckpoint)]
        for c in checkpointers:  # an earlier fit of this trainer
            path = c.last_model_path if ckpt_path == "last" else c.best_model_path
            if path and os.path.isfile(path):
                return path
        folders = [c.dirpath for c in checkpointers if c.dirpath is not None]
        base = os.path.join(self.default_root_dir, "runs", self.name)
        if os.path.isdir(base):
            versions = sorted((int(d.split("_")[1]), d) for d in os.listdir(base)
                              if d.startswith("version_") and d.split("_")[1].isdigit())
            folders += [os.path.join(base, d, "checkpoints") for _, d in reversed(versions)]
        for folder in folders:
            last = os.path.join(folder, "last.ckpt")
            if ckpt_path == "last" and os.path.isfile(last):
                return last
            if ckpt_path == "best":
                best = _recorded_best(last) if os.path.isfile(last) else None
                for path in (best, os.path.join(folder, "best.ckpt")):
                    if path and os.path.isfile(path):
                        return path
        raise ConfigError("ckpt_path=%r: no %s checkpoint found (looked in %s)" % (
            ckpt_path, ckpt_path, ", ".join(folders) or "%s, which does not exist" % base))

    def _guarded(self, stage, model, body):
        """Runs body(); an exception fires every callback's on_exception and is re-raised (the original, even
        when a callback's handler fails); teardown runs either way."""
        try:
            result = body()
        except BaseException as exc:
            for c in self.callbacks:
                try:
                    c.on_exception(self, model, exc)
                except Exception:
                    pass
            self._teardown(stage, "failed")
            raise
        self._teardown(stage, "success")
        return result

    def _teardown(self, stage, status):
        try:
            self._call("teardown", stage)
        finally:
            self.state.fn = None
            if stage == "fit":
                self._logging.finalize(status)
            if self._engine is not None:
                self._engine.close()

    def _sanity_check(self):
        """Validates num_sanity_val_steps batches before training (Lightning): a broken validation set fails
        here, not after an epoch. The results are discarded; checkpoints and early stopping skip it."""
        eng = self._engine
        if self.num_sanity_val_steps == 0 or not eng.has_val:
            return
        total = _limit(self.limit_val_batches, len(eng.val_loader), "limit_val_batches")
        steps = total if self.num_sanity_val_steps == -1 else min(self.num_sanity_val_steps, total)
        self.sanity_checking = True
        try:
            self._call("on_sanity_check_start")
            self._run_validation(steps)
            self._call("on_validation_epoch_end")
            self._call("on_validation_end")
            self._call("on_sanity_check_end")
        finally:
            self.sanity_checking = False

    def _run_validation(self, max_batches=None):
        """The validation hooks around one pass of the engine over (at most max_batches) validation batches."""
        self._call("on_validation_start")
        self._call("on_validation_epoch_start")
        limit = self.limit_val_batches
        if max_batches is not None:  # the engine reads the trainer's limit
            self.limit_val_batches = max_batches
        try:
            res = self._engine.validate(self)
        finally:
            self.limit_val_batches = limit
        return res

    def _data_epoch(self, epoch):
        """The data epoch a training epoch reads: itself, or epoch 0's batches again with overfit_batches."""
        return 0 if self.overfit_batches else epoch

    def _mid_epoch_every(self):
        """Training batches between validations inside an epoch (val_check_interval), or None."""
        v, nb = self.val_check_interval, self.num_training_batches
        if isinstance(v, numbers.Integral):
            if v > nb:
                raise ConfigError("val_check_interval=%d: more than the %d training batches of an epoch" % (v, nb))
            return v if v < nb else None
        return max(1, int(nb * v)) if v < 1.0 else None

    def _time_up(self):
        return self.max_time is not None and _clock() - self._train_start >= self.max_time.total_seconds()

    def _replan(self, epochs_run):
        """A time budget's estimate of the fit's length after ``epochs_run`` epochs of this fit (Ultralytics:
        ceil(budget / mean epoch time), at most an explicit max_epochs); it sets the schedule's length."""
        mean = (_clock() - self._train_start) / max(epochs_run, 1)
        planned = max(1, math.ceil(self.max_time.total_seconds() / mean)) if mean > 0 else self.max_epochs_effective
        if self.max_epochs is not None:
            planned = min(planned, self.max_epochs)
        if planned != self.max_epochs_effective:
            log.info("time budget: %d epochs planned (%.3g s per epoch)", planned, mean)
        self._planned_epochs = planned
        # the learning-rate schedule reads the optimizer config's epochs, close_mosaic the data's
        self._engine.cfg.epochs = planned
        self.datamodule.epochs = planned

    def _fit_loop(self):
        eng, st = self._engine, self._state
        every = self._mid_epoch_every()
        first_epoch = st.epoch
        while st.epoch < self.max_epochs_effective and not self.should_stop:
            epoch = st.epoch
            self.datamodule.set_epoch(self._data_epoch(epoch))
            self.validated_this_epoch = False
            self._call("on_train_epoch_start")
            t0 = time.perf_counter()
            epoch_items = []
            first_row = len(self.loss_history)
            pending = None  # the previous batch's losses: read once the next batch is queued
            validates = eng.has_val and (epoch + 1) % self.check_val_every_n_epoch == 0
            since_val = 0  # training batches since the last validation of this epoch

            def settle(p):
                losses, batch_index, step = p
                row = losses.array()
                if not np.isfinite(row).all():
                    self._diverged(epoch, batch_index, step, {n: float(v) for n, v in zip(LOSS_NAMES, row)})
                self.loss_history.append(row)
                epoch_items.append(row[ITEM])
                self.callback_metrics.update({"train/box_loss": float(row[7]), "train/cls_loss": float(row[8]),
                                              "train/l1_loss": float(row[9])})
                self._logging.log_step(self, row, len(self.loss_history))
            res = None
            for i, batch in enumerate(eng.train_loader):
                if i >= self.num_training_batches:
                    break
                self._call("on_train_batch_start", batch, i)
                steps_before = st.global_step
                current = _PendingLosses(eng.train_step(batch, epoch, i))
                if pending is not None:
                    settle(pending)
                pending = (current, i, steps_before)
                self._last_batch = (epoch, i, st.global_step)
                since_val += 1
                self._call("on_train_batch_end", {"loss": LossValue(current, 0)}, batch, i)
                if 0 < self.max_steps <= st.global_step or (st.global_step > steps_before and self._time_up()):
                    self.should_stop = True
                if not self.should_stop and validates and every and (i + 1) % every == 0 \
                        and i + 1 < self.num_training_batches:
                    self.validating_mid_epoch = True
                    try:
                        res = self._validation_loop()
                    finally:
                        self.validating_mid_epoch = False
                    since_val = 0
                if self.should_stop:
                    break
            if pending is not None:
                settle(pending)
            agreed = eng.end_epoch(self.loss_history[first_row:])
            if agreed is not None:  # several ranks: the rows of the global batches, the same on every rank
                self.loss_history[first_row:] = agreed
                epoch_items = [row[ITEM] for row in agreed]
            st.epoch += 1
            self.current_epoch_completed = st.epoch
            if self.max_time is not None:
                self._replan(st.epoch - first_epoch)
                if self._time_up():
                    self.should_stop = True
            mean = np.mean(epoch_items, axis=0) if epoch_items else np.zeros(3)
            row = {"epoch": epoch, "step": st.global_step, "train/box_loss": mean[0], "train/cls_loss": mean[1],
                   "train/l1_loss": mean[2]}
            row.update({"lr/%s" % n: lr for n, lr, _, _ in self.group_schedule()})
            self.log_dict({k: v for k, v in row.items() if k not in ("epoch", "step")})
            if validates and since_val:
                self._validation_loop(row)
            elif res is not None:  # stopped right after a validation inside the epoch: that one counts
                row.update(res["logged"])
            row["time"] = time.perf_counter() - t0
            self._epoch_rows.append(row)
            self._write_metrics()
            self._call("on_train_epoch_end")
            self.should_stop = self._dist.any(self.should_stop)  # a stop on any rank stops every rank

    def _diverged(self, epoch, batch_index, step, losses=None, tensors=()):
        """Stops the fit when it diverges: at the first non-finite loss (read one batch behind, so with no
        extra device synchronisation), or, for the last step of an epoch (whose update no later loss has
        seen), when the checkpoint about to be written holds non-finite tensors. Ultralytics reloads
        last.pt and retries the epoch; ptl stops instead, since the same data, weights and settings would
        diverge again: nothing is saved from the broken weights, the files already written stay."""
        if losses is not None:
            what = "the loss is not finite (%s)" % ", ".join(
                "%s=%s" % (n, v) for n, v in losses.items() if not np.isfinite(v))
        else:
            what = "the weights are not finite after its optimizer step (%s%s)" % (
                ", ".join(tensors[:3]), ", ..." if len(tensors) > 3 else "")
        saver = next((c for c in self.callbacks if isinstance(c, cb.ModelCheckpoint)), None)
        if saver:
            saver.wait_for_writes(raise_error=False)  # its files are on disk before they are listed
        kept = [saver.last_model_path, saver.best_model_path] if saver else []
        kept = sorted({p for p in kept + [self._resumed_from] if p and os.path.isfile(p)})
        raise DivergenceError(
            "training diverged at epoch %d, batch %d (after %d optimizer steps): %s; nothing was saved from "
            "these weights. %s; lower lr0, check the data, or use a precision with more range" % (
                epoch, batch_index, step, what, "Checkpoints kept: %s" % ", ".join(kept) if kept else
                "No checkpoint had been written"), epoch, batch_index, step, losses, tensors)

    def _validation_loop(self, row=None):
        self.num_val_batches = _limit(self.limit_val_batches, len(self._engine.val_loader), "limit_val_batches")
        res = self._run_validation()
        if not self.validating_mid_epoch:
            self.validated_this_epoch = True
        self.ap_per_class = res["ap_per_class"]
        self.val_history.append(res)
        self.log_dict(res["logged"])
        if row is not None:
            row.update(res["logged"])
        self._call("on_validation_epoch_end")
        self._call("on_validation_end")
        return res

    # ---------------------------------------------------------------------------- validate etc.
    def validate(self, model, datamodule):
        """Validates ``model``'s current weights; returns ``[metrics dict]`` like Lightning. Writes no file
        (but ``predictions.json`` with ``coco_eval``): checkpoint and early-stopping callbacks act only while
        fitting, as in Lightning."""
        self._join_job()
        self._check_precision(self.device)
        self.model, self.datamodule = model, datamodule
        self.state.fn = "validate"
        self._engine = None

        def run():
            self._call("setup", "validate")
            self._engine = Engine(self, model, datamodule, for_fit=False)
            return self._validation_loop()
        try:
            return [dict(self._guarded("validate", model, run)["logged"])]
        except BaseException as exc:
            self._dist.close(exc)
            raise

    def predict(self, model, source, conf=0.25, max_det=300, imgsz=640, batch_size=16, save=False, save_txt=False,
                save_conf=False, name="predict", iou=None, end2end=False):
        """Detections as :meth:`ptl.Detector.predict` gives them (8.4.190's predictor: the one-to-many head
        with NMS at ``iou``; ``end2end=True``: the one-to-one top-k; eval mode) for ``source``: image files,
        folders, globs, ``.txt`` lists, (H, W, 3) arrays (letterboxed to ``imgsz``, boxes in each image's
        pixels; a file that cannot be read gives ``None`` after a DataWarning) or a network-ready batch (boxes
        in its pixels). One :class:`ptl.predict.Results` per image (``res["boxes"]`` (k, 4) xyxy, ``"scores"``, ``"classes"``,
        score descending; ``path``, ``orig_shape``). ``save`` / ``save_txt`` write annotated images / YOLO
        label files to ``<default_root_dir>/runs/<name>/version_N`` (:mod:`ptl.predict`)."""
        from .predict import predict
        return predict(model, source, conf=conf, max_det=max_det, imgsz=imgsz, batch_size=batch_size, save=save,
                       save_txt=save_txt, save_conf=save_conf, project=self.default_root_dir, name=name, iou=iou,
                       end2end=end2end)

    # -------------------------------------------------------------------------------- logs
    def _configure_run_dir(self):
        """Rank 0 makes the run folder (its first logger's log_dir; none with fast_dev_run) and writes through
        the loggers; the other ranks are told its path and write nothing."""
        if self.fast_dev_run:  # writes nothing, not even the folder
            self.loggers = []
            self.log_dir = self.default_root_dir
            return
        path = self._logging.setup(self.is_global_zero)
        self.loggers = self._logging.loggers
        self.log_dir = self._dist.group.broadcast_object(path) if self._dist.group is not None else path

    def hparams(self):
        """The fit's settings, nested by part (trainer, model, data): what hparams.yaml and checkpoints hold."""
        h = {"trainer": {k: getattr(self, k) for k in (
            "max_epochs", "max_steps", "precision", "accumulate_grad_batches", "gradient_clip_val",
            "limit_train_batches", "limit_val_batches", "overfit_batches", "val_check_interval",
            "check_val_every_n_epoch", "num_sanity_val_steps", "fast_dev_run", "deterministic", "accelerator",
            "devices", "num_nodes", "strategy", "timeout", "seed", "patience", "freeze", "name",
            "capture_network", "end2end", "float32_matmul_precision", "all_reduce_in_graph", "benchmark")}}
        h["trainer"]["max_time"] = None if self.max_time is None else format_max_time(self.max_time)
        if self._engine is not None:
            h["model"] = self._engine.model_hparams()
            h["data"] = self._engine.data_hparams()
        return h

    def _write_hparams(self):
        self._logging.log_hyperparams(self.hparams())

    def _write_args(self, ckpt_path):
        if self.logger and self.is_global_zero:
            from .arguments import resolved_args
            runlog.write_args(self.log_dir, resolved_args(self, self.model, self.datamodule, ckpt_path,
                                                          self.capture_network))

    def _write_metrics(self):
        self._logging.log_epoch(self, self._epoch_rows, len(self.loss_history), self.log_dir)

    # ----------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path):
        """Writes the full training state to ``path`` (atomically: a crash leaves any previous file). Rank 0
        alone writes (the state is the same on every rank)."""
        if self.is_global_zero:
            self._checkpoint_snapshot(path)()

    def _checkpoint_tensors(self):
        """A copy of the training state's tensors now, for _checkpoint_snapshot and _weights_snapshot."""
        return self._engine.state_tensors()

    def _checkpoint_snapshot(self, path, tensors=None):
        """save_checkpoint's state taken now (copies; or ``tensors``, _checkpoint_tensors() of this moment);
        returns the job that writes it."""
        return _checkpoint.snapshot(self, path, tensors)

    def save_weights(self, path):
        """Writes the fit's EMA weights (what validation measured) as a weights-only ``.safetensors`` that
        ``Detector.load`` reads (atomically)."""
        if self.is_global_zero:
            self._weights_snapshot(path)()

    def _weights_snapshot(self, path, tensors=None):
        """save_weights' state taken now (copies; or read from ``tensors``, _checkpoint_tensors() of this
        moment); returns the job that writes it."""
        from .weights import write_weights
        model, eng = self.model, self._engine
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        weights = eng.ema_state_dict() if tensors is None else eng.ema_state_from(tensors)
        return functools.partial(write_weights, path, weights, model.model_name, model.num_classes, model.names)

    # ----------------------------------------------------------------------------------- digests
    def digest(self):
        """SHA256 per part of the run: losses, model, optimizer, schedule, ema, metrics."""
        eng = self._engine
        if eng is None:
            raise RuntimeError("digest: nothing was fitted yet")
        parts = eng.digest_parts()
        h = hashlib.sha256(np.asarray(self.loss_history, np.float32).tobytes())
        parts["losses"] = h.hexdigest()
        m = hashlib.sha256()
        for r in self.val_history:
            for k in sorted(r["logged"]):
                m.update(k.encode() + np.float64(r["logged"][k]).tobytes())
        parts["metrics"] = m.hexdigest()
        return parts

