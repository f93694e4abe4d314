"""freeze (Ultralytics 8.4.190's option, issue 19): the executor skips frozen gradients and runs the BatchNorm of
frozen modules in eval mode, the optimizer never updates frozen tensors, and a fit with freeze leaves them
bit-identical (CPU; coco256 at imgsz 64)."""
import os
import warnings

import numpy as np
import pytest

import ptl
from ptl import _C
from ptl import optim
from ptl.data import DetectionData
from ptl.trainer import Trainer, frozen_buffer_names, frozen_parameter_names

IMGSZ = 64


def names_of(model):
    return [n for n, _, _ in model.parameter_table()], [n for n, _, _ in model.buffer_table()]


def frozen_names(model, freeze):
    params, buffers = names_of(model)
    return frozen_parameter_names(freeze, params), frozen_buffer_names(freeze, buffers)


def grads_of(model):
    g = model.flat_gradients.numpy()
    return {n: g[o:o + int(np.prod(s))].copy() for n, o, s in model.parameter_table()}


def backward(model, frozen=(), input_grad=False, seed=0):
    """One training forward and backward of a fixed batch with fixed output gradients, from zero gradients;
    returns (parameter gradients by name, image gradient or None)."""
    rng = np.random.default_rng(seed)
    model.set_frozen(frozen)
    out = model.forward(rng.random((2, 3, IMGSZ, IMGSZ), dtype=np.float32))
    d = {k: tuple(rng.standard_normal(np.asarray(t).shape).astype(np.float32) for t in out[k]) for k in out}
    model.zero_grad()
    dimg = model.backward(d, input_grad=input_grad)
    return grads_of(model), dimg


@pytest.fixture(params=["fast", "reference"])
def kernels(request, monkeypatch):
    """Both CPU backends (the executor's skipping is backend independent; CUDA runs the same executor)."""
    monkeypatch.setenv("PTL_CPU_KERNELS", request.param)
    return request.param


@pytest.mark.parametrize("freeze", [5, [4], [0, "model.9."]])
def test_frozen_gradients_skipped_and_the_rest_unchanged(kernels, freeze):
    """Frozen parameters get no gradient (exactly zero in the buffer), the executor runs fewer backward ops,
    and every trainable gradient is the bits of a backward without frozen parameters on the same forward
    (the frozen modules' BatchNorm in eval mode, freeze's only effect on the forward): the cut upstream
    changes nothing downstream, and a frozen layer in the middle still passes gradients to the layers before
    it."""
    model = ptl.Detector("yolo26n", num_classes=3)
    assert model.info()["backend"] == ("cpu-fast" if kernels == "fast" else "cpu")
    fp, fb = frozen_names(model, freeze)
    assert fp and fb
    same_forward, _ = backward(model, fb)
    ops_all = model.info()["backward_ops"]
    got, _ = backward(model, fp + fb)
    info = model.info()
    assert info["frozen_tensors"] == len(fp) + len(fb)
    for n in fp:
        assert not got[n].any(), n
    trainable = [n for n in got if n not in set(fp)]
    for n in trainable:
        assert np.array_equal(got[n], same_forward[n]), n
        assert got[n].any(), n
    if freeze == 5:  # nothing before layer 5 trains: the backward stops there (a Concat built in place has none)
        assert info["backward_ops"] < ops_all <= info["ops"]
    else:  # a frozen middle layer passes gradients through: layer 0 / 1 still train
        assert any(got[n].any() for n in trainable if n.startswith("model.1."))


def test_prefix_of_parameters_only_keeps_batchnorm_training():
    """A prefix that selects a conv weight but not its BatchNorm module leaves the forward as it is: the other
    gradients are the bits of an unfrozen backward."""
    model = ptl.Detector("yolo26n", num_classes=3)
    fp, fb = frozen_names(model, ["model.2.cv1.conv.weight"])
    assert fp == ["model.2.cv1.conv.weight"] and fb == []
    full, _ = backward(model)
    got, _ = backward(model, fp)
    assert not got[fp[0]].any() and full[fp[0]].any()
    assert all(np.array_equal(got[n], full[n]) for n in got if n != fp[0])


def test_image_gradient_still_flows_through_frozen_layers():
    model = ptl.Detector("yolo26n", num_classes=3)
    fp, fb = frozen_names(model, 6)
    ref_g, ref_img = backward(model, fb, input_grad=True)
    got_g, got_img = backward(model, fp + fb, input_grad=True)
    assert np.array_equal(got_img, ref_img) and np.abs(ref_img).sum() > 0
    assert all(not got_g[n].any() for n in fp)
    assert all(np.array_equal(got_g[n], ref_g[n]) for n in got_g if n not in set(fp))


def test_frozen_batchnorm_statistics_are_not_updated():
    """A training forward leaves the frozen modules' running statistics as they were (eval mode) and updates
    the others."""
    model = ptl.Detector("yolo26n", num_classes=3)
    fp, fb = frozen_names(model, 3)
    before = model.state_dict()
    model.set_frozen(fp + fb)
    assert model.frozen == [n for n in before if n in set(fp + fb)]
    model.forward(np.random.default_rng(0).random((2, 3, IMGSZ, IMGSZ), dtype=np.float32))
    after = model.state_dict()
    _, buffers = names_of(model)
    assert all(np.array_equal(after[n], before[n]) for n in fb)
    assert all(not np.array_equal(after[n], before[n]) for n in buffers if n not in set(fb))


def test_bad_masks_raise():
    model = ptl.Detector("yolo26n", num_classes=3)
    with pytest.raises(ValueError, match="model.99.conv.weight"):
        model.set_frozen(["model.99.conv.weight"])
    with pytest.raises(TypeError, match="names"):
        model.set_frozen("model.0.conv.weight")
    n = len(model.state_dict())
    with pytest.raises(ValueError, match="frozen: expected one flag per tensor"):
        _C.executor_set_frozen(model._exec, [0] * (n - 1))
    with pytest.raises(ValueError, match="frozen: the flag of model.0.conv.weight is not 0 or 1"):
        _C.executor_set_frozen(model._exec, [3] + [0] * (n - 1))
    with pytest.raises(ValueError, match="model.0.bn.running_mean and model.0.bn.running_var"):
        model.set_frozen(["model.0.bn.running_mean"])
    assert model.frozen == [] and model.info()["frozen_tensors"] == 0  # a refused mask changes nothing


# ------------------------------------------------------------------------------------------- optimizer

TABLE = [("model.0.conv.weight", 0, (4, 3, 1, 1)), ("model.0.bn.weight", 12, (4,)), ("model.0.bn.bias", 16, (4,)),
         ("model.1.conv.weight", 20, (6, 4, 1, 1)), ("model.1.bn.weight", 44, (6,)), ("model.1.bn.bias", 50, (6,))]
N = 56
FROZEN = ["model.0.conv.weight", "model.0.bn.weight", "model.0.bn.bias"]


def run_optimizer(name, frozen, max_norm=0.0, steps=3):
    rng = np.random.default_rng(0)
    params = ptl.tensor(rng.standard_normal(N).astype(np.float32))
    grads = ptl.zeros((N,), dtype="float32")
    opt = optim.FlatOptimizer(params, grads, TABLE, name, lr0=0.1, momentum=0.9, weight_decay=0.05,
                              max_norm=max_norm, ema=False, frozen=frozen)
    p0 = params.numpy().copy()
    for _ in range(steps):
        optim._copy_into(grads, rng.standard_normal(N).astype(np.float32) * 3)  # nonzero on frozen ones too
        opt.step()
    return opt, p0, params.numpy().copy()


@pytest.mark.parametrize("name", ["MuSGD", "SGD", "AdamW"])
def test_optimizer_never_updates_frozen_tensors(name):
    """Nonzero gradients, weight decay and momentum: the frozen tensors keep their bits and their state stays
    zero; the others step exactly as without the freeze (no clip: the update is per tensor); the groups are
    those of the unfrozen optimizer."""
    opt, p0, p = run_optimizer(name, FROZEN)
    ref, _, p_ref = run_optimizer(name, [])
    assert opt.param_groups == ref.param_groups and opt.frozen == FROZEN
    state = opt.state_dict()
    for n, o, s in TABLE:
        k = int(np.prod(s))
        if n in FROZEN:
            assert np.array_equal(p[o:o + k], p0[o:o + k]), n
            assert not any(state[pre + n].any() for pre in ("m.", "v.") if pre + n in state), n
        else:
            assert np.array_equal(p[o:o + k], p_ref[o:o + k]) and not np.array_equal(p[o:o + k], p0[o:o + k]), n
    frozen_idx = {i for i, (n, _, _) in enumerate(TABLE) if n in FROZEN}
    assert not frozen_idx & set(opt._plan["call"][:, 2].tolist())
    assert not frozen_idx & set(opt._plan["cmuon"][:, 2].tolist())
    assert opt._plan["nmuon"] == (1 if name == "MuSGD" else 0)  # model.1.conv.weight alone


def test_clip_norm_leaves_frozen_gradients_out():
    """The gradient norm the clip reports is that of the trainable gradients alone."""
    params = ptl.tensor(np.zeros(N, np.float32))
    grads = ptl.tensor(np.full(N, 2.0, np.float32))
    opt = optim.FlatOptimizer(params, grads, TABLE, "SGD", lr0=0.1, momentum=0.9, max_norm=1.0, ema=False,
                              frozen=FROZEN)
    opt.step()
    trainable = N - 20  # model.0's 12 + 4 + 4 elements are frozen
    assert opt.last_grad_norm == pytest.approx(2.0 * np.sqrt(trainable), rel=1e-6)
    assert not params.numpy()[:20].any() and params.numpy()[20:].all()


def test_optimizer_frozen_arguments_checked():
    params, grads = ptl.zeros((N,), dtype="float32"), ptl.zeros((N,), dtype="float32")
    with pytest.raises(ValueError, match="frozen: not in the parameter table: 'nope'"):
        optim.FlatOptimizer(params, grads, TABLE, "SGD", ema=False, frozen=["nope"])
    with pytest.raises(TypeError, match="frozen"):
        optim.FlatOptimizer(params, grads, TABLE, "SGD", ema=False, frozen="model.0.bn.bias")
    opt = optim.FlatOptimizer(params, grads, TABLE, "SGD", ema=False, frozen=FROZEN)
    gs = opt.param_groups
    bad_call = ptl.tensor(np.array([[0, 12, 0]], np.int64))  # a chunk of the frozen model.0.conv.weight
    with pytest.raises(ValueError, match="frozen parameter"):
        _C._optim_step(params=params, grads=grads, state1=opt.state1, state2=opt.state2, scalars=opt.scalars,
                       ptab=opt._ptab, call=bad_call, cmuon=opt._cmuon, sgtab=opt._sgtab, ws_bf16=None, ws_f64=None,
                       tx=0, ta=0, nmuon=0, kinds=[optim.KINDS[g["kind"]] for g in gs], lrs=[0.1] * len(gs),
                       momenta=[0.9] * len(gs), wds=[0.0] * len(gs))


# ------------------------------------------------------------------------------------------------- fits

def small_data(coco256):
    return DetectionData(str(coco256 / "data.yaml"), imgsz=IMGSZ, batch_size=4, workers=2, verbose=False)


def small_trainer(root, **kw):
    kw.setdefault("max_epochs", 1)
    kw.setdefault("limit_train_batches", 2)
    kw.setdefault("limit_val_batches", 0)  # what these tests look at is the training state
    return Trainer(default_root_dir=str(root), accelerator="cpu", enable_progress_bar=False, seed=0, **kw)


# no warm-up (whose first lr is 0) and a large lr: the first step moves every tensor with a gradient, past the
# rounding of the EMA the model adopts at the end
HP = {"optimizer": "MuSGD", "warmup_epochs": 0, "lr0": 0.2}


@pytest.fixture(scope="module")
def unfrozen_fit(coco256, tmp_path_factory):
    """The start and end weights of the same fit without freeze (at imgsz 64 a few tensors get no gradient
    in two batches, e.g. the P5 box bias: they do not change either way)."""
    model = ptl.Detector("yolo26n", num_classes=80, hparams=HP)
    start = model.state_dict()
    small_trainer(tmp_path_factory.mktemp("unfrozen")).fit(model, small_data(coco256))
    return start, model.state_dict()


@pytest.mark.parametrize("freeze", [3, [4, "model.9.cv1."]])
def test_fit_leaves_frozen_tensors_bit_identical(coco256, tmp_path, unfrozen_fit, freeze):
    """After a fit (the model adopts the EMA at its end, which keeps constant tensors exactly) the frozen
    parameters and the frozen modules' BatchNorm statistics hold their initial bits; every other parameter
    and statistic that the unfrozen fit changes changed (a frozen layer in the middle still passes
    gradients to the layers before it)."""
    start, unfrozen_end = unfrozen_fit
    model = ptl.Detector("yolo26n", num_classes=80, hparams=HP)
    assert all(np.array_equal(v, start[k]) for k, v in model.state_dict().items())
    tr = small_trainer(tmp_path, freeze=freeze)
    tr.fit(model, small_data(coco256))
    fp, fb = frozen_names(model, freeze)
    assert tr.frozen_parameters == fp and tr.frozen_buffers == fb and fb
    end = model.state_dict()
    frozen = set(fp + fb)
    moving = [n for n in start if not np.array_equal(unfrozen_end[n], start[n])]
    assert len(moving) > 0.9 * len(start) and any(n.startswith("model.0.") for n in moving)
    for n in start:
        if n in frozen:
            assert np.array_equal(end[n], start[n]), n
        elif n in moving:
            assert not np.array_equal(end[n], start[n]), n


def test_resume_with_freeze_is_exact(coco256, tmp_path):
    class StopAfterOne(ptl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = True

    full = small_trainer(tmp_path / "full", max_epochs=2, freeze=2)
    full.fit(ptl.Detector("yolo26n", hparams=HP), small_data(coco256))
    first = small_trainer(tmp_path / "part", max_epochs=2, freeze=2, callbacks=[StopAfterOne()])
    first.fit(ptl.Detector("yolo26n", hparams=HP), small_data(coco256))
    assert first.current_epoch == 1
    last = os.path.join(first.log_dir, "checkpoints", "last.ckpt")
    resumed = small_trainer(tmp_path / "part", max_epochs=2, freeze=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ptl.ResumeWarning)
        resumed.fit(ptl.Detector("yolo26n", hparams=HP), small_data(coco256), ckpt_path=last)
    assert resumed.digest() == full.digest()
    other = small_trainer(tmp_path / "part", max_epochs=2, freeze=3)
    with pytest.warns(ptl.ResumeWarning, match="freeze 2 -> 3"):
        other.fit(ptl.Detector("yolo26n", hparams=HP), small_data(coco256), ckpt_path=last)


def test_cli_freeze(coco256, tmp_path, capsys):
    """``freeze=3`` on the command line: layers 0..2 of the trained weights are those the run started from."""
    from ptl import train
    argv = ["--data", str(coco256 / "data.yaml"), "imgsz=64", "batch=4", "workers=2", "device=cpu", "epochs=1",
            "limit_train_batches=2", "limit_val_batches=1", "progress_bar=false", "project=%s" % tmp_path,
            "optimizer=MuSGD", "warmup_epochs=0", "lr0=0.2", "freeze=3", "verbose=false"]
    try:
        rc = train.main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc in (0, None), capsys.readouterr().err
    t, _ = ptl.load_safetensors(str(tmp_path / "runs" / "train" / "version_0" / "checkpoints" / "last.ckpt"))
    start = ptl.Detector("yolo26n", num_classes=80, seed=0).state_dict()
    same = {n for n, v in start.items() if np.array_equal(np.asarray(t["model." + n]).reshape(v.shape), v)}
    frozen = {n for n in start if n.startswith(("model.0.", "model.1.", "model.2."))}
    assert frozen <= same and len(same - frozen) < 0.05 * len(start)
    assert not same & {n for n in start if n.startswith(("model.3.", "model.4.", "model.5."))}


# ------------------------------------------------------------------------------------------------- CUDA

@pytest.mark.cuda
def test_cuda_frozen_gradients_skipped_and_the_rest_unchanged():
    """The executor's skipping on the CUDA backend: frozen gradients stay zero, trainable ones are the bits of
    the same forward's backward without frozen parameters."""
    model = ptl.Detector("yolo26n", num_classes=3).to("cuda", dtype="float32")
    fp, fb = frozen_names(model, [4, "model.9.cv1."])
    same_forward, _ = backward(model, fb)
    got, _ = backward(model, fp + fb)
    assert all(not got[n].any() for n in fp)
    assert all(np.array_equal(got[n], same_forward[n]) for n in got if n not in set(fp))


@pytest.mark.cuda
def test_cuda_fit_with_freeze_replays_the_eager_fit(coco256, tmp_path):
    """A CUDA fit with freeze leaves the frozen tensors bit-identical, and its recorded network (made after
    the mask was set) gives the eager fit's digests."""
    digests, seen = [], []

    class Watch(ptl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(pl_module.recorded)

    for capture in (False, True):
        model = ptl.Detector("yolo26n", num_classes=80, hparams=HP)
        start = model.state_dict()
        seen.clear()
        tr = Trainer(default_root_dir=str(tmp_path / str(capture)), accelerator="cuda", devices=1, max_epochs=1,
                     limit_train_batches=3, limit_val_batches=1, enable_progress_bar=False, seed=0, freeze=3,
                     callbacks=[Watch()])
        tr.fit(model, small_data(coco256), capture_network=capture)
        assert any(seen) == capture  # the captured fit replayed
        end = model.state_dict()
        fp, fb = frozen_names(model, 3)
        assert all(np.array_equal(end[n], start[n]) for n in fp + fb)
        digests.append(tr.digest())
    assert digests[0] == digests[1]
