"""The real package as the oracle: ptl against ultralytics==8.4.190 (CPU) on the same inputs.

metrics (ap_per_class, DetMetrics, the validator's matching, ConfusionMatrix), post-processing (NMS of
the one-to-many head and the end-to-end top-k), the end-to-end objective (E2ELoss), the network (all
five scales, forward/backward, state_dict by name), MuSGD + EMA, the schedule of 8.4.190's own trainer
over 300+ iterations, and a short fine-tune of both from the same weights. docs/ultralytics_parity.md
lists the rules these checks cover. Marked ``ultralytics`` (skipped where the package is missing)."""
import os
import pathlib
import sys
import tempfile
import types
import warnings

import numpy as np
import pytest

import ptl
import ptl.objective  # noqa: F401  (the module; ptl also exports a function of that name)
from ptl import metrics, optim
from ptl.model import Detector

OBJ = sys.modules["ptl.objective"]

pytestmark = pytest.mark.ultralytics
os.environ.setdefault("YOLO_VERBOSE", "False")
F = np.float32


@pytest.fixture(scope="module")
def torch():
    import torch
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    return torch


@pytest.fixture(scope="module")
def ul(torch):
    import ultralytics
    assert ultralytics.__version__ == "8.4.190", ultralytics.__version__
    return ultralytics


@pytest.fixture(scope="module")
def coco_yaml(coco256):
    """coco256's data.yaml with an absolute root (Ultralytics resolves `path` against the working dir)."""
    import yaml
    cfg = yaml.safe_load(open(pathlib.Path(coco256) / "data.yaml"))
    cfg["path"] = str(coco256)
    path = pathlib.Path(tempfile.mkdtemp()) / "coco256.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def coco_labels(coco256, split="train2017"):
    """Per image: (class (m,), normalised xywh (m, 4)) of coco256's label files, sorted by name."""
    out = []
    for f in sorted((pathlib.Path(coco256) / "labels" / split).glob("*.txt")):
        t = np.loadtxt(f, ndmin=2).astype(F) if f.stat().st_size else np.zeros((0, 5), F)
        out.append((t[:, 0].astype(np.int64), t[:, 1:5]))
    return out


def detect_head(torch, nc):
    """An 8.4.190 Detect head used only for its decoding and end-to-end post-processing."""
    from ultralytics.nn.modules.head import Detect
    d = Detect(nc=nc, reg_max=1, end2end=True, ch=(8, 8, 8))
    d.stride = torch.tensor([8.0, 16.0, 32.0])
    return d


# ------------------------------------------------------------------------------------------ metrics


def test_ap_per_class_random(ul):
    """ap_per_class on random statistics (some classes without predictions or without ground truth):
    every output to 1e-9, tp/fp counts exactly."""
    from ultralytics.utils.metrics import ap_per_class
    rng = np.random.default_rng(0)
    for n, m, ncls in [(3000, 700, 20), (50, 80, 10), (1, 1, 1), (500, 40, 3), (0, 30, 4), (2000, 900, 6)]:
        tp = np.zeros((n, 10), bool)
        tp[np.arange(10)[None, :] < rng.integers(0, 11, n)[:, None]] = True
        conf, pc, gc = rng.random(n), rng.integers(0, ncls + 2, n), rng.integers(0, ncls, m)
        utp, ufp, p, r, f1, ap, cls, pcur, rcur, f1cur, px, prec = ap_per_class(tp, conf, pc.astype(float),
                                                                               gc.astype(float))
        got = metrics.ap_per_class(tp, conf, pc, gc)
        np.testing.assert_array_equal(got["classes"], cls)
        for k, want in (("ap", ap), ("p", p), ("r", r), ("f1", f1), ("p_curve", pcur), ("r_curve", rcur),
                        ("f1_curve", f1cur), ("px", px)):
            np.testing.assert_allclose(got[k], want, rtol=0, atol=1e-9, err_msg=k)
        if len(cls):
            np.testing.assert_allclose(got["pr_curve"], prec, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(got["tp"], utp)
        np.testing.assert_array_equal(got["fp"], ufp)


def synthetic_detections(rng, labels, imgsz):
    """Predictions for ground truth (input pixels): jittered boxes with 12% misses, 5% wrong classes,
    duplicates of 8% of them (lower score), and 0-3 false positives per image; distinct scores."""
    out = []
    for cls, xywh in labels:
        gt = metrics.target_boxes(xywh, imgsz)
        keep = rng.random(len(gt)) >= 0.12
        wh = np.repeat(gt[keep, 2:] - gt[keep, :2], 2, 0).reshape(-1, 4)
        pb = gt[keep] + rng.normal(0, 0.07, (keep.sum(), 4)).astype(F) * wh
        pc = cls[keep].copy()
        flip = rng.random(len(pc)) < 0.05
        pc[flip] = rng.integers(0, 80, flip.sum())
        sc = rng.uniform(0.3, 1.0, len(pc))
        dup = rng.random(len(pc)) < 0.08
        pb = np.concatenate([pb, pb[dup] + rng.normal(0, 1.0, (dup.sum(), 4))])
        pc, sc = np.concatenate([pc, pc[dup]]), np.concatenate([sc, sc[dup] * 0.9])
        nfp = rng.integers(0, 4)
        xy = rng.uniform(0, imgsz - 40, (nfp, 2))
        pb = np.concatenate([pb, np.concatenate([xy, xy + rng.uniform(5, 40, (nfp, 2))], 1)]).astype(F)
        pc, sc = np.concatenate([pc, rng.integers(0, 80, nfp)]), np.concatenate([sc, rng.uniform(0.001, 0.6, nfp)])
        sc = (sc + rng.uniform(0, 1e-4, len(sc))).astype(F)  # no equal scores: both sorts agree
        order = np.argsort(-sc, kind="stable")
        out.append((pb[order], sc[order], pc[order], gt, cls))
    return out


def test_detmetrics_coco256(ul, torch, coco256):
    """coco256's train and val labels as ground truth, synthetic predictions with duplicates and misses:
    8.4.190's validator matching (box_iou + match_predictions), DetMetrics and ConfusionMatrix against
    ptl's DetectionMetrics: matches identical, mAP50, mAP50-95, P, R and per-class AP to 1e-9,
    confusion counts equal."""
    from ultralytics.engine.validator import BaseValidator
    from ultralytics.utils.metrics import ConfusionMatrix, DetMetrics, box_iou
    names = {i: str(i) for i in range(80)}
    v = types.SimpleNamespace(iouv=torch.linspace(0.5, 0.95, 10))
    rng = np.random.default_rng(1)
    labels = coco_labels(coco256, "train2017") + coco_labels(coco256, "val2017")
    dets = synthetic_detections(rng, labels, 640)
    um, ucm = DetMetrics(names), ConfusionMatrix(names=names)
    dm = metrics.DetectionMetrics(names)
    for k, (pb, sc, pc, gb, gc) in enumerate(dets):
        if len(gb) and len(pb):
            tp = BaseValidator.match_predictions(v, torch.tensor(pc.astype(F)), torch.tensor(gc.astype(F)),
                                                 box_iou(torch.tensor(gb), torch.tensor(pb))).numpy()
        else:
            tp = np.zeros((len(pb), 10), bool)
        np.testing.assert_array_equal(metrics.match_predictions(pb, pc, gb, gc), tp)
        um.update_stats({"tp": tp, "conf": sc, "pred_cls": pc.astype(F), "target_cls": gc.astype(F),
                         "target_img": np.unique(gc.astype(F)), "im_name": "%d.jpg" % k})
        ucm.process_batch({"bboxes": torch.tensor(pb), "conf": torch.tensor(sc), "cls": torch.tensor(pc.astype(F))},
                          {"bboxes": torch.tensor(gb), "cls": torch.tensor(gc.astype(F))}, conf=0.001)
        dm.update(pb, sc, pc, gb, gc)
    um.process()
    got = dm.compute()
    res = um.results_dict
    for key, ours in (("metrics/precision(B)", "precision"), ("metrics/recall(B)", "recall"),
                      ("metrics/mAP50(B)", "mAP50"), ("metrics/mAP50-95(B)", "mAP50-95"), ("fitness", "fitness")):
        assert abs(got[ours] - res[key]) <= 1e-9, (key, got[ours], res[key])
    np.testing.assert_array_equal(got["classes"], um.ap_class_index)
    for i, c in enumerate(um.ap_class_index):
        p, r, ap50, ap = um.class_result(i)
        row = got["per_class"][names[c]]
        for a, b in ((row["precision"], p), (row["recall"], r), (row["ap50"], ap50), (row["ap50_95"], ap)):
            assert abs(a - b) <= 1e-9, names[c]
        assert row["n_gt"] == um.nt_per_class[c] and row["n_images"] == um.nt_per_image[c]
    np.testing.assert_array_equal(got["confusion_matrix"], ucm.matrix.astype(np.int64))
    assert 0.4 < got["mAP50-95"] < got["mAP50"] < 1


@pytest.mark.parametrize("end2end,predict", [(False, False), (True, False), (False, True)])
def test_postprocess(ul, torch, end2end, predict):
    """Head outputs (no equal logits) through 8.4.190's Detect._inference + non_max_suppression as its
    validator calls it (conf 0.001, iou 0.7, multi_label, max_det 300; end2end: Detect.postprocess) or
    as its predictor does (conf 0.25, best class per anchor):
    the same detections, boxes and classes exactly, scores within 2 ulps (torch.s vectorised exp is
    not correctly rounded; ptl rounds exp(-x) from double)."""
    from ultralytics.utils.nms import non_max_suppression
    import torchvision  # noqa: F401  (the validator imports it, so NMS runs torchvision's kernel)
    rng = np.random.default_rng(2)
    for (h, w, nc, bsz) in [(64, 96, 5, 2), (128, 128, 80, 2), (96, 64, 1, 3)]:
        A = sum((h // s) * (w // s) for s in (8, 16, 32))
        boxes = rng.normal(2, 1.5, (bsz, A, 4)).astype(F)
        scores = rng.normal(-4, 2.5, (bsz, A, nc)).astype(F)
        d = detect_head(torch, nc)
        d.end2end = end2end
        feats = [torch.zeros(bsz, 1, h // s, w // s) for s in (8, 16, 32)]
        y = d._inference({"boxes": torch.tensor(boxes).permute(0, 2, 1), "scores": torch.tensor(scores).permute(0, 2, 1),
                          "feats": feats})
        if end2end:
            y = d.postprocess(y.permute(0, 2, 1))
        conf = 0.25 if predict else 0.001
        # its wall-clock cut-off (2 s + 0.05 s per image) returns nothing on a busy host: lifted
        want = non_max_suppression(y, conf, 0.7, multi_label=not predict, max_det=300, nc=0, end2end=end2end,
                                   max_time_img=60.0)
        got = metrics.postprocess(boxes, scores, (h, w), conf=conf, end2end=end2end, multi_label=not predict)
        for g, u in zip(got, want):
            u = u.numpy()
            assert g.shape == u.shape
            np.testing.assert_array_equal(g[:, [0, 1, 2, 3, 5]], u[:, [0, 1, 2, 3, 5]])
            np.testing.assert_allclose(g[:, 4], u[:, 4], rtol=2.5e-7, atol=0)  # 2 float32 ulps


# ---------------------------------------------------------------------------------------- objective


def head_outputs_for(rng, rows, bsz, h, w, nc):
    """Outputs that look like a network's near its targets: anchors around each object regress its
    edges (+-30%) and score its class higher, elsewhere noise."""
    pts, st = [], []
    for s in (8, 16, 32):
        ys, xs = np.meshgrid(np.arange(h // s) + 0.5, np.arange(w // s) + 0.5, indexing="ij")
        pts.append(np.stack([xs.ravel(), ys.ravel()], 1))
        st.append(np.full(ys.size, s))
    anc, st = np.concatenate(pts).astype(F), np.concatenate(st).astype(F)
    A = len(anc)
    out = []
    for _ in range(2):
        boxes = rng.normal(2, 0.7, (bsz, A, 4)).astype(F)
        scores = rng.normal(-6, 1.5, (bsz, A, nc)).astype(F)
        for r in rows:
            b, c, cx, cy, bw, bh = int(r[0]), int(r[1]), r[2] * w, r[3] * h, r[4] * w, r[5] * h
            px, py = anc[:, 0] * st, anc[:, 1] * st
            m = (abs(px - cx) < bw / 2 + 8) & (abs(py - cy) < bh / 2 + 8)
            dist = np.stack([px - (cx - bw / 2), py - (cy - bh / 2), (cx + bw / 2) - px, (cy + bh / 2) - py], 1) / st[:, None]
            boxes[b, m] = (dist[m] * rng.uniform(0.7, 1.3, (m.sum(), 4))).astype(F)
            scores[b, m, c] = rng.normal(-1, 1.5, m.sum())
        out += [boxes, scores]
    return out


def test_objective_e2e_loss(ul, torch, coco256):
    """8.4.190's E2ELoss against ptl.objective on identical outputs and coco256 targets (every box size,
    small ones included): loss items to 1e-6 relative, gradients w.r.t. the outputs to 1e-5 (of the
    largest), identical assignments (foreground, assigned object) and target scores."""
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.loss import E2ELoss
    model = DetectionModel("yolo26n.yaml", nc=80, verbose=False)
    model.args = get_cfg()
    labels = coco_labels(coco256, "train2017")
    rng = np.random.default_rng(3)
    small = 0
    for start, bsz, (h, w), wgt in ((0, 8, (320, 320), 0.8), (8, 8, (256, 384), 0.45), (16, 4, (640, 640), 0.1)):
        rows = np.concatenate([np.concatenate([np.full((len(c), 1), i, F), c[:, None].astype(F), b], 1)
                               for i, (c, b) in enumerate(labels[start:start + bsz])])
        small += int(((rows[:, 4] * w < 16) | (rows[:, 5] * h < 16)).sum())
        outs = head_outputs_for(rng, rows, bsz, h, w, 80)
        crit = E2ELoss(model)
        crit.o2m, crit.o2o = wgt, 1 - wgt
        captured = {}
        for name, branch in (("o2m", crit.one2many), ("o2o", crit.one2one)):
            fwd = branch.assigner.forward

            def capture(*a, _f=fwd, _n=name, **k):
                captured[_n] = _f(*a, **k)
                return captured[_n]
            branch.assigner.forward = capture
        leaves = [torch.tensor(o, requires_grad=True) for o in outs]
        feats = [torch.zeros(bsz, 1, h // s, w // s) for s in (8, 16, 32)]
        preds = {br: {"boxes": leaves[2 * k].permute(0, 2, 1), "scores": leaves[2 * k + 1].permute(0, 2, 1),
                      "feats": feats} for k, br in enumerate(("one2many", "one2one"))}
        batch = {"batch_idx": torch.tensor(rows[:, 0]), "cls": torch.tensor(rows[:, 1:2]),
                 "bboxes": torch.tensor(rows[:, 2:6])}
        loss, items = crit(preds, batch)
        loss.sum().backward()
        res = OBJ.objective(outs, rows, img_size=(h, w), num_classes=80, o2m_weight=wgt,
                                      return_assignment=True)
        got = res["losses"]
        np.testing.assert_allclose(got[0], float(loss.sum().detach()), rtol=1e-6)
        np.testing.assert_allclose(got[7:10], [float(v) for v in items.values()], rtol=1e-6)
        for i in range(4):
            ref = leaves[i].grad.numpy()
            np.testing.assert_allclose(res["grads"][i], ref, rtol=0, atol=1e-5 * np.abs(ref).max(), err_msg=str(i))
        for br in ("o2m", "o2o"):
            _, _, tscore, fg, gidx = captured[br]
            gt, sc = res["assignment"][br]
            np.testing.assert_array_equal(gt, np.where(fg.numpy(), gidx.numpy(), -1), err_msg=br)
            np.testing.assert_allclose(sc, tscore.numpy().sum(-1), rtol=1e-5, atol=1e-7, err_msg=br)
    assert small > 20  # objects the 16-pixel small-box rule treats differently from the older 8-pixel one


# ------------------------------------------------------------------------------------------ network


@pytest.mark.parametrize("scale", ["n", "s", "m", "l", "x"])
def test_network_structure(ul, torch, scale):
    """Every scale: ptl's state_dict names, order and shapes are 8.4.190's DetectionModel keys (its
    num_batches_tracked counters aside), and 8.4.190's state_dict loads into ptl by name."""
    from ultralytics.nn.tasks import DetectionModel
    ref = DetectionModel("yolo26%s.yaml" % scale, nc=80, verbose=False)
    rsd = {k: v for k, v in ref.state_dict().items() if not k.endswith("num_batches_tracked")}
    ours = Detector(scale=scale, num_classes=80)
    sd = ours.state_dict()
    assert list(sd) == list(rsd)
    for k, v in rsd.items():
        assert sd[k].shape == tuple(v.shape), k
    assert ours.num_parameters() == sum(p.numel() for p in ref.parameters())
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    for k, v in ours.state_dict().items():
        np.testing.assert_array_equal(v, rsd[k].numpy(), err_msg=k)


def _randomised(torch, ref, seed):
    """8.4.190's model with random BN affine parameters and statistics (every path carries a signal)."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for k, v in ref.state_dict().items():
            if k.endswith("bn.weight") or k.endswith("running_var"):
                v.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, tuple(v.shape))))
            elif k.endswith("bn.bias") or k.endswith("running_mean"):
                v.copy_(torch.from_numpy(rng.uniform(-0.3, 0.3, tuple(v.shape))))
    return ref


@pytest.mark.parametrize("hw,training", [((64, 96), True), ((64, 96), False), ((128, 128), True), ((128, 128), False)])
def test_network_forward_backward(ul, torch, hw, training, monkeypatch):
    """yolo26n with 8.4.190's weights (loaded by name): head outputs of both heads, BatchNorm running
    statistics after a training forward, and every parameter gradient of a random linear functional of
    the outputs (in eval mode of the one-to-many outputs only: 8.4.190 lets the one-to-one head's
    gradient reach the backbone outside training, ptl never does). In float64 all against 8.4.190's model
    (1e-9, norm-relative). In float32 the outputs and statistics against 8.4.190's float32 model (1e-5),
    and the gradients against the float64 gradients of the same weights (1e-4): 8.4.190's own float32
    gradients are 4e-5 to 1.3e-4 away from those, depending on the weights, so a comparison of the two
    float32 gradients measures mostly its rounding. The weights are 8.4.190's initialisation under a fixed
    seed. On the reference CPU kernels, whose arithmetic the spec defines: the fast backend's oneDNN
    convolutions round 3-4x more per conv and are held to the reference by tests/test_cpu_fast.py and
    tests/test_network.py."""
    from ultralytics.nn.tasks import DetectionModel
    monkeypatch.setenv("PTL_CPU_KERNELS", "reference")
    h, w = hw
    x = np.random.default_rng(5).random((2, 3, h, w)).astype(F)
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in
             _randomised(torch, DetectionModel("yolo26n.yaml", nc=80, verbose=False), 7).state_dict().items()}
    truth = None  # the float64 gradients, on which both implementations agree
    for dtype, tol_out, tol_grad in (("float64", 1e-9, 1e-9), ("float32", 1e-5, 1e-4)):
        ref = DetectionModel("yolo26n.yaml", nc=80, verbose=False)
        ref.load_state_dict(state)
        ours = Detector("yolo26n", num_classes=80, dtype=dtype)
        ours.load_state_dict({k: v.numpy() for k, v in state.items()})
        if dtype == "float64":
            ref = ref.double()
        ref.train(training)
        ours.train(training)
        xt = torch.from_numpy(x.astype(dtype))
        r = ref(xt)
        r = r if training else r[1]
        ref_out = {br: (r[br]["boxes"].transpose(1, 2), r[br]["scores"].transpose(1, 2)) for br in ("one2many", "one2one")}
        out = ours.forward(x.astype(dtype))

        def rel(a, b):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
        err = max(rel(a, b.detach().numpy()) for br in out for a, b in zip(out[br], ref_out[br]))
        print("network %s %s train=%s: outputs %.1e" % (dtype, hw, training, err), end="")
        assert err <= (tol_out if training or dtype == "float64" else tol_out / 10), (dtype, err)
        rsd = ref.state_dict()
        if training:
            stat = max(rel(v, rsd[k].numpy()) for k, v in ours.state_dict().items() if "running" in k)
            assert stat <= tol_out, (dtype, stat)
        rng = np.random.default_rng(6)
        R = {br: tuple(rng.standard_normal(a.shape) for a in out[br]) for br in out}
        if not training:  # 8.4.190 detaches the one-to-one head's features only in training mode
            R["one2one"] = tuple(np.zeros_like(q) for q in R["one2one"])
        loss = sum((t * torch.from_numpy(q.astype(dtype))).sum() for br in R for t, q in zip(ref_out[br], R[br]))
        loss.backward()
        ours.zero_grad()
        ours.backward({br: tuple(q.astype(dtype) for q in R[br]) for br in R})
        named = dict(ref.named_parameters())
        g = np.asarray(ours.flat_gradients, np.float64)
        t = np.concatenate([named[n].grad.numpy().ravel() for n, _, _ in ours.parameter_table()]).astype(np.float64)
        if truth is None:
            truth = t
        gerr = rel(g, truth)
        print(", gradients %.1e (8.4.190's: %.1e)" % (gerr, rel(t, truth)))
        assert gerr <= tol_grad, (dtype, gerr)


# ---------------------------------------------------------------------------------------- optimizer


def _views(flat, table):
    return {n: flat[o:o + int(np.prod(s))].reshape(s) for n, o, s in table}


def _tables(model):
    table, off = [], 0
    for name, p in model.named_parameters():
        table.append((name, off, tuple(p.shape)))
        off += p.numel()
    bn, boff = [], 0
    for name, b in model.named_buffers():
        if b.dtype.is_floating_point:
            bn.append((name, boff, tuple(b.shape)))
            boff += b.numel()
    return table, off, bn, boff


def _zeropower_float64(G, eps=1e-7):
    """8.4.190's zeropower_via_newtonschulz5 statement for statement, without the cast to bfloat16."""
    X = G.reshape(-1, G.size(-2), G.size(-1)).double()
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    if G.size(-2) > G.size(-1):
        X = X.transpose(-2, -1)
    a, b, c = 3.4445, -4.7750, 2.0315
    import torch
    for _ in range(5):
        A = X @ X.transpose(-2, -1)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    if G.size(-2) > G.size(-1):
        X = X.transpose(-2, -1)
    return X.reshape(G.shape)


STEPPED = ("model.0.", "model.2.", "model.4.", "model.23.")  # a yolo26n subset, both heads whole


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_musgd_ema_steps(ul, torch, monkeypatch, dtype):
    """10 steps of clip + MuSGD + EMA on identical gradients: 8.4.190's build_optimizer groups, MuSGD and
    ModelEMA on yolo26n against ptl's FlatOptimizer, lr and momentum changing per step, one step
    clipped in float64. Gradients go to layers 0, 2, 4 and the whole head (both x3 class branches;
    8.4.190 skips parameters without a gradient), to keep the CPU time short.

    float64: 8.4.190's MuSGD (its bucketing, padding and orientation, momentum, Nesterov, weight decay,
    x3 head lr) with its Newton-Schulz made float64 (the same statements): weights, EMA and optimizer
    state to 1e-12. float32 (no clipping: torch's float32 norm reduction and ours differ in the last
    bit, which the clip coefficient passes to every gradient): the real bfloat16 Newton-Schulz. Its
    products accumulate in float32 in an
    order oneDNN chooses, and a last-bit difference there flips a bfloat16 rounding that the quintic
    amplifies (one ulp in one element moves the output by ~2%), so the orthogonalised Muon updates are
    not reproducible bit for bit by another summation order; everything that does not pass through
    Newton-Schulz -- every non-Muon weight, its EMA and momentum, and the Muon momentum buffers -- is
    bit-identical, and the Muon weights stay within two bf16 ulps of the update per step (measured:
    7e-5 after 10 steps, bound 3.6e-4)."""
    import ultralytics.optim.muon as um
    from ultralytics.cfg import get_cfg
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import ModelEMA
    if dtype == "float64":
        monkeypatch.setattr(um, "zeropower_via_newtonschulz5", _zeropower_float64)
    torch.manual_seed(0)
    model = DetectionModel("yolo26n.yaml", nc=80, verbose=False)
    if dtype == "float64":
        model = model.double()
    wd = optim.scaled_weight_decay(5e-4, 16)
    ref = BaseTrainer.build_optimizer(types.SimpleNamespace(args=get_cfg(), data={"nc": 80}), model, name="MuSGD",
                                      lr=0.01, momentum=0.937, decay=wd)
    ema = ModelEMA(model)
    full, _, full_bn, _ = _tables(model)
    stepped = lambda k: k.startswith(STEPPED)  # noqa: E731
    table, n = [], 0
    for k, _, shape in full:
        if stepped(k):
            table.append((k, n, shape))
            n += int(np.prod(shape))
    bn_table, nb = [], 0
    for k, _, shape in full_bn:
        if stepped(k):
            bn_table.append((k, nb, shape))
            nb += int(np.prod(shape))
    named, bufs = dict(model.named_parameters()), dict(model.named_buffers())
    flat = torch.cat([named[k].detach().reshape(-1) for k, _, _ in table]).numpy().copy()
    bflat = torch.cat([bufs[k].detach().reshape(-1) for k, _, _ in bn_table]).numpy().copy()
    params, grads, bn = ptl.tensor(flat), ptl.zeros((n,), dtype=dtype), ptl.tensor(bflat)
    ours = optim.FlatOptimizer(params, grads, table, "MuSGD", lr0=0.01, momentum=0.937, weight_decay=wd,
                               max_norm=10.0, bn_buffers=bn, bn_table=bn_table, ns_bf16=dtype == "float32")
    id2name = {id(p): k for k, p in named.items()}
    assert len(ref.param_groups) == len(ours.param_groups)
    for rg, og in zip(ref.param_groups, ours.param_groups):
        assert rg["param_group"] == og["param_group"] and rg["lr"] == og["lr"], rg["param_group"]
        assert rg["weight_decay"] == og["weight_decay"]
        want = sorted(k for k in (id2name[id(p)] for p in rg["params"]) if stepped(k))
        assert want == sorted(table[i][0] for i in og["params"])
        rg["initial_lr"] = rg["lr"]
    muon = {table[i][0] for g in ours.param_groups if g["kind"] == "muon" for i in g["params"]}
    assert len(muon) == 57
    gen = torch.Generator().manual_seed(0)
    tdt = torch.float64 if dtype == "float64" else torch.float32
    for t in range(10):
        for rg, og in zip(ref.param_groups, ours.param_groups):
            rg["lr"] = og["lr"] = rg["initial_lr"] * (1 - 0.05 * t)
            rg["momentum"] = og["momentum"] = 0.8 + 0.0137 * t
        clip = t == 4 and dtype == "float64"
        gs = {k: torch.randn(named[k].shape, generator=gen, dtype=tdt) * (0.5 if clip else 3e-3)
              for k, _, _ in table}
        for k, p in named.items():
            p.grad = gs[k].clone() if k in gs else None
        optim._copy_into(grads, torch.cat([gs[k].reshape(-1) for k, _, _ in table]).numpy())
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0))
        ref.step()
        ref.zero_grad()
        ema.update(model)
        ours.step()
        assert ours.last_grad_norm == pytest.approx(norm, rel=1e-6)
        assert (norm > 10) == clip
    got, got_ema = _views(params.numpy(), table), _views(ours.ema.params.numpy(), table)
    st = ours.state_dict()
    esd = ema.ema.state_dict()
    worst_muon = 0.0
    for k, _, _ in table:
        p = named[k]
        want, want_e = p.detach().numpy(), esd[k].numpy()
        state = ref.state[p]
        if dtype == "float64":
            sgd_buf = state["momentum_buffer_SGD" if k in muon else "momentum_buffer"].numpy()
            for a, b in ((got[k], want), (got_ema[k], want_e), (st["v." + k], sgd_buf)):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-12, err_msg=k)
        elif k in muon:
            np.testing.assert_array_equal(st["m." + k], state["momentum_buffer"].numpy(), err_msg=k)
            worst_muon = max(worst_muon, float(np.abs(got[k] - want).max()))
        else:
            np.testing.assert_array_equal(got[k], want, err_msg=k)
            np.testing.assert_array_equal(got_ema[k], want_e, err_msg=k)
            np.testing.assert_array_equal(st["v." + k], state["momentum_buffer"].numpy(), err_msg=k)
    if dtype == "float32":
        # each step moves a Muon weight by lr * 0.2 (x3 for the class branches) times a direction whose
        # entries are below 1: two bf16 ulps (2^-7) of that per step bound a rounding-level difference
        bound = sum(0.6 * 0.01 * (1 - 0.05 * t) * 2.0 ** -7 for t in range(10))
        print("MuSGD float32: largest Muon-weight difference after 10 steps %.2e (bound %.2e)" % (worst_muon, bound))
        assert worst_muon < bound
    got_bn = _views(ours.ema.bn.numpy(), bn_table)
    for k, _, _ in bn_table:
        np.testing.assert_array_equal(got_bn[k], esd[k].numpy(), err_msg=k)


class _Stop(Exception):
    pass


def _trainer_schedule(ul, torch, coco_yaml, optimizer, epochs, batch):
    """8.4.190's own DetectionTrainer._do_train for epochs x ceil(128 / batch) iterations on coco256's
    train split, with the model's loss replaced by a cheap one (the schedule does not depend on it):
    per batch, every group's lr, momentum (beta1 for AdamW) and weight decay, the accumulate value and
    whether an optimizer step happened."""
    from ultralytics.models.yolo.detect import DetectionTrainer
    ov = dict(model="yolo26n.yaml", data=coco_yaml, epochs=epochs, batch=batch, imgsz=32, device="cpu", workers=0,
              plots=False, val=False, amp=False, save=False, project=tempfile.mkdtemp(), name="s", exist_ok=True,
              optimizer=optimizer, mosaic=0.0, close_mosaic=0, verbose=False)
    trainer = DetectionTrainer(overrides=ov)
    log, steps = [], []

    class Fake:
        num_workers = 0

        def __init__(self, n, nb):
            self.dataset, self.nb = list(range(n)), nb

        def __len__(self):
            return self.nb

        def __iter__(self):
            for _ in range(self.nb):
                yield {"img": torch.zeros(batch, 3, 32, 32, dtype=torch.uint8)}

    def setup(t):
        t.train_loader = Fake(len(t.train_loader.dataset), len(t.train_loader))
        m = t.model
        weights = {k: torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) for k, p in m.named_parameters()}
        names = ("box_loss", "cls_loss", "l1_loss")

        def loss(batch, preds=None):
            total = sum((p * weights[k]).sum() for k, p in m.named_parameters()) * 1e-3
            return total[None], dict.fromkeys(names, total.detach())
        m.loss = loss
        m.criterion = types.SimpleNamespace()  # no E2ELoss: nothing to update per epoch
        step = t.optimizer_step

        def counted():
            steps.append(len(log))
            step()
        t.optimizer_step = counted

    def batch_end(t):
        gs = t.optimizer.param_groups
        log.append(([g["lr"] for g in gs], [g["momentum"] if "momentum" in g else g["betas"][0] for g in gs],
                    [g["weight_decay"] for g in gs], t.accumulate))

    def epoch_end(t):
        if t.epoch == epochs - 1:
            raise _Stop
    trainer.add_callback("on_pretrain_routine_end", setup)
    trainer.add_callback("on_train_batch_end", batch_end)
    trainer.add_callback("on_train_epoch_end", epoch_end)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.train()
        except _Stop:
            pass
    groups = [g["param_group"] for g in trainer.optimizer.param_groups]
    return log, steps, groups, trainer


@pytest.mark.parametrize("optimizer,epochs,batch", [("MuSGD", 10, 4), ("auto", 38, 16), ("SGD", 1, 2)])
def test_schedule_equals_trainer(ul, torch, coco_yaml, optimizer, epochs, batch):
    """A 300+ iteration schedule from 8.4.190's trainer (MuSGD: 10 epochs x 32 batches, warm-up 96
    batches, accumulate 16; auto -> AdamW: 38 x 8, warm-up 24, accumulate 4; SGD: one epoch of 64,
    so no warm-up and accumulate capped at 32): ptl's Schedule gives every group's lr, momentum and weight
    decay and the optimizer steps at the same batches."""
    log, steps, groups, trainer = _trainer_schedule(ul, torch, coco_yaml, optimizer, epochs, batch)
    nb = -(-128 // batch)
    assert len(log) == epochs * nb and len(log) >= 64
    model = trainer.model
    table, n, _, _ = _tables(model)
    cfg = optim.OptimConfig(optimizer=optimizer, epochs=epochs, batch=batch, nc=80, n_train_images=128)
    params, grads = ptl.zeros((n,), dtype="float32"), ptl.zeros((n,), dtype="float32")
    opt, sch = optim.build_optimizer(params, grads, table, cfg, nb)
    assert [g["param_group"] for g in opt.param_groups] == groups
    ours_steps = []
    for epoch in range(epochs):
        for i in range(nb):
            ni = sch.ni(epoch, i)
            sch.apply(opt, epoch, i)
            lrs, moms, wds = opt.group_values()
            want_lr, want_mom, want_wd, want_acc = log[ni]
            np.testing.assert_allclose(lrs, want_lr, rtol=1e-14, atol=0, err_msg="lr at %d" % ni)
            np.testing.assert_allclose(moms, want_mom, rtol=1e-14, atol=0, err_msg="momentum at %d" % ni)
            np.testing.assert_allclose(wds, want_wd, rtol=1e-14, atol=0, err_msg="weight decay at %d" % ni)
            assert sch.accumulate(ni) == want_acc, ni
            if sch.due(ni):
                ours_steps.append(ni)
                sch.stepped(ni)
    assert ours_steps == steps


# ---------------------------------------------------------------------------------------- fine-tune


def test_finetune_loss_curves(ul, torch, coco_yaml):
    """3 epochs of 4 batches of 8 coco256 images at 128 px, no augmentation, optimizer=auto (AdamW for
    this size), from the same weights: ptl's Trainer.fit and 8.4.190's DetectionTrainer on the same
    batches (ptl's loader's, in its order, fed to Ultralytics' trainer): per-epoch mean loss items
    within 1% (measured: 5e-6; about 10 s on an idle 2-core machine)."""
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.nn.tasks import DetectionModel
    E, B, NB, IMG = 3, 8, 4, 128
    noaug = dict(mosaic=0.0, translate=0.0, scale=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, fliplr=0.0, close_mosaic=0)

    def data():
        return ptl.DetectionData(coco_yaml, imgsz=IMG, batch_size=B, workers=2, seed=0, epochs=E, verbose=False,
                                 **noaug)
    det = Detector("yolo26n", num_classes=80, seed=0)
    init = {k: np.array(v) for k, v in det.state_dict().items()}
    rec, batches = data(), []
    for e in range(E):
        rec.set_epoch(e)
        batches.append([(b.images.copy(), b.targets.copy()) for b, _ in zip(rec.train_loader(), range(NB))])
    tr = ptl.Trainer(max_epochs=E, accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False,
                     logger=False, limit_val_batches=0, limit_train_batches=NB, default_root_dir=tempfile.mkdtemp())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.fit(det, data())
    ours = [[r["train/box_loss"], r["train/cls_loss"], r["train/l1_loss"]] for r in tr._epoch_rows]

    class Feed:
        num_workers = 0
        dataset = list(range(128))

        def __init__(self):
            self.epoch = 0

        def __len__(self):
            return NB

        def __iter__(self):
            for im, tg in batches[self.epoch]:
                yield {"img": torch.from_numpy(np.ascontiguousarray(im.transpose(0, 3, 1, 2))),
                       "batch_idx": torch.from_numpy(tg[:, 0]), "cls": torch.from_numpy(tg[:, 1:2]),
                       "bboxes": torch.from_numpy(tg[:, 2:6]), "im_file": [""] * len(im)}
            self.epoch += 1
    ov = dict(model="yolo26n.yaml", data=coco_yaml, epochs=E, batch=B, imgsz=IMG, device="cpu", workers=0, plots=False,
              val=False, amp=False, save=False, project=tempfile.mkdtemp(), name="f", exist_ok=True, seed=0,
              deterministic=True, verbose=False, **noaug)
    trainer = DetectionTrainer(overrides=ov)
    m = DetectionModel("yolo26n.yaml", nc=80, verbose=False)
    m.load_state_dict({k: torch.from_numpy(init[k]) if k in init else v for k, v in m.state_dict().items()})
    trainer.model = m
    rows = []

    def swap(t):
        t.train_loader = Feed()

    def epoch_end(t):
        rows.append([float(v) for v in t.tloss.values()])
        if t.epoch == E - 1:
            raise _Stop
    trainer.add_callback("on_pretrain_routine_end", swap)
    trainer.add_callback("on_train_epoch_end", epoch_end)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.train()
        except _Stop:
            pass
    print("fine-tune per-epoch (box, cls, l1): ptl %s | 8.4.190 %s" % (np.round(ours, 5).tolist(), np.round(rows, 5).tolist()))
    assert len(rows) == len(ours) == E
    np.testing.assert_allclose(np.asarray(ours, np.float64), np.asarray(rows), rtol=0.01)
