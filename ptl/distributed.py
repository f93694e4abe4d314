"""Data parallelism across processes: which rank this process is, starting the other ranks, the rendezvous
and the host collectives (C: ``csrc/dist``), and the gathering of validation statistics.

One process per device. Where the ranks come from, first match wins:

1. ``RANK`` and ``WORLD_SIZE`` are set: ``torchrun`` (``torch.distributed.run``), ptl's own launcher, or
   any launcher that sets PyTorch's variables. ``LOCAL_RANK`` (default ``RANK``) picks the GPU among the
   node's ``devices``; ``NODE_RANK`` (or torchrun's ``GROUP_RANK``) the node; ``MASTER_ADDR`` (default
   ``127.0.0.1``) and ``MASTER_PORT`` (required) where rank 0 listens. ptl starts nothing.
2. SLURM's ``srun`` with more than one task: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
   ``SLURM_NODEID``; ``MASTER_ADDR``, else the first host of ``SLURM_NODELIST``; ``MASTER_PORT``, else
   15000 + the last four digits of ``SLURM_JOB_ID`` (12910 without one), the rule Lightning uses, so that
   every task computes the same port. Job names ``bash`` and ``interactive`` do not count (an interactive
   allocation, as in Lightning). ptl starts nothing.
3. Otherwise this is the one process of its node. With ``devices * num_nodes > 1`` it is the node's first
   rank (``NODE_RANK * devices``, ``NODE_RANK`` default 0) and starts the node's other ranks by running the
   same command again with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``NODE_RANK``, ``MASTER_ADDR`` and
   ``MASTER_PORT`` in their environment, as Lightning's ``ddp`` strategy does (``python script.py ...`` or
   ``python -m package.module ...``); like Lightning's, this cannot work from ``python -c``, a REPL or a
   notebook (there is no command to run again), and says so. Node 0 listens on ``MASTER_PORT`` (default:
   any free port, told to the ranks it starts); other nodes need ``MASTER_ADDR`` and ``MASTER_PORT``.

torchrun's variables come first because ``srun torchrun ...`` sets both and torchrun's describe the
processes that actually run.

Failure is never a hang. Every wait has a timeout, ``timeout=`` seconds (``Trainer(timeout=)``), else the
environment's ``PTL_DIST_TIMEOUT``, else ``DEFAULT_TIMEOUT_S`` (1800 s, PyTorch's default). A rank that
exits or is killed closes its connection, which the others see at once; a rank that fails can say why
(:meth:`ProcessGroup.abort`); rank 0 relays either to every rank, so all fail with one message naming the
rank, as :class:`DistributedError`. Rank 0 also watches the ranks it started: one that exits with an
error stops rank 0's waits at once, and when rank 0 fails it stops the ranks it started.

The host collectives go through rank 0, which combines in rank order: an all-reduce sum is bit for bit
the single-process sum ``x_0 + x_1 + ...`` of the same buffers, on every rank. They carry the CPU ranks'
gradients and, on GPUs, everything but the gradients (which NCCL carries): the ncclUniqueId, the run
folder, validation statistics, barriers.
"""
import atexit
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from . import _C

__all__ = ["DEFAULT_TIMEOUT_S", "ClusterEnv", "check_same_file", "Context", "DistributedError", "Launcher", "ProcessGroup",
           "detect_environment", "first_slurm_host", "gather_metrics", "gather_rows", "nccl_communicator",
           "parse_devices", "planned_world_size", "setup",
           "timeout_seconds"]

DEFAULT_TIMEOUT_S = _C.DIST_TIMEOUT_S
DistributedError = _C.DistributedError
STRATEGIES = ("auto", "ddp")
_STOP_GRACE_S = 10.0  # how long a failing rank 0 lets the ranks it started exit before it kills them


# ---- where this process stands -----------------------------------------------------------------------

@dataclass(frozen=True)
class ClusterEnv:
    """A rank as a launcher described it. ``launcher``: "torchrun", "ptl" (started by ptl), "env" (other
    RANK/WORLD_SIZE launchers) or "slurm"."""
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    master_addr: str
    master_port: int


def _env_int(environ, name, default=None, minimum=0):
    text = environ.get(name)
    if text is None or text.strip() == "":
        if default is None:
            raise ValueError("environment: %s is not set" % name)
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError("environment: %s=%r is not an integer" % (name, text)) from None
    if value < minimum:
        raise ValueError("environment: %s=%d, expected >= %d" % (name, value, minimum))
    return value


def first_slurm_host(nodelist):
    """The first host of a SLURM node list: ``"gpu[07-09,12],cpu3"`` -> ``"gpu07"``, ``"r[1-2]-n[3-4]"`` ->
    ``"r1-n3"``, ``"a b"`` -> ``"a"``."""
    out, i, text = [], 0, nodelist.strip()
    while i < len(text) and text[i] not in ", ":
        if text[i] == "[":
            end = text.find("]", i)
            if end < 0:
                raise ValueError("SLURM_NODELIST=%r: unbalanced '['" % nodelist)
            out.append(re.split(r"[,-]", text[i + 1:end])[0])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    host = "".join(out)
    if not host:
        raise ValueError("SLURM_NODELIST=%r names no host" % nodelist)
    return host


def detect_environment(environ=None):
    """The :class:`ClusterEnv` a launcher set up for this process, or None when no launcher did (see the
    module documentation for the variables and their precedence)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _env_int(env, "WORLD_SIZE", minimum=1)
        rank = _env_int(env, "RANK")
        if rank >= world:
            raise ValueError("environment: RANK=%d but WORLD_SIZE=%d" % (rank, world))
        launcher = "ptl" if "PTL_LAUNCHER_PID" in env else "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env"
        local = _env_int(env, "LOCAL_RANK", rank)
        node = _env_int(env, "NODE_RANK", _env_int(env, "GROUP_RANK", 0))
        port = _env_int(env, "MASTER_PORT", 0) if world == 1 else _env_int(env, "MASTER_PORT", minimum=1)
        return ClusterEnv(launcher, rank, world, local, node, env.get("MASTER_ADDR") or "127.0.0.1", port)
    ntasks = env.get("SLURM_NTASKS")
    if (ntasks and "SLURM_PROCID" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")
            and _env_int(env, "SLURM_NTASKS", minimum=1) > 1):
        world = _env_int(env, "SLURM_NTASKS", minimum=1)
        rank = _env_int(env, "SLURM_PROCID")
        if rank >= world:
            raise ValueError("environment: SLURM_PROCID=%d but SLURM_NTASKS=%d" % (rank, world))
        addr = env.get("MASTER_ADDR") or first_slurm_host(env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST")
                                                           or "127.0.0.1")
        job = env.get("SLURM_JOB_ID", "")
        default_port = 15000 + int(job[-4:]) if job[-4:].isdigit() else 12910
        return ClusterEnv("slurm", rank, world, _env_int(env, "SLURM_LOCALID", 0), _env_int(env, "SLURM_NODEID", 0),
                          addr, _env_int(env, "MASTER_PORT", default_port, minimum=1))
    return None


def timeout_seconds(timeout=None, environ=None):
    """The seconds any one wait may take: ``timeout``, else ``PTL_DIST_TIMEOUT``, else ``DEFAULT_TIMEOUT_S``."""
    env = os.environ if environ is None else environ
    if timeout is None and env.get("PTL_DIST_TIMEOUT"):
        try:
            timeout = float(env["PTL_DIST_TIMEOUT"])
        except ValueError:
            raise ValueError("environment: PTL_DIST_TIMEOUT=%r is not a number of seconds"
                             % env["PTL_DIST_TIMEOUT"]) from None
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError("timeout: expected seconds > 0, got %r" % (timeout,))
    return float(timeout)


def parse_devices(devices, accelerator, available=None):
    """The devices of one node: a list of CUDA ordinals, or for the CPU a list of that many ``None`` (one
    process each). ``devices``: an int N (the first N GPUs; N CPU processes), a list of GPU ordinals, a
    string of them (``"0,1"``), ``-1`` or ``"auto"`` (every visible GPU; one CPU process). ``available``:
    the GPU count (default: ``ptl.cuda.device_count()``)."""
    if accelerator not in ("cpu", "cuda"):
        raise ValueError("accelerator: expected 'cpu' or 'cuda', got %r" % (accelerator,))
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            devices = "auto"
        elif re.fullmatch(r"-?\d+", text):
            devices = int(text)
        elif re.fullmatch(r"\d+(\s*,\s*\d+)*,?", text):
            devices = [int(t) for t in text.split(",") if t.strip()]
        else:
            raise ValueError("devices: expected an int, a list of GPU ordinals, '0,1,...' or 'auto', got %r" % devices)
    if accelerator == "cpu":
        if devices == "auto":
            return [None]
        if isinstance(devices, (list, tuple)):
            raise ValueError("devices: the CPU takes a number of processes, not a list %r" % (devices,))
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError("devices: expected a number of CPU processes >= 1, got %r" % (devices,))
        return [None] * devices
    if available is None:
        from . import cuda
        available = cuda.device_count()
    if available == 0:
        raise ValueError("devices=%r on CUDA: no CUDA device is available" % (devices,))
    if devices == "auto" or devices == -1:
        ids = list(range(available))
    elif isinstance(devices, (list, tuple)):
        ids = list(devices)
        if not ids or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in ids):
            raise ValueError("devices: expected GPU ordinals >= 0, got %r" % (devices,))
        if len(set(ids)) != len(ids):
            raise ValueError("devices: %r names a GPU twice" % (devices,))
    elif isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1:
        ids = list(range(devices))
    else:
        raise ValueError("devices: expected an int >= 1, a list of GPU ordinals, -1 or 'auto', got %r" % (devices,))
    if not ids:
        raise ValueError("devices: no CUDA device is visible")
    missing = [d for d in ids if d >= available]
    if missing:
        raise ValueError("devices: GPU %s requested but this node has %d" % (", ".join(map(str, missing)), available))
    return ids


def planned_world_size(accelerator, devices, num_nodes=1, environ=None):
    """The ranks of the job this process is part of: the launcher's world size, else devices x num_nodes
    (``accelerator`` "auto" is the GPU when one is visible). ``devices="auto"`` counts one device here, as
    the Trainer does until the data-parallel step exists."""
    env = detect_environment(environ)
    if env is not None:
        return env.world_size
    if accelerator == "auto":
        from . import cuda
        accelerator = "cuda" if cuda.is_available() else "cpu"
    return len(parse_devices(1 if devices == "auto" else devices, accelerator)) * num_nodes


# ---- starting the node's other ranks -----------------------------------------------------------------

def _command_again():
    """This process's command, to run once more for another rank (Lightning's rule: ``-m module`` when run as
    one, else the script). Raises ValueError where there is none."""
    import __main__
    interactive = hasattr(sys, "ps1") or bool(sys.flags.interactive)
    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name and not interactive:
        return [sys.executable, "-m", spec.name] + sys.argv[1:]
    script = sys.argv[0] if sys.argv else ""
    if interactive or script in ("", "-c", "-") or not os.path.isfile(script):
        raise ValueError("devices > 1: ptl starts the other ranks by running this command again, which cannot be "
                         "done from python -c, a REPL or a notebook (Lightning's 'ddp' strategy has the same rule). "
                         "Run a script (python train.py), or start the ranks with torchrun or srun")
    return [sys.executable, os.path.abspath(script)] + sys.argv[1:]


class Launcher:
    """Starts ranks ``first + 1 .. first + count - 1`` of this node as copies of this process's command and
    watches them. ``check()`` raises :class:`DistributedError` once one has exited with an error (the host
    collectives call it while they wait); ``wait`` collects them at the end; ``stop`` ends them."""

    def __init__(self, first_rank, count, world_size, node_rank, master_addr, master_port, timeout_s, command=None):
        self.command = list(command) if command is not None else _command_again()
        self.first_rank, self.count, self.world_size = first_rank, count, world_size
        self.node_rank, self.master_addr, self.master_port = node_rank, master_addr, master_port
        self.timeout_s = timeout_s
        self.children = []  # (rank, Popen)

    def start(self):
        for local in range(1, self.count):
            env = dict(os.environ)
            env.update({"RANK": str(self.first_rank + local), "LOCAL_RANK": str(local),
                        "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(self.count),
                        "NODE_RANK": str(self.node_rank), "MASTER_ADDR": self.master_addr,
                        "MASTER_PORT": str(self.master_port), "PTL_LAUNCHER_PID": str(os.getpid()),
                        "PTL_DIST_TIMEOUT": repr(self.timeout_s)})
            try:
                proc = subprocess.Popen(self.command, env=env)
            except OSError as exc:
                self.stop()
                raise DistributedError("ptl.distributed: cannot start rank %d (%s): %s"
                                       % (self.first_rank + local, " ".join(self.command), exc)) from None
            self.children.append((self.first_rank + local, proc))
        atexit.register(self.stop)  # a rank 0 that ends without close() still ends the ranks it started
        return self

    def check(self):
        for rank, proc in self.children:
            code = proc.poll()
            if code:
                raise DistributedError("ptl.distributed: rank %d (pid %d) exited with %s (its own output says why)"
                                       % (rank, proc.pid, _status(code)))

    def wait(self, timeout_s=None):
        """Waits for every started rank to exit (at most timeout_s, default the job's timeout, then they are
        stopped); raises DistributedError naming the first that failed."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        try:
            for rank, proc in self.children:
                left = deadline - time.monotonic()
                try:
                    code = proc.wait(max(left, 0.0))
                except subprocess.TimeoutExpired:
                    raise DistributedError("ptl.distributed: rank %d (pid %d) has not exited %.0f s after rank 0 "
                                           "finished; it was stopped" % (rank, proc.pid, self.timeout_s)) from None
                if code:
                    raise DistributedError("ptl.distributed: rank %d (pid %d) exited with %s"
                                           % (rank, proc.pid, _status(code)))
        finally:
            self.stop()

    def stop(self, grace_s=_STOP_GRACE_S):
        """Lets the started ranks exit for grace_s seconds (they fail on their own once rank 0's connections
        close), then terminates and finally kills any that are left."""
        deadline = time.monotonic() + grace_s
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            alive = [p for _, p in self.children if p.poll() is None]
            for p in alive if sig is not None else ():
                p.send_signal(sig)
            for p in alive:
                try:
                    p.wait(max(deadline - time.monotonic(), 0.0) if sig is None else 5.0)
                except subprocess.TimeoutExpired:
                    pass


def _status(code):
    if code < 0:
        try:
            return "signal %s" % signal.Signals(-code).name
        except ValueError:
            return "signal %d" % -code
    return "status %d" % code


# ---- the group --------------------------------------------------------------------------------------

def _pack_arrays(arrays):
    """A dict of NumPy arrays as bytes: a JSON header (name, dtype, shape) and the raw data (no pickle)."""
    header, chunks = [], []
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        header.append([name, a.dtype.str, list(a.shape)])
        chunks.append(a.tobytes())
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + b"".join(chunks)


def _unpack_arrays(blob):
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n].decode())
    out, off = {}, 8 + n
    for name, dtype, shape in header:
        dt = np.dtype(dtype)
        size = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        out[name] = np.frombuffer(blob, dt, size // dt.itemsize if dt.itemsize else 0, off).reshape(shape).copy()
        off += size
    return out


class ProcessGroup:
    """The ranks of one job, connected through rank 0 (the rendezvous is in ``join``). Every collective must
    be called by every rank in the same order; each raises :class:`DistributedError` naming the rank that
    failed, exited or timed out. ``watch``: a callable run every 100 ms while waiting (the launcher's check)."""

    def __init__(self, group, watch=None):
        self._g, self._watch = group, watch
        info = group.info()
        self.rank, self.world_size = info["rank"], info["world"]

    @classmethod
    def join(cls, rank, world_size, master_addr, master_port, timeout_s=None, listen_fd=-1, watch=None):
        """Rank 0 admits the others (on listen_fd, from ``listen``, or on master_port); the others connect to
        master_addr:master_port, retrying until the timeout."""
        g = _C.dist_join(master_addr, int(master_port), int(rank), int(world_size), timeout=timeout_seconds(timeout_s),
                         listen_fd=listen_fd, watch=watch)
        return cls(g, watch)

    @staticmethod
    def listen(port=0):
        """Rank 0's listening socket before the others start: (fd, port); port 0 takes a free one."""
        return _C.dist_listen(int(port))

    @property
    def timeout(self):
        """Seconds any one collective may wait."""
        return self._g.info()["timeout"]

    @timeout.setter
    def timeout(self, seconds):
        self._g.set_timeout(timeout_seconds(seconds))

    def barrier(self):
        self._g.barrier(watch=self._watch)

    def all_reduce_(self, buf):
        """In place: ``buf`` (a contiguous float32/float64 NumPy array or CPU ptl.Tensor) becomes the sum over
        ranks, added in rank order, identical on every rank."""
        self._g.all_reduce_(buf, watch=self._watch)
        return buf

    def broadcast_(self, buf):
        """In place: every rank's ``buf`` (a writable contiguous buffer of one size everywhere) gets rank 0's."""
        self._g.broadcast_(buf, watch=self._watch)
        return buf

    def broadcast_bytes(self, data=None):
        return self._g.broadcast_bytes(data if self.rank == 0 else None, watch=self._watch)

    def broadcast_object(self, obj=None):
        """Rank 0's JSON-serialisable ``obj`` on every rank."""
        raw = self.broadcast_bytes(json.dumps(obj).encode() if self.rank == 0 else None)
        return json.loads(raw.decode())

    def all_gather_bytes(self, data):
        """[rank 0's bytes, rank 1's, ...] on every rank."""
        return self._g.all_gather(bytes(data), watch=self._watch)

    def all_gather_arrays(self, arrays):
        """Every rank's dict of NumPy arrays, as a list in rank order."""
        return [_unpack_arrays(b) for b in self.all_gather_bytes(_pack_arrays(arrays))]

    def any(self, flag):
        """True on every rank when ``flag`` is true on any (a decision all ranks must share, e.g. stopping)."""
        v = np.array([1.0 if flag else 0.0])
        return bool(self.all_reduce_(v)[0] > 0)

    def abort(self, reason):
        """Fails the job on purpose, telling every rank why (through rank 0); never waits."""
        self._g.abort(str(reason))

    def close(self):
        self._g.close()


# ---- one job's context ------------------------------------------------------------------------------

class Context:
    """This process's place in a job: ``rank``, ``local_rank``, ``node_rank``, ``world_size``, ``device``
    (its CUDA ordinal, or None on the CPU), ``group`` (None for one process), ``launcher`` (the node's first
    rank when ptl started the others)."""

    def __init__(self, rank=0, local_rank=0, node_rank=0, world_size=1, device=None, group=None, launcher=None,
                 env=None):
        self.rank, self.local_rank, self.node_rank, self.world_size = rank, local_rank, node_rank, world_size
        self.device, self.group, self.launcher, self.env = device, group, launcher, env

    @property
    def is_global_zero(self):
        return self.rank == 0

    def any(self, flag):
        return self.group.any(flag) if self.group is not None else bool(flag)

    def close(self, error=None):
        """Ends the job on this rank. Success: a last barrier, then rank 0 waits for the ranks it started.
        ``error`` (the exception that ends this rank): every rank is told, and started ranks are stopped."""
        if self.group is None:
            return
        try:
            if error is not None:
                self.group.abort("%s: %s" % (type(error).__name__, error))
            else:
                self.group.barrier()
        finally:
            self.group.close()
            if self.launcher is not None:
                if error is not None:
                    self.launcher.stop()
                else:
                    self.launcher.wait()


def nccl_communicator(ctx, timeout=None):
    """The NCCL communicator of this GPU rank: rank 0 makes the ncclUniqueId, the host group carries it to
    the others, every rank joins on its GPU (``ctx.device``). NCCL is opened here (the ``nvidia-nccl-cu13``
    wheel or the system's); a missing one, or any NCCL failure, raises :class:`ptl.CudaError`."""
    if ctx.group is None or ctx.device is None:
        raise ValueError("nccl_communicator: needs a job of several GPU ranks, got %d rank(s) on %s"
                         % (ctx.world_size, "the CPU" if ctx.device is None else "cuda:%d" % ctx.device))
    uid = ctx.group.broadcast_bytes(_C.nccl_unique_id() if ctx.rank == 0 else None)
    return _C.nccl_comm(uid, ctx.world_size, ctx.rank, ctx.device, timeout_seconds(timeout))


def setup(accelerator="cpu", devices=1, num_nodes=1, strategy="auto", timeout=None, environ=None, command=None):
    """This process's :class:`Context`: detects a launcher (module documentation) or starts the node's other
    ranks, then joins the group. One process (world size 1) needs no group and starts nothing."""
    env_vars = os.environ if environ is None else environ
    if strategy not in STRATEGIES:
        raise ValueError("strategy: expected one of %s, got %r" % (", ".join(map(repr, STRATEGIES)), strategy))
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError("num_nodes: expected an int >= 1, got %r" % (num_nodes,))
    timeout_s = timeout_seconds(timeout, env_vars)
    env = detect_environment(env_vars)
    if env is not None:
        per_node = parse_devices(devices, accelerator) if devices != "auto" or accelerator == "cuda" else None
        if per_node is not None and devices != "auto" and len(per_node) * num_nodes != env.world_size:
            raise ValueError("devices=%r x num_nodes=%d make %d ranks, but the %s launcher started %d"
                             % (devices, num_nodes, len(per_node) * num_nodes, env.launcher, env.world_size))
        device = None
        if accelerator == "cuda" and devices == "auto" and len(per_node) == 1:
            device = per_node[0]  # a launcher that gives each process one visible GPU
        elif accelerator == "cuda":
            if env.local_rank >= len(per_node):
                raise ValueError("LOCAL_RANK=%d but this node has %d GPUs for ptl (devices=%r)"
                                 % (env.local_rank, len(per_node), devices))
            device = per_node[env.local_rank]
        group = None
        if env.world_size > 1:
            group = ProcessGroup.join(env.rank, env.world_size, env.master_addr, env.master_port, timeout_s)
        return Context(env.rank, env.local_rank, env.node_rank, env.world_size, device, group, None, env)
    per_node = parse_devices(devices, accelerator)
    world = len(per_node) * num_nodes
    if world == 1:
        return Context(device=per_node[0])
    node = _env_int(env_vars, "NODE_RANK", 0)
    if node >= num_nodes:
        raise ValueError("environment: NODE_RANK=%d but num_nodes=%d" % (node, num_nodes))
    addr = env_vars.get("MASTER_ADDR") or ("127.0.0.1" if num_nodes == 1 else None)
    port = _env_int(env_vars, "MASTER_PORT", 0)
    if addr is None or (node > 0 and port == 0):
        raise ValueError("num_nodes=%d: every node's process needs MASTER_ADDR and MASTER_PORT (node 0's address "
                         "and a free port there) and its NODE_RANK" % num_nodes)
    rank = node * len(per_node)
    listen_fd = -1
    if rank == 0:
        listen_fd, port = ProcessGroup.listen(port)
    try:
        launcher = Launcher(rank, len(per_node), world, node, addr, port, timeout_s, command).start()
    except BaseException:
        if listen_fd >= 0:
            os.close(listen_fd)
        raise
    try:
        group = ProcessGroup.join(rank, world, addr, port, timeout_s, listen_fd=listen_fd, watch=launcher.check)
    except BaseException:
        launcher.stop()
        raise
    return Context(rank, 0, node, world, per_node[0], group, launcher, None)


def check_same_file(group, path, what="ckpt_path"):
    """Raises ValueError on every rank unless every rank's ``path`` holds the same bytes (resuming: every rank
    must start from one checkpoint, also when the nodes do not share a file system)."""
    import hashlib
    with open(path, "rb") as f:
        mine = hashlib.sha256(f.read()).hexdigest()
    seen = [d.decode() for d in group.all_gather_bytes(mine.encode())] if group is not None else [mine]
    if len(set(seen)) > 1:
        odd = [r for r, d in enumerate(seen) if d != seen[0]]
        raise ValueError("%s: %s differs between ranks (rank(s) %s hold other bytes than rank 0): every rank must "
                         "resume from the same checkpoint" % (what, path, ", ".join(map(str, odd))))


# ---- validation statistics --------------------------------------------------------------------------

def gather_rows(group, keys, rows):
    """Every rank's ``rows`` (an (n, k) array, one row per key; (0, k) when it has none) on every rank, ordered
    by ``keys`` (int64, unique over ranks): for the per-batch validation losses keyed by the global batch
    index, whose sum in that order is the single-process sum. Returns (keys, rows) of all ranks."""
    keys = np.asarray(keys, np.int64).reshape(-1)
    rows = np.asarray(rows)
    if rows.ndim != 2 or len(rows) != len(keys):
        raise ValueError("gather_rows: expected one row per key, an (%d, k) array, got shape %s"
                         % (len(keys), rows.shape))
    parts = group.all_gather_arrays({"keys": keys, "rows": rows}) if group is not None else [
        {"keys": keys, "rows": rows}]
    all_keys = np.concatenate([p["keys"] for p in parts])
    all_rows = np.concatenate([p["rows"] for p in parts]) if parts else rows
    order = np.argsort(all_keys, kind="stable")
    if len(np.unique(all_keys)) != len(all_keys):
        raise ValueError("gather_rows: a key was given by two ranks")
    return all_keys[order], all_rows[order]


def gather_metrics(group, met, keys):
    """A :class:`ptl.metrics.DetectionMetrics` holding every rank's images in the order of ``keys``: one
    int64 per ``met.update`` call, the image's position in the single-process validation order (global
    batch index * val batch size + position in the batch). With the same weights and batches this equals
    the single-process accumulation (per-image matches, scores, classes, image classes, and the confusion
    matrix, a sum of counts), so ``compute()`` gives the single-process metrics exactly."""
    from .metrics import IOU_THRESHOLDS, DetectionMetrics
    keys = np.asarray(keys, np.int64).reshape(-1)
    if len(keys) != len(met._tp):
        raise ValueError("gather_metrics: %d keys for %d images" % (len(keys), len(met._tp)))
    cat = lambda xs, dt, shape: np.concatenate(xs).astype(dt) if xs else np.zeros(shape, dt)  # noqa: E731
    mine = {"keys": keys, "n_pred": np.array([len(c) for c in met._conf], np.int64),
            "n_gt": np.array([len(g) for g in met._gt], np.int64),
            "tp": cat(met._tp, np.uint8, (0, len(IOU_THRESHOLDS))), "conf": cat(met._conf, np.float64, (0,)),
            "cls": cat(met._cls, np.int64, (0,)), "gt": cat(met._gt, np.int64, (0,))}
    if met.confusion is not None:
        mine["confusion"] = met.confusion.matrix
    parts = group.all_gather_arrays(mine) if group is not None else [mine]
    images = []
    for p in parts:
        po, go = np.concatenate([[0], np.cumsum(p["n_pred"])]), np.concatenate([[0], np.cumsum(p["n_gt"])])
        for i, key in enumerate(p["keys"]):
            images.append((int(key), p["tp"][po[i]:po[i + 1]].astype(bool), p["conf"][po[i]:po[i + 1]],
                           p["cls"][po[i]:po[i + 1]], p["gt"][go[i]:go[i + 1]]))
    images.sort(key=lambda im: im[0])
    if len({im[0] for im in images}) != len(images):
        raise ValueError("gather_metrics: an image key was given by two ranks")
    out = DetectionMetrics(met.names, met.num_classes, met.confusion_conf)
    for _, tp, conf, cls, gt in images:
        out._tp.append(tp)
        out._conf.append(conf)
        out._cls.append(cls)
        out._gt.append(gt)
        out._img.append(np.unique(gt))
    if out.confusion is not None:
        for p in parts:
            out.confusion.matrix += p["confusion"]
    return out
