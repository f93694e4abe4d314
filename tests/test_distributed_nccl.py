"""NCCL for data parallelism over GPUs: opened at run time like cuBLAS/cuDNN (no GPU needed for that), the
ncclUniqueId carried by the host rendezvous; the communicator's collectives need two GPUs (cuda tier)."""
import numpy as np
import pytest

import ptl
from ptl import _C

from dist_ranks import errors, finish, start_ranks

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

