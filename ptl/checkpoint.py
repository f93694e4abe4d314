"""Training checkpoints: one ``.safetensors`` file holding the model (``model.*``), the EMA (``ema.*``),
the optimizer state (``optim.*``), the schedule, the accumulated gradients, the loss history, and a JSON
header of trainer state (epoch, step, RNG offsets, callback states, hyperparameters) in the metadata
key ``ptl.trainer``. Written atomically (a crash leaves any previous file); ``restore`` continues a fit
bit-exactly."""
import json
import math
import os

import numpy as np

from . import io
from . import random as _random
from .objective import LOSS_NAMES

CKPT_VERSION = 1


def save(trainer, path):
    """Writes ``trainer``'s full training state to ``path``."""
    eng, st = trainer._engine, trainer._state
    tensors = eng.state_tensors()
    tensors["trainer.losses"] = np.asarray(trainer.loss_history, np.float32).reshape(-1, len(LOSS_NAMES))
    header = {"version": CKPT_VERSION, "epoch": st.epoch, "global_step": st.global_step,
              "batches_seen": st.batches_seen, "rng": list(_random.default_generator.get_state()),
              "hparams": jsonable(trainer.hparams()), "callbacks": {}, "val_history": jsonable(
                  [r["logged"] for r in trainer.val_history]), "epoch_rows": jsonable(trainer._epoch_rows)}
    for c in trainer.callbacks:
        header["callbacks"][c.state_key] = jsonable(c.state_dict())
    checkpoint = {"header": header, "tensors": tensors}
    trainer._call("on_save_checkpoint", checkpoint)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    io.save_safetensors(path, checkpoint["tensors"], metadata={"ptl.trainer": json.dumps(checkpoint["header"])})


def restore(trainer, path):
    """Loads a checkpoint written by :func:`save` into ``trainer`` (its engine already built)."""
    tensors, meta = io.load_safetensors(path)
    if not meta or "ptl.trainer" not in meta:
        raise ValueError("ckpt_path: %s is not a ptl training checkpoint (no 'ptl.trainer' metadata)" % path)
    header = json.loads(meta["ptl.trainer"])
    if header.get("version") != CKPT_VERSION:
        raise ValueError("ckpt_path: %s has checkpoint version %r, expected %d" % (path, header.get("version"),
                                                                                   CKPT_VERSION))
    checkpoint = {"header": header, "tensors": tensors}
    trainer._call("on_load_checkpoint", checkpoint)
    trainer._engine.load_state_tensors(tensors)
    st = trainer._state
    st.epoch, st.global_step, st.batches_seen = header["epoch"], header["global_step"], header["batches_seen"]
    _random.default_generator.set_state(header["rng"])
    trainer.loss_history = [row for row in np.asarray(tensors["trainer.losses"], np.float32)]
    trainer.val_history = [{"logged": r} for r in header.get("val_history", [])]
    trainer._epoch_rows = header.get("epoch_rows", [])
    trainer.current_epoch_completed = st.epoch
    for c in trainer.callbacks:
        if c.state_key in header["callbacks"]:
            c.load_state_dict(header["callbacks"][c.state_key])


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

