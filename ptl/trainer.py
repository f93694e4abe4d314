"""``ptl.Trainer``: Lightning-style fit / validate / predict loops for :class:`ptl.Detector`.

The step loop follows spec §9: per batch the warm-up / schedule update, forward, objective (both
branches), backward, and an optimizer step (clip, MuSGD/SGD/AdamW, EMA) whenever the nominal-batch
accumulation says so; per epoch the o2m/o2o weight update, validation of the EMA weights, logging and
checkpoints. Callbacks run between steps, never inside one.

Checkpoints are one ``.safetensors`` file: the model (``model.*``), the EMA (``ema.*``), the optimizer
state (``optim.*``), the schedule, the accumulated gradients, the loss history, and a JSON header of
trainer state (epoch, step, RNG offsets, callback states, hyperparameters) in the metadata key
``ptl.trainer``. Checkpoints are written at epoch ends; ``fit(..., ckpt_path=...)`` continues from
there bit-exactly.
"""
import csv
import hashlib
import json
import math
import os
import sys
import time

import numpy as np

from . import _C, io
from . import callbacks as cb
from . import cuda as _cuda
from . import metrics as _metrics
from . import optim as _optim
from . import random as _random
from .objective import LOSS_NAMES, num_anchors, o2m_weight
from .objective import objective as _objective

PRECISIONS = {"32-true": "float32", "32": "float32", 32: "float32", "16-mixed": "float16", "16": "float16",
              16: "float16", "bf16-mixed": "bfloat16", "bf16": "bfloat16"}
ITEM = slice(7, 10)  # the o2o loss items (box, cls, l1) of the objective's losses vector
CKPT_VERSION = 1


class LossValue:
    """One loss of one training batch, read back from the device only when asked (``float(v)`` or
    ``v.item()``): handing it to callbacks costs no host-device synchronisation."""

    __slots__ = ("_losses", "_index")

    def __init__(self, losses, index):
        self._losses, self._index = losses, index

    def item(self):
        return float(self._losses.array()[self._index])

    __float__ = item

    def __format__(self, spec):
        return format(self.item(), spec)

    def __repr__(self):
        return "LossValue(%r)" % self.item()


class _PendingLosses:
    """The objective's losses vector of one batch (a device tensor on CUDA), converted once."""

    __slots__ = ("_t", "_a")

    def __init__(self, t):
        self._t, self._a = t, None

    def array(self):
        if self._a is None:
            t = self._t
            self._a = np.asarray(t.numpy() if isinstance(t, _C.Tensor) else t, np.float32)
            self._t = None
        return self._a


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


def _limit(value, total, name):
    if value is None:
        return total
    if isinstance(value, bool):
        raise TypeError("%s: expected an int or a float fraction, got %r" % (name, value))
    if isinstance(value, int):
        if value < 0:
            raise ValueError("%s: expected >= 0, got %d" % (name, value))
        return min(value, total)
    if isinstance(value, float):
        if not 0.0 <= value <= 1.0:
            raise ValueError("%s: a float must be a fraction in [0, 1], got %r" % (name, value))
        return int(total * value) if value < 1.0 else total
    raise TypeError("%s: expected an int or a float fraction, got %r" % (name, value))


class Trainer:
    """Fits a :class:`ptl.Detector` on :class:`ptl.DetectionData` (Lightning's argument names).

    Detector hyperparameters (optimizer, lr0, lrf, momentum, weight_decay, warmup_*, EMA, cos_lr) come
    from ``model.hparams`` (spec §10 defaults). ``accumulate_grad_batches=None`` follows the spec's
    nominal batch of 64 (with its warm-up ramp); an int fixes the number of batches per step.
    """

    def __init__(self, *, max_epochs=None, max_steps=-1, precision="32-true", accumulate_grad_batches=None,
                 gradient_clip_val=10.0, limit_train_batches=None, limit_val_batches=None,
                 check_val_every_n_epoch=1, callbacks=None, logger=True, enable_progress_bar=True,
                 enable_checkpointing=True, deterministic=True, default_root_dir=None, accelerator="auto",
                 devices="auto", name="train", seed=None):
        if max_epochs is not None and (not isinstance(max_epochs, int) or max_epochs < 1):
            raise ValueError("max_epochs: expected an int >= 1 or None, got %r" % (max_epochs,))
        if not isinstance(max_steps, int) or max_steps < -1 or max_steps == 0:
            raise ValueError("max_steps: expected -1 (no limit) or an int >= 1, got %r" % (max_steps,))
        if precision not in PRECISIONS:
            raise ValueError("precision: expected '32-true', '16-mixed' or 'bf16-mixed', got %r" % (precision,))
        if accumulate_grad_batches is not None and (not isinstance(accumulate_grad_batches, int)
                                                    or accumulate_grad_batches < 1):
            raise ValueError("accumulate_grad_batches: expected None or an int >= 1, got %r"
                             % (accumulate_grad_batches,))
        if gradient_clip_val is not None and not gradient_clip_val >= 0:
            raise ValueError("gradient_clip_val: expected None or >= 0, got %r" % (gradient_clip_val,))
        if not isinstance(check_val_every_n_epoch, int) or check_val_every_n_epoch < 1:
            raise ValueError("check_val_every_n_epoch: expected an int >= 1, got %r" % (check_val_every_n_epoch,))
        if accelerator not in ("auto", "cpu", "cuda", "gpu"):
            raise ValueError("accelerator: expected 'cpu', 'cuda' or 'auto', got %r" % (accelerator,))
        if devices not in ("auto", 1, [0], "1"):
            raise ValueError("devices: only one device is supported so far (multi-GPU is planned), got %r"
                             % (devices,))
        _limit(limit_train_batches, 1, "limit_train_batches")
        _limit(limit_val_batches, 1, "limit_val_batches")
        if accelerator == "cpu" and PRECISIONS[precision] != "float32":
            raise ValueError("precision: %r needs CUDA; the CPU trains in '32-true'" % (precision,))
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self.precision = precision
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val = gradient_clip_val
        self.limit_train_batches = limit_train_batches
        self.limit_val_batches = limit_val_batches
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.enable_checkpointing = enable_checkpointing
        self.enable_progress_bar = enable_progress_bar
        self.deterministic = deterministic
        self.default_root_dir = os.fspath(default_root_dir) if default_root_dir is not None else os.getcwd()
        self.accelerator = "cuda" if accelerator == "gpu" else accelerator
        self.logger = logger
        self.name = name
        self.seed = seed
        self.callbacks = list(callbacks or [])
        for c in self.callbacks:
            if not isinstance(c, cb.Callback):
                raise TypeError("callbacks: expected ptl.Callback instances, got %s" % type(c).__name__)
        if enable_checkpointing and not any(isinstance(c, cb.ModelCheckpoint) for c in self.callbacks):
            self.callbacks.append(cb.ModelCheckpoint(filename="best", monitor="fitness", mode="max", save_last=True,
                                                     monitor_optional=True))
        if enable_progress_bar and not any(isinstance(c, cb.ProgressBar) for c in self.callbacks):
            self.callbacks.append(cb.ProgressBar())
        self.callback_metrics = {}
        self.logged_metrics = {}
        self.should_stop = False
        self.sanity_checking = False
        self.state = _TrainerState()
        self.validated_this_epoch = False
        self.current_epoch_completed = 0
        self.num_training_batches = 0
        self.loss_history = []  # per training batch: the objective's losses vector (float32, LOSS_NAMES)
        self.val_history = []
        self.ap_per_class = {}  # class name -> AP50-95 of the last validation
        self.datamodule = None
        self.model = None
        self.log_dir = None
        self._state = _FitState()
        self._engine = None
        self._epoch_rows = []
        self.capture_network = False

    # -------------------------------------------------------------------------------- properties
    @property
    def current_epoch(self):
        return self._state.epoch

    @property
    def global_step(self):
        return self._state.global_step

    @property
    def max_epochs_effective(self):
        return self.max_epochs if self.max_epochs is not None else 100

    @property
    def device(self):
        if self.accelerator == "cpu":
            return "cpu"
        if self.accelerator == "cuda":
            if not _cuda.is_available():
                raise ValueError("accelerator: 'cuda' requested but no CUDA device is available")
            return "cuda"
        return "cuda" if _cuda.is_available() else "cpu"

    def log_dict(self, values):
        for k, v in values.items():
            self.logged_metrics[k] = float(v)
            self.callback_metrics[k] = float(v)

    def group_schedule(self):
        """[(group name, lr, momentum)] of the optimizer's parameter groups, as last set."""
        if self._engine is None:
            return []
        return [("pg%d_%s" % (i, g["param_group"]), float(g["lr"]), float(g["momentum"]))
                for i, g in enumerate(self._engine.opt.param_groups)]

    def progress_metrics(self):
        return {k: v for k, v in self.callback_metrics.items() if k.startswith("train/")}

    # ------------------------------------------------------------------------------------ hooks
    def _call(self, hook, *args):
        for c in self.callbacks:
            getattr(c, hook)(self, self.model, *args)

    # -------------------------------------------------------------------------------------- fit
    def fit(self, model, datamodule, ckpt_path=None, capture_network=False):
        """Trains ``model`` on ``datamodule``; ``ckpt_path`` resumes from a checkpoint of this trainer.
        ``capture_network=True`` (CUDA): the first full-size step runs eagerly, then the network's forward
        and backward are recorded as CUDA graphs and replayed on every full-size step after it (the
        objective, optimizer and EMA stay eager); the replayed network computes the bits of the eager one,
        so the fit's results are those of an eager fit (docs/training.md)."""
        if capture_network and self.device == "cpu":
            raise ValueError("capture_network=True: graph replay needs accelerator='cuda'")
        self.capture_network = bool(capture_network)
        self.model, self.datamodule = model, datamodule
        self.should_stop = False
        self.state.fn = "fit"
        self._configure_run_dir()
        if self.seed is not None:
            _random.seed_everything(self.seed)

        def run():
            self._call("setup", "fit")
            self._engine = _Engine(self, model, datamodule)
            if ckpt_path is not None:
                self._restore(ckpt_path)
            self._write_hparams()
            self._call("on_fit_start")
            self._call("on_train_start")
            self._fit_loop()
            self._call("on_train_end")
            self._call("on_fit_end")
        self._guarded("fit", model, run)
        return self

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
            self._teardown(stage)
            raise
        self._teardown(stage)
        return result

    def _teardown(self, stage):
        try:
            self._call("teardown", stage)
        finally:
            self.state.fn = None
            if self._engine is not None:
                self._engine.close()

    def _fit_loop(self):
        eng, st = self._engine, self._state
        while st.epoch < self.max_epochs_effective and not self.should_stop:
            epoch = st.epoch
            self.datamodule.set_epoch(epoch)
            self.validated_this_epoch = False
            self._call("on_train_epoch_start")
            t0 = time.perf_counter()
            epoch_items = []
            pending = None  # the previous batch's losses: read once the next batch is queued

            def settle(p):
                row = p.array()
                self.loss_history.append(row)
                epoch_items.append(row[ITEM])
                self.callback_metrics.update({"train/box_loss": float(row[7]), "train/cls_loss": float(row[8]),
                                              "train/l1_loss": float(row[9])})
            for i, batch in enumerate(eng.train_loader):
                if i >= self.num_training_batches:
                    break
                self._call("on_train_batch_start", batch, i)
                current = _PendingLosses(eng.train_step(batch, epoch, i))
                if pending is not None:
                    settle(pending)
                pending = current
                self._call("on_train_batch_end", {"loss": LossValue(current, 0)}, batch, i)
                if 0 < self.max_steps <= st.global_step:
                    self.should_stop = True
                    break
            if pending is not None:
                settle(pending)
            eng.end_epoch()
            st.epoch += 1
            self.current_epoch_completed = st.epoch
            mean = np.mean(epoch_items, axis=0) if epoch_items else np.zeros(3)
            row = {"epoch": epoch, "step": st.global_step, "train/box_loss": mean[0], "train/cls_loss": mean[1],
                   "train/l1_loss": mean[2]}
            row.update({"lr/%s" % n: lr for n, lr, _ in self.group_schedule()})
            self.log_dict({k: v for k, v in row.items() if k not in ("epoch", "step")})
            if (epoch + 1) % self.check_val_every_n_epoch == 0 and eng.has_val:
                self._validation_loop(row)
            row["time"] = time.perf_counter() - t0
            self._epoch_rows.append(row)
            self._write_metrics()
            self._call("on_train_epoch_end")

    def _validation_loop(self, row=None):
        self._call("on_validation_start")
        self._call("on_validation_epoch_start")
        res = self._engine.validate(self)
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
        """Validates ``model``'s current weights; returns ``[metrics dict]`` like Lightning. Writes no file:
        checkpoint and early-stopping callbacks act only while fitting, as in Lightning."""
        self.model, self.datamodule = model, datamodule
        self.state.fn = "validate"
        self._engine = None

        def run():
            self._call("setup", "validate")
            self._engine = _Engine(self, model, datamodule, for_fit=False)
            return self._validation_loop()
        return [dict(self._guarded("validate", model, run)["logged"])]

    def predict(self, model, images_or_paths, conf=0.25, max_det=300, imgsz=640, batch_size=16):
        """Detections of the one-to-one head (spec §8.2, eval mode).

        ``images_or_paths``: an image batch as :meth:`Detector.predict` takes it (boxes come back in its
        pixels), or a list of image files (letterboxed to ``imgsz``; boxes come back in each file's
        pixels, and a file that cannot be read gives ``None`` after a DataWarning). Each result is
        ``{"boxes": (k, 4) xyxy, "scores": (k,), "classes": (k,)}``, score descending."""
        if not (isinstance(images_or_paths, (list, tuple)) and images_or_paths
                and all(isinstance(p, (str, os.PathLike)) for p in images_or_paths)):
            return model.predict(images_or_paths, conf=conf, max_det=max_det)
        from .data import image_batches
        out = [None] * len(images_or_paths)
        for batch in image_batches(images_or_paths, imgsz=imgsz, batch_size=batch_size):
            dets = model.predict(batch.images, conf=conf, max_det=max_det)
            for k, det in enumerate(dets):
                h0, w0, gy, gx, pl, pt = np.asarray(batch.meta, np.float64)[k]
                det["boxes"] = _metrics.scale_boxes(det["boxes"], (gx, gy), (pl, pt), (h0, w0)).astype(np.float32)
                out[int(batch.indices[k])] = det
        return out

    # -------------------------------------------------------------------------------- logs
    def _configure_run_dir(self):
        if self.logger:
            base = os.path.join(self.default_root_dir, "runs", self.name)
            os.makedirs(base, exist_ok=True)
            taken = [int(d.split("_")[1]) for d in os.listdir(base)
                     if d.startswith("version_") and d.split("_")[1].isdigit()]
            self.log_dir = os.path.join(base, "version_%d" % (max(taken) + 1 if taken else 0))
        else:
            self.log_dir = self.default_root_dir
        os.makedirs(self.log_dir, exist_ok=True)

    def hparams(self):
        h = {"trainer": {k: getattr(self, k) for k in (
            "max_epochs", "max_steps", "precision", "accumulate_grad_batches", "gradient_clip_val",
            "limit_train_batches", "limit_val_batches", "check_val_every_n_epoch", "deterministic", "accelerator",
            "seed", "capture_network")}}
        if self._engine is not None:
            h["model"] = self._engine.model_hparams()
            h["data"] = self._engine.data_hparams()
        return h

    def _write_hparams(self):
        if not self.logger:
            return
        import yaml
        with open(os.path.join(self.log_dir, "hparams.yaml"), "w") as f:
            yaml.safe_dump(_jsonable(self.hparams()), f, sort_keys=False)

    def _write_metrics(self):
        if not self.logger:
            return
        keys = []
        for r in self._epoch_rows:
            keys += [k for k in r if k not in keys]
        path = os.path.join(self.log_dir, "metrics.csv")
        tmp = path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in self._epoch_rows:
                w.writerow({k: ("%.6g" % v if isinstance(v, float) else v) for k, v in r.items()})
        os.replace(tmp, path)
        _plot_results(path, os.path.join(self.log_dir, "results.png"))

    # ----------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path):
        """Writes the full training state to ``path`` (atomically: a crash leaves any previous file)."""
        eng, st = self._engine, self._state
        tensors = eng.state_tensors()
        tensors["trainer.losses"] = np.asarray(self.loss_history, np.float32).reshape(-1, len(LOSS_NAMES))
        header = {"version": CKPT_VERSION, "epoch": st.epoch, "global_step": st.global_step,
                  "batches_seen": st.batches_seen, "rng": list(_random.default_generator.get_state()),
                  "hparams": _jsonable(self.hparams()), "callbacks": {}, "val_history": _jsonable(
                      [r["logged"] for r in self.val_history]), "epoch_rows": _jsonable(self._epoch_rows)}
        for c in self.callbacks:
            header["callbacks"][c.state_key] = _jsonable(c.state_dict())
        checkpoint = {"header": header, "tensors": tensors}
        self._call("on_save_checkpoint", checkpoint)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        io.save_safetensors(path, checkpoint["tensors"], metadata={"ptl.trainer": json.dumps(checkpoint["header"])})

    def _restore(self, path):
        tensors, meta = io.load_safetensors(path)
        if not meta or "ptl.trainer" not in meta:
            raise ValueError("ckpt_path: %s is not a ptl training checkpoint (no 'ptl.trainer' metadata)" % path)
        header = json.loads(meta["ptl.trainer"])
        if header.get("version") != CKPT_VERSION:
            raise ValueError("ckpt_path: %s has checkpoint version %r, expected %d" % (path, header.get("version"),
                                                                                       CKPT_VERSION))
        checkpoint = {"header": header, "tensors": tensors}
        self._call("on_load_checkpoint", checkpoint)
        self._engine.load_state_tensors(tensors)
        st = self._state
        st.epoch, st.global_step, st.batches_seen = header["epoch"], header["global_step"], header["batches_seen"]
        _random.default_generator.set_state(header["rng"])
        self.loss_history = [row for row in np.asarray(tensors["trainer.losses"], np.float32)]
        self.val_history = [{"logged": r} for r in header.get("val_history", [])]
        self._epoch_rows = header.get("epoch_rows", [])
        self.current_epoch_completed = st.epoch
        for c in self.callbacks:
            if c.state_key in header["callbacks"]:
                c.load_state_dict(header["callbacks"][c.state_key])

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


class _Engine:
    """The training machinery of one fit: model buffers, objective, optimizer, EMA, schedule, loaders."""

    def __init__(self, trainer, model, data, for_fit=True):
        self.trainer, self.model, self.data = trainer, model, data
        self.device = trainer.device
        self.compute = PRECISIONS[trainer.precision]
        if self.device == "cpu" and self.compute != "float32":
            raise ValueError("precision: %r needs CUDA; the CPU trains in '32-true'" % trainer.precision)
        if data.num_classes != model.num_classes:
            raise ValueError("datamodule: %d classes in %s but the model has %d" % (
                data.num_classes, data.cfg.get("yaml", "data.yaml"), model.num_classes))
        self.train_loader = data.train_loader() if for_fit else None
        try:
            self.val_loader = data.val_loader()
        except (ValueError, KeyError):
            if not for_fit:
                raise
            self.val_loader = None
        # limit_val_batches=0 turns validation off, as in Lightning
        self.has_val = self.val_loader is not None and (
            not for_fit or _limit(trainer.limit_val_batches, len(self.val_loader), "limit_val_batches") > 0)
        self.ptable = model.parameter_table()
        self.btable = model.buffer_table()
        if self.device != "cpu":
            model.to(self.device, dtype=self.compute)
        self.params = _as_tensor(model.flat_parameters)
        self.grads = _as_tensor(model.flat_gradients)
        self.buffers = _as_tensor(model.flat_buffers)
        self._inputs = {}  # CUDA: per batch shape, the network input and the uint8 staging buffer
        self.capture = False
        self._plans = {}  # per batch shape: the fused step's fixed arguments
        if not for_fit:
            self.opt = None
            return
        nb = len(self.train_loader)
        trainer.num_training_batches = _limit(trainer.limit_train_batches, nb, "limit_train_batches")
        if trainer.num_training_batches == 0:
            raise ValueError("limit_train_batches: no training batch left to run")
        hp = dict(getattr(model, "hparams", None) or {})
        self.cfg = _optim.OptimConfig(epochs=trainer.max_epochs_effective, batch=data.batch_size,
                                      nc=model.num_classes, n_train_images=self.train_loader.num_images,
                                      max_norm=trainer.gradient_clip_val or 0.0,
                                      **{k: v for k, v in hp.items() if k in _optim.OptimConfig.__dataclass_fields__})
        model.zero_grad()
        model.train()
        self.opt, self.schedule = _optim.build_optimizer(
            self.params, self.grads, self.ptable, self.cfg, trainer.num_training_batches,
            scaler=self.compute == "float16",
            bn_buffers=self.buffers, bn_table=self.btable)
        self.fixed_accumulate = trainer.accumulate_grad_batches
        data.epochs = trainer.max_epochs_effective  # close_mosaic counts back from the fit's last epoch
        self.ema_model = None
        self.capture = bool(getattr(trainer, "capture_network", False)) and self.device != "cpu"

    # -- hyperparameters
    def model_hparams(self):
        h = {"model": self.model.model_name, "num_classes": self.model.num_classes}
        if getattr(self, "cfg", None) is not None:
            h.update({k: getattr(self.cfg, k) for k in self.cfg.__dataclass_fields__})
            name, lr0, mom, wbl = _optim.choose_optimizer(self.cfg)
            h["resolved_optimizer"] = {"name": name, "lr0": lr0, "momentum": mom, "warmup_bias_lr": wbl}
        h["box"], h["cls"], h["dfl"] = self.model.loss_gains
        return h

    def data_hparams(self):
        d = self.data
        return {"data": d.cfg.get("yaml"), "imgsz": d.imgsz, "batch_size": d.batch_size, "workers": d.workers,
                "cache": d.cache, "seed": d.seed, **d.hyp}

    # -- one batch
    def _due(self, ni):
        if self.fixed_accumulate is not None:
            return ni - self.schedule.last_opt_step >= self.fixed_accumulate
        return self.schedule.due(ni)

    def train_step(self, batch, epoch, i):
        """One batch: the schedule's values here, then one C call (upload, forward, objective, backward,
        and the optimizer step + EMA when the accumulation says so). Returns the losses vector (a device
        tensor on CUDA: nothing waits for it)."""
        st = self.trainer._state
        ni = st.batches_seen
        self.schedule.apply(self.opt, epoch, i)
        due = self._due(ni)
        ema = self.opt.ema
        decay = ema.decay(ema.updates + 1) if due and ema is not None else 0.0
        lrs, momenta, wds = self.opt.group_values()
        targets = _C.from_numpy(np.ascontiguousarray(batch.targets, dtype=np.float32))
        losses = _C.train_step(self._plan(batch), batch.images, targets,
                               o2m_weight(epoch, self.trainer.max_epochs_effective), due, lrs, momenta, wds, decay)
        if due:
            if ema is not None:
                ema.updates += 1
            self.schedule.stepped(ni)
            st.global_step += 1
        st.batches_seen += 1
        return losses  # on CUDA a device tensor, read back later (one batch behind)

    def _plan(self, batch):
        """The fused step's arguments that stay fixed for a batch shape (see csrc/train/py_train_step.c)."""
        shape = tuple(batch.images.shape)
        plan = self._plans.get(shape)
        if plan is not None:
            return plan
        b, h, w, _ = shape
        na, nc = num_anchors((h, w)), self.model.num_classes
        dev = self.device
        if dev == "cpu":
            net, staging = self.model._net, None
            inp = _C.empty(shape, dtype="float32")
        else:
            net = self.model._cuda._h
            inp, staging = self._input_buffers(shape)
        grads = tuple(_C.empty((b, na, k), dtype="float32", device=dev) for k in (4, nc, 4, nc))
        ema = self.opt.ema
        plan = {"net": net, "input": inp, "staging": staging, "grads": grads, "gains": self.model.loss_gains,
                "scale_from": (self.opt.scalars, _optim.SCALE_INDEX) if self.opt.scaler else None,
                "optim": self.opt.step_kwargs(),
                "ema": None if ema is None else [(ema.params, self.params)] + (
                    [(ema.bn, self.buffers)] if ema.bn is not None else []),
                "record": self.capture and b == self.data.batch_size}
        self._plans[shape] = plan
        return plan

    def _input_buffers(self, shape):
        """CUDA: the network input (compute dtype) and the uint8 upload buffer for a batch shape."""
        if shape not in self._inputs:
            self._inputs[shape] = (_C.empty(shape, dtype=self.model.compute_dtype, device=self.device),
                                   _C.empty((int(np.prod(shape)),), dtype="uint8", device=self.device))
        return self._inputs[shape]

    def end_epoch(self):
        pass

    def _images(self, batch):
        """The batch's images as the model takes them: the uint8 array on the CPU; on CUDA a device tensor
        in the compute dtype, uploaded and normalised asynchronously into a buffer kept per shape."""
        if self.device == "cpu":
            return batch.images
        dst, staging = self._input_buffers(tuple(batch.images.shape))
        batch.upload(dst, staging)
        return dst

    # -- validation on the EMA weights
    def _eval_model(self):
        from .model import Detector
        if self.opt is None or self.opt.ema is None:
            return self.model
        if self.ema_model is None:
            self.ema_model = Detector(self.model.model_name, num_classes=self.model.num_classes)
            if self.device != "cpu":
                self.ema_model.to(self.device, dtype=self.model.compute_dtype)
        _assign(self.ema_model.flat_parameters, self.opt.ema.params)
        if self.opt.ema.bn is not None:
            _assign(self.ema_model.flat_buffers, self.opt.ema.bn)
        return self.ema_model

    def validate(self, trainer):
        model = self._eval_model()
        was = model.training
        model.eval()
        names = self.data.names
        met = _metrics.DetectionMetrics(names)
        loss_sum, nb = np.zeros(3), 0
        total = len(self.val_loader)
        limit = _limit(trainer.limit_val_batches, total, "limit_val_batches")
        try:
            for j, batch in enumerate(self.val_loader):
                if j >= limit:
                    break
                trainer._call("on_validation_batch_start", batch, j)
                out = model.forward(self._images(batch))
                h, w = batch.images.shape[1:3]
                res = _objective((*out["one2many"], *out["one2one"]), batch.targets, img_size=(h, w),
                                 num_classes=self.model.num_classes, o2m_weight=0.8,
                                 gains=self.model.loss_gains)
                lv = res["losses"].numpy() if isinstance(res["losses"], _C.Tensor) else np.asarray(res["losses"])
                loss_sum += lv[ITEM]
                nb += 1
                dets = _metrics.postprocess(out["one2one"][0], out["one2one"][1], (h, w), conf=0.001)
                _update_metrics(met, dets, batch, h, w)
                trainer._call("on_validation_batch_end", None, batch, j)
        finally:
            model.train(was)
        r = met.compute()
        mean = loss_sum / max(nb, 1)
        logged = {"val/box_loss": mean[0], "val/cls_loss": mean[1], "val/l1_loss": mean[2],
                  "metrics/precision": r["precision"], "metrics/recall": r["recall"], "metrics/mAP50": r["mAP50"],
                  "metrics/mAP50-95": r["mAP50-95"], "fitness": r["fitness"]}
        return {"logged": {k: float(v) for k, v in logged.items()}, "ap_per_class": r.get("ap_per_class", {})}

    # -- state
    def state_tensors(self):
        t = {"model." + k: v for k, v in self.model.state_dict().items()}
        t.update({"optim." + k: v for k, v in self.opt.state_dict().items()})
        if self.opt.ema is not None:
            t.update(self.opt.ema.state_dict(self.opt.specs, self.opt.bn_specs))
        t.update(self.schedule.state_dict())
        t["trainer.grads"] = self.grads.numpy()
        return t

    def load_state_tensors(self, t):
        def strip(prefix):
            return {k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}
        self.model.load_state_dict(strip("model."), strict=True)
        self.opt.load_state_dict(strip("optim."))
        if self.opt.ema is not None:
            self.opt.ema.load_state_dict({k: v for k, v in t.items() if k.startswith("ema.")}, self.opt.specs,
                                         self.opt.bn_specs)
        self.schedule.load_state_dict(t)
        _assign(self.model.flat_gradients, np.asarray(t["trainer.grads"], np.float32).reshape(-1))

    def digest_parts(self):
        model = self.model.state_dict()
        out = {"model": _optim.digest(model)}
        if self.opt is not None:
            out["optimizer"] = _optim.digest(self.opt.state_dict())
            out["schedule"] = _optim.digest(self.schedule.state_dict())
            out["ema"] = _optim.digest(self.opt.ema.state_dict(self.opt.specs, self.opt.bn_specs)
                                       if self.opt.ema is not None else {})
        return out

    def close(self):
        cuda_net = getattr(self.model, "_cuda", None)
        if self.capture and cuda_net is not None:
            cuda_net.retire()  # a fit's recording ends with it (its graphs' memory goes back)
        self._plans.clear()
        for name in ("train_loader", "val_loader"):
            loader = getattr(self, name, None)
            close = getattr(loader, "close", None)
            if close is not None:
                close()


def _as_tensor(flat):
    """A ptl.Tensor over a flat model buffer (zero-copy for the CPU network's NumPy views)."""
    return flat if isinstance(flat, _C.Tensor) else _C.from_numpy(flat)


def _assign(dst, src):
    """Copies a flat buffer (ptl.Tensor or NumPy) into another, across devices."""
    if isinstance(src, np.ndarray):
        src = _C.from_numpy(np.ascontiguousarray(src))
    if isinstance(dst, np.ndarray):
        dst[:] = src.numpy().reshape(dst.shape)
    else:
        _C._optim_copy(dst, src)


def _update_metrics(met, dets, batch, h, w):
    """Adds one batch's detections and ground truth, both mapped back to the original images."""
    targets = np.asarray(batch.targets, np.float64).reshape(-1, 6)
    meta = np.asarray(batch.meta, np.float64)
    for k, det in enumerate(dets):
        h0, w0, gy, gx, pl, pt = meta[k]
        rows = targets[targets[:, 0] == k]
        gt = np.empty((len(rows), 4))
        gt[:, 0] = (rows[:, 2] - rows[:, 4] / 2) * w
        gt[:, 1] = (rows[:, 3] - rows[:, 5] / 2) * h
        gt[:, 2] = (rows[:, 2] + rows[:, 4] / 2) * w
        gt[:, 3] = (rows[:, 3] + rows[:, 5] / 2) * h
        gt = _metrics.scale_boxes(gt, (gx, gy), (pl, pt), (h0, w0))
        pb = _metrics.scale_boxes(det[:, :4], (gx, gy), (pl, pt), (h0, w0))
        met.update(pb, det[:, 4], det[:, 5].astype(np.int64), gt, rows[:, 1].astype(np.int64))


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else str(v)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    return obj


def _plot_results(csv_path, png_path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if not getattr(_plot_results, "warned", False):
            print("ptl: matplotlib is not installed; results.png skipped", file=sys.stderr)
            _plot_results.warned = True
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
