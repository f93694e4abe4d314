import numpy as np
import pytest

import ptl

# Known-answer vectors of Philox4x32-10 (Random123's kat_vectors).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr, key, want", KAT)
def test_philox_known_answers(ctr, key, want):
    assert ptl._C._philox4x32_10(*ctr, *key) == want


def test_uniform_is_the_documented_function_of_philox():
    g = ptl.Generator(seed=(7 << 32) | 5, offset=3)
    u = ptl.rand(9, generator=g).numpy()
    words = []
    for block in range(3, 6):
        words += ptl._C._philox4x32_10(block, 0, 0, 0, 5, 7)
    expect = (np.array(words[:9], np.uint64) >> 8).astype(np.float32) * np.float32(2.0**-24)
    assert np.array_equal(u, expect)
    assert g.offset == 6


def test_stream_offsets_and_seeds():
    whole = ptl.rand(16, generator=ptl.Generator(3)).numpy()
    g = ptl.Generator(3)
    a = ptl.rand(5, generator=g).numpy()   # uses blocks 0, 1
    b = ptl.rand(8, generator=g).numpy()   # starts at block 2 = draw 8
    assert np.array_equal(a, whole[:5]) and np.array_equal(b, whole[8:16])
    assert not np.array_equal(ptl.rand(16, generator=ptl.Generator(4)).numpy(), whole)
    assert ptl.seed_everything(3) == 3
    assert np.array_equal(ptl.rand(16).numpy(), whole)


def test_distributions():
    g = ptl.Generator(11)
    u = ptl.rand(1 << 20, generator=g, low=-2.0, high=3.0).numpy()
    assert u.min() >= -2.0 and u.max() < 3.0 and abs(u.mean() - 0.5) < 0.01
    z = ptl.randn(1 << 20, generator=g, mean=1.0, std=2.0).numpy().astype(np.float64)
    assert np.isfinite(z).all()
    assert abs(z.mean() - 1.0) < 0.01 and abs(z.std() - 2.0) < 0.01
    s = (z - 1.0) / 2.0
    assert abs((s ** 3).mean()) < 0.02 and abs((s ** 4).mean() - 3.0) < 0.05  # symmetric, Gaussian tails
    assert abs((np.abs(s) < 1).mean() - 0.6827) < 0.003


def test_lower_precision_draws_are_rounded_float32_draws():
    for fn in (ptl.rand, ptl.randn):
        f32 = fn(1001, generator=ptl.Generator(9)).numpy()
        for dt in ("bfloat16", "float16", "float64"):
            low = fn(1001, dtype=dt, generator=ptl.Generator(9)).numpy()
            assert np.array_equal(low, ptl.tensor(f32).to(dtype=dt).numpy())


def test_seed_everything_rejects_bad_seeds():
    with pytest.raises(TypeError, match="seed"):
        ptl.seed_everything("1")
    with pytest.raises(ValueError, match="seed"):
        ptl.seed_everything(-1)
    with pytest.raises(TypeError, match="floating-point"):
        ptl._C._rng_fill(ptl.zeros(3, dtype="int32"), 0, 0, 0, 0.0, 1.0)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_cuda_rng_bitwise_equal_cpu(dtype):
    for seed, offset, n in [(0, 0, 1), (1, 5, 1003), ((1 << 40) + 17, 1 << 33, 1 << 20)]:
        for fn in (ptl.rand, ptl.randn):
            c = fn(n, dtype=dtype, generator=ptl.Generator(seed, offset)).numpy()
            g = fn(n, dtype=dtype, device="cuda", generator=ptl.Generator(seed, offset)).numpy()
            assert np.array_equal(c.view(np.uint8), g.view(np.uint8)), (fn.__name__, seed, n)
