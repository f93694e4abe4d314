"""Layer kernels (csrc/nn/*.c) on the CPU: forwards against NumPy float64 references, backwards against
central finite differences in float64 (every input and parameter), BatchNorm running statistics, and
argument checking. The kernels are reached through the test bindings ptl._C.layer_*."""
import numpy as np
import pytest

import ptl

C = ptl._C


def T(a):
    return ptl.tensor(np.ascontiguousarray(a))


def N(t):
    return np.asarray(t.numpy())


def numgrad(f, arrays, idx, eps=1e-6):
    """Central finite differences of the scalar f(*arrays) with respect to arrays[idx] (in place)."""
    a = arrays[idx]
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + eps
        fp = f(*arrays)
        a[i] = old - eps
        fm = f(*arrays)
        a[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g


def assert_grad(analytic, numeric):
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------- conv2d


def conv_ref(x, w, b, s, g):
    """NHWC input, OHWI weight, padding k//2."""
    n, h, wd, cin = x.shape
    cout, k, _, cig = w.shape
    p = k // 2
    ho, wo = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    y = np.zeros((n, ho, wo, cout))
    cog = cout // g
    for ky in range(k):
        for kx in range(k):
            patch = xp[:, ky:ky + s * (ho - 1) + 1:s, kx:kx + s * (wo - 1) + 1:s, :]
            for gi in range(g):
                y[..., gi * cog:(gi + 1) * cog] += patch[..., gi * cig:(gi + 1) * cig] @ \
                    w[gi * cog:(gi + 1) * cog, ky, kx, :].T
    if b is not None:
        y += b
    return y


def conv(x, w, b, s, g):
    """y of the reference convolution, through a plan made for x and w."""
    return C.layer_conv2d_forward(C.layer_conv2d_plan(x, w, s, g), x, w, b)


CONV_CASES = [
    # n, h, w, cin, cout, k, stride, groups
    (2, 5, 7, 3, 4, 3, 1, 1),     # 3x3, odd sizes
    (1, 7, 6, 4, 5, 3, 2, 1),     # stride 2, odd/even
    (1, 5, 13, 3, 4, 3, 2, 1),    # stride 2, wide enough for the 4-pixel weight-gradient blocks
    (2, 6, 5, 4, 4, 3, 1, 4),     # depthwise
    (1, 7, 7, 5, 5, 3, 2, 5),     # depthwise stride 2
    (2, 4, 5, 6, 3, 1, 1, 1),     # 1x1
    (1, 5, 6, 4, 6, 3, 1, 2),     # general groups
    (1, 6, 5, 2, 3, 5, 1, 1),     # 5x5
    (1, 2, 3, 3, 2, 3, 2, 1),     # output smaller than the kernel's reach
]


def conv_params(case, rng, bias=True):
    n, h, w, cin, cout, k, s, g = case
    x = rng.standard_normal((n, h, w, cin))
    wt = rng.standard_normal((cout, k, k, cin // g))
    b = rng.standard_normal(cout) if bias else None
    return x, wt, b


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_forward_matches_numpy(case):
    rng = np.random.default_rng(0)
    x, w, b = conv_params(case, rng)
    s, g = case[6], case[7]
    ref = conv_ref(x, w, b, s, g)
    y = N(conv(T(x), T(w), T(b), s, g))
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    y_nobias = N(conv(T(x), T(w), None, s, g))
    np.testing.assert_allclose(y_nobias, conv_ref(x, w, None, s, g), rtol=1e-12, atol=1e-12)
    y32 = N(conv(T(x.astype(np.float32)), T(w.astype(np.float32)), T(b.astype(np.float32)), s, g))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_backward_finite_differences(case):
    rng = np.random.default_rng(1)
    x, w, b = conv_params(case, rng)
    s, g = case[6], case[7]
    r = rng.standard_normal(conv_ref(x, w, b, s, g).shape)
    plan = C.layer_conv2d_plan(T(x), T(w), s, g)

    def loss(x, w, b):
        return float((N(C.layer_conv2d_forward(plan, T(x), T(w), T(b))) * r).sum())

    dx = T(np.full(x.shape, np.nan))  # overwritten
    C.layer_conv2d_backward_input(plan, T(r), T(w), dx)
    w0 = rng.standard_normal(w.shape)  # accumulated onto
    dw = T(w0)
    C.layer_conv2d_backward_weight(plan, T(x), T(r), dw)
    b0 = rng.standard_normal(b.shape)
    db = T(b0)
    C.layer_conv2d_backward_bias(plan, T(r), db)
    assert_grad(N(dx), numgrad(loss, [x, w, b], 0))
    dx_ws = T(np.full(x.shape, np.nan))  # the transposed-weight path: a workspace of w's size
    C.layer_conv2d_backward_input(plan, T(r), T(w), dx_ws, T(np.empty(w.size)))
    np.testing.assert_allclose(N(dx_ws), N(dx), rtol=1e-12, atol=1e-12)
    x0 = rng.standard_normal(x.shape)  # add=True: added onto, as for an input with several consumers
    dx_add = T(x0)
    C.layer_conv2d_backward_input(plan, T(r), T(w), dx_add, None, True)
    np.testing.assert_allclose(N(dx_add) - x0, N(dx), rtol=1e-12, atol=1e-12)
    assert_grad(N(dw) - w0, numgrad(loss, [x, w, b], 1))
    assert_grad(N(db) - b0, numgrad(loss, [x, w, b], 2))


def test_conv2d_backward_float32_matches_float64():
    rng = np.random.default_rng(2)
    case = (2, 9, 8, 16, 24, 3, 2, 1)
    x, w, _ = conv_params(case, rng, bias=False)
    r = rng.standard_normal(conv_ref(x, w, None, 2, 1).shape)
    out = {}
    for dt in (np.float64, np.float32):
        dx = T(np.zeros(x.shape, dt))
        dw = T(np.zeros(w.shape, dt))
        plan = C.layer_conv2d_plan(dx, dw, 2, 1)
        ws = T(np.empty(w.size, dt)) if dt == np.float32 else None  # float32 on the transposed-weight path
        C.layer_conv2d_backward_input(plan, T(r.astype(dt)), T(w.astype(dt)), dx, ws)
        C.layer_conv2d_backward_weight(plan, T(x.astype(dt)), T(r.astype(dt)), dw)
        out[dt] = N(dx), N(dw)
    for a, b in zip(out[np.float32], out[np.float64]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_conv2d_weight_layout_round_trip():
    rng = np.random.default_rng(3)
    w_oihw = rng.standard_normal((6, 4, 3, 3))
    w_ohwi = N(C.layer_conv2d_weight_layout(T(w_oihw), True))
    np.testing.assert_array_equal(w_ohwi, w_oihw.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(N(C.layer_conv2d_weight_layout(T(w_ohwi), False)), w_oihw)


def test_conv2d_rejects_bad_arguments():
    x = T(np.zeros((1, 4, 4, 4)))
    with pytest.raises(ValueError, match="w"):
        conv(x, T(np.zeros((2, 3, 3, 3))), None, 1, 1)
    with pytest.raises(ValueError, match="groups"):
        conv(x, T(np.zeros((3, 3, 3, 2))), None, 1, 2)
    with pytest.raises(TypeError, match="w"):
        conv(x, T(np.zeros((2, 3, 3, 4), np.float32)), None, 1, 1)
    with pytest.raises(TypeError, match="x"):
        conv(T(np.zeros((1, 4, 4, 4), np.int32)), T(np.zeros((2, 3, 3, 4))), None, 1, 1)
    with pytest.raises(ValueError, match="bias"):
        conv(x, T(np.zeros((2, 3, 3, 4))), T(np.zeros(3)), 1, 1)
    w = T(np.zeros((2, 3, 3, 4)))
    with pytest.raises(ValueError, match="dy"):
        C.layer_conv2d_backward_input(C.layer_conv2d_plan(x, w, 1, 1), T(np.zeros((1, 3, 4, 2))), w, x)
    with pytest.raises(TypeError, match="plan"):
        C.layer_conv2d_backward_bias(None, T(np.zeros((1, 4, 4, 2))), T(np.zeros(2)))


# ---------------------------------------------------------------------------------------------- batchnorm


EPS, MOM = 1e-3, 0.03


def silu(z):
    return z / (1 + np.exp(-z))


def bn_ref(x, gamma, beta, rm, rv, training, act):
    c = x.shape[-1]
    x2 = x.reshape(-1, c)
    if training:
        mean, var = x2.mean(0), x2.var(0)
    else:
        mean, var = rm, rv
    z = (x - mean) / np.sqrt(var + EPS) * gamma + beta
    return silu(z) if act == "silu" else z


def bn_inputs(rng, shape):
    c = shape[-1]
    x = rng.standard_normal(shape) * 1.5 + rng.standard_normal(c)
    gamma = 1 + 0.3 * rng.standard_normal(c)
    beta = 0.5 * rng.standard_normal(c)
    rm = 0.2 * rng.standard_normal(c)
    rv = 0.5 + rng.random(c)
    return x, gamma, beta, rm, rv


@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_forward_and_running_stats(act, training):
    rng = np.random.default_rng(4)
    shape = (3, 5, 7, 19)  # 19 channels: two full blocks of 8 and a partial one
    x, gamma, beta, rm, rv = bn_inputs(rng, shape)
    trm, trv = T(rm), T(rv)
    y, sm, si = C.layer_batchnorm_forward(T(x), T(gamma), T(beta), trm, trv, training, act)
    np.testing.assert_allclose(N(y), bn_ref(x, gamma, beta, rm, rv, training, act), rtol=1e-12, atol=1e-12)
    x2 = x.reshape(-1, shape[-1])
    m = x2.shape[0]
    if training:
        mean, var = x2.mean(0), x2.var(0)
        np.testing.assert_allclose(N(trm), (1 - MOM) * rm + MOM * mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(N(trv), (1 - MOM) * rv + MOM * var * m / (m - 1), rtol=1e-12)
    else:
        mean, var = rm, rv
        np.testing.assert_array_equal(N(trm), rm)
        np.testing.assert_array_equal(N(trv), rv)
    np.testing.assert_allclose(N(sm), mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(N(si), 1 / np.sqrt(var + EPS), rtol=1e-12)


def test_batchnorm_float32_matches_float64():
    rng = np.random.default_rng(5)
    x, gamma, beta, rm, rv = bn_inputs(rng, (4, 6, 6, 12))
    f32 = [T(a.astype(np.float32)) for a in (x, gamma, beta, rm, rv)]
    y, _, _ = C.layer_batchnorm_forward(*f32, True, "silu")
    np.testing.assert_allclose(N(y), bn_ref(x, gamma, beta, rm, rv, True, "silu"), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(N(f32[3]), (1 - MOM) * rm + MOM * x.reshape(-1, 12).mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_backward_finite_differences(act, training):
    rng = np.random.default_rng(6)
    shape = (2, 3, 5, 10)
    x, gamma, beta, rm, rv = bn_inputs(rng, shape)
    r = rng.standard_normal(shape)

    def loss(x, gamma, beta):
        y, _, _ = C.layer_batchnorm_forward(T(x), T(gamma), T(beta), T(rm), T(rv), training, act)
        return float((N(y) * r).sum())

    _, sm, si = C.layer_batchnorm_forward(T(x), T(gamma), T(beta), T(rm), T(rv), training, act)
    dx = T(np.full(shape, np.nan))
    g0, b0 = rng.standard_normal(10), rng.standard_normal(10)
    dg, db = T(g0), T(b0)
    C.layer_batchnorm_backward(T(x), T(r), T(gamma), T(beta), sm, si, training, act, dx, dg, db)
    args = [x, gamma, beta]
    assert_grad(N(dx), numgrad(loss, args, 0))
    assert_grad(N(dg) - g0, numgrad(loss, args, 1))
    assert_grad(N(db) - b0, numgrad(loss, args, 2))
    # dx may alias dy; dgamma/dbeta may be skipped
    dy = T(r)
    C.layer_batchnorm_backward(T(x), dy, T(gamma), T(beta), sm, si, training, act, dy, None, None)
    np.testing.assert_allclose(N(dy), N(dx), rtol=1e-14, atol=1e-14)


def test_batchnorm_rejects_bad_arguments():
    x = T(np.zeros((2, 3, 4)))
    c = T(np.ones(4))
    with pytest.raises(ValueError, match="gamma"):
        C.layer_batchnorm_forward(x, T(np.ones(3)), c, c, c, True, None)
    with pytest.raises(ValueError, match="act"):
        C.layer_batchnorm_forward(x, c, c, c, c, True, "relu")
    with pytest.raises(TypeError, match="running_var"):
        C.layer_batchnorm_forward(x, c, c, c, T(np.ones(4, np.float32)), True, None)


# ---------------------------------------------------------------------------------------------- silu


def test_silu_forward_backward():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 5)) * 4
    np.testing.assert_allclose(N(C.layer_silu_forward(T(x))), silu(x), rtol=1e-14, atol=1e-15)
    r = rng.standard_normal(x.shape)
    dx = N(C.layer_silu_backward(T(x), T(r)))
    assert_grad(dx, numgrad(lambda x: float((N(C.layer_silu_forward(T(x))) * r).sum()), [x], 0))
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(N(C.layer_silu_forward(T(x32))), silu(x), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------- maxpool


def maxpool_ref(x):
    n, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)), constant_values=-np.inf)
    y = np.full(x.shape, -np.inf)
    for ky in range(5):
        for kx in range(5):
            y = np.maximum(y, xp[:, ky:ky + h, kx:kx + w, :])
    return y


def maxpool_bwd_ref(x, dy):
    """Routes each output's gradient to the first maximum of its window in scan order."""
    n, h, w, c = x.shape
    dx = np.zeros_like(x)
    for b in range(n):
        for oy in range(h):
            for ox in range(w):
                for ch in range(c):
                    best, arg = -np.inf, None
                    for iy in range(max(oy - 2, 0), min(oy + 3, h)):
                        for ix in range(max(ox - 2, 0), min(ox + 3, w)):
                            if arg is None or x[b, iy, ix, ch] > best:
                                best, arg = x[b, iy, ix, ch], (iy, ix)
                    dx[b, arg[0], arg[1], ch] += dy[b, oy, ox, ch]
    return dx


def test_maxpool_forward_and_finite_differences():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 6, 7, 18))  # 18 channels: a full block of 16 and a partial one
    y = N(C.layer_maxpool5_forward(T(x)))
    np.testing.assert_array_equal(y, maxpool_ref(x))
    xs = x[:, :, :, :3].copy()
    r = rng.standard_normal(xs.shape)
    dx = T(np.full(xs.shape, np.nan))
    C.layer_maxpool5_backward(T(xs), T(r), dx, False)
    assert_grad(N(dx), numgrad(lambda x: float((N(C.layer_maxpool5_forward(T(x))) * r).sum()), [xs], 0))
    base = rng.standard_normal(xs.shape)
    acc = T(base)
    C.layer_maxpool5_backward(T(xs), T(r), acc, True)
    np.testing.assert_allclose(N(acc), base + N(dx), rtol=1e-14, atol=1e-14)


def test_maxpool_ties_route_to_first_in_scan_order():
    rng = np.random.default_rng(9)
    x = rng.integers(0, 3, (2, 7, 6, 3)).astype(np.float64)  # many ties
    dy = rng.standard_normal(x.shape)
    dx = T(np.zeros(x.shape))
    C.layer_maxpool5_backward(T(x), T(dy), dx, False)
    np.testing.assert_allclose(N(dx), maxpool_bwd_ref(x, dy), rtol=1e-14, atol=1e-14)
    x32 = x.astype(np.float32)
    np.testing.assert_array_equal(N(C.layer_maxpool5_forward(T(x32))), maxpool_ref(x))


def test_maxpool_argmax_is_kept_on_cuda_only():
    # the CPU's backward finds its argmaxes again: a buffer for them is refused, not silently left unwritten
    x = T(np.zeros((1, 4, 4, 2)))
    kept = C.empty((1, 4, 4, 2), dtype="uint8")
    with pytest.raises(ValueError, match="argmax: kept by the CUDA kernels only"):
        C.layer_maxpool5_forward(x, argmax=kept)
    with pytest.raises(ValueError, match="argmax: kept by the CUDA kernels only"):
        C.layer_maxpool5_backward(x, x, T(np.zeros((1, 4, 4, 2))), False, argmax=kept)


def test_maxpool_small_and_negative_inputs():
    x = -np.abs(np.random.default_rng(10).standard_normal((1, 1, 2, 2))) - 1e30
    np.testing.assert_array_equal(N(C.layer_maxpool5_forward(T(x))), maxpool_ref(x))
    x = np.full((1, 3, 3, 1), -np.inf)
    dy = np.ones(x.shape)
    dx = T(np.zeros(x.shape))
    C.layer_maxpool5_backward(T(x), T(dy), dx, False)
    np.testing.assert_array_equal(N(dx), maxpool_bwd_ref(x, dy))


# ---------------------------------------------------------------------------------------------- upsample


def test_upsample_forward_backward():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 5, 4))
    y = N(C.layer_upsample2x_forward(T(x)))
    np.testing.assert_array_equal(y, x.repeat(2, axis=1).repeat(2, axis=2))
    r = rng.standard_normal(y.shape)
    dx = T(np.full(x.shape, np.nan))
    C.layer_upsample2x_backward(T(r), dx, False)
    assert_grad(N(dx), numgrad(lambda x: float((N(C.layer_upsample2x_forward(T(x))) * r).sum()), [x], 0))
    base = rng.standard_normal(x.shape)
    acc = T(base)
    C.layer_upsample2x_backward(T(r), acc, True)
    np.testing.assert_allclose(N(acc), base + N(dx), rtol=1e-14, atol=1e-14)
    with pytest.raises(ValueError, match="dy"):
        C.layer_upsample2x_backward(T(r[:, :5]), dx, False)


# ---------------------------------------------------------------------------------------------- concat


def test_concat_forward_backward():
    rng = np.random.default_rng(12)
    xs = [rng.standard_normal((2, 3, 4, c)) for c in (3, 5, 1)]
    y = N(C.layer_concat_forward([T(a) for a in xs]))
    np.testing.assert_array_equal(y, np.concatenate(xs, axis=-1))
    dy = rng.standard_normal(y.shape)
    base = [rng.standard_normal(a.shape) for a in xs]
    dxs = [T(b) for b in base]
    C.layer_concat_backward(T(dy), dxs, [False, True, False])
    np.testing.assert_array_equal(N(dxs[0]), dy[..., :3])
    np.testing.assert_allclose(N(dxs[1]), base[1] + dy[..., 3:8], rtol=1e-15)
    np.testing.assert_array_equal(N(dxs[2]), dy[..., 8:])
    dxs = [T(b) for b in base]
    C.layer_concat_backward(T(dy), dxs, None)
    np.testing.assert_array_equal(N(dxs[1]), dy[..., 3:8])
    y32 = N(C.layer_concat_forward([T(a.astype(np.float32)) for a in xs]))
    np.testing.assert_array_equal(y32, np.concatenate(xs, axis=-1).astype(np.float32))
    with pytest.raises(ValueError, match="xs"):
        C.layer_concat_forward([T(xs[0]), T(np.zeros((2, 3, 5, 1)))])
    with pytest.raises(ValueError, match="dxs"):
        C.layer_concat_backward(T(dy), [T(base[0])], None)


def test_channel_copy_slices():
    rng = np.random.default_rng(13)
    src = rng.standard_normal((2, 3, 7))
    dst0 = rng.standard_normal((2, 3, 5))
    dst = T(dst0)
    C.layer_channel_copy(T(src), 2, dst, 1, 3, False)
    want = dst0.copy()
    want[..., 1:4] = src[..., 2:5]
    np.testing.assert_array_equal(N(dst), want)
    C.layer_channel_copy(T(src), 4, dst, 2, 3, True)
    want[..., 2:5] += src[..., 4:7]
    np.testing.assert_allclose(N(dst), want, rtol=1e-15)
    with pytest.raises(ValueError, match="channel_copy"):
        C.layer_channel_copy(T(src), 5, dst, 0, 3, False)


# ---------------------------------------------------------------------------------------------- elementwise


def test_add_and_accumulate():
    rng = np.random.default_rng(14)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    np.testing.assert_array_equal(N(C.layer_add(T(a), T(b))), a + b)
    y = T(b)
    C.layer_accumulate(T(a), y)
    np.testing.assert_array_equal(N(y), b + a)
    with pytest.raises(ValueError, match="b"):
        C.layer_add(T(a), T(b[:2]))


def test_add_into_a_slice():
    """The Add row into a Concat's slice (the executor's in-place Concat part): y's other channels untouched, the
    backward's two gradients overwritten or added to, and against float64 finite differences."""
    rng = np.random.default_rng(15)
    a, b = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))
    y0 = rng.standard_normal((2, 3, 4, 9))
    y = T(y0)
    C.layer_add_into(T(a), T(b), y, 3)
    want = y0.copy()
    want[..., 3:8] = a + b
    np.testing.assert_array_equal(N(y), want)

    r = rng.standard_normal(y0.shape)  # loss = sum(r * y): dy = r
    da0, db0 = rng.standard_normal(a.shape), rng.standard_normal(a.shape)
    da, db = T(da0), T(db0)
    C.layer_add_into_backward(T(r), 3, da, db, True, False)
    np.testing.assert_array_equal(N(da), da0 + r[..., 3:8])
    np.testing.assert_array_equal(N(db), r[..., 3:8])

    def loss(a, b):
        out = T(y0)
        C.layer_add_into(T(a), T(b), out, 3)
        return float(np.sum(r * N(out)))

    for i in range(2):
        g = [T(np.zeros(a.shape)), None]
        g = g if i == 0 else g[::-1]
        C.layer_add_into_backward(T(r), 3, g[0], g[1], False, False)
        assert_grad(N(g[i]), numgrad(loss, [a.copy(), b.copy()], i))
    with pytest.raises(ValueError, match="y_off"):
        C.layer_add_into(T(a), T(b), y, 5)
    with pytest.raises(ValueError, match="at least one"):
        C.layer_add_into_backward(T(r), 3, None, None, False, False)


def test_zero():
    t = T(np.ones((3, 5)))
    C.layer_zero(t)
    np.testing.assert_array_equal(N(t), np.zeros((3, 5)))


# ---------------------------------------------------------------------------------------------- attention


def attention_ref(qkv, heads, kd, hd):
    b, h, w, _ = qkv.shape
    n = h * w
    per = qkv.reshape(b, n, heads, 2 * kd + hd)
    q, k, v = per[..., :kd], per[..., kd:2 * kd], per[..., 2 * kd:]  # (b, n, heads, d)
    s = np.einsum("bihd,bjhd->bhij", q, k) * kd ** -0.5
    s = np.exp(s - s.max(-1, keepdims=True))
    p = s / s.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", p, v)
    return o.reshape(b, h, w, heads * hd), p, v.reshape(b, h, w, heads * hd)


ATTN_CASES = [(2, 3, 4, 2, 2, 4), (1, 2, 5, 1, 3, 6), (1, 3, 3, 3, 1, 2)]  # b, h, w, heads, kd, hd


@pytest.mark.parametrize("case", ATTN_CASES)
def test_attention_forward_matches_numpy(case):
    b, h, w, heads, kd, hd = case
    rng = np.random.default_rng(15)
    qkv = rng.standard_normal((b, h, w, heads * (2 * kd + hd)))
    o, attn, v = (N(t) for t in C.layer_attention_forward(T(qkv), heads, kd, hd))
    ro, rp, rv = attention_ref(qkv, heads, kd, hd)
    np.testing.assert_allclose(o, ro, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(attn, rp, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(v, rv)
    o32, _, _ = C.layer_attention_forward(T(qkv.astype(np.float32)), heads, kd, hd)
    np.testing.assert_allclose(N(o32), ro, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ATTN_CASES)
def test_attention_backward_finite_differences(case):
    b, h, w, heads, kd, hd = case
    rng = np.random.default_rng(16)
    qkv = rng.standard_normal((b, h, w, heads * (2 * kd + hd)))
    ro, _, _ = attention_ref(qkv, heads, kd, hd)
    r_o, r_v = rng.standard_normal(ro.shape), rng.standard_normal(ro.shape)

    def loss(qkv):
        o, _, v = C.layer_attention_forward(T(qkv), heads, kd, hd)
        return float((N(o) * r_o).sum() + (N(v) * r_v).sum())

    _, attn, _ = C.layer_attention_forward(T(qkv), heads, kd, hd)
    dq = T(np.full(qkv.shape, np.nan))
    C.layer_attention_backward(T(qkv), attn, T(r_o), T(r_v), heads, kd, hd, dq)
    assert_grad(N(dq), numgrad(loss, [qkv], 0))
    # without the extra v gradient
    dq2 = T(np.full(qkv.shape, np.nan))
    C.layer_attention_backward(T(qkv), attn, T(r_o), None, heads, kd, hd, dq2)
    vslots = N(dq).reshape(b, h, w, heads, 2 * kd + hd).copy()
    vslots[..., 2 * kd:] -= r_v.reshape(b, h, w, heads, hd)
    np.testing.assert_allclose(N(dq2), vslots.reshape(qkv.shape), rtol=1e-12, atol=1e-12)


def test_attention_rejects_bad_sizes():
    qkv = T(np.zeros((1, 2, 2, 10)))
    with pytest.raises(ValueError, match="qkv"):
        C.layer_attention_forward(qkv, 2, 2, 2)


# ---------------------------------------------------------------------------------------------- determinism

DETERMINISM_SCRIPT = r"""
import hashlib, numpy as np, ptl
C = ptl._C
rng = np.random.default_rng(17)
T = lambda a: ptl.tensor(np.ascontiguousarray(a, np.float32))
h = hashlib.sha256()
def add(t):
    h.update(np.ascontiguousarray(t.numpy()).tobytes())
for (cin, cout, k, s, g) in [(16, 24, 3, 1, 1), (16, 24, 3, 2, 1), (24, 24, 3, 1, 24), (24, 40, 1, 1, 1)]:
    x = T(rng.standard_normal((2, 17, 15, cin)))
    w = T(rng.standard_normal((cout, k, k, cin // g)))
    plan = C.layer_conv2d_plan(x, w, s, g)
    y = C.layer_conv2d_forward(plan, x, w, None)
    dy = T(rng.standard_normal(tuple(y.shape)))
    dx, dw, db = T(np.zeros(tuple(x.shape))), T(np.zeros(tuple(w.shape))), T(np.zeros(cout))
    C.layer_conv2d_backward_input(plan, dy, w, dx)
    C.layer_conv2d_backward_weight(plan, x, dy, dw)
    C.layer_conv2d_backward_bias(plan, dy, db)
    for t in (y, dx, dw, db):
        add(t)
x = T(rng.standard_normal((2, 16, 16, 72)))
c = lambda: T(rng.random(72) + 0.5)
g, b, rm, rv = c(), c(), c(), c()
y, sm, si = C.layer_batchnorm_forward(x, g, b, rm, rv, True, "silu")
dx, dg, db = T(np.zeros((2, 16, 16, 72))), T(np.zeros(72)), T(np.zeros(72))
C.layer_batchnorm_backward(x, y, g, b, sm, si, True, "silu", dx, dg, db)
for t in (y, sm, si, rm, rv, dx, dg, db):
    add(t)
p = C.layer_maxpool5_forward(x)
C.layer_maxpool5_backward(x, p, dx, True)
add(p); add(dx)
qkv = T(rng.standard_normal((2, 8, 8, 2 * 16)))
o, a, v = C.layer_attention_forward(qkv, 2, 4, 8)
dq = T(np.zeros((2, 8, 8, 32)))
C.layer_attention_backward(qkv, a, o, v, 2, 4, 8, dq)
for t in (o, a, v, dq):
    add(t)
print(h.hexdigest())
"""


def test_results_do_not_depend_on_thread_count():
    import os
    import subprocess
    import sys

    digests = set()
    for threads in ("1", "3"):
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT], env=env, capture_output=True, text=True,
                             check=True, cwd=os.path.dirname(os.path.dirname(ptl.__file__)))
        digests.add(out.stdout.strip())
    assert len(digests) == 1
