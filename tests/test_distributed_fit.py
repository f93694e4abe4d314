"""Data-parallel fits on CPU ranks through the fused step (issue 16): a fit via devices=2 and via a
torchrun-style environment with digests equal on every rank; the ranks' samples per epoch are the
single-process epoch; one step's averaged gradient equals (bit for bit) the average of the shards' gradients
computed in one process; validation metrics equal a single-process validation of the same weights; only
rank 0 writes files; a killed rank ends the job with a message within the timeout; a checkpoint written
mid-accumulation resumes bit-exactly; and how a 2-rank fit relates to one process with the global batch."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import ptl
from ptl.objective import objective, o2m_weight

from dist_ranks import REPO, finish, start_ranks

# Every rank of a fit runs this script (devices=N: rank 0 is started by the test and starts the others).
# Ranks other than 0 run with a file-size limit of 0 bytes until the fit has returned: a write of any byte
# to any file fails there (EFBIG), so a fit that passes wrote its files on rank 0 only.
FIT = """
import json, logging, os, resource, signal, sys
sys.path.insert(0, {repo!r})
import ptl
logging.basicConfig(level=logging.INFO)  # the progress lines go through the ptl logger
out, root, world, kill, epochs, ckpt = sys.argv[1:7]
world, kill, epochs = int(world), int(kill), int(epochs)
rank = int(os.environ.get("RANK", "0"))
limit = resource.getrlimit(resource.RLIMIT_FSIZE)
if rank:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, limit[1]))

class Record(ptl.Callback):
    seen = {{}}
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.setdefault(trainer.current_epoch, []).append([int(i) for i in batch.indices])
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == kill and trainer.global_step >= 2:
            os.kill(os.getpid(), 9)

data = ptl.DetectionData({data!r}, imgsz=64, batch_size=2, workers=0, verbose=False, seed=0)
model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0)
every = ptl.ModelCheckpoint(filename="epoch{{epoch}}", monitor=None, save_top_k=-1, save_last=True,
                            auto_insert_metric_name=False)
tr = ptl.Trainer(accelerator="cpu", devices=world, max_epochs=epochs, limit_train_batches=3, limit_val_batches=2,
                 accumulate_grad_batches=2, default_root_dir=root, seed=0, timeout=30, callbacks=[Record(), every])
tr.fit(model, data, ckpt_path=ckpt or None)
resource.setrlimit(resource.RLIMIT_FSIZE, limit)
with open(os.path.join(out, "fit%d.json" % tr.global_rank), "w") as f:
    json.dump({{"digest": tr.digest(), "log_dir": tr.log_dir, "world": tr.world_size, "local": tr.local_rank,
               "val": tr.val_history[-1]["logged"], "seen": Record.seen, "step": tr.global_step,
               "losses": [[float(v) for v in r] for r in tr.loss_history]}}, f)
"""


def launched_fit(tmp_path, coco256, world, kill=-1, epochs=2, ckpt="", name="run"):
    """Starts rank 0 of a fit by devices=world (it starts the other ranks); returns (result, out folder,
    root folder, seconds)."""
    out = tmp_path / name
    out.mkdir()
    script = out / "fit.py"
    script.write_text(FIT.format(repo=REPO, data=str(coco256 / "data.yaml")))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(script), str(out), str(out / "root"), str(world), str(kill), str(epochs),
                        str(ckpt)], env=env, capture_output=True, text=True, timeout=900)
    return r, out, out / "root", time.monotonic() - t0


def results(out, world):
    return [json.loads((out / ("fit%d.json" % r)).read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def two_rank_fit(tmp_path_factory, coco256):
    """A 2-epoch fit on 2 CPU ranks (3 steps of 2 x 2 images per epoch, accumulating 2: the first epoch ends
    between optimizer steps)."""
    r, out, root, _ = launched_fit(tmp_path_factory.mktemp("ddp"), coco256, 2)
    assert r.returncode == 0, r.stderr
    return r, out, root, results(out, 2)


def test_devices_2_fit_digests_equal_and_only_rank_0_writes(two_rank_fit):
    r, _, root, res = two_rank_fit
    assert res[0]["digest"] == res[1]["digest"]  # parameters, optimizer, EMA, BN statistics, losses, metrics
    assert res[0]["losses"] == res[1]["losses"] and len(res[0]["losses"]) == 6
    assert [x["world"] for x in res] == [2, 2] and [x["local"] for x in res] == [0, 1]
    assert res[0]["log_dir"] == res[1]["log_dir"] and res[0]["step"] == 3  # steps after batches 2, 4, 6
    assert sorted(os.listdir(root / "runs" / "train")) == ["version_0"]  # one run folder, made by rank 0
    files = sorted(os.listdir(res[0]["log_dir"]))
    assert "metrics.csv" in files and "hparams.yaml" in files and "checkpoints" in files
    assert sorted(os.listdir(os.path.join(res[0]["log_dir"], "checkpoints"))) == [
        "epoch0.ckpt", "epoch1.ckpt", "last.ckpt"]
    assert r.stderr.count(ptl.report.TABLE_HEADER) == 2  # the validation table: rank 0 only, once per epoch


def test_fit_shards_are_the_single_process_epochs(two_rank_fit, coco256):
    """Step k of the two ranks together is batch k of one process with the global batch of 4 images."""
    _, _, _, res = two_rank_fit
    single = ptl.DetectionData(coco256 / "data.yaml", imgsz=64, batch_size=4, workers=0, verbose=False, seed=0)
    loader = single.train_loader()
    for epoch in (0, 1):
        mine = [x["seen"][str(epoch)] for x in res]
        assert [len(m) for m in mine] == [3, 3] and all(len(b) == 2 for m in mine for b in m)
        for k in range(3):
            assert mine[0][k] + mine[1][k] == loader.indices(epoch, k).tolist()


def test_fit_validation_equals_a_single_process_validation(two_rank_fit, coco256):
    _, _, _, res = two_rank_fit
    weights = os.path.join(res[0]["log_dir"], "weights", "last.safetensors")  # the EMA weights validated last
    data = ptl.DetectionData(coco256 / "data.yaml", imgsz=64, batch_size=2, workers=0, verbose=False, seed=0)
    model = ptl.Detector.load(weights)
    single = ptl.Trainer(accelerator="cpu", limit_val_batches=2, logger=False, enable_progress_bar=False)
    logged = single.validate(model, data)[0]
    assert logged == res[0]["val"] == res[1]["val"]
    assert np.isfinite(list(logged.values())).all()


def test_a_mid_accumulation_checkpoint_resumes_bit_exactly(two_rank_fit, tmp_path, coco256):
    """The epoch-0 checkpoint holds each rank's pending gradients (trainer.grads, trainer.grads.rank1): a
    2-rank resume for the second epoch ends where the uninterrupted fit did."""
    _, _, _, res = two_rank_fit
    ckpt = os.path.join(res[0]["log_dir"], "checkpoints", "epoch0.ckpt")
    tensors, _ = ptl.io.load_safetensors(ckpt)
    assert {"trainer.grads", "trainer.grads.rank1"} <= set(tensors)
    assert np.abs(tensors["trainer.grads"]).max() > 0
    assert (tensors["trainer.grads"] != tensors["trainer.grads.rank1"]).any()
    r, out, _, _ = launched_fit(tmp_path, coco256, 2, ckpt=ckpt)
    assert r.returncode == 0, r.stderr
    again = results(out, 2)
    assert again[0]["digest"] == again[1]["digest"] == res[0]["digest"]


def test_a_resume_with_another_world_size_is_refused(two_rank_fit, coco256):
    _, _, _, res = two_rank_fit
    ckpt = os.path.join(res[0]["log_dir"], "checkpoints", "epoch0.ckpt")
    data = ptl.DetectionData(coco256 / "data.yaml", imgsz=64, batch_size=2, workers=0, verbose=False, seed=0)
    tr = ptl.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False)
    with pytest.raises(ptl.CheckpointError, match="2 ranks"):
        tr.fit(ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0), data, ckpt_path=ckpt)


def test_a_killed_rank_ends_the_fit_within_the_timeout(tmp_path, coco256):
    r, _, _, took = launched_fit(tmp_path, coco256, 2, kill=1)
    assert r.returncode != 0 and took < 120, r.stderr
    assert "rank 1" in r.stderr and ("closed its connection" in r.stderr or "exited with signal SIGKILL" in r.stderr)



# A rank that fails in a fit (an exception in a callback, or stuck past the timeout) while the others wait in
# the step's gradient all-reduce: they raise DistributedError naming it, never hang.
FAILING = """
import ptl
class Fail(ptl.Callback):
    last = time.monotonic()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        Fail.last = time.monotonic()
        if rank == 1 and trainer.global_step == 1:
            if {how!r} == "raise":
                raise ValueError("bad batch on rank 1")
            time.sleep(25)
data = ptl.DetectionData({data!r}, imgsz=64, batch_size=2, workers=0, verbose=False, seed=0)
model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0)
tr = ptl.Trainer(accelerator="cpu", devices=2, max_epochs=1, limit_train_batches=3, limit_val_batches=0,
                 accumulate_grad_batches=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 seed=0, callbacks=[Fail()])
try:
    tr.fit(model, data)
except (D.DistributedError, ValueError) as exc:
    report(exc, Fail.last)
"""


# the stuck case waits out its timeout on top of two ranks' start-up (~26 s): the slow tier runs it
@pytest.mark.parametrize("how", ["raise", pytest.param("stuck", marks=pytest.mark.slow)])
def test_a_failing_rank_fails_the_fit_on_every_rank(tmp_path, coco256, how):
    timeout = 60.0 if how == "raise" else 4.0
    procs = start_ranks(tmp_path, FAILING.format(how=how, data=str(coco256 / "data.yaml")), 2, timeout=timeout)
    res = finish(procs, limit=300)
    errs = {r: json.loads((tmp_path / ("rank%d.err" % r)).read_text()) for r in range(2)
            if (tmp_path / ("rank%d.err" % r)).exists()}
    e0 = errs.get(0)
    assert e0 is not None and e0["type"] == "DistributedError", (res, errs)
    assert "rank 1" in e0["msg"], e0
    if how == "raise":  # told at once, with the reason
        assert "ValueError: bad batch on rank 1" in e0["msg"] and e0["after"] < 30, e0
        assert errs[1]["type"] == "ValueError", errs
    else:  # rank 0 waits in the step's all-reduce until the timeout
        assert "timed out after 4 s" in e0["msg"] and timeout - 0.5 < e0["after"] < timeout + 10, e0

# ---- 3 ranks started torchrun-style, with empty shards -------------------------------------------------

THREE = """
import ptl
class Record(ptl.Callback):
    seen = {{}}
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.setdefault(trainer.current_epoch, []).append([int(i) for i in batch.indices])
data = ptl.DetectionData({data!r}, imgsz=64, batch_size=2, workers=0, verbose=False, seed=0, fraction=8)
model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0)
tr = ptl.Trainer(accelerator="cpu", devices=3, max_epochs=3, accumulate_grad_batches=3, limit_val_batches=1,
                 default_root_dir=os.path.join(OUT, "root"), seed=0, enable_progress_bar=False, callbacks=[Record()])
tr.fit(model, data)
with open(os.path.join(OUT, "fit%d.json" % rank), "w") as f:
    json.dump({{"digest": tr.digest(), "seen": Record.seen, "step": tr.global_step,
               "val": tr.val_history[-1]["logged"]}}, f)
"""


def test_torchrun_style_fit_3_ranks_with_empty_shards(tmp_path, coco256):
    """8 images, 3 ranks of 2: per epoch a full global batch, then one image each for ranks 0 and 1 and none
    for rank 2. Accumulating 3 batches over 3 epochs, the optimizer steps after batches 3 (full) and 6
    (rank 2 empty: it takes part without a batch); rank 2's empty batches 2 and 4 are micro-batches, for
    which it makes no call. Validation: one batch, rank 0's; ranks 1 and 2 contribute nothing."""
    body = THREE.format(data=str(coco256 / "data.yaml"))
    res = finish(start_ranks(tmp_path, body, 3, timeout=120), limit=900)
    assert all(rc == 0 for rc, _, _ in res.values()), res
    out = results(tmp_path, 3)
    assert out[0]["digest"] == out[1]["digest"] == out[2]["digest"]
    assert [x["step"] for x in out] == [2, 2, 2]
    assert out[0]["val"] == out[2]["val"]
    single = ptl.DetectionData(coco256 / "data.yaml", imgsz=64, batch_size=6, workers=0, verbose=False, seed=0,
                               fraction=8).train_loader()
    for epoch in (0, 1, 2):
        mine = [x["seen"][str(epoch)] for x in out]
        assert [len(b) for m in mine for b in m] == [2, 1, 2, 1, 2, 0]
        for k in range(2):
            assert sum((m[k] for m in mine), []) == single.indices(epoch, k).tolist()


# ---- one step's gradient over 2 ranks -------------------------------------------------------------------

STEP = """
import ptl
sys.path.insert(0, os.path.join({repo!r}, "tests"))
data = ptl.DetectionData({data!r}, imgsz=64, batch_size=2, workers=0, verbose=False, seed=0)
model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0,
                     hparams={{"optimizer": "SGD", "weight_decay": 0.0}})
class AfterStep(ptl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.v = trainer._engine.opt.state2.numpy().copy()  # SGD momentum: the gradient the update used
        self.bn = pl_module.flat_buffers.numpy().copy()      # the live BatchNorm statistics
after = AfterStep()
tr = ptl.Trainer(accelerator="cpu", devices=2, max_epochs=1, max_steps=1, accumulate_grad_batches=1,
                 gradient_clip_val=0, limit_val_batches=0, logger=False, enable_checkpointing=False,
                 enable_progress_bar=False, seed=0, callbacks=[after])
tr.fit(model, data)
save(v=after.v, bn=after.bn, loss=np.asarray(tr.loss_history[0]))
"""


def shard_step(coco256, rank):
    """One process's forward, objective (both branches) and backward of rank `rank`'s first batch of a 2-rank,
    1-epoch fit, from the fresh model: (gradient, BatchNorm statistics after the forward, losses)."""
    data = ptl.DetectionData(coco256 / "data.yaml", imgsz=64, batch_size=2, workers=0, verbose=False, seed=0)
    data.shard(rank, 2)
    data.epochs = 1  # as the fit sets it (close_mosaic counts back from the last epoch)
    batch = next(iter(data.train_loader()))
    model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0)
    model.train()
    model.zero_grad()
    out = model.forward(batch.images)
    res = objective((*out["one2many"], *out["one2one"]), batch.targets, img_size=batch.images.shape[1:3],
                    num_classes=model.num_classes, o2m_weight=o2m_weight(0, 1), gains=model.loss_gains)
    g = res["grads"]
    model.backward({"one2many": (g[0], g[1]), "one2one": (g[2], g[3])})
    return (np.array(model.flat_gradients.numpy(), np.float32), np.array(model.flat_buffers.numpy()),
            np.asarray(res["losses"]), len(batch))


def test_one_step_averages_the_shards_gradients(tmp_path, coco256):
    """Each rank's gradient is its shard's at the global batch's scale (x 2, Ultralytics' loss * world); the
    step sums them over the ranks and the optimizer divides by 2: the gradient it uses (the SGD momentum
    buffer after one step from zero, without decay or clipping) is, bit for bit, the average of the two
    ranks' gradients computed in one process, i.e. the sum of the shards' per-batch gradients. Every rank
    ends with rank 0's BatchNorm statistics; the step's loss row is the image-weighted mean of the shards'."""
    procs = start_ranks(tmp_path, STEP.format(repo=REPO, data=str(coco256 / "data.yaml")), 2, timeout=120)
    try:
        shards = [shard_step(coco256, r) for r in range(2)]
    finally:
        res = finish(procs, limit=600)
    assert all(rc == 0 for rc, _, _ in res.values()), res
    (g0, bn0, l0, n0), (g1, bn1, l1, n1) = shards
    assert np.abs(g0 - g1).max() > 0 and (bn0 != bn1).any()
    two = np.float32(2)
    averaged = (two * g0 + two * g1) * np.float32(0.5)
    assert averaged.tobytes() == (g0 + g1).tobytes()
    loss = ((n0 * l0.astype(np.float64) + n1 * l1.astype(np.float64)) / (n0 + n1)).astype(np.float32)
    for r in range(2):
        o = np.load(tmp_path / ("rank%d.npz" % r))
        assert o["v"].tobytes() == (averaged + np.float32(0)).tobytes()  # v = 0 * momentum + gradient
        assert o["bn"].tobytes() == bn0.tobytes()
        assert o["loss"].tobytes() == loss.tobytes()


@pytest.mark.slow
def test_two_ranks_against_one_process_with_the_global_batch(two_rank_fit, tmp_path, coco256):
    """What a 2-rank fit shares with one process whose batch is the global one (4 images): the images of
    every step (above), the schedule (nominal-batch accumulation, decay scaling, warm-up, steps taken) and
    the learning rates; what differs: BatchNorm normalises each rank's 2 images with their own batch
    statistics, and the loss is normalised per rank, so losses and weights are not the single process's."""
    _, _, _, res = two_rank_fit
    data = ptl.DetectionData(coco256 / "data.yaml", imgsz=64, batch_size=4, workers=0, verbose=False, seed=0)
    tr = ptl.Trainer(accelerator="cpu", max_epochs=2, limit_train_batches=3, limit_val_batches=2,
                     accumulate_grad_batches=2, default_root_dir=str(tmp_path), seed=0, enable_progress_bar=False)
    tr.fit(ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0), data)
    d = tr.digest()
    assert d["schedule"] == res[0]["digest"]["schedule"] and tr.global_step == res[0]["step"]
    csv_ddp = open(os.path.join(res[0]["log_dir"], "metrics.csv")).read().splitlines()
    csv_one = open(os.path.join(tr.log_dir, "metrics.csv")).read().splitlines()
    head = csv_one[0].split(",")
    lr = [i for i, h in enumerate(head) if h.startswith("lr/")]
    assert lr and csv_ddp[0] == csv_one[0]
    for a, b in zip(csv_ddp[1:], csv_one[1:]):
        assert [a.split(",")[i] for i in lr] == [b.split(",")[i] for i in lr]
    assert d["model"] != res[0]["digest"]["model"] and d["losses"] != res[0]["digest"]["losses"]
