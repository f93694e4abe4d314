"""The training step in C (csrc/train/train_step.h): a failure at any stage leaves the parameters, the
optimizer state and the EMA as they were (ARCHITECTURE.md §2). Each stage's failure is injected with the
test hook ptl._C._fault_inject (it only makes that stage report an error); bad arguments are refused
before anything is written; a step after a failed one runs normally."""
import numpy as np
import pytest

import ptl
from ptl import _C
from ptl.data import DetectionData
from ptl.engine import Engine

STAGES = ["upload", "forward", "objective", "backward", "optimizer", "ema"]


@pytest.fixture(scope="module")
def setup(coco256, tmp_path_factory):
    tr = ptl.Trainer(default_root_dir=str(tmp_path_factory.mktemp("step")), max_epochs=1, limit_train_batches=2,
                     accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False, seed=0)
    data = DetectionData(str(coco256 / "data.yaml"), verbose=False, imgsz=64, batch_size=2, workers=1)
    model = ptl.Detector("yolo26n")
    tr.model, tr.datamodule = model, data
    eng = tr._engine = Engine(tr, model, data)
    data.set_epoch(0)
    batch = next(iter(eng.train_loader))
    yield eng, batch
    eng.close()


def _state(eng):
    """Everything a failed step must leave as it was: parameters, optimizer state and scalars, EMA."""
    opt = eng.opt
    parts = [eng.params.numpy(), opt.state2.numpy(), opt.scalars.numpy(), opt.ema.params.numpy(),
             opt.ema.bn.numpy()]
    if opt.state1 is not None:
        parts.append(opt.state1.numpy())
    return [p.copy() for p in parts]


def _step(eng, batch, lrs=None, decay=0.5):
    g_lrs, moms, wds = eng.opt.group_values()
    targets = _C.from_numpy(np.ascontiguousarray(batch.targets, dtype=np.float32))
    return _C.train_step(eng._plan(batch.images.shape), batch.images, targets, 0.5, True,
                         lrs or [0.01] * len(g_lrs), moms, wds, decay)


@pytest.mark.parametrize("stage", STAGES)
def test_failed_stage_changes_nothing(setup, stage):
    eng, batch = setup
    before = _state(eng)
    _C._fault_inject(stage)
    try:
        with pytest.raises(RuntimeError, match="injected failure at stage '%s'" % stage):
            _step(eng, batch)
    finally:
        _C._fault_inject(None)
    for a, b in zip(before, _state(eng)):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), stage
    # the hook fired once: the next step runs and moves the weights and the EMA
    eng.model.zero_grad()
    losses = _step(eng, batch).numpy()
    assert np.isfinite(losses).all()
    after = _state(eng)
    assert not np.array_equal(before[0], after[0]) and not np.array_equal(before[3], after[3])


@pytest.mark.parametrize("what", ["lrs", "decay"])
def test_bad_arguments_change_nothing(setup, what):
    """A value an optimizer or EMA check refuses is refused before the upload: nothing moves, the BN
    running statistics and the gradients included."""
    eng, batch = setup
    before = _state(eng) + [eng.buffers.numpy(), eng.grads.numpy()]
    n = len(eng.opt.param_groups)
    with pytest.raises(ValueError, match=what):
        _step(eng, batch, lrs=[float("nan")] * n) if what == "lrs" else _step(eng, batch, decay=1.5)
    for a, b in zip(before, _state(eng) + [eng.buffers.numpy(), eng.grads.numpy()]):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), what


def test_fault_hook_names_its_stages():
    with pytest.raises(ValueError, match="upload, forward, objective, backward, optimizer"):
        _C._fault_inject("sideways")
    _C._fault_inject(None)


def test_data_parallel_plan_and_step_arguments_are_checked(setup, monkeypatch):
    """A plan's world, communicator and BatchNorm buffer are checked when it is made; a step without images
    is only an optimizer step of a data-parallel job, refused elsewhere before anything moves."""
    eng, batch = setup
    seen = {}
    real = _C.train_step_plan
    monkeypatch.setattr(_C, "train_step_plan", lambda d: seen.setdefault("plan", d) and real(d))
    shape = tuple(batch.images.shape)
    cached = eng._plans.pop(shape, None)
    eng._plan(shape)  # a new plan: its dict is captured
    monkeypatch.undo()
    if cached is not None:
        eng._plans[shape] = cached
    cached = eng._plans[shape]
    plan = dict(seen["plan"])
    assert plan["world"] == 1
    with pytest.raises(ValueError, match="world"):
        _C.train_step_plan(dict(plan, world=0))
    with pytest.raises(TypeError, match=r"plan\['comm'\]: world 2"):
        _C.train_step_plan(dict(plan, world=2))
    with pytest.raises(TypeError, match="_DistGroup"):
        _C.train_step_plan(dict(plan, world=2, comm=object(), bn=eng.buffers))
    with pytest.raises(TypeError, match="_DistGroup"):  # a communicator at world 1 is checked too
        _C.train_step_plan(dict(plan, comm=object(), bn=eng.buffers))
    with pytest.raises(ValueError, match="all_reduce_in_graph needs a CUDA network"):
        _C.train_step_plan(dict(plan, all_reduce_in_graph=True))
    with pytest.raises(ValueError, match="multiples of 32, got 100x64"):
        _C.train_step_plan(dict(plan, shape=(2, 100, 64)))
    before = _state(eng) + [eng.buffers.numpy(), eng.grads.numpy()]
    g_lrs, moms, wds = eng.opt.group_values()
    with pytest.raises(ValueError, match="without images"):
        _C.train_step(cached, None, None, 0.5, True, g_lrs, moms, wds, 0.5)
    for a, b in zip(before, _state(eng) + [eng.buffers.numpy(), eng.grads.numpy()]):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
