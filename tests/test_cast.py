"""float32 <-> bfloat16 / float16 casts: NumPy (float16) or an independent nearest-value search
(bfloat16) as the reference, and CUDA == CPU bit for bit."""
import numpy as np
import pytest

import ptl


def special_float32():
    bits = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FBFFFFF,
            0x00000001, 0x807FFFFF, 0x00400000, 0x7F7FFFFF, 0xFF7FFFFF, 0x33000000, 0x33000001, 0x32FFFFFF,
            0x38800000, 0x387FFFFF, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000, 0x3F801000, 0x3F803000,
            0x3F808000, 0x3F818000, 0x3F7FFFFF, 0x7F7F8000, 0x7F7F7FFF]
    rng = np.random.default_rng(0)
    rand = rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    # values in float16's range, and exact halfway points of float16 / bfloat16 grids
    near = (rng.standard_normal(1 << 18) * np.exp2(rng.integers(-26, 17, 1 << 18))).astype(np.float32)
    half_f16 = (rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint32) << 13) | 0x1000
    half_bf16 = (rng.integers(0, 1 << 16, 1 << 16, dtype=np.uint32) << 16) | 0x8000
    return np.concatenate([np.array(bits, np.uint32), rand, near.view(np.uint32), half_f16.astype(np.uint32),
                           half_bf16.astype(np.uint32)]).view(np.float32)


def bf16_reference(x):
    """Nearest bfloat16 by comparing both neighbours in float64; ties to the even pattern."""
    bits = x.view(np.uint32)
    lo = (bits >> 16).astype(np.uint32)
    hi = lo + 1
    to_f = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # noqa: E731
    with np.errstate(invalid="ignore", over="ignore"):
        xv = x.astype(np.float64)
        # past the largest finite pattern, the next one (Inf) stands for 2^128, as with an unbounded
        # exponent: IEEE rounding overflows to Inf from the halfway point up
        hv = np.where((hi & 0x7FFF) == 0x7F80, np.copysign(2.0**128, xv), to_f(hi))
        dlo, dhi = np.abs(xv - to_f(lo)), np.abs(hv - xv)
        pick_hi = (dhi < dlo) | ((dhi == dlo) & (lo % 2 == 1))
    out = np.where(pick_hi, hi, lo).astype(np.uint16)
    nan = np.isnan(x)
    out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def bf16_bits(t):
    """Raw bfloat16 patterns of a tensor, read back through an exact widening to float32."""
    return (t.numpy().view(np.uint32) >> 16).astype(np.uint16)


def test_float32_to_float16_matches_numpy():
    x = special_float32()
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(np.float16)
    got = ptl.tensor(x).to(dtype="float16").numpy()
    assert np.array_equal(got.view(np.uint16), ref.view(np.uint16))


def test_all_float16_patterns_to_float32_match_numpy():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got = ptl.tensor(h).to(dtype="float32").numpy()
    assert np.array_equal(got.view(np.uint32), h.astype(np.float32).view(np.uint32))
    assert np.array_equal(ptl.tensor(got).to(dtype="float16").numpy().view(np.uint16), h.view(np.uint16))


def test_float32_to_bfloat16_is_nearest_even():
    x = special_float32()
    got = bf16_bits(ptl.tensor(x).to(dtype="bfloat16"))
    finite = np.isfinite(x)
    ref = bf16_reference(x)
    assert np.array_equal(got[finite], ref[finite])
    assert np.array_equal(got[~finite], ref[~finite])
    big = np.array([3.4e38, -3.4e38], np.float32)  # rounds past the largest bfloat16
    assert np.isinf(ptl.tensor(big).to(dtype="bfloat16").numpy()).all()


def test_all_bfloat16_patterns_round_trip():
    patterns = np.arange(1 << 16, dtype=np.uint32)
    f = (patterns << 16).view(np.float32)
    back = bf16_bits(ptl.tensor(f).to(dtype="bfloat16"))
    nan = np.isnan(f)
    assert np.array_equal(back[~nan], patterns[~nan].astype(np.uint16))
    assert np.array_equal(back[nan], (patterns[nan] | 0x40).astype(np.uint16))  # NaNs stay NaN, made quiet


def test_other_casts_follow_documented_rules():
    x = np.array([1.9, -1.9, np.nan, 1e20, -1e20, 300.0, -5.0], np.float32)
    assert np.array_equal(ptl.tensor(x).to(dtype="int32").numpy(), [1, -1, 0, 2147483647, -2147483648, 300, -5])
    assert np.array_equal(ptl.tensor(x).to(dtype="uint8").numpy(), [1, 0, 0, 255, 0, 255, 0])
    big = np.array([2**62 + 1, -(2**62) - 1], np.int64)
    assert np.array_equal(ptl.tensor(big).to(dtype="int64").numpy(), big)


@pytest.mark.cuda
@pytest.mark.parametrize("dst", ["float16", "bfloat16"])
def test_cuda_casts_bitwise_equal_cpu(dst):
    x = special_float32()
    cpu = ptl.tensor(x).to(dtype=dst)
    gpu = ptl.tensor(x, device="cuda").to(dtype=dst)
    assert np.array_equal(gpu.numpy().view(np.uint8), cpu.numpy().view(np.uint8))
    # and back: every 16-bit pattern to float32
    pats = np.arange(1 << 16, dtype=np.uint32)
    src = ptl.tensor((pats << 16).view(np.float32)).to(dtype=dst)  # all patterns (bf16) / a spread (f16)
    if dst == "float16":
        src = ptl.tensor(pats.astype(np.uint16).view(np.float16))
    a = src.to(dtype="float32").numpy().view(np.uint32)
    b = src.to(device="cuda").to(dtype="float32").numpy().view(np.uint32)
    assert np.array_equal(a, b)


@pytest.mark.cuda
def test_cuda_generic_casts_equal_cpu():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(10000) * 1000).astype(np.float64)
    for src in ("float64", "float32", "int64", "uint8"):
        for dst in ("float64", "float32", "float16", "bfloat16", "int32", "int64", "uint8"):
            c = ptl.tensor(x, dtype=src).to(dtype=dst)
            g = ptl.tensor(x, dtype=src, device="cuda").to(dtype=dst)
            assert np.array_equal(c.numpy(), g.numpy(), equal_nan=True), (src, dst)
