"""NCCL for data parallelism over GPUs: opened at run time like cuBLAS/cuDNN (no GPU needed for that), the
ncclUniqueId carried by the host rendezvous; the communicator's collectives need two GPUs (cuda tier)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ptl
from ptl import _C
from ptl import callbacks as cb
from ptl.data import DetectionData
from ptl.engine import Engine

from dist_ranks import REPO, errors, finish, start_ranks

needs_cuda_build = pytest.mark.skipif(not _C.WITH_CUDA, reason="ptl was built without CUDA (no NCCL)")


def nccl_or_skip():
    try:
        return _C.nccl_version()
    except ptl.CudaError as exc:  # the wheel or the system library is missing: the message says which
        assert "NCCL" in str(exc) and "nvidia-nccl" in str(exc)
        pytest.skip(str(exc))


@needs_cuda_build
def test_nccl_is_opened_at_run_time():
    v = nccl_or_skip()
    assert v >= 21800 and _C.nccl_library().endswith("libnccl.so.2")
    a, b = _C.nccl_unique_id(), _C.nccl_unique_id()
    assert len(a) == len(b) == 128 and a != b


UID = """
ctx = D.setup("cpu", devices="auto")
uid = ctx.group.broadcast_bytes(D._C.nccl_unique_id() if rank == 0 else None)
ctx.close()
save(uid=np.frombuffer(uid, np.uint8))
"""


@needs_cuda_build
def test_rank_0s_unique_id_reaches_every_rank(tmp_path):
    nccl_or_skip()
    res = finish(start_ranks(tmp_path, UID, 3))
    assert all(rc == 0 for rc, _, _ in res.values()), res
    ids = [np.load(tmp_path / ("rank%d.npz" % r))["uid"].tobytes() for r in range(3)]
    assert len(ids[0]) == 128 and ids[0] == ids[1] == ids[2]


ALL_REDUCE = """
import ptl
t0 = time.monotonic()
ctx = D.setup("cuda", devices=2)
comm = D.nccl_communicator(ctx)
x = ptl.tensor(np.arange(1000, dtype=np.float32) * (rank + 1), device="cuda:%d" % ctx.device)
comm.all_reduce_(x)
y = ptl.tensor(np.full(10, rank + 7.0, np.float32), device="cuda:%d" % ctx.device)
comm.broadcast_(y, 0)
got = x.numpy(), y.numpy()
comm.check()
comm.close()
ctx.close()
save(x=got[0], y=got[1])
"""


@pytest.mark.cuda
def test_nccl_all_reduce_and_broadcast_on_two_gpus(tmp_path):
    if ptl.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    res = finish(start_ranks(tmp_path, ALL_REDUCE, 2, timeout=120), limit=240)
    assert all(rc == 0 for rc, _, _ in res.values()), res
    for r in range(2):
        o = np.load(tmp_path / ("rank%d.npz" % r))
        assert (o["x"] == np.arange(1000, dtype=np.float32) * 3).all() and (o["y"] == 7).all()


MISSING_PEER = """
import ptl
t0 = time.monotonic()
ctx = D.setup("cuda", devices=2)
uid = ctx.group.broadcast_bytes(D._C.nccl_unique_id() if rank == 0 else None)
try:
    if rank == 0:
        D._C.nccl_comm(uid, 2, 0, ctx.device, 3.0)  # rank 1 never joins NCCL
    else:
        time.sleep(8)
except ptl.CudaError as exc:
    report(exc, t0)
"""


@pytest.mark.cuda
def test_nccl_init_waits_are_bounded(tmp_path):
    if ptl.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    res = finish(start_ranks(tmp_path, MISSING_PEER, 2, timeout=60), limit=120)
    assert res[0][0] == 0, res
    e = errors(tmp_path, [0])[0]
    assert "did not complete within 3 s" in e["msg"] and e["after"] < 20, e



@pytest.mark.cuda
def test_cuda_all_reduce_in_graph(coco256, tmp_path, monkeypatch):
    """Trainer(all_reduce_in_graph=True), on one GPU with a one-rank NCCL communicator given to the fit's
    engine: recording captures the all-reduce and the BatchNorm broadcast into a third graph after the
    backward, the optimizer steps that replay launch that graph instead of queueing the two collectives, and
    the accumulation micro-batches replay the backward alone. The fit gives the digests of the same fit with
    the communication queued after the replayed backward, and of the fit without a communicator (a one-rank
    sum and broadcast change nothing; in place, NCCL queues no kernel for them, so the third graph has the
    backward's node count)."""
    nccl_or_skip()
    real_init = Engine.__init__

    def with_comm(self, trainer, model, data, for_fit=True):
        real_init(self, trainer, model, data, for_fit)
        device = int(str(self.device).partition(":")[2] or 0)
        self.comm = _C.nccl_comm(_C.nccl_unique_id(), 1, 0, device, 60.0)

    seen = {}

    class Watch(cb.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen["nodes"] = tuple(pl_module.info()["recorded_nodes"])
            comm = trainer._engine.comm
            seen["counts"] = None if comm is None else comm.counts()

    digests, counts = {}, {}
    for mode in ("none", "after", "graph"):
        seen.clear()
        with monkeypatch.context() as m:
            if mode != "none":
                m.setattr(Engine, "__init__", with_comm)
            tr = ptl.Trainer(default_root_dir=str(tmp_path / mode), max_epochs=2, limit_train_batches=4,
                             limit_val_batches=1, accelerator="cuda", precision="bf16-mixed",
                             accumulate_grad_batches=2, seed=0, enable_progress_bar=False, callbacks=[Watch()],
                             all_reduce_in_graph=mode == "graph")
            data = DetectionData(str(coco256 / "data.yaml"), verbose=False, imgsz=128, batch_size=4, workers=2)
            tr.fit(ptl.Detector("yolo26n"), data, capture_network=True)
        digests[mode], counts[mode] = tr.digest(), seen["counts"]
        fwd, bwd, tail = seen["nodes"]
        assert fwd > 0 and bwd > 0, seen
        assert (tail >= bwd) if mode == "graph" else tail == 0, (mode, seen)
    steps = 2 * 4 // 2  # optimizer steps: 2 epochs of 4 batches, accumulating 2
    assert counts["after"] == {"queued": 2 * steps, "captured": 0, "replays": 0}, counts
    g = counts["graph"]
    assert g["replays"] >= 1 and g["captured"] >= 2 and g["captured"] % 2 == 0, counts
    assert g["queued"] + 2 * g["replays"] == 2 * steps, counts
    assert digests["graph"] == digests["after"] == digests["none"]


# A replayed data-parallel fit on two GPUs (devices=2: this process is rank 0 and starts rank 1).
GPU_FIT = """
import json, os, sys
sys.path.insert(0, {repo!r})
import ptl
out, root, in_graph = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
data = ptl.DetectionData({data!r}, imgsz=128, batch_size=4, workers=2, verbose=False, seed=0)
model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0)
tr = ptl.Trainer(accelerator="cuda", devices=2, precision="bf16-mixed", max_epochs=2, limit_train_batches=4,
                 limit_val_batches=1, accumulate_grad_batches=2, default_root_dir=root, seed=0, timeout=60,
                 enable_progress_bar=False, all_reduce_in_graph=in_graph)
tr.fit(model, data, capture_network=True)
with open(os.path.join(out, "fit%d.json" % tr.global_rank), "w") as f:
    json.dump({{"digest": tr.digest(), "world": tr.world_size}}, f)
"""


@pytest.mark.cuda
def test_cuda_two_gpu_fit_all_reduce_in_graph(tmp_path, coco256):
    """Two GPUs, graph replay: the fit with the all-reduce recorded in the backward's graph gives every rank
    the digests of the fit with the all-reduce queued after the replayed backward."""
    if ptl.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    digests = []
    for in_graph in (0, 1):
        out = tmp_path / str(in_graph)
        out.mkdir()
        script = out / "fit.py"
        script.write_text(GPU_FIT.format(repo=REPO, data=str(coco256 / "data.yaml")))
        r = subprocess.run([sys.executable, str(script), str(out), str(out / "root"), str(in_graph)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        res = [json.loads((out / ("fit%d.json" % k)).read_text()) for k in range(2)]
        assert [x["world"] for x in res] == [2, 2]
        assert res[0]["digest"] == res[1]["digest"], in_graph
        digests.append(res[0]["digest"])
    assert digests[0] == digests[1]
