"""Callbacks with Lightning's hook names and call order, and the built-in ones.

Order during ``Trainer.fit`` (as in Lightning 2.x with validation at the end of each epoch)::

    setup(stage="fit") -> on_fit_start -> on_train_start
      per epoch: on_train_epoch_start
        per batch: on_train_batch_start -> on_train_batch_end
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
import math
import os
import sys
import time

from . import io
from .errors import ConfigError
from .hparams_check import check_bool, check_float, check_int

HOOKS = (
    "setup", "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start",
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

    ``monitor`` names a metric of ``trainer.callback_metrics`` (None: keep the latest only),
    ``mode`` "min"/"max", ``save_top_k`` how many best to keep (-1 all, 0 none), ``save_last`` also
    writes ``last.ckpt``. ``filename`` is a template such as ``"{epoch}-{step}-{metrics/mAP50-95:.4f}"``
    (metric names may contain "/" and "-"; the ``.ckpt`` suffix is added). ``save_weights``: beside the
    full training checkpoints, ``<run>/weights/best.safetensors`` (whenever the best checkpoint changes)
    and ``last.safetensors`` (with ``save_last``) hold the EMA weights alone, for ``Detector.load``.

    Only files this fit wrote are ever removed or overwritten: a checkpoint of an earlier run (in a
    shared folder, or the top-k list a resumed fit inherits) keeps its file, and a name that an earlier
    run's file already has gets a ``-v1``, ``-v2``, ... suffix, as in Lightning. At the start of a fit
    the temporary files of killed checkpoint writes in the folder are removed.
    """

    def __init__(self, dirpath=None, filename=None, monitor=None, mode="min", save_top_k=1, save_last=None,
                 every_n_epochs=1, monitor_optional=False, save_weights=True):
        if dirpath is not None:
            try:
                dirpath = os.fspath(dirpath)
            except TypeError:
                raise ConfigError("dirpath: expected a folder path or None, got %r" % (dirpath,)) from None
            if os.path.exists(dirpath) and not os.path.isdir(dirpath):
                raise ConfigError("dirpath: %s exists and is not a folder" % dirpath)
        if filename is not None and (not isinstance(filename, str) or not filename):
            raise ConfigError("filename: expected a file name template or None, got %r" % (filename,))
        self.dirpath = dirpath
        self.filename = filename or "epoch={epoch}-step={step}"
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
        self.every_n_epochs = check_int("every_n_epochs", every_n_epochs, 1)
        # the trainer's default checkpointer skips top-k when nothing validates
        self.monitor_optional = check_bool("monitor_optional", monitor_optional)
        self.save_weights = check_bool("save_weights", save_weights)
        self.best_k_models = {}  # path -> score
        self.best_model_path = ""
        self.best_model_score = None
        self.last_model_path = ""
        self._written = set()  # the files this fit wrote: the only ones it may remove or overwrite

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
            out.append(format(v, spec))
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
        """``path``, or with a -vN suffix when an earlier run's file has that name."""
        stem, ext = os.path.splitext(path)
        candidate, version = path, 0
        while candidate not in self._written and os.path.lexists(candidate):
            version += 1
            candidate = "%s-v%d%s" % (stem, version, ext)
        return candidate

    def _write(self, trainer, path):
        path = self._unused_path(path)
        trainer.save_checkpoint(path)
        self._written.add(path)
        return path

    def _drop(self, path):
        """Forgets a top-k entry; its file is removed only when this fit wrote it."""
        del self.best_k_models[path]
        if path in self._written:
            _remove(path)
            self._written.discard(path)

    def _save(self, trainer, pl_module):
        if trainer.current_epoch_completed % self.every_n_epochs or not _global_zero(trainer):
            return
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
            trainer.save_weights(os.path.join(trainer.log_dir, "weights", which + ".safetensors"))

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

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._save(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module):
        if not trainer.validated_this_epoch:
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
    validations."""

    def __init__(self, monitor, patience=3, mode="min", min_delta=0.0, check_finite=True):
        self.monitor = _check_metric_name("monitor", monitor)
        self.patience = check_int("patience", patience, 0)
        self.mode = _check_mode(mode)
        self.min_delta = abs(check_float("min_delta", min_delta))
        self.check_finite = check_bool("check_finite", check_finite)
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

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            raise KeyError("EarlyStopping(monitor=%r): metric not found; logged metrics: %s"
                           % (self.monitor, ", ".join(sorted(metrics))))
        value = float(metrics[self.monitor])
        if self.check_finite and not math.isfinite(value):
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            return
        # an improvement must beat the best by more than min_delta
        shifted = value + self.min_delta if self.mode == "min" else value - self.min_delta
        if self.best_score is None or _better(self.mode, shifted, self.best_score):
            self.best_score = value
            self.wait_count = 0
        else:
            self.wait_count += 1
            if self.wait_count >= self.patience:
                trainer.should_stop = True
                self.stopped_epoch = trainer.current_epoch


class LearningRateMonitor(Callback):
    """Logs each parameter group's learning rate (``lr-<group>``) and momentum (``momentum-<group>``)
    every ``logging_interval`` ("step" or "epoch")."""

    def __init__(self, logging_interval="epoch", log_momentum=True):
        if logging_interval not in ("step", "epoch"):
            raise ConfigError("logging_interval: expected 'step' or 'epoch', got %r" % (logging_interval,))
        self.logging_interval = logging_interval
        self.log_momentum = check_bool("log_momentum", log_momentum)
        self.history = []

    def _log(self, trainer):
        values = {}
        for name, lr, momentum in trainer.group_schedule():
            values["lr-%s" % name] = lr
            if self.log_momentum:
                values["momentum-%s" % name] = momentum
        self.history.append((trainer.global_step, values))
        trainer.log_dict(values)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.logging_interval == "step":
            self._log(trainer)

    def on_train_epoch_start(self, trainer, pl_module):
        if self.logging_interval == "epoch":
            self._log(trainer)


class ProgressBar(Callback):
    """A live bar on a TTY (it/s, ETA, losses) and plain periodic lines otherwise."""

    def __init__(self, refresh_rate=1, stream=None, lines_per_epoch=4):
        self.refresh_rate = check_int("refresh_rate", refresh_rate, 1)
        if stream is not None and not callable(getattr(stream, "write", None)):
            raise ConfigError("stream: expected a text stream (with write) or None, got %r" % (stream,))
        self.stream = stream
        self.lines_per_epoch = check_int("lines_per_epoch", lines_per_epoch, 1)
        self._t0 = None

    @property
    def _out(self):
        return self.stream if self.stream is not None else sys.stderr

    def _tty(self):
        isatty = getattr(self._out, "isatty", None)
        return bool(isatty and isatty())

    def on_train_epoch_start(self, trainer, pl_module):
        self._t0 = time.perf_counter()

    def _line(self, trainer, batch_idx, total):
        done = batch_idx + 1
        elapsed = time.perf_counter() - self._t0
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 and total else 0.0
        losses = " ".join("%s=%.4g" % (k.split("/")[-1], v) for k, v in trainer.progress_metrics().items())
        return "epoch %d/%d %d/%s %.2fit/s eta %.0fs %s" % (
            trainer.current_epoch + 1, trainer.max_epochs_effective, done, total or "?", rate, eta, losses)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not _global_zero(trainer):
            return
        total = trainer.num_training_batches
        last = total and batch_idx + 1 == total
        if self._tty():
            if (batch_idx + 1) % self.refresh_rate == 0 or last:
                bar_w = 20
                frac = (batch_idx + 1) / total if total else 0
                bar = "#" * int(bar_w * frac) + "-" * (bar_w - int(bar_w * frac))
                self._out.write("\r[%s] %s" % (bar, self._line(trainer, batch_idx, total)))
                if last:
                    self._out.write("\n")
                self._out.flush()
        else:
            every = max(1, (total or 1) // max(1, self.lines_per_epoch))
            if (batch_idx + 1) % every == 0 or last:
                self._out.write(self._line(trainer, batch_idx, total) + "\n")
                self._out.flush()

    def on_validation_end(self, trainer, pl_module):
        if not _global_zero(trainer):
            return
        shown = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("metrics/") or k.startswith("val/")}
        if shown:
            self._out.write("validation: " + " ".join("%s=%.4g" % (k, v) for k, v in sorted(shown.items())) + "\n")
            self._out.flush()


class CloseMosaic(Callback):
    """Turns mosaic off for the last ``epochs`` epochs (spec §7.10), exactly from that epoch on."""

    def __init__(self, epochs=10):
        self.epochs = check_int("epochs", epochs, 0)

    def setup(self, trainer, pl_module, stage):
        if trainer.datamodule is not None:
            trainer.datamodule.close_mosaic = self.epochs
