"""Running a test body in several real processes, torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT in the environment): each writes its results to files in the test's folder."""
import json
import os
import socket
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each worker runs first: join the group from its environment (RANK, WORLD_SIZE, MASTER_*).
PRELUDE = """
import json, os, sys, time
import numpy as np
sys.path.insert(0, {repo!r})
from ptl import distributed as D
OUT = {out!r}
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
def save(**kw):
    np.savez(os.path.join(OUT, "rank%d.npz" % rank), **kw)
def report(exc, t0):
    with open(os.path.join(OUT, "rank%d.err" % rank), "w") as f:
        json.dump({{"type": type(exc).__name__, "msg": str(exc), "after": time.monotonic() - t0}}, f)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(tmp_path, body, world, timeout=20.0, ranks=None, env_extra=None, port=None):
    """Starts `world` (or the listed `ranks`) worker processes running PRELUDE + body, torchrun-style."""
    port = port or free_port()
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE.format(repo=REPO, out=str(tmp_path)) + textwrap.dedent(body))
    procs = {}
    for r in range(world) if ranks is None else ranks:
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PTL_DIST_TIMEOUT=str(timeout))
        env.pop("PTL_LAUNCHER_PID", None)
        env.update(env_extra or {})
        procs[r] = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
    return procs


def finish(procs, limit=60):
    """Waits for every process; returns {rank: (returncode, stdout, stderr)}."""
    out = {}
    for r, p in procs.items():
        try:
            o, e = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            raise AssertionError("rank %d hung:\n%s" % (r, e))
        out[r] = (p.returncode, o, e)
    return out


def errors(tmp_path, ranks):
    return {r: json.loads((tmp_path / ("rank%d.err" % r)).read_text()) for r in ranks}
