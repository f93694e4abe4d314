"""Weight files a :class:`ptl.Detector` starts from, and the transfer between models (Ultralytics 8.4.190's
``BaseModel.load``).

:func:`read_weights` reads any of:

- an Ultralytics ``.pt`` checkpoint (``ptl.ultralytics_pt``: no torch, nothing in the pickle runs),
  its ``ema`` entry when present, else ``model``;
- a weights-only ``.safetensors`` (``Detector.save``, ``<run>/weights/best.safetensors``);
- a full ptl training checkpoint (``.ckpt``, a ``.safetensors`` with ``ptl.trainer`` metadata): its EMA
  weights, the ones validation measured (the raw ``model.*`` weights when it holds no EMA).

:func:`plan_transfer` matches a state dict against a model's tensor table as 8.4.190 does. First the
rows of the final class convs (``model.23.cv3.{i}.2.*``, ``model.23.one2one_cv3.{i}.2.*``) are remapped by
class name (``_remap_cls_by_names``): a class of the model whose name (stripped, case-insensitive) is
one of the source's takes that class's row; nothing is remapped when either side has placeholder names
("0", "1", ...), when no name matches, or when the names match in the same order and count (then the
plain copy below does it); a weight whose input width differs (another scale) is left to the plain copy
(which cannot copy it either), while its bias, one value per class, is remapped. Then every other tensor whose name and shape match is copied (``intersect_dicts``) and every
other one is listed. Counts follow Ultralytics' ``Transferred a/b items`` line: remapped tensors count
as transferred, and the totals include each BatchNorm's ``num_batches_tracked`` counter (ptl does not
store it, spec §1.1): a counter counts as transferred when the source holds it, or, for ptl files
(which never do), when the source has that BatchNorm (a counter is a scalar, so its shape always
matches, as in Ultralytics' count). Last, as 8.4.190 does, a first conv (``model.0.conv.weight``) of
another shape but the same kernel size takes the source's leading filters over the leading input
channels (a one-channel side the sum over channels) and counts as transferred: between scales (e.g.
yolo26s into yolo26n, 16 of 32 filters) this is what happens; a source of another input channel
count would take the same path, though ptl's input is always RGB.

:func:`transfer_width` is 8.4.190's other step: the Detect head's class branch is
``max(ch0, min(nc, 100))`` wide (spec §1.5), so when the head's input widths match the source's (the
same scale), the new model is built with the source's class-branch width (``Detector(cls_width=)``) and
every hidden tensor of that branch transfers; only the final class convs get the new class count.
"""
import json
import os
import re
import sys

import numpy as np

__all__ = ["WeightsFile", "read_weights", "write_weights", "Transfer", "plan_transfer", "head_widths",
           "transfer_width", "placeholder_names"]

_NBT = ".num_batches_tracked"
_CLS_OUT = re.compile(r"model\.23\.(?:one2one_)?cv3\.\d+\.2\.(?:weight|bias)")  # the final class convs
_FIRST_CONV = "model.0.conv.weight"


class WeightsFile:
    """``tensors`` (name -> array), ``scale`` (or None), ``num_classes`` (or None), ``names`` (list or
    None), ``cls_width`` (the class branch's width: the file's record, else its tensors', else None),
    ``kind`` ("ultralytics", "weights file", "training checkpoint") and ``path``."""

    def __init__(self, path, kind, tensors, scale=None, num_classes=None, names=None, cls_width=None):
        self.path, self.kind, self.tensors = path, kind, tensors
        self.scale, self.num_classes, self.names = scale, num_classes, names
        self.cls_width = int(cls_width) if cls_width is not None else head_widths(tensors)[1]

    @property
    def model_name(self):
        return None if self.scale is None else "yolo26" + self.scale


def _scale(model):
    s = str(model or "")
    return s[-1] if s.startswith("yolo26") and len(s) == 7 else None


def head_widths(tensors):
    """(the Detect head's input widths (P3, P4, P5), its class-branch width) of a state dict, each None
    when the dict lacks the tensors that say it (``model.23.cv2.{i}.0.conv.weight``,
    ``model.23.cv3.0.2.weight``)."""
    def in_width(name):
        shape = _shape(tensors.get(name))
        return int(shape[1]) if shape is not None and len(shape) == 4 else None
    ch = tuple(in_width("model.23.cv2.%d.0.conv.weight" % i) for i in range(3))
    return (None if None in ch else ch), in_width("model.23.cv3.0.2.weight")


def _shape(v):
    if isinstance(v, tuple) and len(v) == 2 and v[1] == "BF16":  # ptl.io's bfloat16 form
        v = v[0]
    shape = getattr(v, "shape", None)
    return None if shape is None else tuple(shape)


def transfer_width(tensors, channels, cls_width):
    """The class-branch width a new model with head input widths ``channels`` and default class-branch
    width ``cls_width`` takes to receive ``tensors``, as 8.4.190's ``load`` rebuilds it: the source's
    width when the head input widths match and the class-branch widths differ; None otherwise."""
    ch, width = head_widths(tensors)
    if ch == tuple(channels) and width is not None and width != cls_width:
        return width
    return None


def placeholder_names(names):
    """Ultralytics' placeholder test: every name is its own index ("0", "1", ...; an empty list too)."""
    return all(str(i) == str(n) for i, n in enumerate(names))


def write_weights(path, tensors, model_name, num_classes, names, cls_width=None):
    """A weights-only ``.safetensors`` (atomic): the tensors plus ``model``, ``num_classes``, ``cls_width``
    (default: read from the tensors) and ``names`` (JSON) metadata, which :func:`read_weights` and
    ``Detector.load`` read back."""
    from . import io
    width = cls_width if cls_width is not None else head_widths(tensors)[1]
    meta = {"model": model_name, "num_classes": str(int(num_classes)), "names": json.dumps(list(names))}
    if width is not None:
        meta["cls_width"] = str(int(width))
    io.save_safetensors(path, tensors, metadata=meta)


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
                           hp.get("names"), hp.get("cls_width"))
    try:
        names = json.loads(meta["names"]) if "names" in meta else None
        nc = int(meta["num_classes"]) if "num_classes" in meta else None
        width = int(meta["cls_width"]) if "cls_width" in meta else None
    except ValueError as e:
        raise ValueError("%s: unreadable weights metadata (%s)" % (path, e)) from None
    return WeightsFile(path, "weights file", tensors, _scale(meta.get("model")), nc, names, width)


class Transfer:
    """The outcome of matching a state dict against a model (:func:`plan_transfer`).

    ``arrays``: name -> array to copy (name and shape match); ``parts``: name -> (index, values) of the
    tensors of which a part comes from the source (``tensor[index] = values``; the rest keeps the model's
    values): the final class convs' rows remapped by class name and 8.4.190's partial first conv;
    ``remapped_classes``: how many of the model's ``num_classes`` classes found their name in the source;
    ``mismatched``: [(name, source shape, model shape)] (the partial first conv included); ``missing``:
    model tensors the source lacks (they keep their values); ``unexpected``: source tensors the model
    lacks; ``transferred`` / ``total``: Ultralytics' counts; ``notes``: lines the summary adds (e.g. the
    class-branch width the model was built with)."""

    def __init__(self, source, arrays, mismatched, missing, unexpected, transferred, total, parts=None,
                 remapped_classes=0, num_classes=0):
        self.source, self.arrays = source, arrays
        self.mismatched, self.missing, self.unexpected = mismatched, missing, unexpected
        self.transferred, self.total = transferred, total
        self.parts, self.remapped_classes, self.num_classes = dict(parts or {}), remapped_classes, num_classes
        self.notes = []

    @property
    def complete(self):
        return not (self.mismatched or self.missing or self.unexpected)

    def summary(self):
        """``Transferred a/b items from <source>`` plus one line per kind of tensor left out."""
        lines = ["Transferred %d/%d items from %s" % (self.transferred, self.total, self.source)]
        lines += ["  " + n for n in self.notes]
        remapped = [k for k in self.parts if _CLS_OUT.fullmatch(k)]
        if remapped:
            lines.append("  %d/%d classes found by name: their rows of the %d class-output tensors come from the "
                         "source's classes of that name%s" % (
                             self.remapped_classes, self.num_classes, len(remapped),
                             "" if self.remapped_classes == self.num_classes else "; the other rows keep the "
                             "model's initialisation"))
        if _FIRST_CONV in self.parts:
            (filters, inputs), _ = self.parts[_FIRST_CONV]
            lines.append("  %s: its first %d filters (%d input channels) come from the source" % (
                _FIRST_CONV, filters.stop, inputs.stop))
        mismatched = [m for m in self.mismatched if m[0] not in self.parts]
        if mismatched:
            lines.append("  %d tensors of another shape keep the model's initialisation:" % len(mismatched))
            lines += ["    %s %s in the source, %s here" % m for m in mismatched]
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


def _norm(name):
    return str(name).strip().lower()


def remap_rows(index, state, names, target_names, source="state_dict"):
    """8.4.190's ``_remap_cls_by_names``: ``(parts, matched)``, parts: name -> (model rows, the source's
    rows for them) of the final class convs in ``index``, for the classes of ``target_names`` whose name is
    one of ``names`` (the source's, in its row order); ``({}, 0)`` when nothing is remapped (see the
    module doc). Raises ValueError when the source's names point past a tensor's rows."""
    if names is None or target_names is None:
        return {}, 0
    names, target_names = list(names), list(target_names)
    if placeholder_names(names) or placeholder_names(target_names):
        return {}, 0
    lookup = {}
    for i, n in enumerate(names):  # a repeated name maps to its last class, as a dict built in order does
        lookup[_norm(n)] = i
    idx = np.array([lookup.get(_norm(n), -1) for n in target_names], dtype=np.int64)
    valid = idx >= 0
    matched = int(valid.sum())
    if matched == 0 or (len(names) == len(target_names) and np.array_equal(idx, np.arange(len(target_names)))):
        return {}, 0
    parts = {}
    for k, (_, _, shape) in index.items():
        if not _CLS_OUT.fullmatch(k) or k not in state or shape[0] != len(target_names):
            continue
        a = _as_array(k, state[k])
        if tuple(a.shape[1:]) != tuple(shape[1:]):  # another scale's input width: left to the plain copy
            continue
        if a.shape[0] <= idx.max():
            raise ValueError("%s: %s has %d rows, but the source's class names reach class %d"
                             % (source, k, a.shape[0], int(idx.max())))
        parts[k] = (np.flatnonzero(valid), a[idx[valid]])
    return parts, matched


def _first_conv_part(a, shape):
    """8.4.190's first conv of another shape with the same kernel: the first min(filters) filters over the
    first min(input channels) channels (a one-channel side takes the sum over the other's channels)."""
    if a.ndim != 4 or len(shape) != 4 or tuple(a.shape[2:]) != tuple(shape[2:]):
        return None
    c1, c2 = min(shape[0], a.shape[0]), min(shape[1], a.shape[1])
    values = a[:c1].sum(1, keepdims=True) if c2 == 1 else a[:c1, :c2]
    return (slice(0, c1), slice(0, c2)), values


def plan_transfer(index, state, source="state_dict", names=None, target_names=None):
    """Matches ``state`` (name -> array) against ``index`` (name -> (is_buffer, offset, shape)) as 8.4.190's
    ``load`` does, checking everything and writing nothing: the class rows by name (``names``: the
    source's class names, ``target_names``: the model's; see :func:`remap_rows`), the rest by name and
    shape, then a first conv of another shape in part. Raises ValueError for a value that is not
    floating-point."""
    counters = {k[:-len("running_mean")] + "num_batches_tracked" for k in index if k.endswith(".running_mean")}
    parts, matched = remap_rows(index, state, names, target_names, source)
    arrays, mismatched, unexpected = {}, [], []
    given_counters = set()
    for k, v in dict(state).items():
        if k in parts:
            continue
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
            if k == _FIRST_CONV and _first_conv_part(a, shape) is not None:
                parts[k] = _first_conv_part(a, shape)
            continue
        arrays[k] = a
    left = {m[0] for m in mismatched}
    missing = [k for k in index if k not in arrays and k not in parts and k not in left]
    if given_counters:
        nbt = len(given_counters)
    else:  # a ptl file: the counter Ultralytics' file would hold for each of its BatchNorms (always shape ())
        nbt = sum(1 for c in counters if c[:-len("num_batches_tracked")] + "running_mean" in state)
    return Transfer(source, arrays, mismatched, missing, unexpected, len(arrays) + len(parts) + nbt,
                    len(index) + len(counters), parts, matched, len(target_names or ()))
