"""``ptl.Trainer``: Lightning-style fit / validate / predict loops for :class:`ptl.Detector`.

The step loop follows spec §9: per batch the warm-up / schedule update, forward, objective (both
branches), backward, and an optimizer step (clip, MuSGD/SGD/AdamW, EMA) whenever the nominal-batch
accumulation says so; per epoch the o2m/o2o weight update, validation of the EMA weights, logging and
checkpoints. Callbacks run between steps, never inside one. The machinery of one fit is
:class:`ptl.engine.Engine`; checkpoints are :mod:`ptl.checkpoint`; the run folder's files :mod:`ptl.runlog`.
"""
import hashlib
import os
import time

import numpy as np

from . import callbacks as cb
from . import checkpoint as _checkpoint
from . import cuda as _cuda
from . import distributed as _distributed
from . import random as _random
from . import runlog
from .errors import ConfigError, DivergenceError
from .hparams_check import check_bool, check_float, check_int
from .runlog import check_run_name
from .objective import LOSS_NAMES
from .engine import ITEM, PRECISIONS, Engine, LossValue, _limit, _PendingLosses


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


class Trainer:
    """Fits a :class:`ptl.Detector` on :class:`ptl.DetectionData` (Lightning's argument names).

    Detector hyperparameters (optimizer, lr0, lrf, momentum, weight_decay, warmup_*, EMA, cos_lr) come
    from ``model.hparams`` (spec §10 defaults). ``accumulate_grad_batches=None`` follows the spec's
    nominal batch of 64 (with its warm-up ramp); an int fixes the number of batches per step.

    Several devices (:mod:`ptl.distributed`): ``devices`` (an int, a list of GPU ordinals, ``"0,1"`` or
    ``"auto"``; on the CPU a number of processes), ``num_nodes`` and ``strategy="ddp"`` (``"auto"``: ddp
    when there is more than one device) as in Lightning; ``timeout`` bounds every wait of a distributed job
    (seconds; default ``PTL_DIST_TIMEOUT`` or ``ptl.distributed.DEFAULT_TIMEOUT_S``). Rank 0 alone prints,
    logs and writes files; ``global_rank``, ``local_rank``, ``node_rank``, ``world_size`` and
    ``is_global_zero`` say where this process stands.

    ``end2end`` chooses what validation measures, as 8.4.190's ``nms`` does: False (the default, its
    ``nms=None``) the one-to-many head with class-aware NMS; True (its ``nms=False``) the one-to-one
    head's top-300 without NMS. It is recorded in ``hparams()["trainer"]``.
    """

    def __init__(self, *, max_epochs=None, max_steps=-1, precision="32-true", accumulate_grad_batches=None,
                 gradient_clip_val=10.0, limit_train_batches=None, limit_val_batches=None,
                 check_val_every_n_epoch=1, callbacks=None, logger=True, enable_progress_bar=True,
                 enable_checkpointing=True, deterministic=True, default_root_dir=None, accelerator="auto",
                 devices="auto", name="train", seed=None, num_nodes=1, strategy="auto", timeout=None,
                 end2end=False):
        check_int("max_epochs", max_epochs, 1, none_ok=True)
        if check_int("max_steps", max_steps, -1) == 0:
            raise ConfigError("max_steps: expected -1 (no limit) or an int >= 1, got 0")
        if not isinstance(precision, (str, int)) or precision not in PRECISIONS:
            raise ConfigError("precision: expected '32-true', '16-mixed' or 'bf16-mixed', got %r" % (precision,))
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
        _limit(limit_train_batches, 1, "limit_train_batches")
        _limit(limit_val_batches, 1, "limit_val_batches")
        if limit_train_batches is not None and not isinstance(limit_train_batches, bool) and limit_train_batches == 0:
            raise ConfigError("limit_train_batches: 0 leaves no training batch to run")
        if accelerator == "cpu" and PRECISIONS[precision] != "float32":
            raise ConfigError("precision: %r needs CUDA; the CPU trains in '32-true'" % (precision,))
        for flag, value in (("logger", logger), ("enable_progress_bar", enable_progress_bar),
                            ("enable_checkpointing", enable_checkpointing), ("deterministic", deterministic),
                            ("end2end", end2end)):
            check_bool(flag, value)
        if default_root_dir is not None:
            try:
                default_root_dir = os.fspath(default_root_dir)
            except TypeError:
                raise ConfigError("default_root_dir: expected a folder path, got %r" % (default_root_dir,)) from None
            if os.path.exists(default_root_dir) and not os.path.isdir(default_root_dir):
                raise ConfigError("default_root_dir: %s exists and is not a folder" % default_root_dir)
        check_run_name(name)
        check_int("seed", seed, 0, 2 ** 64 - 1, none_ok=True)
        if isinstance(callbacks, cb.Callback):
            callbacks = [callbacks]
        elif callbacks is not None and not isinstance(callbacks, (list, tuple)):
            raise ConfigError("callbacks: expected a list of ptl.Callback instances, got %s" % type(callbacks).__name__)
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
        self.default_root_dir = default_root_dir if default_root_dir is not None else os.getcwd()
        self.accelerator = "cuda" if accelerator == "gpu" else accelerator
        self.devices, self.num_nodes, self.strategy, self.timeout = devices, num_nodes, strategy, timeout
        self.end2end = end2end
        self._dist = _distributed.Context()  # one process until fit() joins a job
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
        self._resumed_from = None  # the checkpoint this fit resumed from (named when a fit diverges)
        self._last_batch = (0, 0, 0)  # epoch, batch index and optimizer steps after the latest training batch
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
        return self.max_epochs if self.max_epochs is not None else 100

    @property
    def device(self):
        if self.accelerator == "cpu":
            return "cpu"
        gpu = "cuda" if not self._dist.device else "cuda:%d" % self._dist.device  # this rank's GPU
        if self.accelerator == "cuda":
            if not _cuda.is_available():
                raise ConfigError("accelerator: 'cuda' requested but no CUDA device is available")
            return gpu
        return gpu if _cuda.is_available() else "cpu"

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
        so the fit's results are those of an eager fit (docs/training.md).

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
        device = self.device  # accelerator='cuda' without a device fails here, before any work
        if capture_network and device == "cpu":
            raise ConfigError("capture_network=True: graph replay needs accelerator='cuda'")
        if device == "cpu" and PRECISIONS[self.precision] != "float32":
            raise ConfigError("precision: %r needs CUDA; the CPU trains in '32-true'" % (self.precision,))
        if datamodule.num_classes != model.num_classes:
            raise ConfigError("datamodule: %d classes in %s but the model has %d" % (
                datamodule.num_classes, getattr(datamodule, "cfg", {}).get("yaml", "data.yaml"), model.num_classes))
        resume = self._resumed_from = None
        if ckpt_path is not None:
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
            self._write_hparams()
            self._call("on_fit_start")
            self._call("on_train_start")
            self._fit_loop()
            self._engine.adopt_ema()  # the model now holds what validation and the best checkpoint measured
            self._call("on_train_end")
            self._call("on_fit_end")
        try:
            self._guarded("fit", model, run)
        except _checkpoint.CheckpointError:
            if self.logger:  # the fresh version_N folder: the failed resume wrote nothing there
                runlog.remove_if_empty(self.log_dir)
            raise
        return self

    def _join_job(self):
        """This process's place: one device (the GPU that ``devices`` names). devices * num_nodes > 1, or a
        launcher's world size > 1, needs the data-parallel step, which the fused C step does not have yet:
        ptl.distributed launches, shards the data and reduces, but the step's all-reduce is still to be
        wired (docs/training.md, "Several GPUs and nodes")."""
        acc = "cpu" if self.accelerator == "cpu" or not _cuda.is_available() else "cuda"
        try:
            # "auto" is one device until the data-parallel step exists (then, as in Lightning, every visible GPU)
            per_node = _distributed.parse_devices(1 if self.devices == "auto" else self.devices, acc)
            world = _distributed.planned_world_size(acc, self.devices, self.num_nodes)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if world == 1:
            self._dist = _distributed.Context(device=per_node[0])
        else:
            env = _distributed.detect_environment()
            raise NotImplementedError("Trainer: %d ranks (devices=%r, num_nodes=%d%s) need the data-parallel training "
                                      "step, which is not wired into the fused step yet; ptl trains on one device"
                                      % (world, self.devices, self.num_nodes,
                                         ", started by %s" % env.launcher if env is not None else ""))

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
                losses, batch_index, step = p
                row = losses.array()
                if not np.isfinite(row).all():
                    self._diverged(epoch, batch_index, step, {n: float(v) for n, v in zip(LOSS_NAMES, row)})
                self.loss_history.append(row)
                epoch_items.append(row[ITEM])
                self.callback_metrics.update({"train/box_loss": float(row[7]), "train/cls_loss": float(row[8]),
                                              "train/l1_loss": float(row[9])})
            for i, batch in enumerate(eng.train_loader):
                if i >= self.num_training_batches:
                    break
                self._call("on_train_batch_start", batch, i)
                step = st.global_step
                current = _PendingLosses(eng.train_step(batch, epoch, i))
                if pending is not None:
                    settle(pending)
                pending = (current, i, step)
                self._last_batch = (epoch, i, st.global_step)
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
        kept = [saver.last_model_path, saver.best_model_path] if saver else []
        kept = sorted({p for p in kept + [self._resumed_from] if p and os.path.isfile(p)})
        raise DivergenceError(
            "training diverged at epoch %d, batch %d (after %d optimizer steps): %s; nothing was saved from "
            "these weights. %s; lower lr0, check the data, or use a precision with more range" % (
                epoch, batch_index, step, what, "Checkpoints kept: %s" % ", ".join(kept) if kept else
                "No checkpoint had been written"), epoch, batch_index, step, losses, tensors)

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
        self._join_job()
        self.model, self.datamodule = model, datamodule
        self.state.fn = "validate"
        self._engine = None

        def run():
            self._call("setup", "validate")
            self._engine = Engine(self, model, datamodule, for_fit=False)
            return self._validation_loop()
        return [dict(self._guarded("validate", model, run)["logged"])]

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
        """Rank 0 makes the run folder; the other ranks are told its path."""
        path = runlog.make_run_dir(self.default_root_dir, self.name, bool(self.logger)) if self.is_global_zero else None
        self.log_dir = self._dist.group.broadcast_object(path) if self._dist.group is not None else path

    def hparams(self):
        h = {"trainer": {k: getattr(self, k) for k in (
            "max_epochs", "max_steps", "precision", "accumulate_grad_batches", "gradient_clip_val",
            "limit_train_batches", "limit_val_batches", "check_val_every_n_epoch", "deterministic", "accelerator",
            "seed", "capture_network", "end2end")}}
        if self._engine is not None:
            h["model"] = self._engine.model_hparams()
            h["data"] = self._engine.data_hparams()
        return h

    def _write_hparams(self):
        if self.logger and self.is_global_zero:
            runlog.write_hparams(self.log_dir, self.hparams())

    def _write_metrics(self):
        if self.logger and self.is_global_zero:
            runlog.write_metrics(self.log_dir, self._epoch_rows)

    # ----------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path):
        """Writes the full training state to ``path`` (atomically: a crash leaves any previous file). Rank 0
        alone writes (the state is the same on every rank)."""
        if self.is_global_zero:
            _checkpoint.save(self, path)

    def save_weights(self, path):
        """Writes the fit's EMA weights (what validation measured) as a weights-only ``.safetensors`` that
        ``Detector.load`` reads (atomically)."""
        from .weights import write_weights
        if not self.is_global_zero:
            return
        model = self.model
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_weights(path, self._engine.ema_state_dict(), model.model_name, model.num_classes, model.names)

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

