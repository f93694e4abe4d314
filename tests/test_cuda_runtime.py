"""ptl.cuda: device queries, the caching allocator's statistics and private pools, CUDA errors."""
import numpy as np
import pytest

import ptl

MiB = 1 << 20


QUERIES = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")


def test_cpu_queries_never_raise():
    """is_available and device_count answer on any machine and agree; without a device every memory
    query is a ValueError that says so, with one it is a byte count; a bad device name is a ValueError."""
    avail, count = ptl.cuda.is_available(), ptl.cuda.device_count()
    assert isinstance(avail, bool) and isinstance(count, int)
    assert avail == (count > 0)
    assert issubclass(ptl.CudaError, RuntimeError)
    for q in QUERIES:
        if avail:
            v = getattr(ptl.cuda, q)()
            assert isinstance(v, int) and v >= 0, (q, v)
        else:
            with pytest.raises(ValueError, match="no CUDA device"):
                getattr(ptl.cuda, q)()
    with pytest.raises(ValueError, match="gpu:0"):
        ptl.cuda.memory_allocated("gpu:0")



@pytest.mark.cuda
def test_device_queries():
    assert ptl.cuda.device_count() >= 1
    assert isinstance(ptl.cuda.get_device_name(), str) and ptl.cuda.get_device_name(0)
    ptl.cuda.synchronize()
    with pytest.raises(ValueError, match="cuda:999"):
        ptl.cuda.get_device_name(999)


@pytest.mark.cuda
def test_allocator_statistics():
    # Other tests may leave live tensors (and so partly used segments) behind: only deltas are asserted,
    # and the large request is bigger than all cached free space together, so no cached block can serve it
    # and it gets a segment of its own (a multiple of 2 MiB is not rounded).
    ptl.cuda.synchronize()
    ptl.cuda.empty_cache()
    base = ptl.cuda.memory_allocated()
    base_res = ptl.cuda.memory_reserved()
    assert base_res >= base
    size = max(30 * MiB, -(-(base_res - base + 1) // (2 * MiB)) * 2 * MiB)
    ptl.cuda.reset_peak_memory_stats()
    a = ptl.empty(size // 4, dtype="float32", device="cuda")
    assert ptl.cuda.memory_allocated() == base + size
    assert ptl.cuda.memory_reserved() == base_res + size
    small = ptl.empty(100, dtype="uint8", device="cuda")            # rounded to 512 bytes
    assert ptl.cuda.memory_allocated() == base + size + 512
    peak = ptl.cuda.max_memory_allocated()
    assert peak == base + size + 512
    reserved = ptl.cuda.memory_reserved()
    del a, small
    assert ptl.cuda.memory_allocated() == base
    assert ptl.cuda.max_memory_allocated() == peak                  # peak survives the free
    assert ptl.cuda.memory_reserved() == reserved                   # freed blocks stay cached
    b = ptl.empty(size // 4, dtype="float32", device="cuda")
    assert ptl.cuda.memory_reserved() == reserved                   # ... and are reused
    del b
    ptl.cuda.reset_peak_memory_stats()
    assert ptl.cuda.max_memory_allocated() == base
    assert ptl.cuda.max_memory_reserved() == reserved
    ptl.cuda.empty_cache()
    assert ptl.cuda.memory_reserved() == base_res                   # empty_cache gives segments back
    assert ptl.cuda.memory_allocated() == base


@pytest.mark.cuda
def test_blocks_split_and_merge():
    pool = ptl.cuda.MemPool()                                       # starts with no segments
    res0 = ptl.cuda.memory_reserved()
    with ptl.cuda.use_mem_pool(pool):
        parts = [ptl.empty(2 * MiB, dtype="uint8", device="cuda") for _ in range(3)]
        res1 = ptl.cuda.memory_reserved()
        assert res1 - res0 == 20 * MiB                              # three splits of one 20 MiB segment
        del parts
        whole = ptl.empty(15 * MiB, dtype="uint8", device="cuda")  # fits only if the pieces merged back
        assert ptl.cuda.memory_reserved() == res1
        del whole
    pool.release()
    assert ptl.cuda.memory_reserved() == res0


@pytest.mark.cuda
def test_private_pool_is_separate():
    ptl.cuda.empty_cache()
    t = ptl.empty(MiB, dtype="uint8", device="cuda")
    del t                                                   # a cached free block in the default pool
    res = ptl.cuda.memory_reserved()
    pool = ptl.cuda.MemPool()
    with ptl.cuda.use_mem_pool(pool):
        p = ptl.zeros(MiB, dtype="uint8", device="cuda")
    res_pool = ptl.cuda.memory_reserved()
    assert res_pool > res                                   # the pool did not take the cached block
    q = ptl.empty(MiB, dtype="uint8", device="cuda")        # outside the block: the cached block again
    assert ptl.cuda.memory_reserved() == res_pool
    assert not p.numpy().any()
    del q
    pool.release()                                          # retired; freed once its tensor goes
    held = ptl.cuda.memory_reserved()
    del p
    assert ptl.cuda.memory_reserved() < held
    with pytest.raises(ValueError, match="released"):
        with ptl.cuda.use_mem_pool(pool):
            pass


@pytest.mark.cuda
def test_out_of_memory_raises_cuda_error_naming_the_call():
    with pytest.raises(ptl.CudaError, match="cudaMalloc.*out of memory"):
        ptl.empty(1 << 50, dtype="uint8", device="cuda")
    x = ptl.tensor(np.arange(10, dtype=np.float32), device="cuda")  # the device still works
    assert np.array_equal(x.numpy(), np.arange(10, dtype=np.float32))
