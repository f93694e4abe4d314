"""Loads ptl._C with the OpenMP settings of its CPU kernels (csrc/cpu/threads.h).

libgomp, which ptl._C and oneDNN run their parallel loops on, reads its environment once, when it is
loaded together with ptl._C, and offers no call to change its wait policy afterwards; so the settings are
put in the environment for that moment and the caller's environment is restored right after:

- PTL_NUM_THREADS: threads per team. Default: OMP_NUM_THREADS when set, else the CPUs this process may
  run on (os.sched_getaffinity).
- Idle threads spin SPIN_COUNT times (about 20 us here) before they sleep, unless GOMP_SPINCOUNT or
  OMP_WAIT_POLICY is set. libgomp's default (300,000, about 6 ms) keeps every thread of a finished
  region busy: under a competing load that CPU time is taken from the threads doing the work, and the
  step slowed 5-6x more than with SPIN_COUNT (benchmarks/RESULTS.md, "CPU training step").
"""
import os
import warnings

SPIN_COUNT = 1000


def num_threads() -> int:
    """The team size that loading ptl._C applies (PTL_NUM_THREADS, OMP_NUM_THREADS, or the CPUs available)."""
    for name in ("PTL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if not value:
            continue
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        return int(value)
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every CPU counts
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def _libgomp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any(line.rstrip().endswith("/libgomp.so.1") for line in f)
    except OSError:
        return False


def _load():
    settings = {"OMP_NUM_THREADS": str(num_threads())}
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        settings["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    if _libgomp_loaded():
        warnings.warn("libgomp was loaded before ptl: ptl's thread count (PTL_NUM_THREADS) and wait policy "
                      "(GOMP_SPINCOUNT) do not apply; import ptl first", RuntimeWarning, stacklevel=3)
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        from . import _C
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    return _C


_C = _load()
