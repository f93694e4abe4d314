"""The optimizer on flat buffers (Ultralytics 8.4.190's rules, docs/ultralytics_parity.md): parameter
groups, MuSGD / SGD / AdamW, schedules, the
gradient clip, the fp16 loss scaler, the EMA, state export/import and digests.

All parameters live in one flat float32 buffer (the network's parameter table gives each name an offset
and a shape); gradients, optimizer state and the EMA use the same layout. Python builds the groups and a
compact table once; one ``step()`` is a handful of C launches over the flat memory, with no host sync:
the clip coefficient, the Inf/NaN flag and the loss scale stay on the device.

Schedules are pure functions of (epoch, iteration, config), so a resumed fit continues exactly.
"""
import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from . import _C
from .hparams_check import OPTIMIZERS, check_choice, check_optim_config

# Layouts and defaults come from csrc/optim/optim.h (one source), exported by the extension.
DEFAULTS = _C.OPTIM_DEFAULTS
CHUNK = DEFAULTS["chunk"]         # elements per chunk of the C tables
NS_ALIGN = DEFAULTS["ns_align"]   # bf16 elements (512 bytes): every Newton-Schulz matrix starts aligned like
                                  # a fresh torch allocation, so cuBLAS picks the same kernels as torch's loop
MUON_W, SGD_W = DEFAULTS["muon_w"], DEFAULTS["sgd_w"]  # MuSGD shares (build_optimizer's muon, sgd)
NS_COEFFS = DEFAULTS["ns_coeffs"]
KINDS = DEFAULTS["kinds"]
PT = {name: i for i, name in enumerate(_C.OPTIM_TABLE_COLUMNS)}  # columns of the parameter table
S = {name: i for i, name in enumerate(_C.OPTIM_SCALARS)}         # slots of the scalar-state buffer
_S_N = _C.OPTIM_NUM_SCALARS
SCALE_INDEX = S["scale"]  # where Optimizer.scalars keeps the loss scale (read on the device by the objective)


# ---------------------------------------------------------------------------------------------------
# parameter tables and groups


@dataclass(frozen=True)
class ParamSpec:
    """One named parameter: a view of `shape` at element `offset` of a flat buffer."""
    name: str
    offset: int
    shape: tuple
    is_norm: bool = None  # BatchNorm weight; None: decided from the name (a `.bn.` module)

    @property
    def numel(self):
        return math.prod(self.shape)


def param_specs(table):
    """Normalises a parameter table: ParamSpec, (name, offset, shape[, is_norm]) tuples or dicts with
    name/offset/shape keys, or a {name: (offset, shape)} dict. Checks offsets and overlaps."""
    if isinstance(table, dict):
        table = [(k,) + tuple(v) for k, v in table.items()]
    out = []
    for i, e in enumerate(table):
        if isinstance(e, ParamSpec):
            s = e
        elif isinstance(e, dict):
            s = ParamSpec(e["name"], int(e["offset"]), tuple(int(d) for d in e["shape"]), e.get("is_norm"))
        else:
            e = tuple(e)
            if len(e) not in (3, 4):
                raise ValueError("table: entry %d must be (name, offset, shape[, is_norm]), got %r" % (i, e))
            s = ParamSpec(str(e[0]), int(e[1]), tuple(int(d) for d in e[2]), e[3] if len(e) == 4 else None)
        if s.offset < 0 or any(d <= 0 for d in s.shape):
            raise ValueError("table: parameter %r has offset %d and shape %r" % (s.name, s.offset, s.shape))
        out.append(s)
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ValueError("table: duplicate parameter names")
    spans = sorted((s.offset, s.offset + s.numel, s.name) for s in out)
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ValueError("table: parameters %r and %r overlap" % (an, bn))
    return out


def _is_norm_weight(s):
    if s.is_norm is not None:
        return bool(s.is_norm)
    parts = s.name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and (parts[-2] == "bn" or "norm" in parts[-2].lower())


HEAD_INDEX = "23"  # the Detect layer of every YOLO26 scale


def _is_head_cls(name):
    """The parameters of the head's class branches, cv3 and one2one_cv3, train at 3x lr under MuSGD
    (8.4.190 picks them by module, not by name pattern)."""
    parts = name.split(".")
    return len(parts) > 3 and parts[0] == "model" and parts[1] == HEAD_INDEX and parts[2] in ("cv3", "one2one_cv3")


def param_groups(table, optimizer="MuSGD", lr0=0.01, momentum=0.937, weight_decay=5e-4):
    """Parameter groups as 8.4.190's build_optimizer (MuSGD: weight x3, weight, bn x3, bn, bias x3, bias,
    muon x3, muon; a tensor is Muon's when it has 2 or 4 dimensions) or the three classic groups (weight,
    bn, bias) for SGD/AdamW. `weight_decay` is the scaled value.
    Returns a list of dicts: param_group, kind, lr, initial_lr, momentum, weight_decay, params (indices
    into the table)."""
    specs = param_specs(table)
    opt = check_choice("optimizer", optimizer, OPTIMIZERS[1:], fold_case=True)
    use_muon = opt == "MuSGD"
    cls = {"weight": [], "bn": [], "bias": [], "muon": []}
    for i, s in enumerate(specs):
        if len(s.shape) in (2, 4) and use_muon:
            cls["muon"].append(i)
        elif "bias" in s.name:
            cls["bias"].append(i)
        elif _is_norm_weight(s):
            cls["bn"].append(i)
        else:
            cls["weight"].append(i)
    decay = {"weight": weight_decay, "bn": 0.0, "bias": 0.0, "muon": weight_decay}
    kind = {"SGD": "sgd", "AdamW": "adamw", "MuSGD": "sgd"}[opt]
    groups = []
    for name in (("weight", "bn", "bias", "muon") if use_muon else ("weight", "bn", "bias")):
        k = "muon" if name == "muon" else kind
        base = dict(param_group=name, kind=k, momentum=momentum, weight_decay=decay[name])
        if use_muon:
            fast = [i for i in cls[name] if _is_head_cls(specs[i].name)]
            rest = [i for i in cls[name] if not _is_head_cls(specs[i].name)]
            groups.append(dict(base, lr=lr0 * 3, initial_lr=lr0 * 3, params=fast))
            groups.append(dict(base, lr=lr0, initial_lr=lr0, params=rest))
        else:
            groups.append(dict(base, lr=lr0, initial_lr=lr0, params=cls[name]))
    return groups


# ---------------------------------------------------------------------------------------------------
# configuration and schedules (pure functions)


@dataclass
class OptimConfig:
    """default.yaml's values that drive the optimizer and its schedules."""
    optimizer: str = "auto"
    epochs: int = 100
    batch: int = 16
    nbs: int = 64
    lr0: float = 0.01
    lrf: float = 0.01
    momentum: float = 0.937
    weight_decay: float = 5e-4
    warmup_epochs: float = 3.0
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    cos_lr: bool = False
    max_norm: float = DEFAULTS["max_norm"]
    ema_decay: float = 0.9999
    ema_tau: float = 2000.0
    nc: int = 80
    n_train_images: int = 0

    def __post_init__(self):  # a bad value is a ConfigError naming the field, before any work
        check_optim_config(self)


def choose_optimizer(cfg):
    """optimizer=auto as 8.4.190: MuSGD (lr 0.01) for more than 10000 iterations, else AdamW with
    lr round(0.002 * 5 / (4 + nc), 6); momentum 0.9 and warm-up bias lr 0 either way.
    Returns (name, lr0, construction momentum, warmup_bias_lr)."""
    name = check_choice("optimizer", cfg.optimizer, OPTIMIZERS, fold_case=True)
    if name == "auto":
        iterations = math.ceil(cfg.n_train_images / max(cfg.batch, cfg.nbs)) * cfg.epochs
        if iterations > 10000:
            return "MuSGD", 0.01, 0.9, 0.0
        return "AdamW", round(0.002 * 5 / (4 + cfg.nc), 6), 0.9, 0.0
    return name, cfg.lr0, cfg.momentum, cfg.warmup_bias_lr


def accumulate_steps(batch, nbs=64):
    """Batches summed per optimizer step, uncapped: max(round(nbs / batch), 1) (it scales the decay)."""
    return max(round(nbs / batch), 1)


def scaled_weight_decay(weight_decay, batch, nbs=64):
    """Weight decay actually used, fixed at setup: weight_decay * batch * accumulate / nbs."""
    return weight_decay * batch * accumulate_steps(batch, nbs) / nbs


def nominal_accumulate(cfg, batches_per_epoch):
    """8.4.190's ``acc0``: accumulate_steps capped at the fit's batch count (nb * epochs), the value the
    warm-up ramps to and keeps after it."""
    return min(accumulate_steps(cfg.batch, cfg.nbs), batches_per_epoch * cfg.epochs)


def linear_lf(epoch, epochs, lrf):
    return max(1 - epoch / epochs, 0) * (1.0 - lrf) + lrf


def cosine_lf(epoch, epochs, lrf):
    return max((1 - math.cos(epoch * math.pi / epochs)) / 2, 0) * (lrf - 1) + 1


def lr_factor(epoch, cfg):
    """lf(epoch), linear by default, cosine with cfg.cos_lr (LambdaLR, set at each epoch's start)."""
    return (cosine_lf if cfg.cos_lr else linear_lf)(epoch, cfg.epochs, cfg.lrf)


def warmup_iters(batches_per_epoch, warmup_epochs=3.0, epochs=100):
    """8.4.190's warm-up length: round(min(warmup_epochs, epochs - 1) * nb) batches (the last epoch is
    never warm-up), 0 for none. Warm-up runs while 0 < nw and ni <= nw."""
    we = min(warmup_epochs, max(epochs - 1, 0))
    return round(we * batches_per_epoch) if we > 0 else 0


def accumulate_at(ni, nw, acc0):
    """Batches summed per optimizer step at global batch ni: during warm-up
    max(1, round(interp(ni, [0, nw], [1, acc0]))), after it acc0 (nominal_accumulate)."""
    if 0 < nw and ni <= nw:
        return max(1, int(np.round(np.interp(ni, [0, nw], [1, acc0]))))
    return acc0


def _interp(x, x1, y0, y1):
    return float(np.interp(x, [0, x1], [y0, y1]))


def group_hparams(groups, epoch, ni, nw, cfg, warmup_bias_lr, construct_momentum):
    """Learning rate and momentum of each group at (epoch, ni). During warm-up (0 < nw, ni <= nw) the bias
    lr falls from warmup_bias_lr and the others rise from 0 to initial_lr * lf(epoch), the momentum rises
    from warmup_momentum to momentum; after it the lr is initial_lr * lf(epoch) and the momentum keeps
    cfg.momentum (its value at ni = nw), or the construction value when there is no warm-up. AdamW groups
    have no momentum to warm (beta1 stays at the construction value)."""
    f = lr_factor(epoch, cfg)
    warm = 0 < nw and ni <= nw
    lrs, moms = [], []
    for g in groups:
        target = g["initial_lr"] * f
        if warm:
            start = warmup_bias_lr if g["param_group"] == "bias" else 0.0
            lrs.append(_interp(ni, nw, start, target))
            mom = _interp(ni, nw, cfg.warmup_momentum, cfg.momentum)
        else:
            lrs.append(target)
            mom = cfg.momentum if nw > 0 else construct_momentum
        moms.append(construct_momentum if g["kind"] == "adamw" else mom)
    return lrs, moms


def ema_decay(updates, decay=OptimConfig.ema_decay, tau=OptimConfig.ema_tau):
    """ModelEMA's ramp: d = 0.9999 (1 - exp(-updates / 2000))."""
    return decay * (1 - math.exp(-updates / tau))


# ---------------------------------------------------------------------------------------------------
# the C tables


def _build_plan(specs, groups, n, ns_batched=True, frozen=frozenset()):
    """The int64 tables of csrc/optim/optim.h: ptab, call, cmuon, sgtab, and the arena sizes.
    ns_batched=False gives every matrix its own row of sgtab (one GEMM per matrix, as torch's loop).
    frozen: indices of parameters that keep their group but are in no chunk and no Newton-Schulz batch
    (flagged in ptab), so they are never updated and never counted by the clip norm."""
    group_of = np.full(len(specs), -1, np.int64)
    for k, g in enumerate(groups):
        for i in g["params"]:
            group_of[i] = k
    if (group_of < 0).any():
        raise ValueError("groups: parameter %r is in no group" % specs[int(np.argmin(group_of))].name)
    ptab = np.zeros((len(specs), len(PT)), np.int64)
    call, cmuon = [], []
    shapes = {}  # (r, c) wide orientation -> list of parameter indices
    for i, s in enumerate(specs):
        if s.offset + s.numel > n:
            raise ValueError("table: parameter %r ends at %d beyond the flat buffer (%d elements)"
                             % (s.name, s.offset + s.numel, n))
        rows = s.shape[0] if len(s.shape) >= 2 else 1
        cols = s.numel // rows
        d2, d1 = (s.shape[-2], s.shape[-1]) if len(s.shape) >= 2 else (1, 1)
        for col, v in (("off", s.offset), ("numel", s.numel), ("rows", rows), ("cols", cols), ("group", group_of[i]),
                       ("xoff", -1), ("tall", int(rows > cols)), ("midx", -1), ("d2", d2), ("d1", d1),
                       ("frozen", int(i in frozen))):
            ptab[i, PT[col]] = v
        if i in frozen:
            continue
        for st in range(0, s.numel, CHUNK):
            call.append((s.offset + st, min(CHUNK, s.numel - st), i))
        if groups[group_of[i]]["kind"] == "muon":
            key = (min(rows, cols), max(rows, cols)) + (() if ns_batched else (i,))
            shapes.setdefault(key, []).append(i)
    sgtab, tx, ta, midx = [], 0, 0, 0
    up = lambda v: -(-v // NS_ALIGN) * NS_ALIGN
    for (r, c, *_), members in shapes.items():
        xs, as_ = up(r * c), up(r * r)
        sgtab.append((r, c, len(members), tx, ta, xs, as_))
        for i in members:
            s = specs[i]
            ptab[i, PT["xoff"]], ptab[i, PT["midx"]], ptab[i, PT["cfirst"]] = tx, midx, len(cmuon)
            for st in range(0, s.numel, CHUNK):
                cmuon.append((s.offset + st, min(CHUNK, s.numel - st), i))
            ptab[i, PT["ccount"]] = len(cmuon) - ptab[i, PT["cfirst"]]
            tx += xs
            ta += as_
            midx += 1
    as_tab = lambda rows, w: np.asarray(rows, np.int64).reshape(-1, w)
    return dict(ptab=ptab, call=as_tab(call, 3), cmuon=as_tab(cmuon, 3), sgtab=as_tab(sgtab, 7),
                tx=tx, ta=ta, nmuon=midx)


# ---------------------------------------------------------------------------------------------------
# the optimizer


class FlatOptimizer:
    """MuSGD / SGD (nesterov) / AdamW over flat buffers, with clipping, the fp16 loss scaler and the EMA.

    params, grads: 1-D float32 ptl.Tensors (float64 allowed on the CPU) of the same layout; table: the
    network's parameter table (see param_specs). bn_buffers (optional): the flat BatchNorm running
    mean/var buffer, EMA'd with the parameters; bn_table names its entries.
    `param_groups` is a list of dicts like torch's (lr, momentum, initial_lr, weight_decay, ...): set
    lr/momentum there (or use Schedule.apply) before step().
    CUDA options: ns_replay captures the Newton-Schulz work into a CUDA graph on the second step and
    replays it (bit-identical to eager); ns_batched (default) groups same-shape matrices into one
    strided-batched GEMM per product, False issues one GEMM per matrix. With every matrix 512-byte
    aligned the batched form reproduced torch's per-matrix loop in the torchref test (H200).
    ns_bf16 (CPU only) rounds the CPU's Newton-Schulz to bfloat16 at the points CUDA does.
    frozen: names of parameters that are never updated (Ultralytics' freeze: requires_grad=False, so
    torch's optimizers and the clip skip them): they stay in their groups, as 8.4.190 builds them, but get
    no update, decay or momentum and do not count in the clip norm.
    """

    def __init__(self, params, grads, table, optimizer="MuSGD", lr0=0.01, momentum=0.937, weight_decay=5e-4,
                 nesterov=True, max_norm=DEFAULTS["max_norm"], scaler=False, init_scale=2.0 ** 16,
                 growth_interval=DEFAULTS["growth_interval"], bn_buffers=None, bn_table=None, ema=True,
                 ema_decay_max=OptimConfig.ema_decay, ema_tau=OptimConfig.ema_tau, beta2=DEFAULTS["beta2"],
                 eps=DEFAULTS["eps"], muon_w=MUON_W, sgd_w=SGD_W, ns_bf16=False, zero_grad=True, ns_replay=True,
                 ns_batched=True, frozen=()):
        for nm, t in (("params", params), ("grads", grads)):
            if not isinstance(t, _C.Tensor) or t.ndim != 1:
                raise TypeError("%s: expected a 1-D ptl.Tensor" % nm)
        if grads.shape != params.shape or grads.dtype != params.dtype or grads.device != params.device:
            raise ValueError("grads: expected the shape, dtype and device of params")
        if params.dtype not in ("float32", "float64"):
            raise TypeError("params: expected float32 or float64, got %s" % params.dtype)
        self.params, self.grads, self.device, self.dtype = params, grads, params.device, params.dtype
        self.n = params.shape[0]
        self.specs = param_specs(table)
        if not isinstance(optimizer, str):
            raise TypeError("optimizer: expected 'MuSGD', 'SGD' or 'AdamW', got %r" % (optimizer,))
        self.optimizer = check_choice("optimizer", optimizer, OPTIMIZERS[1:], fold_case=True)
        self.param_groups = param_groups(self.specs, self.optimizer, lr0, momentum, weight_decay)
        if not (max_norm is None or max_norm >= 0):
            raise ValueError("max_norm: expected None or >= 0, got %r" % (max_norm,))
        self.nesterov, self.max_norm, self.scaler = bool(nesterov), float(max_norm or 0.0), bool(scaler)
        self.growth_interval, self.beta2, self.eps = int(growth_interval), float(beta2), float(eps)
        self.muon_w, self.sgd_w, self.ns_bf16, self.zero_grad = float(muon_w), float(sgd_w), bool(ns_bf16), zero_grad
        if isinstance(frozen, str):
            raise TypeError("frozen: expected a collection of parameter names, got the string %r" % (frozen,))
        index = {s.name: i for i, s in enumerate(self.specs)}
        unknown = sorted(set(frozen) - set(index))
        if unknown:
            raise ValueError("frozen: not in the parameter table: %s" % ", ".join(map(repr, unknown[:3])))
        self.frozen = [s.name for s in self.specs if s.name in set(frozen)]
        plan = _build_plan(self.specs, self.param_groups, self.n, ns_batched, {index[k] for k in self.frozen})
        self._plan = plan
        dev = self.device
        self._ptab = _C.tensor(plan["ptab"], device=dev)
        self._call = _C.tensor(plan["call"], device=dev)
        self._cmuon = _C.tensor(plan["cmuon"], device=dev)
        self._sgtab = _C.tensor(plan["sgtab"])
        kinds = {g["kind"] for g in self.param_groups}
        self.state1 = _C.zeros((self.n,), dtype=self.dtype, device=dev) if kinds - {"sgd"} else None
        self.state2 = _C.zeros((self.n,), dtype=self.dtype, device=dev)
        sc = np.zeros(_S_N, np.float64 if self.dtype == "float64" else np.float32)
        sc[S["scale"]], sc[S["coef"]] = init_scale if self.scaler else 1.0, 1.0
        self.scalars = _C.tensor(sc, device=dev)
        if dev == "cpu":
            self._ws_bf16 = self._ws_f64 = None
        else:
            self._ws_bf16 = _C.zeros((max(1, 2 * plan["tx"] + 2 * plan["ta"]),), dtype="bfloat16", device=dev)
            nf = len(plan["call"]) + len(plan["cmuon"]) + plan["nmuon"]
            self._ws_f64 = _C.empty((max(1, nf),), dtype="float64", device=dev)
        # CUDA: the Newton-Schulz work of a step (fixed shapes and buffers) is captured once into a CUDA
        # graph and replayed (item 7; bit-identical to eager, see tests). Off, or on the CPU: eager.
        self._ns_graph = _C._optim_ns_graph() if ns_replay and dev != "cpu" and plan["nmuon"] else None
        self.bn_buffers = bn_buffers
        self.bn_specs = param_specs(bn_table) if bn_table is not None else None
        if self.bn_specs is not None:
            shared = {s.name for s in self.bn_specs} & {s.name for s in self.specs}
            if shared:  # both export as "ema.<name>": one would overwrite the other
                raise ValueError("bn_table: names shared with the parameter table: %s" % sorted(shared)[:3])
        self.ema = None
        if ema:
            self.ema = EMA(params, bn_buffers, decay=ema_decay_max, tau=ema_tau)

    # -- stepping

    def step(self):
        """Unscale (scaler), clip, update (skipped on Inf/NaN with the scaler), update the scale, zero the
        gradients, then update the EMA (always, as 8.4.190's optimizer_step). Queues device work only."""
        lrs, momenta, wds = self.group_values()
        _C._optim_step(lrs=lrs, momenta=momenta, wds=wds, **self.step_kwargs())
        if self.ema is not None:
            self.ema.update(self.params, self.bn_buffers)

    def group_values(self):
        """Per group (lr, momentum, weight decay) lists as the step reads them (set by the schedule)."""
        gs = self.param_groups
        return ([float(g["lr"]) for g in gs], [float(g["momentum"]) for g in gs],
                [float(g["weight_decay"]) for g in gs])

    def step_kwargs(self):
        """Everything ``_C._optim_step`` takes except the per-group lrs / momenta / wds: buffers, tables
        and fixed settings (the fused training step holds these for a whole fit)."""
        return dict(params=self.params, grads=self.grads, state1=self.state1, state2=self.state2,
                    scalars=self.scalars, ptab=self._ptab, call=self._call, cmuon=self._cmuon, sgtab=self._sgtab,
                    ws_bf16=self._ws_bf16, ws_f64=self._ws_f64, tx=self._plan["tx"], ta=self._plan["ta"],
                    nmuon=self._plan["nmuon"], kinds=[KINDS[g["kind"]] for g in self.param_groups],
                    muon_w=self.muon_w, sgd_w=self.sgd_w, beta2=self.beta2, eps=self.eps, nesterov=self.nesterov,
                    max_norm=self.max_norm, scaler=self.scaler, growth_interval=self.growth_interval,
                    ns_bf16=self.ns_bf16, zero_grad=bool(self.zero_grad), ns_graph=self._ns_graph)

    @property
    def ns_replay_state(self):
        """'off', 'eager' (before the capture), 'replay', or 'failed: <why>' (then eager for good)."""
        if self._ns_graph is None:
            return "off"
        state, _, why, _ = _C._optim_ns_graph_state(self._ns_graph)
        return ("eager", "replay", "failed: " + why)[state]

    @property
    def ns_lanes(self):
        """The streams the Newton-Schulz products of a stage run on beside each other (CUDA, after the first step;
        1: one stream, as without replay or with ``PTL_NS_LANES=0``)."""
        if self._ns_graph is None:
            return 1
        return _C._optim_ns_graph_state(self._ns_graph)[3] or 1

    # -- scalar state (these read the device: call between steps, not inside one)

    def _scalars(self):
        return self.scalars.numpy().astype(np.float64)

    @property
    def scale(self):
        """Current loss scale (1.0 without the scaler); multiply the loss gradient by it."""
        return float(self._scalars()[S["scale"]])

    @property
    def last_grad_norm(self):
        return float(self._scalars()[S["norm"]])

    @property
    def last_step_skipped(self):
        return bool(self._scalars()[S["found_inf"]])

    @property
    def steps(self):
        return int(self._scalars()[S["step"]])

    # -- state export / import

    def _need_bn_table(self):
        # without names the EMA of the BatchNorm buffers would silently be left out of checkpoints
        if self.ema is not None and self.ema.bn is not None and self.bn_specs is None:
            raise ValueError("bn_table: needed to export or import the EMA of bn_buffers")

    def _views(self, flat):
        """name -> view of a copy of ``flat`` (the views share that copy, not the live buffer)."""
        arr = flat.numpy()
        return {s.name: arr[s.offset:s.offset + s.numel].reshape(s.shape) for s in self.specs}

    def state_dict(self, ema=True):
        """name -> NumPy: per-parameter optimizer state ("m.<name>": Muon momentum / AdamW exp_avg,
        "v.<name>": SGD momentum / AdamW exp_avg_sq), the scaler and step counters ("scalars"), the
        group hyper-parameters and, with ``ema``, the EMA ("ema.<name>" for parameters and BatchNorm
        buffers alike, "ema.updates")."""
        self._need_bn_table()
        out = {}
        if self.state1 is not None:
            out.update({"m." + k: v for k, v in self._views(self.state1).items()})
        out.update({"v." + k: v for k, v in self._views(self.state2).items()})
        out["scalars"] = self._scalars()
        out["groups.lr"] = np.array([g["lr"] for g in self.param_groups], np.float64)
        out["groups.momentum"] = np.array([g["momentum"] for g in self.param_groups], np.float64)
        if ema and self.ema is not None:
            out.update(self.ema.state_dict(self.specs, self.bn_specs))
        return out

    def load_state_dict(self, state, ema=True):
        """Inverse of state_dict (missing per-parameter entries raise KeyError)."""
        self._need_bn_table()
        for prefix, buf in (("m.", self.state1), ("v.", self.state2)):
            if buf is None:
                continue
            _copy_into(buf, _patched(buf, self.specs, state, prefix))
        sc = np.asarray(state["scalars"], np.float64)
        if sc.shape != (_S_N,):
            raise ValueError("scalars: expected %d entries, got shape %r" % (_S_N, sc.shape))
        _copy_into(self.scalars, sc.astype(np.float64 if self.dtype == "float64" else np.float32))
        for key, field_ in (("groups.lr", "lr"), ("groups.momentum", "momentum")):
            vals = np.asarray(state[key], np.float64)
            if vals.shape != (len(self.param_groups),):
                raise ValueError("%s: expected %d groups, got shape %r" % (key, len(self.param_groups), vals.shape))
            for g, v in zip(self.param_groups, vals):
                g[field_] = float(v)
        if ema and self.ema is not None:
            self.ema.load_state_dict(state, self.specs, self.bn_specs)


def _copy_into(dst, arr):
    _C._optim_copy(dst, _C.tensor(np.ascontiguousarray(arr)))


def _patched(buf, specs, state, prefix):
    flat = buf.numpy().copy()
    for s in specs:
        v = np.asarray(state[prefix + s.name])
        if v.shape != tuple(s.shape):
            raise ValueError("%s%s: expected shape %r, got %r" % (prefix, s.name, tuple(s.shape), v.shape))
        flat[s.offset:s.offset + s.numel] = v.reshape(-1)
    return flat


class EMA:
    """Shadow copies of the flat parameters and BN buffers; update k moves them towards the model by
    lerp(ema, model, 1 - d), d = decay (1 - exp(-k / tau)) (8.4.190's ModelEMA)."""

    def __init__(self, params, bn_buffers=None, decay=OptimConfig.ema_decay, tau=OptimConfig.ema_tau, updates=0):
        self.decay_max, self.tau, self.updates = float(decay), float(tau), int(updates)
        self.params = _C.empty(params.shape, dtype=params.dtype, device=params.device)
        _C._optim_copy(self.params, params)
        self.bn = None
        if bn_buffers is not None:
            self.bn = _C.empty(bn_buffers.shape, dtype=bn_buffers.dtype, device=bn_buffers.device)
            _C._optim_copy(self.bn, bn_buffers)

    def decay(self, k):
        return ema_decay(k, self.decay_max, self.tau)

    def update(self, params, bn_buffers=None):
        self.updates += 1
        d = self.decay(self.updates)
        _C._optim_ema(self.params, params, d)
        if self.bn is not None:
            if bn_buffers is None:
                raise ValueError("bn_buffers: the EMA holds BatchNorm buffers; pass them to update()")
            _C._optim_ema(self.bn, bn_buffers, d)

    def state_dict(self, specs, bn_specs=None):
        arr = self.params.numpy()  # a copy: the entries are views of it
        out = {"ema." + s.name: arr[s.offset:s.offset + s.numel].reshape(s.shape) for s in specs}
        if self.bn is not None and bn_specs is not None:
            b = self.bn.numpy()
            out.update({"ema." + s.name: b[s.offset:s.offset + s.numel].reshape(s.shape) for s in bn_specs})
        out["ema.updates"] = np.array(self.updates, np.int64)
        return out

    def load_state_dict(self, state, specs, bn_specs=None):
        _copy_into(self.params, _patched(self.params, specs, state, "ema."))
        if self.bn is not None and bn_specs is not None:
            _copy_into(self.bn, _patched(self.bn, bn_specs, state, "ema."))
        self.updates = int(state["ema.updates"])


# ---------------------------------------------------------------------------------------------------
# schedule driver


@dataclass
class Schedule:
    """Applies 8.4.190's warm-up, accumulation and lr schedule to a FlatOptimizer: call
    `apply(opt, epoch, i)` before each batch and `due(ni)` to ask whether this batch ends an optimizer
    step (then `stepped(ni)`): a step happens when ni - last_opt_step >= accumulate(ni)."""
    cfg: OptimConfig
    batches_per_epoch: int
    warmup_bias_lr: float = 0.0
    construct_momentum: float = 0.937
    last_opt_step: int = -1
    nw: int = field(init=False)
    acc0: int = field(init=False)

    def __post_init__(self):
        self.nw = warmup_iters(self.batches_per_epoch, self.cfg.warmup_epochs, self.cfg.epochs)
        self.acc0 = nominal_accumulate(self.cfg, self.batches_per_epoch)

    def ni(self, epoch, i):
        return i + self.batches_per_epoch * epoch

    def apply(self, opt, epoch, i):
        lrs, moms = group_hparams(opt.param_groups, epoch, self.ni(epoch, i), self.nw, self.cfg,
                                  self.warmup_bias_lr, self.construct_momentum)
        for g, lr, m in zip(opt.param_groups, lrs, moms):
            g["lr"], g["momentum"] = lr, m

    def accumulate(self, ni):
        return accumulate_at(ni, self.nw, self.acc0)

    def due(self, ni):
        return ni - self.last_opt_step >= self.accumulate(ni)

    def stepped(self, ni):
        self.last_opt_step = ni

    def state_dict(self):
        return {"schedule.last_opt_step": np.array(self.last_opt_step, np.int64)}

    def load_state_dict(self, state):
        self.last_opt_step = int(state["schedule.last_opt_step"])


def build_optimizer(params, grads, table, cfg, batches_per_epoch, scaler=False, bn_buffers=None, bn_table=None,
                    frozen=()):
    """The optimizer=auto choice, groups with the scaled decay, and the matching Schedule; ``frozen``
    parameters are never updated (FlatOptimizer)."""
    name, lr0, mom, wbl = choose_optimizer(cfg)
    wd = scaled_weight_decay(cfg.weight_decay, cfg.batch, cfg.nbs)
    opt = FlatOptimizer(params, grads, table, optimizer=name, lr0=lr0, momentum=mom, weight_decay=wd,
                        max_norm=cfg.max_norm, scaler=scaler, bn_buffers=bn_buffers, bn_table=bn_table,
                        ema_decay_max=cfg.ema_decay, ema_tau=cfg.ema_tau, frozen=frozen)
    return opt, Schedule(cfg, batches_per_epoch, wbl, mom)


# ---------------------------------------------------------------------------------------------------
# digests


def digest(tensors):
    """SHA256 (hex) of the raw bytes of named tensors (ptl.Tensor or NumPy), in sorted-name order."""
    if not isinstance(tensors, dict):
        raise TypeError("tensors: expected a dict name -> tensor, got %s" % type(tensors).__name__)
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        arr = t.numpy() if isinstance(t, _C.Tensor) else np.asarray(t)
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()
