"""The dataset options and formats of issue 19 (data side), on coco256: single_cls, rect training batches,
fraction, the disk cache (byte-identical, atomic, invalidated), imgsz rounding and non-square training,
BMP/WebP/TIFF images, COCO-JSON datasets."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import ptl
from ptl import _C
from ptl.data import DataWarning, DetectionData, label_path

FILL = 114


def data(yaml, **kw):
    kw.setdefault("imgsz", 64)
    kw.setdefault("batch_size", 4)
    kw.setdefault("workers", 2)
    kw.setdefault("pin_memory", False)
    kw.setdefault("verbose", False)
    return DetectionData(str(yaml), **kw)


def batches(loader):
    return [(b.images.copy(), b.targets.copy(), b.indices.copy(), b.meta.copy()) for b in loader]


def assert_same(a, b, msg=""):
    assert len(a) == len(b), msg
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v, err_msg=msg)


def copy_dataset(coco256, root, n=12, split="train2017"):
    """n coco256 images with their labels, writable (YOLO layout); returns the yaml."""
    files = sorted((coco256 / "images" / split).glob("*.jpg"))[:n]
    for sub in ("images/train", "labels/train"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, root / "images/train" / f.name)
        lab = coco256 / "labels" / split / (f.stem + ".txt")
        if lab.exists():
            shutil.copy(lab, root / "labels/train" / lab.name)
    (root / "d.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: %s\n"
                                 % [str(i) for i in range(80)])
    return root / "d.yaml"


@pytest.fixture(scope="module")
def subset(coco256, tmp_path_factory):
    """32 coco256 train images through a list file (read-only images, like ../shared)."""
    root = tmp_path_factory.mktemp("subset")
    files = sorted((coco256 / "images/train2017").glob("*.jpg"))[:32]
    (root / "train.txt").write_text("".join(str(f) + "\n" for f in files))
    (root / "d.yaml").write_text("path: %s\ntrain: %s\nval: %s\nnames: %s\n"
                                 % (coco256, root / "train.txt", root / "train.txt", [str(i) for i in range(80)]))
    return root / "d.yaml"


# ---- single_cls ------------------------------------------------------------------------------------------------

def test_single_cls(tmp_path, coco256, subset):
    y = subset
    d = data(y, single_cls=True)
    assert d.names == ["item"] and d.num_classes == 1  # Ultralytics' trainer: names {0: "item"}, nc 1
    plain = data(y)
    tl, pl = d.train_loader(), plain.train_loader()
    assert tl.info["boxes"] == pl.info["boxes"] > 0
    for i in range(0, 32, 5):  # the same boxes, every class 0
        t, tp = tl.sample(i)[1], pl.sample(i)[1]
        np.testing.assert_array_equal(t[:, 1:], tp[:, 1:])
        assert (t[:, 0] == 0).all()
    assert {int(c) for b in tl for c in b.targets[:, 1]} == {0}
    assert len({int(c) for b in pl for c in b.targets[:, 1]}) > 5
    # a class beyond the names is accepted (Ultralytics checks classes only without single_cls); duplicates are
    # found with the classes as written
    root = tmp_path / "ds"
    (root / "images/train").mkdir(parents=True)
    shutil.copy(coco256 / "images/train2017/000000000009.jpg", root / "images/train/a.jpg")
    (root / "labels/train").mkdir(parents=True)
    (root / "labels/train/a.txt").write_text("7 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n")
    (root / "d.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: [a, b]\n")
    with pytest.warns(DataWarning, match="class 7 exceeds the dataset's 2 classes"):
        with pytest.raises(ValueError, match="none of the 1 images is usable"):
            data(root / "d.yaml").val_loader()
    with pytest.warns(DataWarning, match=r"a\.txt:3: duplicate row removed"):
        vl = data(root / "d.yaml", single_cls=True).val_loader()
    t = vl.sample(0)[1]
    assert t.shape == (2, 5) and (t[:, 0] == 0).all()


# ---- rect ---------------------------------------------------------------------------------------------------------

def rect_shapes_reference(hw, imgsz, batch, pad):
    """Ultralytics' set_rectangle: sort by h / w, per batch [max, 1] / [1, 1 / min] / [1, 1], then
    ceil(shape * imgsz / 32 + pad) * 32."""
    ar = hw[:, 0] / hw[:, 1]
    order = np.argsort(ar, kind="stable")
    ar = ar[order]
    shapes = []
    for s in range(0, len(ar), batch):
        a = ar[s:s + batch]
        shape = [a.max(), 1] if a.max() < 1 else [1, 1 / a.min()] if a.min() > 1 else [1, 1]
        shapes.append((np.ceil(np.array(shape) * imgsz / 32 + pad).astype(int) * 32).tolist())
    return order, shapes


def test_rect_training_batches(coco256):
    d = data(coco256 / "data.yaml", imgsz=128, batch_size=16, rect=True, mosaic=1.0, fliplr=0.0, hsv_h=0.0,
             hsv_s=0.0, hsv_v=0.0, translate=0.0, scale=0.0)
    with pytest.warns(UserWarning, match="training order is kept"):
        tl = d.train_loader()
    order, shapes = rect_shapes_reference(d.shapes("train"), 128, 16, 0.0)  # pad 0 for training
    assert tl.batch_shapes.tolist() == shapes and len({tuple(s) for s in shapes}) > 2
    assert not d.mosaic_enabled(0)
    seen = []
    for epoch in (0, 1):
        d.set_epoch(epoch)
        got = batches(tl)
        assert [list(b[0].shape[1:3]) for b in got] == shapes  # every image of a batch has its batch's shape
        np.testing.assert_array_equal(np.concatenate([b[2] for b in got]), order)  # fixed order, sorted by h / w
        assert tl.batch_shapes.tolist() == shapes
        seen.append(got)
    # no mosaic: without scale/translate a sample is the load-time resize letterboxed (scale-up on) to its
    # batch's shape (Pillow decodes with the same libjpeg as ptl)
    from PIL import Image
    files = d.files("train")
    k = int(seen[0][3][2][0])
    img = np.asarray(Image.open(files[k]).convert("RGB"))
    h0, w0 = img.shape[:2]
    r = 128 / max(h0, w0)
    loaded = _C.data_t_resize(img, min(int(np.ceil(w0 * r)), 128), min(int(np.ceil(h0 * r)), 128))
    want, _, left, top = _C.data_t_letterbox(loaded, *shapes[3], True)
    np.testing.assert_array_equal(seen[0][3][0][0], want)
    assert (want == FILL).any()
    # the augmentation still varies by epoch (flips, HSV, affine draws), the shapes never
    d2 = data(coco256 / "data.yaml", imgsz=128, batch_size=16, rect=True)
    with pytest.warns(UserWarning):
        t2 = d2.train_loader()
    e0 = batches(t2)
    d2.set_epoch(1)
    e1 = batches(t2)
    assert [b[0].shape for b in e0] == [b[0].shape for b in e1]
    assert not np.array_equal(e0[0][0], e1[0][0])


def test_rect_with_one_shape_still_shuffles(tmp_path, coco256):
    y = copy_dataset(coco256, tmp_path, n=8)
    from PIL import Image
    for f in (tmp_path / "images/train").glob("*.jpg"):  # every image square: one batch shape
        Image.open(f).convert("RGB").resize((200, 200)).save(str(f))
    d = data(y, imgsz=64, batch_size=4, rect=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        tl = d.train_loader()
    assert tl.batch_shapes.tolist() == [[64, 64], [64, 64]]
    e0 = np.concatenate([b.indices for b in tl])
    d.set_epoch(1)
    e1 = np.concatenate([b.indices for b in tl])
    assert sorted(e0) == sorted(e1) == list(range(8)) and not np.array_equal(e0, e1)


# ---- fraction -----------------------------------------------------------------------------------------------------

def test_fraction(coco256):
    y = coco256 / "data.yaml"
    full = data(y).files("train")
    d = data(y, fraction=0.25)
    assert d.files("train") == full[:32]  # the first quarter of the sorted list, max(1, round(128 * 0.25))
    assert d.train_loader().info["files"] == full[:32]
    assert d.val_loader().num_images == 128  # validation is never cut
    assert data(y, fraction=0.1).files("train") == full[:13]  # round(12.8)
    assert data(y, fraction=5).files("train") == full[:5]  # an int is an image count (Ultralytics)
    assert data(y, fraction=0.001).files("train") == full[:1]
    for bad in (0.0, 1.5, -2, 0, True):
        with pytest.raises(ValueError, match="fraction"):
            data(y, fraction=bad)


# ---- the disk cache -------------------------------------------------------------------------------------------------

def test_disk_cache_is_byte_identical_to_ram_and_none(tmp_path, coco256):
    """Batches from the disk cache (as written, and as read back by a new loader) equal those of the RAM cache
    and of no cache, bit for bit, in training (mosaic, affine, HSV, flips) and validation."""
    y = copy_dataset(coco256, tmp_path, n=12)
    runs = {}
    for name, cache in (("none", None), ("ram", "ram"), ("disk-write", "disk"), ("disk-read", "disk")):
        d = data(y, cache=cache, seed=5, workers=2)
        got = []
        for e in (0, 1):
            d.set_epoch(e)
            got += [batches(d.train_loader()), batches(d.val_loader())]
        runs[name] = got
        if name == "disk-write":
            files = sorted((tmp_path / "images/train/.ptl-cache").glob("*.ptlc"))
            assert len(files) == 12  # one per image, shared by training and validation (both load at 64 x 64)
            assert {f.name.split(".")[-2] for f in files} == {"64x64"}
            mtimes = {f: f.stat().st_mtime_ns for f in files}
    assert mtimes == {f: f.stat().st_mtime_ns for f in mtimes}  # read back, not rewritten
    for name in ("ram", "disk-write", "disk-read"):
        for a, b in zip(runs["none"], runs[name]):
            assert_same(a, b, name)
    # the file holds the resized image after a 64-byte header
    d = data(y, cache="disk", rect_val=False)
    vl = d.val_loader()
    first = vl.info["files"][0]
    blob = (tmp_path / "images/train/.ptl-cache" / (os.path.basename(first) + ".64x64.ptlc")).read_bytes()
    h0, w0 = d.shapes("val")[0]
    w, h = (64, int(np.ceil(h0 * 64 / w0))) if w0 >= h0 else (int(np.ceil(w0 * 64 / h0)), 64)
    assert blob[:8] == b"PTLCACHE" and len(blob) == 64 + w * h * 3


def test_disk_cache_beside_read_only_images_goes_to_cache_dir(tmp_path, subset, coco256):
    if os.stat(str(coco256 / "images/train2017")).st_mode & 0o222:
        pytest.skip("the shared images are writable here")
    ref = batches(data(subset, cache=None).train_loader())
    d = data(subset, cache="disk", cache_dir=str(tmp_path / "cc"))
    got = batches(d.train_loader())
    assert_same(ref, got)
    written = list((tmp_path / "cc").rglob("*.ptlc"))
    assert len(written) == 32 and not (coco256 / "images/train2017/.ptl-cache").exists()


def test_disk_cache_rebuilt_when_an_image_changes(tmp_path, coco256):
    y = copy_dataset(coco256, tmp_path, n=6)
    d = data(y, cache="disk", rect_val=False)
    d.val_loader()
    cache = tmp_path / "images/train/.ptl-cache"
    files = sorted((tmp_path / "images/train").glob("*.jpg"))
    target = cache / (files[2].name + ".64x64.ptlc")
    before = target.read_bytes()
    other = cache / (files[3].name + ".64x64.ptlc")
    other_mtime = other.stat().st_mtime_ns
    from PIL import Image
    img = np.asarray(Image.open(files[2]).convert("RGB"))
    Image.fromarray(255 - img).save(str(files[2]), quality=95)  # same size, new pixels, new mtime
    fresh = batches(data(y, cache=None, rect_val=False).val_loader())
    cached = batches(data(y, cache="disk", rect_val=False).val_loader())
    assert_same(fresh, cached)
    assert target.read_bytes() != before and other.stat().st_mtime_ns == other_mtime  # only that file rebuilt


WRITER = textwrap.dedent("""
    import sys
    from ptl.data import DetectionData
    print("start", flush=True)
    DetectionData(sys.argv[1], imgsz=640, batch_size=4, workers=1, cache="disk", verbose=False,
                  pin_memory=False, cache_dir=sys.argv[2]).val_loader()
    print("done", flush=True)
""")


def test_disk_cache_survives_a_kill_while_writing(tmp_path, coco256, subset):
    """A process killed (SIGKILL) while it writes the cache leaves complete files or none under their names
    (only temporary files, which the next loader removes); the next loader checks every file, writes the
    missing ones and gives the uncached batches. A torn or foreign file in place of a cache file is
    rewritten too."""
    cc = tmp_path / "cc"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(subset), str(cc)], stdout=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(cc.rglob("*.ptlc"))) < 3:
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = list(cc.rglob("*.ptlc"))
    assert 3 <= len(done) < 32, "the writer was not killed while writing"
    for f in done:  # every file under a final name is complete
        assert f.stat().st_size == 64 + int.from_bytes(f.read_bytes()[40:44], "little") * int.from_bytes(
            f.read_bytes()[44:48], "little") * 3
    folder = done[0].parent
    (folder / (done[0].name + ".tmp.999999999.0")).write_bytes(b"left by a dead writer")
    torn, foreign = done[0], done[1]
    torn.write_bytes(torn.read_bytes()[:1000])
    raw = bytearray(foreign.read_bytes())
    raw[20] ^= 0xFF  # the recorded source size no longer matches
    foreign.write_bytes(bytes(raw))
    ref = batches(data(subset, imgsz=640, batch_size=4, workers=1).val_loader())
    got = batches(data(subset, imgsz=640, batch_size=4, workers=1, cache="disk", cache_dir=str(cc)).val_loader())
    assert_same(ref, got)
    assert len(list(cc.rglob("*.ptlc"))) == 32 and not list(cc.rglob("*.tmp.*"))


def test_ctrl_c_while_filling_the_cache(tmp_path, coco256):
    """Ctrl-C during the disk cache's fill ends it promptly. The interrupt is sent once the fill has written
    its first file, and never after the call returned (a late SIGINT would end the whole test session)."""
    import threading
    cc = tmp_path / "cc"
    yaml = tmp_path / "all.yaml"  # all 256 images: far more than the fill writes before the interrupt
    yaml.write_text("path: %s\ntrain: images/train2017\nval: [images/train2017, images/val2017]\nnames: %s\n"
                    % (coco256, [str(i) for i in range(80)]))
    returned, sent = threading.Event(), []

    def interrupt():
        deadline = time.monotonic() + 60
        while not returned.is_set() and time.monotonic() < deadline:
            if any(cc.rglob("*.ptlc")):
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.005)
    timer = threading.Thread(target=interrupt)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            data(yaml, imgsz=640, workers=1, cache="disk", cache_dir=str(cc)).val_loader()
    finally:
        returned.set()
        timer.join()
    assert sent and time.monotonic() - sent[0] < 5
    assert len(list(cc.rglob("*.ptlc"))) < 256, "the fill ran to the end: the interrupt came too late to test"


# ---- imgsz --------------------------------------------------------------------------------------------------------

def test_imgsz_rounded_up_and_non_square(subset):
    with pytest.warns(UserWarning, match=r"imgsz=\(100, 150\) must be a multiple of the stride 32: updating to "
                                         r"\[128, 160\]"):
        d = data(subset, imgsz=(100, 150), batch_size=4)
    assert d.imgsz == [128, 160] and d.imgsz_hw == (128, 160)
    with pytest.warns(UserWarning, match="imgsz=100 must be a multiple of the stride 32: updating to 128"):
        assert data(subset, imgsz=100).imgsz == 128
    tl = d.train_loader()
    for mosaic in (True, False):
        img, t, _ = tl.sample(3, mosaic=mosaic)
        assert img.shape == (128, 160, 3) and len(t) > 0
        assert 0 <= t[:, 1:].min() and t[:, 1:].max() <= 1
    got = batches(tl)
    assert [b[0].shape for b in got] == [(4, 128, 160, 3)] * 8
    # validation: square at the long side (Ultralytics validates at one int imgsz), rectangular batches
    assert all(max(b[0].shape[1:3]) <= 160 + 32 for b in batches(d.val_loader()))


def test_non_square_imgsz_trains(subset, tmp_path):
    with pytest.warns(UserWarning, match="imgsz"):
        d = data(subset, imgsz=(100, 150), batch_size=2)
    tr = ptl.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, accelerator="cpu",
                     enable_progress_bar=False, enable_checkpointing=False, logger=False,
                     default_root_dir=str(tmp_path))
    tr.fit(ptl.Detector("yolo26n", num_classes=80), d)
    assert tr.current_epoch_completed == 1 and np.isfinite(tr.loss_history).all()


# ---- BMP, WebP, TIFF -------------------------------------------------------------------------------------------------

FORMATS = [("png", {}, True), ("bmp", {}, True), ("webp", {"lossless": True}, True),
           ("webp", {"quality": 90}, False), ("tiff", {}, True), ("tiff", {"compression": "tiff_lzw"}, True),
           ("tiff", {"compression": "tiff_adobe_deflate"}, True)]


def test_bmp_webp_tiff_decode_like_png(tmp_path, coco256):
    """Copies of coco256 images made with Pillow decode, through the loader, to within 1 level of the PNG
    reference where the format is lossless (and to Pillow's own decode of a lossy WebP)."""
    from PIL import Image
    srcs = sorted((coco256 / "images/val2017").glob("*.jpg"))[:3]
    root = tmp_path / "ds"
    (root / "images/val").mkdir(parents=True)
    pil = {}
    for k, src in enumerate(srcs):
        rgb = Image.open(src).convert("RGB")
        for j, (ext, kw, _) in enumerate(FORMATS):
            name = "im%d_%d.%s" % (k, j, ext)
            rgb.save(str(root / "images/val" / name), **kw)
            pil[name] = np.asarray(Image.open(str(root / "images/val" / name)).convert("RGB"))
    (root / "d.yaml").write_text("path: .\ntrain: images/val\nval: images/val\nnames: [a]\n")
    missing = [f for f, ok in _C.DATA_FORMATS.items() if not ok]
    if missing:
        pytest.skip("built without %s decoding" % missing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)  # no labels
        vl = data(root / "d.yaml", imgsz=640, rect_val=False).val_loader()
    files = [os.path.basename(f) for f in vl.info["files"]]
    assert len(files) == 3 * len(FORMATS)
    for i, name in enumerate(files):
        k, j = (int(v) for v in name[2:].split(".")[0].split("_"))
        img, _, meta = vl.sample(i)
        h0, w0 = int(meta[0]), int(meta[1])
        top, left = int(meta[5]), int(meta[4])
        got = img[top:top + h0, left:left + w0].astype(int)  # 640 on the long side: no resize, only padding
        ref = pil["im%d_0.png" % k] if FORMATS[j][2] else pil[name]
        assert got.shape == ref.shape and np.abs(got - ref).max() <= 1, name


def test_unbuilt_format_reported_once_with_its_count(tmp_path):
    missing = [f for f, ok in _C.DATA_FORMATS.items() if not ok]
    if not missing:
        pytest.skip("every format is built (the message of a missing one cannot be seen here)")
    from PIL import Image
    ext = {"WebP": "webp", "TIFF": "tiff"}[missing[0]]
    (tmp_path / "images/val").mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (32, 32)).save(str(tmp_path / "images/val" / ("a%d.%s" % (i, ext))))
    Image.new("RGB", (32, 32)).save(str(tmp_path / "images/val/ok.png"))
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/val\nval: images/val\nnames: [a]\n")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        data(tmp_path / "d.yaml").val_loader()
    msgs = [str(w.message) for w in rec if "built without" in str(w.message)]
    assert msgs == ["3 %s images skipped: ptl was built without %s decoding" % (missing[0], missing[0])
                    + msgs[0].split("decoding", 1)[1]]


# ---- COCO JSON ----------------------------------------------------------------------------------------------------

def coco_json_from_yolo(files, path, category_ids, crowd=False):
    """A COCO instances file holding the YOLO labels of files (bbox in pixels, image sizes from Pillow)."""
    from PIL import Image
    images, anns = [], []
    for i, f in enumerate(files):
        w, h = Image.open(f).size
        images.append({"id": 1000 + i, "file_name": os.path.basename(f), "width": w, "height": h})
        lab = label_path(str(f))
        rows = np.loadtxt(lab, ndmin=2) if os.path.exists(lab) and os.path.getsize(lab) else np.zeros((0, 5))
        for r in rows:
            c, cx, cy, bw, bh = r
            anns.append({"id": len(anns) + 1, "image_id": 1000 + i, "category_id": category_ids[int(c)],
                         "bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h], "iscrowd": 0,
                         "area": bw * w * bh * h})
        if crowd:  # COCO's evaluation ignores crowd boxes, and so does training; a box without area is dropped
            anns.append({"id": len(anns) + 1, "image_id": 1000 + i, "category_id": category_ids[0],
                         "bbox": [1, 1, 20, 20], "iscrowd": 1, "area": 400})
            anns.append({"id": len(anns) + 1, "image_id": 1000 + i, "category_id": category_ids[0],
                         "bbox": [5, 5, 0, 10], "iscrowd": 0, "area": 0})
    cats = [{"id": cid, "name": "c%d" % k, "supercategory": "x"} for k, cid in enumerate(category_ids)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))


def test_coco_json_gives_the_yolo_batches(tmp_path, coco256):
    """coco256's labels written as COCO instances (category ids with gaps, listed out of order, crowd and
    empty boxes added) give the same batches as the YOLO labels: images bit for bit, targets to float32."""
    ids = list(range(1, 91))
    ids = [i for i in ids if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]  # COCO's 80 of 90
    files = sorted((coco256 / "images/val2017").glob("*.jpg"))[:24]
    coco_json_from_yolo(files, tmp_path / "annotations/instances_val2017.json", ids, crowd=True)
    doc = json.loads((tmp_path / "annotations/instances_val2017.json").read_text())
    doc["categories"].reverse()  # sorted by id when mapped, not by position
    (tmp_path / "annotations/instances_val2017.json").write_text(json.dumps(doc))
    (tmp_path / "images").mkdir()
    (tmp_path / "images/val2017").symlink_to(coco256 / "images/val2017")  # found beside annotations/
    (tmp_path / "list.txt").write_text("".join(str(f) + "\n" for f in files))
    yolo = tmp_path / "yolo.yaml"
    yolo.write_text("path: %s\ntrain: %s\nval: %s\nnames: %s\n" % (coco256, tmp_path / "list.txt",
                                                                    tmp_path / "list.txt", [str(i) for i in range(80)]))
    cj = tmp_path / "coco.yaml"
    cj.write_text("path: .\ntrain: annotations/instances_val2017.json\nval: annotations/instances_val2017.json\n")
    dc, dy = data(cj, seed=2), data(yolo, seed=2)
    assert dc.names == ["c%d" % k for k in range(80)] and dc.num_classes == 80  # names from the categories
    assert [os.path.basename(f) for f in dc.files("val")] == [f.name for f in files]
    for loader in ("train_loader", "val_loader"):
        a, b = batches(getattr(dy, loader)()), batches(getattr(dc, loader)())
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x[0], y[0])
            np.testing.assert_array_equal(x[2], y[2])
            np.testing.assert_allclose(x[1], y[1], atol=1e-6)
    assert dc.val_loader().info["boxes"] == dy.val_loader().info["boxes"]
    # names in the yaml win; a category count that does not match them is an error naming the file
    cj.write_text(cj.read_text() + "names: %s\n" % [str(i) for i in range(80)])
    assert data(cj).names[3] == "3"
    cj.write_text(cj.read_text().rsplit("names", 1)[0] + "names: [a, b]\n")
    with pytest.raises(ValueError, match="instances_val2017.json: 80 categories but the data yaml has 2 names"):
        data(cj).val_loader()


def test_coco_json_errors_name_the_file(tmp_path):
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations/instances_x.json").write_text("{not json")
    y = tmp_path / "d.yaml"
    y.write_text("path: .\ntrain: annotations/instances_x.json\nval: annotations/instances_x.json\nnames: [a]\n")
    with pytest.raises(FileNotFoundError, match=r"no image folder for .*instances_x\.json"):
        data(y).val_loader()
    (tmp_path / "images/x").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"instances_x\.json: not a valid JSON file"):
        data(y).val_loader()
    (tmp_path / "annotations/instances_x.json").write_text(json.dumps({"images": [], "categories": []}))
    with pytest.raises(ValueError, match=r"instances_x\.json: no 'categories' list"):
        data(y).val_loader()
