"""Trainer: hook order, artifacts, digests, exact resume, crash safety, CLI (CPU fits on coco256)."""
import json
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


class Recorder(cb.Callback):
    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        if name in cb.HOOKS:
            calls = object.__getattribute__(self, "calls")
            return lambda *a, **k: calls.append(name)
        return object.__getattribute__(self, name)


def expected_order(epochs, batches):
    seq = ["setup", "on_fit_start", "on_train_start"]
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
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:  # the next checkpoint write stops half-way and waits to be killed
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
    ({"limit_train_batches": 1.5}, "limit_train_batches"), ({"limit_train_batches": -1}, "limit_train_batches"),
    ({"limit_train_batches": 0}, "limit_train_batches"), ({"limit_train_batches": 0.0}, "limit_train_batches"),
    ({"limit_val_batches": "all"}, "limit_val_batches"),
    ({"accumulate_grad_batches": 0}, "accumulate_grad_batches"), ({"accumulate_grad_batches": 1.5}, "accumulate"),
    ({"gradient_clip_val": -1.0}, "gradient_clip_val"), ({"gradient_clip_val": float("nan")}, "gradient_clip_val"),
    ({"gradient_clip_val": float("inf")}, "gradient_clip_val"),
    ({"check_val_every_n_epoch": 0}, "check_val_every_n_epoch"),
    ({"callbacks": [object()]}, "callbacks"), ({"callbacks": "ProgressBar"}, "callbacks"),
    ({"logger": "tensorboard"}, "logger"), ({"enable_progress_bar": 1}, "enable_progress_bar"),
    ({"enable_checkpointing": None}, "enable_checkpointing"), ({"deterministic": "warn"}, "deterministic"),
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
    with pytest.raises(KeyError, match="bogus"):
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
                           accelerator=acc, enable_checkpointing=False)
        tr.fit(ptl.Detector("yolo26n"), small_data(coco256, imgsz=128))
        losses.append(np.asarray(tr.loss_history[0], np.float64))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4, atol=1e-6)


def _falls(losses, k=16):
    """The mean total loss of the last k batches is below that of the first k."""
    t = np.asarray(losses, np.float64)[:, 0]
    return t[-k:].mean() < t[:k].mean(), (t[:k].mean(), t[-k:].mean())


@pytest.mark.cuda
def test_cuda_fit_one_epoch_640_bf16(coco256, tmp_path):
    """Issue 7: a 2-epoch fit at 640, batch 4, bf16-mixed, 4 workers, RAM cache on the GPU, an optimizer
    step every batch: the loss falls, and the same fit with the network replayed gives the same digests."""
    data = DetectionData(str(coco256 / "data.yaml"), imgsz=640, batch_size=4, workers=4, cache="ram",
                         verbose=False)
    digests = []
    for capture in (False, True):
        tr = Trainer(max_epochs=2, precision="bf16-mixed", accelerator="cuda", enable_progress_bar=False,
                     default_root_dir=str(tmp_path / str(capture)), seed=0, accumulate_grad_batches=1)
        tr.fit(ptl.Detector("yolo26n", seed=0, hparams={"warmup_epochs": 0}), data, capture_network=capture)
        assert tr.global_step == 2 * len(data.train_loader()) == len(tr.loss_history)
        assert np.isfinite(np.asarray(tr.loss_history)).all()
        falls, means = _falls(tr.loss_history)
        assert falls, "loss first/last 16 batches: %.4f -> %.4f" % means
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
    digests, seen = [], []

    class Watch(cb.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(pl_module.recorded)

    for capture in (False, True):
        seen.clear()
        tr = small_trainer(tmp_path / str(capture), max_epochs=2, limit_train_batches=None, precision=precision,
                           accelerator="cuda", accumulate_grad_batches=2, callbacks=[Watch()])
        model = ptl.Detector("yolo26n")
        tr.fit(model, small_data(coco256, batch_size=batch), capture_network=capture)
        digests.append(tr.digest())
        full = [True, True, False] if batch == 48 else [True] * 4
        assert seen == (full * 2 if capture else [False] * len(full) * 2)
        assert not model.recorded
    assert digests[0] == digests[1]


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
        ptl._C.train_step(eng._plan(batch), batch.images, t, 0.5, optimize, lrs, moms, wds, 0.999)
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
