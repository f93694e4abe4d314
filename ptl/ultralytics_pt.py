"""Ultralytics ``.pt`` checkpoints read without torch, and without running anything they contain.

A ``.pt`` file written by ``torch.save`` is a zip archive: ``<name>/data.pkl`` is a pickle of the
object tree and ``<name>/data/<key>`` holds the raw bytes of each tensor storage. Unpickling it
normally imports and calls whatever the pickle names (``torch``, ``ultralytics``, or anything else:
a pickle can run arbitrary code). Here the pickle is *interpreted* instead: :func:`read_pt` walks its
opcodes with :func:`pickletools.genops` (a parser, it executes nothing) and runs a small stack machine
that accepts only the opcodes in ``ALLOWED_OPCODES``. Every class or function reference becomes an
inert :class:`Ref`, and "calling" one builds an inert :class:`Instance` that records its arguments
and state. The only references given a meaning are the ones that rebuild tensors (turned into NumPy
arrays from the storages: float16, float32, float64, bfloat16 (as float32), integer and bool) and a
few plain containers (``OrderedDict``, ``set``, ``frozenset``, protocol 2's latin-1 ``bytes``).
References outside the modules an Ultralytics checkpoint uses (``torch``, ``ultralytics``,
``collections``, ``numpy``, harmless ``builtins``, ...) are refused with an error naming the file, so a
crafted pickle that would call ``os.system`` under ``pickle.load`` is reported, never run.

:func:`load_ultralytics` reads an Ultralytics detection checkpoint: the ``ema`` entry when present
(training checkpoints), else ``model`` (released weights), its ``state_dict`` (names exactly as
``torch.nn.Module.state_dict()`` gives them, ``num_batches_tracked`` included), and the scale, class
count and class names from the model's ``yaml`` and ``names``.
"""
import os
import pickletools
import re
import zipfile
import zlib
from collections import OrderedDict

import numpy as np

__all__ = ["CheckpointError", "Ref", "Instance", "read_pt", "load_ultralytics", "checkpoint_from_tree",
           "UltralyticsCheckpoint", "ALLOWED_OPCODES"]


class CheckpointError(ValueError):
    """A file that is not a readable Ultralytics/PyTorch checkpoint; the message names the file."""


# Opcodes of pickle protocols 2-5 that build plain data, memoize, and reference globals. Left out:
# the text-protocol forms, INST/OBJ (call a class by name), EXT1/2/4 (the copyreg extension registry),
# PERSID (text persistent ids) and the out-of-band buffer opcodes.
ALLOWED_OPCODES = frozenset((
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINFLOAT",
    "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
    "BINSTRING", "SHORT_BINSTRING",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_LIST", "APPEND", "APPENDS", "LIST",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_SET", "ADDITEMS", "FROZENSET",
    "BINPUT", "LONG_BINPUT", "MEMOIZE", "BINGET", "LONG_BINGET",
    "GLOBAL", "STACK_GLOBAL", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD", "BINPERSID",
))

# Module roots an Ultralytics checkpoint references; anything else is refused.
_MODULE_ROOTS = ("torch", "ultralytics", "collections", "numpy", "copyreg", "_codecs", "pathlib", "datetime",
                 "types", "argparse")
_BUILTINS = frozenset(("set", "frozenset", "slice", "complex", "bytearray", "range", "list", "dict", "tuple",
                       "int", "float", "str", "bool", "bytes", "object", "NoneType"))

# torch's typed-storage classes -> NumPy dtype of their elements (bfloat16 as its raw uint16 bits).
_STORAGE_DTYPES = {
    "HalfStorage": np.float16, "FloatStorage": np.float32, "DoubleStorage": np.float64,
    "BFloat16Storage": np.uint16, "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class Ref:
    """An inert stand-in for a class or function the pickle names (``module.name``); never imported."""

    __slots__ = ("module", "name")

    def __init__(self, module, name):
        self.module, self.name = module, name

    @property
    def qualname(self):
        return "%s.%s" % (self.module, self.name)

    def __repr__(self):
        return "Ref(%s)" % self.qualname


class Instance:
    """An inert stand-in for an object the pickle builds from a :class:`Ref`: the reference, the
    arguments it would have been called with, and the state ``BUILD`` would have set (for a
    ``torch.nn.Module`` its ``__dict__``: ``_parameters``, ``_buffers``, ``_modules``, ...)."""

    __slots__ = ("cls", "args", "state", "items", "elements")

    def __init__(self, cls, args):
        self.cls, self.args, self.state = cls, args, None
        self.items, self.elements = {}, []  # what SETITEMS / APPENDS added (dict or list subclasses)

    def get(self, key, default=None):
        return self.state.get(key, default) if isinstance(self.state, dict) else default

    def __repr__(self):
        return "Instance(%s)" % self.cls.qualname


class _Storage:
    """One storage of the archive (``kind``: torch's storage class name), read on first use."""

    __slots__ = ("archive", "key", "kind", "numel", "array")

    def __init__(self, archive, key, kind, numel):
        self.archive, self.key, self.kind, self.numel, self.array = archive, key, kind, numel, None

    def data(self):
        if self.array is None:
            self.array = self.archive.storage(self.key, _STORAGE_DTYPES[self.kind], self.numel)
        return self.array


class _Archive:
    def __init__(self, path, zf):
        self.path, self.zf = path, zf
        pkls = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise CheckpointError("%s: a zip but not a PyTorch checkpoint (no <name>/data.pkl inside)" % path)
        self.prefix = pkls[0][:-len("data.pkl")]
        names = set(zf.namelist())
        order = "little"
        if self.prefix + "byteorder" in names:
            order = self.read(self.prefix + "byteorder").decode("ascii", "replace").strip()
            if order not in ("little", "big"):
                raise CheckpointError("%s: unknown byte order %r" % (path, order))
        self.order = "<" if order == "little" else ">"

    def read(self, name):
        try:
            return self.zf.read(name)
        except KeyError:
            raise CheckpointError("%s: %s is missing from the archive" % (self.path, name)) from None
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError) as e:
            raise CheckpointError("%s: %s cannot be read (truncated or corrupt file: %s)" % (self.path, name, e)) \
                from None

    def storage(self, key, dtype, numel):
        raw = self.read(self.prefix + "data/" + key)
        dt = np.dtype(dtype).newbyteorder(self.order) if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
        if len(raw) < numel * dt.itemsize:
            raise CheckpointError("%s: storage %s holds %d bytes, the pickle says %d elements of %d bytes"
                                  % (self.path, key, len(raw), numel, dt.itemsize))
        return np.frombuffer(raw, dtype=dt, count=numel).astype(dt.newbyteorder("="), copy=False)


def _tensor(path, storage, offset, size, stride):
    """The NumPy array torch's ``_rebuild_tensor_v2`` would view: checked to stay inside the storage."""
    if not isinstance(storage, _Storage):
        raise CheckpointError("%s: a tensor rebuild without a storage" % path)
    size, stride = tuple(size), tuple(stride)
    if (not isinstance(offset, int) or offset < 0 or len(size) != len(stride)
            or not all(isinstance(v, int) and v >= 0 for v in size + stride)):
        raise CheckpointError("%s: invalid tensor geometry (offset %r, size %r, stride %r)" % (path, offset, size,
                                                                                              stride))
    data = storage.data()
    if any(s == 0 for s in size):
        out = np.zeros(size, data.dtype)
    else:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= data.size:
            raise CheckpointError("%s: a tensor of size %r, stride %r at offset %d reads past its storage of %d "
                                  "elements" % (path, size, stride, offset, data.size))
        out = np.lib.stride_tricks.as_strided(data[offset:], shape=size,
                                              strides=[s * data.itemsize for s in stride]).copy()
    if storage.kind == "BFloat16Storage":  # the raw bits, widened exactly
        return (out.astype(np.uint32) << 16).view(np.float32)
    return out


def _rebuild_tensor_v2(path, args):
    if len(args) < 4:
        raise CheckpointError("%s: _rebuild_tensor_v2 with %d arguments" % (path, len(args)))
    return _tensor(path, *args[:4])


def _rebuild_parameter(path, args):
    if not args or not isinstance(args[0], np.ndarray):
        raise CheckpointError("%s: a parameter rebuild without a tensor" % path)
    return args[0]


def _rebuild_from_type_v2(path, args):
    """torch's rebuild of a tensor subclass: (function, type, arguments, state) -> the plain tensor."""
    if len(args) < 3 or not isinstance(args[0], Ref) or not isinstance(args[2], tuple):
        raise CheckpointError("%s: malformed _rebuild_from_type_v2" % path)
    return _call(path, args[0], args[2])


def _ordered_dict(path, args):
    return OrderedDict(args[0]) if args and isinstance(args[0], (list, dict)) else OrderedDict()


def _set(path, args):
    items = args[0] if args and isinstance(args[0], (list, tuple, set, frozenset)) else ()
    try:
        return set(items)
    except TypeError:
        return list(items)


def _frozenset(path, args):
    items = _set(path, args)
    return frozenset(items) if isinstance(items, set) else tuple(items)


def _latin1(path, args):
    """Protocol 2's bytes: _codecs.encode(text, 'latin1')."""
    if len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
        return args[0].encode("latin-1")
    raise CheckpointError("%s: unsupported _codecs.encode%r" % (path, args[1:]))


# The only references a checkpoint may call for real: they build arrays or plain containers.
_CALLS = {
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "collections.OrderedDict": _ordered_dict,
    "builtins.set": _set,
    "__builtin__.set": _set,
    "builtins.frozenset": _frozenset,
    "__builtin__.frozenset": _frozenset,
    "_codecs.encode": _latin1,
    "torch.Size": lambda path, args: tuple(args[0]) if args else (),
}


def _call(path, ref, args):
    fn = _CALLS.get(ref.qualname)
    return fn(path, args) if fn is not None else Instance(ref, args)


def _check_ref(path, module, name):
    root = module.split(".")[0]
    ok = root in _MODULE_ROOTS or (root in ("builtins", "__builtin__") and name in _BUILTINS)
    if not ok or name.startswith("__") and name.endswith("__"):
        raise CheckpointError("%s: refusing to load: the pickle references %s.%s, which no Ultralytics checkpoint "
                              "needs (a pickle can run code through such references; nothing was run)"
                              % (path, module, name))
    return Ref(module, name)


def _interpret(path, data, archive):
    """Runs the allowed opcodes of the pickle ``data`` as a stack machine; returns the top object."""
    stack, metastack, memo = [], [], {}
    storages = {}

    def pop_mark():
        nonlocal stack
        items = stack
        stack = metastack.pop()
        return items

    try:
        ops = pickletools.genops(data)
        for op, arg, pos in ops:
            name = op.name
            if name not in ALLOWED_OPCODES:
                raise CheckpointError("%s: refusing to load: pickle opcode %s at byte %s is not allowed in a "
                                      "checkpoint (nothing was run)" % (path, name, pos))
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                if len(stack) != 1 or metastack:
                    raise CheckpointError("%s: malformed pickle (stack of %d at STOP)" % (path, len(stack)))
                return stack[0]
            if name == "MARK":
                metastack.append(stack)
                stack = []
            elif name == "POP":
                stack.pop()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(stack[-1])
            elif name == "NONE":
                stack.append(None)
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name in ("BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINFLOAT", "BINUNICODE",
                          "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"):
                stack.append(arg)
            elif name in ("BINSTRING", "SHORT_BINSTRING"):  # protocol 2 str from Python 2: text
                stack.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "TUPLE":
                items = tuple(pop_mark())  # before touching `stack`: pop_mark rebinds it
                stack.append(items)
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                items = tuple(stack[-n:])
                del stack[-n:]
                stack.append(items)
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "LIST":
                items = pop_mark()
                stack.append(items)
            elif name in ("APPEND", "APPENDS"):
                items = [stack.pop()] if name == "APPEND" else pop_mark()
                target = stack[-1]
                if isinstance(target, list):
                    target.extend(items)
                elif isinstance(target, Instance):
                    target.elements.extend(items)
                else:
                    raise CheckpointError("%s: malformed pickle (append to %s)" % (path, type(target).__name__))
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "DICT":
                items = pop_mark()
                stack.append(dict(zip(items[::2], items[1::2])))
            elif name in ("SETITEM", "SETITEMS"):
                if name == "SETITEM":
                    v = stack.pop()
                    k = stack.pop()
                    items = [k, v]
                else:
                    items = pop_mark()
                target = stack[-1]
                dst = target if isinstance(target, dict) else target.items if isinstance(target, Instance) else None
                if dst is None:
                    raise CheckpointError("%s: malformed pickle (setitem on %s)" % (path, type(target).__name__))
                for k, v in zip(items[::2], items[1::2]):
                    dst[k] = v
            elif name == "EMPTY_SET":
                stack.append(set())
            elif name == "ADDITEMS":
                items = pop_mark()
                stack[-1].update(items)
            elif name == "FROZENSET":
                items = frozenset(pop_mark())
                stack.append(items)
            elif name in ("BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise CheckpointError("%s: malformed pickle (memo %d unset)" % (path, arg))
                stack.append(memo[arg])
            elif name == "GLOBAL":
                module, _, attr = arg.partition(" ")
                stack.append(_check_ref(path, module, attr))
            elif name == "STACK_GLOBAL":
                attr = stack.pop()
                module = stack.pop()
                if not isinstance(module, str) or not isinstance(attr, str):
                    raise CheckpointError("%s: malformed pickle (STACK_GLOBAL of non-strings)" % path)
                stack.append(_check_ref(path, module, attr))
            elif name == "REDUCE":
                args = stack.pop()
                fn = stack.pop()
                if not isinstance(fn, Ref) or not isinstance(args, tuple):
                    raise CheckpointError("%s: malformed pickle (REDUCE of %s)" % (path, type(fn).__name__))
                stack.append(_call(path, fn, args))
            elif name in ("NEWOBJ", "NEWOBJ_EX"):
                if name == "NEWOBJ_EX":
                    stack.pop()  # keyword arguments: recorded nowhere, an inert object takes none
                args = stack.pop()
                cls = stack.pop()
                if not isinstance(cls, Ref):
                    raise CheckpointError("%s: malformed pickle (NEWOBJ of %s)" % (path, type(cls).__name__))
                stack.append(Instance(cls, tuple(args)))
            elif name == "BUILD":
                state = stack.pop()
                target = stack[-1]
                if not isinstance(target, Instance):
                    raise CheckpointError("%s: malformed pickle (BUILD on %s)" % (path, type(target).__name__))
                if isinstance(state, tuple) and len(state) == 2:  # (__dict__, __slots__ state)
                    merged = dict(state[0] or {})
                    merged.update(state[1] or {})
                    state = merged
                target.state = state
            elif name == "BINPERSID":
                pid = stack.pop()
                stack.append(_persistent(path, pid, archive, storages))
    except CheckpointError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError("%s: malformed or truncated pickle (%s: %s)" % (path, type(e).__name__, e)) from None
    raise CheckpointError("%s: truncated pickle (no STOP)" % path)


def _persistent(path, pid, archive, storages):
    """torch's persistent id of a storage: ('storage', <Ref torch.XStorage>, key, location, numel)."""
    if (not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage" or not isinstance(pid[1], Ref)
            or not isinstance(pid[2], str) or not isinstance(pid[4], int) or pid[4] < 0):
        raise CheckpointError("%s: unsupported persistent id %r" % (path, pid))
    ref, key, numel = pid[1], pid[2], pid[4]
    if ref.module != "torch" or ref.name not in _STORAGE_DTYPES:
        raise CheckpointError("%s: unsupported storage type %s" % (path, ref.qualname))
    if not re.fullmatch(r"[0-9A-Za-z_.-]+", key) or ".." in key:
        raise CheckpointError("%s: invalid storage key %r" % (path, key))
    if key not in storages:
        storages[key] = _Storage(archive, key, ref.name, numel)
    return storages[key]


def read_pt(path):
    """The object tree of a ``torch.save`` zip file, built from inert stand-ins (see the module doc):
    dicts, lists, tuples, numbers, strings, NumPy arrays for tensors, :class:`Instance` for objects.
    Raises :class:`CheckpointError` naming ``path`` for anything else (not a zip, truncated, a pickle
    that names code outside a checkpoint's modules or uses an opcode outside ``ALLOWED_OPCODES``)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError("checkpoint %s does not exist" % path)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        with open(path, "rb") as f:
            head = f.read(4)
        hint = (" (a bare pickle: the legacy pre-1.6 torch format, not supported; re-save it with a current torch)"
                if head[:1] == b"\x80" else " (truncated, or not a checkpoint at all)" if head == b"PK\x03\x04"
                else "")
        raise CheckpointError("%s: not a PyTorch zip checkpoint%s" % (path, hint)) from None
    with zf:
        archive = _Archive(path, zf)
        data = archive.read(archive.prefix + "data.pkl")
        return _interpret(path, data, archive)


# --------------------------------------------------------------------------------- Ultralytics models

class UltralyticsCheckpoint:
    """What :func:`load_ultralytics` found: ``scale`` ('n'..'x'), ``num_classes``, ``names`` (list),
    ``state_dict`` (name -> float32 array, or int64 for ``num_batches_tracked``, in module order),
    ``entry`` ('ema' or 'model') and ``path``."""

    def __init__(self, path, entry, scale, num_classes, names, state_dict):
        self.path, self.entry, self.scale = path, entry, scale
        self.num_classes, self.names, self.state_dict = num_classes, names, state_dict


def _module_state(path, module, prefix, out):
    """torch.nn.Module.state_dict() of an inert module tree: parameters, persistent buffers, children."""
    if not isinstance(module, Instance) or not isinstance(module.state, dict):
        raise CheckpointError("%s: %s is not a module" % (path, prefix.rstrip(".") or "the model"))
    st = module.state
    params, buffers = st.get("_parameters") or {}, st.get("_buffers") or {}
    skip = st.get("_non_persistent_buffers_set") or set()
    for group in (params, buffers):
        for k, v in group.items():
            if v is None or (group is buffers and k in skip):
                continue
            if not isinstance(v, np.ndarray):
                raise CheckpointError("%s: %s%s is not a tensor" % (path, prefix, k))
            out[prefix + k] = v
    for k, child in (st.get("_modules") or {}).items():
        if child is not None:
            _module_state(path, child, prefix + k + ".", out)
    return out


def _scale_of(path, model):
    yaml = model.get("yaml")
    yaml = yaml if isinstance(yaml, dict) else {}
    scale = yaml.get("scale")
    if scale in ("n", "s", "m", "l", "x"):
        return scale
    m = re.search(r"yolo26([nsmlx])", str(yaml.get("yaml_file", "")))
    if m:
        return m.group(1)
    raise CheckpointError("%s: the model's yaml names no scale (n, s, m, l, x); pass model='yolo26n' etc." % path)


def load_ultralytics(path):
    """Reads an Ultralytics YOLO26 detection checkpoint (see the module doc)."""
    path = os.fspath(path)
    return checkpoint_from_tree(path, read_pt(path))


def checkpoint_from_tree(path, top):
    """The :class:`UltralyticsCheckpoint` in the object tree ``top`` that :func:`read_pt` read from ``path``."""
    if not isinstance(top, dict) or not ({"model", "ema"} & set(top)):
        raise CheckpointError("%s: not an Ultralytics checkpoint (expected a dict with 'model' or 'ema', got %s)"
                              % (path, type(top).__name__ if not isinstance(top, Instance) else top.cls.qualname))
    entry = "ema" if isinstance(top.get("ema"), Instance) else "model"
    model = top.get(entry)
    if isinstance(model, dict) and all(isinstance(v, np.ndarray) for v in model.values()):
        raise CheckpointError("%s: '%s' is a bare state_dict; load it with Detector(...).load_state_dict, or save "
                              "the Ultralytics model itself" % (path, entry))
    if not isinstance(model, Instance):
        raise CheckpointError("%s: the checkpoint's '%s' entry is %s, not a model" % (path, entry, type(model).__name__))
    if model.cls.qualname != "ultralytics.nn.tasks.DetectionModel":
        raise CheckpointError("%s: unsupported model type %s; ptl reads YOLO26 detection models "
                              "(ultralytics.nn.tasks.DetectionModel)" % (path, model.cls.qualname))
    yaml = model.get("yaml") if isinstance(model.get("yaml"), dict) else {}
    state = _module_state(path, model, "", OrderedDict())
    if any(k.endswith(".conv.bias") for k in state) and not any(k.endswith(".bn.weight") for k in state):
        raise CheckpointError("%s: the model was fused (BatchNorm folded into the convolutions, model.fuse()); "
                              "ptl needs the unfused weights" % path)
    for k, v in state.items():
        if v.dtype != np.int64 and v.dtype != np.bool_:
            state[k] = v.astype(np.float32, copy=False)
    nc = yaml.get("nc")
    names = model.get("names")
    if not isinstance(nc, int) or nc < 1:
        raise CheckpointError("%s: the model's yaml has no class count 'nc'" % path)
    if isinstance(names, dict) and sorted(names) == list(range(nc)):
        names = [str(names[i]) for i in range(nc)]
    elif isinstance(names, (list, tuple)) and len(names) == nc:
        names = [str(n) for n in names]
    else:
        names = [str(i) for i in range(nc)]
    return UltralyticsCheckpoint(path, entry, _scale_of(path, model), nc, names, state)
