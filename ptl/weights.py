"""Weight files a :class:`ptl.Detector` starts from, and the name-and-shape transfer between models.

:func:`read_weights` reads any of:

- an Ultralytics ``.pt`` checkpoint (``ptl.ultralytics_pt``: no torch, nothing in the pickle runs),
  its ``ema`` entry when present, else ``model``;
- a weights-only ``.safetensors`` (``Detector.save``, ``<run>/weights/best.safetensors``);
- a full ptl training checkpoint (``.ckpt``, a ``.safetensors`` with ``ptl.trainer`` metadata): its EMA
  weights, the ones validation measured (the raw ``model.*`` weights when it holds no EMA).

:func:`plan_transfer` matches a state dict against a model's tensor table the way Ultralytics'
``intersect_dicts`` does: a tensor is copied when its name and shape match; every other one is
listed. Counts follow Ultralytics' ``Transferred a/b items`` line, whose totals include each
BatchNorm's ``num_batches_tracked`` counter (ptl does not store it, spec §1.1): a counter counts as
transferred when the source holds it, or, for ptl files (which never do), when the source has that
BatchNorm (a counter is a scalar, so its shape always matches, as in Ultralytics' count).
"""
import json
import os
import sys

import numpy as np

__all__ = ["WeightsFile", "read_weights", "write_weights", "Transfer", "plan_transfer"]

_NBT = ".num_batches_tracked"


class WeightsFile:
    """``tensors`` (name -> array), ``scale`` (or None), ``num_classes`` (or None), ``names`` (list or
    None), ``kind`` ("ultralytics", "weights file", "training checkpoint") and ``path``."""

    def __init__(self, path, kind, tensors, scale=None, num_classes=None, names=None):
        self.path, self.kind, self.tensors = path, kind, tensors
        self.scale, self.num_classes, self.names = scale, num_classes, names

    @property
    def model_name(self):
        return None if self.scale is None else "yolo26" + self.scale


def _scale(model):
    s = str(model or "")
    return s[-1] if s.startswith("yolo26") and len(s) == 7 else None


def write_weights(path, tensors, model_name, num_classes, names):
    """A weights-only ``.safetensors`` (atomic): the tensors plus ``model``, ``num_classes`` and ``names``
    (JSON) metadata, which :func:`read_weights` and ``Detector.load`` read back."""
    from . import io
    io.save_safetensors(path, tensors, metadata={"model": model_name, "num_classes": str(int(num_classes)),
                                                 "names": json.dumps(list(names))})


def read_weights(path):
    """Reads a weight file (see the module doc); raises ValueError naming the file when it is none."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError("weights %s do not exist" % path)
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:2] == b"PK" or path.endswith(".pt") or path.endswith(".pth"):
        from . import ultralytics_pt
        ck = ultralytics_pt.load_ultralytics(path)
        return WeightsFile(path, "ultralytics", ck.state_dict, ck.scale, ck.num_classes, ck.names)
    from . import io
    try:
        tensors, meta = io.load_safetensors(path)
    except ValueError as e:
        raise ValueError("%s: neither an Ultralytics .pt nor a .safetensors weight file (%s)" % (path, e)) from None
    meta = meta or {}
    if "ptl.trainer" in meta:
        header = json.loads(meta["ptl.trainer"])
        hp = (header.get("hparams") or {}).get("model") or {}
        prefix = "ema." if any(k.startswith("ema.model.") for k in tensors) else "model."
        picked = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix) and k != "ema.updates"}
        return WeightsFile(path, "training checkpoint", picked, _scale(hp.get("model")), hp.get("num_classes"),
                           hp.get("names"))
    names = json.loads(meta["names"]) if "names" in meta else None
    nc = int(meta["num_classes"]) if "num_classes" in meta else None
    return WeightsFile(path, "weights file", tensors, _scale(meta.get("model")), nc, names)


class Transfer:
    """The outcome of matching a state dict against a model (:func:`plan_transfer`).

    ``arrays``: name -> array to copy (name and shape match); ``mismatched``: [(name, source shape,
    model shape)]; ``missing``: model tensors the source lacks (they keep their values);
    ``unexpected``: source tensors the model lacks; ``transferred`` / ``total``: Ultralytics' counts."""

    def __init__(self, source, arrays, mismatched, missing, unexpected, transferred, total):
        self.source, self.arrays = source, arrays
        self.mismatched, self.missing, self.unexpected = mismatched, missing, unexpected
        self.transferred, self.total = transferred, total

    @property
    def complete(self):
        return not (self.mismatched or self.missing or self.unexpected)

    def summary(self):
        """``Transferred a/b items from <source>`` plus one line per kind of tensor left out."""
        lines = ["Transferred %d/%d items from %s" % (self.transferred, self.total, self.source)]
        if self.mismatched:
            lines.append("  %d tensors of another shape keep the model's initialisation:" % len(self.mismatched))
            lines += ["    %s %s in the source, %s here" % m for m in self.mismatched]
        if self.missing:
            lines.append("  %d tensors the source lacks keep the model's values:" % len(self.missing))
            lines += ["    " + k for k in self.missing]
        if self.unexpected:
            lines.append("  %d source tensors the model lacks are ignored:" % len(self.unexpected))
            lines += ["    " + k for k in self.unexpected]
        return "\n".join(lines)

    def report(self, stream=None):
        print(self.summary(), file=stream if stream is not None else sys.stderr)

    def __repr__(self):
        return "Transfer(%d/%d from %s)" % (self.transferred, self.total, self.source)


def _as_array(k, v):
    if isinstance(v, tuple) and len(v) == 2 and v[1] == "BF16":  # ptl.io's bfloat16 form
        from .io import bf16_to_float32
        v = bf16_to_float32(v[0])
    a = np.asarray(v.numpy() if hasattr(v, "numpy") and not isinstance(v, np.ndarray) else v)
    if not np.issubdtype(a.dtype, np.floating):  # weights and BN statistics: an int tensor is a mislabelled file
        raise ValueError("load_state_dict: %s: dtype %s is not a floating-point type" % (k, a.dtype))
    return a


def plan_transfer(index, state, source="state_dict"):
    """Matches ``state`` (name -> array) against ``index`` (name -> (is_buffer, offset, shape)), checking
    everything and writing nothing. Raises ValueError for a value that is not floating-point."""
    counters = {k[:-len("running_mean")] + "num_batches_tracked" for k in index if k.endswith(".running_mean")}
    arrays, mismatched, unexpected = {}, [], []
    given_counters = set()
    for k, v in dict(state).items():
        if k.endswith(_NBT):
            if k in counters:
                given_counters.add(k)
            else:
                unexpected.append(k)
            continue
        if k not in index:
            unexpected.append(k)
            continue
        a = _as_array(k, v)
        shape = index[k][2]
        if tuple(a.shape) != shape:
            mismatched.append((k, tuple(a.shape), shape))
            continue
        arrays[k] = a
    missing = [k for k in index if k not in arrays and k not in {m[0] for m in mismatched}]
    if given_counters:
        nbt = len(given_counters)
    else:  # a ptl file: the counter Ultralytics' file would hold for each of its BatchNorms (always shape ())
        nbt = sum(1 for c in counters if c[:-len("num_batches_tracked")] + "running_mean" in state)
    return Transfer(source, arrays, mismatched, missing, unexpected, len(arrays) + nbt, len(index) + len(counters))
