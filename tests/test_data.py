"""The data pipeline: data.yaml and path rules, decoding, label checks, augmentation geometry, loader
threads, determinism, close_mosaic, RAM cache, rectangular validation, normalisation (CPU and CUDA)."""
import os
import shutil
import struct
import warnings
import zlib

import numpy as np
import pytest

import ptl
from ptl import _C
from ptl.data import DataWarning, DetectionData, image_files, label_path, read_data_yaml

FILL = 114


# ---- helpers ----------------------------------------------------------------------------------------

def write_png(path, img, exif=None, exif_after_idat=False):
    """Minimal PNG writer: (H, W) gray, (H, W, 3) RGB or (H, W, 4) RGBA uint8; `exif` adds an eXIf chunk
    (before the image data unless exif_after_idat)."""
    img = np.ascontiguousarray(img, dtype=np.uint8)
    h, w = img.shape[:2]
    ct = 0 if img.ndim == 2 else {3: 2, 4: 6}[img.shape[2]]
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        ex = chunk(b"eXIf", exif) if exif is not None else b""
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ct, 0, 0, 0))
                + (b"" if exif_after_idat else ex) + chunk(b"IDAT", zlib.compress(raw))
                + (ex if exif_after_idat else b"") + chunk(b"IEND", b""))


def write_labels(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else " ".join(str(v) for v in r)) + "\n")


def make_dataset(root, n=4, size=(64, 48), nc=3, labels=True):
    """n RGB PNGs (w, h) = size with one box each, split train/val identical; returns the yaml path."""
    rng = np.random.default_rng(0)
    w, h = size
    for split in ("train", "val"):
        for i in range(n):
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            write_png(str(root / "images" / split / ("im%d.png" % i)), img)
            if labels:
                write_labels(str(root / "labels" / split / ("im%d.txt" % i)), [(i % nc, 0.5, 0.5, 0.5, 0.5)])
    y = root / "data.yaml"
    y.write_text("path: .\ntrain: images/train\nval: images/val\nnames:\n" +
                 "".join("  %d: c%d\n" % (i, i) for i in range(nc)))
    return str(y)


def data(yaml, **kw):
    kw.setdefault("imgsz", 64)
    kw.setdefault("batch_size", 2)
    kw.setdefault("workers", 1)
    kw.setdefault("pin_memory", False)
    kw.setdefault("verbose", False)
    return DetectionData(yaml, **kw)


def no_aug(**kw):
    base = dict(mosaic=0.0, degrees=0.0, translate=0.0, scale=0.0, shear=0.0, perspective=0.0, hsv_h=0.0,
                hsv_s=0.0, hsv_v=0.0, flipud=0.0, fliplr=0.0)
    base.update(kw)
    return base


def all_batches(loader):
    return [(b.images.copy(), b.targets.copy(), b.indices.copy(), b.meta.copy()) for b in loader]


# ---- data.yaml and paths ----------------------------------------------------------------------------

def test_coco256_yaml_and_paths(coco256):
    cfg = read_data_yaml(str(coco256 / "data.yaml"))
    assert cfg["nc"] == 80 and len(cfg["names"]) == 80 and cfg["names"][0] == "person"
    assert cfg["path"] == os.path.normpath(str(coco256))
    files = image_files(cfg["train"], cfg["path"])
    assert len(files) == 128 and files == sorted(files)
    assert label_path(files[0]) == str(coco256 / "labels" / "train2017" / "000000000009.txt")
    d = data(str(coco256 / "data.yaml"), imgsz=128, batch_size=16, workers=2)
    assert d.num_classes == 80 and d.names[79] == "toothbrush"
    tl = d.train_loader()
    missing = sum(not os.path.exists(label_path(f)) for f in files)
    assert tl.info["n"] == 128 and tl.info["skipped"] == 0 and tl.info["missing_labels"] == missing
    assert len(tl) == 8 and len(d) == 8
    assert len(d.val_loader()) == 4  # val batch = 2 x 16


def test_yaml_relative_path_list_file_and_names_list(tmp_path):
    root = tmp_path / "ds"
    make_dataset(root, n=3)
    (root / "train.txt").write_text("images/train/im0.png\n./images/train/im2.png\n\n")
    y = tmp_path / "cfg" / "d.yaml"
    y.parent.mkdir()
    y.write_text("path: ../ds\ntrain: train.txt\nval: [images/val]\nnames: [a, b, c]\n")
    cfg = read_data_yaml(str(y))
    assert cfg["path"] == str(root) and cfg["names"] == ["a", "b", "c"]
    assert image_files(cfg["train"], cfg["path"]) == [str(root / "images/train/im0.png"),
                                                      str(root / "images/train/im2.png")]
    d = data(str(y))
    assert d.train_loader().info["n"] == 2 and d.val_loader().info["n"] == 3
    # labels/ replaces the LAST images/ folder
    assert label_path("/a/images/b/images/c.jpg") == "/a/images/b/labels/c.txt"


def test_missing_and_empty_dataset_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        read_data_yaml(str(tmp_path / "nope.yaml"))
    y = tmp_path / "d.yaml"
    y.write_text("path: .\ntrain: images/train\nval: images/val\nnames: [a]\n")
    d = data(str(y))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "images" / "train")):
        d.train_loader()
    (tmp_path / "images" / "train").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no images found in .*images/train"):
        d.train_loader()
    (tmp_path / "images" / "train" / "bad.jpg").write_bytes(b"not an image at all")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="none of the 1 images is usable"):
            d.train_loader()
    msgs = [str(w.message) for w in rec]
    assert len(msgs) == 2 and "bad.jpg: not a JPEG, PNG, BMP, WebP or TIFF file" in msgs[0] and "0 images, 1 skipped" in msgs[1]
    y2 = tmp_path / "e.yaml"
    y2.write_text("path: .\ntrain: images/train\nnames: [a]\n")
    with pytest.raises(ValueError, match="missing 'val'"):
        read_data_yaml(str(y2))


def test_bad_arguments(tmp_path):
    y = make_dataset(tmp_path)
    with pytest.raises(ValueError, match="imgsz"):
        data(y, imgsz=0)
    with pytest.raises(ValueError, match="imgsz"):
        data(y, imgsz="640")
    with pytest.raises(ValueError, match="cache"):
        data(y, cache="tape")
    with pytest.raises(ValueError, match="fliplr"):
        data(y, fliplr=1.5)
    with pytest.raises(ValueError, match="epoch"):
        data(y).set_epoch(-1)


# ---- decoding ---------------------------------------------------------------------------------------

def test_png_decoding_rgb_gray_rgba(tmp_path):
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (64, 64), dtype=np.uint8)
    rgba = rng.integers(0, 256, (64, 64, 4), dtype=np.uint8)
    write_png(str(tmp_path / "images/val/a.png"), rgb)
    write_png(str(tmp_path / "images/val/b.png"), gray)
    write_png(str(tmp_path / "images/val/c.png"), rgba)
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/val\nval: images/val\nnames: [x]\n")
    d = data(str(tmp_path / "d.yaml"), rect_val=False)
    vl = d.val_loader()
    img = [vl.sample(i)[0] for i in range(3)]  # 64x64 at imgsz 64: no resize, no padding
    np.testing.assert_array_equal(img[0], rgb)
    np.testing.assert_array_equal(img[1], np.repeat(gray[:, :, None], 3, axis=2))
    np.testing.assert_array_equal(img[2], rgba[:, :, :3])


def test_jpeg_grayscale_and_exif_orientation(tmp_path, coco256):
    src = coco256 / "images/train2017/000000000009.jpg"  # 640 x 480
    raw = src.read_bytes()
    # APP1 Exif, big-endian TIFF, one IFD entry: Orientation (0x0112) SHORT = 6 (rotate 90 clockwise)
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, 6, 0) \
        + struct.pack(">I", 0)
    payload = b"Exif\x00\x00" + tiff
    app1 = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    (tmp_path / "images/val").mkdir(parents=True)
    (tmp_path / "images/val/a.jpg").write_bytes(raw)
    (tmp_path / "images/val/b.jpg").write_bytes(raw[:2] + app1 + raw[2:])
    shutil.copy(coco256 / "images/train2017/000000000086.jpg", tmp_path / "images/val/c.jpg")  # grayscale
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/val\nval: images/val\nnames: [x]\n")
    d = data(str(tmp_path / "d.yaml"), imgsz=640, rect_val=False)
    vl = d.val_loader()
    assert [tuple(s) for s in d.shapes("val")[:2]] == [(480, 640), (640, 480)]
    a, _, ma = vl.sample(0)
    b, _, mb = vl.sample(1)
    assert (ma[4], ma[5]) == (0, 80) and (mb[4], mb[5]) == (80, 0)
    np.testing.assert_array_equal(b[:, 80:560], np.rot90(a[80:560], k=-1))
    c, _, _ = vl.sample(2)
    assert (c[..., 0] == c[..., 1]).all() and (c[..., 1] == c[..., 2]).all() and c.std() > 10


def _tiff_orientation(value, little_endian=False):
    """A TIFF block with one IFD entry: Orientation (0x0112) SHORT = value."""
    e = "<" if little_endian else ">"
    return ((b"II\x2a\x00" if little_endian else b"MM\x00\x2a") + struct.pack(e + "I", 8) + struct.pack(e + "H", 1)
            + struct.pack(e + "HHIHH", 0x0112, 3, 1, value, 0) + struct.pack(e + "I", 0))


def test_png_exif_orientation(tmp_path):
    """PNG's eXIf chunk (a TIFF block, either byte order) rotates/flips the decoded image like JPEG's APP1;
    a chunk after the image data is ignored (the spec puts it before), so the probed size always matches
    the decoded one."""
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)  # h 48, w 64
    v = tmp_path / "images/val"
    write_png(str(v / "a.png"), img)
    write_png(str(v / "b.png"), img, exif=_tiff_orientation(6))  # rotate 90 clockwise
    write_png(str(v / "c.png"), img, exif=_tiff_orientation(3, little_endian=True))  # 180
    write_png(str(v / "d.png"), img, exif=_tiff_orientation(8, little_endian=True))  # 90 counter-clockwise
    write_png(str(v / "e.png"), img, exif=_tiff_orientation(6), exif_after_idat=True)
    write_png(str(v / "f.png"), img, exif=_tiff_orientation(2))  # mirrored left-right
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/val\nval: images/val\nnames: [x]\n")
    d = data(str(tmp_path / "d.yaml"), rect_val=False)
    assert [tuple(s) for s in d.shapes("val")] == [(48, 64), (64, 48), (48, 64), (64, 48), (48, 64), (48, 64)]
    vl = d.val_loader()
    a, b, c, dd, e, f = (vl.sample(i)[0] for i in range(6))  # letterboxed into 64 x 64, 8 pixels of padding
    np.testing.assert_array_equal(a[8:56], img)
    np.testing.assert_array_equal(b[:, 8:56], np.rot90(img, k=-1))
    np.testing.assert_array_equal(c[8:56], img[::-1, ::-1])
    np.testing.assert_array_equal(dd[:, 8:56], np.rot90(img, k=1))
    np.testing.assert_array_equal(e, a)
    np.testing.assert_array_equal(f[8:56], img[:, ::-1])


def test_cmyk_jpeg_converted(tmp_path):
    """A CMYK JPEG (Adobe, inverted, as Pillow and Photoshop write it) becomes RGB = (255 - C)(255 - K) / 255
    per channel, computed from the decoded ink values."""
    Image = pytest.importorskip("PIL.Image")
    # two flat halves: JPEG's loss stays small and the left half has a hand-computed value
    cmyk = np.zeros((64, 64, 4), np.uint8)
    cmyk[:, :32] = (20, 200, 90, 40)
    cmyk[:, 32:] = (230, 10, 130, 0)
    v = tmp_path / "images/val"
    v.mkdir(parents=True)
    Image.fromarray(cmyk, mode="CMYK").save(str(v / "a.jpg"), quality=100, subsampling=0)
    dec = np.asarray(Image.open(str(v / "a.jpg")).convert("CMYK")).astype(np.int64)  # the stored inks
    want = ((255 - dec[..., :3]) * (255 - dec[..., 3:4]) + 127) // 255
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/val\nval: images/val\nnames: [x]\n")
    got = data(str(tmp_path / "d.yaml"), rect_val=False).val_loader().sample(0)[0].astype(np.int64)
    assert got.shape == (64, 64, 3)
    assert np.abs(got - want).max() <= 2, np.abs(got - want).max()
    assert abs(int(got[32, 10, 0]) - (255 - 20) * (255 - 40) // 255) <= 3


# ---- bad input --------------------------------------------------------------------------------------

def test_bad_inputs_reported_once_and_skipped(tmp_path, coco256):
    import re

    img = np.full((32, 32, 3), 50, np.uint8)
    good_jpg = (coco256 / "images/train2017/000000000009.jpg").read_bytes()
    tr, lb = tmp_path / "images/train", tmp_path / "labels/train"

    def png(name, rows):
        write_png(str(tr / (name + ".png")), img)
        if rows is not None:
            write_labels(str(lb / (name + ".txt")), rows)

    png("ok", [(0, 0.5, 0.5, 0.2, 0.2)])
    png("nolabel", None)
    png("fields", [(0, 0.5, 0.5, 0.2, 0.2), (1, 0.5, 0.5, 0.2)])
    png("cls", [(0, 0.5, 0.5, 0.2, 0.2), (0, 0.1, 0.1, 0.1, 0.1), (3, 0.5, 0.5, 0.2, 0.2)])
    png("nan", ["0 0.5 nan 0.2 0.2"])
    png("range", [(1, 0.5, 1.5, 0.2, 0.2)])
    png("neg", [(1, -0.2, 0.5, 0.2, 0.2)])
    png("dup", [(2, 0.5, 0.5, 0.2, 0.2), (1, 0.3, 0.3, 0.1, 0.1), (2, 0.5, 0.5, 0.2, 0.2)])
    png("poly", ["1 0.1 0.2 0.5 0.2 0.5 0.6 0.1 0.6"])
    png("tol", [(1, 0.5, 0.5, 1.005, 0.2)])
    (tr / "trunc.jpg").write_bytes(good_jpg[: len(good_jpg) // 2])
    (tr / "trailing.jpg").write_bytes(good_jpg + b"trailing data after the end-of-image marker")
    (tr / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64 + b"IEND\xaeB`\x82")
    write_png(str(tr / "tiny.png"), np.zeros((8, 40, 3), np.uint8))
    os.symlink(str(tmp_path / "does-not-exist"), str(tr / "dangling.jpg"))
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: [a, b, c]\n")
    d = data(str(tmp_path / "d.yaml"), batch_size=4, **no_aug())
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        tl = d.train_loader()
    msgs = [str(w.message) for w in rec if issubclass(w.category, DataWarning)]

    def one(pattern):
        hits = [m for m in msgs if re.search(pattern, m)]
        assert len(hits) == 1, (pattern, msgs)

    one(r"fields\.txt:2: 4 fields")
    one(r"cls\.txt:3: class 3 exceeds the dataset's 3 classes")
    one(r"nan\.txt:1: field 3 is not finite")
    one(r"range\.txt:1: coordinate 1\.5 out of")
    one(r"neg\.txt:1: coordinate -0\.2 out of")
    one(r"dup\.txt:3: duplicate row removed")
    one(r"trunc\.jpg: truncated JPEG")
    one(r"garbage\.png: corrupt PNG")
    one(r"tiny\.png: image size 40x8 is under 10 pixels")
    one(r"dangling\.jpg: cannot open")
    one(r"6 images, 9 skipped, 1 duplicate label rows removed")
    assert len(msgs) == 11 and len(d.problems) == 10
    assert tl.info["n"] == 6 and tl.info["skipped"] == 9 and tl.info["duplicates"] == 1
    # kept, in sorted file order: dup, nolabel, ok, poly, tol, trailing (no augmentation: targets = labels)
    t = [tl.sample(i)[1] for i in range(5)]
    np.testing.assert_allclose(t[0], [[2, 0.5, 0.5, 0.2, 0.2], [1, 0.3, 0.3, 0.1, 0.1]], atol=1e-6)
    assert t[1].shape == (0, 5)
    np.testing.assert_allclose(t[2], [[0, 0.5, 0.5, 0.2, 0.2]], atol=1e-6)
    np.testing.assert_allclose(t[3], [[1, 0.3, 0.4, 0.4, 0.4]], atol=1e-6)  # polygon -> its box
    np.testing.assert_allclose(t[4], [[1, 0.5, 0.5, 1.0, 0.2]], atol=1e-6)  # within tolerance, clipped


def test_scan_comes_before_the_fill(tmp_path):
    """scan() gives the split's loader with nothing decoded into its cache; *_loader() returns that same
    object filled, once (a fit makes its conv plans between the two)."""
    d = data(make_dataset(tmp_path), cache="ram")
    tl = d.scan("train")
    need, filled = tl._c.cache_info()
    assert need == 4 * 64 * 48 * 3 and filled == 0  # no letterbox padding in the cache: 64x48 at imgsz 64
    assert len(tl) == 2 and [tuple(s) for s in tl.batch_shapes] == [(64, 64), (64, 64)]
    assert d.train_loader() is tl and tl._c.cache_info() == (need, need)
    assert d.train_loader() is tl and d.scan("train") is tl
    assert d.scan("val")._c.cache_info()[1] == 0 and d.val_loader()._c.cache_info()[1] == need
    with pytest.raises(ValueError, match="split: expected 'train' or 'val'"):
        d.scan("test")


def test_ring_exhaustion_is_an_error_not_a_hang(tmp_path):
    y = make_dataset(tmp_path, n=8)
    d = data(y, batch_size=1, workers=2, prefetch=2, **no_aug())
    it = iter(d.train_loader())
    held = [next(it), next(it)]
    with pytest.raises(RuntimeError, match="all 2 batches of the loader's ring"):
        next(it)
    assert len(held) == 2


# ---- geometry: hand-computed cases -----------------------------------------------------------------

def test_letterbox_hand_case():
    img = np.random.default_rng(0).integers(0, 256, (50, 100, 3), dtype=np.uint8)
    out, r, left, top = _C.data_t_letterbox(img, 64, 64, True)
    # r = min(64/50, 64/100) = 0.64, new = (64, 32), dh = 16 -> top = round(15.9) = 16
    assert r == pytest.approx(0.64) and (left, top) == (0, 16)
    assert (out[:16] == FILL).all() and (out[48:] == FILL).all()
    np.testing.assert_array_equal(out[16:48], _C.data_t_resize(img, 64, 32))
    out, r, left, top = _C.data_t_letterbox(img, 96, 160, False)  # no scale-up: r = 1, dw = 30, dh = 23
    assert r == 1 and (left, top) == (30, 23)
    np.testing.assert_array_equal(out[23:73, 30:130], img)
    assert (out[:23] == FILL).all() and (out[73:] == FILL).all() and (out[:, 130:] == FILL).all()
    # odd padding: dw = 3 / 2 = 1.5 -> left = round(1.4) = 1 (right 2)
    _, _, left, top = _C.data_t_letterbox(np.zeros((10, 29, 3), np.uint8), 10, 32, False)
    assert (left, top) == (1, 0)


def test_resize_bilinear_hand_case():
    img = np.array([[[0] * 3, [100] * 3]], np.uint8)  # 1 x 2
    out = _C.data_t_resize(img, 4, 1)
    # source x = (d + 0.5) / 2 - 0.5 = -0.25 (clamped to 0), 0.25, 0.75, 1.25 (clamped to 1)
    np.testing.assert_array_equal(out[0, :, 0], [0, 25, 75, 100])
    big = np.random.default_rng(0).integers(0, 256, (7, 9, 3), dtype=np.uint8)
    np.testing.assert_array_equal(_C.data_t_resize(big, 9, 7), big)


def test_load_size_rule(tmp_path):
    # §7.2: r = imgsz / max(h0, w0); size (min(ceil(w0 r), imgsz), min(ceil(h0 r), imgsz))
    write_png(str(tmp_path / "images/val/a.png"), np.zeros((30, 70, 3), np.uint8))
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/val\nval: images/val\nnames: [x]\n")
    d = data(str(tmp_path / "d.yaml"), imgsz=64, rect_val=False)
    _, _, meta = d.val_loader().sample(0)
    # 70 -> 64, 30 * 64/70 = 27.43 -> 28; letterbox to 64x64 without scale-up: pad top (64-28)/2 = 18
    assert meta[2] == pytest.approx(28 / 30) and meta[3] == pytest.approx(64 / 70)
    assert (meta[4], meta[5]) == (0, 18)


def test_flip_hand_case():
    img = np.zeros((4, 10, 3), np.uint8)
    img[:, 0] = 255
    boxes = np.array([[3, 1.0, 0.5, 4.0, 2.5]], np.float32)
    out, b = _C.data_t_flip(img, boxes, True)
    assert (out[:, 9] == 255).all() and (out[:, :9] == 0).all()
    np.testing.assert_allclose(b, [[3, 6.0, 0.5, 9.0, 2.5]])
    out, b = _C.data_t_flip(img, boxes, False)
    np.testing.assert_array_equal(out, img[::-1])
    np.testing.assert_allclose(b, [[3, 1.0, 1.5, 4.0, 3.5]])


def test_flip_in_pipeline(tmp_path):
    y = make_dataset(tmp_path, n=2, size=(64, 64))
    write_labels(str(tmp_path / "labels/train/im0.txt"), [(1, 0.25, 0.5, 0.3, 0.4)])
    plain = data(y, **no_aug()).train_loader().sample(0)
    flipped = data(y, **no_aug(fliplr=1.0)).train_loader().sample(0)
    np.testing.assert_array_equal(flipped[0], plain[0][:, ::-1])
    np.testing.assert_allclose(plain[1], [[1, 0.25, 0.5, 0.3, 0.4]], atol=1e-6)
    np.testing.assert_allclose(flipped[1], [[1, 0.75, 0.5, 0.3, 0.4]], atol=1e-6)



@pytest.mark.parametrize("mosaic", [False, True])
def test_flips_fused_with_warp_and_hsv(tmp_path, mosaic):
    # The pipeline applies HSV and the flips to each warped row (augment_rows.h); the draws do not depend
    # on the flip probabilities, so flipping must commute with everything else.
    y = make_dataset(tmp_path, n=4, size=(64, 48))
    aug = dict(mosaic=1.0 if mosaic else 0.0, translate=0.3, scale=0.4, hsv_h=0.5, hsv_s=0.7, hsv_v=0.4)
    for i in range(4):
        img, t, _ = data(y, **no_aug(**aug)).train_loader().sample(i, epoch=2)
        lr, tl, _ = data(y, **no_aug(fliplr=1.0, **aug)).train_loader().sample(i, epoch=2)
        ud, tu, _ = data(y, **no_aug(flipud=1.0, **aug)).train_loader().sample(i, epoch=2)
        both, _, _ = data(y, **no_aug(fliplr=1.0, flipud=1.0, **aug)).train_loader().sample(i, epoch=2)
        assert (img != FILL).any() and len(np.unique(img.reshape(-1, 3), axis=0)) > 100
        np.testing.assert_array_equal(lr, img[:, ::-1])
        np.testing.assert_array_equal(ud, img[::-1])
        np.testing.assert_array_equal(both, img[::-1, ::-1])
        np.testing.assert_allclose(tl[:, 1], 1 - t[:, 1], atol=1e-6)
        np.testing.assert_allclose(tu[:, 2], 1 - t[:, 2], atol=1e-6)
        np.testing.assert_allclose(tl[:, [0, 2, 3, 4]], t[:, [0, 2, 3, 4]], atol=1e-6)

def test_affine_matrix_hand_cases():
    # all draws 0.5: no rotation, shear or perspective, sigma 1, the input centre moved to the output centre
    M, s = _C.data_t_affine_matrix(200, 100, 100, 50, (0.5,) * 8, 0.0, 0.1, 0.5, 0.0, 0.0)
    assert s == pytest.approx(1.0)
    np.testing.assert_allclose(M, [[1, 0, -50], [0, 1, -25], [0, 0, 1]], atol=1e-12)
    # u2 = 1 -> angle +90 degrees, u3 = 1 -> sigma 1.5, u6 = u7 = 1 with translate 0.1 -> T = 0.6 * size
    M, s = _C.data_t_affine_matrix(100, 100, 100, 100, (0.5, 0.5, 1.0, 1.0, 0.5, 0.5, 1.0, 1.0),
                                   90.0, 0.1, 0.5, 0.0, 0.0)
    assert s == pytest.approx(1.5)
    # R = [[s cos a, s sin a], [-s sin a, s cos a]] = [[0, 1.5], [-1.5, 0]] about (50, 50), then + (60, 60)
    np.testing.assert_allclose(M, [[0, 1.5, 60 - 75], [-1.5, 0, 60 + 75], [0, 0, 1]], atol=1e-9)
    # shear u4 = 1 with shear 45: S[0][1] = tan(45 deg) = 1
    M, _ = _C.data_t_affine_matrix(10, 10, 10, 10, (0.5, 0.5, 0.5, 0.5, 1.0, 0.5, 0.5, 0.5), 0.0, 0.0, 0.0,
                                   45.0, 0.0)
    np.testing.assert_allclose(M, [[1, 1, -5], [0, 1, 0], [0, 0, 1]], atol=1e-12)


def test_box_transform_and_candidate_rule():
    M = np.array([[0, 1.5, -15], [-1.5, 0, 135], [0, 0, 1]])
    out = _C.data_t_boxes_affine(np.array([[7, 40, 30, 60, 40]], np.float32), M, 1.5, 100, 100, 0.1)
    # corners (x, y) -> (1.5 y - 15, -1.5 x + 135): x' in [30, 45], y' in [45, 75]
    np.testing.assert_allclose(out, [[7, 30, 45, 45, 75]], atol=1e-4)
    shift = np.array([[1, 0, -55], [0, 1, 0], [0, 0, 1]], np.float64)
    boxes = np.array([[1, 50, 10, 60, 20],    # -> x [-5, 5] clipped to [0, 5]: w 5, area 50/100: kept
                      [2, 50, 30, 56, 40],    # -> [0, 1]: w 1 <= 2: dropped
                      [3, 55, 50, 155, 60]],  # -> [0, 100], fully inside
                     np.float32)
    out = _C.data_t_boxes_affine(boxes, shift, 1.0, 100, 100, 0.1)
    np.testing.assert_allclose(out, [[1, 0, 10, 5, 20], [3, 0, 50, 100, 60]])
    # area rule: a 10x10 box scaled by sigma 2 maps to x' in [-17, 3] (clipped [0, 3]), y' in [0, 20]:
    # 3 * 20 / (2^2 * 10 * 10) = 0.15 -> kept with threshold 0.10, dropped with 0.20
    s2 = np.array([[2, 0, -17], [0, 2, 0], [0, 0, 1]], np.float64)
    out = _C.data_t_boxes_affine(np.array([[0, 0, 0, 10, 10]], np.float32), s2, 2.0, 100, 100, 0.1)
    np.testing.assert_allclose(out, [[0, 0, 0, 3, 20]])
    out = _C.data_t_boxes_affine(np.array([[0, 0, 0, 10, 10]], np.float32), s2, 2.0, 100, 100, 0.2)
    assert out.shape == (0, 5)
    # aspect ratio >= 100 is dropped, < 100 kept
    eye = np.eye(3)
    assert _C.data_t_boxes_affine(np.array([[0, 0, 0, 400, 4.1]], np.float32), eye, 1.0, 999, 999,
                                  0.1).shape == (1, 5)  # 97.6
    assert _C.data_t_boxes_affine(np.array([[0, 0, 0, 400, 3.9]], np.float32), eye, 1.0, 999, 999,
                                  0.1).shape == (0, 5)  # 102.6


def test_warp_integer_shift_and_border():
    img = np.random.default_rng(2).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    M = np.array([[1, 0, -5], [0, 1, 3], [0, 0, 1]], np.float64)  # output (x, y) <- input (x + 5, y - 3)
    out = _C.data_t_warp(img, M, 30, 20)
    np.testing.assert_array_equal(out[3:, :25], img[:17, 5:])
    assert (out[:3] == FILL).all() and (out[:, 25:] == FILL).all()
    # the separable path (no rotation/shear) equals the general one (a negligible shear forces it)
    big = np.random.default_rng(3).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    M = np.array([[0.77, 0, -6.3], [0, 1.31, 4.9], [0, 0, 1]], np.float64)
    Mg = M.copy()
    Mg[0, 1] = 1e-300
    sep, gen = _C.data_t_warp(big, M, 64, 60), _C.data_t_warp(big, Mg, 64, 60)
    assert (sep == FILL).any() and (sep != FILL).any()
    np.testing.assert_array_equal(sep, gen)
    # half-pixel shift: bilinear average of neighbours
    M = np.array([[1, 0, -0.5], [0, 1, 0], [0, 0, 1]], np.float64)
    out = _C.data_t_warp(img, M, 30, 20)
    want = np.floor((img[:, :-1].astype(np.float64) + img[:, 1:]) / 2 + 0.5)
    np.testing.assert_array_equal(out[:, :29], want)



def warp_reference(img, M, w_out, h_out):
    """The fixed-point warp in numpy: coordinates to 1/1024 pixel (per-column and per-row parts rounded
    separately, as OpenCV's warpAffine), taps to 1/32 pixel, exact bilinear weights, one rounding, taps
    outside the input reading the fill value."""
    im = np.linalg.inv(M)
    h_in, w_in = img.shape[:2]
    pad = np.full((h_in + 2, w_in + 2, 3), FILL, np.int64)
    pad[1:-1, 1:-1] = img
    xs, ys = np.arange(w_out), np.arange(h_out)
    X = (np.rint(im[0, 2] * 1024).astype(np.int64) + 16 + np.rint(im[0, 0] * xs * 1024).astype(np.int64)) >> 5
    Y = (np.rint((im[1, 1] * ys + im[1, 2]) * 1024).astype(np.int64) + 16) >> 5
    sx, fx, sy, fy = X >> 5, X & 31, Y >> 5, Y & 31
    out = np.full((h_out, w_out, 3), FILL, np.uint8)
    okx, oky = (sx >= -1) & (sx < w_in), (sy >= -1) & (sy < h_in)
    for y in np.nonzero(oky)[0]:
        x = np.nonzero(okx)[0]
        a, b = sx[x] + 1, sy[y] + 1
        g, f, gy, fyy = (32 - fx[x])[:, None], fx[x][:, None], 32 - fy[y], fy[y]
        v = (pad[b, a] * g * gy + pad[b, a + 1] * f * gy + pad[b + 1, a] * g * fyy + pad[b + 1, a + 1] * f * fyy)
        out[y, x] = (v + 512) >> 10
    return out


def test_warp_separable_matches_reference_and_general_path():
    rng = np.random.default_rng(11)
    for k in range(120):
        h_in, w_in = rng.integers(1, 40, 2)
        img = rng.integers(0, 256, (h_in, w_in, 3), dtype=np.uint8)
        a, b = rng.uniform(0.3, 3.0, 2) * rng.choice([-1, 1], 2)
        M = np.array([[a, 0, rng.uniform(-50, 50)], [0, b, rng.uniform(-50, 50)], [0, 0, 1]])
        if k % 4 == 0:  # first rows just above the input (source row -1), and an integer shift
            M = np.array([[1, 0, rng.integers(-5, 5)], [0, 1, 2.03], [0, 0, 1]], np.float64)
        w_out, h_out = (int(v) for v in rng.integers(1, 60, 2))
        out = _C.data_t_warp(img, M, w_out, h_out)
        np.testing.assert_array_equal(out, warp_reference(img, M, w_out, h_out))
        Mg = M.copy()
        Mg[0, 1] = 1e-300  # forces the general (rotation/shear) path, whose taps are computed per pixel
        np.testing.assert_array_equal(out, _C.data_t_warp(img, Mg, w_out, h_out))

def test_mosaic_rects_hand_cases():
    s, w, h = 64, 40, 30
    def R(k, w, h, xc, yc, s):
        return _C.data_t_mosaic_rects(k, w, h, xc, yc, s, s)

    assert R(0, w, h, 50, 70, s) == ((10, 40, 50, 70), (0, 0, 40, 30))
    assert R(1, w, h, 50, 70, s) == ((50, 40, 90, 70), (0, 0, 40, 30))
    assert R(2, w, h, 50, 70, s) == ((10, 70, 50, 100), (0, 0, 40, 30))
    assert R(3, w, h, 50, 70, s) == ((50, 70, 90, 100), (0, 0, 40, 30))
    # clipped at the canvas edges (2s = 128)
    assert R(0, w, h, 20, 100, s) == ((0, 70, 20, 100), (20, 0, 40, 30))
    assert R(1, w, h, 100, 20, s) == ((100, 0, 128, 20), (0, 10, 28, 30))
    assert R(2, w, h, 20, 100, s) == ((0, 100, 20, 128), (20, 0, 40, 28))
    assert R(3, w, h, 100, 110, s) == ((100, 110, 128, 128), (0, 0, 28, 18))


def test_mosaic_in_pipeline_boxes_sit_on_their_tiles(tmp_path):
    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    for i, c in enumerate(colors):
        write_png(str(tmp_path / ("images/train/im%d.png" % i)), np.full((64, 64, 3), c, np.uint8))
        write_labels(str(tmp_path / ("labels/train/im%d.txt" % i)), [(i, 0.5, 0.5, 0.8, 0.8)])
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: [a, b, c, d]\n")
    # scale 0, translate 0: M is a shift by -s/2 (exact copy of the canvas centre)
    d = data(str(tmp_path / "d.yaml"), **no_aug(mosaic=1.0))
    tl = d.train_loader()
    seen = 0
    for epoch in range(3):
        for i in range(4):
            img, t, _ = tl.sample(i, epoch=epoch, mosaic=True)
            assert ((img == 114).all(axis=2)).sum() == 0  # the 64x64 window is covered by the 4 tiles
            assert len(t) >= 1
            for cls, cx, cy, bw, bh in t:
                x1, x2 = int(np.ceil((cx - bw / 2) * 64)), int((cx + bw / 2) * 64)
                y1, y2 = int(np.ceil((cy - bh / 2) * 64)), int((cy + bh / 2) * 64)
                region = img[y1:y2, x1:x2].reshape(-1, 3)
                assert len(region) > 0
                assert (region == colors[int(cls)]).all()
                seen += 1
    assert seen >= 12



def test_mosaic_canvas_and_tile_rows_agree(tmp_path):
    # Without rotation the warp reads the mosaic tiles row by row; with one (here a negligible one) it
    # reads the part of a 2s x 2s canvas that it needs, filled with the tiles and 114. Same pixels.
    y = make_dataset(tmp_path, n=5, size=(64, 40))
    rng = np.random.default_rng(9)
    for i, (w, h) in enumerate([(64, 40), (30, 64), (50, 50), (64, 20), (20, 30)]):  # varied tile layouts
        write_png(str(tmp_path / "images" / "train" / ("im%d.png" % i)), rng.integers(0, 256, (h, w, 3), np.uint8))
    sep = data(y, mosaic=1.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0).train_loader()
    gen = data(y, mosaic=1.0, degrees=1e-12, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0).train_loader()
    fills = 0
    for epoch in range(3):
        for i in range(5):
            a, ta, _ = sep.sample(i, epoch=epoch, mosaic=True)
            b, tb, _ = gen.sample(i, epoch=epoch, mosaic=True)
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(ta, tb, atol=1e-5)
            fills += int((a == FILL).all(axis=2).any())
    assert fills > 0  # some samples show the canvas border

def test_hsv_hand_cases():
    red = np.zeros((2, 2, 3), np.uint8)
    red[..., 0] = 255
    np.testing.assert_array_equal(_C.data_t_hsv(red, (1 / 3, 0, 0))[0, 0], [0, 255, 0])  # hue +60 (=120 deg)
    np.testing.assert_array_equal(_C.data_t_hsv(red, (2 / 3, 0, 0))[0, 0], [0, 0, 255])
    np.testing.assert_array_equal(_C.data_t_hsv(red, (0, -1, 0))[0, 0], [255, 255, 255])  # no saturation
    np.testing.assert_array_equal(_C.data_t_hsv(red, (0, 0, -0.5))[0, 0], [127, 0, 0])  # V 255 -> 127
    gray = np.full((1, 1, 3), 77, np.uint8)
    np.testing.assert_array_equal(_C.data_t_hsv(gray, (0.3, 0.5, 0.0)), gray)  # S = 0: hue/sat do nothing



def hsv_reference(img, r):
    """RandomHSV (spec §7.6) in numpy with the arithmetic the C code documents: OpenCV's 8-bit RGB->HSV
    (12-bit division tables), the three per-sample tables, and HSV->RGB factors computed in float32 and
    rounded to 15 bits, times V."""
    x = np.arange(256, dtype=np.float64)
    hv = np.fmod(x + r[0] * 180.0, 180.0)
    lh = np.where(hv < 0, hv + 180.0, hv).astype(np.int64)
    ls = np.clip(x * (1 + r[1]), 0, 255).astype(np.int64)
    lv = np.clip(x * (1 + r[2]), 0, 255).astype(np.int64)
    i = np.arange(1, 256, dtype=np.float64)
    sdiv = np.concatenate([[0], np.rint((255 << 12) / i)]).astype(np.int64)
    hdiv = np.concatenate([[0], np.rint((180 << 12) / (6.0 * i))]).astype(np.int64)
    R, G, B = (img[..., c].astype(np.int64) for c in range(3))
    V = np.maximum(R, np.maximum(G, B))
    d = V - np.minimum(R, np.minimum(G, B))
    S = (d * sdiv[V] + 2048) >> 12
    num = np.where(V == R, G - B, np.where(V == G, B - R + 2 * d, R - G + 4 * d))
    H = (num * hdiv[d] + 2048) >> 12
    H = np.where(H < 0, H + 180, H)
    H2, S2, V2 = lh[H], ls[S], lv[V]
    f32 = np.float32
    s = S2.astype(f32) * (f32(1) / f32(255))
    f = H2.astype(f32) * (f32(6) / f32(180))
    sec = np.floor(f).astype(np.int64)
    f = f - sec.astype(f32)
    t = np.stack([np.ones_like(s), f32(1) - s, f32(1) - s * f, f32(1) - s * (f32(1) - f)], -1)
    F = np.rint(t * f32(32768)).astype(np.int64)
    order = np.array([[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]])
    Fc = np.take_along_axis(F, order[sec], axis=-1)
    return ((V2[..., None] * Fc + 16384) >> 15).astype(np.uint8)


def test_hsv_matches_reference():
    rng = np.random.default_rng(4)
    grid = np.stack(np.meshgrid(*[np.arange(0, 256, 5)] * 3, indexing="ij"), -1).reshape(52, 52 * 52, 3)
    for img in (rng.integers(0, 256, (61, 203, 3), dtype=np.uint8), grid.astype(np.uint8)):
        for r in [(0.013, 0.61, -0.37), (-0.0149, -0.69, 0.39), (0.5, 0.99, 0.99), (-0.7, -1.0, -1.0)]:
            np.testing.assert_array_equal(_C.data_t_hsv(img.copy(), r), hsv_reference(img, r))

# ---- loader: determinism, close_mosaic, cache, validation ------------------------------------------

@pytest.fixture(scope="module")
def subset(coco256, tmp_path_factory):
    """24 coco256 train images through a list file (keeps the loader tests fast)."""
    root = tmp_path_factory.mktemp("subset")
    files = sorted((coco256 / "images/train2017").glob("*.jpg"))[:24]
    (root / "train.txt").write_text("".join(str(f) + "\n" for f in files))
    (root / "d.yaml").write_text("path: %s\ntrain: %s\nval: images/val2017\nnames: %s\n"
                                 % (coco256, root / "train.txt", [str(i) for i in range(80)]))
    return str(root / "d.yaml")


def test_determinism_across_workers_cache_and_persistence(subset):
    ref = None
    for workers, cache, persistent in ((0, None, True), (1, None, False), (4, "ram", True), (16, None, True),
                                       (4, "ram", False)):
        d = data(subset, imgsz=64, batch_size=5, workers=workers, cache=cache, persistent_workers=persistent,
                 seed=7)
        tl = d.train_loader()
        got = []
        for epoch in (0, 1):
            d.set_epoch(epoch)
            got.append(all_batches(tl))
        if ref is None:
            ref = got
            e0, e1 = got
            assert len(e0) == 5 and [b[0].shape[0] for b in e0] == [5, 5, 5, 5, 4]  # last partial batch kept
            assert sorted(np.concatenate([b[2] for b in e0]).tolist()) == list(range(24))  # a permutation
            assert not np.array_equal(np.concatenate([b[2] for b in e0]), np.concatenate([b[2] for b in e1]))
            assert not np.array_equal(e0[0][0], e1[0][0])
            continue
        for a_epoch, b_epoch in zip(ref, got):
            for a, b in zip(a_epoch, b_epoch):
                for x, y in zip(a, b):
                    np.testing.assert_array_equal(x, y, err_msg="workers=%d cache=%s" % (workers, cache))
    other = data(subset, imgsz=64, batch_size=5, workers=2, seed=8).train_loader()
    assert not np.array_equal(all_batches(other)[0][0], ref[0][0][0])


def test_abandoned_epoch_does_not_leak_into_the_next(subset):
    ref = data(subset, imgsz=64, batch_size=4, workers=0, seed=5)
    ref.set_epoch(1)
    want = all_batches(ref.train_loader())
    d = data(subset, imgsz=64, batch_size=4, workers=4, seed=5)
    tl = d.train_loader()
    for i, _ in enumerate(tl):  # epoch 0, left after two batches while workers are still busy
        if i == 1:
            break
    d.set_epoch(1)
    got = all_batches(tl)
    assert len(got) == len(want)
    for a, b in zip(want, got):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_batches_equal_samples_and_targets_packing(subset):
    d = data(subset, imgsz=64, batch_size=4, workers=3, seed=3)
    tl = d.train_loader()
    b = next(iter(tl))
    for i in range(len(b)):
        img, t, meta = tl.sample(int(b.indices[i]))
        np.testing.assert_array_equal(b.images[i], img)
        np.testing.assert_array_equal(b.targets[b.targets[:, 0] == i][:, 1:], t)
    assert np.all(np.diff(b.targets[:, 0]) >= 0)


def test_close_mosaic_switches_exactly(subset):
    d = data(subset, imgsz=64, batch_size=6, workers=3, epochs=4, close_mosaic=2, seed=1)
    assert [d.mosaic_enabled(e) for e in range(4)] == [True, True, False, False]
    tl = d.train_loader()
    for epoch in (1, 2):
        d.set_epoch(epoch)
        differs = 0
        for b in tl:
            for i, idx in enumerate(b.indices):
                on = tl.sample(int(idx), epoch=epoch, mosaic=True)[0]
                off = tl.sample(int(idx), epoch=epoch, mosaic=False)[0]
                np.testing.assert_array_equal(b.images[i], on if epoch < 2 else off)
                differs += not np.array_equal(on, off)
        assert differs > 0


def test_rect_validation_batches(coco256):
    d = data(str(coco256 / "data.yaml"), imgsz=320, batch_size=16, workers=2)
    vl = d.val_loader()
    shapes = d.shapes("val")
    ar = shapes[:, 0] / shapes[:, 1]
    order = np.argsort(ar, kind="stable")
    bs = d.val_batch_size
    b0 = None
    for k, b in enumerate(vl):
        idx = order[k * bs:(k + 1) * bs]
        np.testing.assert_array_equal(b.indices, idx)
        a = ar[idx]
        shape = [a.max(), 1] if a.max() < 1 else [1, 1 / a.min()] if a.min() > 1 else [1, 1]
        want = (np.ceil(np.array(shape) * 320 / 32 + 0.5).astype(int) * 32).tolist()
        assert list(b.images.shape[1:3]) == want
        if b0 is None:
            b0 = (b.images.copy(), b.targets.copy(), b.indices.copy(), b.meta.copy())
    # targets map back to the label files: x_orig = (cx * W - pad_left) / gain_x / w0
    images, targets, indices, meta = b0
    H, W = images.shape[1:3]
    files = d.files("val")
    checked = 0
    for i, idx in enumerate(indices):
        lab = label_path(files[idx])
        if not os.path.exists(lab):
            continue
        want = np.loadtxt(lab, ndmin=2)
        t = targets[targets[:, 0] == i][:, 1:].astype(np.float64)
        h0, w0, gy, gx, left, top = meta[i]
        back = np.stack([t[:, 0], (t[:, 1] * W - left) / gx / w0, (t[:, 2] * H - top) / gy / h0,
                         t[:, 3] * W / gx / w0, t[:, 4] * H / gy / h0], 1)
        np.testing.assert_allclose(back, want, atol=2e-5)
        checked += 1
    assert checked > 20


# ---- normalisation ----------------------------------------------------------------------------------

def _bf16_round(x32):
    u = x32.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def test_normalize_cpu_all_dtypes():
    src = np.arange(256, dtype=np.uint8).repeat(3).reshape(1, 16, 16, 3)
    x32 = np.arange(256, dtype=np.float32).repeat(3).reshape(src.shape) / np.float32(255)
    want = {"float32": x32, "float16": x32.astype(np.float16).astype(np.float32), "bfloat16": _bf16_round(x32)}
    for dt, w in want.items():
        dst = ptl.empty(src.shape, dt)
        _C.data_normalize(ptl.tensor(src), dst)
        np.testing.assert_array_equal(dst.to(dtype="float32").numpy(), w)
    with pytest.raises(TypeError, match="dst"):
        _C.data_normalize(ptl.tensor(src), ptl.empty(src.shape, "int32"))
    with pytest.raises(ValueError, match="dst"):
        _C.data_normalize(ptl.tensor(src), ptl.empty((3,), "float32"))


def test_batch_upload_cpu(tmp_path):
    y = make_dataset(tmp_path, n=4)
    b = next(iter(data(y, **no_aug()).train_loader()))
    dst = ptl.empty(b.images.shape, "float32")
    b.upload(dst)
    np.testing.assert_array_equal(dst.numpy(), b.images.astype(np.float32) / np.float32(255))


@pytest.mark.cuda
def test_normalize_cuda_matches_cpu():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (3, 37, 53, 3), dtype=np.uint8)
    src.flat[:256] = np.arange(256)  # every value of the kernel's table, in its 16-byte packs and its tail
    for dt in ("float32", "float16", "bfloat16"):
        cpu = ptl.empty(src.shape, dt)
        _C.data_normalize(ptl.tensor(src), cpu)
        gpu = ptl.empty(src.shape, dt, device="cuda")
        _C.data_normalize(ptl.tensor(src, device="cuda"), gpu)
        np.testing.assert_array_equal(gpu.to(device="cpu").to(dtype="float32").numpy(),
                                      cpu.to(dtype="float32").numpy())


@pytest.mark.cuda
def test_batch_upload_cuda_matches_cpu(tmp_path):
    y = make_dataset(tmp_path, n=6)
    d = DetectionData(y, imgsz=64, batch_size=3, workers=2, verbose=False, **no_aug(mosaic=1.0))
    assert d.pin_memory
    staging = ptl.empty((3 * 64 * 64 * 3,), "uint8", device="cuda")
    for b in d.train_loader():
        for dt in ("float32", "bfloat16", "float16"):
            gpu = ptl.empty(b.images.shape, dt, device="cuda")
            b.upload(gpu, staging)
            cpu = ptl.empty(b.images.shape, dt)
            b.upload(cpu)
            np.testing.assert_array_equal(gpu.to(device="cpu").to(dtype="float32").numpy(),
                                          cpu.to(dtype="float32").numpy())


def test_ctrl_c_while_a_worker_is_stuck(tmp_path, coco256):
    import signal
    import threading
    import time

    (tmp_path / "images/train").mkdir(parents=True)
    src = coco256 / "images/train2017/000000000009.jpg"
    for i in range(3):
        shutil.copy(src, tmp_path / "images/train" / ("x%d.jpg" % i))
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: [a]\n")
    d = data(str(tmp_path / "d.yaml"), workers=1, batch_size=3, allow_empty_labels=True, **no_aug())
    tl = d.train_loader()
    fifo = tmp_path / "images/train/x1.jpg"
    fifo.unlink()
    os.mkfifo(str(fifo))  # the worker's open() blocks until someone writes: a batch that never comes
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in tl:
            pass
    assert time.monotonic() - t0 < 5
    timer.join()
    fd = os.open(str(fifo), os.O_WRONLY | os.O_NONBLOCK)  # release the stuck worker (it reads EOF)
    os.close(fd)
    fifo.unlink()
    shutil.copy(src, fifo)
    assert sum(len(b) for b in tl) == 3
