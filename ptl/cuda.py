"""CUDA device queries and the caching allocator's statistics (same meanings as torch.cuda's).

All functions take an optional ``device`` (an index, ``"cuda"`` or ``"cuda:N"``; default 0).
Memory figures are bytes. ``memory_allocated`` counts blocks handed out (sizes rounded to 512 bytes),
``memory_reserved`` the segments the allocator holds from the driver (cached blocks included).

cuBLAS and cuDNN are not linked into ptl: the first use of a GPU opens them from the pip wheels of
the ``ptl[cuda]`` extra (``nvidia-cublas``, ``nvidia-cudnn-cu13`` under a ``sys.path`` folder's
``nvidia/``), else from the system library path; without them that first use raises
:class:`ptl.CudaError` naming the missing library and the package to install. See :func:`libraries`.
"""
import contextlib
import ctypes
import os
import sys

from . import _C


def _library_roots():
    """The sys.path folders, in order, in which the nvidia-* wheels' nvidia/<lib>/lib folders are looked for.
    The current directory ('' on sys.path) is left out: libraries are not loaded from wherever one runs."""
    roots = []
    for p in sys.path:
        p = os.path.abspath(p) if p else None
        if p and p not in roots and os.path.isdir(os.path.join(p, "nvidia")):
            roots.append(p)
    return roots


_C._set_library_roots(_library_roots())


def _index(device):
    if device is None:
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError("device: expected an index >= 0, got %d" % device)
        return device
    if isinstance(device, str):
        if device == "cuda":
            return 0
        if device.startswith("cuda:") and device[5:].isdigit():
            return int(device[5:])
    raise ValueError("device: expected an index, 'cuda' or 'cuda:N', got %r" % (device,))


def is_available():
    """True when ptl was built with CUDA and a driver with at least one GPU is present; False (never an
    exception) without a driver, a GPU or a CUDA build. It does not open cuBLAS/cuDNN (see libraries)."""
    return _C.cuda_device_count() > 0


def libraries():
    """``{name: file}`` of the run-time CUDA libraries (cuBLASLt, cuBLAS, cuDNN), opening them if
    needed (no GPU is required for that). Raises :class:`ptl.CudaError` naming a missing library and
    the package that provides it, or ValueError when ptl was built without CUDA."""
    _C._set_library_roots(_library_roots())
    return {name: path for name, _, _, path in _C.cuda_libraries(True)}


def device_count():
    return _C.cuda_device_count()


def get_device_name(device=None):
    return _C.cuda_get_device_name(_index(device))


_CU_ATTR_CC_MAJOR, _CU_ATTR_CC_MINOR = 75, 76  # CUdevice_attribute values of cuda.h


def get_device_capability(device=None):
    """``(major, minor)`` compute capability of the device (``(9, 0)`` on an H200), read through the CUDA
    driver library (``libcuda.so.1``, present wherever a GPU can be used). Raises ValueError without a
    driver or with a device index it does not have."""
    index = _index(device)
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise ValueError("get_device_capability: the CUDA driver (libcuda.so.1) is not installed") from None
    dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    for what, rc in (("cuInit", lambda: lib.cuInit(0)),
                     ("cuDeviceGet", lambda: lib.cuDeviceGet(ctypes.byref(dev), index)),
                     ("cuDeviceGetAttribute", lambda: lib.cuDeviceGetAttribute(ctypes.byref(major),
                                                                               _CU_ATTR_CC_MAJOR, dev)),
                     ("cuDeviceGetAttribute", lambda: lib.cuDeviceGetAttribute(ctypes.byref(minor),
                                                                               _CU_ATTR_CC_MINOR, dev))):
        code = rc()
        if code != 0:
            raise ValueError("get_device_capability: %s failed for device %d (CUresult %d)" % (what, index, code))
    return major.value, minor.value


def default_precision(device):
    """The precision a fit uses when none is asked for: ``"32-true"`` on the CPU; on a GPU ``"bf16-mixed"``
    where it computes in bfloat16 natively (compute capability >= 8.0, Ampere and later), else
    ``"16-mixed"`` (float16 with a loss scale), as Ultralytics trains with AMP by default."""
    if device == "cpu":
        return "32-true"
    return "bf16-mixed" if get_device_capability(device)[0] >= 8 else "16-mixed"


def synchronize(device=None):
    """Waits for all work queued on the device."""
    _C.cuda_synchronize(_index(device))


def early_launch(device=None):
    """Whether ptl's kernels are launched to start while the kernel ahead of them in the stream finishes
    (programmatic dependent launch: devices running code built for compute capability 9.0 or later; the
    environment variable ``PTL_PDL=0`` turns it off). Each kernel still waits for that kernel's results
    before it reads or writes anything, so results are the same bits either way."""
    return _C.cuda_early_launch(_index(device))


def call_graphs(enabled=None):
    """Whether calls that come again with the same tensors on the same queue (a convolution's cuDNN or
    cuBLAS call, a BatchNorm pass of two or three kernels) are relaunched as CUDA graphs of what they
    enqueued, how many such graphs have been made and how many are held now: ``(on, made, held)``.

    An eager step of yolo26n makes 560 such calls. Made directly each costs its host time every step (a
    cuDNN call 5-9 us, each of our launches 2-3 us); relaunched, one graph launch. In an eager step every
    call's tensors repeat (its memory is laid out once per shape), so each call is recorded at its second
    step and relaunched from its third. The graph holds the kernels the call enqueued, so results are the
    same bits. Each graph holds about 0.35 MiB of device memory outside ptl's allocator (H100): one training
    shape of yolo26n needs 560 (about 200 MiB). At most ``ptl._C.CALL_GRAPHS_LIMIT`` are held: at the limit
    all are let go and the calls in use are recorded again, unless the graphs were hardly relaunched since
    the last time (then this turns itself off). On by default (the environment variable
    ``PTL_CALL_GRAPHS=0`` turns it off); ``enabled=True/False`` sets it for the process, and the returned
    ``on`` is the setting before."""
    return _C.cuda_call_graphs(None if enabled is None else bool(enabled))


def memory_stats(device=None):
    return _C.cuda_memory_stats(_index(device))


def memory_allocated(device=None):
    return memory_stats(device)["allocated"]


def max_memory_allocated(device=None):
    return memory_stats(device)["max_allocated"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved"]


def max_memory_reserved(device=None):
    return memory_stats(device)["max_reserved"]


def reset_peak_memory_stats(device=None):
    _C._allocator_op(_index(device), 0)


def empty_cache(device=None):
    """Returns every cached, unused segment to the driver (reserved memory shrinks)."""
    _C._allocator_op(_index(device), 1)


class MemPool:
    """A private allocator pool: tensors allocated under :func:`use_mem_pool` take their memory from
    segments this pool owns, which other allocations never reuse (the graph recorder keeps its
    buffers in one). :meth:`release` hands its segments back once its tensors are gone."""

    def __init__(self, device=None):
        self.device = _index(device)
        self.id = _C._allocator_op(self.device, 2)

    def release(self):
        if self.id is not None:
            _C._allocator_op(self.device, 3, self.id)
            self.id = None


@contextlib.contextmanager
def use_mem_pool(pool):
    """Allocations on the pool's device inside the block come from ``pool``."""
    if pool.id is None:
        raise ValueError("pool: this MemPool was released")
    prev = _C._allocator_op(pool.device, 4, pool.id)
    try:
        yield pool
    finally:
        _C._allocator_op(pool.device, 4, prev)
