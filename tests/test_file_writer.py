"""The background file writer (ptl/file_writer.py) and ModelCheckpoint's writes through it."""
import os
import threading

import pytest

import ptl
from ptl import callbacks as cb
from ptl.data import DetectionData
from ptl.file_writer import BackgroundWriter
from ptl.trainer import Trainer


def test_jobs_run_in_order_on_another_thread():
    w = BackgroundWriter("t")
    seen, gate = [], threading.Event()
    w.submit(gate.wait)
    for i in range(5):
        w.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert seen == []  # the first job holds the thread
    gate.set()
    w.wait()
    assert seen == [(i, "t") for i in range(5)]
    assert not any(t.name == "t" for t in threading.enumerate())  # an idle writer holds no thread


def test_a_failed_job_drops_the_rest_and_is_raised_once():
    w = BackgroundWriter("t")
    seen, gate = [], threading.Event()

    def fail():
        gate.wait()
        raise OSError("disk full")
    w.submit(fail)
    w.submit(seen.append, "removal after the failed write")
    gate.set()
    with pytest.raises(OSError, match="disk full"):
        w.wait()
    assert seen == []
    w.wait()  # raised once
    w.submit(seen.append, 1)  # the writer goes on
    w.wait()
    assert seen == [1]


def test_submit_raises_an_earlier_failure_and_the_thread_ends():
    w = BackgroundWriter("t")
    done = threading.Event()

    def fail():
        done.set()
        raise ZeroDivisionError
    w.submit(fail)
    done.wait()
    while any(t.name == "t" for t in threading.enumerate()):
        pass
    with pytest.raises(ZeroDivisionError):
        w.submit(print, "never")
    w.wait()  # nothing left


def _fit(coco256, root, **ckpt):
    saver = cb.ModelCheckpoint(monitor="fitness", mode="max", save_last=True, **ckpt)
    tr = Trainer(max_epochs=2, limit_train_batches=1, limit_val_batches=1, accelerator="cpu", seed=0,
                 enable_progress_bar=False, logger=False, default_root_dir=str(root), callbacks=[saver])
    data = DetectionData(str(coco256 / "data.yaml"), imgsz=64, batch_size=4, workers=2, verbose=False)
    return tr, saver, data


def test_background_writes_give_the_files_of_writes_in_the_hook(coco256, tmp_path):
    """The same fit writing in the background and before each hook returns: the same files, with the same
    tensors, all on disk when fit returns, and no writer thread left."""
    files = []
    for background in (True, False):
        tr, saver, data = _fit(coco256, tmp_path / str(background), write_in_background=background)
        tr.fit(ptl.Detector("yolo26n"), data)
        assert not any(t.name == "ptl-checkpoint-writer" for t in threading.enumerate())
        root = tmp_path / str(background)
        names = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
                       if f.endswith((".ckpt", ".safetensors")))
        tensors = {n: ptl.io.load_safetensors(root / n)[0] for n in names}
        files.append((names, tensors))
    (names_bg, t_bg), (names_fg, t_fg) = files
    assert names_bg == names_fg and len(names_bg) >= 4
    for n in names_bg:
        assert sorted(t_bg[n]) == sorted(t_fg[n])
        for k in t_bg[n]:
            a, b = t_bg[n][k], t_fg[n][k]
            assert (a[0] == b[0]).all() if isinstance(a, tuple) else (a == b).all(), (n, k)


def test_a_failed_background_write_fails_the_fit_and_keeps_the_earlier_files(coco256, tmp_path):
    class FailSecondEpochsWrite(cb.Callback):
        armed = False

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            if trainer.current_epoch_completed == 2 and not self.armed:
                self.armed = True
                ptl.io._inject_write_fault(1000)  # the disk fails after 1000 bytes of the next write

    tr, saver, data = _fit(coco256, tmp_path)
    tr.callbacks.append(FailSecondEpochsWrite())
    with pytest.raises(OSError, match="injected failure"):
        tr.fit(ptl.Detector("yolo26n"), data)
    folder = tmp_path / "checkpoints"
    names = sorted(os.listdir(folder))
    assert "last.ckpt" in names and not any(".tmp." in n for n in names)
    ck = ptl.checkpoint.read(folder / "last.ckpt")
    assert ck.epochs_done == 1  # the first epoch's file, whole
    assert not any(t.name == "ptl-checkpoint-writer" for t in threading.enumerate())


def test_write_in_background_is_checked():
    with pytest.raises(ptl.ConfigError, match="write_in_background"):
        cb.ModelCheckpoint(write_in_background="yes")
