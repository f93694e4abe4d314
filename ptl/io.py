"""Reading and writing ``.safetensors`` files (the C writer and reader: ``csrc/io/safetensors_write.c``,
``csrc/io/safetensors_read.c``; atomic writes: ``csrc/io/atomic_file.c``).

Format: an 8-byte little-endian header length N, N bytes of JSON
``{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}}`` padded with
spaces to a multiple of 8, then the raw little-endian tensor bytes. Files written here load with the
``safetensors`` package and the other way round.

Writes are atomic: the file is written to a temporary file in the same folder, fsynced and renamed
over the destination, so a crash mid-write leaves the previous file intact (at worst a stray
``<path>.tmp.<pid>.<thread id>.<n>`` file next to it, which :func:`remove_stale_temporaries` deletes).

The reader validates the whole header (UTF-8, JSON, dtypes, shapes against byte ranges, ranges tiling
the data, file length) before it reads any data; a bad file raises ValueError naming it.

Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL.

**bfloat16.** NumPy has no bfloat16 dtype, so a BF16 tensor is represented by the pair
``(uint16 array of the raw bfloat16 bits, "BF16")`` -- ``save_safetensors`` accepts it and
``load_safetensors`` returns it. ``save_safetensors`` also accepts a ``ptl.Tensor`` of any dtype
(bfloat16 ones are stored as BF16). ``bf16_to_float32``/``float32_to_bf16`` convert the bits.
"""
import os
import re

import numpy as np

from . import _C

__all__ = ["save_safetensors", "load_safetensors", "bf16_to_float32", "float32_to_bf16", "remove_stale_temporaries",
           "safetensors_dtype_name"]

# the temporary names of csrc/io/atomic_file.c: <path>.tmp.<pid>.<thread id>.<attempt>
_TEMP_NAME = re.compile(r"^(?P<target>.+)\.tmp\.(?P<pid>[0-9]+)\.(?P<tid>[0-9]+)\.(?P<attempt>[0-9]+)$")

_NP_TO_ST = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
    np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16", np.dtype(np.int8): "I8",
    np.dtype(np.uint64): "U64", np.dtype(np.uint32): "U32", np.dtype(np.uint16): "U16",
    np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL",
}
_ST_TO_NP = {v: k for k, v in _NP_TO_ST.items()}
_ST_TO_NP["BF16"] = np.dtype(np.uint16)


def bf16_to_float32(bits):
    """float32 values of raw bfloat16 bits (a uint16 array); exact."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x):
    """Raw bfloat16 bits (uint16) of float32 values, rounded to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def _entry(name, value):
    if not isinstance(name, str):
        raise TypeError("tensor names must be str, got %r" % (name,))
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], str):
            raise TypeError("tensor %r: a tuple must be (array, dtype name), e.g. (uint16 bits, 'BF16')" % name)
        arr, st = np.asarray(value[0]), value[1]
        want = _ST_TO_NP.get(st)
        if want is None:
            raise ValueError("tensor %r: unknown safetensors dtype %r" % (name, st))
        if arr.dtype.newbyteorder("=") != want.newbyteorder("="):
            raise TypeError("tensor %r: dtype %r needs a %s array, got %s" % (name, st, want, arr.dtype))
        return name, st, np.asarray(arr, dtype=want.newbyteorder("<"), order="C")
    if type(value).__name__ == "Tensor" and hasattr(value, "to") and hasattr(value, "numpy"):
        if value.device != "cpu":
            value = value.to(device="cpu")
        if value.dtype == "bfloat16":
            return name, "BF16", np.ascontiguousarray(value.numpy().view(np.uint32) >> 16).astype(np.uint16)
        value = value.numpy()
    arr = np.asarray(value)
    st = _NP_TO_ST.get(arr.dtype.newbyteorder("="))
    if st is None:
        raise TypeError("tensor %r: unsupported dtype %s (supported: %s, or (uint16, 'BF16'))"
                        % (name, arr.dtype, ", ".join(sorted(str(d) for d in _NP_TO_ST))))
    return name, st, np.asarray(arr, dtype=arr.dtype.newbyteorder("<"), order="C")


def save_safetensors(path, tensors, metadata=None):
    """Write ``{name: array}`` to ``path`` atomically, with optional ``{str: str}`` metadata.

    Values: NumPy arrays (or array-likes) of a supported dtype, ``(uint16 bits, "BF16")`` pairs, or
    ``ptl.Tensor``s.
    """
    path = os.fspath(path)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in metadata.items()):
            raise TypeError("metadata must be a dict of str to str or None")
    entries = []
    for name, value in dict(tensors).items():
        name, st, arr = _entry(name, value)
        entries.append((name, st, arr.shape, arr.reshape(-1).view(np.uint8)))
    _C.safetensors_save(path, entries, metadata)


def load_safetensors(path):
    """Read ``path`` -> ``({name: ndarray}, metadata dict)``; BF16 tensors come back as
    ``(uint16 bits, "BF16")``. A bad or truncated file raises ValueError naming the path; a missing or
    unreadable one OSError."""
    entries, metadata = _C.safetensors_load(os.fspath(path))
    out = {}
    for name, st, shape, data in entries:
        arr = np.frombuffer(data, dtype=_ST_TO_NP[st].newbyteorder("<")).reshape(shape)
        out[name] = (arr, "BF16") if st == "BF16" else arr
    return out, metadata


def safetensors_dtype_name(value):
    """The safetensors dtype name of a value as :func:`load_safetensors` returns it ("F32", "BF16", ...)."""
    if isinstance(value, tuple):
        return value[1]
    return _NP_TO_ST.get(np.asarray(value).dtype.newbyteorder("="), str(np.asarray(value).dtype))


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temporaries(folder, target=None):
    """Deletes the temporary files that killed writes left in ``folder`` (only the writer's own
    ``<name>.tmp.<pid>.<thread id>.<n>`` names, only when process ``pid`` is gone, and with ``target``
    only those of that file name). Returns the removed paths."""
    removed = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return removed
    for name in sorted(names):
        m = _TEMP_NAME.match(name)
        if not m or (target is not None and m.group("target") != target):
            continue
        if int(m.group("pid")) == os.getpid() or _pid_alive(int(m.group("pid"))):
            continue  # a write in progress, here or in another process
        path = os.path.join(folder, name)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def _inject_write_fault(after_bytes, pause_ms=0):
    """Tests only: the next atomic write fails after ``after_bytes`` bytes as a full disk would, first
    pausing ``pause_ms`` milliseconds (so a test can kill the process mid-write); -1 disarms."""
    _C._atomic_write_fault(int(after_bytes), int(pause_ms))
