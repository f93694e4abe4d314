"""ptl.distributed: the launcher environment, the rendezvous and the host collectives with 2 and 3 real
processes (CPU), failure handling (a killed, stuck, aborting or mismatched rank ends the job with one clear
message, within the timeout), and the launcher that starts the other ranks itself."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ptl
from ptl import distributed as D

from dist_ranks import REPO, errors, finish, free_port, start_ranks


JOIN = """
t0 = time.monotonic()
ctx = D.setup("cpu", devices="auto")
g = ctx.group
"""


# ---- the environment ---------------------------------------------------------------------------------

def test_environment_precedence_and_values():
    torchrun = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "1", "MASTER_ADDR": "node0",
                "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
    e = D.detect_environment(torchrun)
    assert (e.launcher, e.rank, e.world_size, e.local_rank, e.node_rank, e.master_addr, e.master_port) == (
        "torchrun", 3, 8, 1, 1, "node0", 29500)
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
             "SLURM_NODELIST": "gpu[07-09,12]", "SLURM_JOB_ID": "4242137", "SLURM_JOB_NAME": "train"}
    e = D.detect_environment(slurm)
    assert (e.launcher, e.rank, e.world_size, e.local_rank, e.node_rank, e.master_addr, e.master_port) == (
        "slurm", 5, 8, 1, 2, "gpu07", 15000 + 2137)
    assert D.detect_environment(dict(slurm, MASTER_ADDR="10.0.0.1", MASTER_PORT="1234")).master_port == 1234
    assert D.detect_environment(dict(slurm, SLURM_JOB_ID="")).master_port == 12910
    # srun torchrun: torchrun's variables describe the processes that run
    assert D.detect_environment(dict(slurm, **torchrun)).launcher == "torchrun"
    # an interactive allocation, or a single task, is not a SLURM launch: this process is alone
    assert D.detect_environment(dict(slurm, SLURM_JOB_NAME="interactive")) is None
    assert D.detect_environment(dict(slurm, SLURM_NTASKS="1", SLURM_PROCID="0")) is None
    assert D.detect_environment({}) is None
    e = D.detect_environment({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "5"})
    assert (e.launcher, e.local_rank, e.master_addr) == ("env", 0, "127.0.0.1")
    for bad, words in [({"RANK": "2", "WORLD_SIZE": "2", "MASTER_PORT": "5"}, "RANK=2"),
                       ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_PORT"),
                       ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_PORT": "5"}, "RANK"),
                       (dict(slurm, SLURM_PROCID="9"), "SLURM_PROCID")]:
        with pytest.raises(ValueError, match=words):
            D.detect_environment(bad)


def test_first_slurm_host():
    for text, host in [("gpu[07-09,12],cpu3", "gpu07"), ("node1,node2", "node1"), ("a b", "a"),
                       ("r[1-2]-n[03-04]", "r1-n03"), ("host[5]", "host5"), ("single", "single")]:
        assert D.first_slurm_host(text) == host
    with pytest.raises(ValueError):
        D.first_slurm_host("gpu[1-2")


def test_devices_and_timeout_arguments():
    assert D.parse_devices(3, "cpu") == [None] * 3 and D.parse_devices("auto", "cpu") == [None]
    assert D.parse_devices("0,2", "cuda", available=4) == [0, 2] and D.parse_devices(2, "cuda", available=4) == [0, 1]
    assert D.parse_devices("auto", "cuda", available=3) == [0, 1, 2] == D.parse_devices(-1, "cuda", available=3)
    for devices, acc, words in [([0, 1], "cpu", "CPU"), (0, "cpu", "processes"), ([0, 0], "cuda", "twice"),
                                ([5], "cuda", "GPU 5"), ("x", "cuda", "devices"), ("auto", "tpu", "accelerator")]:
        with pytest.raises(ValueError, match=words):
            D.parse_devices(devices, acc, available=4)
    assert D.timeout_seconds(None, {}) == D.DEFAULT_TIMEOUT_S == ptl._C.DIST_TIMEOUT_S == 1800.0
    assert D.timeout_seconds(None, {"PTL_DIST_TIMEOUT": "12.5"}) == 12.5 and D.timeout_seconds(3, {}) == 3.0
    for bad in (0, -1, "10", True):
        with pytest.raises(ValueError, match="timeout"):
            D.timeout_seconds(bad, {})


# ---- collectives ---------------------------------------------------------------------------------

COLLECTIVES = JOIN + """
rng = np.random.default_rng(rank)
# magnitudes that make float32 addition order visible
x32 = (rng.standard_normal(4097) * 10.0 ** rng.integers(-6, 7, 4097)).astype(np.float32)
x64 = rng.standard_normal(1000) * 1e10 ** rng.integers(-1, 2, 1000)
s32, s64 = g.all_reduce_(x32.copy()), g.all_reduce_(x64.copy())
again = g.all_reduce_(x32.copy())
empty = g.all_reduce_(np.zeros(0, np.float32))
b = np.full(7, rank, np.int32)
g.broadcast_(b)
blob = g.broadcast_bytes(b"uid-" + bytes(range(200)) if rank == 0 else None)
obj = g.broadcast_object({"log_dir": "runs/train/version_3"} if rank == 0 else None)
gathered = g.all_gather_bytes(b"x" * (rank * 1000))
arrays = g.all_gather_arrays({"v": np.arange(rank + 1, dtype=np.int64), "f": np.full((2, rank), 0.5)})
anyflag = g.any(rank == world - 1)
noflag = g.any(False)
t = time.monotonic(); g.barrier(); barrier_s = time.monotonic() - t
ctx.close()
save(x32=x32, x64=x64, s32=s32, s64=s64, again=again, empty=empty, b=b, blob=np.frombuffer(blob, np.uint8),
     sizes=[len(x) for x in gathered], ok_gather=all(x == b"x" * (r * 1000) for r, x in enumerate(gathered)),
     ok_arrays=all((a["v"] == np.arange(r + 1)).all() and a["f"].shape == (2, r) for r, a in enumerate(arrays)),
     obj=json.dumps(obj), anyflag=anyflag, noflag=noflag)
"""


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_exact_and_identical(tmp_path, world):
    res = finish(start_ranks(tmp_path, COLLECTIVES, world))
    assert all(rc == 0 for rc, _, _ in res.values()), res
    out = [dict(np.load(tmp_path / ("rank%d.npz" % r))) for r in range(world)]
    # the sum is rank 0 + rank 1 + ... added left to right, on every rank, bit for bit
    ref32, ref64 = out[0]["x32"].copy(), out[0]["x64"].copy()
    for r in range(1, world):
        ref32 += out[r]["x32"]
        ref64 += out[r]["x64"]
    for o in out:
        assert o["s32"].tobytes() == ref32.tobytes() == o["again"].tobytes()
        assert o["s64"].tobytes() == ref64.tobytes() and o["empty"].size == 0
        assert (o["b"] == 0).all() and bytes(o["blob"]) == b"uid-" + bytes(range(200))
        assert json.loads(str(o["obj"])) == {"log_dir": "runs/train/version_3"}
        assert list(o["sizes"]) == [r * 1000 for r in range(world)] and o["ok_gather"] and o["ok_arrays"]
        assert bool(o["anyflag"]) and not bool(o["noflag"])
    if world == 3:  # the test can tell orders apart: the reverse order gives other bits
        rev = out[2]["x32"] + out[1]["x32"] + out[0]["x32"]
        assert rev.tobytes() != ref32.tobytes()


# ---- failures ------------------------------------------------------------------------------------

WAIT_THEN_REPORT = """
try:
    if rank == int(os.environ["VICTIM"]):
        {victim}
    g.barrier()
    raise SystemExit("the barrier returned")
except D.DistributedError as exc:
    report(exc, t0)
"""


@pytest.mark.parametrize("world", [2, 3])
def test_killed_rank_ends_the_job_quickly(tmp_path, world):
    body = JOIN + WAIT_THEN_REPORT.format(victim="os.kill(os.getpid(), 9)")
    victim = world - 1
    t0 = time.monotonic()
    res = finish(start_ranks(tmp_path, body, world, timeout=60, env_extra={"VICTIM": str(victim)}))
    assert res[victim][0] == -signal.SIGKILL
    errs = errors(tmp_path, [r for r in range(world) if r != victim])
    for r, e in errs.items():  # far sooner than the 60 s timeout, the same message everywhere
        assert e["type"] == "DistributedError" and e["after"] < 15, e
        assert "rank %d" % victim in e["msg"] and "closed its connection" in e["msg"], e
    assert len({e["msg"] for e in errs.values()}) == 1
    assert time.monotonic() - t0 < 45


def test_stuck_rank_times_out(tmp_path):
    # rank 2 waits longer, so the verdict it reports is the one rank 0 relays
    body = JOIN + "g.timeout = 2.0 if rank == 0 else 20.0\n" + WAIT_THEN_REPORT.format(victim="time.sleep(30)")
    procs = start_ranks(tmp_path, body, 3, env_extra={"VICTIM": "1"})
    try:
        res = finish({r: procs[r] for r in (0, 2)}, limit=30)
    finally:
        procs[1].kill()
        procs[1].communicate()
    assert all(res[r][0] == 0 for r in (0, 2)), res
    e0, e2 = errors(tmp_path, [0, 2]).values()
    assert "timed out after 2 s" in e0["msg"] and "rank 1" in e0["msg"] and 1.8 < e0["after"] < 10, e0
    assert e2["msg"] == e0["msg"]  # rank 0 relays its verdict


def test_abort_reason_reaches_every_rank(tmp_path):
    body = JOIN + """
try:
    if rank == 1:
        g.abort("ValueError: bad label file in shard 1")
        raise SystemExit(3)
    g.barrier()
except D.DistributedError as exc:
    report(exc, t0)
"""
    res = finish(start_ranks(tmp_path, body, 3))
    assert res[1][0] == 3
    for e in errors(tmp_path, [0, 2]).values():
        assert "rank 1" in e["msg"] and "failed: ValueError: bad label file in shard 1" in e["msg"], e


@pytest.mark.parametrize("case,words", [("count", "disagrees in all_reduce"), ("op", "collective mismatch"),
                                        ("dtype", "dtype float64")])
def test_mismatched_calls_fail_clearly(tmp_path, case, words):
    body = JOIN + """
case = os.environ["CASE"]
try:
    if case == "count":
        g.all_reduce_(np.zeros(4 + rank, np.float32))
    elif case == "op":
        g.barrier() if rank == 0 else g.all_reduce_(np.zeros(4, np.float32))
    else:
        g.all_reduce_(np.zeros(4, np.float32 if rank == 0 else np.float64))
    raise SystemExit("no error")
except D.DistributedError as exc:
    report(exc, t0)
"""
    res = finish(start_ranks(tmp_path, body, 2, env_extra={"CASE": case}))
    assert all(rc == 0 for rc, _, _ in res.values()), res
    for e in errors(tmp_path, [0, 1]).values():
        assert words in e["msg"], e


def test_rendezvous_waits_are_bounded(tmp_path):
    body = """
t0 = time.monotonic()
try:
    D.setup("cpu", devices="auto")
except D.DistributedError as exc:
    report(exc, t0)
"""
    # rank 1 never comes
    res = finish(start_ranks(tmp_path, body, 2, timeout=1.5, ranks=[0]))
    e = errors(tmp_path, [0])[0]
    assert res[0][0] == 0 and "rendezvous" in e["msg"] and "rank(s) 1 did not" in e["msg"] and e["after"] < 8, e
    # rank 0 never comes
    res = finish(start_ranks(tmp_path, body, 2, timeout=1.5, ranks=[1]))
    e = errors(tmp_path, [1])[1]
    assert res[1][0] == 0 and "could not reach rank 0" in e["msg"] and e["after"] < 8, e


def test_rendezvous_turns_away_a_wrong_rank(tmp_path):
    """A process of another world size (a stale or foreign job) is told why and refused; the right rank 1
    still joins."""
    body = """
t0 = time.monotonic()
try:
    ctx = D.setup("cpu", devices="auto")
    ctx.group.barrier()
    save(ok=True)
except D.DistributedError as exc:
    report(exc, t0)
"""
    port = free_port()
    stray_dir = tmp_path / "stray"
    stray_dir.mkdir()
    procs = start_ranks(tmp_path, body, 2, ranks=[0], port=port)
    res_stray = finish(start_ranks(stray_dir, body, 3, ranks=[1], port=port))
    procs.update(start_ranks(tmp_path, body, 2, ranks=[1], port=port))
    res = finish(procs)
    assert all(rc == 0 for rc, _, _ in list(res.values()) + list(res_stray.values()))
    e = json.loads((stray_dir / "rank1.err").read_text())
    assert "world size is 2" in e["msg"] and "started with 3" in e["msg"], e
    assert all(np.load(tmp_path / ("rank%d.npz" % r))["ok"] for r in (0, 1))


def test_ctrl_c_stops_a_wait(tmp_path):
    body = JOIN + """
(open(os.path.join(OUT, "ready%d" % rank), "w").close())
try:
    g.barrier() if rank == 0 else time.sleep(30)
except KeyboardInterrupt:
    report(KeyboardInterrupt("interrupted"), t0)
"""
    procs = start_ranks(tmp_path, body, 2)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready0").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    procs[0].send_signal(signal.SIGINT)
    res = finish({0: procs[0]}, limit=20)
    procs[1].kill()
    procs[1].communicate()
    assert res[0][0] == 0 and errors(tmp_path, [0])[0]["type"] == "KeyboardInterrupt"


# ---- the launcher --------------------------------------------------------------------------------

LAUNCHED = """
import os, sys, time
import numpy as np
sys.path.insert(0, {repo!r})
from ptl import distributed as D
out = sys.argv[1]
ctx = D.setup("cpu", devices=int(sys.argv[2]), timeout=30)
fail = int(sys.argv[3])
if ctx.rank == fail:
    time.sleep(0.5)
    raise SystemExit(7)
try:
    x = ctx.group.all_reduce_(np.array([float(ctx.rank)]))
    ctx.close()
    with open(os.path.join(out, "launched%d" % ctx.rank), "w") as f:
        f.write("%d %d %d %s %g" % (ctx.rank, ctx.local_rank, ctx.world_size, os.environ.get("PTL_LAUNCHER_PID"), x[0]))
except D.DistributedError as exc:
    with open(os.path.join(out, "failed%d" % ctx.rank), "w") as f:
        f.write(str(exc))
    raise SystemExit(1)
"""


def run_launched(tmp_path, world, fail=-1):
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED.format(repo=REPO))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT",
                                                            "PTL_LAUNCHER_PID")}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(script), str(tmp_path), str(world), str(fail)], env=env,
                       capture_output=True, text=True, timeout=90)
    return r, time.monotonic() - t0


def test_launcher_starts_the_other_ranks(tmp_path):
    r, _ = run_launched(tmp_path, 3)
    assert r.returncode == 0, r.stderr
    seen = [(tmp_path / ("launched%d" % k)).read_text().split() for k in range(3)]
    assert [s[:3] for s in seen] == [["0", "0", "3"], ["1", "1", "3"], ["2", "2", "3"]]
    assert seen[0][3] == "None" and seen[1][3] == seen[2][3] != "None"  # ranks 1, 2 were started by rank 0
    assert all(s[4] == "3" for s in seen)


def test_launched_rank_that_fails_ends_the_job(tmp_path):
    r, took = run_launched(tmp_path, 3, fail=2)
    assert r.returncode == 1 and took < 40, (r.returncode, took, r.stderr)
    msg = (tmp_path / "failed0").read_text()
    assert "rank 2" in msg and ("exited with status 7" in msg or "closed its connection" in msg), msg


def test_launcher_needs_a_command_to_run_again(tmp_path):
    code = "import sys; sys.path.insert(0, %r); from ptl import distributed as D; D.setup('cpu', devices=2)" % REPO
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "python -c" in r.stderr and "torchrun" in r.stderr


SAME_FILE = JOIN + """
path = os.path.join(OUT, "ckpt%d" % (rank if os.environ["CASE"] == "differ" and rank == 2 else 0))
with open(path, "ab") as f:
    f.write(b"checkpoint bytes")
g.barrier()
try:
    D.check_same_file(g, path)
    save(ok=True)
except ValueError as exc:
    report(exc, t0)
ctx.close()
"""


@pytest.mark.parametrize("case", ["same", "differ"])
def test_every_rank_resumes_from_the_same_checkpoint(tmp_path, case):
    res = finish(start_ranks(tmp_path, SAME_FILE, 3, env_extra={"CASE": case}))
    assert all(rc == 0 for rc, _, _ in res.values()), res
    if case == "same":
        assert all(np.load(tmp_path / ("rank%d.npz" % r))["ok"] for r in range(3))
    else:
        for e in errors(tmp_path, range(3)).values():
            assert "differs between ranks" in e["msg"] and "rank(s) 2" in e["msg"], e


def test_one_process_needs_no_group():
    ctx = D.setup("cpu", devices=1, environ={})
    assert (ctx.rank, ctx.world_size, ctx.group, ctx.is_global_zero, ctx.any(True)) == (0, 1, None, True, True)
    ctx.close()


def test_trainer_rank_properties_and_multi_rank_fit_is_not_wired_yet(coco256):
    tr = ptl.Trainer(accelerator="cpu", devices=2, strategy="ddp", timeout=5, logger=False)
    assert (tr.global_rank, tr.local_rank, tr.node_rank, tr.world_size, tr.is_global_zero) == (0, 0, 0, 1, True)
    assert tr.timeout == 5.0
    data = ptl.DetectionData(coco256 / "data.yaml", imgsz=64, batch_size=2, workers=0, verbose=False)
    with pytest.raises(NotImplementedError, match="2 ranks"):
        tr.fit(ptl.Detector("yolo26n", num_classes=data.num_classes), data)


def test_cli_batch_is_the_global_batch(coco256):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = REPO
    base = [sys.executable, "-m", "ptl.train", "--data", str(coco256 / "data.yaml"), "--epochs", "1"]
    r = subprocess.run(base + ["--device", "cpu", "--devices", "2", "--batch", "5"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2 and "--batch 5 is the batch of all 2 ranks" in r.stderr, r.stderr
    r = subprocess.run(base + ["--device", "0,1", "--devices", "2"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2 and "--devices" in r.stderr, r.stderr
