"""Callbacks with Lightning's hook names and call order, and the built-in ones.

Order during ``Trainer.fit`` (as in Lightning 2.x with validation at the end of each epoch)::

    setup(stage="fit") -> on_fit_start
      [sanity check: num_sanity_val_steps batches, trainer.sanity_checking is True]
        on_sanity_check_start -> on_validation_start -> ... -> on_validation_end -> on_sanity_check_end
    -> on_train_start
      per epoch: on_train_epoch_start
        per batch: on_train_batch_start -> on_train_batch_end
          [every val_check_interval batches: the validation hooks below, trainer.validating_mid_epoch True]
        [validation] on_validation_start -> on_validation_epoch_start
                     -> (on_validation_batch_start -> on_validation_batch_end)*
                     -> on_validation_epoch_end -> on_validation_end
        on_train_epoch_end
    on_train_end -> on_fit_end -> teardown(stage="fit")

``on_save_checkpoint`` runs while a checkpoint is assembled, ``on_load_checkpoint`` when one is
restored, ``on_exception`` when anything raises inside ``fit`` (the exception is re-raised after it).
A callback's ``state_dict()`` is saved in checkpoints under its ``state_key``.

The built-in callbacks check their arguments when they are made (ConfigError naming the argument).

With several ranks (:mod:`ptl.distributed`) every rank runs every hook; ``trainer.global_rank``,
``local_rank``, ``world_size`` and ``is_global_zero`` say which rank this is. The built-in callbacks write
files and print on rank 0 only; a callback that stops the fit must decide alike on every rank.
"""
import logging
import math
import os
import sys
import time
import warnings

from . import io
from .errors import ConfigError
from .file_writer import BackgroundWriter
from .hparams_check import check_bool, check_float, check_int

log = logging.getLogger(__name__)

HOOKS = (
    "setup", "on_fit_start", "on_sanity_check_start", "on_sanity_check_end", "on_train_start",
    "on_train_epoch_start", "on_train_batch_start",
    "on_train_batch_end", "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start",
    "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_train_epoch_end",
    "on_save_checkpoint", "on_load_checkpoint", "on_exception", "on_train_end", "on_fit_end", "teardown",
)


class Callback:
    """Base class: override any hook; every hook receives ``(trainer, pl_module, ...)``."""

    @property
    def state_key(self):
        return type(self).__qualname__

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def setup(self, trainer, pl_module, stage): pass
    def teardown(self, trainer, pl_module, stage): pass
    def on_fit_start(self, trainer, pl_module): pass
    def on_fit_end(self, trainer, pl_module): pass
    def on_sanity_check_start(self, trainer, pl_module): pass
    def on_sanity_check_end(self, trainer, pl_module): pass
    def on_train_start(self, trainer, pl_module): pass
    def on_train_end(self, trainer, pl_module): pass
    def on_train_epoch_start(self, trainer, pl_module): pass
    def on_train_epoch_end(self, trainer, pl_module): pass
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx): pass
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx): pass
    def on_validation_start(self, trainer, pl_module): pass
    def on_validation_end(self, trainer, pl_module): pass
    def on_validation_epoch_start(self, trainer, pl_module): pass
    def on_validation_epoch_end(self, trainer, pl_module): pass
    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx): pass
    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx): pass
    def on_save_checkpoint(self, trainer, pl_module, checkpoint): pass
    def on_load_checkpoint(self, trainer, pl_module, checkpoint): pass
    def on_exception(self, trainer, pl_module, exception): pass


def _better(mode, value, best):
    if best is None:
        return True
    return value < best if mode == "min" else value > best


def _check_mode(mode):
    if mode not in ("min", "max"):
        raise ConfigError("mode: expected 'min' or 'max', got %r" % (mode,))
    return mode


def _check_metric_name(name, value, none_ok=False):
    if value is None and none_ok:
        return value
    if not isinstance(value, str) or not value:
        raise ConfigError("%s: expected a metric name such as 'metrics/mAP50-95'%s, got %r"
                          % (name, " or None" if none_ok else "", value))
    return value


def _template_fields(template):
    """[(name, format spec)] of the ``{...}`` fields of a file name template."""
    fields, i = [], 0
    while True:
        j = template.find("{", i)
        if j < 0:
            if "}" in template[i:]:
                raise ConfigError("filename: unbalanced '}' in %r" % template)
            return fields
        if "}" in template[i:j]:
            raise ConfigError("filename: unbalanced '}' in %r" % template)
        k = template.find("}", j)
        if k < 0:
            raise ConfigError("filename: unbalanced '{' in %r" % template)
        name, _, spec = template[j + 1:k].partition(":")
        if not name or "{" in name:
            raise ConfigError("filename: empty or nested field in %r" % template)
        fields.append((name, spec))
        i = k + 1


class ModelCheckpoint(Callback):
    """Saves checkpoints after each validation (or training epoch when there is none).

    Lightning 2.6's arguments, in its order and with its defaults: ``monitor`` names a metric of
    ``trainer.callback_metrics`` (None: keep the latest only), ``mode`` "min"/"max", ``save_top_k`` how many
    best to keep (-1 all, 0 none), ``save_last`` also writes ``last.ckpt``, ``verbose`` logs each save.
    ``filename`` is a template such as ``"{epoch}-{step}-{metrics/mAP50-95:.4f}"`` (metric names may contain
    "/" and "-", written as "_"; the ``.ckpt`` suffix is added; default ``"{epoch}-{step}"``); with
    ``auto_insert_metric_name`` each field is written ``name=value`` (``epoch=3-step=120.ckpt``).
    ``every_n_epochs`` (None: 1) saves every n-th epoch; ``save_on_train_epoch_end=True`` saves at the end of
    the training epoch even when it validated (None: after validation, or at the epoch end without one);
    ``enable_version_counter=False`` overwrites a file of that name instead of adding ``-v1``.

    ptl writes a checkpoint only at an epoch's end, where resuming from it is exact: ``save_on_exception``,
    ``every_n_train_steps`` and ``train_time_interval`` (mid-epoch checkpoints) take only their defaults,
    and validations inside an epoch (``val_check_interval``) write none. ``save_weights_only=True`` is
    refused as well: the weights-only files are ptl's ``save_weights`` (keyword only, like
    ``monitor_optional``): beside the full training checkpoints, ``<run>/weights/best.safetensors``
    (whenever the best checkpoint changes) and ``last.safetensors`` (with ``save_last``) hold the EMA
    weights alone, for ``Detector.load``. Nothing is written during ``fast_dev_run``.

    The files are written by a background thread while training goes on (``write_in_background``, keyword
    only; False writes before the hook returns): the state is copied at the epoch's end, the previous epoch's
    writes are waited for first (so at most one epoch's files are in flight), and every write is done before
    ``fit`` returns. A failed write fails the fit at the next save or at its end, and the files it would have
    replaced stay as they were.

    Only files this fit wrote are ever removed or overwritten (unless ``enable_version_counter=False``): a
    checkpoint of an earlier run (in a shared folder, or the top-k list a resumed fit inherits) keeps its
    file, and a name that an earlier run's file already has gets a ``-v1``, ``-v2``, ... suffix, as in
    Lightning. At the start of a fit the temporary files of killed checkpoint writes in the folder are
    removed.
    """

    def __init__(self, dirpath=None, filename=None, monitor=None, verbose=False, save_last=None, save_top_k=1,
                 save_on_exception=False, save_weights_only=False, mode="min", auto_insert_metric_name=True,
                 every_n_train_steps=None, train_time_interval=None, every_n_epochs=None,
                 save_on_train_epoch_end=None, enable_version_counter=True, *, monitor_optional=False,
                 save_weights=True, write_in_background=True):
        if dirpath is not None:
            try:
                dirpath = os.fspath(dirpath)
            except TypeError:
                raise ConfigError("dirpath: expected a folder path or None, got %r" % (dirpath,)) from None
            if os.path.exists(dirpath) and not os.path.isdir(dirpath):
                raise ConfigError("dirpath: %s exists and is not a folder" % dirpath)
        if filename is not None and (not isinstance(filename, str) or not filename):
            raise ConfigError("filename: expected a file name template or None, got %r" % (filename,))
        epoch_end_only = "ptl checkpoints at epoch ends, where resuming is exact (use every_n_epochs)"
        for name, value, allowed, why in (
                ("save_on_exception", save_on_exception, (False,), "a checkpoint mid-epoch would not resume exactly"),
                ("save_weights_only", save_weights_only, (False,),
                 "ptl writes the weights alone as weights/*.safetensors beside each checkpoint (save_weights)"),
                ("every_n_train_steps", every_n_train_steps, (None, 0), epoch_end_only),
                ("train_time_interval", train_time_interval, (None,), epoch_end_only)):
            if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
                raise ConfigError("%s: only %s supported (%s), got %r" % (
                    name, " or ".join(map(repr, allowed)), why, value))
        self.dirpath = dirpath
        self.verbose = check_bool("verbose", verbose)
        self.auto_insert_metric_name = check_bool("auto_insert_metric_name", auto_insert_metric_name)
        self.filename = filename or "{epoch}-{step}"
        fields = _template_fields(self.filename)
        literal = self.filename
        for name, spec in fields:
            literal = literal.replace("{%s%s%s}" % (name, ":" if spec else "", spec), "")
        if "/" in literal or os.sep in literal:
            raise ConfigError("filename: expected a file name without folders (use dirpath), got %r" % (filename,))
        for name, spec in fields:
            try:
                format(0 if name in ("epoch", "step") else 0.0, spec)
            except (ValueError, TypeError):
                raise ConfigError("filename: bad format spec %r for {%s} in %r" % (spec, name, self.filename)) \
                    from None
        self.monitor = _check_metric_name("monitor", monitor, none_ok=True)
        self.mode = _check_mode(mode)
        self.save_top_k = check_int("save_top_k", save_top_k, -1)
        if save_last is not None:
            check_bool("save_last", save_last)
        self.save_last = save_last
        self.every_n_epochs = check_int("every_n_epochs", 1 if every_n_epochs is None else every_n_epochs, 1)
        if save_on_train_epoch_end is not None:
            check_bool("save_on_train_epoch_end", save_on_train_epoch_end)
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.enable_version_counter = check_bool("enable_version_counter", enable_version_counter)
        # the trainer's default checkpointer skips top-k when nothing validates
        self.monitor_optional = check_bool("monitor_optional", monitor_optional)
        self.save_weights = check_bool("save_weights", save_weights)
        self.write_in_background = check_bool("write_in_background", write_in_background)
        self._writer = BackgroundWriter("ptl-checkpoint-writer")
        self.best_k_models = {}  # path -> score
        self.best_model_path = ""
        self.best_model_score = None
        self.last_model_path = ""
        self._written = set()  # the files this fit wrote: the only ones it may remove or overwrite
        self._copy = None  # the training state of the save in progress (_state)

    def state_dict(self):
        return {"monitor": self.monitor, "best_model_score": self.best_model_score,
                "best_model_path": self.best_model_path, "best_k_models": dict(self.best_k_models),
                "last_model_path": self.last_model_path}

    def load_state_dict(self, state):
        best_k = state.get("best_k_models", {})
        if not isinstance(best_k, dict) or not all(isinstance(k, str) for k in best_k):
            raise ConfigError("ModelCheckpoint state: best_k_models must map file paths to scores, got %r"
                              % (best_k,))
        self.best_model_score = state.get("best_model_score")
        self.best_model_path = state.get("best_model_path", "")
        self.best_k_models = dict(best_k)
        self.last_model_path = state.get("last_model_path", "")

    def format_name(self, metrics, epoch, step):
        values = {"epoch": epoch, "step": step}
        template = self.filename
        # metric names with '/' or '-' inside {...} are looked up as they are
        out, i = [], 0
        while i < len(template):
            j = template.find("{", i)
            if j < 0:
                out.append(template[i:])
                break
            k = template.find("}", j)
            out.append(template[i:j])
            name, _, spec = template[j + 1:k].partition(":")
            if name in values:
                v = values[name]
            elif name in metrics:
                v = float(metrics[name])
            else:
                raise KeyError("filename: %r is neither epoch, step nor a logged metric (have: %s)"
                               % (name, ", ".join(sorted(metrics))))
            out.append(("%s=" % name if self.auto_insert_metric_name else "") + format(v, spec))
            i = k + 1
        return "".join(out).replace("/", "_") + ".ckpt"

    def _folder(self, trainer):
        return self.dirpath or os.path.join(trainer.log_dir, "checkpoints")

    def _dir(self, trainer):
        d = self._folder(trainer)
        os.makedirs(d, exist_ok=True)
        return d

    def setup(self, trainer, pl_module, stage):
        if stage != "fit":
            return
        self._written = set()
        if _global_zero(trainer) and (trainer.log_dir is not None or self.dirpath is not None):
            io.remove_stale_temporaries(self._folder(trainer))

    def _unused_path(self, path):
        """``path``, or with a -vN suffix when an earlier run's file has that name (enable_version_counter)."""
        stem, ext = os.path.splitext(path)
        candidate, version = path, 0
        while self.enable_version_counter and candidate not in self._written and os.path.lexists(candidate):
            version += 1
            candidate = "%s-v%d%s" % (stem, version, ext)
        return candidate

    def _submit(self, job, *args):
        if self.write_in_background:
            self._writer.submit(job, *args)
        else:
            job(*args)

    def wait_for_writes(self, raise_error=True):
        """Blocks until the files submitted so far are written; raises a failed write's exception (or, with
        ``raise_error=False``, logs it)."""
        try:
            self._writer.wait()
        except Exception as e:
            if raise_error:
                raise
            log.error("a checkpoint write failed: %s", e)

    def _state(self, trainer):
        """One copy of the training state per save, shared by the checkpoints and weights files it writes."""
        if self._copy is None:
            self._copy = trainer._checkpoint_tensors()
        return self._copy

    def _write(self, trainer, path):
        path = self._unused_path(path)
        self._submit(trainer._checkpoint_snapshot(path, self._state(trainer)))
        self._written.add(path)
        if self.verbose:
            shown = "" if self.monitor is None or self.monitor not in trainer.callback_metrics else \
                " (%s=%.5g)" % (self.monitor, float(trainer.callback_metrics[self.monitor]))
            log.info("epoch %d, step %d: checkpoint %s%s", trainer.current_epoch_completed - 1, trainer.global_step,
                     path, shown)
        return path

    def _drop(self, path):
        """Forgets a top-k entry; its file is removed only when this fit wrote it."""
        del self.best_k_models[path]
        if path in self._written:
            self._submit(_remove, path)  # after the writes submitted before it
            self._written.discard(path)

    def _save(self, trainer, pl_module):
        if trainer.current_epoch_completed % self.every_n_epochs or not _global_zero(trainer):
            return
        self.wait_for_writes()  # the previous epoch's files first: one epoch's copies in memory at most
        try:
            self._save_files(trainer)
        finally:
            self._copy = None  # the jobs hold what they write

    def _save_files(self, trainer):
        metrics = trainer.callback_metrics
        d = self._dir(trainer)
        epoch, step = trainer.current_epoch_completed - 1, trainer.global_step
        if self.save_top_k != 0:
            if self.monitor is None:
                path = self._write(trainer, os.path.join(d, self.format_name(metrics, epoch, step)))
                for old in list(self.best_k_models):
                    if old != path and self.save_top_k != -1:
                        self._drop(old)
                self.best_k_models[path] = None
                self.best_model_path = path
                self._save_weights(trainer, "best")
            elif self.monitor not in metrics and self.monitor_optional:
                pass
            else:
                if self.monitor not in metrics:
                    raise KeyError("ModelCheckpoint(monitor=%r): metric not found; logged metrics: %s"
                                   % (self.monitor, ", ".join(sorted(metrics))))
                score = float(metrics[self.monitor])
                if not math.isnan(score):
                    self._update_top_k(trainer, d, metrics, epoch, step, score)
        if self.save_last:
            last = self.last_model_path if self.last_model_path in self._written else os.path.join(d, "last.ckpt")
            self.last_model_path = self._write(trainer, last)
            self._save_weights(trainer, "last")

    def _save_weights(self, trainer, which):
        if self.save_weights:
            path = os.path.join(trainer.log_dir, "weights", which + ".safetensors")
            self._submit(trainer._weights_snapshot(path, self._state(trainer)))

    def on_fit_end(self, trainer, pl_module):
        self.wait_for_writes()  # fit returns with its files on disk, or raises why one is not

    def teardown(self, trainer, pl_module, stage):
        if stage != "fit":
            return
        self.wait_for_writes(raise_error=False)  # a fit that failed elsewhere still finishes the writes it started

    def _update_top_k(self, trainer, d, metrics, epoch, step, score):
        full = self.save_top_k != -1 and len(self.best_k_models) >= self.save_top_k
        worst = None
        if full:
            worst = max(self.best_k_models, key=lambda p: self.best_k_models[p]) if self.mode == "min" else \
                min(self.best_k_models, key=lambda p: self.best_k_models[p])
            if not _better(self.mode, score, self.best_k_models[worst]):
                return
        path = self._write(trainer, os.path.join(d, self.format_name(metrics, epoch, step)))
        if worst is not None and worst != path:
            self._drop(worst)
        self.best_k_models[path] = score
        pick = min if self.mode == "min" else max
        self.best_model_path = pick(self.best_k_models, key=lambda p: self.best_k_models[p])
        self.best_model_score = self.best_k_models[self.best_model_path]
        if self.best_model_path == path:
            self._save_weights(trainer, "best")

    def _skip(self, trainer):
        return trainer.sanity_checking or trainer.state.fn != "fit" or trainer.fast_dev_run or \
            trainer.validating_mid_epoch

    def on_validation_end(self, trainer, pl_module):
        if not self._skip(trainer) and not self.save_on_train_epoch_end:
            self._save(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module):
        if self._skip(trainer) or self.save_on_train_epoch_end is False:
            return
        if self.save_on_train_epoch_end or not trainer.validated_this_epoch:
            self._save(trainer, pl_module)


def _global_zero(trainer):
    return getattr(trainer, "is_global_zero", True)


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class EarlyStopping(Callback):
    """Stops fitting when ``monitor`` has not improved by more than ``min_delta`` for ``patience``
    validation checks (Lightning 2.6's arguments, order and defaults).

    ``mode`` "min"/"max"; ``strict``: a missing metric raises (else a RuntimeWarning with ``verbose``, and
    the check is skipped); ``check_finite``: stop when the metric is NaN or infinite; ``stopping_threshold``:
    stop once the metric is better than it; ``divergence_threshold``: stop once it is worse than it;
    ``check_on_train_epoch_end``: check at the end of the training epoch instead of after each validation
    (None: after validation); ``verbose``: log each improvement and the stop through the ``ptl`` logger.
    ``log_rank_zero_only`` is accepted for Lightning's sake (ptl runs one process). The check is skipped in
    the sanity check and with ``fast_dev_run``. ``Trainer(patience=N)`` is Ultralytics' early stopping:
    this callback on ``fitness`` with ``mode="max"``.
    """

    def __init__(self, monitor, min_delta=0.0, patience=3, verbose=False, mode="min", strict=True,
                 check_finite=True, stopping_threshold=None, divergence_threshold=None, check_on_train_epoch_end=None,
                 log_rank_zero_only=False):
        self.monitor = _check_metric_name("monitor", monitor)
        self.min_delta = abs(check_float("min_delta", min_delta))
        self.patience = check_int("patience", patience, 0)
        self.verbose = check_bool("verbose", verbose)
        self.mode = _check_mode(mode)
        self.strict = check_bool("strict", strict)
        self.check_finite = check_bool("check_finite", check_finite)
        self.stopping_threshold = check_float("stopping_threshold", stopping_threshold, none_ok=True)
        self.divergence_threshold = check_float("divergence_threshold", divergence_threshold, none_ok=True)
        if check_on_train_epoch_end is not None:
            check_bool("check_on_train_epoch_end", check_on_train_epoch_end)
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.log_rank_zero_only = check_bool("log_rank_zero_only", log_rank_zero_only)
        self.best_score = None
        self.wait_count = 0
        self.stopped_epoch = 0

    def state_dict(self):
        return {"best_score": self.best_score, "wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch,
                "patience": self.patience}

    def load_state_dict(self, state):
        self.best_score = state.get("best_score")
        self.wait_count = state.get("wait_count", 0)
        self.stopped_epoch = state.get("stopped_epoch", 0)

    def _skip(self, trainer):
        return trainer.sanity_checking or trainer.state.fn != "fit" or trainer.fast_dev_run

    def on_validation_end(self, trainer, pl_module):
        if not self.check_on_train_epoch_end and not self._skip(trainer):
            self._check(trainer)

    def on_train_epoch_end(self, trainer, pl_module):
        if self.check_on_train_epoch_end and not self._skip(trainer):
            self._check(trainer)

    def _check(self, trainer):
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            message = "EarlyStopping(monitor=%r): metric not found; logged metrics: %s" % (
                self.monitor, ", ".join(sorted(metrics)))
            if self.strict:
                raise RuntimeError(message)
            if self.verbose:
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            return
        value = float(metrics[self.monitor])
        stop, reason = self._evaluate(value)
        if stop:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
        if reason and self.verbose:
            log.info("EarlyStopping: %s", reason)

    def _evaluate(self, value):
        """(stop?, why) for a new value of the metric; updates best_score and wait_count."""
        sign = 1.0 if self.mode == "max" else -1.0  # better means larger after multiplying by sign
        if self.check_finite and not math.isfinite(value):
            return True, "%s = %r is not finite; stopping" % (self.monitor, value)
        if self.stopping_threshold is not None and sign * value > sign * self.stopping_threshold:
            return True, "%s = %.5g reached the stopping threshold %g" % (self.monitor, value,
                                                                          self.stopping_threshold)
        if self.divergence_threshold is not None and sign * value < sign * self.divergence_threshold:
            return True, "%s = %.5g is past the divergence threshold %g" % (self.monitor, value,
                                                                            self.divergence_threshold)
        # an improvement must beat the best by more than min_delta
        if self.best_score is None or sign * (value - self.best_score) > self.min_delta:
            self.best_score, self.wait_count = value, 0
            return False, "%s improved to %.5g" % (self.monitor, value)
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return True, "%s did not improve in the last %d checks (best %.5g); stopping" % (
                self.monitor, self.wait_count, self.best_score)
        return False, None


class LearningRateMonitor(Callback):
    """Logs each parameter group's learning rate (``lr-<group>``), with ``log_momentum`` its momentum
    (``momentum-<group>``) and with ``log_weight_decay`` its weight decay (``weight_decay-<group>``), every
    ``logging_interval`` ("step" or "epoch"; None, Lightning's default, follows the schedule's own interval:
    ptl's learning rate is set per epoch after the warm-up, so None logs per epoch)."""

    def __init__(self, logging_interval=None, log_momentum=False, log_weight_decay=False):
        if logging_interval not in (None, "step", "epoch"):
            raise ConfigError("logging_interval: expected 'step', 'epoch' or None, got %r" % (logging_interval,))
        self.logging_interval = logging_interval
        self.log_momentum = check_bool("log_momentum", log_momentum)
        self.log_weight_decay = check_bool("log_weight_decay", log_weight_decay)
        self.history = []

    def _log(self, trainer):
        values = {}
        for name, lr, momentum, weight_decay in trainer.group_schedule():
            values["lr-%s" % name] = lr
            if self.log_momentum:
                values["momentum-%s" % name] = momentum
            if self.log_weight_decay:
                values["weight_decay-%s" % name] = weight_decay
        self.history.append((trainer.global_step, values))
        trainer.log_dict(values)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.logging_interval == "step" and not trainer.fast_dev_run:
            self._log(trainer)

    def on_train_epoch_start(self, trainer, pl_module):
        if self.logging_interval in (None, "epoch") and not trainer.fast_dev_run:
            self._log(trainer)


class ProgressBar(Callback):
    """Training and validation progress, then the validation table.

    On a TTY one line is redrawn in place (a bar, it/s, ETA and the training losses) on ``stream`` (default
    stderr); otherwise, as in a log file, ``lines_per_epoch`` plain lines per training epoch and per
    validation, with no control characters, through the ``ptl.callbacks`` logger (or written to ``stream``
    when one is given). Silent during the sanity check. After each validation: Ultralytics' table (:func:`ptl.report.validation_table`): the
    ``all`` row and, with ``per_class``, one row per class present."""

    def __init__(self, refresh_rate=1, stream=None, lines_per_epoch=4, per_class=True):
        self.refresh_rate = check_int("refresh_rate", refresh_rate, 1)
        if stream is not None and not callable(getattr(stream, "write", None)):
            raise ConfigError("stream: expected a text stream (with write) or None, got %r" % (stream,))
        self.stream = stream
        self.lines_per_epoch = check_int("lines_per_epoch", lines_per_epoch, 1)
        self.per_class = check_bool("per_class", per_class)
        self._t0 = None
        self._width = 0  # of the line on screen (TTY), padded over when redrawn shorter

    @property
    def _out(self):
        return self.stream if self.stream is not None else sys.stderr

    def _tty(self):
        isatty = getattr(self._out, "isatty", None)
        return bool(isatty and isatty())

    def _say(self, line):
        if self.stream is None:
            log.info(line)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    @staticmethod
    def _rate(t0, done, total):
        elapsed = time.perf_counter() - t0
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 and total else 0.0
        return "%d/%s %.2fit/s eta %.0fs" % (done, total or "?", rate, eta)

    def _show(self, text, batch_idx, total):
        """Draws progress line ``text`` for batch ``batch_idx`` of ``total``."""
        done = batch_idx + 1
        last = bool(total) and done == total
        if self._tty():
            if done % self.refresh_rate == 0 or last:
                bar_w = 20
                fill = int(bar_w * done / total) if total else 0
                line = "[%s%s] %s" % ("#" * fill, "-" * (bar_w - fill), text)
                self._out.write("\r" + line.ljust(self._width))
                self._width = len(line)
                if last:
                    self._out.write("\n")
                    self._width = 0
                self._out.flush()
        else:
            every = max(1, (total or 1) // self.lines_per_epoch)
            if done % every == 0 or last:
                self._say(text)

    def on_train_epoch_start(self, trainer, pl_module):
        self._t0 = time.perf_counter()

    def _line(self, trainer, batch_idx, total):
        """The progress line; the epoch's last one also counts the image files the train loader has left out
        (skipped at the scan or replaced after a failed decode, issue 18.2) when there are any."""
        losses = " ".join("%s=%.4g" % (k.split("/")[-1], v) for k, v in trainer.progress_metrics().items())
        line = "epoch %d/%d %s %s" % (trainer.current_epoch + 1, trainer.max_epochs_effective,
                                      self._rate(self._t0, batch_idx + 1, total), losses)
        loader = getattr(getattr(trainer, "_engine", None), "train_loader", None)
        skipped = getattr(loader, "skipped_files", 0) if total and batch_idx + 1 == total else 0
        return line + (" skipped %d image file%s" % (skipped, "" if skipped == 1 else "s") if skipped else "")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not _global_zero(trainer):
            return
        total = trainer.num_training_batches
        self._show(self._line(trainer, batch_idx, total), batch_idx, total)

    def on_validation_start(self, trainer, pl_module):
        self._tv = time.perf_counter()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if getattr(trainer, "sanity_checking", False) or not _global_zero(trainer):
            return
        total = getattr(trainer, "num_val_batches", 0)
        self._show("validation %s" % self._rate(self._tv, batch_idx + 1, total), batch_idx, total)

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or not _global_zero(trainer):
            return
        res = getattr(getattr(trainer, "_engine", None), "last_results", None)
        if res is None:
            return
        from .report import validation_table
        names = getattr(trainer.datamodule, "names", None)
        for line in validation_table(res, names, self.per_class):
            self._say(line)


class CloseMosaic(Callback):
    """Turns mosaic off for the last ``epochs`` epochs (spec §7.10), exactly from that epoch on."""

    def __init__(self, epochs=10):
        self.epochs = check_int("epochs", epochs, 0)

    def setup(self, trainer, pl_module, stage):
        if trainer.datamodule is not None:
            trainer.datamodule.close_mosaic = self.epochs
