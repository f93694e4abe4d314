"""Counter-based random numbers (Philox4x32-10), identical on the CPU and on CUDA.

A :class:`Generator` is just ``(seed, offset)``. Every draw reads Philox blocks starting at ``offset``
and then advances it by the number of blocks used (``ceil(n / 4)`` for ``n`` values), so the same
(seed, offset) gives the same numbers on any device and with any thread count.
"""
import os
import random as _pyrandom

import numpy as np

from . import _C

_UINT64 = (1 << 64) - 1


class Generator:
    """A Philox stream position: ``seed`` (64-bit) and ``offset`` (in 128-bit blocks)."""

    def __init__(self, seed=0, offset=0):
        self.manual_seed(seed)
        self.offset = int(offset)

    def manual_seed(self, seed):
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise TypeError("seed: expected an int, got %s" % type(seed).__name__)
        self.seed = int(seed) & _UINT64
        self.offset = 0
        return self

    def get_state(self):
        return (self.seed, self.offset)

    def set_state(self, state):
        self.seed, self.offset = int(state[0]) & _UINT64, int(state[1])

    def __repr__(self):
        return "ptl.Generator(seed=%d, offset=%d)" % (self.seed, self.offset)


default_generator = Generator(0)


def seed_everything(seed=None):
    """Seeds ptl's default generator, Python's ``random`` and NumPy's global generator.

    ``seed=None`` takes ``PTL_GLOBAL_SEED`` from the environment, else 0. Returns the seed used and
    exports it as ``PTL_GLOBAL_SEED`` (as Lightning does with ``PL_GLOBAL_SEED``).
    """
    if seed is None:
        seed = int(os.environ.get("PTL_GLOBAL_SEED", 0))
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError("seed: expected an int, got %s" % type(seed).__name__)
    seed = int(seed)
    if not 0 <= seed <= _UINT64:
        raise ValueError("seed: expected 0 <= seed < 2**64, got %d" % seed)
    default_generator.manual_seed(seed)
    _pyrandom.seed(seed)
    np.random.seed(seed % (1 << 32))
    os.environ["PTL_GLOBAL_SEED"] = str(seed)
    return seed


def _draw(tensor, kind, a, b, generator):
    gen = default_generator if generator is None else generator
    used = _C._rng_fill(tensor, kind, gen.seed, gen.offset, float(a), float(b))
    gen.offset += used
    return tensor


def rand(shape, dtype="float32", device="cpu", low=0.0, high=1.0, generator=None):
    """Uniform numbers in ``[low, high)`` (24 random bits each)."""
    return _draw(_C.empty(shape, dtype, device), 0, low, high, generator)


def randn(shape, dtype="float32", device="cpu", mean=0.0, std=1.0, generator=None):
    """Normal numbers (Box-Muller on Philox words, computed in float32)."""
    return _draw(_C.empty(shape, dtype, device), 1, mean, std, generator)


def full(shape, value, dtype="float32", device="cpu"):
    """A tensor with every element equal to ``value`` (converted like a cast)."""
    t = _C.empty(shape, dtype, device)
    _C._fill(t, float(value))
    return t
