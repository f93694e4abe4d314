"""Prediction sources (files, folders, globs, .txt lists, arrays, batches), Results, and the files
save / save_txt write (ptl/predict.py), from the Python API, the Trainer and the command line."""
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import ptl
from ptl.predict import Results

REPO = pathlib.Path(__file__).resolve().parent.parent
PT = pathlib.Path(__file__).resolve().parent / "data" / "yolo26n_3cls_fp16.pt"
KW = dict(imgsz=64, conf=0.0, max_det=4)  # small and fast; conf 0: every image has detections


@pytest.fixture(scope="module")
def model():
    return ptl.Detector.load(PT)


@pytest.fixture
def images(coco256, tmp_path):
    """Three val images in tmp/imgs (one as PNG, one in a subfolder) and a .txt list of them."""
    src = sorted((coco256 / "images" / "val2017").glob("*.jpg"))[:3]
    d = tmp_path / "imgs"
    (d / "sub").mkdir(parents=True)
    a = shutil.copy(src[0], d / "a.jpg")
    b = d / "b.png"
    Image.open(src[1]).convert("RGB").save(b)
    c = shutil.copy(src[2], d / "sub" / "c.jpg")
    (tmp_path / "list.txt").write_text("imgs/a.jpg\nimgs/b.png\n\nimgs/sub/c.jpg\n")
    return [pathlib.Path(a), b, pathlib.Path(c)]


def same(r, q):
    return np.array_equal(r.boxes, q.boxes) and np.array_equal(r.scores, q.scores) and np.array_equal(
        r.classes, q.classes)


def test_sources(model, images, tmp_path):
    a, b, c = images
    one = model.predict(str(a), **KW)
    assert len(one) == 1 and isinstance(one[0], Results)
    r = one[0]
    w, h = Image.open(a).size
    assert r.path == str(a) and r.orig_shape == (h, w) and r.names == ["cat", "dog", "traffic light"]
    assert len(r) == 4 and r["boxes"] is r.boxes and r["scores"] is r.scores and r["classes"] is r.classes
    assert r.boxes.min() >= 0 and r.boxes[:, [0, 2]].max() <= w and r.boxes[:, [1, 3]].max() <= h
    each = {p: model.predict(str(p), **KW)[0] for p in images}
    folder = model.predict(tmp_path / "imgs", **KW)  # recursive, sorted
    assert [x.path for x in folder] == sorted(str(p) for p in images)
    assert all(same(x, each[pathlib.Path(x.path)]) for x in folder)
    globbed = model.predict(str(tmp_path / "imgs" / "**" / "*.jpg"), **KW)
    assert sorted(x.path for x in globbed) == sorted([str(a), str(c)])
    listed = model.predict(tmp_path / "list.txt", **KW)
    assert [x.path for x in listed] == [str(a), str(b), str(c)]
    mixed = model.predict([str(c), a], **KW)
    assert [x.path for x in mixed] == [str(c), str(a)] and same(mixed[1], each[a])
    # arrays and PIL images: the same pixels give exactly what the file gives
    pixels = np.asarray(Image.open(b).convert("RGB"))
    from_array = model.predict([pixels, Image.open(b)], **KW)
    assert all(x.path is None and x.orig_shape == pixels.shape[:2] and same(x, each[b]) for x in from_array)
    # a network-ready batch: boxes in its own pixels
    batch = np.zeros((2, 64, 96, 3), np.uint8)
    out = model.predict(batch, conf=0.0, end2end=True)
    assert len(out) == 2 and out[0].orig_shape == (64, 96) and out[0]["boxes"].shape == (min(300, 8 * 12 + 4 * 6 + 6), 4)


def test_bad_sources(model, images, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        model.predict(tmp_path / "nope.jpg", **KW)
    with pytest.raises(FileNotFoundError, match=r"no images match .*\*\.bmp"):
        model.predict(str(tmp_path / "imgs" / "*.bmp"), **KW)
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(ValueError, match="notes.md"):
        model.predict(tmp_path / "notes.md", **KW)
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8"):
        model.predict([np.zeros((8, 8), np.uint8)], **KW)
    with pytest.raises(ValueError, match="imgsz"):
        model.predict(images[0], imgsz=50)
    broken = tmp_path / "imgs" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    with pytest.warns(ptl.DataWarning, match="broken.jpg"):
        res = model.predict(tmp_path / "imgs", **KW)
    assert [r is None for r in res] == [p.name == "broken.jpg" for p in sorted((tmp_path / "imgs").rglob("*.*"))
                                        if p.suffix != ".txt"]


def test_saved_images_and_labels(model, images, tmp_path):
    a, b, c = images
    res = model.predict([a, b, c, np.asarray(Image.open(a))], project=tmp_path, save=True, save_txt=True,
                        save_conf=True, **KW)
    out = tmp_path / "runs" / "predict" / "version_0"
    assert all(r.save_dir == str(out) for r in res)
    assert sorted(os.listdir(out)) == ["a.jpg", "b.png", "c.jpg", "image3.jpg", "labels"]
    assert sorted(os.listdir(out / "labels")) == ["a.txt", "b.txt", "c.txt", "image3.txt"]
    for r, stem in zip(res, ("a", "b", "c", "image3")):
        rows = np.loadtxt(out / "labels" / (stem + ".txt"), ndmin=2)
        assert rows.shape == (len(r), 6)
        h, w = r.orig_shape
        assert np.array_equal(rows[:, 0], r.classes)
        box = np.stack([(rows[:, 1] - rows[:, 3] / 2) * w, (rows[:, 2] - rows[:, 4] / 2) * h,
                        (rows[:, 1] + rows[:, 3] / 2) * w, (rows[:, 2] + rows[:, 4] / 2) * h], 1)
        assert np.abs(box - r.boxes).max() < 1e-3 * max(h, w)
        assert np.abs(rows[:, 5] - r.scores).max() < 1e-6
    drawn, plain = np.asarray(Image.open(out / "b.png")), np.asarray(Image.open(b).convert("RGB"))
    assert drawn.shape == plain.shape and (drawn != plain).any()
    from ptl.predict import _color
    x1, y1, x2, y2 = sorted(res[1].boxes[0][[0, 2]]) + sorted(res[1].boxes[0][[1, 3]])
    x1, y1, x2, y2 = int(np.ceil(x1)), int(np.ceil(y1)), int(x2), int(y2)
    assert tuple(drawn[(y1 + y2) // 2, x1]) == _color(int(res[1].classes[0])) or \
        tuple(drawn[(y1 + y2) // 2, x2]) == _color(int(res[1].classes[0]))  # the box outline, in its class colour
    # a second run gets the next folder; the default label rows have 5 columns
    model.predict(a, project=tmp_path, save_txt=True, **KW)
    assert np.loadtxt(tmp_path / "runs" / "predict" / "version_1" / "labels" / "a.txt", ndmin=2).shape[1] == 5
    assert not (tmp_path / "runs" / "predict" / "version_1" / "a.jpg").exists()
    assert not list(tmp_path.rglob("*.tmp.*"))


def test_trainer_predict_saves_under_its_root(model, images, tmp_path):
    tr = ptl.Trainer(accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False, logger=False,
                     default_root_dir=tmp_path / "root")
    res = tr.predict(model, tmp_path / "imgs", save=True, **KW)
    assert len(res) == 3
    assert sorted(os.listdir(tmp_path / "root" / "runs" / "predict" / "version_0")) == ["a.jpg", "b.png", "c.jpg"]


def test_predict_cli(images, tmp_path):
    r = subprocess.run([sys.executable, "-m", "ptl.predict", "--model", str(PT), "--source", str(tmp_path / "imgs"),
                        "--imgsz", "64", "--conf", "0", "--max-det", "2", "--save-txt", "--project", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 3 and "detections" not in r.stdout  # "<path>: 2 cat, ..." lines
    out = tmp_path / "runs" / "predict" / "version_0"
    assert sorted(os.listdir(out / "labels")) == ["a.txt", "b.txt", "c.txt"] and (out / "a.jpg").exists()
    from ptl.predict import main
    assert main(["--model", str(PT), "--source", str(tmp_path / "missing")]) == 2
