"""CUDA device queries and the caching allocator's statistics (same meanings as torch.cuda's).

All functions take an optional ``device`` (an index, ``"cuda"`` or ``"cuda:N"``; default 0).
Memory figures are bytes. ``memory_allocated`` counts blocks handed out (sizes rounded to 512 bytes),
``memory_reserved`` the segments the allocator holds from the driver (cached blocks included).
"""
import contextlib

from . import _C


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
    """True when ptl was built with CUDA and a driver with at least one GPU is present."""
    return _C.cuda_device_count() > 0


def device_count():
    return _C.cuda_device_count()


def get_device_name(device=None):
    return _C.cuda_get_device_name(_index(device))


def synchronize(device=None):
    """Waits for all work queued on the device."""
    _C.cuda_synchronize(_index(device))


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
