"""The training machinery of one fit (``Engine``): the model's flat buffers, optimizer, schedule, EMA,
loaders, the fused C step per batch and validation of the EMA weights. ``ptl.Trainer`` drives it."""
import contextlib
import os
import threading

import numpy as np

from . import _C
from . import distributed as _distributed
from . import metrics as _metrics
from . import optim as _optim
from .objective import LOSS, LOSS_NAMES, num_anchors, o2m_weight
from .objective import objective as _objective

PRECISIONS = {"32-true": "float32", "32": "float32", 32: "float32", "16-mixed": "float16", "16": "float16",
              16: "float16", "bf16-mixed": "bfloat16", "bf16": "bfloat16"}
# PyTorch's torch.set_float32_matmul_precision values; all but "highest" let float32 convolutions use TF32
FLOAT32_MATMUL_PRECISIONS = ("highest", "high", "medium")
# batch shapes planned while the caches fill: the first ones of training, then validation's (the device's plan
# cache keeps 1024 unused plans, 57 per yolo26n shape, more for the deeper scales)
PLAN_AHEAD_SHAPES = 8
ITEM = slice(LOSS["item_box"], LOSS["item_l1"] + 1)  # the o2o loss items (box, cls, l1) of the losses vector

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
            self._a = self._t.numpy()
            self._t = None
        return self._a



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



class Engine:
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
        # data parallelism: this rank's share of every epoch and of validation (docs/training.md)
        self.dist = trainer._dist
        self.rank, self.world = self.dist.rank, self.dist.world_size
        self.comm = None  # the gradient all-reduce's communicator (world > 1)
        self._counts = []  # images of each training batch of the epoch on this rank
        self._rank_grads = None  # rank 0: (batches_seen, every rank's pending gradients) for a checkpoint
        data.shard(self.rank, self.world)
        self.train_loader = data.scan("train") if for_fit else None
        try:
            self.val_loader = data.scan("val")
        except (ValueError, KeyError):
            if not for_fit:
                raise
            self.val_loader = None
        # limit_val_batches=0 turns validation off, as in Lightning
        self.has_val = self.val_loader is not None and (not for_fit or _limit(
            trainer.limit_val_batches, self.val_loader.num_global_batches, "limit_val_batches") > 0)
        self.ptable = model.parameter_table()
        self.btable = model.buffer_table()
        if self.device != "cpu":
            model.to(self.device, dtype=self.compute)
            model.set_conv_options(allow_tf32=getattr(trainer, "float32_matmul_precision", "highest") != "highest",
                                   find=bool(getattr(trainer, "benchmark", False)))
        self._fill_loaders()
        self.params, self.grads, self.buffers = model.flat_parameters, model.flat_gradients, model.flat_buffers
        self._uploads, self._inputs = {}, {}  # CUDA: per batch shape, the uint8 staging buffer; validation's input
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
        # the nominal-batch accumulation and the decay scaling follow the global batch (all ranks)
        self.cfg = _optim.OptimConfig(epochs=trainer.max_epochs_effective, batch=data.global_batch_size,
                                      nc=model.num_classes, n_train_images=self.train_loader.num_images,
                                      max_norm=trainer.gradient_clip_val or 0.0,
                                      **{k: v for k, v in hp.items() if k in _optim.OptimConfig.__dataclass_fields__})
        # freeze (Trainer): no gradient and no update for these parameters, eval-mode BatchNorm for these
        # statistics' layers; the fit's own choice, so a model frozen by an earlier fit is unfrozen here
        frozen = list(getattr(trainer, "frozen_parameters", ()))
        model.set_frozen(frozen + list(getattr(trainer, "frozen_buffers", ())))
        model.zero_grad()
        model.train()
        self.opt, self.schedule = _optim.build_optimizer(
            self.params, self.grads, self.ptable, self.cfg, trainer.num_training_batches,
            scaler=self.compute == "float16",
            bn_buffers=self.buffers, bn_table=self.btable, frozen=frozen)
        self.fixed_accumulate = trainer.accumulate_grad_batches
        data.epochs = trainer.max_epochs_effective  # close_mosaic counts back from the fit's last epoch
        model.names = data.names  # the classes it learns (predictions and weight files carry them)
        self.capture = bool(getattr(trainer, "capture_network", False)) and self.device != "cpu"
        if self.world > 1:
            self.comm = (self.dist.group.handle if self.device == "cpu"
                         else _distributed.nccl_communicator(self.dist, trainer.timeout))

    def _fill_loaders(self):
        """Fills the loaders' caches; on CUDA a second thread meanwhile makes and warms the conv plans of
        their first batch shapes (the process's first cuDNN query alone takes ~0.2 s, a cuDNN kernel's first
        launch 10-40 ms), which the first forwards of those shapes then find. The fill stays on this thread,
        where Ctrl-C reaches it."""
        loaders = [ld for ld in (self.train_loader, self.val_loader) if ld is not None]
        planner, failed = None, []
        if self.device != "cpu":
            # the training shapes, then validation's, whose no-grad forwards need forward plans alone
            shapes, taken = [], 0
            for forward_only, ld in ((False, self.train_loader), (True, self.val_loader)):
                if ld is None:
                    continue
                mine = []
                for (_, _, n), (h, w) in zip(ld.batch_slices, ld.batch_shapes):
                    shape = (int(n), int(h), int(w))
                    if n > 0 and shape not in mine and taken < PLAN_AHEAD_SHAPES:
                        mine.append(shape)
                        taken += 1
                shapes.append((mine, forward_only))

            def plan():
                try:
                    for mine, forward_only in shapes:
                        self.model.plan(mine, forward_only=forward_only)
                except Exception as exc:  # raised here, after the fill
                    failed.append(exc)
            planner = threading.Thread(target=plan, name="ptl-conv-plans")
            planner.start()
        try:
            for ld in loaders:
                ld.fill()
        finally:
            if planner is not None:
                planner.join()
        if failed:
            raise failed[0]

    # -- hyperparameters
    def model_hparams(self):
        h = {"model": self.model.model_name, "num_classes": self.model.num_classes, "cls_width": self.model.cls_width}
        if getattr(self, "cfg", None) is not None:
            h.update({k: getattr(self.cfg, k) for k in self.cfg.__dataclass_fields__})
            name, lr0, mom, wbl = _optim.choose_optimizer(self.cfg)
            h["resolved_optimizer"] = {"name": name, "lr0": lr0, "momentum": mom, "warmup_bias_lr": wbl}
        h["box"], h["cls"], h["dfl"] = self.model.loss_gains
        h["names"] = self.model.names
        return h

    # the data options a checkpoint records beyond the augmentation (a datamodule without one leaves it out)
    DATA_OPTIONS = ("rect", "single_cls", "fraction", "close_mosaic", "rect_val", "val_batch_size", "max_pixels",
                    "jpeg_scale_pixels", "allow_empty_labels", "cache_dir")

    def data_hparams(self):
        """The data's settings as hparams.yaml and checkpoints record them; resume compares them
        (ptl.checkpoint: imgsz and batch_size must match, a changed option is a ResumeWarning)."""
        d = self.data
        h = {"data": d.cfg.get("yaml"), "imgsz": d.imgsz, "batch_size": d.batch_size, "workers": d.workers,
             "cache": d.cache, "seed": d.seed, **d.hyp}
        h.update({k: getattr(d, k) for k in self.DATA_OPTIONS if hasattr(d, k)})
        if h.get("cache_dir") is not None:
            h["cache_dir"] = os.fspath(h["cache_dir"])
        return h

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
        self._counts.append(len(batch))
        o2m = o2m_weight(epoch, self.trainer.max_epochs_effective)
        if len(batch):
            targets = _C.from_numpy(np.ascontiguousarray(batch.targets, dtype=np.float32))
            losses = _C.train_step(self._plan(tuple(batch.images.shape)), batch.images, targets, o2m, due, lrs,
                                   momenta, wds, decay)
        elif due:  # no images on this rank in this step: it still takes part in the all-reduce and the update
            losses = _C.train_step(self._any_plan(), None, None, o2m, True, lrs, momenta, wds, decay)
        else:
            losses = _C.zeros((len(LOSS_NAMES),), dtype="float32")
        if due:
            if ema is not None:
                ema.updates += 1
            self.schedule.stepped(ni)
            st.global_step += 1
        st.batches_seen += 1
        return losses  # on CUDA a device tensor, read back later (one batch behind)

    def _any_plan(self):
        """A plan for a step without images (an empty shard): any shape's, else the nominal batch's."""
        if self._plans:
            return next(iter(self._plans.values()))
        h, w = self.train_loader.batch_shapes[0]
        return self._plan((self.data.batch_size, int(h), int(w), 3))

    def _plan(self, shape):
        """The fused step's arguments that stay fixed for a batch shape (B, H, W, 3) (see
        csrc/train/py_train_step.c)."""
        shape = tuple(int(v) for v in shape)
        plan = self._plans.get(shape)
        if plan is not None:
            return plan
        b, h, w, _ = shape
        na, nc = num_anchors((h, w)), self.model.num_classes
        dev = self.device
        net = self.model._exec
        staging = None if dev == "cpu" else self._staging(shape)
        grads = tuple(_C.empty((b, na, k), dtype="float32", device=dev) for k in (4, nc, 4, nc))
        ema = self.opt.ema
        plan = {"net": net, "shape": (b, h, w), "staging": staging, "grads": grads, "gains": self.model.loss_gains,
                "scale_from": (self.opt.scalars, _optim.SCALE_INDEX) if self.opt.scaler else None,
                "optim": self.opt.step_kwargs(),
                "ema": None if ema is None else [(ema.params, self.params)] + (
                    [(ema.bn, self.buffers)] if ema.bn is not None else []),
                "record": self.capture and b == self.data.batch_size, "world": self.world,
                "all_reduce_in_graph": self.capture and getattr(self.trainer, "all_reduce_in_graph", False)}
        if self.comm is not None:
            group = self.dist.group
            plan.update(comm=self.comm, bn=self.buffers, watch=None if group is None else group.watch)
        self._plans[shape] = _C.train_step_plan(plan)
        return self._plans[shape]

    def _staging(self, shape):
        """CUDA: the uint8 upload buffer for a batch shape (the fused step normalises from it into the
        network's own input)."""
        if shape not in self._uploads:
            self._uploads[shape] = _C.empty((int(np.prod(shape)),), dtype="uint8", device=self.device)
        return self._uploads[shape]

    def _input(self, shape):
        """CUDA: a network input (compute dtype) for a batch shape, for the model's own forward (validation)."""
        if shape not in self._inputs:
            self._inputs[shape] = _C.empty(shape, dtype=self.model.compute_dtype, device=self.device)
        return self._inputs[shape]

    def end_epoch(self, rows):
        """Data parallelism, at the end of an epoch's batches (every rank): ``rows`` are this rank's losses
        vectors of the epoch, one per batch. Returns None for one process; else the rows every rank gets the
        same: per step, the mean over ranks weighted by their images (in rank order, in float64). Rank 0
        also collects every rank's pending gradients for a checkpoint written before the next batch."""
        counts, self._counts = self._counts, []
        if self.world == 1:
            return None
        group = self.dist.group
        mine = {"rows": np.asarray(rows, np.float32).reshape(-1, len(LOSS_NAMES)),
                "counts": np.asarray(counts, np.int64)}
        parts = group.all_gather_arrays(mine)
        total = np.zeros(mine["rows"].shape, np.float64)
        images = np.zeros(len(counts), np.float64)
        for p in parts:
            total += p["counts"][:, None] * p["rows"].astype(np.float64)
            images += p["counts"]
        self._rank_grads = None
        if self._grads_pending():
            self._rank_grads = (self.trainer._state.batches_seen, group.gather_arrays({"grads": self.grads.numpy()}))
        return list((total / images[:, None]).astype(np.float32))

    def _grads_pending(self):
        """Whether the gradients hold micro-batches not yet stepped (the optimizer zeroes them when it steps)."""
        st = self.trainer._state
        return st.batches_seen > 0 and self.schedule.last_opt_step != st.batches_seen - 1

    def _all_rank_grads(self):
        """Every rank's pending gradients (rank 0, world > 1), as checkpoints hold them."""
        if not self._grads_pending():
            zero = np.zeros(self.grads.shape, np.dtype(self.grads.dtype))
            return [zero] * self.world
        seen, parts = self._rank_grads or (None, None)
        if seen != self.trainer._state.batches_seen or parts is None:
            raise RuntimeError("save_checkpoint: a checkpoint of a data-parallel fit holds every rank's pending "
                               "gradients, which rank 0 collects at the end of each epoch (and which are zero right "
                               "after an optimizer step); save at an epoch end (on_train_epoch_end, "
                               "on_validation_end) or after an optimizer step")
        return [p["grads"] for p in parts]

    def _images(self, batch):
        """The batch's images as the model takes them: the uint8 array on the CPU; on CUDA a device tensor
        in the compute dtype, uploaded and normalised asynchronously into a buffer kept per shape."""
        if self.device == "cpu":
            return batch.images
        shape = tuple(batch.images.shape)
        dst = self._input(shape)
        batch.upload(dst, self._staging(shape))
        return dst

    # -- validation on the EMA weights
    def _eval_weights(self):
        """The model's executor pointed at the EMA's weights (ARCHITECTURE.md §3: no second network, and
        the training recording survives), or at the model's own when there is no EMA."""
        ema = self.opt.ema if self.opt is not None else None
        if ema is None:
            return contextlib.nullcontext(self.model)
        return self.model.using_weights(ema.params, ema.bn if ema.bn is not None else self.buffers)

    def ema_detector(self):
        """A new CPU Detector holding the EMA's weights (what validation inside the fit runs on)."""
        from .model import Detector
        det = Detector(self.model.model_name, num_classes=self.model.num_classes, hparams=self.model.hparams,
                       cls_width=self.model.cls_width)
        ema = self.opt.ema
        det.flat_parameters = ema.params
        det.flat_buffers = ema.bn if ema.bn is not None else self.buffers
        return det

    # -- what a fit leaves behind: the EMA weights (those validation measured)
    def ema_state_dict(self):
        """name -> array of the weights validation uses: the EMA's parameters and BN statistics (the model's
        own weights when the fit keeps no EMA)."""
        ema = self.opt.ema if self.opt is not None else None
        if ema is None:
            return self.model.state_dict()
        out = {}
        for flat, table in ((ema.params, self.ptable), (ema.bn, self.btable if ema.bn is not None else ())):
            arr = flat.numpy() if isinstance(flat, _C.Tensor) else np.asarray(flat)
            for name, off, shape in table:
                out[name] = arr[off:off + int(np.prod(shape))].reshape(shape).copy()
        return {k: out[k] if k in out else v for k, v in self.model.state_dict().items()}

    def ema_state_from(self, tensors):
        """ema_state_dict() read from state_tensors() taken at the same moment (they hold the same arrays)."""
        src = "ema." if self.opt is not None and self.opt.ema is not None else "model."
        return {k: tensors[src + k] if src + k in tensors else tensors["model." + k]
                for k, *_ in self.model._entries}

    def adopt_ema(self):
        """Copies the EMA weights into the model (as Ultralytics' final model is its EMA)."""
        ema = self.opt.ema if self.opt is not None else None
        if ema is None:
            return
        self.model.flat_parameters = ema.params
        if ema.bn is not None:
            self.model.flat_buffers = ema.bn

    def validate(self, trainer):
        with self._eval_weights() as model:
            return self._validate(trainer, model)

    def _validate(self, trainer, model):
        was = model.training
        model.eval()
        names = self.data.names
        met = _metrics.DetectionMetrics(names)
        # with several ranks each validates the batches dealt to it, keyed by their place in the
        # single-process order (global batch index; image: batch index * batch size + position)
        loss_keys, loss_rows, image_keys = [], [], []
        limit = _limit(trainer.limit_val_batches, self.val_loader.num_global_batches, "limit_val_batches")
        try:
            with model.no_grad():  # validation keeps nothing for a backward
                for j, batch in enumerate(self.val_loader):
                    if batch.batch >= limit:
                        break
                    trainer._call("on_validation_batch_start", batch, j)
                    out = model.forward(self._images(batch))
                    h, w = batch.images.shape[1:3]
                    res = _objective((*out["one2many"], *out["one2one"]), batch.targets, img_size=(h, w),
                                     num_classes=self.model.num_classes, o2m_weight=0.8,
                                     gains=self.model.loss_gains)
                    loss_keys.append(batch.batch)
                    loss_rows.append(np.asarray(res["losses"])[ITEM])
                    image_keys += [batch.batch * self.data.val_batch_size + k for k in range(len(batch))]
                    # 8.4.190's default (nms=None): the one-to-many head with NMS; end2end: the one-to-one top-k
                    head = out["one2one" if trainer.end2end else "one2many"]
                    dets = _metrics.postprocess(head[0], head[1], (h, w), conf=0.001, end2end=trainer.end2end)
                    _update_metrics(met, dets, batch, h, w)
                    trainer._call("on_validation_batch_end", dets, batch, j)  # outputs: the detections per image
        finally:
            model.train(was)
        rows = np.asarray(loss_rows, np.float32).reshape(-1, 3)
        if self.world > 1:
            met = _distributed.gather_metrics(self.dist.group, met, image_keys)
            _, rows = _distributed.gather_rows(self.dist.group, loss_keys, rows)
        loss_sum = np.zeros(3)
        for row in rows:  # in batch order, as one process adds them
            loss_sum += row
        r = met.compute()
        mean = loss_sum / max(len(rows), 1)
        logged = {"val/box_loss": mean[0], "val/cls_loss": mean[1], "val/l1_loss": mean[2],
                  "metrics/precision": r["precision"], "metrics/recall": r["recall"], "metrics/mAP50": r["mAP50"],
                  "metrics/mAP50-95": r["mAP50-95"], "fitness": r["fitness"]}
        self.last_results = r  # per-class results, curves, confusion matrix of the last validation
        return {"logged": {k: float(v) for k, v in logged.items()}, "ap_per_class": r.get("ap_per_class", {})}

    # -- state
    def state_tensors(self):
        t = {"model." + k: v for k, v in self.model.state_dict().items()}
        t.update({"optim." + k: v for k, v in self.opt.state_dict(ema=False).items()})
        if self.opt.ema is not None:  # once, as "ema.*" (weights files and predict read it there)
            t.update(self.opt.ema.state_dict(self.opt.specs, self.opt.bn_specs))
        t.update(self.schedule.state_dict())
        if self.world == 1:
            t["trainer.grads"] = self.grads.numpy()
        else:  # rank r's pending gradients as trainer.grads.rank<r> (rank 0's as trainer.grads)
            for r, g in enumerate(self._all_rank_grads()):
                t["trainer.grads" + (".rank%d" % r if r else "")] = g
        return t

    def load_state_tensors(self, t, batches_seen=0):
        def strip(prefix):
            return {k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}
        self.model.load_state_dict(strip("model."), strict=True)
        self.opt.load_state_dict(strip("optim."), ema=False)
        if self.opt.ema is not None:
            self.opt.ema.load_state_dict({k: v for k, v in t.items() if k.startswith("ema.")}, self.opt.specs,
                                         self.opt.bn_specs)
        self.schedule.load_state_dict(t)
        names = ["trainer.grads" + (".rank%d" % r if r else "") for r in range(self.world)]
        self.model.flat_gradients = np.asarray(t[names[self.rank]], np.float32).reshape(-1)
        if self.world > 1 and self.rank == 0:  # what a checkpoint written before the next batch holds
            self._rank_grads = (batches_seen, [{"grads": np.asarray(t[n], np.float32).reshape(-1)} for n in names])

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
        if self.capture:
            self.model.retire()  # a fit's recording ends with it (its graphs' memory goes back)
        self._plans.clear()
        if self.comm is not None and self.device != "cpu":
            self.comm.close()  # the fit's NCCL communicator (the host group is the job's)
        self.comm = None
        for name in ("train_loader", "val_loader"):
            loader = getattr(self, name, None)
            close = getattr(loader, "close", None)
            if close is not None:
                close()


def _update_metrics(met, dets, batch, h, w):
    """Adds one batch's detections and ground truth, both in the network input's pixels (8.4.190 matches
    there, not in the original images)."""
    targets = np.asarray(batch.targets, np.float32).reshape(-1, 6)
    for k, det in enumerate(dets):
        rows = targets[targets[:, 0] == k]
        gt = _metrics.target_boxes(rows[:, 2:6], (h, w))
        met.update(det[:, :4], det[:, 4], det[:, 5].astype(np.int64), gt, rows[:, 1].astype(np.int64))
