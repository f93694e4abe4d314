"""The end-to-end detection objective (8.4.190's E2ELoss, docs/ultralytics_parity.md) against a NumPy
reference written here, finite differences and CUDA (marked). The real package is the oracle in
tests/test_ultralytics_parity.py."""
import math
import pathlib
import sys

import numpy as np
import pytest

import ptl
import ptl.objective  # noqa: F401  (the module; ptl may also export a function of that name)

O = sys.modules["ptl.objective"]

STRIDES = (8, 16, 32)
K_V = 4 / math.pi ** 2


# ----------------------------------------------------------------------------- NumPy reference

def ref_anchors(h, w, dt=np.float64):
    pts, st = [], []
    for s in STRIDES:
        ys, xs = np.meshgrid(np.arange(h // s) + 0.5, np.arange(w // s) + 0.5, indexing="ij")
        pts.append(np.stack([xs.ravel(), ys.ravel()], 1))
        st.append(np.full(xs.size, s))
    return np.concatenate(pts).astype(dt), np.concatenate(st).astype(dt)


def _atan(x):
    """float64: NumPy's. float32: the polynomial the C code uses on the CPU and the GPU (Cephes' atanf,
    from single-precision multiplies and adds), evaluated with the same operations."""
    if x.dtype != np.float32:
        return np.arctan(x)
    f = np.float32
    sign = np.where(x < 0, f(-1), f(1))
    a = np.abs(x)
    big, mid = a > f(2.414213562373095), a > f(0.4142135623730950)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(big, f(-1) / a, np.where(mid, (a - f(1)) / (a + f(1)), a))
    y0 = np.where(big, f(1.5707963267948966), np.where(mid, f(0.7853981633974483), f(0)))
    z = a * a
    p = f(8.05374449538e-2) * z - f(1.38776856032e-1)
    p = p * z + f(1.99777106478e-1)
    p = p * z - f(3.33329491539e-1)
    y = (p * z) * a + a
    return sign * (y0 + y)


def _exp(x):
    """float64: NumPy's; float32: the C code's Cephes expf (same operations)."""
    if x.dtype != np.float32:
        return np.exp(x)
    f = np.float32
    xc = np.clip(x, f(-103.97208), f(88.72283905206835))
    fn = np.floor(xc * f(1.44269504088896341) + f(0.5))
    r = (xc - fn * f(0.693359375)) - fn * f(-2.12194440e-4)
    p = f(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + f(c)
    y = ((p * r) * r + r) + f(1)
    n = fn.astype(np.int64)
    hh = n // 2 + (n % 2 != 0) * (n < 0)  # C division truncates toward zero
    out = (y * np.ldexp(f(1), hh).astype(f)) * np.ldexp(f(1), n - hh).astype(f)
    out = np.where(x > f(88.72283905206835), f(np.inf), out)
    return np.where(x < f(-103.97208), f(0), out)


def ref_ciou(a, b, alpha=None, return_alpha=False):
    """CIoU of xyxy boxes a, b (broadcast over leading dims), 8.4.190's bbox_iou formula in its order.
    alpha: use this value of the (gradient-free) alpha instead of the one of a, b."""
    ax1, ay1, ax2, ay2 = (a[..., i] for i in range(4))
    bx1, by1, bx2, by2 = (b[..., i] for i in range(4))
    eps = 1e-7
    w1, h1 = ax2 - ax1, (ay2 - ay1) + eps
    w2, h2 = bx2 - bx1, (by2 - by1) + eps
    inter = np.maximum(np.minimum(ax2, bx2) - np.maximum(ax1, bx1), 0) * \
        np.maximum(np.minimum(ay2, by2) - np.maximum(ay1, by1), 0)
    union = ((w1 * h1 + w2 * h2) - inter) + eps
    iou = inter / union
    cw = np.maximum(ax2, bx2) - np.minimum(ax1, bx1)
    ch = np.maximum(ay2, by2) - np.minimum(ay1, by1)
    c2 = (cw * cw + ch * ch) + eps
    dx = ((bx1 + bx2) - ax1) - ax2
    dy = ((by1 + by2) - ay1) - ay2
    rho2 = (dx * dx + dy * dy) / 4
    da = _atan(w2 / h2) - _atan(w1 / h1)
    v = K_V * (da * da)
    if alpha is None:
        alpha = v / (((1 - iou) + v) + eps)
    c = iou - (rho2 / c2 + v * alpha)
    return (c, alpha) if return_alpha else c


def ref_targets(rows, bsz, h, w, dt=np.float64):
    """Per image: classes and pixel xyxy boxes, in row order, degenerate rows dropped."""
    rows = np.asarray(rows, np.float32).reshape(-1, 6)
    out = []
    for b in range(bsz):
        r = rows[(rows[:, 0] == b) & (rows[:, 4] > 0) & (rows[:, 5] > 0)]
        cx, cy = r[:, 2].astype(dt) * w, r[:, 3].astype(dt) * h
        bw, bh = r[:, 4].astype(dt) * w, r[:, 5].astype(dt) * h
        box = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1)
        keep = ((box[:, 0] + box[:, 1]) + box[:, 2]) + box[:, 3] > 0
        out.append((r[keep, 1].astype(np.int64), box[keep]))
    return out


def ref_assign_image(dist, logits, cls, gtb, h, w, topk, topk2):
    """Dense TaskAlignedAssigner of one image (8.4.190's); ties: lower anchor index first (stable sort).
    Returns owner (A,) (-1 background) and the normalised target score (A,)."""
    dt = dist.dtype.type
    anc, st = ref_anchors(h, w, dt)
    na, n = len(anc), len(cls)
    owner, nval = np.full(na, -1), np.zeros(na, dt)
    if n == 0:
        return owner, nval
    cx, cy = (gtb[:, 0] + gtb[:, 2]) / 2, (gtb[:, 1] + gtb[:, 3]) / 2
    bw, bh = gtb[:, 2] - gtb[:, 0], gtb[:, 3] - gtb[:, 1]
    bw = np.where(bw < 16, dt(16), bw)  # STAL: sides under the second stride widened to it
    bh = np.where(bh < 16, dt(16), bh)
    e = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1)
    px, py = anc[:, 0] * st, anc[:, 1] * st
    inbox = (px[None] - e[:, None, 0] > 1e-9) & (py[None] - e[:, None, 1] > 1e-9) & \
        (e[:, None, 2] - px[None] > 1e-9) & (e[:, None, 3] - py[None] > 1e-9)
    pb = np.stack([(anc[:, 0] - dist[:, 0]) * st, (anc[:, 1] - dist[:, 1]) * st,
                   (anc[:, 0] + dist[:, 2]) * st, (anc[:, 1] + dist[:, 3]) * st], 1)
    u = np.maximum(ref_ciou(gtb[:, None, :], pb[None, :, :]), 0)
    ov = np.where(inbox, u, dt(0))
    ps = 1 / (1 + _exp(-logits[:, cls].T))
    u2 = ov * ov
    align = np.where(inbox, np.sqrt(ps) * ((u2 * u2) * u2), dt(0))
    rows = np.arange(n)[:, None]
    top = np.zeros((n, na), bool)
    top[rows, np.argsort(-align, axis=1, kind="stable")[:, :topk]] = True
    mask = top & inbox
    multi = mask.sum(0) > 1
    best = ov.argmax(0)
    mask[:, multi] = False
    mask[best[multi], np.nonzero(multi)[0]] = True
    if topk2 != topk:
        keep = np.zeros((n, na), bool)
        keep[rows, np.argsort(-(align * mask), axis=1, kind="stable")[:, :topk2]] = True
        mask &= keep
    fg = mask.any(0)
    owner = np.where(fg, mask.argmax(0), -1)
    am = align * mask
    amax, omax = am.max(1), (ov * mask).max(1)
    nval = ((am * omax[:, None]) / (amax[:, None] + 1e-9)).max(0)
    return owner, nval


def ref_branch(dist, logits, tg, h, w, topk, topk2):
    """One branch over the batch: owners, scores and the loss sums L_box, L_cls, L_l1 (v8DetectionLoss)."""
    bsz = dist.shape[0]
    dt = dist.dtype.type
    anc, st = ref_anchors(h, w, dt)
    owners, nvals = [], []
    for b in range(bsz):
        o, nv = ref_assign_image(dist[b], logits[b], tg[b][0], tg[b][1], h, w, topk, topk2)
        owners.append(o)
        nvals.append(nv)
    owners, nvals = np.stack(owners), np.stack(nvals)
    t_sum = max(float(nvals[owners >= 0].astype(np.float64).sum()), 1.0)
    box = cls_l = l1 = 0.0
    for b in range(bsz):
        x = logits[b].astype(np.float64)
        t = np.zeros_like(x)
        fg = owners[b] >= 0
        t[fg, tg[b][0][owners[b][fg]]] = nvals[b][fg]
        cls_l += float((np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))).sum())
        sel = fg & (nvals[b] != 0)
        if sel.any():
            a, s, d = anc[sel], st[sel][:, None], dist[b][sel]
            tgt = tg[b][1][owners[b][sel]] / s
            pred = np.concatenate([a - d[:, :2], a + d[:, 2:]], 1)
            wgt = nvals[b][sel]
            box += float(((1 - ref_ciou(pred, tgt)) * wgt).sum())
            norm = np.array([w, h, w, h], dt)
            tn = (np.concatenate([a - tgt[:, :2], tgt[:, 2:] - a], 1) * s) / norm
            pn = (d * s) / norm
            l1 += float((np.abs(pn - tn).sum(1) / 4 * wgt).sum())
    return owners, nvals, np.array([box, cls_l, l1]) / t_sum


def ref_objective(outputs, rows, h, w, o2m_weight, dt=np.float64, gains=(7.5, 0.5, 1.5)):
    bsz = outputs[0].shape[0]
    tg = ref_targets(rows, bsz, h, w, dt)
    res = {}
    comps = []
    for k, (br, topk, topk2) in enumerate((("o2m", 10, 10), ("o2o", 7, 1))):
        o, nv, lv = ref_branch(outputs[2 * k].astype(dt), outputs[2 * k + 1].astype(dt), tg, h, w, topk, topk2)
        res[br] = (o, nv)
        comps.append(lv * np.array(gains))
    wo = max(1 - o2m_weight, 0)
    total = bsz * (o2m_weight * comps[0].sum() + wo * comps[1].sum())
    res["losses"] = np.concatenate([[total], bsz * comps[0], bsz * comps[1], comps[1]])
    return res


# ----------------------------------------------------------------------------- data

def make_targets(rng, bsz, counts, nc=80, min_side=2 / 640, max_side=0.6):
    rows = []
    for b in range(bsz):
        n = counts[b] if hasattr(counts, "__len__") else counts
        wh = np.exp(rng.uniform(np.log(min_side), np.log(max_side), (n, 2)))
        c = wh / 2 + rng.uniform(0, 1, (n, 2)) * (1 - wh)
        rows.append(np.column_stack([np.full(n, b), rng.integers(0, nc, n), c, wh]))
    return np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, 6), np.float32)


def make_outputs(rng, rows, bsz, h, w, nc, dt=np.float64):
    """Head outputs that look half-trained: anchors inside an object regress (noisily) towards it, the
    rest predict small random boxes; logits around -3."""
    anc, st = ref_anchors(h, w)
    outs = []
    for _ in range(2):
        dist = rng.uniform(0.3, 4.0, (bsz, len(anc), 4))
        for r in rows[rng.permutation(len(rows))] if len(rows) else []:
            b = int(r[0])
            g = np.array([(r[2] - r[4] / 2) * w, (r[3] - r[5] / 2) * h, (r[2] + r[4] / 2) * w,
                          (r[3] + r[5] / 2) * h])[None] / st[:, None]
            inside = (anc[:, 0] > g[:, 0] - 1) & (anc[:, 0] < g[:, 2] + 1) & \
                (anc[:, 1] > g[:, 1] - 1) & (anc[:, 1] < g[:, 3] + 1)
            d = np.stack([anc[:, 0] - g[:, 0], anc[:, 1] - g[:, 1], g[:, 2] - anc[:, 0],
                          g[:, 3] - anc[:, 1]], 1)[inside]
            dist[b, inside] = d * np.exp(rng.normal(0, 0.3, d.shape)) + rng.normal(0, 0.2, d.shape)
        logits = rng.normal(-3, 2, (bsz, len(anc), nc))
        outs += [dist.astype(dt), logits.astype(dt)]
    return outs


def run(outputs, rows, h, w, o2m_weight=0.8, **kw):
    return O.objective(outputs, rows, img_size=(h, w), o2m_weight=o2m_weight, return_assignment=True, **kw)


def check_assignment(res, ref, score_rtol):
    for br in ("o2m", "o2o"):
        gt, sc = res["assignment"][br]
        np.testing.assert_array_equal(gt, ref[br][0], err_msg=br)
        np.testing.assert_allclose(sc, ref[br][1], rtol=score_rtol, atol=0, err_msg=br)


CASES = [  # (seed, batch, h, w, nc, boxes per image)
    (0, 2, 64, 64, 3, [3, 0]),
    (1, 3, 128, 96, 5, [1, 6, 12]),
    (2, 2, 96, 160, 4, [25, 40]),
    (3, 1, 256, 256, 80, [60]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "s%d_%dx%d" % (c[0], c[2], c[3]))
def test_matches_reference_float64(case):
    seed, bsz, h, w, nc, counts = case
    rng = np.random.default_rng(seed)
    rows = make_targets(rng, bsz, counts, nc, min_side=3 / max(h, w))
    outs = make_outputs(rng, rows, bsz, h, w, nc)
    for wgt in (0.8, 0.3):
        res = run(outs, rows, h, w, wgt)
        ref = ref_objective(outs, rows, h, w, wgt)
        check_assignment(res, ref, 1e-12)
        np.testing.assert_allclose(res["losses"], ref["losses"], rtol=2e-6)  # float32 storage
        assert res["assignment"]["o2m"][0].max() >= 0 or sum(counts) == 0
    for br in ("o2o",):  # at most one positive per object
        gt = res["assignment"][br][0]
        for b in range(bsz):
            v = gt[b][gt[b] >= 0]
            assert len(v) == len(set(v.tolist()))


def test_matches_reference_float32():
    rng = np.random.default_rng(7)
    bsz, h, w, nc = 3, 128, 160, 20
    rows = make_targets(rng, bsz, [5, 30, 0], nc, min_side=3 / 160)
    outs = make_outputs(rng, rows, bsz, h, w, nc, dt=np.float32)
    res = run(outs, rows, h, w)
    ref = ref_objective(outs, rows, h, w, 0.8, dt=np.float32)
    check_assignment(res, ref, 0)  # same float32 operations: bit-identical
    np.testing.assert_allclose(res["losses"], ref["losses"], rtol=1e-5)
    ref64 = ref_objective(outs, rows, h, w, 0.8)
    np.testing.assert_allclose(res["losses"], ref64["losses"], rtol=1e-4)


def test_coco256_real_boxes(coco256):
    files = sorted((pathlib.Path(coco256) / "labels").rglob("*.txt"))
    assert len(files) > 100
    rng = np.random.default_rng(11)
    bsz, h, w, nc = 16, 640, 640, 80
    nonempty = 0
    for start in range(0, len(files), bsz * 4):  # every 4th batch of 16 images: 64 images in all
        rows = []
        for b, f in enumerate(files[start:start + bsz]):
            lab = np.loadtxt(f, ndmin=2).reshape(-1, 5)
            rows.append(np.column_stack([np.full(len(lab), b), lab]))
        rows = np.concatenate(rows).astype(np.float32)
        nonempty += len(rows)
        outs = make_outputs(rng, rows, bsz, h, w, nc)
        res = run(outs, rows, h, w)
        ref = ref_objective(outs, rows, h, w, 0.8)
        check_assignment(res, ref, 1e-12)
        np.testing.assert_allclose(res["losses"], ref["losses"], rtol=2e-6)
    assert nonempty > 100


def test_gradients_finite_differences():
    rng = np.random.default_rng(3)
    bsz, h, w, nc = 2, 64, 96, 3
    rows = make_targets(rng, bsz, [4, 2], nc, min_side=4 / 96)
    outs = make_outputs(rng, rows, bsz, h, w, nc)
    res = run(outs, rows, h, w, 0.6)
    asg = res["assignment"]
    assert (asg["o2m"][0] >= 0).sum() > 5 and (asg["o2o"][0] >= 0).sum() > 1

    def total(o):
        return float(O.objective(o, rows, img_size=(h, w), o2m_weight=0.6, assignment=asg)["losses"][0])

    # float32 storage of the total limits FD precision: use the components' float64 recomputation
    # instead, through a float64 total built from the reference with the same frozen assignment.
    def total64(o):
        tg = ref_targets(rows, bsz, h, w)
        t = 0.0
        for k, (br, wgt) in enumerate((("o2m", 0.6), ("o2o", 0.4))):
            t += wgt * bsz * frozen_branch(o[2 * k], o[2 * k + 1], tg, h, w, *asg[br], outs[2 * k]).dot([7.5, 0.5, 1.5])
        return t

    np.testing.assert_allclose(total64(outs), total(outs), rtol=2e-6)
    eps = 1e-6
    for i in range(4):
        g = res["grads"][i]
        flat = outs[i].reshape(-1)
        idx = np.arange(flat.size) if i % 2 == 0 else rng.choice(flat.size, 200, replace=False)
        if i % 2 == 1:  # include every positive's class entry
            gt = asg["o2m" if i == 1 else "o2o"][0].reshape(-1)
            pos = np.nonzero(gt >= 0)[0]
            idx = np.union1d(idx, pos * nc + rng.integers(0, nc, len(pos)))
        num = np.empty(len(idx))
        for k, j in enumerate(idx):
            o = [x.copy() for x in outs]
            o[i].reshape(-1)[j] += eps
            up = total64(o)
            o[i].reshape(-1)[j] -= 2 * eps
            num[k] = (up - total64(o)) / (2 * eps)
        ana = g.reshape(-1)[idx]
        np.testing.assert_allclose(ana, num, rtol=1e-5, atol=1e-7 * max(1.0, np.abs(num).max()),
                                   err_msg="output %d" % i)
        assert np.abs(ana).max() > 0


def frozen_branch(dist, logits, tg, h, w, owners, nvals, base_dist):
    """Loss sums (box, cls, l1)/T of one branch with a given assignment (float64); CIoU's alpha is
    taken at base_dist (the spec gives it no gradient)."""
    anc, st = ref_anchors(h, w)
    t_sum = max(nvals[owners >= 0].sum(), 1.0)
    out = np.zeros(3)
    for b in range(dist.shape[0]):
        x = logits[b]
        t = np.zeros_like(x)
        fg = owners[b] >= 0
        t[fg, tg[b][0][owners[b][fg]]] = nvals[b][fg]
        out[1] += (np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))).sum()
        sel = fg & (nvals[b] != 0)
        a, s, d = anc[sel], st[sel][:, None], dist[b][sel]
        tgt = tg[b][1][owners[b][sel]] / s
        pred = np.concatenate([a - d[:, :2], a + d[:, 2:]], 1)
        d0 = base_dist[b][sel]
        _, alpha = ref_ciou(np.concatenate([a - d0[:, :2], a + d0[:, 2:]], 1), tgt, return_alpha=True)
        out[0] += ((1 - ref_ciou(pred, tgt, alpha)) * nvals[b][sel]).sum()
        norm = np.array([w, h, w, h], float)
        tn = (np.concatenate([a - tgt[:, :2], tgt[:, 2:] - a], 1) * s) / norm
        out[2] += (np.abs((d * s) / norm - tn).sum(1) / 4 * nvals[b][sel]).sum()
    return out / t_sum


def test_gradient_matches_frozen_total_exactly_for_weights():
    """The gradient scales with the branch weights: w_o2m = 1 leaves no o2o gradient and vice versa."""
    rng = np.random.default_rng(5)
    rows = make_targets(rng, 2, [3, 3], 4, min_side=0.1)
    outs = make_outputs(rng, rows, 2, 64, 64, 4)
    r1 = run(outs, rows, 64, 64, 1.0)
    assert np.abs(r1["grads"][2]).max() == 0 and np.abs(r1["grads"][3]).max() == 0
    assert np.abs(r1["grads"][0]).max() > 0
    r0 = run(outs, rows, 64, 64, 0.0)
    assert np.abs(r0["grads"][0]).max() == 0 and np.abs(r0["grads"][1]).max() == 0
    rh = run(outs, rows, 64, 64, 0.5)
    np.testing.assert_allclose(rh["grads"][1], 0.5 * r1["grads"][1], rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(rh["grads"][3], 0.5 * r0["grads"][3], rtol=1e-12, atol=1e-300)


def test_ties_lowest_anchor_index_first():
    """Equal metrics: the lower anchor index wins (documented rule), run after run."""
    h = w = 64
    anc, st = ref_anchors(h, w)
    na = len(anc)
    # one 40x40 px object; every anchor predicts exactly that box (exact in binary) and every logit is
    # equal, so all candidates of the object have the same metric
    rows = np.array([[0, 1, 0.5, 0.5, 40 / 64, 40 / 64]], np.float32)
    gx1, gy1, gx2, gy2 = 12, 12, 52, 52
    dist = np.stack([anc[:, 0] - gx1 / st, anc[:, 1] - gy1 / st, gx2 / st - anc[:, 0], gy2 / st - anc[:, 1]], 1)
    logits = np.zeros((na, 2))
    outs = [dist[None], logits[None], dist[None].copy(), logits[None].copy()]
    first = run(outs, rows, h, w)
    ref = ref_objective(outs, rows, h, w, 0.8)
    check_assignment(first, ref, 1e-12)
    cand = np.nonzero((anc[:, 0] * st > 12) & (anc[:, 0] * st < 52) & (anc[:, 1] * st > 12) & (anc[:, 1] * st < 52))[0]
    np.testing.assert_array_equal(np.nonzero(first["assignment"]["o2m"][0][0] >= 0)[0], cand[:10])
    np.testing.assert_array_equal(np.nonzero(first["assignment"]["o2o"][0][0] >= 0)[0], cand[:1])
    for _ in range(3):
        again = run(outs, rows, h, w)
        for br in ("o2m", "o2o"):
            np.testing.assert_array_equal(again["assignment"][br][0], first["assignment"][br][0])
        np.testing.assert_array_equal(again["losses"], first["losses"])
    # zero metrics everywhere (predictions far off): picks fall on the lowest-index anchors overall,
    # so only candidates among anchors 0..9 become positive (here: none of them lie in the object)
    far = np.tile(np.array([-100.0, -100.0, 100.5, 100.5]), (na, 1))  # boxes far off: CIoU < 0
    outs = [far[None], logits[None], far[None].copy(), logits[None].copy()]
    res = run(outs, rows, h, w)
    check_assignment(res, ref_objective(outs, rows, h, w, 0.8), 1e-12)
    assert (res["assignment"]["o2m"][0] >= 0).sum() == 0
    # ... and an object in the top-left corner gets its candidates among those lowest anchors
    rows2 = np.array([[0, 0, 10 / 64, 10 / 64, 20 / 64, 20 / 64]], np.float32)
    res = run(outs, rows2, h, w)
    check_assignment(res, ref_objective(outs, rows2, h, w, 0.8), 1e-12)
    assert set(np.nonzero(res["assignment"]["o2m"][0][0] >= 0)[0]) == {0, 1, 8, 9}


def test_conflict_goes_to_largest_ciou_then_first_object():
    h = w = 64
    anc, st = ref_anchors(h, w)
    rng = np.random.default_rng(9)
    # two identical objects: every claimed anchor is contested with equal CIoU -> first object wins
    rows = np.array([[0, 1, 0.5, 0.5, 0.5, 0.5], [0, 1, 0.5, 0.5, 0.5, 0.5]], np.float32)
    outs = make_outputs(rng, rows, 1, h, w, 2)
    res = run(outs, rows, h, w)
    check_assignment(res, ref_objective(outs, rows, h, w, 0.8), 1e-12)
    gt = res["assignment"]["o2m"][0]
    assert (gt == 0).sum() == 10 and (gt == 1).sum() == 0


def test_empty_and_degenerate_targets():
    rng = np.random.default_rng(2)
    bsz, h, w, nc = 2, 64, 64, 3
    outs = make_outputs(rng, np.zeros((0, 6), np.float32), bsz, h, w, nc)
    for rows in (np.zeros((0, 6), np.float32),
                 np.array([[0, 1, 0.5, 0.5, 0.0, 0.3], [1, 2, 0.5, 0.5, 0.2, 0.0]], np.float32)):
        res = run(outs, rows, h, w)
        for br in ("o2m", "o2o"):
            assert (res["assignment"][br][0] == -1).all()
        x = [outs[1], outs[3]]
        bce = [float((np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v)))).sum()) for v in x]
        want = [0, bsz * 0.5 * bce[0], 0, 0, bsz * 0.5 * bce[1], 0]
        np.testing.assert_allclose(res["losses"][1:7], want, rtol=1e-6)
        assert np.abs(res["grads"][0]).max() == 0
        np.testing.assert_allclose(res["grads"][1], 0.8 * bsz * 0.5 / (1 + np.exp(-outs[1])), rtol=1e-12)


def test_bad_inputs():
    rng = np.random.default_rng(1)
    rows = make_targets(rng, 1, 2, 3)
    outs = make_outputs(rng, rows, 1, 64, 64, 3)
    bad = rows.copy()
    bad[1, 1] = 3
    with pytest.raises(ValueError, match="class"):
        run(outs, bad, 64, 64)
    bad = rows.copy()
    bad[0, 0] = 1
    with pytest.raises(ValueError, match="image index"):
        run(outs, bad, 64, 64)
    with pytest.raises(ValueError, match="img_size"):
        run(outs, rows, 64, 48)
    with pytest.raises(ValueError, match="anchors"):
        run(outs, rows, 64, 96)
    with pytest.raises(ValueError, match="num_classes"):
        O.objective(outs, rows, img_size=64, num_classes=80)
    with pytest.raises(ValueError, match="targets"):
        run(outs, rows[:, :5], 64, 64)
    with pytest.raises(TypeError, match="outputs"):
        run([o.astype(np.float16) for o in outs], rows, 64, 64)
    with pytest.raises(ValueError, match="o2m_weight"):
        run(outs, rows, 64, 64, o2m_weight=1.5)


def test_bad_assignment_raises_naming_it():
    """A given assignment that points past an image's targets raises (it used to read past the packed
    targets); -1 and valid indices still work."""
    rng = np.random.default_rng(6)
    rows = make_targets(rng, 2, [2, 1], 3)
    outs = make_outputs(rng, rows, 2, 64, 64, 3)
    asg = run(outs, rows, 64, 64)["assignment"]
    ok = O.objective(outs, rows, img_size=64, assignment=asg)
    assert np.isfinite(ok["losses"]).all()
    for br, k in (("o2m", 0), ("o2o", 1)):
        for bad_value in (1, 7, 100000, -2):  # image 1 has one target: index 1 is already out of range
            bad = {b: (v[0].copy(), v[1].copy()) for b, v in asg.items()}
            bad[br][0][1, 5] = bad_value
            with pytest.raises(ValueError, match=r"assign_gt\[%d\]" % k):
                O.objective(outs, rows, img_size=64, assignment=bad)
    with pytest.raises(TypeError, match="assignment"):
        O.objective(outs, rows, img_size=64, assignment={"o2m": asg["o2m"]})


class _FreshTensors:
    """A sequence whose items are built on each access, so nothing else keeps them alive."""

    def __init__(self, arrays):
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays)

    def __getitem__(self, i):
        if i >= len(self.arrays):
            raise IndexError(i)
        return ptl.tensor(self.arrays[i])


def test_outputs_from_a_sequence_that_builds_its_items():
    """The C entry point keeps the items of its sequence arguments alive for the whole call (it used to
    drop them right away and then read freed buffers)."""
    rng = np.random.default_rng(8)
    rows = make_targets(rng, 2, [4, 3], 80)
    outs = make_outputs(rng, rows, 2, 640, 640, 80, dt=np.float32)  # 2.7 MB scores: freed memory unmaps
    want = O.objective(outs, rows, img_size=640)
    losses = ptl.empty((10,), dtype="float32")
    grads = [ptl.empty(o.shape, dtype="float32") for o in outs]
    ptl._C.objective(_FreshTensors(outs), O._targets(rows), 640, 640, 0.8, losses, grads)
    np.testing.assert_array_equal(losses.numpy(), want["losses"])
    for g, w in zip(grads, want["grads"]):
        np.testing.assert_array_equal(g.numpy(), w)
    with pytest.raises(TypeError, match="img_size"):
        O.objective(outs, rows, img_size="640")


def test_gains_and_gradient_scale():
    """Overridden gains change the losses as the reference does; grad_scale multiplies every gradient
    (the same bits as scaling by hand for a power of two) and leaves the losses alone."""
    rng = np.random.default_rng(11)
    rows = make_targets(rng, 2, [3, 5], nc=4)
    outs = make_outputs(rng, rows, 2, 96, 64, 4)
    gains = (2.0, 3.0, 0.25)
    r = O.objective(outs, rows, img_size=(96, 64), o2m_weight=0.6, gains=gains)
    ref = ref_objective(outs, rows, 96, 64, 0.6, gains=gains)
    np.testing.assert_allclose(r["losses"], ref["losses"], rtol=1e-7)  # the losses vector is float32
    base = O.objective(outs, rows, img_size=(96, 64), o2m_weight=0.6)
    assert not np.allclose(base["losses"], r["losses"])
    scaled = O.objective(outs, rows, img_size=(96, 64), o2m_weight=0.6, grad_scale=1024.0)
    np.testing.assert_array_equal(scaled["losses"], base["losses"])
    for a, b in zip(scaled["grads"], base["grads"]):
        np.testing.assert_array_equal(a, 1024.0 * b)
    # gains scale the gradients of their own term: zero cls gain leaves no score gradient
    z = O.objective(outs, rows, img_size=(96, 64), gains=(7.5, 0.0, 1.5))
    assert not np.any(z["grads"][1]) and not np.any(z["grads"][3]) and np.any(z["grads"][0])
    for bad in ((1, -1, 1), (1, float("nan"), 1), (1, 2)):
        with pytest.raises(ValueError, match="gains"):
            O.objective(outs, rows, img_size=(96, 64), gains=bad)
    with pytest.raises(ValueError, match="grad_scale"):
        O.objective(outs, rows, img_size=(96, 64), grad_scale=0.0)
    with pytest.raises(ValueError, match="scale_from"):
        O.objective(outs, rows, img_size=(96, 64), scale_from=(ptl.tensor(np.ones(2, np.float32)), 0))


def test_o2m_weight_schedule_and_tensor_inputs():
    assert O.o2m_weight(0, 100) == pytest.approx(0.8)
    assert O.o2m_weight(49, 100) == pytest.approx(0.4535, abs=5e-5)
    assert O.o2m_weight(99, 100) == pytest.approx(0.1)
    assert O.o2m_weight(0, 1) == pytest.approx(0.8)
    assert O.num_anchors(640) == 8400 and O.num_anchors((320, 640)) == 4200
    rng = np.random.default_rng(4)
    rows = make_targets(rng, 2, 3, 5)
    outs = make_outputs(rng, rows, 2, 64, 64, 5, dt=np.float32)
    a = O.objective(outs, rows, img_size=64)
    t = O.objective([ptl.tensor(o) for o in outs], ptl.tensor(rows), img_size=64)
    assert isinstance(t["losses"], ptl.Tensor)
    np.testing.assert_array_equal(t["losses"].numpy(), a["losses"])
    for g1, g2 in zip(t["grads"], a["grads"]):
        np.testing.assert_array_equal(g1.numpy(), g2)
    items = O.loss_items(t["losses"])
    assert items["total"] == pytest.approx(float(a["losses"][0]))
    # caller-provided gradient buffers are overwritten
    grads = [np.full(o.shape, 7.0, np.float32) for o in outs]
    gt = [ptl.tensor(g) for g in grads]
    O.objective([ptl.tensor(o) for o in outs], rows, img_size=64, grads=gt)
    for g1, g2 in zip(gt, a["grads"]):
        np.testing.assert_array_equal(g1.numpy(), g2)


# ----------------------------------------------------------------------------- CUDA

def _cuda_case(counts, dtype="float32", seed=0, bsz=16, h=640, w=640, nc=80):
    rng = np.random.default_rng(seed)
    rows = make_targets(rng, bsz, counts, nc, min_side=2 / 640)
    outs = make_outputs(rng, rows, bsz, h, w, nc, dt=np.float32)
    dev = [ptl.tensor(o, dtype=dtype, device="cuda") for o in outs]
    # the CPU sees exactly the values the GPU sees (after rounding to the compute dtype)
    host = [d.to(device="cpu", dtype="float32").numpy() for d in dev]
    return rows, dev, host


def _cuda_vs_cpu(rows, dev, host, h=640, w=640, wgt=0.8):
    g = O.objective(dev, rows, img_size=(h, w), o2m_weight=wgt, return_assignment=True)
    c = O.objective(host, rows, img_size=(h, w), o2m_weight=wgt, return_assignment=True)
    for br in ("o2m", "o2o"):
        np.testing.assert_array_equal(g["assignment"][br][0].numpy(), c["assignment"][br][0], err_msg=br)
        # same float32 operations on both backends: the soft targets agree to the bit
        np.testing.assert_array_equal(g["assignment"][br][1].numpy(), c["assignment"][br][1], err_msg=br)
    np.testing.assert_allclose(g["losses"].numpy(), c["losses"], rtol=1e-5)
    return g, c


@pytest.mark.cuda
def test_cuda_matches_cpu_float32():
    counts = [0, 1, 20, 300] * 4
    rows, dev, host = _cuda_case(counts)
    g, c = _cuda_vs_cpu(rows, dev, host)
    assert (c["assignment"]["o2m"][0] >= 0).sum() > 1000
    for i in range(4):
        gg, cc = g["grads"][i].numpy(), c["grads"][i]
        np.testing.assert_allclose(gg, cc, rtol=1e-5, atol=1e-5 * np.abs(cc).max(), err_msg="grad %d" % i)
    # workspace growth and shrink: a smaller batch after a larger one, then the large one again
    rows2, dev2, host2 = _cuda_case([3, 0, 5, 1], bsz=4, seed=1)
    _cuda_vs_cpu(rows2, dev2, host2, wgt=0.3)
    g2 = O.objective(dev, rows, img_size=640, return_assignment=True)
    np.testing.assert_array_equal(g2["losses"].numpy(), g["losses"].numpy())  # deterministic
    for i in range(4):
        np.testing.assert_array_equal(g2["grads"][i].numpy(), g["grads"][i].numpy())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_half_precision_outputs(dtype):
    rows, dev, host = _cuda_case([0, 1, 20, 300], dtype=dtype, bsz=4, seed=2)
    g, c = _cuda_vs_cpu(rows, dev, host)
    for i in range(4):
        assert g["grads"][i].dtype == dtype
        want = ptl.tensor(c["grads"][i], dtype=dtype).to(dtype="float32").numpy()
        got = g["grads"][i].to(dtype="float32").numpy()
        # float32 gradients agree to ~1e-6; rounding them to 8/11 bits may differ by one unit
        ulp = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10
        np.testing.assert_allclose(got, want, rtol=ulp, atol=1e-6 * np.abs(want).max())


@pytest.mark.cuda
def test_cuda_gradient_scale_read_on_the_device():
    """float16 loss scaling: the scale read from a device tensor (scale_from) gives the same gradients as
    the host value, and scaled float16 gradients keep values that unscaled ones flush to zero."""
    rows, dev, host = _cuda_case([0, 2, 9, 40], dtype="float16", bsz=4, seed=3)
    sc = ptl.tensor(np.array([0.0, 4096.0, 0.0], np.float32), device="cuda")
    a = O.objective(dev, rows, img_size=640, scale_from=(sc, 1))
    b = O.objective(dev, rows, img_size=640, grad_scale=4096.0)
    c = O.objective(dev, rows, img_size=640)
    np.testing.assert_array_equal(a["losses"].numpy(), c["losses"].numpy())
    for x, y, z in zip(a["grads"], b["grads"], c["grads"]):
        np.testing.assert_array_equal(x.to(dtype="float32").numpy(), y.to(dtype="float32").numpy())
        xs = x.to(dtype="float32").numpy()
        zs = z.to(dtype="float32").numpy()
        assert np.count_nonzero(xs) >= np.count_nonzero(zs)
    with pytest.raises(IndexError, match="scale_from"):
        O.objective(dev, rows, img_size=640, scale_from=(sc, 3))


@pytest.mark.cuda
def test_cuda_frozen_assignment_and_non_square():
    rows, dev, host = _cuda_case([2, 7, 0], bsz=3, h=320, w=512, seed=3, nc=7)
    g, c = _cuda_vs_cpu(rows, dev, host, h=320, w=512)
    asg = {k: (v[0], v[1]) for k, v in g["assignment"].items()}
    f = O.objective(dev, rows, img_size=(320, 512), assignment=asg)
    np.testing.assert_allclose(f["losses"].numpy(), g["losses"].numpy(), rtol=1e-6)
    for i in range(4):
        np.testing.assert_array_equal(f["grads"][i].numpy(), g["grads"][i].numpy())


@pytest.mark.cuda
def test_cuda_bad_assignment_raises():
    """The device path checks a given assignment on the host before any kernel reads it."""
    rows, dev, host = _cuda_case([2, 1], bsz=2, h=64, w=64, nc=3, seed=4)
    g = O.objective(dev, rows, img_size=64, return_assignment=True)
    gt = g["assignment"]["o2o"][0].numpy()
    gt[1, 3] = 5
    bad = {"o2m": g["assignment"]["o2m"],
           "o2o": (ptl.tensor(gt, device="cuda"), g["assignment"]["o2o"][1])}
    with pytest.raises(ValueError, match=r"assign_gt\[1\]"):
        O.objective(dev, rows, img_size=64, assignment=bad)
