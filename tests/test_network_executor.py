"""The network executor's host logic (csrc/nn/executor.h, net_plan.h), which the CPU and CUDA backends
share, run on the CPU backend: gradient and activation slot sharing, shape slots (switching, eviction),
the skipped image gradient, no leaked block. The CPU backend hands out NaN-filled memory, so a read of
anything the executor did not write first shows in these results; its weight cast and head copies use
the CUDA kernels' index arithmetic (csrc/nn/weight_cast.h)."""
import gc

import numpy as np
import pytest

import ptl
from ptl import _C
from ptl.model import Detector


def _state(seed=3):
    """Random BN affine parameters and running statistics, so that every path carries a signal."""
    sd = Detector("yolo26n", num_classes=80, seed=seed).state_dict()
    rng = np.random.default_rng(0)
    for k in sd:
        if k.endswith("bn.weight") or k.endswith("running_var"):
            sd[k] = rng.uniform(0.5, 1.5, sd[k].shape).astype(np.float32)
        elif k.endswith("bn.bias") or k.endswith("running_mean"):
            sd[k] = rng.uniform(-0.3, 0.3, sd[k].shape).astype(np.float32)
    return sd


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


class Net:
    """A network description with one CPU executor on its storage, driven directly through _C."""

    def __init__(self, sd, training=True):
        self.det = Detector("yolo26n", num_classes=80)
        self.det.load_state_dict(sd)
        self.x = _C.executor_create(self.det._net)
        _C.executor_configure(self.x, training=training)

    def step(self, images, grads, input_grad=True):
        """forward + backward from zeroed gradients: (outputs, parameter gradients, BN buffers, d images)."""
        out = [t.numpy() for t in _C.executor_forward(self.x, _C.from_numpy(images))]
        self.det.zero_grad()
        d = [None if g is None else _C.from_numpy(g) for g in grads]
        dx = _C.executor_backward(self.x, *d, input_grad=input_grad)
        return (out, self.det.flat_gradients.numpy(), self.det.flat_buffers.numpy(),
                None if dx is None else dx.numpy())


def _inputs(B, H, W, seed=1, branches=(0, 1)):
    rng = np.random.default_rng(seed)
    x = rng.random((B, H, W, 3)).astype(np.float32)
    A = sum((H // s) * (W // s) for s in (8, 16, 32))
    grads = []
    for br in range(2):
        for c in (4, 80):
            g = rng.standard_normal((B, A, c)).astype(np.float32)
            grads.append(g if br in branches else None)
    return x, grads


def _same(r1, r2):
    (o1, g1, b1, d1), (o2, g2, b2, d2) = r1, r2
    for a, b in zip(o1, o2):
        assert np.array_equal(_bits(a), _bits(b))
    assert np.array_equal(_bits(g1), _bits(g2))
    assert np.array_equal(_bits(b1), _bits(b2))
    assert (d1 is None) == (d2 is None)
    if d1 is not None:
        assert np.array_equal(_bits(d1), _bits(d2))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("what,ratio", [("gradients", 0.6), ("activations", 0.9)])
def test_slot_sharing_is_bitwise_neutral(training, what, ratio):
    """Gradients sharing memory by their lives in the backward, and activations by their lives in the
    forward and backward (with the gradients too), give the bits of one slot per value, in a smaller
    arena; every result is finite (nothing is read from the NaN-filled memory before being written)."""
    sd = _state()
    x, grads = _inputs(2, 96, 128)
    shared, private = Net(sd, training), Net(sd, training)
    _C.executor_configure(private.x, **{"share_" + what: False})
    r1, r2 = shared.step(x, grads), private.step(x, grads)
    _same(r1, r2)
    for a in r1[0] + [r1[1], r1[3]]:
        assert np.isfinite(a).all()
    assert np.count_nonzero(r1[1]) > 0.9 * r1[1].size
    sizes = _C.executor_info(shared.x)["arena_bytes"], _C.executor_info(private.x)["arena_bytes"]
    assert sizes[0] < ratio * sizes[1], sizes
    # shared gradients: an input of each of yolo26n's 11 Adds whose output is a value of its own (not a Concat's slice)
    # takes that output's gradient slot, its copy skipped; private gradients: none
    aliases = _C.executor_info(shared.x)["shared_add_gradients"], _C.executor_info(private.x)["shared_add_gradients"]
    assert aliases == ((11, 0) if what == "gradients" else (11, 11)), aliases


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("lag,branches,attached", [(1, 0, 1), (2, 0, 1), (_C.NET_SIDE_MAX_LAG, 0, 1), (0, 1, 0),
                                                   (0, 2, 0), (0, 1, 1), (0, 2, 1), (_C.NET_SIDE_LAG, 1, 1),
                                                   (_C.NET_SIDE_LAG, 2, 1)])
def test_side_queues_are_bitwise_neutral(training, lag, branches, attached):
    """What the CUDA backend runs on side streams, run here on the CPU's one queue as late as it may run (the
    stand-in of those streams): with a side lag each conv's weight and bias gradients `lag` steps late (a
    branch's on its branch's steps); with branches=1 each branch (the head's chains of one level, the
    one-to-one's detached, and with attached=1 the one-to-many's, which add into the neck's gradients) at
    the end of the forward and before its join op's
    step in the backward, with branches=2 as early as may be (at its fork in the forward, at the backward's
    start), the two ends of where a branch stream may run it. The layout keeps what they touch alive until
    then, so the step gives the bits of the in-order one; a slot reused too early would show, as would the
    NaN-filled fresh memory. The arena grows by those longer lives only."""
    sd = _state()
    x, grads = _inputs(2, 96, 128)
    ref, late = Net(sd, training), Net(sd, training)
    _C.executor_configure(ref.x, side_lag=0, branches=0)
    _C.executor_configure(late.x, side_lag=lag, branches=branches, attached=attached)
    for input_grad in (True, False):
        r1, r2 = ref.step(x, grads, input_grad), late.step(x, grads, input_grad)
        _same(r1, r2)
        assert np.count_nonzero(r1[1]) > 0.9 * r1[1].size
    info, base = _C.executor_info(late.x), _C.executor_info(ref.x)
    assert info["side_lag"] == lag and info["branches"] == branches and info["attached"] == attached
    assert not info["side_stream"] and not info["branch_stream"] and not info["attached_stream"]
    assert info["branch_wgrad_streams"] == (False, False) and len(info["workspace_bytes"]) == 6
    assert info["branch_ops"] == (30, 30)  # yolo26n's head: 6 chains of 5 ops, one-to-one and one-to-many
    assert base["arena_bytes"] <= info["arena_bytes"] <= 1.1 * base["arena_bytes"]
    if lag == 1 and not branches:  # awaited at the next step's start: no life is longer
        assert info["arena_bytes"] == base["arena_bytes"]


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("branches", [1, 2])
def test_branches_forward_only(training, branches):
    """A forward-only layout (validation) with the branches run late or early gives the outputs and BN
    statistics of the in-order forward."""
    sd = _state()
    x, _ = _inputs(2, 96, 128)
    ref, late = Net(sd, training), Net(sd, training)
    _C.executor_configure(ref.x, grad=False, branches=0)
    _C.executor_configure(late.x, grad=False, branches=branches)
    o1 = [t.numpy() for t in _C.executor_forward(ref.x, _C.from_numpy(x))]
    o2 = [t.numpy() for t in _C.executor_forward(late.x, _C.from_numpy(x))]
    for a, b in zip(o1, o2):
        assert np.array_equal(_bits(a), _bits(b))
    assert np.array_equal(_bits(ref.det.flat_buffers.numpy()), _bits(late.det.flat_buffers.numpy()))


def _inputs_of(op):
    """The values an op of network_ops reads."""
    return [p[0] for p in op["parts"]] if "parts" in op else [op[k] for k in ("in", "in2") if k in op]


def test_branches_of_yolo26n():
    """yolo26n's branches are its head's chains, one branch per level and kind: the one-to-one chains
    (detached inputs) and the one-to-many ones (they add into the neck output's gradient). Each forks
    after the neck op that makes its input; an attached one joins before the first neck op whose backward
    touches that input's gradient (the neck's own reader of it, else its producer), a detached one before
    the producer's step."""
    d = Detector("yolo26n", num_classes=80)
    ops = _C.network_ops(d._net)["ops"]
    plan = _C.executor_info(_C.executor_create(d._net))["branch_plan"]
    head = [i for i, o in enumerate(ops) if o["layer"] == ops[-1]["layer"]]
    assert len(plan) == 6 and sorted(b["attached"] for b in plan) == [False] * 3 + [True] * 3
    producer = {o["out"]: i for i, o in enumerate(ops)}
    covered = []
    for b in plan:
        first = ops[b["first"]]
        assert first["kind"] == "conv" and b["fork"] == producer[first["in"]] + 1
        readers = [i for i, o in enumerate(ops) if first["in"] in _inputs_of(o) and i not in head]
        want = (max(readers) if readers else producer[first["in"]]) if b["attached"] else b["fork"] - 1
        assert b["join"] == want, b
        covered += range(b["first"], b["last"] + 1)
    assert sorted(covered) == head  # each level's chains are consecutive ops of the head


def _parts_in_place(desc):
    """The Concat parts ptl_net_cat_in_place builds in place, by its rules for the kernels of the CPU and CUDA
    backends, from network_ops: a whole value other than the image, written by a conv (its BatchNorm), an
    upsample, a max-pool or an add, and read by nothing but that part, split Concats, upsamples and max-pools,
    each before the Concat."""
    ops, channels = desc["ops"], [c for c, _ in desc["values"]]
    producer = {o["out"]: (i, o["kind"]) for i, o in enumerate(ops) if "out" in o}
    placed = 0
    for k, o in enumerate(ops):
        if o["kind"] != "cat" or len(o["parts"]) < 2:
            continue
        for v, c0, nc in o["parts"]:
            others = [(i, r["kind"]) for i, r in enumerate(ops) for u in _inputs_of(r) if u == v and i != k]
            placed += (v != desc["input"] and c0 == 0 and nc == channels[v]
                       and producer[v][1] in ("conv", "upsample2x", "maxpool5", "add")
                       and all(i < k and kind in ("cat", "upsample2x", "maxpool5") for i, kind in others))
    return placed


@pytest.mark.parametrize("kernels", ["fast", "reference", "bfloat16-storage"])
@pytest.mark.parametrize("training", [True, False])
def test_cat_in_place_is_bitwise_neutral(kernels, training, monkeypatch):
    """Concats built in place (their parts' producers write into the Concat's output, their readers read it
    there) give the bits of the copies on every CPU backend, in order and with the side queues' work late or
    early, with and without the image gradient, and with frozen layers whose gradients nothing needs beside
    trainable ones in one Concat; the arena is smaller and the Concats with every part in place run no
    backward."""
    monkeypatch.setenv("PTL_CPU_KERNELS", kernels)
    sd = _state()
    x, grads = _inputs(2, 96, 128)
    copies, placed = Net(sd, training), Net(sd, training)
    _C.executor_configure(copies.x, cat_in_place=False)
    want = _parts_in_place(_C.network_ops(placed.det._net))
    assert want >= 20
    assert _C.executor_info(placed.x)["cat_in_place"] == (True, want)
    assert _C.executor_info(copies.x)["cat_in_place"] == (False, 0)
    for config in ({}, {"side_lag": 2, "branches": 1}, {"side_lag": _C.NET_SIDE_MAX_LAG, "branches": 2}):
        for n in (copies, placed):
            _C.executor_configure(n.x, **config)
        for input_grad in (True, False):
            _same(copies.step(x, grads, input_grad), placed.step(x, grads, input_grad))
    info, base = _C.executor_info(placed.x), _C.executor_info(copies.x)
    assert info["arena_bytes"] < base["arena_bytes"]
    assert info["backward_ops"] < base["backward_ops"] == base["ops"]
    # forward-only layouts, where memory is shared most tightly (a part's value lives from its first producer)
    for grad in (False, True):
        for n in (copies, placed):
            _C.executor_configure(n.x, grad=grad)
        o1, o2 = ([t.numpy() for t in _C.executor_forward(n.x, _C.from_numpy(x))] for n in (copies, placed))
        for a, b in zip(o1, o2):
            assert np.array_equal(_bits(a), _bits(b))
    # layer 2's first conv frozen with all before it: its gradient, a part of layer 2's Concat, is not needed
    names = [n for n in sd if n.startswith(("model.0.", "model.1.", "model.2.cv1."))]
    for n in (copies, placed):
        _C.executor_set_frozen(n.x, n.det._frozen_flags(set(names)))
    _same(copies.step(x, grads, False), placed.step(x, grads, False))
    # and back to the copies: the same executor gives the same bits
    _C.executor_configure(placed.x, cat_in_place=False)
    assert _C.executor_info(placed.x)["cat_in_place"] == (False, 0)
    _same(copies.step(x, grads), placed.step(x, grads))


def test_queue_workspace_limit():
    """A queue's conv workspace is at most the limit (the branch queues' aside): with the side lag on, a conv
    whose weight and bias gradients need more runs them in order, the others lag (branch ops run theirs in
    their branch), and a conv outside the branches whose calls need more has its workspace in the arena, for
    its forward and its backward step alone, where nothing alive then is overwritten. The step's bits are the
    in-order step's, in training and in a no-grad forward; limit 0 moves nothing, lag 0 lags nothing."""
    sd = _state()
    x, grads = _inputs(2, 96, 128)
    ref, lim = Net(sd), Net(sd)
    _C.executor_configure(ref.x, side_lag=0, branches=0)
    _C.executor_configure(lim.x, side_lag=_C.NET_SIDE_LAG, branches=1, queue_workspace_limit=0)
    _same(ref.step(x, grads), lim.step(x, grads))
    info = _C.executor_info(lim.x)
    in_branch = {i for b in info["branch_plan"] for i in range(b["first"], b["last"] + 1)}
    convs, whole = info["conv_workspaces"], info["workspace_bytes"][0]
    assert len(convs) == sum(o["kind"] in ("conv", "conv_bias") for o in _C.network_ops(lim.det._net)["ops"])
    assert all(lag == (op not in in_branch) and not arena for op, _, _, lag, arena in convs)
    sizes = sorted({max(d, pg) for op, d, pg, *_ in convs if op not in in_branch})
    if len(sizes) < 2 or sizes[0] == sizes[-1] or whole == 0:
        pytest.skip(f"the {info['backend']} backend's convolutions need no workspaces of different sizes")
    limit = sizes[len(sizes) // 2]
    _C.executor_configure(lim.x, queue_workspace_limit=limit)
    _same(ref.step(x, grads), lim.step(x, grads))
    info = _C.executor_info(lim.x)
    # on the CPU's one queue the branches' convs, which the limit leaves alone, run on the main queue too
    branch_ws = max(max(d, pg) for op, d, pg, *_ in convs if op in in_branch)
    assert info["queue_workspace_limit"] == limit and info["workspace_bytes"][0] <= max(limit, branch_ws)
    assert info["workspace_bytes"][0] < whole
    lags, arenas = {}, {}
    for op, d, pg, lag, arena in info["conv_workspaces"]:
        assert lag == (op not in in_branch and pg <= limit)
        assert arena == (op not in in_branch and max(d, 0 if lag else pg) > limit)
        lags[op], arenas[op] = lag, arena
    assert any(lags.values()) and not all(lags[op] for op in lags if op not in in_branch) and any(arenas.values())
    for net in (ref, lim):  # a forward-only layout: the forwards' workspaces alone
        _C.executor_configure(net.x, training=False, grad=False)
    outs = [[t.numpy() for t in _C.executor_forward(net.x, _C.from_numpy(x))] for net in (ref, lim)]
    for a, b in zip(*outs):
        assert np.array_equal(_bits(a), _bits(b))
    info = _C.executor_info(lim.x)
    assert info["forward_only"] and any(arena for *_, arena in info["conv_workspaces"])
    for net in (ref, lim):
        _C.executor_configure(net.x, training=True, grad=True)
    _C.executor_configure(lim.x, side_lag=0)
    _same(ref.step(x, grads), lim.step(x, grads))
    assert not any(lag for _, _, _, lag, _ in _C.executor_info(lim.x)["conv_workspaces"])
    with pytest.raises(ValueError, match="queue_workspace_limit must be >= 0"):
        _C.executor_configure(lim.x, queue_workspace_limit=-1)
    # the conv plans' own limit (CUDA algorithm choice; the CPU kernels have one algorithm) is a conv option
    assert _C.executor_info(lim.x)["conv_options"]["workspace_limit"] == _C.NET_CONV_WORKSPACE_LIMIT
    _C.executor_configure(lim.x, workspace_limit=1 << 20)
    assert _C.executor_info(lim.x)["conv_options"]["workspace_limit"] == 1 << 20
    with pytest.raises(ValueError, match="workspace_limit must be >= 0"):
        _C.executor_configure(lim.x, workspace_limit=-5)


def test_side_lag_bounds():
    net = Net(_state(), True)
    for bad in (-1, _C.NET_SIDE_MAX_LAG + 1):
        with pytest.raises(ValueError, match="side_lag must be in"):
            _C.executor_configure(net.x, side_lag=bad)
    for bad in (-1, 3):
        with pytest.raises(ValueError, match="branches must be"):
            _C.executor_configure(net.x, branches=bad)
        with pytest.raises(ValueError, match="attached must be 0 or 1"):
            _C.executor_configure(net.x, attached=bad - 1)
    info = _C.executor_info(net.x)
    assert info["side_lag"] == 0 and not info["branches"]  # the CPU backend's default: in order
    assert 0 < _C.NET_SIDE_LAG <= _C.NET_SIDE_MAX_LAG


def test_backward_consumes_its_forward():
    """The gradients reuse the memory of activations the backward has read, so a second backward of one
    forward is refused; a new forward makes the same step again, bit for bit."""
    sd = _state()
    x, grads = _inputs(1, 64, 96)
    net = Net(sd, False)
    first = net.step(x, grads)
    d = [None if g is None else _C.from_numpy(g) for g in grads]
    with pytest.raises(RuntimeError, match="run a forward first"):
        _C.executor_backward(net.x, *d)
    _same(first, net.step(x, grads))


@pytest.mark.parametrize("training", [True, False])
def test_forward_only_layout(training):
    """Forwards without gradients (validation, prediction) give the same outputs and BN statistics bit for
    bit from a much smaller arena, and refuse a backward; with gradients on again the shape is remade and
    the step is the usual one."""
    sd = _state()
    x, grads = _inputs(2, 96, 128)
    full, fwd = Net(sd, training), Net(sd, training)
    _C.executor_configure(fwd.x, grad=False)
    out_full = [t.numpy() for t in _C.executor_forward(full.x, _C.from_numpy(x))]
    out_fwd = [t.numpy() for t in _C.executor_forward(fwd.x, _C.from_numpy(x))]
    for a, b in zip(out_full, out_fwd):
        assert np.array_equal(_bits(a), _bits(b))
    assert np.array_equal(_bits(full.det.flat_buffers.numpy()), _bits(fwd.det.flat_buffers.numpy()))
    info = _C.executor_info(fwd.x)
    assert info["forward_only"] and not _C.executor_info(full.x)["forward_only"]
    assert info["arena_bytes"] < 0.25 * _C.executor_info(full.x)["arena_bytes"]
    d = [None if g is None else _C.from_numpy(g) for g in grads]
    with pytest.raises(RuntimeError, match="without gradients"):
        _C.executor_backward(fwd.x, *d)
    _C.executor_configure(fwd.x, grad=True)
    fwd.det.load_state_dict(sd)
    full.det.load_state_dict(sd)
    _same(full.step(x, grads), fwd.step(x, grads))
    assert not _C.executor_info(fwd.x)["forward_only"]


def test_shape_slots_switch_and_evict():
    """One executor keeps two shapes: switching back to a held shape reuses its buffers (no block is
    made), a third shape evicts the least recently used one; each step's results are bitwise those of a
    fresh executor from the same state, whatever the shape history."""
    sd = _state(seed=4)
    live = Net(sd, True)
    shapes = [(2, 96, 128), (1, 64, 64), (2, 96, 128), (1, 32, 64), (1, 64, 64), (2, 96, 128)]
    blocks = []
    for k, (B, H, W) in enumerate(shapes):
        x, grads = _inputs(B, H, W, seed=k, branches=(0, 1) if k % 2 == 0 else (k % 3 == 1,))
        live.det.load_state_dict(sd)  # the same state for both (training mode moves the BN statistics)
        r = live.step(x, grads, input_grad=k != 3)
        blocks.append(_C.executor_cpu_live_blocks())
        fresh = Net(sd, True)
        _same(r, fresh.step(x, grads, input_grad=k != 3))
        info = _C.executor_info(live.x)
        assert info["batch_shape"] == (B, H, W)
        del fresh
        gc.collect()
    # shapes 0 and 1 fill the two slots; 2 switches back (nothing made); 3 evicts 1, 4 evicts 0, 5 evicts 3:
    # each eviction frees as many blocks as it makes
    assert blocks[2] == blocks[1]
    assert blocks[3] == blocks[2] == blocks[4] == blocks[5]


def test_image_gradient_is_optional():
    """Without input_grad the first conv's input gradient is skipped; nothing else changes."""
    sd = _state(seed=5)
    x, grads = _inputs(1, 64, 96)
    with_dx, without = Net(sd, True).step(x, grads, True), Net(sd, True).step(x, grads, False)
    assert with_dx[3] is not None and without[3] is None
    _same(with_dx[:3] + (None,), without)


def test_one_branch_only():
    """A missing branch gradient reads as zero: the o2o branch alone leaves the rest of the network's
    gradients zero (its first convs are detached) and equals the full gradient minus the o2m branch's."""
    sd = _state(seed=6)
    x, grads = _inputs(1, 64, 64)
    o2o_only = [None, None] + grads[2:]
    o2m_only = grads[:2] + [None, None]
    g_both = Net(sd, False).step(x, grads)[1]
    g_o2o = Net(sd, False).step(x, o2o_only)[1]
    g_o2m = Net(sd, False).step(x, o2m_only)[1]
    head = np.zeros(g_both.size, bool)
    for name, off, shape in Detector("yolo26n").parameter_table():
        if ".one2one_" in name:
            head[off:off + int(np.prod(shape))] = True
    assert np.all(g_o2o[~head] == 0) and np.count_nonzero(g_o2o[head]) > 0
    assert np.all(g_o2m[head] == 0)
    assert np.array_equal(_bits(g_both[head]), _bits(g_o2o[head]))
    assert np.array_equal(_bits(g_both[~head]), _bits(g_o2m[~head]))


def test_bad_calls_leave_the_executor_usable():
    net = Net(_state(seed=7), True)
    x, grads = _inputs(1, 64, 64)
    with pytest.raises(RuntimeError, match="forward"):
        _C.executor_backward(net.x, None, None, None, None)
    with pytest.raises(ValueError, match="multiples of 32"):
        _C.executor_forward(net.x, _C.from_numpy(np.zeros((1, 48, 64, 3), np.float32)))
    with pytest.raises(TypeError, match="images"):
        _C.executor_forward(net.x, _C.from_numpy(np.zeros((1, 64, 64, 3), np.float64)))
    r = net.step(x, grads)
    _C.executor_forward(net.x, _C.from_numpy(x))  # the step's backward consumed its forward
    with pytest.raises(ValueError, match="d_scores"):
        _C.executor_backward(net.x, None, _C.from_numpy(np.zeros((1, 84, 81), np.float32)), None, None)
    _same(r, Net(_state(seed=7), True).step(x, grads))


def test_plan_checks_its_shapes():
    """Detector.plan takes (batch, height, width) shapes, checked as a forward checks them, for training
    or (forward_only) no-grad layouts; on the CPU there is nothing to plan ahead, and planning changes no
    result."""
    det = Detector("yolo26n", num_classes=80, seed=0)
    with pytest.raises(ValueError, match="multiples of 32"):
        det.plan([(1, 64, 64), (1, 48, 64)])
    with pytest.raises(ValueError, match="batch size"):
        det.plan([(0, 64, 64)])
    with pytest.raises(TypeError, match=r"shapes\[1\]: expected a tuple"):
        _C.executor_plan(det._exec, [(1, 64, 64), (1, 64)])
    with pytest.raises(TypeError, match="shapes: expected a sequence"):
        _C.executor_plan(det._exec, 3)
    x = np.random.default_rng(0).integers(0, 256, (1, 64, 96, 3), dtype=np.uint8)
    before = _bits(det.forward(x)["one2one"][1]).copy()
    det.plan([(1, 64, 96), (2, 64, 64)])
    det.plan([(1, 64, 96)], forward_only=True)
    det.plan([])
    assert np.array_equal(_bits(det.forward(x)["one2one"][1]), before)
    with det.no_grad():
        assert np.array_equal(_bits(det.forward(x)["one2one"][1]), before)


def test_no_block_leaks():
    """Every block an executor takes goes back when it is freed."""
    gc.collect()
    before = _C.executor_cpu_live_blocks()
    net = Net(_state(seed=8), True)
    for B, H, W in ((1, 64, 64), (2, 32, 32), (1, 64, 96)):
        x, grads = _inputs(B, H, W)
        net.step(x, grads)
    assert _C.executor_cpu_live_blocks() > before
    del net
    gc.collect()
    assert _C.executor_cpu_live_blocks() == before
    with pytest.raises(RuntimeError, match="recorder"):
        _C.executor_replay(Net(_state(), True).x)


@pytest.mark.parametrize("scale", ["yolo26n", "yolo26l"])
@pytest.mark.parametrize("cast_biases", [False, True])
def test_weight_table_tiles(scale, cast_biases):
    """The CUDA weight kernels take the table cut into tiles, one a block (csrc/nn/weight_cast.h): on the CPU
    backend's table (weights only) and the CUDA backend's (weights and biases) the tiles in both orders map
    each element of the copy to its master element as the per-record walk the CPU uses does, exactly once,
    the padding to nothing, the master's order consecutive, each staged element to its own slot, and each
    thread's walk (a block's stride at a time, by carries) reaches the coordinates division gives. yolo26l's
    3x3 convs over 512 channels have rows longer than a tile, cut into runs of input channels."""
    det = Detector(scale, num_classes=80)
    convs = sum(1 for n, _, s in det.parameter_table() if len(s) == 4)
    biases = sum(1 for n, _, s in det.parameter_table() if n.endswith(".bias") and "bn" not in n)
    records, tiles, elements = _C.network_check_weight_table(det._net, cast_biases)
    assert records == convs + (biases if cast_biases else 0)
    weights = sum(int(np.prod(s)) for n, _, s in det.parameter_table() if len(s) == 4)
    assert elements >= weights
    # every record is cut (at least one tile each), and no tile holds more than the kernels stage
    assert records <= tiles and weights <= tiles * 4096


def test_eval_shapes_leave_the_training_slots():
    """Eval-mode forwards (validation's many shapes) have their own slot: the training shapes' slots,
    and so any recording in them, survive them (no block is made when training resumes)."""
    net = Net(_state(seed=9), True)
    train_shapes = [(2, 64, 96), (1, 64, 64)]
    for B, H, W in train_shapes:
        net.step(*_inputs(B, H, W))
    _C.executor_configure(net.x, training=False)
    for H, W in ((96, 64), (64, 128), (32, 96)):
        _C.executor_forward(net.x, _C.from_numpy(_inputs(1, H, W)[0]))
    _C.executor_configure(net.x, training=True)
    before = _C.executor_cpu_live_blocks()
    for B, H, W in train_shapes:
        net.step(*_inputs(B, H, W))
        assert _C.executor_cpu_live_blocks() == before


def _representable(a, dtype):
    a = np.asarray(a, np.float32)
    if dtype == "float16":
        return np.array_equal(a.astype(np.float16).astype(np.float32), a)
    return not (a.view(np.uint32) & 0xFFFF).any()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_storage_emulation_rounds_what_cuda_stores(dtype, monkeypatch):
    """PTL_CPU_KERNELS=<dtype>-storage (csrc/nn/backend_cpu_storage.c, the oracle of the low-precision CUDA
    network): the head outputs (float32 copies of stored maps) and the conv weight gradients (one addition of
    a stored value into zeroed master gradients) hold storage-dtype values, the BatchNorm gradients (master
    arithmetic) do not all; and in eval mode it stays within 2 unit roundoffs of the float32 reference."""
    sd = _state()
    monkeypatch.setenv("PTL_CPU_KERNELS", dtype + "-storage")
    em = Net(sd, training=False)
    assert _C.executor_info(em.x)["backend"] == dtype + "_storage"
    monkeypatch.setenv("PTL_CPU_KERNELS", "reference")
    ref = Net(sd, training=False)
    x, grads = _inputs(1, 64, 96)
    xs = x.astype(np.float16).astype(np.float32) if dtype == "float16" else \
        (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # truncation is one valid rounding
    (eo, eg, _, _), (ro, rg, _, _) = em.step(xs, grads, False), ref.step(xs, grads, False)
    assert all(_representable(o, dtype) for o in eo)
    conv = np.zeros(eg.shape, bool)
    for name, off, shape in em.det.parameter_table():
        if name.endswith("conv.weight"):
            conv[off:off + int(np.prod(shape))] = True
    assert _representable(eg[conv], dtype) and not _representable(eg[~conv], dtype)
    # eval mode, so the error stays near one rounding (measured 0.4-0.7 units)
    unit = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    for a, b in zip(eo, ro):
        assert 0 < np.linalg.norm(a - b) / np.linalg.norm(b) < 2 * unit
    assert 0 < np.linalg.norm(eg - rg) / np.linalg.norm(rg) < 2 * unit


def test_storage_emulation_needs_float32(monkeypatch):
    monkeypatch.setenv("PTL_CPU_KERNELS", "bfloat16-storage")
    with pytest.raises(ValueError, match="bfloat16-storage.*float32"):
        Detector("yolo26n", num_classes=80, dtype="float64")
    monkeypatch.setenv("PTL_CPU_KERNELS", "bf16")
    with pytest.raises(ValueError, match="'bfloat16-storage' or 'float16-storage'"):
        Detector("yolo26n", num_classes=80)
