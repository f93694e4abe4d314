"""CUDA layer kernels (csrc/cuda/*.cu) against the CPU references, forward and backward, in float32, bfloat16
and float16, through the test bindings ptl._C.layer_* (one per op, run on the device of its tensors) and
the convolution plans of ptl._C.layer_conv2d_* (the same bindings as the CPU tests'; the plan's CUDA
algorithms from ptl._C.layer_cuda_conv2d_plan_info).

Reduced-precision inputs are rounded to their dtype first and the CPU reference (float64) runs on the
rounded values, so the comparison measures the kernels, not the input rounding. Errors are relative
norms, |gpu - ref| / |ref|. Also: BatchNorm running statistics, parameter-gradient accumulation, bitwise
reproducibility of re-runs, no NaN, bitwise agreement with the CPU float32 kernels where the arithmetic is
the same (max-pool, upsample, copies, adds), and argument checking."""
import zlib

import numpy as np
import pytest

import ptl

C = ptl._C
pytestmark = pytest.mark.cuda

DTYPES = ["float32", "bfloat16", "float16"]
# bfloat16 / float16: the kernels compute in float32 and round each stored value to nearest, so a result
# that is stored once (or twice: a saved intermediate) is within a few unit roundoffs u of the float64
# truth on the same rounded inputs; 2u each: bfloat16 (8 significant bits) u = 2^-8, float16 (11) u = 2^-11
LOW = {"bfloat16": 2 * 2.0 ** -8, "float16": 2 * 2.0 ** -11}


def seed(key):
    return zlib.crc32(repr(key).encode())


def tol(dt, f32):
    return f32 if dt == "float32" else LOW[dt]


def gpu(a, dt="float32"):
    return ptl.tensor(np.ascontiguousarray(a, dtype=np.float32), device="cuda").to(dtype=dt)


def host(t):
    """A float64 NumPy copy of any tensor."""
    return np.asarray(t.to(device="cpu", dtype="float32").numpy(), dtype=np.float64)


def rounded(a, dt):
    """a rounded to dt (what the GPU sees), as float64."""
    return host(gpu(a, dt))


def round_like_gpu(a, dt):
    """float32 values rounded to nearest-even in dt (NumPy's own rounding, not the GPU's), as float64:
    what one float32 operation stored in dt gives."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dt == "float16":
        return a.astype(np.float16).astype(np.float64)
    if dt == "bfloat16":
        bits = a.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def T64(a):
    return ptl.tensor(np.ascontiguousarray(a, dtype=np.float64))


def N(t):
    return np.asarray(t.numpy(), dtype=np.float64)


def rel(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(a).all(), "non-finite values in the CUDA result"
    d = np.linalg.norm(ref)
    return np.linalg.norm(a - ref) / (d if d > 0 else 1.0)


def same_bits(a, b):
    return np.array_equal(np.asarray(a.numpy()).view(np.uint8), np.asarray(b.numpy()).view(np.uint8))


def empty(shape, dt="float32"):
    return ptl.empty(tuple(int(s) for s in shape), dt, "cuda")


# ---------------------------------------------------------------------------------------------- conv2d

CONV_CASES = [
    # n, h, w, cin, cout, k, stride, groups
    (2, 5, 7, 3, 4, 3, 1, 1),       # tiny, odd sizes
    (1, 7, 6, 4, 5, 3, 2, 1),       # stride 2
    (2, 6, 5, 4, 4, 3, 1, 4),       # depthwise
    (1, 7, 7, 8, 8, 3, 2, 8),       # depthwise stride 2
    (2, 20, 20, 64, 64, 3, 1, 64),  # depthwise, a weight gradient reduced over many chunks
    (1, 9, 11, 12, 12, 3, 2, 12),   # depthwise: 16-byte packs in float32 only (12 channels)
    (1, 6, 6, 4, 4, 5, 1, 4),       # depthwise 5x5 (through cuDNN; the direct kernels are 3x3)
    (2, 4, 5, 6, 3, 1, 1, 1),       # 1x1
    (1, 5, 6, 4, 6, 3, 1, 2),       # general groups
    (1, 6, 5, 2, 3, 5, 1, 1),       # 5x5
    (2, 32, 32, 3, 16, 3, 2, 1),    # the stem: 3 input channels (a direct forward, conv2d_narrow.h)
    (1, 9, 8, 1, 8, 3, 1, 1),       # one input channel, not depthwise
    (2, 7, 9, 2, 24, 3, 2, 1),      # two input channels, stride 2; x of 252 elements: loaded by element
    (2, 70, 150, 4, 40, 3, 2, 1),   # narrow weight gradient: two pixel tiles a row (64 + 11), 40 outputs (16 + 16 + 8)
    (1, 20, 140, 4, 64, 3, 2, 1),   # narrow weight gradient: 64 outputs, over 48 KB of shared memory
    (2, 16, 16, 32, 64, 3, 2, 1),   # a downsampling Conv
    (2, 16, 16, 64, 32, 1, 1, 1),   # a 1x1 projection
    (2, 10, 10, 64, 64, 3, 1, 64),  # a depthwise 3x3 (the attention's pe)
]


@pytest.fixture(params=["graph", "legacy"])
def cudnn_api(request, monkeypatch):
    """Plans made through cuDNN's graph API (the default) or its legacy entry points (PTL_CUDNN_API)."""
    if request.param == "legacy":
        monkeypatch.setenv("PTL_CUDNN_API", "legacy")
    else:
        monkeypatch.delenv("PTL_CUDNN_API", raising=False)
    return request.param


def cpu_conv(x, wt, s, g):
    """The CPU reference's plan for float64 copies of x and wt, and the copies."""
    x64, w64 = T64(x), T64(wt)
    return C.layer_conv2d_plan(x64, w64, s, g), x64, w64


def conv_setup(case, dt, rng, **opts):
    n, h, w, cin, cout, k, s, g = case
    x = rounded(rng.standard_normal((n, h, w, cin)), dt)
    wt = rounded(rng.standard_normal((cout, k, k, cin // g)) / np.sqrt(k * k * cin / g), dt)
    xg, wg = gpu(x, dt), gpu(wt, dt)
    plan = C.layer_conv2d_plan(xg, wg, s, g, **opts)
    info = C.layer_cuda_conv2d_plan_info(plan)
    ws = empty((info["workspace"],), "uint8") if info["workspace"] else None
    return x, wt, xg, wg, plan, info, ws


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_forward_backward_match_cpu(case, dt, cudnn_api):
    rng = np.random.default_rng(seed(case))
    n, h, w, cin, cout, k, s, g = case
    x, wt, xg, wg, plan, info, ws = conv_setup(case, dt, rng)
    ho, wo = info["y_shape"][1:3]
    b = rounded(rng.standard_normal(cout), dt)
    y = empty(info["y_shape"], dt)
    C.layer_conv2d_forward(plan, xg, wg, gpu(b, dt), y, ws)
    rp, x64, w64 = cpu_conv(x, wt, s, g)
    ref = N(C.layer_conv2d_forward(rp, x64, w64, T64(b)))
    assert ref.shape == (n, ho, wo, cout)
    assert rel(host(y), ref) <= tol(dt, 1e-4)
    y2 = empty(info["y_shape"], dt)
    C.layer_conv2d_forward(plan, xg, wg, None, y2, ws)
    assert rel(host(y2), N(C.layer_conv2d_forward(rp, x64, w64, None))) <= tol(dt, 1e-4)

    dy = rounded(rng.standard_normal((n, ho, wo, cout)), dt)
    dyg = gpu(dy, dt)
    dx = empty(x.shape, dt)
    C.layer_conv2d_backward_input(plan, dyg, wg, dx, ws)
    dx_ref = T64(np.zeros_like(x))
    C.layer_conv2d_backward_input(rp, T64(dy), w64, dx_ref)
    assert rel(host(dx), N(dx_ref)) <= tol(dt, 1e-4)

    # parameter gradients accumulate onto what is there
    dw0 = rounded(rng.standard_normal(wt.shape), dt)
    dwg = gpu(dw0, dt)
    C.layer_conv2d_backward_weight(plan, xg, dyg, dwg, ws)
    dw_ref = T64(dw0)
    C.layer_conv2d_backward_weight(rp, x64, T64(dy), dw_ref)
    assert rel(host(dwg), N(dw_ref)) <= tol(dt, 1e-4)
    db0 = rounded(rng.standard_normal(cout), dt)
    dbg = gpu(db0, dt)
    C.layer_conv2d_backward_bias(plan, dyg, dbg, ws)
    db_ref = T64(db0)
    C.layer_conv2d_backward_bias(rp, T64(dy), db_ref)
    assert rel(host(dbg), N(db_ref)) <= tol(dt, 1e-5 if dt == "float32" else LOW[dt])


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_conv2d_narrow_on_tensor_cores(dt):
    """The stem's forward and weight gradient in bfloat16 and float16 run on tensor cores (conv2d_narrow.h), not
    cuDNN: on a shape with more pixel tiles than the weight gradient has warps (each warp adds several tiles) both
    match the float64 reference, the gradient adds onto dw, and both repeat bit for bit."""
    rng = np.random.default_rng(7)
    case = (4, 320, 896, 3, 16, 3, 2, 1)  # 4 * 160 rows of 7 tiles: 4480 tiles over 4096 warps
    x, wt, xg, wg, plan, info, ws = conv_setup(case, dt, rng)
    assert info["algos"][0] == -1 and info["algos"][2] == -1 and info["tensor_op"][2]
    rp, x64, w64 = cpu_conv(x, wt, 2, 1)
    ys = []
    for _ in range(2):
        y = empty(info["y_shape"], dt)
        C.layer_conv2d_forward(plan, xg, wg, None, y, ws)
        ys.append(host(y))
    assert np.array_equal(ys[0], ys[1])
    assert rel(ys[0], N(C.layer_conv2d_forward(rp, x64, w64, None))) <= tol(dt, 1e-4)
    ho, wo = info["y_shape"][1:3]
    dy = rounded(rng.standard_normal((4, ho, wo, 16)), dt)
    dyg = gpu(dy, dt)
    dw0 = rounded(rng.standard_normal(wt.shape), dt)
    got = []
    for _ in range(2):
        dwg = gpu(dw0, dt)
        C.layer_conv2d_backward_weight(plan, xg, dyg, dwg, ws)
        got.append(host(dwg))
    assert np.array_equal(got[0], got[1])
    ref = T64(dw0)
    C.layer_conv2d_backward_weight(rp, x64, T64(dy), ref)
    assert rel(got[0], N(ref)) <= LOW[dt]


def test_conv2d_float32_plans_are_true_float32_and_deterministic(cudnn_api):
    rng = np.random.default_rng(1)
    case = (2, 16, 16, 32, 64, 3, 1, 1)
    _, _, xg, wg, plan, info, ws = conv_setup(case, "float32", rng)
    assert info["path"] == "cudnn-" + cudnn_api
    assert info["tensor_op"] == (False, False, False)
    assert info["dtype"] == "float32"
    assert min(info["algos"]) >= 0
    # 1x1 stride-1 ungrouped convolutions run as cuBLAS GEMMs (no cuDNN algorithm)
    _, _, _, _, _, info1, _ = conv_setup((2, 8, 8, 32, 16, 1, 1, 1), "float32", rng)
    assert info1["algos"] == (-1, -1, -1) and info1["tensor_op"] == (False, False, False)
    assert info1["path"] == "cublas"
    # depthwise 3x3 runs the direct kernels (no cuDNN algorithm, no heuristics query when planning)
    _, _, _, _, _, info2, _ = conv_setup((2, 8, 8, 16, 16, 3, 1, 16), "float32", rng)
    assert info2["algos"] == (-1, -1, -1) and info2["tensor_op"] == (False, False, False)
    assert info2["path"] == "direct"
    _, _, _, _, _, info3, _ = conv_setup((2, 8, 8, 16, 16, 5, 1, 16), "float32", rng)
    assert min(info3["algos"]) >= 0
    # so does the forward of a 3x3 convolution with at most 4 input channels (the stem; cuDNN's backward)
    _, _, _, _, _, info4, _ = conv_setup((2, 8, 8, 3, 16, 3, 2, 1), "float32", rng)
    assert info4["algos"][0] == -1 and min(info4["algos"][1:]) >= 0
    for narrow in ((1, 6, 5, 2, 8, 5, 1, 1), (1, 6, 5, 2, 12, 3, 1, 1)):  # 5x5; output channels not a multiple of 8
        _, _, _, _, _, info5, _ = conv_setup(narrow, "float32", rng)
        assert min(info5["algos"]) >= 0
    # the float32 plans rerun bitwise: forward and every backward
    x, wt = host(xg), host(wg)
    dyg = gpu(rng.standard_normal(info["y_shape"]))
    runs = []
    for _ in range(2):
        y, dx = empty(info["y_shape"]), empty(x.shape)
        dw, db = ptl.zeros(wt.shape, "float32", "cuda"), ptl.zeros((wt.shape[0],), "float32", "cuda")
        C.layer_conv2d_forward(plan, xg, wg, None, y, ws)
        C.layer_conv2d_backward_input(plan, dyg, wg, dx, ws)
        C.layer_conv2d_backward_weight(plan, xg, dyg, dw, ws)
        C.layer_conv2d_backward_bias(plan, dyg, db, ws)
        runs.append((y, dx, dw, db))
    assert all(same_bits(a, b) for a, b in zip(*runs))
    # bf16 plans are free to use tensor cores; the TF32 opt-in too (no assertion on what cuDNN picks)
    C.layer_conv2d_plan(gpu(host(xg), "bfloat16"), gpu(host(wg), "bfloat16"), 1, 1)
    C.layer_conv2d_plan(xg, wg, 1, 1, allow_tf32=True)


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", [(4, 40, 40, 32, 64, 3, 1, 1), (4, 80, 80, 64, 32, 1, 1, 1),
                                  (4, 40, 40, 64, 64, 3, 1, 64),  # cuDNN, GEMM, depthwise
                                  (4, 64, 64, 3, 16, 3, 2, 1)])  # the stem's direct forward
def test_conv2d_reruns_are_bitwise_equal(case, dt, cudnn_api):
    rng = np.random.default_rng(2)
    x, wt, xg, wg, plan, info, ws = conv_setup(case, dt, rng)
    dyg = gpu(rng.standard_normal(info["y_shape"]), dt)
    outs = []
    for _ in range(2):
        y = empty(info["y_shape"], dt)
        dx = empty(x.shape, dt)
        dw = ptl.zeros(wt.shape, dt, "cuda")
        db = ptl.zeros((wt.shape[0],), dt, "cuda")
        C.layer_conv2d_forward(plan, xg, wg, None, y, ws)
        C.layer_conv2d_backward_input(plan, dyg, wg, dx, ws)
        C.layer_conv2d_backward_weight(plan, xg, dyg, dw, ws)
        C.layer_conv2d_backward_bias(plan, dyg, db, ws)
        outs.append((y, dx, dw, db))
    for a, b in zip(*outs):
        assert same_bits(a, b)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("case", [(2, 16, 16, 32, 64, 3, 2, 1), (2, 12, 12, 16, 24, 3, 1, 1),
                                  (2, 16, 16, 64, 32, 1, 1, 1), (2, 10, 10, 64, 64, 3, 1, 64),
                                  (2, 11, 11, 16, 16, 3, 2, 16)])  # cuDNN (two), GEMM, depthwise (two)
def test_conv2d_backward_input_adds(case, dt, cudnn_api):
    """dx += dL/dx in one call (an input with several consumers, as the executor adds it): the CPU reference's
    sum within the dtype's rounding, and the same bits from run to run."""
    rng = np.random.default_rng(seed(case) + 7)
    x, wt, xg, wg, plan, info, ws = conv_setup(case, dt, rng)
    assert info["adds_input_grad"]
    dy = rounded(rng.standard_normal(info["y_shape"]), dt)
    dx0 = rounded(rng.standard_normal(x.shape), dt)
    rp, _, w64 = cpu_conv(x, wt, case[6], case[7])
    ref = T64(dx0)
    C.layer_conv2d_backward_input(rp, T64(dy), w64, ref, None, True)
    outs = []
    for _ in range(2):
        dx = gpu(dx0, dt)
        C.layer_conv2d_backward_input(plan, gpu(dy, dt), wg, dx, ws, True)
        outs.append(dx)
    assert rel(host(outs[0]), N(ref)) <= tol(dt, 1e-4)
    assert same_bits(*outs)


@pytest.mark.parametrize("case", [(2, 20, 20, 16, 32, 3, 1, 1), (2, 20, 20, 32, 16, 3, 2, 1),
                                  (2, 16, 16, 32, 32, 1, 1, 1), (2, 20, 20, 32, 32, 3, 1, 32)])
def test_conv2d_forward_only_plans(case, cudnn_api):
    """A forward-only plan (a no-grad layout's) gives the full plan's forward bits, needs no more workspace,
    and refuses every backward direction by name."""
    rng = np.random.default_rng(4)
    x, wt, xg, wg, plan, info, ws = conv_setup(case, "bfloat16", rng)
    fplan = C.layer_conv2d_plan(xg, wg, case[6], case[7], forward_only=True)
    finfo = C.layer_cuda_conv2d_plan_info(fplan)
    assert finfo["path"] == info["path"] and finfo["algos"][0] == info["algos"][0]
    assert finfo["workspace"] <= info["workspace"]
    b = gpu(rng.standard_normal(case[4]), "bfloat16")
    y, fy = empty(info["y_shape"], "bfloat16"), empty(info["y_shape"], "bfloat16")
    C.layer_conv2d_forward(plan, xg, wg, b, y, ws)
    fws = empty((finfo["workspace"],), "uint8") if finfo["workspace"] else None
    C.layer_conv2d_forward(fplan, xg, wg, b, fy, fws)
    assert same_bits(y, fy)
    dyg = gpu(rng.standard_normal(info["y_shape"]), "bfloat16")
    with pytest.raises(ValueError, match="backward_input_cuda: the plan was made for forwards only"):
        C.layer_conv2d_backward_input(fplan, dyg, wg, empty(x.shape, "bfloat16"), ws)
    with pytest.raises(ValueError, match="backward_weight_cuda: the plan was made for forwards only"):
        C.layer_conv2d_backward_weight(fplan, xg, dyg, ptl.zeros(wt.shape, "bfloat16", "cuda"), ws)
    with pytest.raises(ValueError, match="backward_bias_cuda: the plan was made for forwards only"):
        C.layer_conv2d_backward_bias(fplan, dyg, ptl.zeros((case[4],), "bfloat16", "cuda"), ws)


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_conv2d_find_mode_and_workspace_checks(dt, cudnn_api):
    rng = np.random.default_rng(3)
    case = (2, 12, 12, 16, 16, 3, 1, 1)
    x, wt, xg, wg, plan, info, ws = conv_setup(case, dt, rng, find=True)
    if dt == "float32":
        assert info["tensor_op"] == (False, False, False)
    y = empty(info["y_shape"], dt)
    C.layer_conv2d_forward(plan, xg, wg, None, y, ws)
    rp, x64, w64 = cpu_conv(x, wt, 1, 1)
    assert rel(host(y), N(C.layer_conv2d_forward(rp, x64, w64, None))) <= tol(dt, 1e-4)
    dy = rounded(rng.standard_normal(info["y_shape"]), dt)
    dx, dw = empty(x.shape, dt), ptl.zeros(wt.shape, dt, "cuda")
    C.layer_conv2d_backward_input(plan, gpu(dy, dt), wg, dx, ws)
    C.layer_conv2d_backward_weight(plan, xg, gpu(dy, dt), dw, ws)
    dx_ref, dw_ref = T64(np.zeros(x.shape)), T64(np.zeros(wt.shape))
    C.layer_conv2d_backward_input(rp, T64(dy), w64, dx_ref)
    C.layer_conv2d_backward_weight(rp, x64, T64(dy), dw_ref)
    assert rel(host(dx), N(dx_ref)) <= tol(dt, 1e-4) and rel(host(dw), N(dw_ref)) <= tol(dt, 1e-4)
    if info["workspace"] > 0:
        with pytest.raises(ValueError, match="workspace"):
            C.layer_conv2d_backward_bias(plan, gpu(np.zeros(info["y_shape"]), dt), ptl.zeros((16,), dt, "cuda"),
                                              None)


def test_conv2d_find_gives_its_scratch_back(cudnn_api):
    """The timed search runs the candidates on scratch tensors of the problem's sizes in a private pool, which
    goes back to the driver with the plan made: nothing stays reserved (Trainer(benchmark=True) keeps the
    network's peak memory)."""
    rng = np.random.default_rng(5)
    case = (2, 72, 56, 24, 40, 3, 1, 1)  # a shape no other test plans: the search runs here, not from a cache
    xg = gpu(rounded(rng.standard_normal(case[:4]), "bfloat16"), "bfloat16")
    wg = gpu(rounded(rng.standard_normal((40, 3, 3, 24)) / 15, "bfloat16"), "bfloat16")
    ptl.cuda.synchronize()
    before = ptl.cuda.memory_reserved()
    plan = C.layer_conv2d_plan(xg, wg, 1, 1, find=True)
    assert C.layer_cuda_conv2d_plan_info(plan)["y_shape"] == (2, 72, 56, 40)
    assert ptl.cuda.memory_reserved() == before


def test_conv2d_rejects_bad_arguments():
    rng = np.random.default_rng(4)
    x, wt, xg, wg, plan, info, ws = conv_setup((1, 6, 6, 4, 8, 3, 1, 1), "float32", rng)
    with pytest.raises(ValueError, match="w"):
        C.layer_conv2d_plan(ptl.tensor(x.astype(np.float32)), wg, 1, 1)  # x on the CPU, w on CUDA
    with pytest.raises(ValueError, match="plan"):
        C.layer_cuda_conv2d_plan_info(C.layer_conv2d_plan(T64(x), T64(wt), 1, 1))  # a CPU plan
    with pytest.raises(TypeError, match="x"):
        C.layer_conv2d_plan(ptl.tensor(x, device="cuda"), wg, 1, 1)  # float64
    with pytest.raises(ValueError, match="groups"):
        C.layer_conv2d_plan(xg, wg, 1, 3)
    with pytest.raises(ValueError, match="y"):
        C.layer_conv2d_forward(plan, xg, wg, None, empty((1, 5, 6, 8)), ws)
    with pytest.raises(TypeError, match="plan"):
        C.layer_conv2d_forward(None, xg, wg, None, empty(info["y_shape"]), ws)
    with pytest.raises(TypeError, match="plan"):
        C.layer_conv2d_forward(plan, gpu(x, "bfloat16"), gpu(wt, "bfloat16"), None,
                                    empty(info["y_shape"], "bfloat16"), ws)


# ---------------------------------------------------------------------------------------------- batchnorm

# the last: a layer of yolo26n's size at batch 2, 640 (many row chunks), and a partial channel tile
BN_SHAPES = [(2, 5, 7, 16), (3, 1, 1, 8), (1, 9, 9, 3), (4, 40, 40, 32), (2, 6, 6, 100), (1, 3, 4, 640),
             (2, 160, 160, 48)]


def bn_inputs(shape, dt, rng):
    c = shape[-1]
    x = rounded(3.0 + 2.0 * rng.standard_normal(shape), dt)  # a mean far from 0 tests the shifted sums
    gamma = 1.0 + 0.5 * rng.standard_normal(c)
    beta = 0.5 * rng.standard_normal(c)
    rm = rng.standard_normal(c)
    rv = 0.5 + rng.random(c)
    return x, gamma, beta, rm, rv


def g32(a):
    return gpu(a, "float32")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batchnorm_forward_backward_match_cpu(shape, training, act, dt):
    rng = np.random.default_rng(seed((shape, training, act)))
    x, gamma, beta, rm, rv = bn_inputs(shape, dt, rng)
    # the CPU reference in float64 with float32-rounded parameters (the GPU keeps them in float32)
    gamma, beta, rm, rv = (rounded(a, "float32") for a in (gamma, beta, rm, rv))
    rmg, rvg = g32(rm), g32(rv)
    y, sm, si = C.layer_batchnorm_forward(gpu(x, dt), g32(gamma), g32(beta), rmg, rvg, training, act)
    assert y.dtype == dt and sm.dtype == "float32" and si.dtype == "float32"
    rm_ref, rv_ref = T64(rm), T64(rv)
    y_ref, sm_ref, si_ref = C.layer_batchnorm_forward(T64(x), T64(gamma), T64(beta), rm_ref, rv_ref, training, act)
    assert rel(host(y), N(y_ref)) <= tol(dt, 1e-5)
    for got, ref in ((sm, sm_ref), (si, si_ref), (rmg, rm_ref), (rvg, rv_ref)):
        assert rel(host(got), N(ref)) <= 1e-6

    dy = rounded(rng.standard_normal(shape), dt)
    dg0, db0 = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
    dx, dgg, dbg = empty(shape, dt), g32(dg0), g32(db0)
    C.layer_batchnorm_backward(gpu(x, dt), gpu(dy, dt), g32(gamma), g32(beta), sm, si, training, act, dx, dgg,
                                    dbg)
    dx_ref, dg_ref, db_ref = T64(np.zeros(shape)), T64(rounded(dg0, "float32")), T64(rounded(db0, "float32"))
    C.layer_batchnorm_backward(T64(x), T64(dy), T64(gamma), T64(beta), T64(host(sm)), T64(host(si)), training, act,
                               dx_ref, dg_ref, db_ref)
    assert rel(host(dx), N(dx_ref)) <= tol(dt, 1e-5)
    assert rel(host(dgg), N(dg_ref)) <= 1e-5
    assert rel(host(dbg), N(db_ref)) <= 1e-5


CONV_BN_CASES = [
    # (n, h, w, cin, cout, k, stride), x's mean
    ((2, 9, 7, 16, 24, 3, 1), 0.0),      # 24 channels: a 32-wide channel tile, part of it past cout
    ((2, 10, 10, 32, 64, 3, 2), 4.0),    # stride 2; a mean far from 0 tests the shifted sums
    ((3, 11, 13, 64, 128, 1, 1), 0.0),   # 1x1, two channel tiles, a last row tile of 45 rows
    ((1, 20, 20, 8, 16, 3, 1), 2.0),     # 8 input channels: k = 72, a k slice half past k's end
    ((2, 17, 15, 48, 80, 3, 1), -3.0),   # 80 channels: a second channel tile of 16
    ((4, 256, 160, 8, 16, 3, 1), 1.0),   # 2560 row tiles on 256 blocks: 10 tiles a block in one pipeline
    ((2, 8, 8, 3, 16, 3, 2), 0.0),       # 3 input channels: the plan's convolution, then BatchNorm
]


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("case,mean", CONV_BN_CASES)
def test_conv2d_batchnorm_forward_matches_cpu(case, mean, act, dt, monkeypatch):
    """The training forward of a Conv layer (conv2d_bn.h), fused wherever the kernel takes the shape
    (PTL_CONV_BN=1): z against the CPU convolution, and the statistics, running statistics and y against the CPU
    BatchNorm of the GPU's own z (so they measure the fused sums alone); a rerun gives the same bits."""
    monkeypatch.setenv("PTL_CONV_BN", "1")
    n, h, w, cin, cout, k, s = case
    rng = np.random.default_rng(seed((case, act, dt)))
    x = rounded(mean + rng.standard_normal((n, h, w, cin)), dt)
    wt = rounded(rng.standard_normal((cout, k, k, cin)) / np.sqrt(k * k * cin), dt)
    xg, wg = gpu(x, dt), gpu(wt, dt)
    plan = C.layer_conv2d_plan(xg, wg, s, 1)
    info = C.layer_cuda_conv2d_plan_info(plan)
    assert info["conv_bn_fused"] == (cin % 8 == 0)
    ws = empty((info["workspace"],), "uint8") if info["workspace"] else None
    _, gamma, beta, rm, rv = bn_inputs((1, cout), dt, rng)
    gamma, beta, rm, rv = (rounded(a, "float32") for a in (gamma, beta, rm, rv))
    runs = []
    for _ in range(2):
        rmg, rvg = g32(rm), g32(rv)
        z, y, sm, si = C.layer_conv2d_batchnorm_forward(plan, xg, wg, g32(gamma), g32(beta), rmg, rvg, act, ws)
        runs.append((z, y, sm, si, rmg, rvg))
    assert all(same_bits(a, b) for a, b in zip(*runs))
    z, y, sm, si, rmg, rvg = runs[0]
    assert z.dtype == y.dtype == dt and tuple(z.shape) == tuple(info["y_shape"])
    rp, x64, w64 = cpu_conv(x, wt, s, 1)
    assert rel(host(z), N(C.layer_conv2d_forward(rp, x64, w64, None))) <= tol(dt, 0)
    rm_ref, rv_ref = T64(rm), T64(rv)
    y_ref, sm_ref, si_ref = C.layer_batchnorm_forward(T64(host(z)), T64(gamma), T64(beta), rm_ref, rv_ref, True,
                                                      act)
    for got, ref in ((sm, sm_ref), (si, si_ref), (rmg, rm_ref), (rvg, rv_ref)):
        assert rel(host(got), N(ref)) <= 1e-6
    assert rel(host(y), N(y_ref)) <= tol(dt, 0)


@pytest.mark.parametrize("mode", [None, "0", "1"])
def test_conv2d_batchnorm_fusion_choice(mode, monkeypatch):
    """Which Conv layers run fused: none unless PTL_CONV_BN=1, then every shape the kernel takes (bfloat16 or
    float16, groups 1, 1x1 or 3x3, channel counts multiples of 8)."""
    if mode is None:
        monkeypatch.delenv("PTL_CONV_BN", raising=False)
    else:
        monkeypatch.setenv("PTL_CONV_BN", mode)
    cases = [((2, 8, 8, 16, 32, 3, 1, 1), "bfloat16", True), ((2, 8, 8, 16, 16, 1, 1, 1), "float16", True),
             ((2, 8, 8, 16, 16, 3, 1, 1), "float32", False), ((2, 8, 8, 16, 16, 3, 1, 16), "bfloat16", False),
             ((2, 8, 8, 12, 16, 3, 1, 1), "bfloat16", False), ((2, 8, 8, 16, 12, 3, 1, 1), "bfloat16", False),
             ((2, 8, 8, 16, 16, 5, 1, 1), "bfloat16", False)]
    for (n, h, w, cin, cout, k, s, g), dt, takes in cases:
        x, wt = gpu(np.zeros((n, h, w, cin)), dt), gpu(np.zeros((cout, k, k, cin // g)), dt)
        fused = C.layer_cuda_conv2d_plan_info(C.layer_conv2d_plan(x, wt, s, g))["conv_bn_fused"]
        assert fused == (takes and mode == "1"), (mode, cin, cout, k, g, dt)


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_batchnorm_dx_may_alias_dy_and_params_grads_optional(dt):
    rng = np.random.default_rng(7)
    shape = (2, 8, 8, 24)
    x, gamma, beta, rm, rv = bn_inputs(shape, dt, rng)
    y, sm, si = C.layer_batchnorm_forward(gpu(x, dt), g32(gamma), g32(beta), g32(rm), g32(rv), True, "silu")
    dy = rng.standard_normal(shape)
    ref = empty(shape, dt)
    C.layer_batchnorm_backward(gpu(x, dt), gpu(dy, dt), g32(gamma), g32(beta), sm, si, True, "silu", ref, None,
                                    None)
    inplace = gpu(dy, dt)
    C.layer_batchnorm_backward(gpu(x, dt), inplace, g32(gamma), g32(beta), sm, si, True, "silu", inplace, None,
                                    None)
    assert same_bits(inplace, ref)


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_batchnorm_reruns_are_bitwise_equal(dt):
    rng = np.random.default_rng(8)
    shape = (4, 80, 80, 32)  # many row chunks
    x, gamma, beta, rm, rv = bn_inputs(shape, dt, rng)
    xg, dyg = gpu(x, dt), gpu(rng.standard_normal(shape), dt)
    runs = []
    for _ in range(2):
        rmg, rvg, dgg, dbg = g32(rm), g32(rv), ptl.zeros((32,), "float32", "cuda"), ptl.zeros((32,), "float32", "cuda")
        y, sm, si = C.layer_batchnorm_forward(xg, g32(gamma), g32(beta), rmg, rvg, True, "silu")
        dx = empty(shape, dt)
        C.layer_batchnorm_backward(xg, dyg, g32(gamma), g32(beta), sm, si, True, "silu", dx, dgg, dbg)
        runs.append((y, sm, si, rmg, rvg, dx, dgg, dbg))
    for a, b in zip(*runs):
        assert same_bits(a, b)


def test_batchnorm_rejects_bad_arguments():
    x = gpu(np.ones((2, 3, 4)))
    c = g32(np.ones(4))
    with pytest.raises(TypeError, match="gamma"):
        C.layer_batchnorm_forward(x, gpu(np.ones(4), "bfloat16"), c, c, c, True, None)
    with pytest.raises(ValueError, match="beta"):
        C.layer_batchnorm_forward(x, c, g32(np.ones(3)), c, c, True, None)
    with pytest.raises(ValueError, match="act"):
        C.layer_batchnorm_forward(x, c, c, c, c, True, "relu")
    with pytest.raises(ValueError, match="x"):
        C.layer_batchnorm_forward(ptl.tensor(np.ones((2, 3, 4), np.float32)), c, c, c, c, True, None)


# ---------------------------------------------------------------------------------------------- silu / add


@pytest.mark.parametrize("dt", DTYPES)
def test_silu_forward_backward(dt):
    rng = np.random.default_rng(9)
    x = rounded(4 * rng.standard_normal((3, 7, 5, 11)), dt)
    dy = rounded(rng.standard_normal(x.shape), dt)
    y = C.layer_silu_forward(gpu(x, dt))
    assert rel(host(y), N(C.layer_silu_forward(T64(x)))) <= tol(dt, 1e-5)
    dx = C.layer_silu_backward(gpu(x, dt), gpu(dy, dt))
    assert rel(host(dx), N(C.layer_silu_backward(T64(x), T64(dy)))) <= tol(dt, 1e-5)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(5, 333), (4, 64)])  # one element a thread; 16-byte packs
def test_add_and_accumulate(dt, shape):
    rng = np.random.default_rng(10)
    a, b = rounded(rng.standard_normal(shape), dt), rounded(rng.standard_normal(shape), dt)
    y = C.layer_add(gpu(a, dt), gpu(b, dt))
    acc = gpu(b, dt)
    C.layer_accumulate(gpu(a, dt), acc)
    # one float32 add per element, stored in dt: exactly NumPy's float32 sum rounded to nearest-even
    exact = round_like_gpu(a.astype(np.float32) + b.astype(np.float32), dt)
    assert np.array_equal(host(y), exact) and np.array_equal(host(acc), exact)
    assert same_bits(y, acc)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("c, y_off, yc", [(16, 8, 40), (3, 5, 11)])  # 16-byte packs; one element a thread
def test_add_into_a_slice_matches_cpu(dt, c, y_off, yc):
    """CUDA's own Add row into a Concat's slice (one kernel each way) against the CPU's row of two channel copies:
    one float32 add stored in dt, y's other channels untouched; the backward's slice copied or added into each
    input gradient (either may be missing), bit for bit as the copies give."""
    rng = np.random.default_rng(16)
    shape = (2, 5, 7, c)
    a, b = rounded(rng.standard_normal(shape), dt), rounded(rng.standard_normal(shape), dt)
    y0 = rounded(rng.standard_normal(shape[:3] + (yc,)), dt)
    y = gpu(y0, dt)
    C.layer_add_into(gpu(a, dt), gpu(b, dt), y, y_off)
    want = y0.copy()
    want[..., y_off:y_off + c] = round_like_gpu(a.astype(np.float32) + b.astype(np.float32), dt)
    assert np.array_equal(host(y), want)
    ref = ptl.tensor(y0.astype(np.float32))
    C.layer_add_into(ptl.tensor(a.astype(np.float32)), ptl.tensor(b.astype(np.float32)), ref, y_off)
    if dt == "float32":
        assert np.array_equal(host(y), N(ref))
    dy = rounded(rng.standard_normal(y0.shape), dt)
    g0 = [rounded(rng.standard_normal(shape), dt) for _ in range(2)]
    for acc in ((False, False), (True, False), (False, True), (True, True)):
        for missing in (None, 0, 1):
            g = [None if j == missing else gpu(g0[j], dt) for j in range(2)]
            C.layer_add_into_backward(gpu(dy, dt), y_off, g[0], g[1], acc[0], acc[1])
            for j in range(2):
                if j == missing:
                    continue
                sl = dy[..., y_off:y_off + c]
                want = round_like_gpu(g0[j].astype(np.float32) + sl.astype(np.float32), dt) if acc[j] else sl
                assert np.array_equal(host(g[j]), want), (acc, missing, j)


@pytest.mark.parametrize("dt, n", [("float32", 4099), ("float32", 4096), ("bfloat16", 7)])
def test_zero_kernel(dt, n):
    """The CUDA backend's zeroing (a kernel: 16 bytes a thread, or one where the size does not allow)."""
    t = gpu(np.arange(1, n + 1), dt)
    C.layer_zero(t)
    assert np.array_equal(host(t), np.zeros(n))


# ---------------------------------------------------------------------------------------------- maxpool / upsample


def maxpool_backward(x, dy, dx, acc):
    """The GPU backward both ways, finding the argmaxes itself and reading those a forward kept (a training
    forward's, in the network): same bits, and the kept forward's output is the plain one's."""
    kept = C.empty(tuple(x.shape), dtype="uint8", device="cuda")
    y = host(C.layer_maxpool5_forward(x, argmax=kept))
    assert np.array_equal(y, host(C.layer_maxpool5_forward(x)), equal_nan=True)
    dx2 = dx.to(device="cpu").to(device="cuda")
    C.layer_maxpool5_backward(x, dy, dx, acc)
    C.layer_maxpool5_backward(x, dy, dx2, acc, argmax=kept)
    assert np.array_equal(host(dx), host(dx2), equal_nan=True)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", [(2, 7, 9, 5), (1, 3, 2, 17), (2, 20, 20, 64), (3, 17, 11, 40)])
@pytest.mark.parametrize("ties", [False, True])
def test_maxpool_matches_cpu(shape, ties, dt):
    rng = np.random.default_rng(11)
    x = rng.integers(0, 3, shape).astype(np.float64) if ties else rounded(rng.standard_normal(shape), dt)
    dy = rounded(rng.standard_normal(shape), dt)
    dx0 = rounded(rng.standard_normal(shape), dt)
    y = C.layer_maxpool5_forward(gpu(x, dt))
    assert np.array_equal(host(y), N(C.layer_maxpool5_forward(T64(x))))  # a max is exact in any dtype
    for acc in (False, True):
        dx = gpu(dx0, dt)
        maxpool_backward(gpu(x, dt), gpu(dy, dt), dx, acc)
        if dt == "float32":  # same sums in the same order as the CPU's float32 kernel
            ref = ptl.tensor(dx0.astype(np.float32))
            C.layer_maxpool5_backward(ptl.tensor(x.astype(np.float32)), ptl.tensor(dy.astype(np.float32)), ref, acc)
            assert np.array_equal(host(dx), N(ref))
        else:
            ref = T64(dx0)
            C.layer_maxpool5_backward(T64(x), T64(dy), ref, acc)
            assert rel(host(dx), N(ref)) <= LOW[dt]


def test_maxpool_nan_propagates():
    x = np.zeros((1, 6, 6, 2))
    x[0, 2, 3, 1] = np.nan
    y = host(C.layer_maxpool5_forward(gpu(x)))
    ref = N(C.layer_maxpool5_forward(T64(x)))
    assert np.array_equal(np.isnan(y), np.isnan(ref)) and np.isnan(y).any()
    # the backward routes each gradient to the same cell as the CPU: the first NaN, else the first maximum
    x[0, 4, 1, 0] = x[0, 1, 5, 1] = np.nan
    x[0, 3, 3, 0] = -np.inf
    dy = np.random.default_rng(14).standard_normal(x.shape).astype(np.float32)
    dx = gpu(np.zeros(x.shape))
    maxpool_backward(gpu(x), gpu(dy), dx, False)
    ref = ptl.tensor(np.zeros(x.shape, np.float32))
    C.layer_maxpool5_backward(ptl.tensor(x.astype(np.float32)), ptl.tensor(dy), ref, False)
    assert np.array_equal(host(dx), N(ref))


@pytest.mark.parametrize("channels", [3, 16])  # one channel a thread, and packs of them
def test_maxpool_backward_windows_of_minus_infinity(channels):
    # a window whose every cell is -inf routes its gradient to its first cell inside the image, as on the CPU
    x = np.full((2, 6, 7, channels), -np.inf)
    x[0, 4, 5, :] = 1.0
    x[1, 0, 0, 1] = np.nan
    dy = np.random.default_rng(15).standard_normal(x.shape).astype(np.float32)
    for acc in (False, True):
        dx = gpu(np.ones(x.shape))
        maxpool_backward(gpu(x), gpu(dy), dx, acc)
        ref = ptl.tensor(np.ones(x.shape, np.float32))
        C.layer_maxpool5_backward(ptl.tensor(x.astype(np.float32)), ptl.tensor(dy), ref, acc)
        assert np.array_equal(host(dx), N(ref))


@pytest.mark.parametrize("dt", DTYPES)
def test_upsample_matches_cpu(dt):
    rng = np.random.default_rng(12)
    shape = (2, 5, 7, 6)
    x = rounded(rng.standard_normal(shape), dt)
    y = C.layer_upsample2x_forward(gpu(x, dt))
    assert np.array_equal(host(y), N(C.layer_upsample2x_forward(T64(x))))
    dy = rounded(rng.standard_normal((2, 10, 14, 6)), dt)
    dx0 = rounded(rng.standard_normal(shape), dt)
    for acc in (False, True):
        dx = gpu(dx0, dt)
        C.layer_upsample2x_backward(gpu(dy, dt), dx, acc)
        if dt == "float32":
            ref = ptl.tensor(dx0.astype(np.float32))
            C.layer_upsample2x_backward(ptl.tensor(dy.astype(np.float32)), ref, acc)
            assert np.array_equal(host(dx), N(ref))
        else:
            ref = T64(dx0)
            C.layer_upsample2x_backward(T64(dy), ref, acc)
            assert rel(host(dx), N(ref)) <= LOW[dt]


# ---------------------------------------------------------------------------------------------- channel copy


# (source width, destination width, slices): odd widths take the element-wise kernel; widths and offsets
# that are multiples of 8 take the 16-byte one (4 elements in float32), offset 4 only in float32
@pytest.mark.parametrize("widths", [(10, 7, ((2, 1, 5), (0, 0, 7), (3, 0, 7))),
                                    (24, 40, ((8, 16, 16), (0, 0, 24), (4, 8, 8), (16, 32, 8)))])
@pytest.mark.parametrize("dt", DTYPES)
def test_channel_copy_matches_cpu(dt, widths):
    rng = np.random.default_rng(13)
    src_c, dst_c, cases = widths
    src = rounded(rng.standard_normal((2, 3, 5, src_c)), dt)
    dst0 = rounded(rng.standard_normal((2, 3, 5, dst_c)), dt)
    for (soff, doff, c) in cases:
        for acc in (False, True):
            d = gpu(dst0, dt)
            C.layer_channel_copy(gpu(src, dt), soff, d, doff, c, acc)
            ref = T64(dst0)
            C.layer_channel_copy(T64(src), soff, ref, doff, c, acc)
            if acc:  # one float32 add per element: exact (see test_add_and_accumulate)
                want = dst0.copy()
                want[..., doff:doff + c] = round_like_gpu(
                    dst0[..., doff:doff + c].astype(np.float32) + src[..., soff:soff + c].astype(np.float32), dt)
                assert np.array_equal(host(d), want)
            else:
                assert np.array_equal(host(d), rounded(N(ref), dt))
    same = rounded(rng.standard_normal((4, 6)), dt)  # whole-row copy takes the memcpy path
    d = gpu(np.zeros((4, 6)), dt)
    C.layer_channel_copy(gpu(same, dt), 0, d, 0, 6, False)
    assert np.array_equal(host(d), same)
    with pytest.raises(ValueError, match="out of range"):
        C.layer_channel_copy(gpu(src, dt), src_c - 4, gpu(dst0, dt), 0, 5, False)


# ---------------------------------------------------------------------------------------------- attention

ATTN_CASES = [
    # b, h, w, heads, kd, hd
    (2, 4, 5, 2, 8, 16),
    (1, 3, 3, 1, 4, 4),
    (2, 20, 20, 2, 32, 64),  # yolo26n's C2PSA at 640: 20x20 positions, 2 heads
    (1, 7, 9, 4, 16, 32),
]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("case", ATTN_CASES)
def test_attention_matches_cpu(case, dt):
    rng = np.random.default_rng(seed(case))
    b, h, w, heads, kd, hd = case
    cq = heads * (2 * kd + hd)
    qkv = rounded(rng.standard_normal((b, h, w, cq)), dt)
    o, attn, v = C.layer_attention_forward(gpu(qkv, dt), heads, kd, hd)
    o_ref, attn_ref, v_ref = C.layer_attention_forward(T64(qkv), heads, kd, hd)
    assert rel(host(o), N(o_ref)) <= tol(dt, 1e-4)
    assert rel(host(attn), N(attn_ref)) <= tol(dt, 1e-4)
    assert np.array_equal(host(v), N(v_ref))
    d_o = rounded(rng.standard_normal(o_ref.shape), dt)
    dv = rounded(rng.standard_normal(o_ref.shape), dt)
    # the reference backward reads the GPU's saved softmax, so the check isolates the backward
    attn_used = host(attn)
    for extra in (None, dv):
        dq = empty(qkv.shape, dt)
        C.layer_attention_backward(gpu(qkv, dt), attn, gpu(d_o, dt), None if extra is None else gpu(extra, dt),
                                        heads, kd, hd, dq)
        dq_ref = T64(np.zeros(qkv.shape))
        C.layer_attention_backward(T64(qkv), T64(attn_used), T64(d_o), None if extra is None else T64(extra), heads, kd,
                                   hd, dq_ref)
        assert rel(host(dq), N(dq_ref)) <= tol(dt, 1e-4)


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_attention_reruns_are_bitwise_equal(dt):
    rng = np.random.default_rng(14)
    b, h, w, heads, kd, hd = 2, 20, 20, 2, 32, 64
    qkv = gpu(rng.standard_normal((b, h, w, heads * (2 * kd + hd))), dt)
    d_o = gpu(rng.standard_normal((b, h, w, heads * hd)), dt)
    runs = []
    for _ in range(2):
        o, attn, v = C.layer_attention_forward(qkv, heads, kd, hd)
        dq = empty((b, h, w, heads * (2 * kd + hd)), dt)
        C.layer_attention_backward(qkv, attn, d_o, v, heads, kd, hd, dq)
        runs.append((o, attn, v, dq))
    for a, c in zip(*runs):
        assert same_bits(a, c)


def test_attention_rejects_bad_sizes():
    q = gpu(np.zeros((1, 2, 2, 10)))
    with pytest.raises(ValueError, match="qkv"):
        C.layer_attention_forward(q, 2, 2, 2)
    with pytest.raises(ValueError, match="heads"):
        C.layer_attention_forward(q, 0, 2, 2)
