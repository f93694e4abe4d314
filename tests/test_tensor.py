import numpy as np
import pytest

import ptl

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8"]
SHAPES = [(), (0,), (1,), (3, 0, 2), (2, 3, 1, 4, 5), (7,)]


def sample(shape, dtype, rng):
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_numpy_round_trip(dtype, shape):
    a = sample(shape, dtype, np.random.default_rng(0))
    t = ptl.tensor(a)
    assert t.shape == shape and t.dtype == dtype and t.device == "cpu" and t.ndim == len(shape)
    assert t.nbytes == a.nbytes and t.numel() == a.size
    back = t.numpy()
    assert back.dtype == a.dtype and back.shape == shape
    assert back.tobytes() == a.tobytes()
    assert np.asarray(t).tobytes() == a.tobytes()


def test_large_round_trip():
    a = np.random.default_rng(1).standard_normal((1 << 22) + 3).astype(np.float32)
    assert np.array_equal(ptl.tensor(a).numpy(), a)


def test_non_contiguous_and_sequences_are_copied():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    for view in (a[::2], a.T, a[:, 1::3]):
        assert np.array_equal(ptl.tensor(view).numpy(), view)
    assert np.array_equal(ptl.tensor([[1, 2], [3, 4]]).numpy(), np.array([[1, 2], [3, 4]]))
    assert ptl.tensor(np.array([True, False])).dtype == "uint8"


def test_dtype_argument_converts():
    a = np.array([1.5, -2.25, 3.0], dtype=np.float64)
    assert ptl.tensor(a, dtype="float32").numpy().dtype == np.float32
    assert np.array_equal(ptl.tensor(a, dtype=np.int32).numpy(), np.array([1, -2, 3], np.int32))
    b = ptl.tensor(a, dtype=ptl.bfloat16)
    assert b.dtype == "bfloat16" and b.nbytes == 6
    assert b.numpy().dtype == np.float32  # bfloat16 comes back as float32
    assert np.array_equal(b.numpy(), a.astype(np.float32))


def test_to_and_tensor_from_tensor():
    t = ptl.tensor(np.array([1.0, 2.5], np.float32))
    assert t.to() is t and t.to(device="cpu", dtype="float32") is t
    h = t.to(dtype="float16")
    assert h.dtype == "float16" and np.array_equal(h.numpy(), np.array([1.0, 2.5], np.float16))
    c = ptl.tensor(t, dtype="float64")
    assert c.dtype == "float64" and np.array_equal(c.numpy(), [1.0, 2.5])


def test_empty_zeros_full():
    z = ptl.zeros((2, 3), dtype="int64")
    assert z.shape == (2, 3) and z.dtype == "int64" and not z.numpy().any()
    assert ptl.empty(5).dtype == "float32" and ptl.empty(5).shape == (5,)
    assert ptl.zeros([]).shape == ()
    f = ptl.full((4,), 2.5, dtype="bfloat16")
    assert np.array_equal(f.numpy(), np.full(4, 2.5, np.float32))
    assert np.array_equal(ptl.full(3, 300, dtype="uint8").numpy(), [255, 255, 255])  # saturates


def test_repr_len_item():
    t = ptl.zeros((2, 3))
    assert repr(t) == "ptl.Tensor(shape=(2, 3), dtype=float32, device='cpu')"
    assert len(t) == 2
    assert ptl.full((1,), 7.0).item() == 7.0
    with pytest.raises(ValueError, match="item"):
        t.item()
    with pytest.raises(TypeError):
        len(ptl.zeros(()))


@pytest.mark.parametrize("call, exc, words", [
    (lambda: ptl.zeros((2, -1)), ValueError, "shape"),
    (lambda: ptl.zeros("abc"), TypeError, "shape"),
    (lambda: ptl.zeros((2.5,)), TypeError, "shape"),
    (lambda: ptl.zeros((1,) * 9), ValueError, "shape"),
    (lambda: ptl.zeros(3, dtype="float8"), ValueError, "dtype"),
    (lambda: ptl.zeros(3, dtype=3.5), TypeError, "dtype"),
    (lambda: ptl.zeros(3, dtype=np.complex64), TypeError, "dtype"),
    (lambda: ptl.zeros(3, device="gpu"), ValueError, "device"),
    (lambda: ptl.zeros(3, device="cuda:x"), ValueError, "device"),
    (lambda: ptl.zeros(3, device=0), TypeError, "device"),
    (lambda: ptl.tensor(np.array([object()])), TypeError, "data"),
    (lambda: ptl.tensor(np.zeros(2, np.int8)), TypeError, "data"),
    (lambda: ptl.tensor(np.zeros(2, np.complex128)), TypeError, "data"),
    (lambda: ptl.tensor(object()), TypeError, "data"),
    (lambda: ptl.tensor([1.0], device="tpu"), ValueError, "device"),
    (lambda: ptl.Tensor(), TypeError, "ptl.tensor"),
    (lambda: ptl.zeros(3).to(dtype="int4"), ValueError, "dtype"),
    (lambda: ptl.zeros(3).__array__(copy=False), ValueError, "copy"),
])
def test_bad_arguments(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_cuda_requested_without_device():
    if ptl.cuda.is_available():
        with pytest.raises(ValueError, match="cuda:999"):
            ptl.zeros(3, device="cuda:999")
    else:
        for call in (lambda: ptl.zeros(3, device="cuda"), lambda: ptl.tensor([1.0], device="cuda:1"),
                     lambda: ptl.zeros(3).to(device="cuda")):
            with pytest.raises(ValueError, match="CUDA"):
                call()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_round_trip(dtype):
    rng = np.random.default_rng(2)
    for shape in SHAPES + [(1 << 20, 3)]:
        a = sample(shape, dtype, rng)
        t = ptl.tensor(a, device="cuda")
        assert t.device == "cuda:0" and t.shape == shape
        assert t.numpy().tobytes() == a.tobytes()
        assert t.to(device="cpu").numpy().tobytes() == a.tobytes()
        assert t.to(device="cuda").numpy().tobytes() == a.tobytes()


@pytest.mark.cuda
def test_cuda_conversions_and_zeros():
    a = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    g = ptl.tensor(a, device="cuda")
    for dt in ("float64", "float16", "bfloat16", "int32"):
        assert np.array_equal(g.to(dtype=dt).numpy(), ptl.tensor(a).to(dtype=dt).numpy())
        assert np.array_equal(ptl.tensor(a, dtype=dt, device="cuda").numpy(), ptl.tensor(a, dtype=dt).numpy())
    assert not ptl.zeros((3, 1000), device="cuda").numpy().any()
    assert np.array_equal(ptl.full(7, -1.5, dtype="float16", device="cuda").numpy(), np.full(7, -1.5, np.float16))


def test_from_numpy_shares_memory_and_keeps_the_array_alive():
    a = np.arange(6, dtype=np.float32)
    t = ptl.from_numpy(a)
    a[2] = 42.0
    assert t.numpy()[2] == 42.0 and t.data_ptr == a.ctypes.data
    del a
    assert t.numpy().tolist() == [0, 1, 42, 3, 4, 5]
    with pytest.raises(ValueError, match="contiguous"):
        ptl.from_numpy(np.zeros((4, 4), np.float32)[:, 1])
    with pytest.raises(TypeError, match="array"):
        ptl.from_numpy([1.0])
    with pytest.raises(TypeError, match="dtype"):
        ptl.from_numpy(np.zeros(3, np.int8))
