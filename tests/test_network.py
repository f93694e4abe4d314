"""The YOLO26 network (csrc/nn/network.c, ptl/model.py): structure, names, counts, init, forward,
backward (finite differences), BatchNorm modes, o2o isolation, state_dict strictness; torchref parity."""
import math

import numpy as np
import pytest

import ptl
from ptl.model import Detector

SPEC_TOTAL = {"n": 2_572_280, "s": 10_009_784, "m": 21_896_248, "l": 26_299_704, "x": 58_993_368}
SPEC_LAYERS = {
    "n": [464, 4672, 6640, 36992, 26080, 147712, 87040, 295424, 346112, 164608, 249728, 0, 0, 119808, 0, 0,
          34304, 36992, 0, 95232, 147712, 0, 463104, 309656],
    "s": [928, 18560, 26080, 147712, 103360, 590336, 346112, 1180672, 1380352, 656896, 990976, 0, 0, 477184, 0,
          0, 136192, 147712, 0, 378880, 590336, 0, 1843712, 993784],
    "m": [1856, 73984, 111872, 590336, 444928, 2360320, 1380352, 2360320, 1380352, 656896, 990976, 0, 0,
          1642496, 0, 0, 542720, 590336, 0, 1511424, 2360320, 0, 1974784, 2921976],
    "l": [1856, 73984, 173824, 590336, 691712, 2360320, 2234368, 2360320, 2234368, 656896, 1455616, 0, 0,
          2496512, 0, 0, 756736, 590336, 0, 2365440, 2360320, 0, 1974784, 2921976],
    "x": [2784, 166272, 389760, 1327872, 1553664, 5309952, 5022720, 5309952, 5022720, 1476864, 3264768, 0, 0,
          5612544, 0, 0, 1700352, 1327872, 0, 5317632, 5309952, 0, 4436736, 6440952],
}


@pytest.fixture(scope="module")
def det_n():
    return Detector("yolo26n", num_classes=80)


def _images(n, h, w, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).random((n, 3, h, w)).astype(dtype)


# ------------------------------------------------------------------------------------ structure

@pytest.mark.parametrize("scale", ["n", "s", "m", "l", "x"])
def test_parameter_counts_match_spec(scale):
    det = Detector(scale=scale)
    assert det.num_parameters() == SPEC_TOTAL[scale]
    assert det.layer_parameters() == SPEC_LAYERS[scale]
    assert sum(int(np.prod(s)) for _, _, s in det.parameter_table()) == SPEC_TOTAL[scale]


def test_one_head_count_and_num_classes():
    det = Detector("yolo26n", num_classes=80)
    o2o = sum(int(np.prod(s)) for n, _, s in det.parameter_table() if ".one2one_" in n)
    assert det.num_parameters() - o2o == 2_417_452  # spec §1.6 one-head-only count
    det3 = Detector("yolo26n", num_classes=3)
    # cls width cc = max(64, min(3, 100)) = 64; the final class convs shrink to 3 outputs.
    sd = det3.state_dict()
    assert sd["model.23.cv3.0.2.weight"].shape == (3, 64, 1, 1)
    assert sd["model.23.one2one_cv3.2.2.bias"].shape == (3,)
    assert sd["model.23.cv3.2.1.1.conv.weight"].shape == (64, 64, 1, 1)
    wide = Detector("yolo26n", num_classes=200).state_dict()  # cc = max(64, min(200, 100)) = 100
    assert wide["model.23.cv3.1.0.1.conv.weight"].shape == (100, 128, 1, 1)
    assert wide["model.23.cv3.1.2.weight"].shape == (200, 100, 1, 1)


def test_state_dict_names_and_shapes(det_n):
    sd = det_n.state_dict()
    expect = {
        "model.0.conv.weight": (16, 3, 3, 3),
        "model.0.bn.running_mean": (16,),
        "model.0.bn.running_var": (16,),
        "model.2.m.0.cv1.conv.weight": (8, 16, 3, 3),
        "model.6.m.0.m.1.cv2.conv.weight": (32, 32, 3, 3),
        "model.6.m.0.cv3.conv.weight": (64, 64, 1, 1),
        "model.9.cv1.conv.weight": (128, 256, 1, 1),
        "model.10.m.0.attn.qkv.conv.weight": (256, 128, 1, 1),
        "model.10.m.0.attn.pe.conv.weight": (128, 1, 3, 3),
        "model.10.m.0.ffn.1.bn.bias": (128,),
        "model.22.m.0.0.cv2.conv.weight": (128, 64, 3, 3),
        "model.22.m.0.1.attn.proj.conv.weight": (128, 128, 1, 1),
        "model.23.cv2.0.2.weight": (4, 16, 1, 1),
        "model.23.cv2.2.2.bias": (4,),
        "model.23.cv3.1.0.0.conv.weight": (128, 1, 3, 3),
        "model.23.one2one_cv3.0.1.1.conv.weight": (80, 80, 1, 1),
        "model.23.one2one_cv2.1.1.bn.running_var": (16,),
    }
    for k, shape in expect.items():
        assert sd[k].shape == shape, k
    assert not any(k.endswith("num_batches_tracked") for k in sd)
    assert len(set(sd)) == len(sd)
    n_bn = sum(k.endswith(".bn.running_mean") for k in sd)
    assert sum(k.endswith(".bn.weight") for k in sd) == n_bn
    # Ultralytics order within a Conv: conv.weight, bn.weight, bn.bias, bn.running_mean, bn.running_var.
    keys = list(sd)
    i = keys.index("model.0.conv.weight")
    assert keys[i:i + 5] == ["model.0.conv.weight", "model.0.bn.weight", "model.0.bn.bias",
                             "model.0.bn.running_mean", "model.0.bn.running_var"]
    # C3k2 registers cv1, cv2, then m; Detect registers cv2, cv3, one2one_cv2, one2one_cv3.
    assert keys.index("model.2.cv2.conv.weight") < keys.index("model.2.m.0.cv1.conv.weight")
    assert keys.index("model.23.cv3.2.2.bias") < keys.index("model.23.one2one_cv2.0.0.conv.weight")
    # The parameter table tiles the flat buffer exactly, in order.
    off = 0
    for _, o, s in det_n.parameter_table():
        assert o == off
        off += int(np.prod(s))
    assert off == det_n.flat_parameters.numel()


# ---------------------------------------------------------------------------------------- init

def test_initialisation(det_n):
    sd = det_n.state_dict()
    for k, v in sd.items():
        if k.endswith("bn.weight") or k.endswith("running_var"):
            assert np.all(v == 1), k
        elif k.endswith("bn.bias") or k.endswith("running_mean"):
            assert np.all(v == 0), k
    for k in ("model.1.conv.weight", "model.8.m.0.cv3.conv.weight", "model.23.cv3.0.0.0.conv.weight"):
        w = sd[k]
        b = 1 / math.sqrt(w.shape[1] * w.shape[2] * w.shape[3])
        assert np.abs(w).max() <= b and np.abs(w).max() > 0.95 * b, k
        assert abs(w.mean()) < 0.1 * b, k
        assert abs(w.std() - b / math.sqrt(3)) < 0.1 * b, k
    for i, s in enumerate((8, 16, 32)):
        for pre in ("", "one2one_"):
            assert np.all(sd[f"model.23.{pre}cv2.{i}.2.bias"] == np.float32(2.0))
            np.testing.assert_allclose(sd[f"model.23.{pre}cv3.{i}.2.bias"], math.log(5 / 80 / (640 / s) ** 2),
                                       rtol=1e-6)
    np.testing.assert_allclose(sd["model.23.cv3.0.2.bias"][0], -11.5366, atol=1e-4)
    for k, v in sd.items():
        if ".one2one_" in k:
            assert np.array_equal(v, sd[k.replace("one2one_", "")]), k
    # Draws differ between tensors and seeds; the same seed reproduces.
    assert not np.array_equal(sd["model.3.conv.weight"].ravel()[:100], sd["model.5.conv.weight"].ravel()[:100])
    assert np.array_equal(Detector("yolo26n").flat_parameters, det_n.flat_parameters)
    assert not np.array_equal(Detector("yolo26n", seed=1).flat_parameters, det_n.flat_parameters)


# ------------------------------------------------------------------------------------- forward

def test_forward_shapes_strides_nonsquare():
    det = Detector("yolo26n", num_classes=7)
    assert det.strides == (8, 16, 32)
    out = det.forward(_images(2, 64, 96))
    A = 8 * 12 + 4 * 6 + 2 * 3
    for br in ("one2many", "one2one"):
        boxes, scores = out[br]
        assert boxes.shape == (2, A, 4) and scores.shape == (2, A, 7)
        assert np.isfinite(boxes).all() and np.isfinite(scores).all()
    # At init o2o == o2m exactly (same weights, same features).
    assert np.array_equal(out["one2many"][0], out["one2one"][0])
    assert np.array_equal(out["one2many"][1], out["one2one"][1])
    pts, strides = det.anchors(64, 96)
    assert pts.shape == (A, 2) and list(np.unique(strides)) == [8, 16, 32]
    for bad in ((1, 3, 48, 64), (1, 3, 64, 100)):
        with pytest.raises(ValueError, match="multiples of 32"):
            det.forward(np.zeros(bad, np.float32))
    with pytest.raises(ValueError, match="images"):
        det.forward(np.zeros((1, 64, 64, 3), np.float32))


def test_uint8_nhwc_equals_float_nchw(det_n):
    rng = np.random.default_rng(3)
    u8 = rng.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    f = (u8.astype(np.float32) / 255).transpose(0, 3, 1, 2)
    det_n.eval()
    try:
        a = det_n.forward(u8)
        b = det_n.forward(f)
    finally:
        det_n.train()
    for br in a:
        for x, y in zip(a[br], b[br]):
            assert np.array_equal(x, y)


def test_batchnorm_train_vs_eval():
    det = Detector("yolo26n")
    x = _images(2, 64, 64, seed=5)
    # Training: the running stats of layer 0 move by momentum 0.03 towards the batch mean and the
    # unbiased batch variance of its conv output (computed here independently with NumPy).
    w = det.state_dict()["model.0.conv.weight"].astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((2, 16, 32, 32))
    for kh in range(3):
        for kw in range(3):
            patch = xp[:, :, kh:kh + 64:2, kw:kw + 64:2]
            conv += np.einsum("nchw,oc->nohw", patch, w[:, :, kh, kw])
    mean, var = conv.mean((0, 2, 3)), conv.var((0, 2, 3), ddof=1)
    before = det.state_dict()
    t1 = det.forward(x)
    sd = det.state_dict()
    np.testing.assert_allclose(sd["model.0.bn.running_mean"], 0.03 * mean, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(sd["model.0.bn.running_var"], 0.97 + 0.03 * var, rtol=1e-5)
    for k in before:
        if k.endswith("running_var") and ".one2one_" not in k:
            assert not np.array_equal(before[k], sd[k]), k
    # Training-mode outputs of an image depend on the rest of the batch; eval-mode ones do not.
    t_single = det.forward(x[:1])
    assert not np.allclose(t1["one2many"][1][:1], t_single["one2many"][1])
    det.eval()
    frozen = det.flat_buffers.numpy()
    e1 = det.forward(x)
    e_single = det.forward(x[:1])
    assert np.array_equal(det.flat_buffers, frozen)
    np.testing.assert_allclose(e1["one2many"][1][:1], e_single["one2many"][1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(e1["one2many"][1], t1["one2many"][1])


# ------------------------------------------------------------------------------------ backward

def _linear_functional(out, seed):
    rng = np.random.default_rng(seed)
    return {br: tuple(rng.standard_normal(a.shape) for a in out[br]) for br in out}


def _loss(out, R):
    return sum(float(np.sum(a * r)) for br in out for a, r in zip(out[br], R[br]))


def test_finite_differences_float64():
    det = Detector("yolo26n", num_classes=5, dtype="float64", seed=2)
    # Random BN affine parameters and biases, so that no gradient is trivially tied to init values.
    rng = np.random.default_rng(7)
    p = det.flat_parameters.numpy()
    for name, off, shape in det.parameter_table():
        n = int(np.prod(shape))
        if name.endswith("bn.weight"):
            p[off:off + n] = rng.uniform(0.5, 1.5, n)
        elif name.endswith("bn.bias") or name.endswith(".bias"):
            p[off:off + n] = rng.uniform(-0.5, 0.5, n)
    det.flat_parameters = p
    x = _images(2, 64, 64, seed=11, dtype=np.float64)
    out = det.forward(x)
    R = _linear_functional(out, 1)
    det.zero_grad()
    dx = det.backward(R, input_grad=True)
    grad = det.flat_gradients.numpy()

    # The o2o head reads detached features: the analytic gradient of a backbone/neck parameter (or a
    # pixel) is that of the o2m part of the loss alone, which is what the finite difference must see.
    R_m = {"one2many": R["one2many"], "one2one": tuple(np.zeros_like(r) for r in R["one2one"])}

    def f_params(i, h, RR):
        p = det.flat_parameters.numpy()
        old = p[i]
        p[i] = old + h
        det.flat_parameters = p
        v = _loss(det.forward(x), RR)
        p[i] = old
        det.flat_parameters = p
        return v

    table = {n: (o, s) for n, o, s in det.parameter_table()}
    picks = ["model.0.conv.weight", "model.0.bn.weight", "model.2.m.0.cv1.conv.weight", "model.6.m.0.cv2.bn.bias",
             "model.9.cv1.conv.weight", "model.10.m.0.attn.qkv.conv.weight", "model.10.m.0.attn.pe.conv.weight",
             "model.13.cv2.conv.weight", "model.22.m.0.1.attn.qkv.bn.weight", "model.23.cv2.0.2.bias",
             "model.23.cv3.2.0.0.conv.weight", "model.23.one2one_cv3.1.1.1.conv.weight",
             "model.23.one2one_cv2.2.0.bn.bias"]
    h = 1e-6  # early layers are strongly curved: the O(h^2) error at 1e-5 is ~1e-6 relative
    for name in picks:
        off, shape = table[name]
        i = off + int(rng.integers(int(np.prod(shape))))
        RR = R if name.startswith("model.23.") else R_m
        fd = (f_params(i, h, RR) - f_params(i, -h, RR)) / (2 * h)
        assert abs(fd - grad[i]) <= 1e-6 * max(1.0, abs(fd)), (name, fd, grad[i])

    def f_input(idx, h):
        xx = x.copy()
        xx[idx] += h
        return _loss(det.forward(xx), R_m)

    for _ in range(4):
        idx = tuple(int(rng.integers(s)) for s in x.shape)
        fd = (f_input(idx, h) - f_input(idx, -h)) / (2 * h)
        assert abs(fd - dx[idx]) <= 1e-6 * max(1.0, abs(fd)), (idx, fd, dx[idx])


def test_backward_accumulates_and_eval_mode_gradients():
    det = Detector("yolo26n", num_classes=4, dtype="float64")
    x = _images(1, 32, 32, seed=2, dtype=np.float64)
    det.eval()
    out = det.forward(x)
    R = _linear_functional(out, 4)
    R["one2one"] = tuple(np.zeros_like(r) for r in R["one2one"])  # body gradients see o2m only
    det.zero_grad()
    det.backward(R)
    g1 = det.flat_gradients.numpy()
    det.forward(x)  # each forward has one backward
    det.backward(R)
    np.testing.assert_allclose(det.flat_gradients, 2 * g1, rtol=1e-12)
    # Eval mode (fixed statistics): one finite-difference probe on a BN weight deep in the net.
    off = dict((n, o) for n, o, _ in det.parameter_table())["model.19.m.0.cv3.bn.weight"]
    p = det.flat_parameters.numpy()
    vals = []
    for hh in (1e-6, -1e-6):
        p[off] += hh
        det.flat_parameters = p
        vals.append(_loss(det.forward(x), R))
        p[off] -= hh
        det.flat_parameters = p
    fd = (vals[0] - vals[1]) / 2e-6
    assert abs(fd - g1[off]) <= 1e-6 * max(1.0, abs(fd))


def test_no_grad_context():
    """Detector.no_grad(): the same outputs, a backward refused inside, gradients back on after (also when
    the block raises)."""
    det = Detector("yolo26n", num_classes=3)
    det.eval()
    x = _images(1, 64, 64, seed=4)
    out = det.forward(x)
    with det.no_grad():
        inner = det.forward(x)
        with pytest.raises(RuntimeError, match="without gradients"):
            det.backward(_linear_functional(inner, 1))
    for br in out:
        for a, b in zip(out[br], inner[br]):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(KeyError):
        with det.no_grad():
            raise KeyError("inside")
    det.forward(x)
    det.backward(_linear_functional(out, 1))


def test_o2o_gradient_isolation():
    det = Detector("yolo26n", num_classes=3)
    x = _images(2, 64, 64, seed=9)
    out = det.forward(x)
    R = _linear_functional(out, 2)
    table = det.parameter_table()

    def grads_for(branch):
        det.forward(x)  # each forward has one backward
        det.zero_grad()
        dx = det.backward({branch: R[branch]}, input_grad=True)
        g = det.flat_gradients.numpy()
        head = {"o2m": 0.0, "o2o": 0.0, "body": 0.0}
        for name, off, shape in table:
            n = int(np.prod(shape))
            key = "o2o" if ".one2one_" in name else "o2m" if name.startswith("model.23.") else "body"
            head[key] += float(np.abs(g[off:off + n]).sum())
        return head, dx

    o2o, dx = grads_for("one2one")
    assert o2o["body"] == 0.0 and o2o["o2m"] == 0.0 and o2o["o2o"] > 0
    assert np.all(dx == 0)
    o2m, dx = grads_for("one2many")
    assert o2m["o2o"] == 0.0 and o2m["o2m"] > 0 and o2m["body"] > 0
    assert np.abs(dx).sum() > 0


# ---------------------------------------------------------------------------------- state dict

def test_load_state_dict_round_trip_and_strictness():
    a = Detector("yolo26n", num_classes=6, seed=1)
    a.forward(_images(2, 64, 64))  # move the running stats away from init
    b = Detector("yolo26n", num_classes=6, seed=2)
    sd = a.state_dict()
    before = b.state_dict()

    missing = dict(sd)
    del missing["model.4.m.0.cv2.conv.weight"]
    with pytest.raises(KeyError, match=r"model\.4\.m\.0\.cv2\.conv\.weight"):
        b.load_state_dict(missing)
    extra = dict(sd, **{"model.99.conv.weight": np.zeros(3, np.float32)})
    with pytest.raises(KeyError, match=r"model\.99\.conv\.weight"):
        b.load_state_dict(extra)
    bad = dict(sd)
    bad["model.1.bn.running_var"] = np.ones(7, np.float32)
    with pytest.raises(ValueError, match=r"model\.1\.bn\.running_var"):
        b.load_state_dict(bad)
    after = b.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)  # nothing changed

    # Non-strict (a transfer): the mis-shaped value is listed and keeps the model's value, the rest loads.
    plan = b.load_state_dict(bad, strict=False, verbose=False)
    assert [m[0] for m in plan.mismatched] == ["model.1.bn.running_var"] and not plan.missing
    sb = b.state_dict()
    assert np.array_equal(sb["model.1.bn.running_var"], before["model.1.bn.running_var"])
    assert all(np.array_equal(sb[k], sd[k]) for k in sd if k != "model.1.bn.running_var")
    b.load_state_dict(before)

    # Non-strict: unknown keys ignored, missing ones keep their values; num_batches_tracked accepted.
    part = {"model.0.conv.weight": sd["model.0.conv.weight"], "foo": np.zeros(1)}
    b.load_state_dict(part, strict=False)
    assert np.array_equal(b.state_dict()["model.0.conv.weight"], sd["model.0.conv.weight"])
    full = dict(sd, **{"model.0.bn.num_batches_tracked": np.array(3)})
    b.load_state_dict(full)
    sb = b.state_dict()
    assert all(np.array_equal(sd[k], sb[k]) for k in sd)
    x = _images(1, 64, 64, seed=4)
    a.eval(), b.eval()
    oa, ob = a.forward(x), b.forward(x)
    assert all(np.array_equal(p, q) for br in oa for p, q in zip(oa[br], ob[br]))


def test_save_load_safetensors(tmp_path):
    if not hasattr(ptl._C, "safetensors_save"):
        pytest.skip("ptl._C has no safetensors functions (csrc/io not registered in module.c)")
    a = Detector("yolo26n", num_classes=6, seed=4)
    a.forward(_images(2, 64, 64))  # running stats away from init
    path = tmp_path / "det.safetensors"
    a.save(path)
    b = Detector.load(path)
    assert (b.scale, b.num_classes) == ("n", 6)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(np.array_equal(sa[k], sb[k]) for k in sa)
    from ptl.io import load_safetensors
    tensors, meta = load_safetensors(path)
    assert meta["model"] == "yolo26n" and meta["num_classes"] == "6"
    assert set(tensors) == set(sa)
    with pytest.raises(ValueError, match="cv3"):  # a 6-class file does not fit an 80-class model
        Detector("yolo26n", num_classes=80).load_state_dict(tensors)
    st = pytest.importorskip("safetensors.numpy")
    ext = st.load_file(str(path))
    assert all(np.array_equal(ext[k], sa[k]) for k in sa)


def test_predict_shapes_and_ranges(det_n):
    x = np.random.default_rng(0).integers(0, 256, (2, 64, 96, 3), dtype=np.uint8)
    res = det_n.predict(x, conf=0.0, end2end=True)  # the one-to-one top-k: min(300, A) rows
    A = 8 * 12 + 4 * 6 + 2 * 3
    assert len(res) == 2
    for r in res:
        k = len(r["scores"])
        assert k == min(300, A)
        assert r["boxes"].shape == (k, 4) and r["classes"].shape == (k,)
        assert np.all(np.diff(r["scores"]) <= 0) and np.all((r["scores"] > 0) & (r["scores"] < 1))
        assert r["classes"].min() >= 0 and r["classes"].max() < 80
        assert np.all(r["boxes"][:, 2] > r["boxes"][:, 0]) and np.all(r["boxes"][:, 3] > r["boxes"][:, 1])
    assert det_n.training  # predict restores the mode
    assert det_n.predict(x, conf=0.5)[0]["scores"].shape == (0,)  # init prior: scores near 1e-5


def test_shape_change_and_bad_calls():
    det = Detector("yolo26n", num_classes=2).eval()
    a = _images(1, 64, 64, seed=1)
    first = det.forward(a)
    other = det.forward(_images(2, 96, 64, seed=2))
    assert other["one2many"][1].shape == (2, 12 * 8 + 6 * 4 + 3 * 2, 2)
    again = det.forward(a)
    assert all(np.array_equal(p, q) for br in first for p, q in zip(first[br], again[br]))
    with pytest.raises(ValueError, match="d_scores"):
        det.backward({"one2many": (None, np.zeros((1, 5, 2)))})
    fresh = Detector("yolo26n", num_classes=2)
    with pytest.raises(RuntimeError, match="forward"):
        fresh.backward({"one2many": (None, None)})
    with pytest.raises(TypeError, match="images"):
        det.forward(np.zeros((1, 3, 64, 64), np.int32))


def test_to_and_modes(det_n):
    assert det_n.to("cpu") is det_n
    if not ptl.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            det_n.to("cuda")
    with pytest.raises(ValueError, match="device"):
        det_n.to("gpu")
    with pytest.raises(ValueError, match="float64"):
        Detector("yolo26n", dtype="float64").to("cuda")
    assert det_n.eval().training is False
    assert det_n.train().training is True
    with pytest.raises(ValueError):
        Detector("yolo27n")
    with pytest.raises(ValueError):
        Detector(scale="q")
    assert Detector(scale="s").scale == "s"


# ------------------------------------------------------------------------------------ torchref

@pytest.mark.torchref
@pytest.mark.parametrize("kernels", ["reference", "fast"])
@pytest.mark.parametrize("scale,training", [("n", True), ("n", False), ("s", True)])
def test_torchref_parity(torchref, scale, training, kernels, monkeypatch):
    """Same weights in torchref and ptl: same names and order, head outputs, running statistics and
    every parameter gradient of a fixed random linear functional of the outputs (float32, CPU).

    On the reference kernels every tensor's gradient is checked as well; the fast CPU backend's oneDNN
    convolutions sum in float32 in their own order (per conv 3-4x the reference's rounding error,
    tests/test_cpu_fast.py), which puts some deep gradients (yolo26s, layers 19-22) up to 2x further from
    the float64 truth than PyTorch's float32, so the fast backend is held to the issue's whole-network
    measures here and to the reference (against float64) per tensor in test_cpu_fast.py."""
    import torch
    from torchref import model as tm

    if kernels == "fast" and not ptl._C.cpu_conv2d_available():
        pytest.skip("ptl built without oneDNN")
    monkeypatch.setenv("PTL_CPU_KERNELS", kernels)
    ours = Detector(scale=scale, num_classes=80, seed=3)
    ref = tm.build_model(scale, seed=0)
    ref_named = tm.named_tensors(ref)
    sd = ours.state_dict()
    assert list(ref_named) == list(sd)  # same names, same order
    for k, v in ref_named.items():
        assert tuple(v.shape) == sd[k].shape, k
    # Random BN parameters and statistics, so that every path carries a distinct signal.
    rng = np.random.default_rng(0)
    for k in sd:
        if k.endswith("bn.weight") or k.endswith("running_var"):
            sd[k] = rng.uniform(0.5, 1.5, sd[k].shape).astype(np.float32)
        elif k.endswith("bn.bias") or k.endswith("running_mean"):
            sd[k] = rng.uniform(-0.3, 0.3, sd[k].shape).astype(np.float32)
    ours.load_state_dict(sd)
    tm.load_named_tensors(ref, {k: torch.from_numpy(v.copy()) for k, v in sd.items()})
    ours.train(training)
    ref.train(training)
    x = _images(2, 128, 96, seed=1)
    out = ours.forward(x)
    rb, rs, rb1, rs1 = ref(torch.from_numpy(x))
    ref_out = {"one2many": (rb.transpose(1, 2), rs.transpose(1, 2)),
               "one2one": (rb1.transpose(1, 2), rs1.transpose(1, 2))}

    def rel(a, b):
        return float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)) /
                     max(np.linalg.norm(np.asarray(b, np.float64)), 1e-30))

    out_err = max(rel(a, b.detach().numpy()) for br in out for a, b in zip(out[br], ref_out[br]))
    assert out_err <= 1e-4
    ref_sd = tm.named_tensors(ref)
    ours_sd = ours.state_dict()
    stat_err = max(rel(ours_sd[k], ref_sd[k].numpy()) for k in ours_sd if "running" in k)
    assert stat_err <= 1e-4
    R = _linear_functional(out, 5)
    RR = list(R["one2many"]) + list(R["one2one"])
    loss = sum((t * torch.from_numpy(r.astype(np.float32))).sum() for t, r in zip(list(ref_out["one2many"]) +
                                                                                 list(ref_out["one2one"]), RR))
    loss.backward()
    ours.zero_grad()
    ours.backward({br: tuple(r.astype(np.float32) for r in R[br]) for br in R})
    # The float64 truth: torchref in double precision, same weights (and, in eval mode, statistics).
    ref64 = tm.build_model(scale, seed=0).double()
    tm.load_named_tensors(ref64, {k: torch.from_numpy(v.astype(np.float64)) for k, v in sd.items()})
    ref64.train(training)
    out64 = [t.transpose(1, 2) for t in ref64(torch.from_numpy(x.astype(np.float64)))]
    sum((t * torch.from_numpy(r)).sum() for t, r in zip(out64, RR)).backward()
    g = ours.flat_gradients.numpy().astype(np.float64)
    p32, p64 = dict(ref.named_parameters()), dict(ref64.named_parameters())
    names = [n for n, _, _ in ours.parameter_table()]
    t32 = np.concatenate([p32[n].grad.numpy().ravel() for n in names]).astype(np.float64)
    t64 = np.concatenate([p64[n].grad.numpy().ravel() for n in names])
    norm = np.linalg.norm
    grad_err = norm(g - t32) / norm(t32)  # the measure: ptl vs torchref, float32
    print(f"torchref parity {scale} train={training}: outputs {out_err:.2e}, running stats {stat_err:.2e}, "
          f"gradient {grad_err:.2e} (vs float64: ptl {norm(g - t64) / norm(t64):.2e}, "
          f"torch {norm(t32 - t64) / norm(t64):.2e})")
    assert grad_err <= 1e-4
    if kernels == "fast":
        return
    # Per tensor, against the float64 truth: within 1e-4 of its own norm, or no further from the
    # truth than 1.5x PyTorch's own float32 result (deep early-layer BN gradients are ill-conditioned
    # in float32 for both). Tensors whose exact gradient is zero (a BN shift followed, through linear
    # layers only, by another training-mode BN) must stay at rounding level of the whole gradient.
    bad = []
    for name, off, shape in ours.parameter_table():
        sl = slice(off, off + int(np.prod(shape)))
        e_ours, e_torch, ref_n = norm(g[sl] - t64[sl]), norm(t32[sl] - t64[sl]), norm(t64[sl])
        if ref_n <= 1e-6 * norm(t64):
            ok = e_ours <= 1e-6 * norm(t64)
        else:
            ok = e_ours <= 1e-4 * ref_n or e_ours <= 1.5 * e_torch
        if not ok:
            bad.append((name, ref_n, e_ours, e_torch))
    assert not bad, f"(name, |truth|, |ptl - truth|, |torch - truth|): {bad[:10]}"


@pytest.mark.torchref
def test_torchref_parity_float64(torchref):
    """In float64 the two implementations agree to rounding: the same network, exactly."""
    import torch
    from torchref import model as tm

    ours = Detector("yolo26n", num_classes=80, dtype="float64", seed=3)
    sd = ours.state_dict()
    rng = np.random.default_rng(1)
    for k in sd:
        if k.endswith("bn.weight"):
            sd[k] = rng.uniform(0.5, 1.5, sd[k].shape)
        elif k.endswith("bn.bias"):
            sd[k] = rng.uniform(-0.3, 0.3, sd[k].shape)
    ours.load_state_dict(sd)
    ref = tm.build_model("n", seed=0).double()
    tm.load_named_tensors(ref, {k: torch.from_numpy(v.copy()) for k, v in sd.items()})
    ref.train()
    x = _images(2, 64, 128, seed=2, dtype=np.float64)
    out = ours.forward(x)
    ref_out = [t.transpose(1, 2) for t in ref(torch.from_numpy(x))]
    mine = list(out["one2many"]) + list(out["one2one"])
    for a, b in zip(mine, ref_out):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-9, atol=1e-9)
    R = _linear_functional(out, 6)
    RR = list(R["one2many"]) + list(R["one2one"])
    sum((a * torch.from_numpy(b)).sum() for a, b in zip(ref_out, RR)).backward()
    ours.zero_grad()
    ours.backward(R)
    params = dict(ref.named_parameters())
    ref_g = np.concatenate([params[n].grad.numpy().ravel() for n, _, _ in ours.parameter_table()])
    scale = np.linalg.norm(ref_g)
    for name, off, shape in ours.parameter_table():
        n = int(np.prod(shape))
        r = params[name].grad.numpy().ravel()
        assert np.linalg.norm(ours.flat_gradients.numpy()[off:off + n] - r) <= 1e-9 * max(np.linalg.norm(r), 1e-3 * scale), name
