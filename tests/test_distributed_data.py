"""Data parallelism without the fused step: the loaders' shards (their union is the single-process epoch,
each image once, with the same bytes), sharded validation gathered into the single-process metrics, and one
step's averaged gradient over 2 real processes equal, bit for bit, to the average of the two shards'
gradients computed in one process."""
import numpy as np
import pytest

import ptl
from ptl.engine import _update_metrics
from ptl.objective import objective

from dist_ranks import finish, start_ranks


def make_data(coco256, rank=0, world=1, **kw):
    kw.setdefault("imgsz", 64)
    kw.setdefault("workers", 0)
    d = ptl.DetectionData(coco256 / "data.yaml", verbose=False, **kw)
    d.shard(rank, world)
    return d


@pytest.mark.parametrize("world,batch", [(2, 4), (3, 5), (3, 7)])
def test_training_shards_are_the_single_process_epoch(coco256, world, batch):
    """Step k of every rank together is batch k of one process whose batch is the global one, in rank order;
    over an epoch each image comes once. (3, 7): 128 = 6 * 21 + 2, so in the last step rank 2 gets nothing."""
    single = make_data(coco256, batch_size=batch * world).train_loader()
    ranks = [make_data(coco256, r, world, batch_size=batch).train_loader() for r in range(world)]
    n = single.num_images
    for epoch in (0, 3):
        ref = single.indices(epoch)
        assert all(len(L) == len(ref) == L.num_global_batches for L in ranks)
        for k, want in enumerate(ref):
            got = np.concatenate([L.indices(epoch, k) for L in ranks])
            assert got.tolist() == want.tolist(), (epoch, k)
        union = np.concatenate([np.concatenate(L.indices(epoch)) for L in ranks])
        assert len(union) == n and len(np.unique(union)) == n
    sizes = [int(L.batch_slices[-1, 2]) for L in ranks]
    assert sum(sizes) == n - (len(ref) - 1) * batch * world and max(sizes) - min(sizes) <= 1
    if (world, batch) == (3, 7):
        assert sizes == [1, 1, 0]
    assert ranks[0].indices(0, 0).tolist() != ranks[0].indices(1, 0).tolist()  # shuffled per epoch


def test_rect_shards_share_each_global_batch_shape(coco256):
    """rect: the aspect-ratio order and the letterbox shape of each global batch are the single-process ones."""
    single = make_data(coco256, batch_size=6, rect=True, imgsz=320).train_loader()
    ranks = [make_data(coco256, r, 2, batch_size=3, rect=True, imgsz=320).train_loader() for r in range(2)]
    assert len(set(map(tuple, single.batch_shapes.tolist()))) > 1
    for L in ranks:
        assert L.batch_shapes.tolist() == single.batch_shapes.tolist()
    for k in range(len(single)):
        got = np.concatenate([L.indices(0, k) for L in ranks])
        assert got.tolist() == single.indices(0, k).tolist()


def test_shards_build_the_same_samples(coco256):
    """Augmentation is a function of (seed, epoch, index): a rank's images are the single-process ones."""
    single = make_data(coco256, batch_size=6, workers=2)
    single.set_epoch(1)
    ref = {}
    for b in single.train_loader():
        for k, idx in enumerate(b.indices):
            ref[int(idx)] = b.images[k].tobytes()
    seen = 0
    for r in range(2):
        d = make_data(coco256, r, 2, batch_size=3, workers=2)
        d.set_epoch(1)
        for b in d.train_loader():
            for k, idx in enumerate(b.indices):
                assert b.images[k].tobytes() == ref[int(idx)]
                seen += 1
    assert seen == len(ref) == single.train_loader().num_images


@pytest.mark.parametrize("workers", [0, 2])
def test_an_empty_slice_is_an_empty_batch(coco256, workers):
    d = make_data(coco256, 2, 3, batch_size=7, workers=workers)
    seen = [(b.images.shape, b.targets.shape, b.batch) for b in d.train_loader()]
    assert [s[0][0] for s in seen] == [7] * 6 + [0]
    assert seen[-1] == ((0, 64, 64, 3), (0, 6), 6)


@pytest.mark.parametrize("world", [2, 3])
def test_validation_deals_whole_single_process_batches(coco256, world):
    def digest(b):
        return b.batch, b.indices.tolist(), b.images.tobytes(), b.meta.tobytes(), b.targets.tobytes()
    single = [digest(b) for b in make_data(coco256, val_batch_size=16).val_loader()]
    for r in range(world):
        mine = [digest(b) for b in make_data(coco256, r, world, val_batch_size=16).val_loader()]
        assert [m[0] for m in mine] == list(range(r, len(single), world))
        assert mine == [single[m[0]] for m in mine]


# ---- validation statistics gathered over 3 ranks -----------------------------------------------------

def fake_detections(batch, h, w):
    """Detections drawn from each image's ground truth (jittered, some with the wrong class) plus false
    positives, with coarse scores (ties make the accumulation order matter), seeded by the dataset index."""
    out = []
    t = np.asarray(batch.targets).reshape(-1, 6)
    for k, idx in enumerate(batch.indices):
        rng = np.random.default_rng(int(idx))
        rows = t[t[:, 0] == k]
        gt = np.stack([(rows[:, 2] - rows[:, 4] / 2) * w, (rows[:, 3] - rows[:, 5] / 2) * h,
                       (rows[:, 2] + rows[:, 4] / 2) * w, (rows[:, 3] + rows[:, 5] / 2) * h], 1)
        size = np.maximum(gt[:, 2:] - gt[:, :2], 1)
        boxes = gt + rng.normal(0, 0.15, gt.shape) * np.concatenate([size, size], 1)
        cls = np.where(rng.random(len(rows)) < 0.8, rows[:, 1], rng.integers(0, 80, len(rows)))
        fp = rng.uniform(0, [w, h, w, h], (3, 4))
        fp[:, 2:] = np.maximum(fp[:, 2:], fp[:, :2] + 2)
        boxes = np.concatenate([boxes, fp])
        cls = np.concatenate([cls, rng.integers(0, 80, 3)])
        score = np.round(rng.uniform(0.05, 1.0, len(boxes)) * 5) / 5
        order = np.argsort(-score, kind="stable")
        out.append(np.concatenate([boxes, score[:, None], cls[:, None]], 1)[order].astype(np.float32))
    return out


def val_state(loader, names, model=None, limit=2):
    """The metric accumulation, one key per image, and the first `limit` global batches' loss rows."""
    met, keys, loss_keys, loss_rows = ptl.metrics.DetectionMetrics(names), [], [], []
    assert met.confusion is not None
    for b in loader:
        h, w = b.images.shape[1:3]
        _update_metrics(met, fake_detections(b, h, w), b, h, w)
        keys += [b.batch * 16 + k for k in range(len(b))]
        if model is not None and b.batch < limit:
            out = model.forward(b.images)
            res = objective((*out["one2many"], *out["one2one"]), b.targets, img_size=(h, w),
                            num_classes=model.num_classes, gains=model.loss_gains)
            loss_keys.append(b.batch)
            loss_rows.append(np.asarray(res["losses"]))
    return met, np.asarray(keys), np.asarray(loss_keys), np.asarray(loss_rows, np.float32).reshape(-1, 10)


VALIDATE = """
import ptl
sys.path.insert(0, os.path.join({repo!r}, "tests"))
from test_distributed_data import make_data, val_state
import pathlib
ctx = D.setup("cpu", devices="auto")
data = make_data(pathlib.Path({coco!r}), rank, world, val_batch_size=16)
model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0).eval()
met, keys, loss_keys, loss_rows = val_state(data.val_loader(), data.names, model)
merged = D.gather_metrics(ctx.group, met, keys).compute()
lk, lr = D.gather_rows(ctx.group, loss_keys, loss_rows)
ctx.close()
save(ap=merged["ap"], p=merged["p"], r=merged["r"], scalars=[merged[k] for k in ("precision", "recall", "mAP50",
     "mAP50-95", "fitness")], n_images=merged["n_images"], confusion=merged["confusion_matrix"], loss_keys=lk,
     loss_rows=lr, images=len(keys))
"""


def test_sharded_validation_equals_one_process(tmp_path, coco256):
    from dist_ranks import REPO
    world = 3
    body = VALIDATE.format(repo=REPO, coco=str(coco256))
    procs = start_ranks(tmp_path, body, world, timeout=60)
    data = make_data(coco256, val_batch_size=16)
    model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0).eval()
    met, keys, loss_keys, loss_rows = val_state(data.val_loader(), data.names, model)
    ref = met.compute()
    res = finish(procs, limit=240)
    assert all(rc == 0 for rc, _, _ in res.values()), res
    assert ref["mAP50"] > 0.1 and ref["mAP50-95"] > 0.01  # the statistics are not trivial
    # gathered in rank order without the keys, the tied scores would be accumulated in another order
    naive = ptl.metrics.DetectionMetrics(data.names)
    for r in range(world):
        m, _, _, _ = val_state(make_data(coco256, r, world, val_batch_size=16).val_loader(), data.names)
        for name in ("_tp", "_conf", "_cls", "_gt", "_img"):
            getattr(naive, name).extend(getattr(m, name))
    assert naive.compute()["mAP50-95"] != ref["mAP50-95"]
    for r in range(world):
        o = np.load(tmp_path / ("rank%d.npz" % r))
        assert o["ap"].tobytes() == ref["ap"].tobytes() and o["p"].tobytes() == ref["p"].tobytes()
        assert list(o["scalars"]) == [ref[k] for k in ("precision", "recall", "mAP50", "mAP50-95", "fitness")]
        assert (o["n_images"] == ref["n_images"]).all() and (o["confusion"] == ref["confusion_matrix"]).all()
        # the validation losses: each global batch's row, summed in batch order as one process does
        assert o["loss_keys"].tolist() == loss_keys.tolist() == [0, 1]
        assert o["loss_rows"].tobytes() == loss_rows.tobytes()
    assert sum(int(np.load(tmp_path / ("rank%d.npz" % r))["images"]) for r in range(world)) == len(keys)


# ---- one step's gradients over 2 ranks ----------------------------------------------------------------

def shard_gradient(model, batch):
    """Forward, both branches' objective and backward of one batch from zero gradients (as the step
    before its optimizer update); returns the flat gradient and BatchNorm statistics."""
    model.train()
    model.zero_grad()
    h, w = batch.images.shape[1:3]
    out = model.forward(batch.images)
    res = objective((*out["one2many"], *out["one2one"]), batch.targets, img_size=(h, w),
                    num_classes=model.num_classes, gains=model.loss_gains)
    g = res["grads"]
    model.backward({"one2many": (g[0], g[1]), "one2one": (g[2], g[3])})
    return np.array(model.flat_gradients, np.float32), np.array(model.flat_buffers, np.float32)


GRADIENTS = """
import ptl
sys.path.insert(0, os.path.join({repo!r}, "tests"))
from test_distributed_data import make_data, shard_gradient
import pathlib
ctx = D.setup("cpu", devices="auto")
data = make_data(pathlib.Path({coco!r}), rank, world, batch_size=2)
model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0)
own, own_bn = shard_gradient(model, next(iter(data.train_loader())))
avg = ctx.group.all_reduce_(own.copy()) / world  # the sum over ranks, then the optimizer's division
bn = ctx.group.broadcast_(own_bn.copy())          # BatchNorm statistics: rank 0's everywhere
ctx.close()
save(own=own, avg=avg, bn=bn)
"""


def test_averaged_gradient_equals_one_process(tmp_path, coco256):
    from dist_ranks import REPO
    procs = start_ranks(tmp_path, GRADIENTS.format(repo=REPO, coco=str(coco256)), 2, timeout=120)
    shards = []
    for r in range(2):
        d = make_data(coco256, r, 2, batch_size=2)
        shards.append(shard_gradient(ptl.Detector("yolo26n", num_classes=d.num_classes, seed=0),
                                     next(iter(d.train_loader()))))
    res = finish(procs, limit=240)
    assert all(rc == 0 for rc, _, _ in res.values()), res
    (g0, bn0), (g1, bn1) = shards
    want = (g0 + g1) / 2
    assert np.abs(g0 - g1).max() > 0 and np.abs(want).max() > 0 and (bn0 != bn1).any()
    for r in range(2):
        o = np.load(tmp_path / ("rank%d.npz" % r))
        assert o["own"].tobytes() == shards[r][0].tobytes()  # each rank computed its own shard's gradient
        assert o["avg"].tobytes() == want.tobytes()
        assert o["bn"].tobytes() == bn0.tobytes()
