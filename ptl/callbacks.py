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

With several ranks (:mod:`ptl.distributed`) every rank runs every hook; ``trainer.global_rank``,
``local_rank``, ``world_size`` and ``is_global_zero`` say which rank this is. The built-in callbacks write
files and print on rank 0 only; a callback that stops the fit must decide alike on every rank.
"""
import math
import os
import sys
import time

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
        raise ValueError("mode: expected 'min' or 'max', got %r" % (mode,))
    return mode


class ModelCheckpoint(Callback):
    """Saves checkpoints after each validation (or training epoch when there is none).

    ``monitor`` names a metric of ``trainer.callback_metrics`` (None: keep the latest only),
    ``mode`` "min"/"max", ``save_top_k`` how many best to keep (-1 all, 0 none), ``save_last`` also
    writes ``last.ckpt``. ``filename`` is a template such as ``"{epoch}-{step}-{metrics/mAP50-95:.4f}"``
    (metric names may contain "/" and "-"; the ``.ckpt`` suffix is added). ``save_weights``: beside the
    full training checkpoints, ``<run>/weights/best.safetensors`` (whenever the best checkpoint changes)
    and ``last.safetensors`` (with ``save_last``) hold the EMA weights alone, for ``Detector.load``.
    """

    def __init__(self, dirpath=None, filename=None, monitor=None, mode="min", save_top_k=1, save_last=None,
                 every_n_epochs=1, monitor_optional=False, save_weights=True):
        self.dirpath = None if dirpath is None else os.fspath(dirpath)
        self.filename = filename or "epoch={epoch}-step={step}"
        self.monitor = monitor
        self.mode = _check_mode(mode)
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise ValueError("save_top_k: expected an int >= -1, got %r" % (save_top_k,))
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_epochs = every_n_epochs
        self.monitor_optional = monitor_optional  # the trainer's default: skip top-k when nothing validates
        self.save_weights = save_weights
        self.best_k_models = {}  # path -> score
        self.best_model_path = ""
        self.best_model_score = None
        self.last_model_path = ""

    def state_dict(self):
        return {"monitor": self.monitor, "best_model_score": self.best_model_score,
                "best_model_path": self.best_model_path, "best_k_models": dict(self.best_k_models),
                "last_model_path": self.last_model_path}

    def load_state_dict(self, state):
        self.best_model_score = state.get("best_model_score")
        self.best_model_path = state.get("best_model_path", "")
        self.best_k_models = dict(state.get("best_k_models", {}))
        self.last_model_path = state.get("last_model_path", "")

    def format_name(self, metrics, epoch, step):
        values = {"epoch": epoch, "step": step}
        template = self.filename
        # allow metric names with '/' or '-' inside {...}: substitute them with safe keys
        out, i = [], 0
        while i < len(template):
            j = template.find("{", i)
            if j < 0:
                out.append(template[i:])
                break
            k = template.find("}", j)
            if k < 0:
                raise ValueError("filename: unbalanced '{' in %r" % template)
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

    def _dir(self, trainer):
        d = self.dirpath or os.path.join(trainer.log_dir, "checkpoints")
        os.makedirs(d, exist_ok=True)
        return d

    def _save(self, trainer, pl_module):
        if trainer.current_epoch_completed % self.every_n_epochs or not _global_zero(trainer):
            return
        metrics = trainer.callback_metrics
        d = self._dir(trainer)
        epoch, step = trainer.current_epoch_completed - 1, trainer.global_step
        if self.save_top_k != 0:
            if self.monitor is None:
                path = os.path.join(d, self.format_name(metrics, epoch, step))
                trainer.save_checkpoint(path)
                for old in list(self.best_k_models):
                    if old != path and self.save_top_k != -1:
                        _remove(old)
                        del self.best_k_models[old]
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
            path = os.path.join(d, "last.ckpt")
            trainer.save_checkpoint(path)
            self.last_model_path = path
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
        path = os.path.join(d, self.format_name(metrics, epoch, step))
        trainer.save_checkpoint(path)
        self.best_k_models[path] = score
        if worst is not None and worst != path:
            del self.best_k_models[worst]
            _remove(worst)
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
        self.monitor = monitor
        self.patience = int(patience)
        self.mode = _check_mode(mode)
        self.min_delta = abs(float(min_delta))
        self.check_finite = check_finite
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
            raise ValueError("logging_interval: expected 'step' or 'epoch', got %r" % (logging_interval,))
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
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
        self.refresh_rate = max(1, int(refresh_rate))
        self.stream = stream
        self.lines_per_epoch = lines_per_epoch
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
        if not isinstance(epochs, int) or epochs < 0:
            raise ValueError("epochs: expected an int >= 0, got %r" % (epochs,))
        self.epochs = epochs

    def setup(self, trainer, pl_module, stage):
        if trainer.datamodule is not None:
            trainer.datamodule.close_mosaic = self.epochs
