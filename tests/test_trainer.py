"""Trainer: hook order, artifacts, digests, exact resume, crash safety, CLI (CPU fits on coco256)."""
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import ptl
from ptl import callbacks as cb
from ptl.data import DetectionData
from ptl.engine import ITEM
from ptl.trainer import Trainer

IMGSZ = 64


def small_data(coco256, **kw):
    kw.setdefault("imgsz", IMGSZ)
    kw.setdefault("batch_size", 4)
    kw.setdefault("workers", 2)
    return DetectionData(str(coco256 / "data.yaml"), verbose=False, **kw)


def small_trainer(tmp_path, **kw):
    kw.setdefault("max_epochs", 2)
    kw.setdefault("limit_train_batches", 2)
    kw.setdefault("limit_val_batches", 1)
    kw.setdefault("accelerator", "cpu")
    kw.setdefault("enable_progress_bar", False)
    kw.setdefault("seed", 0)
    return Trainer(default_root_dir=str(tmp_path), **kw)


def fits_eager_and_replayed(root, make_data, **kw):
    """Two CUDA fits of a new yolo26n on new data (make_data()), eager and then replaying the recorded network:
    each one's digest, whether each of its training batches replayed, and its model."""
    fits, seen = [], []

    class Watch(cb.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(pl_module.recorded)

    for capture in (False, True):
        seen.clear()
        tr = small_trainer(root / str(capture), accelerator="cuda", callbacks=[Watch()], **kw)
        model = ptl.Detector("yolo26n")
        tr.fit(model, make_data(), capture_network=capture)
        fits.append((tr.digest(), list(seen), model))
    return fits


class Recorder(cb.Callback):
    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        if name in cb.HOOKS:
            calls = object.__getattribute__(self, "calls")
            return lambda *a, **k: calls.append(name)
        return object.__getattribute__(self, name)


def expected_order(epochs, batches):
    seq = ["setup", "on_fit_start", "on_sanity_check_start", "on_validation_start", "on_validation_epoch_start",
           "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end",
           "on_sanity_check_end", "on_train_start"]
    for _ in range(epochs):
        seq.append("on_train_epoch_start")
        seq += ["on_train_batch_start", "on_train_batch_end"] * batches
        seq += ["on_validation_start", "on_validation_epoch_start"]
        seq += ["on_validation_batch_start", "on_validation_batch_end"]
        seq += ["on_validation_epoch_end", "on_validation_end", "on_train_epoch_end"]
    return seq + ["on_train_end", "on_fit_end", "teardown"]


def test_hook_order_matches_lightning(coco256, tmp_path):
    rec = Recorder()
    tr = small_trainer(tmp_path, callbacks=[rec], enable_checkpointing=False)
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    assert rec.calls == expected_order(2, 2)
    assert tr.current_epoch == 2 and tr.global_step >= 1
    for key in ("train/box_loss", "val/cls_loss", "metrics/mAP50-95", "fitness"):
        assert key in tr.callback_metrics and np.isfinite(tr.callback_metrics[key])
    assert tr.ap_per_class and set(tr.ap_per_class) <= set(small_data(coco256).names)


def test_validate_alone(coco256, tmp_path):
    """trainer.validate on a fresh trainer (default callbacks, with and without a logger): Lightning's
    validation hooks in order, the metrics, no file written (checkpointing and early stopping act only
    while fitting), and the same numbers as the validation the same weights get inside a fit."""
    model = ptl.Detector("yolo26n")
    for logger in (True, False):
        rec, stop = Recorder(), cb.EarlyStopping(monitor="fitness", mode="max", patience=0)
        tr = small_trainer(tmp_path / str(logger), callbacks=[rec, stop], logger=logger)
        res = tr.validate(model, small_data(coco256))
        assert rec.calls == ["setup", "on_validation_start", "on_validation_epoch_start",
                             "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_end",
                             "on_validation_end", "teardown"]
        assert set(res[0]) >= {"val/box_loss", "metrics/mAP50-95", "fitness"}
        assert all(np.isfinite(v) for v in res[0].values())
        assert stop.best_score is None and tr.state.fn is None
        assert not os.path.exists(tmp_path / str(logger)) or not any(os.scandir(tmp_path / str(logger)))
    tr = small_trainer(tmp_path / "fit", max_epochs=1, limit_train_batches=1, enable_checkpointing=False)
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    again = small_trainer(tmp_path / "again").validate(tr._engine.ema_detector(), small_data(coco256))[0]
    assert again == {k: tr.callback_metrics[k] for k in again}


def test_fit_writes_artifacts_and_digests_repeat(coco256, tmp_path):
    """Issue 7: a CPU fit at 128 for 2 short epochs writes every artifact; two fits (with 1 and 3 loader
    threads) give one digest."""
    runs = []
    for k in range(2):
        tr = small_trainer(tmp_path / str(k))
        tr.fit(ptl.Detector("yolo26n"), small_data(coco256, imgsz=128, workers=1 + 2 * k))
        runs.append(tr)
    d0, d1 = runs[0].digest(), runs[1].digest()
    assert set(d0) == {"losses", "model", "optimizer", "schedule", "ema", "metrics"}
    assert d0 == d1
    log = runs[0].log_dir
    assert log.endswith(os.path.join("runs", "train", "version_0"))
    rows = open(os.path.join(log, "metrics.csv")).read().splitlines()
    assert len(rows) == 3 and "metrics/mAP50-95" in rows[0] and "lr/pg0_weight" in rows[0]
    assert os.path.exists(os.path.join(log, "hparams.yaml"))
    ckpts = sorted(os.listdir(os.path.join(log, "checkpoints")))
    assert ckpts == ["best.ckpt", "last.ckpt"]
    try:
        import matplotlib  # noqa: F401
        assert os.path.exists(os.path.join(log, "results.png"))
    except ImportError:
        pass
    t, meta = ptl.load_safetensors(os.path.join(log, "checkpoints", "last.ckpt"))
    header = json.loads(meta["ptl.trainer"])
    assert header["epoch"] == 2 and header["global_step"] == runs[0].global_step
    assert any(k.startswith("model.") for k in t) and any(k.startswith("ema.") for k in t)


class StopAfter(cb.Callback):
    def __init__(self, epochs):
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch >= self.epochs:
            trainer.should_stop = True


def test_resume_is_exact(coco256, tmp_path):
    full = small_trainer(tmp_path / "full", max_epochs=3)
    full.fit(ptl.Detector("yolo26n"), small_data(coco256))

    first = small_trainer(tmp_path / "part", max_epochs=3, callbacks=[StopAfter(1)])
    first.fit(ptl.Detector("yolo26n"), small_data(coco256))
    assert first.current_epoch == 1
    last = os.path.join(first.log_dir, "checkpoints", "last.ckpt")
    resumed = small_trainer(tmp_path / "part", max_epochs=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ptl.ResumeWarning)  # nothing differs from the uninterrupted run
        resumed.fit(ptl.Detector("yolo26n", seed=123), small_data(coco256), ckpt_path=last)
    assert resumed.current_epoch == 3
    assert resumed.digest() == full.digest()


def test_crash_while_checkpointing_keeps_the_previous_file(coco256, tmp_path):
    tr = small_trainer(tmp_path, max_epochs=1)
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    path = os.path.join(tr.log_dir, "checkpoints", "last.ckpt")
    before = open(path, "rb").read()

    ptl.io._inject_write_fault(1000)  # the disk fails after 1000 bytes of the next write
    with pytest.raises(OSError, match="injected failure"):
        tr.save_checkpoint(path)
    assert open(path, "rb").read() == before
    resumed = small_trainer(tmp_path / "r", max_epochs=2)
    with pytest.warns(ptl.ResumeWarning, match="planned for 1 epoch"):
        resumed.fit(ptl.Detector("yolo26n"), small_data(coco256), ckpt_path=path)
    assert resumed.current_epoch == 2


KILLED_FIT = textwrap.dedent("""
    import sys
    import ptl
    from ptl import callbacks as cb
    from ptl.data import DetectionData
    from ptl.trainer import Trainer

    class PauseSecondCheckpoint(cb.Callback):
        armed = False

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            # the second epoch's first checkpoint write (the first epoch's are done: a save waits for the
            # previous one's files) stops half-way and waits to be killed
            if trainer.current_epoch_completed == 2 and not self.armed:
                self.armed = True
                ptl.io._inject_write_fault(int(sys.argv[3]), pause_ms=120_000)

    data = DetectionData(sys.argv[2], imgsz=64, batch_size=4, workers=2, verbose=False)
    tr = Trainer(max_epochs=2, limit_train_batches=1, limit_val_batches=1, accelerator="cpu", seed=0,
                 enable_progress_bar=False, logger=False, default_root_dir=sys.argv[1],
                 callbacks=[PauseSecondCheckpoint(), cb.ModelCheckpoint(filename="best", monitor="fitness",
                                                                        mode="max", save_last=True)])
    tr.fit(ptl.Detector("yolo26n"), data)
""")


def test_fit_killed_mid_checkpoint_loses_nothing(coco256, tmp_path):
    """kill -9 during a checkpoint write: the previous epoch's files are intact and resumable, and the
    next fit in that folder removes the killed write's temporary file (and only that)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(ptl.__file__))] + sys.path))
    folder = tmp_path / "checkpoints"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_FIT, str(tmp_path), str(coco256 / "data.yaml"),
                             "5000000"], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    try:
        while True:
            names = os.listdir(folder) if folder.exists() else []
            temps = [f for f in names if ".tmp." in f]
            # the first epoch's two files are complete and the paused write has stopped at its 5,000,000 bytes
            if {"best.ckpt", "last.ckpt"} <= set(names) and temps and \
                    os.path.getsize(folder / temps[0]) == 5_000_000:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the fit never reached its second checkpoint"
            time.sleep(0.05)
        digests = {n: open(folder / n, "rb").read() for n in ("best.ckpt", "last.ckpt")}
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert sorted(os.listdir(folder)) == sorted(["best.ckpt", "last.ckpt"] + temps)
    for name, content in digests.items():
        assert open(folder / name, "rb").read() == content
    resumed = small_trainer(tmp_path, logger=False, max_epochs=2, limit_train_batches=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ptl.ResumeWarning)
        resumed.fit(ptl.Detector("yolo26n"), small_data(coco256), ckpt_path=folder / "last.ckpt")
    assert resumed.current_epoch == 2
    assert not any(".tmp." in f for f in os.listdir(folder))
    assert open(folder / "last.ckpt", "rb").read() == digests["last.ckpt"]  # the older run's: -v1 now
    assert sorted(os.listdir(folder)) == ["best.ckpt", "last-v1.ckpt", "last.ckpt"] or \
        sorted(os.listdir(folder)) == ["best-v1.ckpt", "best.ckpt", "last-v1.ckpt", "last.ckpt"]


class Raiser(cb.Callback):
    def __init__(self):
        self.seen = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        raise RuntimeError("boom in callback")

    def on_exception(self, trainer, pl_module, exception):
        self.seen = exception


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def _threads():
    return len(os.listdir("/proc/self/task"))


def test_callback_exception_reaches_caller_and_cleans_up(coco256, tmp_path):
    data = small_data(coco256)
    fds, threads = _open_fds(), _threads()
    r = Raiser()
    tr = small_trainer(tmp_path, callbacks=[r])
    with pytest.raises(RuntimeError, match="boom in callback"):
        tr.fit(ptl.Detector("yolo26n"), data)
    assert isinstance(r.seen, RuntimeError)
    del tr, data
    import gc
    gc.collect()
    assert _open_fds() <= fds
    assert _threads() <= threads


@pytest.mark.slow
def test_overfitting_four_images_halves_the_loss(coco256, tmp_path):
    """50 steps at 128 px: 16 s on an idle 2-core machine, 200-245 s on a busy one or on CI (slow tier,
    which CI runs in its own step)."""
    imgs = sorted((coco256 / "images" / "train2017").glob("*.jpg"))[:4]
    (tmp_path / "four.txt").write_text("\n".join(str(p) for p in imgs) + "\n")
    (tmp_path / "four.yaml").write_text("path: %s\ntrain: four.txt\nval: four.txt\nnames: %s\n"
                                        % (tmp_path, json.dumps([str(i) for i in range(80)])))
    data = DetectionData(str(tmp_path / "four.yaml"), imgsz=128, batch_size=4, workers=2, mosaic=0.0,
                         translate=0.0, scale=0.0, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, verbose=False)
    model = ptl.Detector("yolo26n")
    model.hparams = {"optimizer": "AdamW", "lr0": 0.002, "warmup_epochs": 0.0}
    tr = Trainer(max_epochs=50, accelerator="cpu", accumulate_grad_batches=1, check_val_every_n_epoch=50,
                 enable_progress_bar=False, enable_checkpointing=False, logger=False,
                 default_root_dir=str(tmp_path), seed=0)
    tr.fit(model, data)
    first, last = tr.loss_history[0][0], tr.loss_history[-1][0]
    assert tr.global_step == 50
    assert last < 0.5 * first, (first, last)


def test_limit_val_batches_zero_skips_validation(coco256, tmp_path):
    rec = Recorder()
    tr = small_trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0, callbacks=[rec])
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    assert "on_validation_start" not in rec.calls and "val/box_loss" not in tr.callback_metrics
    assert os.path.exists(os.path.join(tr.log_dir, "checkpoints", "last.ckpt"))


@pytest.mark.parametrize("kw,words", [
    ({"precision": "8-true"}, "precision"), ({"precision": ["32-true"]}, "precision"),
    ({"max_epochs": 0}, "max_epochs"), ({"max_epochs": 2.0}, "max_epochs"), ({"max_epochs": True}, "max_epochs"),
    ({"max_steps": 0}, "max_steps"), ({"max_steps": -2}, "max_steps"),
    ({"accelerator": "tpu"}, "accelerator"), ({"devices": 0}, "devices"), ({"devices": True}, "devices"),
    ({"devices": [0, 1], "accelerator": "cpu"}, "devices"), ({"num_nodes": 0}, "num_nodes"),
    ({"strategy": "fsdp"}, "strategy"), ({"timeout": -1}, "timeout"),
    ({"devices": [1, 1], "accelerator": "cuda"}, "twice"), ({"devices": "x"}, "devices"),
    ({"max_time": "1:00"}, "max_time"), ({"max_time": "00:00:00:00"}, "positive"), ({"max_time": 5}, "max_time"),
    ({"max_time": {"hour": 1}}, "max_time"), ({"val_check_interval": 0}, "val_check_interval"),
    ({"val_check_interval": 1.5}, "val_check_interval"), ({"val_check_interval": "1"}, "val_check_interval"),
    ({"num_sanity_val_steps": -2}, "num_sanity_val_steps"), ({"fast_dev_run": -1}, "fast_dev_run"),
    ({"fast_dev_run": 1.5}, "fast_dev_run"), ({"overfit_batches": -1}, "overfit_batches"),
    ({"overfit_batches": 1.5}, "overfit_batches"), ({"patience": -1}, "patience"), ({"patience": 1.0}, "patience"),
    ({"freeze": -1}, "freeze"), ({"freeze": [1, ""]}, "freeze"), ({"freeze": "10"}, "freeze"),
    ({"precision": True}, "precision"),
    ({"limit_train_batches": 1.5}, "limit_train_batches"), ({"limit_train_batches": -1}, "limit_train_batches"),
    ({"limit_train_batches": 0}, "limit_train_batches"), ({"limit_train_batches": 0.0}, "limit_train_batches"),
    ({"limit_val_batches": "all"}, "limit_val_batches"),
    ({"accumulate_grad_batches": 0}, "accumulate_grad_batches"), ({"accumulate_grad_batches": 1.5}, "accumulate"),
    ({"gradient_clip_val": -1.0}, "gradient_clip_val"), ({"gradient_clip_val": float("nan")}, "gradient_clip_val"),
    ({"gradient_clip_val": float("inf")}, "gradient_clip_val"),
    ({"check_val_every_n_epoch": 0}, "check_val_every_n_epoch"),
    ({"callbacks": [object()]}, "callbacks"), ({"callbacks": "ProgressBar"}, "callbacks"),
    ({"logger": "tensorboard"}, "logger"), ({"enable_progress_bar": 1}, "enable_progress_bar"),
    ({"enable_checkpointing": 0}, "enable_checkpointing"), ({"deterministic": "yes"}, "deterministic"),
    ({"deterministic": 1}, "deterministic"),
    ({"default_root_dir": 5}, "default_root_dir"), ({"default_root_dir": __file__}, "not a folder"),
    ({"name": ""}, "name"), ({"name": "a/b"}, "name"), ({"name": ".."}, "name"), ({"name": 3}, "name"),
    ({"seed": -1}, "seed"), ({"seed": 2 ** 64}, "seed"), ({"seed": "0"}, "seed"),
    ({"precision": "bf16-mixed", "accelerator": "cpu"}, "needs CUDA"),
])
def test_bad_trainer_arguments(kw, words):
    with pytest.raises((ValueError, TypeError), match=words):
        Trainer(**kw)


def test_fit_checks_its_arguments_before_any_work(coco256, tmp_path):
    tr = small_trainer(tmp_path)
    with pytest.raises(TypeError, match="model"):
        tr.fit("yolo26n", small_data(coco256))
    with pytest.raises(TypeError, match="datamodule"):
        tr.fit(ptl.Detector("yolo26n"), str(coco256 / "data.yaml"))
    with pytest.raises(ptl.ConfigError, match="80 classes.*the model has 3"):
        tr.fit(ptl.Detector("yolo26n", num_classes=3), small_data(coco256))
    if not ptl.cuda.is_available():
        with pytest.raises(ptl.ConfigError, match="no CUDA device"):
            small_trainer(tmp_path, accelerator="cuda").fit(ptl.Detector("yolo26n"), small_data(coco256))
    assert not os.path.exists(tmp_path / "runs")


def test_single_callback_is_accepted(tmp_path):
    stop = StopAfter(1)
    assert stop in Trainer(callbacks=stop, default_root_dir=str(tmp_path)).callbacks


def test_cli_help_and_bad_arguments(coco256, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-m", "ptl.train", "--help"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "--resume" in r.stdout and "--digest" in r.stdout
    r = subprocess.run([sys.executable, "-m", "ptl.train", "--data", "x.yaml", "--epochs", "two"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--epochs" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ptl.train", "--data", str(tmp_path / "missing.yaml")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "missing.yaml" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ptl.train", "--data", str(coco256 / "data.yaml"), "--device", "cpu",
                        "--capture-network"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--capture-network" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ptl.train", "--data", str(coco256 / "data.yaml"), "--device", "cpu",
                        "--precision", "bf16-mixed"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "precision" in r.stderr


def test_cli_fit_prints_digests(coco256, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-m", "ptl.train", "--data", str(coco256 / "data.yaml"), "--imgsz", "64",
                        "--batch", "4", "--workers", "2", "--epochs", "1", "--limit-train-batches", "2",
                        "--limit-val-batches", "1", "--device", "cpu", "--project", str(tmp_path), "--digest",
                        "--progress-bar", "false"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) == {"losses", "model", "optimizer", "schedule", "ema", "metrics"}


def test_predict_on_files_maps_boxes_to_each_file(coco256, tmp_path):
    files = sorted((coco256 / "images" / "val2017").glob("*.jpg"))[:3]
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    model = ptl.Detector("yolo26n")
    tr = Trainer(accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False, logger=False)
    with pytest.warns(ptl.DataWarning, match="broken.jpg"):
        res = tr.predict(model, [str(files[0]), str(bad), str(files[1]), str(files[2])], conf=0.0, imgsz=64)
    assert res[1] is None and all(r is not None for r in (res[0], res[2], res[3]))
    shapes = ptl.DetectionData(str(coco256 / "data.yaml"), verbose=False).shapes("val")
    for r in (res[0], res[2], res[3]):
        assert r["boxes"].shape[1] == 4 and len(r["scores"]) == len(r["classes"]) <= 300
        assert np.all(np.diff(r["scores"]) <= 0)
        assert r["boxes"].min() >= 0
    h0, w0 = shapes[0]
    assert res[0]["boxes"][:, [0, 2]].max() <= w0 and res[0]["boxes"][:, [1, 3]].max() <= h0


def test_detector_hparams_reach_the_optimizer(coco256, tmp_path):
    with pytest.raises(ptl.ConfigError, match="hparams: unknown key 'bogus'"):
        ptl.Detector("yolo26n", hparams={"bogus": 1})
    model = ptl.Detector("yolo26n", hparams={"optimizer": "SGD", "lr0": 0.05, "warmup_epochs": 0.0})
    tr = small_trainer(tmp_path, max_epochs=1, limit_train_batches=1, enable_checkpointing=False)
    tr.fit(model, small_data(coco256))
    groups = tr._engine.opt.param_groups
    assert {g["kind"] for g in groups} == {"sgd"}
    assert all(abs(g["lr"] - 0.05) < 1e-12 for g in groups)  # lf(0) = 1, no warm-up
    assert tr.hparams()["model"]["resolved_optimizer"]["name"] == "SGD"


@pytest.mark.cuda
def test_cuda_detector_round_trip_and_predict(coco256):
    model = ptl.Detector("yolo26n")
    before = model.state_dict()
    model.to("cuda", dtype="float32")
    assert model.device.startswith("cuda") and model.flat_parameters.device.startswith("cuda")
    img = (np.random.default_rng(0).random((2, 64, 96, 3)) * 255).astype(np.uint8)
    gpu = model.predict(img, conf=0.0)
    model.to("cpu")
    cpu = model.predict(img, conf=0.0)
    after = model.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g["scores"][:50], c["scores"][:50], rtol=1e-4, atol=1e-6)


@pytest.mark.cuda
def test_cuda_first_losses_match_cpu(coco256, tmp_path):
    losses = []
    for acc in ("cpu", "cuda"):
        tr = small_trainer(tmp_path / acc, max_epochs=1, limit_train_batches=1, limit_val_batches=1,
                           accelerator=acc, enable_checkpointing=False, precision="32-true")
        tr.fit(ptl.Detector("yolo26n"), small_data(coco256, imgsz=128))
        losses.append(np.asarray(tr.loss_history[0], np.float64))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4, atol=1e-6)


@pytest.mark.cuda
def test_cuda_float32_matmul_precision_reaches_the_convolutions(coco256, tmp_path):
    """float32_matmul_precision="high" gives a 32-true fit's executor TF32 convolutions; the default keeps
    them strict; the first losses agree to TF32's rounding."""
    losses = {}
    for fmp in ("highest", "high"):
        tr = small_trainer(tmp_path / fmp, max_epochs=1, limit_train_batches=1, limit_val_batches=1,
                           accelerator="cuda", enable_checkpointing=False, precision="32-true",
                           float32_matmul_precision=fmp)
        model = ptl.Detector("yolo26n")
        tr.fit(model, small_data(coco256, imgsz=128))
        assert model.info()["conv_options"]["allow_tf32"] is (fmp == "high")
        assert tr.hparams()["trainer"]["float32_matmul_precision"] == fmp
        losses[fmp] = np.asarray(tr.loss_history[0], np.float64)
    np.testing.assert_allclose(losses["high"], losses["highest"], rtol=1e-2, atol=1e-5)


@pytest.mark.cuda
def test_cuda_benchmark_reaches_the_convolutions(coco256, tmp_path):
    """benchmark=True gives the executor timed conv plans, and a fit with them replayed gives the eager fit's
    digest (one process: the second fit takes the plans the first one's search chose)."""
    (eager, seen_e, model_e), (replayed, seen_r, model_r) = fits_eager_and_replayed(
        tmp_path, lambda: small_data(coco256), max_epochs=1, limit_train_batches=3, limit_val_batches=1,
        enable_checkpointing=False, benchmark=True)
    assert model_e.info()["conv_options"]["find"] is True and model_r.info()["conv_options"]["find"] is True
    assert not any(seen_e) and any(seen_r)
    assert eager == replayed


def test_float32_matmul_precision_is_checked():
    with pytest.raises(ptl.ConfigError, match="float32_matmul_precision"):
        Trainer(float32_matmul_precision="tf32")
    assert Trainer().float32_matmul_precision == "highest"


def test_benchmark_is_checked(coco256, tmp_path):
    """benchmark (cuDNN's timed choice) is a bool, off by default, recorded in hparams; on the CPU a fit with it
    trains exactly as one without."""
    with pytest.raises(ptl.ConfigError, match="benchmark"):
        Trainer(benchmark=1)
    assert Trainer().benchmark is False
    losses = []
    for on in (False, True):
        tr = small_trainer(tmp_path / str(on), benchmark=on, max_steps=2)
        assert tr.hparams()["trainer"]["benchmark"] is on
        tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
        losses.append(np.asarray(tr.loss_history))
    assert losses[0].size and np.array_equal(losses[0], losses[1])


def test_all_reduce_in_graph_is_checked(coco256, tmp_path):
    """all_reduce_in_graph is a bool, off by default, recorded in hparams, and refused without graph
    replay, before anything is written."""
    with pytest.raises(ptl.ConfigError, match="all_reduce_in_graph"):
        Trainer(all_reduce_in_graph="yes")
    assert Trainer().all_reduce_in_graph is False
    tr = small_trainer(tmp_path / "run", all_reduce_in_graph=True)
    assert tr.hparams()["trainer"]["all_reduce_in_graph"] is True
    with pytest.raises(ptl.ConfigError, match=r"capture_network=True"):
        tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    assert not (tmp_path / "run").exists()


def _falls(losses, k=16, column=0):
    """The mean loss (the total, or another column of the losses vector) of the last k batches is below that
    of the first k."""
    t = np.asarray(losses, np.float64)
    t = t[:, column].sum(axis=1) if isinstance(column, slice) else t[:, column]
    return t[-k:].mean() < t[:k].mean(), (t[:k].mean(), t[-k:].mean())


@pytest.mark.cuda
def test_cuda_fit_one_epoch_640_bf16(coco256, tmp_path):
    """Issue 7: a 4-epoch fit at 640, batch 4, bf16-mixed, 4 workers, RAM cache on the GPU, an optimizer
    step every batch: the loss items (the one-to-one head's box, cls and L1 terms, which the o2m/o2o
    weighting of the total does not move) fall, and the same fit with the network replayed gives the same
    digests."""
    data = DetectionData(str(coco256 / "data.yaml"), imgsz=640, batch_size=4, workers=4, cache="ram",
                         verbose=False)
    digests = []
    for capture in (False, True):
        tr = Trainer(max_epochs=4, precision="bf16-mixed", accelerator="cuda", enable_progress_bar=False,
                     default_root_dir=str(tmp_path / str(capture)), seed=0, accumulate_grad_batches=1)
        tr.fit(ptl.Detector("yolo26n", seed=0, hparams={"warmup_epochs": 0}), data, capture_network=capture)
        assert tr.global_step == 4 * len(data.train_loader()) == len(tr.loss_history)
        assert np.isfinite(np.asarray(tr.loss_history)).all()
        falls, means = _falls(tr.loss_history, column=ITEM)
        assert falls, "loss items, first/last 16 batches: %.4f -> %.4f" % means
        assert np.isfinite(tr.callback_metrics["metrics/mAP50-95"])
        assert os.path.exists(os.path.join(tr.log_dir, "checkpoints", "last.ckpt"))
        digests.append(tr.digest())
    assert digests[0] == digests[1]
    assert ptl.cuda.max_memory_allocated() > 0


def test_loss_gains_are_hyperparameters(coco256, tmp_path):
    """hparams box / cls / dfl reach the objective: the logged items scale with their gains, and the
    run's hparams.yaml records them. Bad gains raise naming the key."""
    items = []
    for k, hp in enumerate(({}, {"box": 1.5, "cls": 2.0, "dfl": 3.0})):
        tr = small_trainer(tmp_path / str(k), max_epochs=1, limit_train_batches=1, enable_checkpointing=False)
        tr.fit(ptl.Detector("yolo26n", hparams=hp), small_data(coco256))
        items.append(np.asarray(tr.loss_history[0], np.float64)[7:10])
        assert tr.hparams()["model"]["box"] == hp.get("box", 7.5)
    np.testing.assert_allclose(items[1] / items[0], [1.5 / 7.5, 2.0 / 0.5, 3.0 / 1.5], rtol=1e-5)
    with pytest.raises(ValueError, match="cls"):
        ptl.Detector("yolo26n", hparams={"cls": -1.0})


def test_batch_end_gets_a_lazy_loss(coco256, tmp_path):
    """on_train_batch_end's outputs["loss"] reads back only when asked and equals the batch's total."""
    seen = []

    class Grab(cb.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(outputs["loss"])

    tr = small_trainer(tmp_path, max_epochs=1, limit_train_batches=3, callbacks=[Grab()],
                       enable_checkpointing=False)
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    assert [float(v) for v in seen] == [float(r[0]) for r in tr.loss_history]
    assert "%.3f" % seen[0] == "%.3f" % tr.loss_history[0][0]
    # at the epoch's end the train/* metrics are the epoch means of the logged items
    np.testing.assert_allclose(tr.callback_metrics["train/box_loss"], np.mean(np.asarray(tr.loss_history)[:, 7]),
                               rtol=1e-6)


class _ScaleLog(cb.Callback):
    """Per batch: the loss scale before and after, whether the step was skipped, and whether the weights
    moved (reads the device every batch: a test only)."""

    def __init__(self, start_scale):
        self.start_scale, self.rows = start_scale, []

    def on_train_start(self, trainer, pl_module):
        opt = trainer._engine.opt
        sc = np.asarray(opt.scalars.numpy()).copy()
        sc[ptl.optim.SCALE_INDEX] = self.start_scale  # far too large: the first steps must overflow
        ptl._C._optim_copy(opt.scalars, ptl.tensor(sc, device="cuda"))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._before = (trainer._engine.opt.scale, np.asarray(pl_module.flat_parameters.numpy()).copy())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        opt = trainer._engine.opt
        scale0, w0 = self._before
        moved = not np.array_equal(np.asarray(pl_module.flat_parameters.numpy()), w0)
        self.rows.append((scale0, opt.scale, opt.last_step_skipped, moved))


@pytest.mark.cuda
def test_cuda_fit_float16_loss_scaling(coco256, tmp_path):
    """16-mixed: started at a loss scale of 2^30, every overflowing step is skipped (weights unchanged)
    and halves the scale; every other step updates the weights at an unchanged scale (the growth interval
    is far off); the scale settles at a power of two, and over the fit the loss falls as a bf16 fit's does,
    from a first loss within 5% of it."""
    first = {}
    for prec in ("16-mixed", "bf16-mixed"):
        log = _ScaleLog(2.0 ** 30)
        tr = small_trainer(tmp_path / prec, max_epochs=6, limit_train_batches=1.0, precision=prec,
                           accelerator="cuda", enable_checkpointing=False, accumulate_grad_batches=1,
                           callbacks=[log] if prec == "16-mixed" else [])
        tr.fit(ptl.Detector("yolo26n", seed=0, hparams={"warmup_epochs": 0}), small_data(coco256, imgsz=128))
        assert np.isfinite(np.asarray(tr.loss_history)).all()
        first[prec] = float(tr.loss_history[0][0])
        falls, means = _falls(tr.loss_history)
        assert falls, "%s loss first/last 16 batches: %.4f -> %.4f" % ((prec,) + means)
        if prec == "16-mixed":
            rows = log.rows
            skipped = [r for r in rows if r[2]]
            assert len(skipped) >= 1 and rows[0][2], rows[:3]
            for before, after, skip, moved in rows:
                assert (after, moved) == ((before * 0.5, False) if skip else (before, True)), rows
            assert len(skipped) < len(rows) - 20  # the scale came down and most steps trained
            scale = tr._engine.opt.scale
            assert scale < 2.0 ** 30 and np.log2(scale) == int(np.log2(scale))
    assert abs(first["16-mixed"] - first["bf16-mixed"]) <= 0.05 * abs(first["bf16-mixed"])


def _separate_calls_step(eng, batch, epoch, i):
    """The step as separate bindings (the pre-fusion trainer loop), for comparison with _C.train_step."""
    from ptl.objective import o2m_weight
    st = eng.trainer._state
    ni = st.batches_seen
    eng.schedule.apply(eng.opt, epoch, i)
    out = eng.model.forward(batch.images)
    h, w = batch.images.shape[1:3]
    res = ptl.objective((*out["one2many"], *out["one2one"]), batch.targets, img_size=(h, w),
                        o2m_weight=o2m_weight(epoch, eng.trainer.max_epochs_effective), gains=eng.model.loss_gains)
    g = res["grads"]
    eng.model.backward({"one2many": (g[0], g[1]), "one2one": (g[2], g[3])})
    if eng._due(ni):
        eng.opt.step()
        eng.schedule.stepped(ni)
        st.global_step += 1
    st.batches_seen += 1
    return np.asarray(res["losses"])


def test_fused_step_equals_separate_calls(coco256, tmp_path):
    """_C.train_step (one call per step) computes the bits of the separate calls it replaces: losses,
    weights, optimizer state and EMA after steps with and without an optimizer update."""
    from ptl.engine import Engine as _Engine
    runs = []
    for fused in (True, False):
        data = small_data(coco256)
        tr = small_trainer(tmp_path / str(fused), max_epochs=1, accumulate_grad_batches=2,
                           enable_checkpointing=False)
        model = ptl.Detector("yolo26n", hparams={"box": 5.0})
        tr.model, tr.datamodule = model, data
        eng = tr._engine = _Engine(tr, model, data)
        data.set_epoch(0)
        losses = []
        for i, batch in enumerate(eng.train_loader):
            if i == 4:
                break
            losses.append(np.asarray(eng.train_step(batch, 0, i)) if fused else _separate_calls_step(eng, batch, 0, i))
        runs.append((np.array(losses), model.flat_parameters.numpy(), eng.opt.state2.numpy(), eng.opt.ema.params.numpy(),
                     eng.opt.ema.updates, tr.global_step))
        eng.close()
    (l1, p1, s1, e1, u1, g1), (l2, p2, s2, e2, u2, g2) = runs
    assert g1 == g2 == 2 and u1 == u2 == 2
    for a, b in ((l1, l2), (p1, p2), (s1, s2), (e1, e2)):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_capture_network_needs_cuda(coco256, tmp_path):
    with pytest.raises(ValueError, match="capture_network"):
        small_trainer(tmp_path).fit(ptl.Detector("yolo26n"), small_data(coco256), capture_network=True)


@pytest.mark.cuda
@pytest.mark.parametrize("precision,batch", [("bf16-mixed", 48), ("16-mixed", 48), ("32-true", 48), ("bf16-mixed", 32)])
def test_cuda_capture_network_fit_equals_eager(coco256, tmp_path, precision, batch):
    """ARCHITECTURE.md §3 rule 2: a fit that replays the recorded network gives the digests of the same
    fit run eagerly (losses, weights, optimizer, schedule, EMA, metrics), with gradient accumulation and
    a partial last batch (128 images in batches of 48: 48, 48, 32) or none (batches of 32). The first full
    step records, the next replay; a partial batch runs eagerly in its own shape slot; validation (eval
    mode, on the EMA's weights, in the eval slot) leaves the recording unused, or retires it when it grows
    the shared layer scratch, so the next epoch's first step replays or records again. Nothing is left
    recorded after the fit."""
    fits = fits_eager_and_replayed(tmp_path, lambda: small_data(coco256, batch_size=batch), max_epochs=2,
                                   limit_train_batches=None, precision=precision, accumulate_grad_batches=2)
    full = [True, True, False] if batch == 48 else [True] * 4
    for capture, (_, seen, model) in zip((False, True), fits):
        assert seen == (full * 2 if capture else [False] * len(full) * 2)
        assert not model.recorded
    assert fits[0][0] == fits[1][0]


@pytest.mark.cuda
def test_cuda_early_launch_changes_no_bit(coco256, tmp_path):
    """Kernels that start while the one ahead of them finishes (programmatic dependent launch, on by default
    on an H100/H200) still wait for its results: a fit with eager steps, recorded and replayed steps and
    validation gives the digests of the same fit with plain launches (PTL_PDL=0)."""
    script = ("import json, sys, ptl; from ptl import cuda; "
              "tr = ptl.Trainer(max_epochs=1, accelerator='cuda', precision='bf16-mixed', limit_train_batches=4, "
              "limit_val_batches=1, accumulate_grad_batches=2, logger=False, enable_checkpointing=False, "
              "enable_progress_bar=False, default_root_dir=sys.argv[2]); "
              "data = ptl.DetectionData(sys.argv[1], imgsz=256, batch_size=8, workers=2, verbose=False); "
              "tr.fit(ptl.Detector('yolo26n'), data, capture_network=True); "
              "print(json.dumps([cuda.early_launch(), tr.digest()]))")
    runs = []
    for flag in ("1", "0"):
        env = dict(os.environ, PTL_PDL=flag, PYTHONPATH=os.pathsep.join(sys.path))
        r = subprocess.run([sys.executable, "-c", script, str(coco256 / "data.yaml"), str(tmp_path / flag)],
                           capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    (on, d_on), (off, d_off) = runs
    major, _ = ptl.cuda.get_device_capability()
    assert on == (major >= 9) and off is False
    assert d_on == d_off


def test_fused_step_accumulates_parameter_gradients(coco256, tmp_path):
    """Gradient accumulation through _C.train_step: two micro-batches without an optimizer step leave the
    sum of their separate gradients (to float32 rounding: a kernel adds its partial sums into the live
    gradient one by one, so the order of the additions differs), and the optimizer step zeroes them."""
    from ptl.engine import Engine as _Engine
    data = small_data(coco256)
    tr = small_trainer(tmp_path, max_epochs=1, enable_checkpointing=False)
    model = ptl.Detector("yolo26n")
    tr.model, tr.datamodule = model, data
    eng = tr._engine = _Engine(tr, model, data)
    data.set_epoch(0)
    it = iter(eng.train_loader)
    b1, b2 = next(it), next(it)
    lrs, moms, wds = eng.opt.group_values()

    def step(batch, optimize=False):
        t = ptl.from_numpy(np.ascontiguousarray(batch.targets, dtype=np.float32))
        ptl._C.train_step(eng._plan(batch.images.shape), batch.images, t, 0.5, optimize, lrs, moms, wds, 0.999)
        return model.flat_gradients.numpy()

    buf0 = model.flat_buffers.numpy()
    model.zero_grad()
    g1 = step(b1)
    model.zero_grad()
    g2 = step(b2)
    model.zero_grad()
    model.flat_buffers = buf0
    step(b1)
    g12 = step(b2)
    assert np.count_nonzero(g1) > 0.9 * g1.size and not np.array_equal(g1, g2)
    ref = g1.astype(np.float64) + g2
    assert np.linalg.norm(g12 - ref) <= 1e-6 * np.linalg.norm(ref)
    assert np.abs(g12 - ref).max() <= 1e-5 * np.abs(ref).max()
    p0 = model.flat_parameters.numpy()
    assert not np.any(step(b1, optimize=True))  # the update zeroes the gradients after using them
    assert not np.array_equal(model.flat_parameters, p0)
    eng.close()


# ---- issue 15.5 / 19.5: Lightning's loop options and the time budget ----------------------------------------------

class Counter(cb.Callback):
    """Counts hooks (outside the sanity check unless asked) and records the training batches' indices."""

    def __init__(self):
        self.counts, self.sanity, self.batches, self.saves = {}, [], [], 0

    def _hit(self, trainer, name):
        if trainer.sanity_checking:
            self.sanity.append(name)
        else:
            self.counts[name] = self.counts.get(name, 0) + 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._hit(trainer, "train_batch")
        self.batches.append((trainer.current_epoch, batch.indices.tolist(), hash(batch.images.tobytes())))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._hit(trainer, "val_batch")

    def on_validation_end(self, trainer, pl_module):
        self._hit(trainer, "validation%s" % ("_mid" if trainer.validating_mid_epoch else ""))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.saves += 1


def test_time_budget_stops_with_a_loadable_checkpoint(coco256, tmp_path):
    """A 1-second budget stops the first epoch after the step that passes it; it still validates and
    writes last.ckpt, which loads (as weights and to resume), and the plan shrinks to the one epoch."""
    tr = small_trainer(tmp_path, max_time={"seconds": 1}, max_epochs=None, limit_train_batches=None)
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    assert tr.current_epoch == 1 and 0 < len(tr.loss_history) < tr.num_training_batches
    assert tr.max_epochs_effective == 1 and tr.validated_this_epoch
    last = os.path.join(tr.log_dir, "checkpoints", "last.ckpt")
    header = json.loads(ptl.load_safetensors(last)[1]["ptl.trainer"])
    assert header["epoch"] == 1 and header["batches_seen"] == len(tr.loss_history)
    assert ptl.Detector.load(last).num_classes == 80


def test_time_budget_sets_the_schedule_length(coco256, tmp_path, monkeypatch):
    """Ultralytics' rule, on a clock where every epoch takes 10 s: after each epoch the plan is
    ceil(budget / 10 s) epochs; it sets the optimizer config's epochs (the LR schedule) and the data's
    (close_mosaic); an explicit max_epochs caps it."""
    import ptl.trainer as trainer_module
    now = [0.0]
    monkeypatch.setattr(trainer_module, "_clock", lambda: now[0])

    class Tick(cb.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            now[0] += 10.0

    for budget, max_epochs, done in ((25, None, 3), (25, 2, 2)):
        tr = small_trainer(tmp_path / str(budget) / str(max_epochs), max_time={"seconds": budget},
                           max_epochs=max_epochs, limit_train_batches=1, limit_val_batches=0,
                           accumulate_grad_batches=1, enable_checkpointing=False, callbacks=[Tick()])
        data = small_data(coco256)
        tr.fit(ptl.Detector("yolo26n"), data)
        assert tr.current_epoch == done, (budget, max_epochs)
        planned = min(math.ceil(budget / 10), max_epochs or 100)
        assert tr.max_epochs_effective == planned == tr._engine.cfg.epochs == data.epochs
        now[0] = 0.0


def _broken_val_dataset(root, coco256):
    """coco256's training split, and a validation split of 4 PNGs cut in their image data: the scan
    passes them, every decode fails."""
    import yaml
    from PIL import Image
    sys.path.insert(0, os.path.dirname(__file__))
    import bad_data
    cfg = yaml.safe_load((coco256 / "data.yaml").read_text())
    for i, src in enumerate(sorted((coco256 / "images" / "val2017").glob("*.jpg"))[:4]):
        img = np.asarray(Image.open(src).convert("RGB"))
        (root / "images" / "val").mkdir(parents=True, exist_ok=True)
        (root / "labels" / "val").mkdir(parents=True, exist_ok=True)
        (root / "images" / "val" / ("im%d.png" % i)).write_bytes(bad_data.truncated_png(bad_data.png_bytes(img)))
        (root / "labels" / "val" / ("im%d.txt" % i)).write_text("0 0.5 0.5 0.2 0.2\n")
    y = root / "data.yaml"
    y.write_text(yaml.safe_dump({"path": str(root), "train": str(coco256 / "images" / "train2017"),
                                 "val": "images/val", "names": cfg["names"]}))
    return y


def test_sanity_check_catches_a_broken_val_set_before_training(coco256, tmp_path):
    y = _broken_val_dataset(tmp_path, coco256)
    for steps, trained in ((None, False), (0, True)):
        count = Counter()
        tr = small_trainer(tmp_path / str(steps), max_epochs=1, limit_train_batches=1, num_sanity_val_steps=steps,
                           callbacks=[count])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ptl.DataWarning)
            with pytest.raises(OSError, match="none of the 4 images of the dataset decodes"):
                tr.fit(ptl.Detector("yolo26n"), DetectionData(str(y), imgsz=IMGSZ, batch_size=4, workers=1,
                                                               verbose=False))
        assert ("train_batch" in count.counts) == trained, count.counts  # default: failed before any training


def test_val_check_interval_validates_inside_the_epoch(coco256, tmp_path):
    """0.5 of 4 batches: a validation after batch 2 (no checkpoint for it) and the one at the epoch's end;
    an int counts batches (1: after batches 1, 2, 3 and the epoch's end); more than an epoch's batches is
    an error."""
    for interval, mid in ((0.5, 1), (1, 3)):
        count = Counter()
        tr = small_trainer(tmp_path / str(interval), max_epochs=1, limit_train_batches=4, val_check_interval=interval,
                           callbacks=[count])
        tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
        assert count.counts.get("validation_mid", 0) == mid and count.counts["validation"] == 1, interval
        assert len(tr.val_history) == mid + 1 and count.saves == 2  # best.ckpt and last.ckpt at the epoch end
    with pytest.raises(ptl.ConfigError, match="val_check_interval=5: more than the 4 training batches"):
        small_trainer(tmp_path / "x", max_epochs=1, limit_train_batches=4, val_check_interval=5).fit(
            ptl.Detector("yolo26n"), small_data(coco256))


def test_fast_dev_run_writes_nothing(coco256, tmp_path):
    root = tmp_path / "root"
    count = Counter()
    tr = Trainer(fast_dev_run=2, accelerator="cpu", enable_progress_bar=False, default_root_dir=str(root),
                 callbacks=[count, cb.EarlyStopping("fitness", patience=0, mode="max")])
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    assert not root.exists()  # no run folder, checkpoint, log or weights file
    assert count.counts == {"train_batch": 2, "val_batch": 2, "validation": 1} and count.sanity == []
    assert tr.current_epoch == 1 and len(tr.loss_history) == 2 and not tr.should_stop and count.saves == 0


def test_overfit_batches_repeat_the_same_batches(coco256, tmp_path):
    count = Counter()
    tr = small_trainer(tmp_path, max_epochs=2, overfit_batches=2, limit_train_batches=None, callbacks=[count])
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    first = [b[1:] for b in count.batches if b[0] == 0]
    second = [b[1:] for b in count.batches if b[0] == 1]
    assert len(first) == 2 and first == second  # same images, same augmentation
    assert count.counts["val_batch"] == 4  # 2 validation batches per epoch
    data = small_data(coco256)  # without overfit_batches the epochs' first batches differ
    firsts = []
    for epoch in (0, 1):
        data.set_epoch(epoch)
        firsts.append(next(iter(data.train_loader())).indices.tolist())
    assert firsts[0] != firsts[1]


def test_patience_stops_on_fitness_as_ultralytics(coco256, tmp_path):
    assert not any(isinstance(c, cb.EarlyStopping) for c in Trainer(patience=0).callbacks)  # 0: off
    tr = small_trainer(tmp_path, max_epochs=5, limit_train_batches=1, patience=1)
    stop = [c for c in tr.callbacks if isinstance(c, cb.EarlyStopping)]
    assert len(stop) == 1 and (stop[0].monitor, stop[0].mode, stop[0].patience) == ("fitness", "max", 1)
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    fitness = [r["logged"]["fitness"] for r in tr.val_history]
    # the epoch after the last improvement stops it
    assert tr.current_epoch < 5 and fitness[-1] <= max(fitness[:-1])


def test_deterministic_is_documented_and_false_warns():
    with pytest.warns(UserWarning, match="deterministic=False changes nothing"):
        Trainer(deterministic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for value in (None, True, "warn"):
            Trainer(deterministic=value)
    assert "always deterministic" in Trainer.__doc__


def test_devices_choose_the_gpu(monkeypatch):
    """trainer.device is "cuda:N" for devices=[N]; indices are checked against the visible GPUs (a CPU-only
    machine pretends to have two)."""
    monkeypatch.setattr(ptl.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ptl.cuda, "device_count", lambda: 2)
    for devices, device in ((([1]), "cuda:1"), ("1,", "cuda:1"), (1, "cuda:0"), ("auto", "cuda:0"), ([0], "cuda:0")):
        assert Trainer(accelerator="cuda", devices=devices).device == device, devices
    assert Trainer(devices=[1]).device == "cuda:1"  # accelerator auto
    with pytest.raises(ptl.ConfigError, match="GPU 3 requested but this node has 2"):
        Trainer(accelerator="cuda", devices=[3]).device
    assert Trainer(accelerator="cpu").device == "cpu"


@pytest.mark.skipif(ptl.cuda.is_available(), reason="needs a machine without a GPU")
def test_devices_without_a_gpu():
    with pytest.raises(ptl.ConfigError, match="no CUDA device"):
        Trainer(accelerator="cuda", devices=[1]).device
    with pytest.raises(ptl.ConfigError, match="devices"):
        Trainer(devices=[1])  # auto is the CPU here, which takes a number of processes
    assert Trainer().device == "cpu"


@pytest.mark.cuda
@pytest.mark.skipif(ptl.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_devices_1_trains_on_gpu_1(coco256, tmp_path):
    tr = small_trainer(tmp_path, accelerator="cuda", devices=[1], max_epochs=1, limit_train_batches=1)
    model = ptl.Detector("yolo26n")
    tr.fit(model, small_data(coco256))
    assert model.device == "cuda:1" and model.flat_parameters.device == "cuda:1"


def test_default_precision_follows_the_device(monkeypatch):
    assert ptl.cuda.default_precision("cpu") == "32-true"
    for capability, precision in (((9, 0), "bf16-mixed"), ((8, 0), "bf16-mixed"), ((7, 5), "16-mixed")):
        monkeypatch.setattr(ptl.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert ptl.cuda.default_precision("cuda:0") == precision
    assert Trainer(accelerator="cpu").precision == "32-true" and Trainer(precision="16-mixed").precision == "16-mixed"
    if not ptl.cuda.is_available():
        assert Trainer().precision == "32-true"
    if not ptl.cuda.is_available():
        with pytest.raises(ValueError, match="get_device_capability"):
            monkeypatch.undo()
            ptl.cuda.get_device_capability(0)


def test_ckpt_path_last_and_best(coco256, tmp_path):
    """A fresh trainer resolves "last" / "best" from the newest run folder under default_root_dir; after
    its own fit, from its ModelCheckpoint (Lightning)."""
    with pytest.raises(ptl.ConfigError, match="ckpt_path='last': no last checkpoint found"):
        small_trainer(tmp_path).fit(ptl.Detector("yolo26n"), small_data(coco256), ckpt_path="last")
    first = small_trainer(tmp_path, max_epochs=1)
    first.fit(ptl.Detector("yolo26n"), small_data(coco256))
    folder = os.path.join(str(tmp_path), "runs", "train", "version_0", "checkpoints")
    second = small_trainer(tmp_path, max_epochs=2)
    assert second._resolve_ckpt_path("last") == os.path.join(folder, "last.ckpt")
    assert second._resolve_ckpt_path("best") == os.path.join(folder, "best.ckpt")
    second.fit(ptl.Detector("yolo26n"), small_data(coco256), ckpt_path="last")
    assert second.current_epoch == 2 and len(second.loss_history) == 2 * second.num_training_batches
    own = os.path.join(str(tmp_path), "runs", "train", "version_1", "checkpoints", "last.ckpt")
    assert second._resolve_ckpt_path("last") == own


def test_ignored_hyperparameters_and_freeze_are_said(coco256, tmp_path):
    model = ptl.Detector("yolo26n", hparams={"lr0": 0.02})
    tr = small_trainer(tmp_path, max_epochs=1, limit_train_batches=1, freeze=2)
    with pytest.warns(UserWarning) as rec:
        tr.fit(model, small_data(coco256))
    messages = [str(w.message) for w in rec]
    assert any("optimizer=auto found, ignoring lr0=0.02: auto chose AdamW" in m for m in messages), messages
    assert not any("freeze" in m for m in messages), messages  # applied (tests/test_freeze.py), not warned about
    names = [n for n, _, _ in model.parameter_table()]
    assert tr.frozen_parameters == [n for n in names if n.startswith(("model.0.", "model.1."))]
    buffers = [n for n, _, _ in model.buffer_table()]
    assert tr.frozen_buffers == [n for n in buffers if n.startswith(("model.0.", "model.1."))]
    assert tr.hparams()["trainer"]["freeze"] == 2
    with pytest.raises(ptl.ConfigError, match="freezes every parameter"):
        small_trainer(tmp_path, freeze=30).fit(ptl.Detector("yolo26n"), small_data(coco256))


def test_frozen_parameter_names():
    from ptl.trainer import frozen_parameter_names
    names = ["model.0.conv.weight", "model.1.bn.weight", "model.10.m.weight", "model.23.cv2.0.weight"]
    assert frozen_parameter_names(None, names) == []
    assert frozen_parameter_names(0, names) == []
    assert frozen_parameter_names(2, names) == names[:2]  # model.1. is not a prefix of model.10.
    assert frozen_parameter_names([10, "model.23.cv2"], names) == names[2:]


def test_frozen_buffer_names():
    """A BatchNorm goes to eval mode when freeze selects its whole module (8.4.190's module-name rule)."""
    from ptl.trainer import frozen_buffer_names
    names = ["model.0.bn.running_mean", "model.0.bn.running_var", "model.10.m.0.bn.running_mean",
             "model.3.bn.running_mean"]
    assert frozen_buffer_names(None, names) == []
    assert frozen_buffer_names(1, names) == names[:2]
    assert frozen_buffer_names([10, "model.3.bn"], names) == names[2:]
    assert frozen_buffer_names(["model.0.bn.", "model.3.bn.weight"], names) == names[:2]


def test_run_folder_yaml_files_load_back(coco256, tmp_path):
    import yaml
    from ptl.arguments import ARGS
    tr = small_trainer(tmp_path, max_epochs=1, limit_train_batches=1)
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    hp = yaml.safe_load(open(os.path.join(tr.log_dir, "hparams.yaml")))
    assert hp["trainer"]["max_epochs"] == 1 and hp["model"]["model"] == "yolo26n" and hp["data"]["imgsz"] == IMGSZ
    args = yaml.safe_load(open(os.path.join(tr.log_dir, "args.yaml")))
    assert list(args) == [a.name for a in ARGS if a.recorded]  # flat, every argument
    assert (args["epochs"], args["imgsz"], args["batch"], args["device"], args["precision"]) == (
        1, IMGSZ, 4, "cpu", "32-true")
