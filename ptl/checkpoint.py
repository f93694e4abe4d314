"""Training checkpoints: one ``.safetensors`` file holding the model (``model.*``), the EMA (``ema.*``),
the optimizer state (``optim.*``), the schedule, the accumulated gradients (``trainer.grads``; a
data-parallel fit's rank ``r > 0`` as ``trainer.grads.rank<r>``), the loss history, and a JSON header of
trainer state (epoch, step, RNG offsets, callback states, hyperparameters, planned epochs, world size) in
the metadata key ``ptl.trainer``. Written atomically (a crash leaves any previous file); a data-parallel
fit's rank 0 writes it, and it resumes with the same number of ranks only.

Resuming validates before it changes anything: :func:`read` reads the whole file and checks the header,
:func:`check_model` and :func:`plan_resume` compare it with the model and data about to be fitted,
:func:`restore` checks every tensor's name, shape and dtype against the live run and only then writes
the model, optimizer, EMA and trainer state. Every failure is a :class:`ptl.errors.CheckpointError`
naming the file (and the tensor), and leaves all live state as it was.
"""
import functools
import json
import math
import os
import warnings

import numpy as np

from . import io
from . import random as _random
from .errors import CheckpointError, ConfigError, ResumeWarning
from .objective import LOSS_NAMES

CKPT_VERSION = 1
HEADER_KEY = "ptl.trainer"
_FLOAT_DTYPES = ("F32", "F64", "F16", "BF16")
# settings that change what the rest of a resumed fit computes (batch size and image size are errors)
_MODEL_SETTINGS = ("optimizer", "lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum",
                   "warmup_bias_lr", "nbs", "cos_lr", "ema_decay", "ema_tau", "box", "cls", "dfl")
_TRAINER_SETTINGS = ("precision", "accumulate_grad_batches", "gradient_clip_val", "limit_train_batches", "end2end",
                     "freeze")
# the data settings that change the batches (the cache, its folder and the workers do not)
_DATA_SETTINGS = ("seed", "mosaic", "degrees", "translate", "scale", "shear", "perspective", "hsv_h", "hsv_s",
                  "hsv_v", "flipud", "fliplr", "rect", "single_cls", "fraction", "close_mosaic", "max_pixels",
                  "jpeg_scale_pixels")


class Checkpoint:
    """A checkpoint file read whole: ``header`` (the trainer state) and ``tensors`` (name -> array)."""

    def __init__(self, path, header, tensors):
        self.path, self.header, self.tensors = path, header, tensors

    @property
    def epochs_done(self):
        return self.header["epoch"]

    @property
    def epochs_planned(self):
        """The max_epochs of the run that wrote it (older files: from its optimizer settings)."""
        planned = self.header.get("max_epochs")
        if planned is None:
            planned = self.header.get("hparams", {}).get("model", {}).get("epochs")
        return planned


def snapshot(trainer, path, tensors=None):
    """Takes ``trainer``'s full training state now (copies) and returns the job that writes it to ``path``
    (atomically), which may run later and on another thread. ``tensors``: the engine's state_tensors() taken
    at this moment already (one copy for several files), which the job then writes as they are."""
    eng, st = trainer._engine, trainer._state
    tensors = dict(eng.state_tensors() if tensors is None else tensors)
    broken = [k for k, v in tensors.items() if k.startswith(("model.", "ema.")) and np.asarray(v).dtype.kind == "f"
              and not np.isfinite(v).all()]
    if broken:  # the epoch's last update, which no loss has seen yet, broke the weights
        trainer._diverged(*trainer._last_batch, tensors=broken)
    tensors["trainer.losses"] = np.asarray(trainer.loss_history, np.float32).reshape(-1, len(LOSS_NAMES))
    header = {"version": CKPT_VERSION, "epoch": st.epoch, "global_step": st.global_step,
              "batches_seen": st.batches_seen, "max_epochs": trainer.max_epochs_effective,
              "world_size": trainer.world_size,
              "rng": list(_random.default_generator.get_state()),
              "hparams": jsonable(trainer.hparams()), "callbacks": {}, "val_history": jsonable(
                  [r["logged"] for r in trainer.val_history]), "epoch_rows": jsonable(trainer._epoch_rows)}
    for c in trainer.callbacks:
        header["callbacks"][c.state_key] = jsonable(c.state_dict())
    checkpoint = {"header": header, "tensors": tensors}
    trainer._call("on_save_checkpoint", checkpoint)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    metadata = {HEADER_KEY: json.dumps(checkpoint["header"])}
    return functools.partial(io.save_safetensors, path, checkpoint["tensors"], metadata=metadata)


# ------------------------------------------------------------------------------------------- reading
def read(path):
    """Reads the whole checkpoint at ``path`` and checks its header; returns a :class:`Checkpoint`.
    Raises CheckpointError naming the file when it is missing, damaged or not a ptl training checkpoint."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise CheckpointError("ckpt_path: expected a file path, got %r" % (path,)) from None
    if not os.path.exists(path):
        raise CheckpointError("ckpt_path: %s does not exist" % path)
    if not os.path.isfile(path):
        raise CheckpointError("ckpt_path: %s is not a file" % path)
    try:
        tensors, meta = io.load_safetensors(path)
    except ValueError as e:
        raise CheckpointError("ckpt_path: %s" % e) from None
    except OSError as e:
        raise CheckpointError("ckpt_path: cannot read %s: %s" % (path, e.strerror or e)) from None
    if HEADER_KEY not in meta:
        raise CheckpointError("ckpt_path: %s is not a ptl training checkpoint (no '%s' metadata)%s"
                              % (path, HEADER_KEY, _what_it_holds(tensors, meta)))
    try:
        header = json.loads(meta[HEADER_KEY])
    except ValueError as e:
        raise CheckpointError("ckpt_path: %s has a damaged trainer header ('%s' is not JSON: %s)"
                              % (path, HEADER_KEY, e)) from None
    _check_header(path, header)
    if "ema.updates" in tensors:  # files written before 2026-12-03 also hold the EMA as optim.ema.*: a copy
        tensors = {k: v for k, v in tensors.items() if not k.startswith("optim.ema.")}
    return Checkpoint(path, header, tensors)


def _what_it_holds(tensors, meta):
    if "model" in meta and any(k.startswith("model.") for k in tensors):
        return "; it is a model file (%s, %s classes): start a new fit from it with Detector.load" % (
            meta["model"], meta.get("num_classes", "?"))
    names = sorted(tensors)
    shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
    return "; it holds %d tensors (%s)" % (len(names), shown) if names else "; it holds no tensors"


def _is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_header(path, h):
    def bad(what):
        raise CheckpointError("ckpt_path: %s has a damaged trainer header: %s" % (path, what))
    if not isinstance(h, dict):
        bad("expected a JSON object")
    if h.get("version") != CKPT_VERSION:
        raise CheckpointError("ckpt_path: %s has checkpoint version %r, this ptl reads version %d"
                              % (path, h.get("version"), CKPT_VERSION))
    for key in ("epoch", "global_step", "batches_seen"):
        if not _is_count(h.get(key)):
            bad("%s must be an int >= 0, got %r" % (key, h.get(key)))
    for key in ("max_epochs", "world_size"):
        if key in h and not (_is_count(h[key]) and h[key] >= 1):
            bad("%s must be an int >= 1, got %r" % (key, h[key]))
    rng = h.get("rng")
    if not (isinstance(rng, list) and len(rng) == 2 and all(_is_count(v) for v in rng)):
        bad("rng must be [seed, offset], got %r" % (rng,))
    for key, kind in (("hparams", dict), ("callbacks", dict), ("val_history", list), ("epoch_rows", list)):
        if not isinstance(h.get(key, kind()), kind):
            bad("%s must be a JSON %s" % (key, "object" if kind is dict else "array"))
    for section in ("trainer", "model", "data"):
        if not isinstance(h.get("hparams", {}).get(section, {}), dict):
            bad("hparams.%s must be a JSON object" % section)
    if not all(isinstance(v, dict) for v in h.get("callbacks", {}).values()):
        bad("every callback state must be a JSON object")
    if not all(isinstance(v, dict) for v in h.get("val_history", []) + h.get("epoch_rows", [])):
        bad("val_history and epoch_rows must hold JSON objects")


# ------------------------------------------------------------------------------- checks against a fit
def _model_desc(name, nc):
    return "%s with %s classes" % (name, nc)


def check_model(ck, model):
    """The checkpoint holds ``model``'s architecture: its scale, class count and class-branch width (from its
    hparams) and every ``model.*`` tensor's name, shape and dtype. A short message says which model the file holds."""
    hp = ck.header.get("hparams", {}).get("model", {})
    live = _model_desc(model.model_name, model.num_classes)
    if "model" in hp and "num_classes" in hp and (hp["model"], hp["num_classes"]) != (model.model_name,
                                                                                     model.num_classes):
        raise CheckpointError("ckpt_path: %s holds a %s (from its hparams), but the model to fit is a %s: build "
                              "ptl.Detector(%r, num_classes=%s) to resume it"
                              % (ck.path, _model_desc(hp["model"], hp["num_classes"]), live, hp["model"],
                                 hp["num_classes"]))
    width = hp.get("cls_width")
    if width is not None and width != model.cls_width:  # a model built from weights keeps their branch width
        raise CheckpointError("ckpt_path: %s holds a class branch %s wide (from its hparams), but the model to fit has "
                              "%d: build ptl.Detector(%r, num_classes=%s, cls_width=%s) to resume it"
                              % (ck.path, width, model.cls_width, model.model_name, model.num_classes, width))
    found = {k[len("model."):]: v for k, v in ck.tensors.items() if k.startswith("model.")}
    check_model_tensors("ckpt_path: " + ck.path, found, model, error=CheckpointError, prefix="model.")


def check_model_tensors(source, tensors, model, error=ConfigError, prefix=""):
    """Checks a state dict read from a file (``source`` names it) against ``model`` before anything is
    loaded: every parameter and BatchNorm buffer present with its shape and a floating dtype, no other
    names (``*.num_batches_tracked`` is ignored, as ``Detector.load_state_dict`` ignores it). Raises
    ``error`` with a short message naming the first bad tensors (as ``prefix + name``: their names in
    the file)."""
    expected = {prefix + n: (shape, _FLOAT_DTYPES) for n, _, shape in model.parameter_table() + model.buffer_table()}
    found = {prefix + k: v for k, v in tensors.items() if not k.endswith(".num_batches_tracked")}
    problems = mismatches(found, expected)
    if problems:
        raise error("%s does not hold a %s: %s" % (source, _model_desc(model.model_name, model.num_classes),
                                                   summary(problems, found, expected)))


def plan_resume(ck, trainer, datamodule):
    """Checks the fit's batch size and image size against the checkpoint's, and says what resuming
    will do. Returns False when nothing is left to train (after a ResumeWarning saying so)."""
    world = ck.header.get("world_size", 1)
    if world != trainer.world_size:
        raise CheckpointError("ckpt_path: %s was written by a fit on %d rank%s but this fit has %d: resume it with "
                              "%d ranks (it holds each rank's pending gradients, and the data's shards follow the "
                              "world size), or start a new fit from its weights"
                              % (ck.path, world, "" if world == 1 else "s", trainer.world_size, world))
    data_hp = ck.header.get("hparams", {}).get("data", {})
    for key, live in (("batch_size", datamodule.batch_size), ("imgsz", datamodule.imgsz)):
        if key in data_hp and data_hp[key] != live:
            raise CheckpointError("ckpt_path: %s was trained with %s=%s but this fit has %s=%s; resume with the "
                                  "same batch size and image size, or start a new fit from its weights"
                                  % (ck.path, key, data_hp[key], key, live))
    done, planned, wanted = ck.epochs_done, ck.epochs_planned, trainer.max_epochs_effective
    if done >= wanted:
        warnings.warn("ckpt_path: %s has finished %d epoch%s and this fit asks for %d (max_epochs): nothing "
                      "to train" % (ck.path, done, "" if done == 1 else "s", wanted), ResumeWarning, stacklevel=3)
        return False
    if planned is not None and planned != wanted:
        warnings.warn("ckpt_path: %s comes from a run planned for %d epoch(s); resuming it for %d changes the "
                      "learning-rate schedule, close_mosaic and the o2m/o2o weights from epoch %d on, so the "
                      "result will differ from an uninterrupted %d-epoch run"
                      % (ck.path, planned, wanted, done + 1, wanted), ResumeWarning, stacklevel=3)
    return True


def _changed_settings(ck, trainer):
    old = ck.header.get("hparams", {})
    new = trainer.hparams()
    changed = []
    for section, keys in (("model", _MODEL_SETTINGS), ("trainer", _TRAINER_SETTINGS), ("data", _DATA_SETTINGS)):
        o, n = old.get(section, {}), jsonable(new.get(section, {}))
        changed += ["%s %r -> %r" % (k, o[k], n[k]) for k in keys if k in o and k in n and o[k] != n[k]]
    return changed


def _same_kind(dtype):
    """The dtypes a checkpoint may hold where the live run has ``dtype``: its own first, and the other
    width of the same kind (a float64 network's checkpoint in a float32 run, and back), which load
    converts; never another kind (a float relabelled as an int is garbage)."""
    for kind in (("F32", "F64"), ("I64", "I32")):
        if dtype in kind:
            return (dtype,) + tuple(d for d in kind if d != dtype)
    return (dtype,)


def restore(trainer, ck):
    """Loads a checkpoint read by :func:`read` into ``trainer`` (its engine already built): every tensor
    is checked against the live run first, then callbacks, tensors and trainer state are loaded."""
    eng = trainer._engine
    expected = {k: (tuple(np.shape(v)), _same_kind(io.safetensors_dtype_name(v)))
                for k, v in eng.state_tensors().items()}
    expected["trainer.losses"] = ((None, len(LOSS_NAMES)), ("F32",))
    problems = mismatches(ck.tensors, expected)
    losses = ck.tensors.get("trainer.losses")
    if not problems and losses.shape[0] > ck.header["batches_seen"]:
        problems = [("trainer.losses", "has %d rows, more than the %d batches seen"
                     % (losses.shape[0], ck.header["batches_seen"]))]
    if problems:
        raise CheckpointError("ckpt_path: %s does not fit this run: %s" % (ck.path, summary(problems, ck.tensors,
                                                                                           expected)))
    changed = _changed_settings(ck, trainer)
    if changed:
        warnings.warn("ckpt_path: resuming %s with changed settings (%s): the result will differ from an "
                      "uninterrupted run" % (ck.path, ", ".join(changed)), ResumeWarning,
                      stacklevel=5)  # Trainer.fit's caller
    header, tensors = ck.header, ck.tensors
    checkpoint = {"header": header, "tensors": tensors}
    trainer._call("on_load_checkpoint", checkpoint)
    for c in trainer.callbacks:  # before any tensor: a state a callback refuses leaves the run untouched
        state = header.get("callbacks", {}).get(c.state_key)
        if state is not None:
            try:
                c.load_state_dict(state)
            except (ValueError, TypeError, KeyError) as e:
                raise CheckpointError("ckpt_path: %s: the %s state does not load: %s" % (ck.path, c.state_key, e)) \
                    from None
    eng.load_state_tensors(tensors, header["batches_seen"])
    st = trainer._state
    st.epoch, st.global_step, st.batches_seen = header["epoch"], header["global_step"], header["batches_seen"]
    _random.default_generator.set_state(header["rng"])
    trainer.loss_history = [row for row in np.asarray(tensors["trainer.losses"], np.float32)]
    trainer.val_history = [{"logged": r} for r in header.get("val_history", [])]
    trainer._epoch_rows = header.get("epoch_rows", [])
    trainer.current_epoch_completed = st.epoch


# ------------------------------------------------------------------------------- tensor comparisons
def mismatches(found, expected):
    """[(name, problem)] of ``found`` ({name: array or (bits, "BF16")}) against ``expected``
    ({name: (shape, allowed dtype names)}; None in a shape matches any size): missing and unexpected
    names, wrong dtypes and shapes."""
    problems = [(k, "is missing") for k in expected if k not in found]
    problems += [(k, "is not expected") for k in found if k not in expected]
    for k, (shape, dtypes) in expected.items():
        if k not in found:
            continue
        v = found[k]
        got_dtype = io.safetensors_dtype_name(v)
        got_shape = tuple(np.shape(v[0] if isinstance(v, tuple) else v))
        if got_dtype not in dtypes:
            problems.append((k, "has dtype %s, expected %s" % (
                got_dtype, dtypes[0] if len(dtypes) == 1 else "%s (or %s)" % (dtypes[0], ", ".join(dtypes[1:])))))
        elif len(got_shape) != len(shape) or any(s is not None and s != g for s, g in zip(shape, got_shape)):
            problems.append((k, "has shape %s, expected %s" % (
                _shape(got_shape), _shape(tuple("N" if s is None else s for s in shape)))))
    return problems


def _shape(s):
    return "(" + ", ".join(str(d) for d in s) + ("," if len(s) == 1 else "") + ")"


def summary(problems, found, expected, limit=3):
    """A short account of ``problems``: the counts when many names differ, then the first few."""
    missing = sum(1 for _, p in problems if p == "is missing")
    unexpected = sum(1 for _, p in problems if p == "is not expected")
    reshaped = sum(1 for _, p in problems if p.startswith("has shape"))
    head = ""
    if missing + unexpected > limit:
        common = len(set(found) & set(expected))
        head = "%d of its %d tensors match the %d expected names (%d missing, %d not expected); " % (
            common, len(found), len(expected), missing, unexpected)
    elif reshaped > limit:
        head = "%d of the %d tensors have other shapes (another scale or class count?); " % (reshaped, len(expected))
    shown = "; ".join("tensor '%s' %s" % (k, p) for k, p in problems[:limit])
    more = " (and %d more)" % (len(problems) - limit) if len(problems) > limit else ""
    return head + shown + more


def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else str(v)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    return obj
