"""Resuming validates before it changes anything (issue 18.5), says what it does (18.7), and a new run
never deletes an older run's files (18.6). CPU fits on coco256 at 64 px."""
import hashlib
import json
import os
import warnings

import numpy as np
import pytest

import ptl
from ptl import callbacks as cb
from ptl import checkpoint as ckpt
from ptl.data import DetectionData
from ptl.trainer import Trainer

from ckpt_corpus import CASES, FIRST, write_case, patch_trainer, patch_header


def small_data(coco256, **kw):
    kw.setdefault("imgsz", 64)
    kw.setdefault("batch_size", 4)
    return DetectionData(str(coco256 / "data.yaml"), workers=2, verbose=False, **kw)


def small_trainer(root, **kw):
    kw.setdefault("max_epochs", 3)
    return Trainer(limit_train_batches=1, limit_val_batches=1, accelerator="cpu", enable_progress_bar=False,
                   seed=0, default_root_dir=str(root), **kw)


class StopAfter(cb.Callback):
    def __init__(self, epochs):
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch >= self.epochs:
            trainer.should_stop = True


class Score(cb.Callback):
    """Logs score = epochs done, so every validation is a new best for a monitor in "max" mode."""

    def on_validation_end(self, trainer, pl_module):
        trainer.log_dict({"score": float(trainer.current_epoch)})


@pytest.fixture(scope="module")
def good(coco256, tmp_path_factory):
    """last.ckpt of a run planned for 3 epochs and stopped after 1: (path, bytes)."""
    root = tmp_path_factory.mktemp("good")
    tr = small_trainer(root, callbacks=[StopAfter(1)])
    tr.fit(ptl.Detector("yolo26n"), small_data(coco256))
    path = os.path.join(tr.log_dir, "checkpoints", "last.ckpt")
    with open(path, "rb") as f:
        return path, f.read()


def folder_digest(folder):
    out = {}
    for dirpath, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_corpus_covers_the_issue():
    assert len(CASES) >= 20
    for word in ("truncated", "relabelled", "shape", "missing", "foreign", "UTF-8", "scale"):
        assert any(word in c for c in CASES), word


@pytest.mark.parametrize("case", CASES)
def test_bad_checkpoint_is_refused_before_anything_changes(good, coco256, tmp_path, case):
    """Every damaged or foreign checkpoint raises CheckpointError naming the file (and the tensor) in one
    short line; the model's weights, the trainer's state and the callbacks' state are as they were, and
    no run folder is left behind."""
    path = tmp_path / "bad.ckpt"
    pattern, tensor = write_case(good[1], case, str(path))
    model = ptl.Detector("yolo26n", seed=7)
    before = ptl.digest(model.state_dict())
    checkpointer = cb.ModelCheckpoint(monitor="fitness", mode="max", save_last=True)
    tr = small_trainer(tmp_path / "run", callbacks=[checkpointer])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ptl.ResumeWarning)
        with pytest.raises(ptl.CheckpointError, match=pattern) as err:
            tr.fit(model, small_data(coco256), ckpt_path=path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message and len(message) < 500, message
    if tensor is not None:
        assert "'%s'" % tensor in message
    assert ptl.digest(model.state_dict()) == before
    assert (tr.current_epoch, tr.global_step, tr.loss_history, tr.val_history) == (0, 0, [], [])
    assert checkpointer.best_k_models == {} and checkpointer.best_model_path == ""
    assert not os.path.exists(tmp_path / "run" / "runs" / "train" / "version_0")
    path.unlink()


def test_missing_or_unreadable_checkpoint(coco256, tmp_path):
    tr = small_trainer(tmp_path)
    for path, words in ((tmp_path / "nope.ckpt", "does not exist"), (tmp_path, "is not a file")):
        with pytest.raises(ptl.CheckpointError, match=words):
            tr.fit(ptl.Detector("yolo26n"), small_data(coco256), ckpt_path=path)
    with pytest.raises(ptl.CheckpointError, match="expected a file path"):
        tr.fit(ptl.Detector("yolo26n"), small_data(coco256), ckpt_path=3.5)


def test_good_checkpoint_passes_every_check(good, coco256):
    """The checks accept what save writes (so each refusal above is the damage's doing)."""
    ck = ckpt.read(good[0])
    assert (ck.epochs_done, ck.epochs_planned) == (1, 3)
    ckpt.check_model(ck, ptl.Detector("yolo26n"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ckpt.plan_resume(ck, small_trainer("unused"), small_data(coco256))


def test_the_ema_is_held_once_and_older_files_with_two_copies_resume(good, coco256, tmp_path):
    """The EMA is written once, as ema.* (not also as optim.ema.*); a file written before that change, with
    the second copy, still resumes, to the same state as the file without it."""
    tensors, meta = ptl.io.load_safetensors(good[0])
    ema = {k: v for k, v in tensors.items() if k.startswith("ema.")}
    assert "ema.updates" in ema and len(ema) > 500
    assert not any(k.startswith("optim.ema.") for k in tensors)
    older = dict(tensors, **{"optim." + k: v for k, v in ema.items()})
    old_path = str(tmp_path / "older.ckpt")
    ptl.io.save_safetensors(old_path, older, metadata=meta)
    assert set(ckpt.read(old_path).tensors) == set(tensors)
    digests = []
    for i, path in enumerate((good[0], old_path)):
        tr = small_trainer(tmp_path / str(i), callbacks=[StopAfter(2)])
        tr.fit(ptl.Detector("yolo26n"), small_data(coco256), ckpt_path=path)
        assert tr.current_epoch == 2
        digests.append(tr.digest())
    assert digests[0] == digests[1]


def test_model_file_checks_name_file_and_tensor(tmp_path):
    """check_model_tensors (for Detector.load / load_state_dict of a .safetensors): a relabelled dtype,
    a wrong shape, a missing or foreign tensor are named, and a good file passes."""
    model = ptl.Detector("yolo26n")
    path = tmp_path / "m.safetensors"
    model.save(path)
    raw = path.read_bytes()
    tensors, _ = ptl.load_safetensors(path)
    ckpt.check_model_tensors(str(path), tensors, model)
    name = "model.0.conv.weight"
    bad = {
        "has dtype I32": patch_header(raw, lambda h: h[name].update(dtype="I32")),
        r"has shape \(3, 16, 3, 3\)": patch_header(raw, lambda h: h[name].update(shape=[3, 16, 3, 3])),
    }
    for words, content in bad.items():
        path.write_bytes(content)
        with pytest.raises(ptl.ConfigError, match="'%s' %s" % (name, words)) as err:
            ckpt.check_model_tensors(str(path), ptl.load_safetensors(path)[0], model)
        assert str(path) in str(err.value)
    short = dict(tensors)
    short.pop(name)
    with pytest.raises(ptl.ConfigError, match="'%s' is missing" % name):
        ckpt.check_model_tensors(str(path), short, model)
    with pytest.raises(ptl.ConfigError, match="0 of its 2 tensors match the 594 expected names") as err:
        ckpt.check_model_tensors(str(path), {"a": np.ones(1, np.float32), "b": np.ones(2, np.float32)}, model)
    assert len(str(err.value)) < 400
    other = ptl.Detector("yolo26s").state_dict()
    with pytest.raises(ptl.ConfigError, match="other shapes") as err:
        ckpt.check_model_tensors(str(path), other, model)
    assert len(str(err.value)) < 500


# ------------------------------------------------------------------------------------ resume semantics
@pytest.mark.parametrize("max_epochs", [1, None])
def test_nothing_left_to_train_says_so_and_returns(good, coco256, tmp_path, max_epochs):
    """A checkpoint with max_epochs epochs done (asked for 1 here; or a finished run: its planned 3 done)
    trains nothing, writes nothing and leaves the model alone, with a ResumeWarning saying so."""
    path = good[0]
    if max_epochs is None:  # a finished run: 3 of 3 epochs done
        path = tmp_path / "finished.ckpt"
        path.write_bytes(patch_trainer(good[1], lambda s: s.update(epoch=3)))
        max_epochs = 3
    model = ptl.Detector("yolo26n", seed=3)
    before = ptl.digest(model.state_dict())
    tr = small_trainer(tmp_path / "run", max_epochs=max_epochs)
    with pytest.warns(ptl.ResumeWarning, match="nothing to train"):
        assert tr.fit(model, small_data(coco256), ckpt_path=path) is tr
    assert tr.current_epoch == max_epochs and tr.log_dir is None
    assert ptl.digest(model.state_dict()) == before
    assert not os.path.exists(tmp_path / "run")


def test_more_epochs_than_planned_warns_and_trains(good, coco256, tmp_path):
    tr = small_trainer(tmp_path, max_epochs=4, enable_checkpointing=False, callbacks=[StopAfter(2)])
    with pytest.warns(ptl.ResumeWarning, match="planned for 3 epoch.*will differ from an uninterrupted 4-epoch"):
        tr.fit(ptl.Detector("yolo26n"), small_data(coco256), ckpt_path=good[0])
    assert tr.current_epoch == 2 and tr.max_epochs_effective == 4


@pytest.mark.parametrize("kw,words", [({"batch_size": 2}, "batch_size=4 but this fit has batch_size=2"),
                                      ({"imgsz": 96}, "imgsz=64 but this fit has imgsz=96")])
def test_changed_batch_or_image_size_is_an_error(good, coco256, tmp_path, kw, words):
    with pytest.raises(ptl.CheckpointError, match=words):
        small_trainer(tmp_path).fit(ptl.Detector("yolo26n"), small_data(coco256, **kw), ckpt_path=good[0])
    assert not os.path.exists(tmp_path / "runs" / "train" / "version_0")


def test_changed_hyperparameters_warn(good, coco256, tmp_path):
    model = ptl.Detector("yolo26n", hparams={"lr0": 0.02, "cos_lr": True})
    with pytest.warns(ptl.ResumeWarning, match=r"lr0 0\.01 -> 0\.02, cos_lr False -> True"):
        small_trainer(tmp_path, enable_checkpointing=False, callbacks=[StopAfter(2)]).fit(
            model, small_data(coco256), ckpt_path=good[0])


def test_changed_data_options_warn(good, coco256, tmp_path):
    """The newer data options are recorded (hparams.yaml, the checkpoint) and compared on resume: a changed one
    that changes the batches is named in the ResumeWarning; one that does not (the cache) is not."""
    with pytest.warns(ptl.ResumeWarning) as rec:
        small_trainer(tmp_path, enable_checkpointing=False, callbacks=[StopAfter(2)]).fit(
            ptl.Detector("yolo26n"), small_data(coco256, close_mosaic=2, jpeg_scale_pixels=0, cache="ram"),
            ckpt_path=good[0])
    said = " ".join(str(w.message) for w in rec)
    assert "close_mosaic 10 -> 2" in said and "jpeg_scale_pixels %d -> 0" % ptl._C.DATA_JPEG_SCALE_PIXELS in said
    assert "cache" not in said
    data = json.loads(ptl.load_safetensors(good[0])[1]["ptl.trainer"])["hparams"]["data"]
    assert (data["rect"], data["single_cls"], data["fraction"], data["close_mosaic"], data["cache_dir"]) == (
        False, False, 1.0, 10, None)


# -------------------------------------------------------------------------- older runs' files untouched
def test_resumed_fit_never_touches_the_older_runs_files(good, coco256, tmp_path):
    """Issue 18.6: a resumed fit in version_1 inherits version_0's top-k list; its better checkpoints
    replace version_0's best in the list, but version_0's files stay byte for byte."""
    def callbacks():
        return [Score(), cb.ModelCheckpoint(filename="best", monitor="score", mode="max", save_top_k=1,
                                            save_last=True)]
    first = small_trainer(tmp_path, callbacks=callbacks() + [StopAfter(1)])
    first.fit(ptl.Detector("yolo26n"), small_data(coco256))
    v0 = first.log_dir
    before = folder_digest(v0)
    assert {"checkpoints/best.ckpt", "checkpoints/last.ckpt", "hparams.yaml", "metrics.csv"} <= set(before)
    resumed = small_trainer(tmp_path, callbacks=callbacks() + [StopAfter(2)])
    resumed.fit(ptl.Detector("yolo26n"), small_data(coco256), ckpt_path=os.path.join(v0, "checkpoints", "last.ckpt"))
    assert resumed.log_dir != v0 and resumed.current_epoch == 2
    assert folder_digest(v0) == before
    mc = [c for c in resumed.callbacks if isinstance(c, cb.ModelCheckpoint)][0]
    assert mc.best_model_score == 2.0
    assert mc.best_model_path == os.path.join(resumed.log_dir, "checkpoints", "best.ckpt")
    assert list(mc.best_k_models) == [mc.best_model_path]
    assert sorted(os.listdir(os.path.join(resumed.log_dir, "checkpoints"))) == ["best.ckpt", "last.ckpt"]
    header = json.loads(ptl.load_safetensors(mc.best_model_path)[1]["ptl.trainer"])
    assert header["epoch"] == 2 and header["max_epochs"] == 3


def test_checkpoint_records_the_planned_epochs(good):
    header = json.loads(ptl.load_safetensors(good[0])[1]["ptl.trainer"])
    assert (header["epoch"], header["max_epochs"]) == (1, 3)
    assert FIRST in ptl.load_safetensors(good[0])[0]
