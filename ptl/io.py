"""Reading and writing ``.safetensors`` files (the C writer/reader is ``csrc/io/safetensors.c``).

Format: an 8-byte little-endian header length N, N bytes of JSON
``{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}}`` padded with
spaces to a multiple of 8, then the raw little-endian tensor bytes. Files written here load with the
``safetensors`` package and the other way round.

Writes are atomic: the file is written to a temporary file in the same folder, fsynced and renamed
over the destination, so a crash mid-write leaves the previous file intact (at worst a stray
``<path>.tmp.<pid>.<thread id>.<n>`` file next to it).

Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL.

**bfloat16.** NumPy has no bfloat16 dtype, so a BF16 tensor is represented by the pair
``(uint16 array of the raw bfloat16 bits, "BF16")`` -- ``save_safetensors`` accepts it and
``load_safetensors`` returns it. ``save_safetensors`` also accepts a ``ptl.Tensor`` of any dtype
(bfloat16 ones are stored as BF16). ``bf16_to_float32``/``float32_to_bf16`` convert the bits.
"""
import os

import numpy as np

from . import _C

__all__ = ["save_safetensors", "load_safetensors", "bf16_to_float32", "float32_to_bf16"]

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


def save_safetensors(path, tensors, metadata=None, *, _fault_after=-1, _fault_kill=False):
    """Write ``{name: array}`` to ``path`` atomically, with optional ``{str: str}`` metadata.

    Values: NumPy arrays (or array-likes) of a supported dtype, ``(uint16 bits, "BF16")`` pairs, or
    ``ptl.Tensor``s. ``_fault_after``/``_fault_kill`` are test hooks that make the write fail (or
    SIGKILL the process) after that many bytes.
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
    _C.safetensors_save(path, entries, metadata, fault_after=_fault_after, fault_kill=_fault_kill)


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
