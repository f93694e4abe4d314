"""Loggers (issue 14): what Trainer(logger=...) accepts, CSVLogger's metrics.csv, TensorBoardLogger's event
files, results.csv, versions, rank 0 and log_every_n_steps."""
import csv
import os
import sys

import pytest

import ptl
from ptl import loggers
from ptl.loggers import CSVLogger, Logger, TensorBoardLogger
from ptl.runlog import ResultsCSV


@pytest.mark.parametrize("bad", ["tensorboard", 3, {"save_dir": "."}, [CSVLogger("x"), object()], (None,)])
def test_logger_type_errors_name_what_is_accepted(bad):
    with pytest.raises(TypeError, match=r"logger: expected True, False, a ptl.CSVLogger, a ptl.TensorBoardLogger"):
        ptl.Trainer(logger=bad)


def test_logger_arguments_and_folders(tmp_path):
    assert ptl.Trainer(logger=False).loggers == [] and ptl.Trainer(logger=False).logger is None
    for default in (True, None):
        tr = ptl.Trainer(logger=default, default_root_dir=str(tmp_path), name="exp")
        assert isinstance(tr.logger, CSVLogger) and tr.logger.root_dir == os.path.join(str(tmp_path), "runs", "exp")
    one = CSVLogger(tmp_path, "a", version=3)
    assert ptl.Trainer(logger=one).loggers == [one] and one.log_dir == os.path.join(str(tmp_path), "a", "version_3")
    assert CSVLogger(tmp_path, "a", version="mine").log_dir == os.path.join(str(tmp_path), "a", "mine")
    os.makedirs(tmp_path / "a" / "version_7")
    assert CSVLogger(tmp_path, "a").version == 8
    with pytest.raises(ValueError, match="version"):
        CSVLogger(tmp_path, "a", version=-1)
    with pytest.raises(ValueError, match="name"):
        CSVLogger(tmp_path, "a/b")
    with pytest.raises(ValueError, match="log_every_n_steps"):
        ptl.Trainer(log_every_n_steps=0)


def test_loggers_sharing_a_folder_share_a_version(tmp_path):
    os.makedirs(tmp_path / "exp" / "version_0")
    c, t = CSVLogger(tmp_path, "exp"), TensorBoardLogger(tmp_path, "exp")
    conn = loggers.LoggerConnector([c, t], 50, str(tmp_path), "train")
    assert conn.setup() == c.log_dir == t.log_dir == os.path.join(str(tmp_path), "exp", "version_1")
    default = loggers.LoggerConnector(True, 50, str(tmp_path), "train")
    first = default.setup()
    assert default.setup() != first  # every fit of a trainer with logger=True gets its own version


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_logger_appends_and_rewrites_for_a_new_column(tmp_path):
    lg = CSVLogger(tmp_path, "exp")
    lg.log_hyperparams({"trainer": {"max_epochs": 3}, "lr": 0.01})
    lg.log_metrics({"epoch": 0, "a": 1.5}, step=1)
    lg.save()
    path = os.path.join(lg.log_dir, "metrics.csv")
    first = os.stat(path).st_ino
    lg.log_metrics({"epoch": 0, "a": 2.0}, step=2)
    lg.save()
    assert os.stat(path).st_ino == first  # appended in place
    assert _read(path) == [{"epoch": "0", "step": "1", "a": "1.5"}, {"epoch": "0", "step": "2", "a": "2"}]
    lg.log_metrics({"epoch": 1, "b": 0.25}, step=3)
    lg.finalize("success")
    assert os.stat(path).st_ino != first  # a new column: the file written anew, atomically
    assert _read(path)[-1] == {"epoch": "1", "step": "3", "a": "", "b": "0.25"} and len(_read(path)) == 3
    import yaml
    with open(os.path.join(lg.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"trainer": {"max_epochs": 3}, "lr": 0.01}


def test_tensorboard_logger_event_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    lg = TensorBoardLogger(tmp_path, "tb")
    lg.log_hyperparams({"trainer": {"max_epochs": 3, "precision": "32-true", "limit": None}, "lr0": 0.01})
    for step in (1, 2, 3):
        lg.log_metrics({"train/box_loss_step": 1.0 / step, "epoch": 0}, step)
    lg.log_metrics({"metrics/mAP50-95": 0.25}, 3)
    lg.finalize("success")
    ea = EventAccumulator(lg.log_dir)
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("train/box_loss_step")] == [
        (1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert [(e.step, e.value) for e in ea.Scalars("metrics/mAP50-95")] == [(3, 0.25)]
    content = ea.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert info.hparams["trainer/max_epochs"].number_value == 3
    assert info.hparams["trainer/precision"].string_value == "32-true"
    assert info.hparams["trainer/limit"].string_value == "None"
    assert os.path.exists(os.path.join(lg.log_dir, "hparams.yaml"))


def test_tensorboard_logger_without_tensorboard(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.event_file_writer", None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        TensorBoardLogger(tmp_path)


def test_results_csv_appends_each_epoch(tmp_path):
    path = str(tmp_path / "results.csv")
    groups = [("pg0_weight", 0.1, 0.9), ("pg1_bn", 0.1, 0.9)]
    rows = [{"epoch": 0, "time": 1.5, "train/box_loss": 2.0, "train/cls_loss": 3.0, "train/l1_loss": 0.25,
             "lr/pg0_weight": 0.01, "lr/pg1_bn": 0.02}]
    out = ResultsCSV(path, groups)
    out.start(rows)  # an epoch without validation: its metric cells are empty
    rows.append(dict(rows[0], epoch=1, time=2.0, **{"metrics/mAP50-95": 0.123456789, "val/l1_loss": 0.5}))
    ino = os.stat(path).st_ino
    out.append(rows)
    assert os.stat(path).st_ino == ino
    with open(path) as f:
        text = f.read().splitlines()
    assert text[0].endswith("val/dfl_loss,lr/pg0,lr/pg1")
    assert text[1] == "1,1.5,2,3,0.25,,,,,,,,0.01,0.02"
    assert text[2] == "2,3.5,2,3,0.25,,,,0.123457,,,0.5,0.01,0.02"


class Recording(Logger):
    def __init__(self, save_dir):
        super().__init__(save_dir, "rec")
        self.calls, self.params = [], None

    def log_hyperparams(self, params):
        self.params = params

    def log_metrics(self, metrics, step):
        self.calls.append((step, dict(metrics)))


def _tiny_fit(tmp_path, coco256, **kw):
    data = ptl.DetectionData(str(coco256 / "data.yaml"), imgsz=64, batch_size=4, workers=1, verbose=False)
    tr = ptl.Trainer(default_root_dir=str(tmp_path), max_epochs=1, limit_train_batches=3, limit_val_batches=0,
                     accelerator="cpu", enable_progress_bar=False, enable_model_summary=False, **kw)
    tr.fit(ptl.Detector("yolo26n"), data)
    return tr


def test_own_logger_gets_steps_and_epochs(tmp_path, coco256):
    rec = Recording(tmp_path)
    tr = _tiny_fit(tmp_path, coco256, logger=rec, log_every_n_steps=2, enable_checkpointing=False, plots=False)
    assert rec.params["trainer"]["max_epochs"] == 1 and "model" in rec.params
    assert [s for s, m in rec.calls] == [2, 3]  # batch 2 (every 2nd), then the epoch's end after 3 batches
    assert set(rec.calls[0][1]) == {"train/box_loss_step", "train/cls_loss_step", "train/l1_loss_step", "epoch"}
    assert rec.calls[0][1]["train/cls_loss_step"] == pytest.approx(float(tr.loss_history[1][8]))
    assert rec.calls[1][1]["train/box_loss"] == pytest.approx(tr._epoch_rows[0]["train/box_loss"])
    assert tr.log_dir == rec.log_dir and os.path.exists(os.path.join(rec.log_dir, "results.csv"))


def test_only_rank_zero_writes(tmp_path, coco256):
    class NotZero(ptl.Trainer):
        is_global_zero = False
    rec = Recording(tmp_path / "logs")
    data = ptl.DetectionData(str(coco256 / "data.yaml"), imgsz=64, batch_size=4, workers=1, verbose=False)
    tr = NotZero(default_root_dir=str(tmp_path / "root"), max_epochs=1, limit_train_batches=1, limit_val_batches=1,
                 accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False, logger=rec)
    tr.fit(ptl.Detector("yolo26n"), data)
    assert rec.calls == [] and rec.params is None
    assert not os.path.exists(tmp_path / "logs") and not os.path.exists(tmp_path / "root")
