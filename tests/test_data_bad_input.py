"""Bad data never costs a run (issue 18, rules 1-4), on the corpus of tests/bad_data.py: the pixel limit at
scan and at decode (memory bounded), DCT-scaled decoding of large JPEGs, files that fail to decode in a
worker reported once and replaced deterministically (any worker count, any cache), truncated images are
corrupt, missing labels are said."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import bad_data
import ptl
from ptl import _C
from ptl.data import DataWarning, DetectionData

PEAK_KB = textwrap.dedent('''
    # peak resident memory in kB: VmHWM belongs to the address space, so it starts afresh at exec (the
    # ru_maxrss of getrusage carries the forking parent's peak over)
    def peak_kb(field="VmHWM"):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
''')


def data(yaml, **kw):
    kw.setdefault("imgsz", 64)
    kw.setdefault("batch_size", 3)
    kw.setdefault("workers", 1)
    kw.setdefault("pin_memory", False)
    kw.setdefault("verbose", False)
    return DetectionData(str(yaml), **kw)


def epoch(loader):
    """Every batch of one epoch as copies, and the DataWarnings issued meanwhile."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = [(b.images.copy(), b.targets.copy(), b.indices.copy(), b.sources.copy(), b.meta.copy()) for b in loader]
    return out, [str(w.message) for w in rec if issubclass(w.category, DataWarning)]


@pytest.fixture(scope="module")
def jpeg(coco256):
    return (coco256 / "images/train2017/000000000009.jpg").read_bytes()


def good_dataset(root, coco256, n=9):
    """n coco256 train images with their labels (copied, so files can be swapped after the scan)."""
    src = sorted((coco256 / "images/train2017").glob("*.jpg"))[:n]
    for sub in ("images/train", "labels/train"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(src):
        shutil.copy(f, root / "images/train" / ("im%02d.jpg" % i))
        lab = coco256 / "labels/train2017" / (f.stem + ".txt")
        (root / "labels/train" / ("im%02d.txt" % i)).write_text(lab.read_text() if lab.exists() else "")
    (root / "d.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: %s\n"
                                 % [str(i) for i in range(80)])
    return root / "d.yaml"


# ---- rule 1: pixel limit ------------------------------------------------------------------------------------

def test_bombs_and_corrupt_files_skipped_at_scan(tmp_path, jpeg):
    """The scan rejects what a header or an end marker shows (bombs by their declared size, naming
    max_pixels); the rest of the corpus passes it and is left to the decode (rule 2)."""
    corpus = bad_data.write_corpus(str(tmp_path / "images/train"), jpeg)
    (tmp_path / "images/train/good.jpg").write_bytes(jpeg)
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: [a]\n")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        vl = data(tmp_path / "d.yaml").val_loader()
    msgs = [str(w.message) for w in rec if issubclass(w.category, DataWarning)]
    skipped = [c for c in corpus if c not in bad_data.PASS_SCAN]
    for case in skipped:
        assert sum(case in m for m in msgs) == 1, (case, msgs)
    assert any("jpeg_bomb.jpg: JPEG declares 65000x65000" in m and "max_pixels" in m for m in msgs)
    assert any("png_bomb.png: PNG declares 30000x30000" in m for m in msgs)
    kept = sorted(os.path.basename(f) for f in vl.info["files"])
    assert kept == sorted(["good.jpg", *bad_data.PASS_SCAN])
    assert vl.info["skipped"] == len(skipped)


def test_max_pixels_is_configurable(tmp_path, coco256):
    y = good_dataset(tmp_path, coco256, n=3)  # 640 x 480 and similar: ~300 k pixels each
    assert data(y, max_pixels=None).val_loader().info["n"] == 3
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="none of the 3 images is usable"):
            data(y, max_pixels=200_000).val_loader()
    assert sum("over the limit of 200000 (max_pixels)" in str(w.message) for w in rec) == 3
    with pytest.raises(ValueError, match="max_pixels"):
        data(y, max_pixels=0)
    assert ptl.DetectionData.__init__.__kwdefaults__["max_pixels"] == _C.DATA_MAX_PIXELS == 89478485


MEMORY_CHILD = PEAK_KB + textwrap.dedent("""
    import json, os, sys, warnings
    from ptl.data import DetectionData
    warnings.simplefilter("ignore")
    root = sys.argv[1]
    base = peak_kb("VmRSS")
    d = DetectionData(os.path.join(root, "d.yaml"), imgsz=64, batch_size=4, workers=2, verbose=False,
                      pin_memory=False)
    tl = d.train_loader()
    # after the scan, the bombs take the place of good files: only the decode's own check stands in the way
    os.replace(os.path.join(root, "bombs", "jpeg_bomb.jpg"), os.path.join(root, "images/train/im01.jpg"))
    os.replace(os.path.join(root, "bombs", "png_bomb.png"), os.path.join(root, "images/train/im02.jpg"))
    n = sum(len(b) for b in tl)
    print(json.dumps({"n": n, "failed": tl.failed_files, "rss_kb": peak_kb() - base}))
""")


def test_bombs_swapped_in_after_the_scan_keep_memory_bounded(tmp_path, coco256, jpeg):
    """A 65000 x 65000 JPEG and a 30000 x 30000 PNG (12.7 GB and 2.7 GB decoded) replacing files after the
    scan: the decode rejects their declared size before allocating, the epoch finishes, and the process grows
    by less than 150 MB (peak resident memory)."""
    good_dataset(tmp_path, coco256, n=8)
    bombs = tmp_path / "bombs"
    bombs.mkdir()
    (bombs / "jpeg_bomb.jpg").write_bytes(bad_data.jpeg_header_bomb(jpeg))
    (bombs / "png_bomb.png").write_bytes(bad_data.png_header_bomb())
    r = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(tmp_path)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] == 8 and out["failed"] == 2
    assert out["rss_kb"] < 150 * 1024, out


DECODE_CHILD = PEAK_KB + textwrap.dedent("""
    import json, sys
    from ptl import _C
    base = peak_kb("VmRSS")
    try:
        _C.data_t_decode(sys.argv[1], 64, 64, int(sys.argv[2]), 0)
        error = None
    except OSError as e:
        error = str(e)
    print(json.dumps({"error": error, "rss_kb": peak_kb() - base}))
""")


def test_pixel_limit_bounds_decode_memory(tmp_path):
    """A real 4000 x 4000 PNG (50 kB of zeros, 48 MB decoded) under max_pixels = 1 M: refused before any
    pixel buffer exists (the process grows by < 16 MB), while without the limit the decode's 48 MB show."""
    path = tmp_path / "big.png"
    path.write_bytes(bad_data.png_bytes(np.zeros((4000, 4000, 3), np.uint8)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))

    def child(limit):
        r = subprocess.run([sys.executable, "-c", DECODE_CHILD, str(path), str(limit)], capture_output=True,
                           text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    limited, free = child(1_000_000), child(1 << 62)
    assert "16000000 pixels, over the limit of 1000000" in limited["error"] and limited["rss_kb"] < 16 * 1024
    assert free["error"] is None and free["rss_kb"] > 40 * 1024


def test_large_jpeg_decoded_at_a_dct_scale(tmp_path, coco256):
    """A 4000 x 3000 JPEG over jpeg_scale_pixels decodes at the smallest scale n/8 covering its load size
    (the decoder allocates 500 x 375, not 4000 x 3000, for imgsz 64); the loader's bytes are the same with and
    without the RAM or disk cache and for any worker count; 0 turns it off."""
    from PIL import Image
    Image.open(coco256 / "images/train2017/000000000009.jpg").resize((4000, 3000)).save(str(tmp_path / "big.jpg"),
                                                                                        quality=90)
    big = str(tmp_path / "big.jpg")
    img, w0, h0 = _C.data_t_decode(big, 64, 48, _C.DATA_MAX_PIXELS, 1000)
    assert (w0, h0) == (4000, 3000) and img.shape == (375, 500, 3)  # 1/8 covers 64 x 48
    assert _C.data_t_decode(big, 640, 480, _C.DATA_MAX_PIXELS, 1000)[0].shape == (750, 1000, 3)  # 2/8
    assert _C.data_t_decode(big, 64, 48, _C.DATA_MAX_PIXELS, 0)[0].shape == (3000, 4000, 3)
    full = _C.data_t_decode(big, 0, 0, _C.DATA_MAX_PIXELS, 0)[0].astype(np.float64)
    # the scaled decode is the same picture: block means of the full decode within a few levels
    means = full.reshape(375, 8, 500, 8, 3).mean(axis=(1, 3))
    assert np.abs(means - img).mean() < 2.0
    root = tmp_path / "ds"
    (root / "images/train").mkdir(parents=True)
    for i in range(3):
        shutil.copy(big, root / "images/train" / ("b%d.jpg" % i))
    (root / "d.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames: [a]\n")
    ref = None
    for workers, cache in ((0, None), (2, "ram"), (1, "disk"), (2, "disk")):
        d = data(root / "d.yaml", workers=workers, cache=cache, jpeg_scale_pixels=1000, allow_empty_labels=True,
                 cache_dir=str(tmp_path / "cache"))
        got = [epoch(d.train_loader())[0], epoch(d.val_loader())[0]]
        if ref is None:
            ref = got
            continue
        for a, b in zip(ref, got):
            for x, y in zip(a, b):
                for u, v in zip(x, y):
                    np.testing.assert_array_equal(u, v, err_msg="workers=%d cache=%s" % (workers, cache))
    unscaled = epoch(data(root / "d.yaml", jpeg_scale_pixels=0).val_loader())[0]
    assert not np.array_equal(unscaled[0][0], ref[1][0][0])  # the scaled decode is used, not just allowed
    assert np.abs(unscaled[0][0].astype(int) - ref[1][0][0]).mean() < 3


# ---- rules 2 and 3: a file that fails to decode never ends a fit --------------------------------------------

SWAPS = {2: "jpeg_corrupt_body.jpg", 3: "png_short_data.png", 5: "jpeg_truncated_eoi.jpg", 7: "png_truncated.png",
         8: "png_bad_crc.png"}
REPLACED_BY = {2: 4, 3: 4, 5: 6, 7: 9, 8: 9}  # the next index whose file decodes


def swap_in_bad_files(root, jpeg, swaps=SWAPS):
    """Good files become files that the scan passes and only a decode rejects."""
    cases = bad_data.image_cases(jpeg)
    for i, case in swaps.items():
        (root / "images/train" / ("im%02d.jpg" % i)).write_bytes(cases[case])


def test_decode_failures_replaced_identically_for_any_workers_and_cache(tmp_path, coco256, jpeg):
    """Files that fail in a worker or in the cache fill (corrupt JPEG body, truncated JPEG with an end marker,
    truncated PNG, short PNG data, bad PNG checksum) never end an epoch: each is reported once (file and
    reason) and replaced by the next image in dataset order that decodes, the same for every worker count
    and cache (none, RAM, disk), in training (mosaic partners too) and validation, every epoch."""
    y = good_dataset(tmp_path, coco256, n=10)
    swap_in_bad_files(tmp_path, jpeg)
    ref = None
    for workers, cache in ((0, None), (1, None), (3, None), (3, "ram"), (2, "ram"), (2, "disk")):
        d = data(y, workers=workers, cache=cache, batch_size=4, seed=3, mosaic=1.0, rect_val=False,
                 cache_dir=str(tmp_path / "cache"))
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            tl, vl = d.train_loader(), d.val_loader()
        msgs = [str(w.message) for w in rec if issubclass(w.category, DataWarning)]
        runs = []
        for e in (0, 1):
            d.set_epoch(e)
            for loader in (tl, vl):
                b, m = epoch(loader)
                runs.append(b)
                msgs += m
        # each bad file reported once per loader (train and val each meet it), over both epochs
        for i, case in SWAPS.items():
            hits = [m for m in msgs if "im%02d.jpg" % i in m]
            assert len(hits) == 2, (workers, cache, i, msgs)
            assert all("replaced by the next image" in m for m in hits)
        assert all("premature end of data segment" in m for m in msgs if "im05.jpg" in m)  # rule 3
        assert tl.failed_files == vl.failed_files == 5 and tl.skipped_files == 5
        for b in runs[1]:  # validation: the sources say which file each image shows
            for idx, src in zip(b[2], b[3]):
                assert src == REPLACED_BY.get(int(idx), int(idx))
        if ref is None:
            ref = runs
            continue
        for a_run, b_run in zip(ref, runs):
            assert len(a_run) == len(b_run)
            for a, b in zip(a_run, b_run):
                for x, z in zip(a, b):
                    np.testing.assert_array_equal(x, z, err_msg="workers=%d cache=%s" % (workers, cache))
    # validation: a replaced image is the replacement's own sample (letterbox only), with its labels
    val0 = ref[1]
    images = np.concatenate([b[0] for b in val0])
    order = np.concatenate([b[2] for b in val0]).tolist()
    np.testing.assert_array_equal(images[order.index(2)], images[order.index(4)])
    train_sources = np.concatenate([b[3] for b in ref[0]])
    assert not set(SWAPS) & set(train_sources.tolist())  # no bad file is ever trained on


def test_bomb_swapped_in_after_the_scan_is_replaced(tmp_path, coco256, jpeg):
    """The pixel limit checked again at decode: a PNG header bomb in place of a scanned file."""
    y = good_dataset(tmp_path, coco256, n=4)
    vl = data(y).val_loader()
    (tmp_path / "images/train/im01.jpg").write_bytes(bad_data.png_header_bomb())
    batches, msgs = epoch(vl)
    assert sum(len(b[0]) for b in batches) == 4 and vl.failed_files == 1
    assert len(msgs) == 1 and "im01.jpg" in msgs[0] and "30000x30000" in msgs[0] and "max_pixels" in msgs[0]


def test_fit_finishes_past_files_that_fail_to_decode(tmp_path, coco256, jpeg):
    y = good_dataset(tmp_path, coco256, n=8)
    d = data(y, batch_size=4, workers=2, imgsz=64)
    d.train_loader()
    d.val_loader()
    swap_in_bad_files(tmp_path, jpeg, {2: "jpeg_corrupt_body.jpg", 3: "png_bomb.png", 5: "png_truncated.png"})
    tr = ptl.Trainer(max_epochs=1, accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False,
                     logger=False, default_root_dir=str(tmp_path / "runs"), limit_val_batches=0)
    with pytest.warns(DataWarning, match=r"im02\.jpg: its size changed since the dataset scan.*replaced"):
        tr.fit(ptl.Detector("yolo26n", num_classes=80), d)
    assert tr.current_epoch_completed == 1 and np.isfinite(tr.loss_history).all()
    assert d.train_loader().skipped_files == 3  # 2, 3, 5 (8 is past the 8 images of this dataset)


def test_every_file_failing_is_an_error_not_a_hang(tmp_path, coco256, jpeg):
    y = good_dataset(tmp_path, coco256, n=3)
    vl = data(y).val_loader()
    for f in (tmp_path / "images/train").glob("*.jpg"):
        f.write_bytes(bad_data.truncated_jpeg(jpeg, end_marker=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(OSError, match="none of the 3 images of the dataset decodes"):
            for _ in vl:
                pass


def test_prediction_leaves_out_a_file_that_fails_to_decode(tmp_path, coco256, jpeg):
    files = sorted((coco256 / "images/val2017").glob("*.jpg"))[:2]
    bad = tmp_path / "late.jpg"
    bad.write_bytes(bad_data.truncated_jpeg(jpeg, end_marker=True))  # passes the scan
    tr = ptl.Trainer(accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False, logger=False)
    with pytest.warns(DataWarning, match="late.jpg: corrupt JPEG"):
        res = tr.predict(ptl.Detector("yolo26n"), [str(files[0]), str(bad), str(files[1])], conf=0.0, imgsz=64)
    assert res[1] is None and res[0] is not None and res[2] is not None


# ---- rule 4: missing labels are said --------------------------------------------------------------------------

def test_missing_and_empty_labels(tmp_path, jpeg):
    ys = bad_data.label_cases(str(tmp_path), jpeg)
    for case, y in ys.items():
        with pytest.raises(ValueError, match=r"no labels found, 3 images: 0 with labels, %d empty, %d without a label "
                                             r"file.*allow_empty_labels=True" % ((3, 0) if case == "empty" else (0, 3))):
            data(y).train_loader()
        with pytest.warns(DataWarning, match="train .*: no labels found"):
            tl = data(y, allow_empty_labels=True).train_loader()
        assert tl.info["labeled"] == 0 and sum(len(b) for b in tl) == 3
        with pytest.warns(DataWarning, match="val .*: no labels found"):
            data(y).val_loader()  # validation is not refused, only said
    with pytest.raises(ValueError, match=r"labels are looked for as .*nolabels/labels/train/im0\.txt"):
        data(ys["nolabels"]).train_loader()


def test_label_counts(tmp_path, coco256, capsys):
    y = good_dataset(tmp_path, coco256, n=5)
    (tmp_path / "labels/train/im01.txt").unlink()
    (tmp_path / "labels/train/im02.txt").write_text("")
    d = data(y, verbose=True)
    info = d.train_loader().info
    assert (info["n"], info["labeled"], info["empty"], info["missing_labels"]) == (5, 3, 1, 1)
    assert "5 images: 3 with labels, 1 empty, 1 without a label file" in capsys.readouterr().err
