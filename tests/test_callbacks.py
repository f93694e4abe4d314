"""Built-in callbacks against a stand-in trainer (no fitting)."""
import io
import os
import types

import pytest

import ptl
from ptl import callbacks as cb


class FakeTrainer:
    def __init__(self, log_dir):
        self.log_dir = str(log_dir)
        self.callback_metrics = {}
        self.current_epoch = 0
        self.current_epoch_completed = 0
        self.global_step = 0
        self.should_stop = False
        self.sanity_checking = False
        self.fast_dev_run = False
        self.validating_mid_epoch = False
        self.state = types.SimpleNamespace(fn="fit")  # checkpointing and early stopping act only while fitting
        self.validated_this_epoch = True
        self.num_training_batches = 4
        self.max_epochs_effective = 10
        self.logged = {}
        self.saved = []
        self.weights = []  # weights-only files, relative to log_dir
        self.datamodule = None

    def _checkpoint_tensors(self):
        return str(self.callback_metrics)

    def _checkpoint_snapshot(self, path, tensors):  # the state now, written by the job ModelCheckpoint runs
        return lambda: self._write(path, tensors, self.saved, os.path.basename(path))

    def _weights_snapshot(self, path, tensors):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return lambda: self._write(path, tensors, self.weights, os.path.relpath(path, self.log_dir))

    @staticmethod
    def _write(path, text, written, name):
        with open(path, "w") as f:
            f.write(text)
        written.append(name)

    def log_dict(self, d):
        self.logged.update(d)

    def group_schedule(self):
        return [("pg0_weight", 0.01 * (1 + self.global_step), 0.9, 5e-4), ("pg1_bias", 0.1, 0.8, 0.0)]

    def progress_metrics(self):
        return {"train/box_loss": 1.5}

    def end_epoch(self, **metrics):
        self.callback_metrics.update(metrics)
        self.current_epoch_completed += 1
        self.global_step += 4


def test_model_checkpoint_keeps_top_k_and_last(tmp_path):
    tr = FakeTrainer(tmp_path)
    ck = cb.ModelCheckpoint(filename="{epoch}-{metrics/mAP50-95:.3f}", monitor="metrics/mAP50-95", mode="max",
                            save_top_k=2, save_last=True)
    for score in (0.1, 0.3, 0.2, 0.05, 0.4):
        tr.end_epoch(**{"metrics/mAP50-95": score})
        ck.on_validation_end(tr, None)
    ck.on_fit_end(tr, None)  # the last epoch's background writes are done
    files = sorted(os.listdir(tmp_path / "checkpoints"))
    # Lightning's auto_insert_metric_name: each field written name=value ("/" as "_")
    assert files == ["epoch=1-metrics_mAP50-95=0.300.ckpt", "epoch=4-metrics_mAP50-95=0.400.ckpt", "last.ckpt"]
    assert ck.best_model_score == 0.4 and ck.best_model_path.endswith("epoch=4-metrics_mAP50-95=0.400.ckpt")
    # weights-only files: best.safetensors whenever the best changed (0.1, 0.3, 0.4), last every time
    best, last = os.path.join("weights", "best.safetensors"), os.path.join("weights", "last.safetensors")
    assert tr.weights == [best, last, best, last, last, last, best, last]
    assert "0.4" in (tmp_path / best).read_text()
    state = ck.state_dict()
    ck2 = cb.ModelCheckpoint(monitor="metrics/mAP50-95", mode="max")
    ck2.load_state_dict(state)
    assert ck2.best_model_score == 0.4 and len(ck2.best_k_models) == 2


def test_model_checkpoint_errors(tmp_path):
    tr = FakeTrainer(tmp_path)
    tr.end_epoch(loss=1.0)
    with pytest.raises(KeyError, match="nope"):
        cb.ModelCheckpoint(monitor="nope").on_validation_end(tr, None)
    with pytest.raises(KeyError, match="missing"):
        cb.ModelCheckpoint(filename="{missing}").on_validation_end(tr, None)
    with pytest.raises(ValueError, match="mode"):
        cb.ModelCheckpoint(mode="up")
    with pytest.raises(ValueError, match="save_top_k"):
        cb.ModelCheckpoint(save_top_k=-2)


def test_early_stopping_patience_and_min_delta(tmp_path):
    tr = FakeTrainer(tmp_path)
    es = cb.EarlyStopping(monitor="val/loss", patience=2, mode="min", min_delta=0.01)
    for epoch, loss in enumerate([1.0, 0.9, 0.895, 0.899]):
        tr.current_epoch = epoch
        tr.callback_metrics["val/loss"] = loss
        es.on_validation_end(tr, None)
        assert tr.should_stop == (epoch == 3)
    assert es.best_score == 0.9 and es.wait_count == 2 and es.stopped_epoch == 3
    tr2 = FakeTrainer(tmp_path)
    tr2.callback_metrics["val/loss"] = float("nan")
    cb.EarlyStopping(monitor="val/loss").on_validation_end(tr2, None)
    assert tr2.should_stop


def test_early_stopping_positional_order_is_lightnings(tmp_path):
    """EarlyStopping("m", 0.5) is min_delta 0.5 (Lightning's order monitor, min_delta, patience), not patience."""
    es = cb.EarlyStopping("val/loss", 0.5, 1)
    assert (es.min_delta, es.patience) == (0.5, 1)
    tr = FakeTrainer(tmp_path)
    for loss, stop in ((1.0, False), (0.6, True)):  # 0.4 better: not more than min_delta, and patience 1
        tr.callback_metrics["val/loss"] = loss
        es.on_validation_end(tr, None)
        assert tr.should_stop == stop


def test_early_stopping_thresholds_strict_and_when(tmp_path):
    def run(es, values, hook="on_validation_end"):
        tr = FakeTrainer(tmp_path)
        for i, v in enumerate(values):
            tr.current_epoch = i
            tr.callback_metrics["m"] = v
            getattr(es, hook)(tr, None)
            if tr.should_stop:
                return i
        return None
    assert run(cb.EarlyStopping("m", mode="max", stopping_threshold=0.5, patience=100), [0.1, 0.4, 0.6, 0.7]) == 2
    assert run(cb.EarlyStopping("m", divergence_threshold=5.0, patience=100), [1.0, 2.0, 6.0]) == 2
    assert run(cb.EarlyStopping("m", patience=100), [1.0, float("inf")]) == 1  # check_finite
    assert run(cb.EarlyStopping("m", patience=100, check_finite=False), [1.0, float("inf")]) is None
    # check_on_train_epoch_end moves the check from validation's end to the training epoch's end
    late = cb.EarlyStopping("m", patience=0, check_on_train_epoch_end=True)
    assert run(late, [1.0, 2.0]) is None and run(late, [1.0, 2.0], "on_train_epoch_end") == 1
    tr = FakeTrainer(tmp_path)
    with pytest.raises(RuntimeError, match="metric not found"):
        cb.EarlyStopping("missing").on_validation_end(tr, None)
    cb.EarlyStopping("missing", strict=False).on_validation_end(tr, None)  # skipped, no stop
    assert not tr.should_stop
    tr.fast_dev_run = 1  # Lightning: early stopping is off with fast_dev_run
    tr.callback_metrics["m"] = float("nan")
    cb.EarlyStopping("m").on_validation_end(tr, None)
    assert not tr.should_stop


def test_model_checkpoint_lightning_options(tmp_path):
    tr = FakeTrainer(tmp_path)
    plain = cb.ModelCheckpoint(dirpath=tmp_path / "a", auto_insert_metric_name=False)
    tr.end_epoch(loss=1.0)
    plain.on_validation_end(tr, None)
    plain.wait_for_writes()  # the files are written in the background
    assert os.listdir(tmp_path / "a") == ["0-4.ckpt"]  # Lightning's default "{epoch}-{step}", no names
    # save_on_train_epoch_end=True: at the training epoch's end even when it validated
    at_end = cb.ModelCheckpoint(dirpath=tmp_path / "b", save_on_train_epoch_end=True)
    at_end.on_validation_end(tr, None)
    assert not os.path.exists(tmp_path / "b")
    at_end.on_train_epoch_end(tr, None)
    at_end.wait_for_writes()
    assert os.listdir(tmp_path / "b") == ["epoch=0-step=4.ckpt"]
    # enable_version_counter=False overwrites an older run's file of the same name instead of adding -v1
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "last.ckpt").write_text("older run")
    over = cb.ModelCheckpoint(dirpath=tmp_path / "c", save_top_k=0, save_last=True, enable_version_counter=False)
    over.on_validation_end(tr, None)
    over.wait_for_writes()
    assert os.listdir(tmp_path / "c") == ["last.ckpt"] and (tmp_path / "c" / "last.ckpt").read_text() != "older run"
    # nothing is written in the sanity check, with fast_dev_run, or for a validation inside an epoch
    quiet = cb.ModelCheckpoint(dirpath=tmp_path / "d")
    for attr in ("sanity_checking", "fast_dev_run", "validating_mid_epoch"):
        setattr(tr, attr, True)
        quiet.on_validation_end(tr, None)
        quiet.on_train_epoch_end(tr, None)
        setattr(tr, attr, False)
    assert not os.path.exists(tmp_path / "d")


def test_learning_rate_monitor(tmp_path):
    tr = FakeTrainer(tmp_path)
    lrm = cb.LearningRateMonitor(logging_interval="step", log_momentum=True, log_weight_decay=True)
    lrm.on_train_batch_start(tr, None, None, 0)
    assert tr.logged == {"lr-pg0_weight": 0.01, "momentum-pg0_weight": 0.9, "weight_decay-pg0_weight": 5e-4,
                         "lr-pg1_bias": 0.1, "momentum-pg1_bias": 0.8, "weight_decay-pg1_bias": 0.0}
    lrm.on_train_epoch_start(tr, None)  # epoch logging is off in step mode
    assert len(lrm.history) == 1
    tr2 = FakeTrainer(tmp_path)
    default = cb.LearningRateMonitor()  # Lightning's defaults: the schedule's interval (ptl: epoch), lr only
    default.on_train_batch_start(tr2, None, None, 0)
    assert tr2.logged == {}
    default.on_train_epoch_start(tr2, None)
    assert tr2.logged == {"lr-pg0_weight": 0.01, "lr-pg1_bias": 0.1}
    with pytest.raises(ValueError, match="logging_interval"):
        cb.LearningRateMonitor(logging_interval="batch")


def test_progress_bar_plain_lines(tmp_path):
    tr = FakeTrainer(tmp_path)
    out = io.StringIO()
    bar = cb.ProgressBar(stream=out, lines_per_epoch=2)
    bar.on_train_epoch_start(tr, None)
    for i in range(4):
        bar.on_train_batch_end(tr, None, None, None, i)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("epoch 1/10 4/4") and "box_loss=1.5" in lines[-1]
    assert "skipped" not in out.getvalue()  # no loader, nothing skipped: the line does not mention it


def test_close_mosaic_configures_the_data(tmp_path):
    tr = FakeTrainer(tmp_path)

    class Data:
        close_mosaic = 10

    tr.datamodule = Data()
    cb.CloseMosaic(epochs=3).setup(tr, None, "fit")
    assert tr.datamodule.close_mosaic == 3
    with pytest.raises(ValueError, match="epochs"):
        cb.CloseMosaic(epochs=-1)


def dead_pid():
    """The id of a process that has exited (and been reaped)."""
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_new_run_in_the_same_folder_keeps_the_older_runs_files(tmp_path):
    """Issue 18.6: an earlier run's best.ckpt / last.ckpt in the folder are neither removed nor
    overwritten; this run's files get -v1 names and its top-k only ever removes its own files."""
    d = tmp_path / "ckpts"
    d.mkdir()
    old = {"best.ckpt": b"old best", "last.ckpt": b"old last", "3-0.900.ckpt": b"old top"}
    for name, content in old.items():
        (d / name).write_bytes(content)
    tr = FakeTrainer(tmp_path)
    ck = cb.ModelCheckpoint(dirpath=d, filename="best", monitor="score", mode="max", save_top_k=1, save_last=True)
    # the top-k list an inherited state would bring (a resume): the older run's file is in it
    ck.load_state_dict({"best_k_models": {str(d / "3-0.900.ckpt"): 0.2}, "best_model_score": 0.2,
                        "best_model_path": str(d / "3-0.900.ckpt"), "last_model_path": str(d / "last.ckpt")})
    ck.setup(tr, None, "fit")
    for score in (0.1, 0.5, 0.7):
        tr.end_epoch(score=score)
        ck.on_validation_end(tr, None)
    ck.on_fit_end(tr, None)
    for name, content in old.items():
        assert (d / name).read_bytes() == content, name
    assert sorted(os.listdir(d)) == ["3-0.900.ckpt", "best-v1.ckpt", "best.ckpt", "last-v1.ckpt", "last.ckpt"]
    assert tr.saved == ["last-v1.ckpt", "best-v1.ckpt", "last-v1.ckpt", "best-v1.ckpt", "last-v1.ckpt"]
    assert ck.best_model_path == str(d / "best-v1.ckpt") and ck.best_model_score == 0.7
    assert ck.last_model_path == str(d / "last-v1.ckpt")
    # a second run with the same folder steps on to -v2 and still leaves both earlier runs' files
    tr2 = FakeTrainer(tmp_path)
    ck2 = cb.ModelCheckpoint(dirpath=d, filename="best", monitor="score", mode="max", save_last=True)
    ck2.setup(tr2, None, "fit")
    tr2.end_epoch(score=0.3)
    ck2.on_validation_end(tr2, None)
    ck2.on_fit_end(tr2, None)
    assert sorted(os.listdir(d)) == ["3-0.900.ckpt", "best-v1.ckpt", "best-v2.ckpt", "best.ckpt", "last-v1.ckpt",
                                     "last-v2.ckpt", "last.ckpt"]


def test_keep_latest_only_removes_this_runs_files(tmp_path):
    d = tmp_path / "ckpts"
    d.mkdir()
    (d / "epoch=0-step=4.ckpt").write_bytes(b"older run")
    tr = FakeTrainer(tmp_path)
    ck = cb.ModelCheckpoint(dirpath=d)
    ck.load_state_dict({"best_k_models": {str(d / "epoch=0-step=4.ckpt"): None}})
    ck.setup(tr, None, "fit")
    for _ in range(3):
        tr.end_epoch(loss=1.0)
        ck.on_validation_end(tr, None)
    ck.on_fit_end(tr, None)
    assert sorted(os.listdir(d)) == ["epoch=0-step=4.ckpt", "epoch=2-step=12.ckpt"]


def test_stale_temporaries_are_removed_when_a_run_starts(tmp_path):
    """Only the checkpoint writer's own temporary names of processes that are gone are removed."""
    d = tmp_path / "checkpoints"
    d.mkdir()
    pid = dead_pid()
    stale = ["last.ckpt.tmp.%d.%d.0" % (pid, pid), "best.ckpt.tmp.%d.%d.3" % (pid, pid + 1)]
    kept = ["last.ckpt", "notes.tmp", "last.ckpt.tmp", "x.tmp.12.ab.0", "last.ckpt.tmp.%d.1.0" % os.getpid()]
    for name in stale + kept:
        (d / name).write_bytes(b"x")
    tr = FakeTrainer(tmp_path)
    ck = cb.ModelCheckpoint()
    ck.setup(tr, None, "validate")
    assert len(os.listdir(d)) == len(stale + kept)  # only a fit's start cleans
    ck.setup(tr, None, "fit")
    assert sorted(os.listdir(d)) == sorted(kept)


@pytest.mark.parametrize("make,words", [
    (lambda: cb.ModelCheckpoint(save_top_k=1.5), "save_top_k"),
    (lambda: cb.ModelCheckpoint(save_top_k=True), "save_top_k"),
    (lambda: cb.ModelCheckpoint(every_n_epochs=0), "every_n_epochs"),
    (lambda: cb.ModelCheckpoint(save_last="yes"), "save_last"),
    (lambda: cb.ModelCheckpoint(monitor=""), "monitor"),
    (lambda: cb.ModelCheckpoint(monitor=3), "monitor"),
    (lambda: cb.ModelCheckpoint(filename="{epoch"), "unbalanced"),
    (lambda: cb.ModelCheckpoint(filename="epoch}"), "unbalanced"),
    (lambda: cb.ModelCheckpoint(filename="{epoch:.2q}"), "format spec"),
    (lambda: cb.ModelCheckpoint(filename="sub/{epoch}"), "without folders"),
    (lambda: cb.ModelCheckpoint(filename="{}"), "empty"),
    (lambda: cb.ModelCheckpoint(dirpath=__file__), "not a folder"),
    (lambda: cb.ModelCheckpoint(monitor_optional=1), "monitor_optional"),
    (lambda: cb.EarlyStopping(monitor=None), "monitor"),
    (lambda: cb.EarlyStopping(monitor="fitness", patience=-1), "patience"),
    (lambda: cb.EarlyStopping(monitor="fitness", patience=2.5), "patience"),
    (lambda: cb.EarlyStopping(monitor="fitness", min_delta=float("nan")), "min_delta"),
    (lambda: cb.EarlyStopping(monitor="fitness", mode="best"), "mode"),
    (lambda: cb.EarlyStopping(monitor="fitness", check_finite="no"), "check_finite"),
    (lambda: cb.LearningRateMonitor(log_momentum=None), "log_momentum"),
    (lambda: cb.LearningRateMonitor(log_weight_decay=1), "log_weight_decay"),
    (lambda: cb.EarlyStopping("m", strict=None), "strict"),
    (lambda: cb.EarlyStopping("m", stopping_threshold="high"), "stopping_threshold"),
    (lambda: cb.EarlyStopping("m", check_on_train_epoch_end="yes"), "check_on_train_epoch_end"),
    (lambda: cb.ModelCheckpoint(verbose=1), "verbose"),
    (lambda: cb.ModelCheckpoint(save_on_exception=True), "save_on_exception"),
    (lambda: cb.ModelCheckpoint(save_weights_only=True), "save_weights_only"),
    (lambda: cb.ModelCheckpoint(every_n_train_steps=100), "every_n_train_steps"),
    (lambda: cb.ModelCheckpoint(train_time_interval=5), "train_time_interval"),
    (lambda: cb.ModelCheckpoint(save_on_train_epoch_end=1), "save_on_train_epoch_end"),
    (lambda: cb.ModelCheckpoint(enable_version_counter=None), "enable_version_counter"),
    (lambda: cb.ProgressBar(refresh_rate=0), "refresh_rate"),
    (lambda: cb.ProgressBar(lines_per_epoch=0), "lines_per_epoch"),
    (lambda: cb.ProgressBar(stream="stderr"), "stream"),
    (lambda: cb.CloseMosaic(epochs=1.0), "epochs"),
])
def test_callback_arguments_are_range_checked(make, words):
    with pytest.raises(ptl.ConfigError, match=words):
        make()


def test_metric_names_with_slashes_are_allowed_in_filenames(tmp_path):
    ck = cb.ModelCheckpoint(filename="{epoch:03d}-{metrics/mAP50-95:.3f}")
    assert ck.format_name({"metrics/mAP50-95": 0.5}, 7, 1) == "epoch=007-metrics_mAP50-95=0.500.ckpt"
    ck = cb.ModelCheckpoint(filename="{epoch:03d}-{metrics/mAP50-95:.3f}", auto_insert_metric_name=False)
    assert ck.format_name({"metrics/mAP50-95": 0.5}, 7, 1) == "007-0.500.ckpt"
