"""A diverging fit stops at the first non-finite loss with DivergenceError naming where, and loses
nothing: the checkpoints written before stay byte for byte, none is written from the broken weights."""
import glob
import hashlib
import os

import numpy as np
import pytest

import ptl
from test_trainer import small_data, small_trainer

# nbs 4 at batch 4: every batch is an optimizer step, so an absurd learning rate breaks the weights at once
SGD = {"optimizer": "SGD", "lr0": 0.01, "warmup_epochs": 0, "nbs": 4}


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_divergence_stops_with_the_step_and_keeps_the_last_good_checkpoint(coco256, tmp_path):
    data = small_data(coco256)
    good = small_trainer(tmp_path / "good", max_epochs=1, limit_train_batches=2)
    good.fit(ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0, hparams=SGD), data)
    last = next(c for c in good.callbacks if isinstance(c, ptl.callbacks.ModelCheckpoint)).last_model_path
    assert os.path.isfile(last)
    before = {p: _sha(p) for p in glob.glob(str(tmp_path / "good" / "**" / "*.*"), recursive=True)
              if p.endswith((".ckpt", ".safetensors"))}

    broken = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0, hparams=dict(SGD, lr0=1e30))
    tr = small_trainer(tmp_path / "broken", max_epochs=2, limit_train_batches=2)
    with pytest.warns(ptl.ResumeWarning, match="lr0"):
        with pytest.raises(ptl.DivergenceError, match=r"epoch 1, batch 1 \(after 3 optimizer steps\)") as e:
            tr.fit(broken, data, ckpt_path=last)
    err = e.value
    assert (err.epoch, err.batch, err.step) == (1, 1, 3)
    assert not np.isfinite(err.losses["total"])
    assert last in str(err)  # names the last good checkpoint
    after = {p: _sha(p) for p in before}
    assert after == before
    written = [p for p in glob.glob(str(tmp_path / "broken" / "**" / "*.*"), recursive=True)
               if p.endswith((".ckpt", ".safetensors"))]
    assert written == []
    # the losses kept are the finite ones before it
    assert len(tr.loss_history) == 3 and np.isfinite(np.asarray(tr.loss_history)).all()


class _BreakLastUpdate(ptl.callbacks.Callback):
    """Stands in for an update that overflows: after the epoch's last batch, one weight becomes NaN (the
    batch's own loss, computed before, is finite)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        w = np.asarray(pl_module.flat_parameters.numpy()).copy()
        w[123] = np.nan
        pl_module.flat_parameters = w


def test_weights_broken_by_an_epochs_last_update_are_never_saved(coco256, tmp_path):
    """The last batch's update is seen by no later loss: the checkpoint writer catches it instead."""
    data = small_data(coco256)
    tr = small_trainer(tmp_path, max_epochs=2, limit_train_batches=1, callbacks=[_BreakLastUpdate()])
    model = ptl.Detector("yolo26n", num_classes=data.num_classes, seed=0, hparams=SGD)
    with pytest.raises(ptl.DivergenceError, match=r"epoch 0, batch 0 \(after 1 optimizer steps\): the weights") as e:
        tr.fit(model, data)
    assert e.value.losses is None and e.value.tensors
    assert all(t.startswith("model.") for t in e.value.tensors)
    assert "No checkpoint had been written" in str(e.value)
    assert [p for p in glob.glob(str(tmp_path / "**" / "*.*"), recursive=True)
            if p.endswith((".ckpt", ".safetensors"))] == []
