"""Built-in callbacks against a stand-in trainer (no fitting)."""
import io
import os
import types

import pytest

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
        self.state = types.SimpleNamespace(fn="fit")  # checkpointing and early stopping act only while fitting
        self.validated_this_epoch = True
        self.num_training_batches = 4
        self.max_epochs_effective = 10
        self.logged = {}
        self.saved = []
        self.weights = []  # weights-only files, relative to log_dir
        self.datamodule = None

    def save_checkpoint(self, path):
        with open(path, "w") as f:
            f.write(str(self.callback_metrics))
        self.saved.append(os.path.basename(path))

    def save_weights(self, path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(str(self.callback_metrics))
        self.weights.append(os.path.relpath(path, self.log_dir))

    def log_dict(self, d):
        self.logged.update(d)

    def group_schedule(self):
        return [("pg0_weight", 0.01 * (1 + self.global_step), 0.9), ("pg1_bias", 0.1, 0.8)]

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
    files = sorted(os.listdir(tmp_path / "checkpoints"))
    assert files == ["1-0.300.ckpt", "4-0.400.ckpt", "last.ckpt"]
    assert ck.best_model_score == 0.4 and ck.best_model_path.endswith("4-0.400.ckpt")
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


def test_learning_rate_monitor(tmp_path):
    tr = FakeTrainer(tmp_path)
    lrm = cb.LearningRateMonitor(logging_interval="step")
    lrm.on_train_batch_start(tr, None, None, 0)
    assert tr.logged == {"lr-pg0_weight": 0.01, "momentum-pg0_weight": 0.9, "lr-pg1_bias": 0.1,
                         "momentum-pg1_bias": 0.8}
    lrm.on_train_epoch_start(tr, None)  # epoch logging is off in step mode
    assert len(lrm.history) == 1
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


def test_close_mosaic_configures_the_data(tmp_path):
    tr = FakeTrainer(tmp_path)

    class Data:
        close_mosaic = 10

    tr.datamodule = Data()
    cb.CloseMosaic(epochs=3).setup(tr, None, "fit")
    assert tr.datamodule.close_mosaic == 3
    with pytest.raises(ValueError, match="epochs"):
        cb.CloseMosaic(epochs=-1)
