"""Weights in and out: Ultralytics .pt checkpoints read without torch (ptl.ultralytics_pt), the
name-and-shape transfer to another class count, and what fit leaves behind (EMA weights, weights-only
files). The committed fixtures in tests/data come from tests/data/make_pt_fixture.py (torch + Ultralytics);
the ``ultralytics`` tests build real checkpoints with the installed package."""
import hashlib
import io
import json
import os
import pathlib
import pickle
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import ptl
from ptl import ultralytics_pt as upt
from ptl.ultralytics_pt import CheckpointError

REPO = pathlib.Path(__file__).resolve().parent.parent
DATA = pathlib.Path(__file__).resolve().parent / "data"
PT = DATA / "yolo26n_3cls_fp16.pt"


def fresh_python(code, **env):
    """Runs `code` in a new interpreter (ptl importable); returns its stdout parsed as JSON."""
    e = dict(os.environ, PYTHONPATH=str(REPO), **env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=900)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def sha(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def rewritten(src, dst, replace):
    """A copy of the checkpoint `src` whose pickle has each bytes key of `replace` (found exactly once)
    replaced by its value."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/data.pkl"):
                for old, new in replace.items():
                    assert data.count(old) == 1, old
                    data = data.replace(old, new)
            zout.writestr(info, data)
    return dst


def torch_like_zip(path, pickle_bytes, storages=()):
    """A zip laid out as torch.save writes it, around any pickle."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        for key, raw in storages:
            z.writestr("archive/data/%s" % key, raw)
        z.writestr("archive/version", "3\n")
    return path


# ------------------------------------------------------------------------------- the committed fixture

def test_fixture_reads_as_torch_reads_it_without_torch():
    """Names, shapes, dtypes and values of the fp16 fixture equal torch's state_dict of it (digests
    recorded by make_pt_fixture.py), in a process where torch and ultralytics are never imported."""
    want = json.loads((DATA / "yolo26n_3cls_fp16.json").read_text())
    got = fresh_python("""
import hashlib, json, sys
import numpy as np
import ptl
from ptl.ultralytics_pt import load_ultralytics
ck = load_ultralytics(%r)
det = ptl.Detector.load(%r)
sd = det.state_dict()
print(json.dumps({"modules": [m for m in ("torch", "ultralytics") if m in sys.modules], "scale": ck.scale,
                  "num_classes": ck.num_classes, "names": ck.names, "entry": ck.entry,
                  "tensors": [[k, list(v.shape), str(v.dtype), hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()]
                              for k, v in ck.state_dict.items()],
                  "detector": [det.model_name, det.num_classes, det.names],
                  "same": all(np.array_equal(sd[k], ck.state_dict[k]) for k in sd)}))
""" % (str(PT), str(PT)))
    assert got["modules"] == []
    assert (got["scale"], got["num_classes"], got["names"], got["entry"]) == (
        want["scale"], want["num_classes"], want["names"], want["entry"])
    assert got["tensors"] == want["tensors"]
    assert len(want["tensors"]) == 708  # with each BatchNorm's num_batches_tracked, as torch counts them
    assert got["detector"] == ["yolo26n", 3, ["cat", "dog", "traffic light"]] and got["same"]


def test_fixture_raw_outputs_match_ultralytics():
    """Both heads' raw outputs on the recorded image equal Ultralytics' (eval mode) within 1e-5 relative."""
    ref = np.load(DATA / "yolo26n_3cls_fp16_out.npz")
    det = ptl.Detector.load(PT).eval()
    out = det.forward(ref["image"])
    for br in ("one2many", "one2one"):
        for j, part in enumerate(("boxes", "scores")):
            want, got = ref[br + "_" + part], out[br][j]
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (br, part)
            assert np.abs(want).max() > 1e-2 and want.std() > 1e-3  # the outputs carry a signal


def test_storage_dtypes_and_views():
    """fp16, fp32 (transposed, offset views), fp64, bf16 (widened exactly), ints, bool, 0-d, empty, Parameter."""
    got = upt.read_pt(DATA / "tensors.pt")
    want = np.load(DATA / "tensors.npz")
    assert sorted(got) == sorted(want.files)
    for k in want.files:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert np.array_equal(got[k], want[k]), k
    assert got["bf16"].dtype == np.float32 and got["f16"].dtype == np.float16


def test_training_checkpoint_takes_the_ema_entry():
    """A training checkpoint has ``ema`` (and ``model`` None or stale): the EMA is read."""
    tree = upt.read_pt(PT)
    model = tree["model"]
    ck = upt.checkpoint_from_tree("last.pt", dict(tree, ema=model, model=None))
    assert ck.entry == "ema" and ck.num_classes == 3
    other = upt.Instance(upt.Ref("ultralytics.nn.tasks", "DetectionModel"), ())
    with pytest.raises(CheckpointError, match="last.pt"):  # the EMA wins even when 'model' is set
        upt.checkpoint_from_tree("last.pt", dict(tree, ema=other, model=model))
    assert upt.checkpoint_from_tree("best.pt", dict(tree)).entry == "model"


def test_detector_load_and_weights_from_pt(capsys):
    det = ptl.Detector.load(PT)
    ck = upt.load_ultralytics(PT)
    assert det.names == ck.names
    # another class count: every tensor that fits is copied, the class convs keep their initialisation
    five = ptl.Detector("yolo26n", num_classes=5, seed=3, weights=PT)
    init = ptl.Detector("yolo26n", num_classes=5, seed=3).state_dict()
    err = capsys.readouterr().err
    got, src = five.state_dict(), ck.state_dict
    copied = [k for k in got if src[k].shape == got[k].shape]
    kept = [k for k in got if k not in copied]
    nbt = sum(1 for k in src if k.endswith("num_batches_tracked") and k[:-19] + "running_mean" in got)
    total = len(got) + sum(1 for k in got if k.endswith("running_mean"))
    assert "Transferred %d/%d items from %s" % (len(copied) + nbt, total, PT.name) in err
    assert total == 708 and kept and all(k in err for k in kept)
    assert all(np.array_equal(got[k], src[k]) for k in copied)
    assert all(np.array_equal(got[k], init[k]) for k in kept)
    assert {k for k in kept if k.endswith(".2.weight") and "cv3" in k} == {
        "model.23.%scv3.%d.2.weight" % (p, i) for p in ("", "one2one_") for i in range(3)}
    assert five.names == ["0", "1", "2", "3", "4"]  # not the file's: the classes differ


CLS_OUT = ["model.23.%scv3.%d.2.%s" % (p, i, t) for p in ("", "one2one_") for i in range(3) for t in ("weight", "bias")]


def coco_names(coco256):
    import yaml
    names = yaml.safe_load((coco256 / "data.yaml").read_text())["names"]
    return [names[i] for i in range(80)]


def test_cls_width_builds_the_class_branch(tmp_path):
    """cls_width sizes every hidden layer of both heads' class branches (only the final class convs have
    the class count); the default is spec §1.5's and gives the same network as before, bit for bit; the
    width is saved with the weights and read back."""
    default = ptl.Detector("yolo26n", num_classes=3, seed=2)
    assert default.cls_width == 64 == ptl._C.network_info(default._net)["cls_width"]
    assert ptl.Detector("yolo26n", num_classes=80).cls_width == 80
    assert ptl.Detector("yolo26n", num_classes=200).cls_width == 100
    assert ptl.Detector("yolo26s", num_classes=3).cls_width == 128
    same = ptl.Detector("yolo26n", num_classes=3, seed=2, cls_width=64)
    assert np.array_equal(same.flat_parameters.numpy(), default.flat_parameters.numpy())
    wide = ptl.Detector("yolo26n", num_classes=3, seed=2, cls_width=80)
    assert wide.cls_width == 80 and ptl._C.network_info(wide._net)["cls_width"] == 80
    sw, sd = wide.state_dict(), default.state_dict()
    assert sw.keys() == sd.keys()
    changed = {k for k in sw if sw[k].shape != sd[k].shape}
    assert all("cv3." in k and k.startswith("model.23.") for k in changed)
    assert sw["model.23.cv3.0.0.1.conv.weight"].shape == (80, 64, 1, 1)
    assert sw["model.23.one2one_cv3.2.1.0.conv.weight"].shape == (80, 1, 3, 3)
    assert sw["model.23.cv3.1.2.weight"].shape == (3, 80, 1, 1) and sw["model.23.cv3.1.2.bias"].shape == (3,)
    assert all(sw[k].shape == sd[k].shape for k in sw if not k.startswith("model.23.") or "cv2." in k)
    out = wide.eval().forward(np.random.default_rng(0).integers(0, 256, (1, 64, 64, 3), dtype=np.uint8))
    assert out["one2one"][1].shape == (1, 84, 3) and np.isfinite(out["one2one"][1]).all()
    path = tmp_path / "wide.safetensors"
    wide.save(path)
    wf = ptl.weights.read_weights(path)
    assert wf.cls_width == 80
    back = ptl.Detector.load(path)
    assert back.cls_width == 80 and all(np.array_equal(back.state_dict()[k], sw[k]) for k in sw)
    # a weights file without the record (written before it existed) says it through its tensors
    from ptl.io import save_safetensors
    old = tmp_path / "old.safetensors"
    save_safetensors(old, sw, metadata={"model": "yolo26n", "num_classes": "3", "names": '["a", "b", "c"]'})
    assert ptl.weights.read_weights(old).cls_width == 80 and ptl.Detector.load(old).cls_width == 80
    for bad in (0, -3, 2.5, True, "80"):
        with pytest.raises(ValueError, match="cls_width"):
            ptl.Detector("yolo26n", num_classes=3, cls_width=bad)
    with pytest.raises(ValueError, match=r"cls_width must be 0 \(the default width\) or 1\.\.65536 \(got -1\)"):
        ptl._C.network_create("n", 3, cls_width=-1)


def test_transfer_80_to_3_builds_the_source_width_and_remaps_by_name(coco256, tmp_path, capsys):
    """80 -> 3 classes from a ptl file, as Ultralytics 8.4.190 loads it: the new model is built with the
    source's class-branch width (80, not the 64 of 3 classes), so every hidden tensor transfers; the
    final class convs take the source rows of the classes of the same name, or keep their initialisation
    when the target's names are placeholders."""
    names80 = coco_names(coco256)
    src = ptl.Detector("yolo26n", num_classes=80, seed=1, names=names80)
    src.forward(np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8))  # BN stats move
    src_path = tmp_path / "coco80.safetensors"
    src.save(src_path)
    sd80 = src.state_dict()
    bn = sum(1 for k in sd80 if k.endswith("running_mean"))

    plain = ptl.Detector("yolo26n", num_classes=3, seed=7, weights=src_path)  # placeholder names: no remap
    err = capsys.readouterr().err
    init = ptl.Detector("yolo26n", num_classes=3, seed=7, cls_width=80).state_dict()
    got = plain.state_dict()
    assert plain.cls_width == 80 and "class branch built 80 wide, the source's" in err
    copied = [k for k in got if k not in CLS_OUT]
    assert all(got[k].shape == sd80[k].shape and np.array_equal(got[k], sd80[k]) for k in copied)
    assert all(np.array_equal(got[k], init[k]) for k in CLS_OUT)
    assert "Transferred %d/%d items from coco80.safetensors" % (len(copied) + bn, len(got) + bn) in err
    assert (len(copied) + bn, len(got) + bn) == (696, 708)
    assert all(k in err for k in CLS_OUT) and plain.names == ["0", "1", "2"]

    named = ptl.Detector.load(src_path, num_classes=3, names=["person", "car", "dog"], seed=7)
    err = capsys.readouterr().err
    got = named.state_dict()
    assert "Transferred 708/708 items from coco80.safetensors" in err
    assert "3/3 classes found by name" in err and named.names == ["person", "car", "dog"]
    assert all(np.array_equal(got[k], sd80[k]) for k in copied)
    for k in CLS_OUT:  # person, car and dog are COCO classes 0, 2 and 16
        assert np.array_equal(got[k], sd80[k][[0, 2, 16]]), k


def test_remap_by_name_from_the_fixture(capsys):
    """The fixture's classes are cat, dog, traffic light: rows go to the target class of the same name
    (stripped, case-insensitive), the others keep the model's initialisation; placeholder names, no
    match, or the same names in the same order remap nothing (the plain copy does it)."""
    ck = upt.load_ultralytics(PT)
    src = ck.state_dict
    names = ["Traffic Light ", "bird", "CAT"]
    det = ptl.Detector("yolo26n", num_classes=3, seed=5, names=names, weights=PT)
    err = capsys.readouterr().err
    init = ptl.Detector("yolo26n", num_classes=3, seed=5).state_dict()
    got = det.state_dict()
    assert det.cls_width == 64  # 3 classes both: no rebuild
    assert "Transferred 708/708 items from %s" % PT.name in err and "2/3 classes found by name" in err
    assert "the other rows keep the model's initialisation" in err
    for k in CLS_OUT:
        assert np.array_equal(got[k][0], src[k][2].astype(np.float32)), k
        assert np.array_equal(got[k][2], src[k][0].astype(np.float32)), k
        assert np.array_equal(got[k][1], init[k][1]) and not np.array_equal(got[k][1], src[k][1]), k
    assert all(np.array_equal(got[k], src[k]) for k in got if k not in CLS_OUT)
    assert det.names == names  # the target's names stay
    # into 5 classes: the rows' width fits, so the class convs are remapped too (the rest keeps its init)
    five = ptl.Detector.load(PT, num_classes=5, names=["dog", "x", "cat", "y", "z"], seed=3)
    err = capsys.readouterr().err
    init5, got5 = ptl.Detector("yolo26n", num_classes=5, seed=3).state_dict(), five.state_dict()
    assert "Transferred 708/708 items" in err and "2/5 classes found by name" in err
    for k in CLS_OUT:
        assert np.array_equal(got5[k][[0, 2]], src[k][[1, 0]].astype(np.float32))
        assert np.array_equal(got5[k][[1, 3, 4]], init5[k][[1, 3, 4]])
    # nothing to remap: the plain copy (and, for placeholder names, the file's names)
    for target, names_after in ((["cat", "dog", "traffic light"], ["cat", "dog", "traffic light"]),
                                (["a", "b", "c"], ["a", "b", "c"]), (None, ck.names)):
        d = ptl.Detector("yolo26n", num_classes=3, names=target, weights=PT)
        err = capsys.readouterr().err
        assert "Transferred 708/708 items" in err and "found by name" not in err
        sd = d.state_dict()
        assert all(np.array_equal(sd[k], src[k]) for k in sd) and d.names == names_after
    # the source's names say more classes than its rows hold: refused before anything is written
    det = ptl.Detector("yolo26n", num_classes=3, names=["x", "y", "e"])
    before = det.state_dict()
    with pytest.raises(ValueError, match=r"cv3\.0\.2\.(weight|bias) has 3 rows, but the source's class names reach "
                                         r"class 4"):
        det.load_state_dict(src, strict=False, names=["a", "b", "c", "d", "e"])
    assert all(np.array_equal(before[k], v) for k, v in det.state_dict().items())


def test_transfer_from_another_scale(tmp_path, capsys):
    """yolo26s into yolo26n: no width rebuild (the head inputs differ); the first conv takes the source's
    first 16 filters, the class biases (one value per class) are remapped by name, nothing else fits."""
    s = ptl.Detector("yolo26s", num_classes=4, seed=1, names=["dog", "car", "person", "cat"])
    path = tmp_path / "s4.safetensors"
    s.save(path)
    src = s.state_dict()
    det = ptl.Detector("yolo26n", num_classes=3, seed=2, names=["person", "car", "bird"], weights=path)
    err = capsys.readouterr().err
    init, got = ptl.Detector("yolo26n", num_classes=3, seed=2).state_dict(), det.state_dict()
    assert det.cls_width == 64
    w = got["model.0.conv.weight"]
    assert w.shape == (16, 3, 3, 3) and src["model.0.conv.weight"].shape == (32, 3, 3, 3)
    assert np.array_equal(w, src["model.0.conv.weight"][:16])
    biases = [k for k in CLS_OUT if k.endswith("bias")]
    for k in biases:
        assert np.array_equal(got[k][:2], src[k][[2, 1]]) and got[k][2] == init[k][2]
    same = [k for k in got if got[k].shape == src[k].shape and k not in biases]
    assert all(np.array_equal(got[k], src[k]) for k in same)
    assert all(np.array_equal(got[k], init[k]) for k in got if k not in same + biases + ["model.0.conv.weight"])
    bn = sum(1 for k in got if k.endswith("running_mean"))
    assert "Transferred %d/%d items from s4.safetensors" % (len(same) + len(biases) + 1 + bn, len(got) + bn) in err
    assert "model.0.conv.weight: its first 16 filters (3 input channels) come from the source" in err
    assert "class branch built" not in err


def test_existing_model_keeps_its_layout(tmp_path, capsys):
    """load_weights into a built model does not rebuild it: the 64-wide class branch of 3 classes takes
    what fits of an 80-class file (intersect_dicts' count)."""
    src = ptl.Detector("yolo26n", num_classes=80, seed=1)
    path = tmp_path / "coco80.safetensors"
    src.save(path)
    det = ptl.Detector("yolo26n", num_classes=3, seed=7)
    plan = det.load_weights(path)
    assert "Transferred 606/708 items from coco80.safetensors" in capsys.readouterr().err
    assert det.cls_width == 64 and (plan.transferred, plan.total) == (606, 708)


def test_fine_tune_after_transfer_and_reload(coco256, tmp_path, capsys):
    """A short CPU fine-tune after an 80 -> 3 transfer (an 80-wide class branch): it leaves the EMA weights
    in the model and weights-only files and checkpoints that reload with that width; resuming needs a
    model of that width."""
    src = ptl.Detector("yolo26n", num_classes=80, seed=1)
    src_path = tmp_path / "coco80.safetensors"
    src.save(src_path)
    det = ptl.Detector("yolo26n", num_classes=3, seed=7, weights=src_path)
    got = det.state_dict()
    assert det.cls_width == 80
    data = ptl.DetectionData(three_class_data(coco256, tmp_path), imgsz=64, batch_size=4, workers=2, verbose=False)
    tr = ptl.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, accelerator="cpu",
                     default_root_dir=tmp_path, enable_progress_bar=False)
    tr.fit(det, data)
    assert np.isfinite(np.asarray(tr.loss_history)).all()
    assert tr.hparams()["model"]["cls_width"] == 80
    ema = tr._engine.ema_state_dict()
    after = det.state_dict()
    assert all(np.array_equal(after[k], ema[k]) for k in after)  # the model holds the EMA weights
    assert not all(np.array_equal(after[k], got[k]) for k in after)
    assert det.names == ["person", "car", "dog"]
    again = tr.validate(det, data)[0]
    assert again["val/box_loss"] == tr.val_history[-1]["logged"]["val/box_loss"]  # what validation measured
    run = pathlib.Path(tr.log_dir)
    for f in (run / "weights" / "best.safetensors", run / "weights" / "last.safetensors",
              run / "checkpoints" / "last.ckpt"):
        back = ptl.Detector.load(f)
        assert (back.model_name, back.num_classes, back.cls_width, back.names) == (
            "yolo26n", 3, 80, ["person", "car", "dog"]), f
        sb = back.state_dict()
        assert all(np.array_equal(sb[k], after[k]) for k in after), f
    assert (run / "weights" / "last.safetensors").stat().st_size < (run / "checkpoints" / "last.ckpt").stat().st_size / 2
    from ptl.errors import CheckpointError as ResumeError
    more = ptl.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1, accelerator="cpu",
                       default_root_dir=tmp_path, enable_progress_bar=False)
    with pytest.raises(ResumeError, match=r"holds a class branch 80 wide \(from its hparams\), but the model to "
                                              r"fit has 64: build ptl\.Detector\('yolo26n', num_classes=3, "
                                              r"cls_width=80\)"):
        more.fit(ptl.Detector("yolo26n", num_classes=3), data, ckpt_path=run / "checkpoints" / "last.ckpt")
    resumed = ptl.Detector("yolo26n", num_classes=3, cls_width=80)
    with pytest.warns(ptl.errors.ResumeWarning, match="planned for 1 epoch"):
        more.fit(resumed, data, ckpt_path=run / "checkpoints" / "last.ckpt")
    assert more.current_epoch == 2 and np.isfinite(np.asarray(more.loss_history)).all()


def three_class_data(coco256, tmp_path, n_train=16, n_val=8):
    """A 3-class dataset from coco256 (person, car, dog; other objects dropped): image links, new labels."""
    keep = {0: 0, 2: 1, 16: 2}
    root = tmp_path / "three"
    for split, n in (("train2017", n_train), ("val2017", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for img in sorted((coco256 / "images" / split).glob("*.jpg"))[:n]:
            (root / "images" / split / img.name).symlink_to(img)
            lab = coco256 / "labels" / split / (img.stem + ".txt")
            rows = lab.read_text().split("\n") if lab.exists() else []
            out = ["%d %s" % (keep[int(r.split()[0])], " ".join(r.split()[1:])) for r in rows
                   if r.strip() and int(r.split()[0]) in keep]
            (root / "labels" / split / (img.stem + ".txt")).write_text("\n".join(out) + ("\n" if out else ""))
    (root / "data.yaml").write_text("path: .\ntrain: images/train2017\nval: images/val2017\n"
                                    "names:\n  0: person\n  1: car\n  2: dog\n")
    return str(root / "data.yaml")


def test_train_cli_starts_from_a_pt(coco256, tmp_path):
    # 16 training images: the first four hold none of the three classes, and a fit refuses a split without labels
    data = three_class_data(coco256, tmp_path, n_train=16, n_val=2)
    r = subprocess.run([sys.executable, "-m", "ptl.train", "--data", data, "--model", str(PT), "--imgsz", "64",
                        "--batch", "2", "--workers", "1", "--epochs", "1", "--limit-train-batches", "1",
                        "--limit-val-batches", "1", "--device", "cpu", "--project", str(tmp_path),
                        "--progress-bar", "false"], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    last = tmp_path / "runs" / "train" / "version_0" / "weights" / "last.safetensors"
    assert ptl.Detector.load(last).names == ["person", "car", "dog"]


# ------------------------------------------------------------------------------------- bad files

class _RunsCode:
    """Unpickling this (with pickle.load) runs a shell command."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class _Evals:
    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        import builtins
        return builtins.exec, (self.code,)


def test_malicious_pickles_are_refused_and_never_run(tmp_path):
    proof = tmp_path / "proof"
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"model": _RunsCode("touch %s" % proof)}, protocol=2)
    # the payload is real: plain pickle.loads runs it (in a child process)
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                   input=payload, check=True, timeout=60)
    assert proof.exists()
    cases = {
        "system.pt": (pickle.dumps({"model": _RunsCode("touch %s" % marker)}, protocol=2),
                      r"refusing to load: the pickle references posix\.system"),
        "exec.pt": (pickle.dumps({"ema": _Evals("open(%r, 'w').close()" % str(marker))}, protocol=2),
                    r"refusing to load: the pickle references (__builtin__|builtins)\.exec"),
        "proto4.pt": (pickle.dumps([_RunsCode("touch %s" % marker)], protocol=4),
                      r"refusing to load: the pickle references posix\.system"),
        "text.pt": (pickle.dumps({"model": "x"}, protocol=0), r"refusing to load: pickle opcode PUT .* not allowed"),
        "inst.pt": (b"(X\x05\x00\x00\x00touchiposix\nsystem\n.", r"refusing to load: pickle opcode INST"),
        # a reference inside the allowed modules that would run code if called: an inert stand-in here
        "hub.pt": (b"\x80\x02ctorch.hub\nload\nq\x00X\x03\x00\x00\x00abcq\x01\x85q\x02Rq\x03.",
                   r"not an Ultralytics checkpoint"),
        "dunder.pt": (b"\x80\x02cultralytics\n__import__\nq\x00X\x02\x00\x00\x00osq\x01\x85q\x02Rq\x03.",
                      r"refusing to load: the pickle references ultralytics\.__import__"),
    }
    for name, (payload, message) in cases.items():
        path = torch_like_zip(tmp_path / name, payload)
        with pytest.raises(CheckpointError, match=message) as e:
            upt.load_ultralytics(path)
        assert str(path) in str(e.value)
        with pytest.raises(ValueError, match=name):
            ptl.Detector.load(path)
        assert not marker.exists(), name
    got = fresh_python("""
import json, sys
from ptl.ultralytics_pt import CheckpointError, load_ultralytics
try:
    load_ultralytics(%r)
except CheckpointError:
    pass
print(json.dumps([m for m in ("torch", "ultralytics") if m in sys.modules]))
""" % str(tmp_path / "hub.pt"))
    assert got == []  # the stand-in for torch.hub.load imported nothing


def test_truncated_corrupt_and_foreign_files(tmp_path):
    blob = PT.read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(blob[:len(blob) * 6 // 10])
    with pytest.raises(CheckpointError, match=r"cut\.pt: not a PyTorch zip checkpoint \(truncated"):
        upt.load_ultralytics(cut)
    # a storage whose bytes were damaged: the zip's CRC check catches it
    with zipfile.ZipFile(PT) as z:
        info = z.getinfo("yolo26n_3cls_fp16/data/0")
    bad = bytearray(blob)
    h = info.header_offset  # the local header's own name and extra lengths (torch pads storages there)
    at = h + 30 + int.from_bytes(blob[h + 26:h + 28], "little") + int.from_bytes(blob[h + 28:h + 30], "little") + 1000
    bad[at:at + 8] = b"\x00\xff" * 4
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(bytes(bad))
    with pytest.raises(CheckpointError, match=r"damaged\.pt: .*data/0 cannot be read"):
        upt.load_ultralytics(damaged)
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps({"model": None}, protocol=2))
    with pytest.raises(CheckpointError, match=r"legacy\.pt: not a PyTorch zip checkpoint \(a bare pickle"):
        upt.load_ultralytics(legacy)
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match=r"notes\.pt: not a PyTorch zip checkpoint"):
        upt.load_ultralytics(text)
    other = tmp_path / "other.pt"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("readme.txt", "no pickle here")
    with pytest.raises(CheckpointError, match=r"other\.pt: a zip but not a PyTorch checkpoint"):
        upt.load_ultralytics(other)
    # a storage shorter than its tensors say, and a tensor that would read past its storage
    short = tmp_path / "short.pt"
    torch_like_zip(short, pickle_of_tensor(numel=8, size=(8,), stride=(1,)), [("0", b"\x00" * 8)])
    with pytest.raises(CheckpointError, match=r"short\.pt: storage 0 holds 8 bytes"):
        upt.read_pt(short)
    past = tmp_path / "past.pt"
    torch_like_zip(past, pickle_of_tensor(numel=2, size=(4, 4), stride=(4, 1)), [("0", b"\x00" * 8)])
    with pytest.raises(CheckpointError, match=r"past\.pt: a tensor of size \(4, 4\).*reads past its storage"):
        upt.read_pt(past)
    # nothing of a failed load reaches the model
    det = ptl.Detector("yolo26n", num_classes=3)
    before = det.state_dict()
    for f in (cut, damaged, legacy, text, other):
        with pytest.raises(ValueError, match=f.name):
            det.load_weights(f)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        det.load_weights(tmp_path / "missing.pt")
    after = det.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def pickle_of_tensor(numel, size, stride):
    """The pickle torch.save writes for one float32 tensor on storage '0' (hand-assembled)."""
    def tup(vals):
        return b"(" + b"".join(b"J" + int(v).to_bytes(4, "little", signed=True) for v in vals) + b"t"
    return (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
            b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ" + numel.to_bytes(4, "little") + b"tQK\x00"
            + tup(size) + tup(stride) + b"\x89ccollections\nOrderedDict\n)Rt" + b"R.")


def test_unsupported_model_type_and_layout(tmp_path):
    seg = rewritten(PT, tmp_path / "seg.pt", {b"ultralytics.nn.tasks\nDetectionModel\n":
                                             b"ultralytics.nn.tasks\nSegmentationModel\n"})
    with pytest.raises(CheckpointError, match=r"seg\.pt: unsupported model type ultralytics\.nn\.tasks\."
                                              r"SegmentationModel"):
        ptl.Detector.load(seg)
    # a file that says yolo26n / 80 classes but holds the 3-class tensors
    from ptl.io import save_safetensors
    ck = upt.load_ultralytics(PT)
    liar = tmp_path / "liar.safetensors"
    save_safetensors(liar, {k: v for k, v in ck.state_dict.items() if not k.endswith("num_batches_tracked")},
                     metadata={"model": "yolo26n", "num_classes": "80"})
    with pytest.raises(ValueError, match=r"liar\.safetensors: not a ptl weights file of the yolo26n layout: 12 of "
                                         r"another shape \(model\.23\.cv3\.0\.2\."):
        ptl.Detector.load(liar)
    with pytest.raises(ValueError, match=r"tensors\.pt: not an Ultralytics checkpoint"):
        ptl.Detector.load(DATA / "tensors.pt")


def test_interpreter_builds_plain_data():
    """Containers, memo, numbers, bytes, sets and frozensets of protocols 2 and 4; objects as stand-ins."""
    obj = {"a": [1, 2.5, -3, 2 ** 70, True, None, "x", b"\x00\x01"], "t": (1, (2, 3)), "s": {4, 5},
           "f": frozenset({6})}
    obj["again"] = obj["a"]
    for proto in (2, 4):
        tree = upt._interpret("mem", pickle.dumps(obj, protocol=proto), None)
        assert {k: v for k, v in tree.items() if k != "again"} == {k: v for k, v in obj.items() if k != "again"}
        assert tree["again"] is tree["a"]
    # NEWOBJ + BUILD of a module class, as torch.save writes an nn.Module: an inert Instance with its state
    data = (b"\x80\x02cultralytics.nn.modules.conv\nConv\n)\x81}(X\x01\x00\x00\x00kK\x03X\x01\x00\x00\x00sK\x02ub.")
    inst = upt._interpret("mem", data, None)
    assert isinstance(inst, upt.Instance) and inst.cls.qualname == "ultralytics.nn.modules.conv.Conv"
    assert inst.state == {"k": 3, "s": 2} and inst.args == ()


# ----------------------------------------------------------------------- real Ultralytics checkpoints

MAKE_CHECKPOINTS = r"""
import hashlib, json, os, sys
from copy import deepcopy
import numpy as np, torch
from PIL import Image
from ultralytics import YOLO
from ultralytics.nn.tasks import DetectionModel
from ultralytics.utils.torch_utils import intersect_dicts
import yaml
out, names_yaml, images = sys.argv[1], sys.argv[2], sys.argv[3:]
coco = yaml.safe_load(open(names_yaml))["names"]  # the 80 COCO names, as released checkpoints carry them
g = torch.Generator().manual_seed(0)
x = torch.from_numpy(np.stack([np.asarray(Image.open(f).convert("RGB").resize((640, 640))) for f in images]))
x = x.permute(0, 3, 1, 2).float() / 255
meta = {}
for scale in "ns":
    yolo = YOLO("yolo26%s.yaml" % scale)
    with torch.no_grad():  # BatchNorm away from its init and a variance-keeping gain, so outputs carry the image
        for name, t in yolo.model.state_dict().items():
            if name.endswith("bn.weight") or name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith("bn.bias") or name.endswith("running_mean"):
                t.copy_(torch.rand(t.shape, generator=g) * 0.6 - 0.3)
            elif name.endswith("conv.weight"):
                t.mul_(2.0)
    yolo.model.names = dict(coco)
    yolo.save(os.path.join(out, "%s.pt" % scale))  # released-weights form: fp16 'model', 'ema' None
    ema = deepcopy(yolo.model).half()
    opt = torch.optim.SGD(yolo.model.parameters(), lr=0.01, momentum=0.9)
    yolo.model.train()
    sum(v.float().sum() for v in yolo.model(x[:1])["one2many"].values() if torch.is_tensor(v)).backward()
    opt.step()
    torch.save({"epoch": 0, "best_fitness": None, "model": None, "ema": ema, "updates": 1,
                "optimizer": opt.state_dict(), "train_args": {"model": "yolo26%s.yaml" % scale, "imgsz": 640},
                "train_metrics": {"fitness": 0.0}, "date": "today", "version": "8.4.190"},
               os.path.join(out, "%s_train.pt" % scale))  # trainer form: fp16 'ema', 'model' None
    model = torch.load(os.path.join(out, "%s.pt" % scale), weights_only=False)["model"].float().eval()
    sd = model.state_dict()
    with torch.no_grad():
        preds = model(x)[1]
    np.savez(os.path.join(out, "%s_out.npz" % scale), **{
        "%s_%s" % (br, part): preds[br][part].permute(0, 2, 1).contiguous().numpy()
        for br in ("one2many", "one2one") for part in ("boxes", "scores")})
    three = DetectionModel("yolo26%s.yaml" % scale, nc=3, verbose=False)
    meta[scale] = {"tensors": [[k, list(v.shape), str(v.dtype).replace("torch.", ""),
                                hashlib.sha256(np.ascontiguousarray(v.numpy()).tobytes()).hexdigest()]
                               for k, v in sd.items()],
                   "intersect_3": len(intersect_dicts(sd, three.state_dict())), "total_3": len(three.state_dict())}
YOLO("yolo26n-cls.yaml").save(os.path.join(out, "cls.pt"))
YOLO("yolo11n.yaml").save(os.path.join(out, "yolo11n.pt"))
json.dump(meta, open(os.path.join(out, "meta.json"), "w"))
"""

READ_CHECKPOINTS = r"""
import hashlib, json, os, sys
import numpy as np
from PIL import Image
import ptl
from ptl.ultralytics_pt import load_ultralytics
out, images = sys.argv[1], sys.argv[2:]
x = np.stack([np.asarray(Image.open(f).convert("RGB").resize((640, 640))) for f in images])
res = {}
for scale in "ns":
    r = res[scale] = {}
    for form in ("", "_train"):
        ck = load_ultralytics(os.path.join(out, "%s%s.pt" % (scale, form)))
        r["entry" + form] = ck.entry
        r["tensors" + form] = [[k, list(v.shape), str(v.dtype),
                                hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()]
                               for k, v in ck.state_dict.items()]
    det = ptl.Detector.load(os.path.join(out, "%s.pt" % scale)).eval()
    ref = np.load(os.path.join(out, "%s_out.npz" % scale))
    o = det.forward(x)
    r["rel"] = {"%s_%s" % (br, p): float(np.abs(o[br][j] - ref["%s_%s" % (br, p)]).max()
                                         / np.abs(ref["%s_%s" % (br, p)]).max())
                for br in ("one2many", "one2one") for j, p in enumerate(("boxes", "scores"))}
    r["image_signal"] = float(np.abs(ref["one2one_scores"][0] - ref["one2one_scores"][1]).max())
    plan = ptl.Detector("yolo26" + scale, num_classes=3).load_weights(os.path.join(out, "%s.pt" % scale),
                                                                       verbose=False)
    r["transfer"] = [plan.transferred, plan.total]
errors = {}
for name in ("cls.pt", "yolo11n.pt"):
    try:
        ptl.Detector.load(os.path.join(out, name))
    except ValueError as e:
        errors[name] = str(e)
res["errors"] = errors
res["modules"] = [m for m in ("torch", "ultralytics") if m in sys.modules]
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def ultralytics_made(tmp_path_factory, coco256):
    """A folder with Ultralytics' own checkpoints (MAKE_CHECKPOINTS), and the two images used."""
    out = tmp_path_factory.mktemp("ultralytics")
    images = [str(p) for p in sorted((coco256 / "images" / "val2017").glob("*.jpg"))[:2]]
    r = subprocess.run([sys.executable, "-c", MAKE_CHECKPOINTS, str(out), str(coco256 / "data.yaml"), *images],
                       capture_output=True, text=True, timeout=900, env=dict(os.environ, YOLO_OFFLINE="1"))
    assert r.returncode == 0, r.stderr
    return out, images


@pytest.fixture(scope="module")
def ultralytics_checkpoints(ultralytics_made):
    out, images = ultralytics_made
    r = subprocess.run([sys.executable, "-c", READ_CHECKPOINTS, str(out), *images], capture_output=True, text=True,
                       timeout=900, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    return json.loads((out / "meta.json").read_text()), json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.ultralytics
@pytest.mark.parametrize("scale", ["n", "s"])
def test_real_checkpoints_read_without_torch(ultralytics_checkpoints, scale):
    made, read = ultralytics_checkpoints
    r = read[scale]
    assert read["modules"] == []  # the reading process never imported torch or ultralytics
    assert r["entry"] == "model" and r["entry_train"] == "ema"
    assert r["tensors"] == made[scale]["tensors"]  # names, shapes, dtypes and values of Ultralytics' state_dict
    assert r["tensors_train"] == made[scale]["tensors"]  # the trainer form's EMA: the same model
    assert all(v <= 1e-5 for v in r["rel"].values()), r["rel"]
    assert r["image_signal"] > 1e-3  # the two images give different outputs
    # 80 -> 3 classes into a model already built (load_weights keeps its layout): intersect_dicts' count
    assert r["transfer"] == [made[scale]["intersect_3"], made[scale]["total_3"]]


@pytest.mark.ultralytics
def test_real_checkpoints_of_other_models_are_refused(ultralytics_checkpoints):
    errors = ultralytics_checkpoints[1]["errors"]
    assert "unsupported model type ultralytics.nn.tasks.ClassificationModel" in errors["cls.pt"]
    assert "yolo11n.pt: not an Ultralytics YOLO26 detection model of the yolo26n layout" in errors["yolo11n.pt"]
    assert re.search(r"\d+ tensors missing \(model\.", errors["yolo11n.pt"])  # what does not fit is named


# Ultralytics 8.4.190 loads each checkpoint into a new model as its trainer does (DetectionTrainer.get_model: the
# data's names set before load), and records the 'Transferred a/b' line, the state dict and the names after.
TRANSFER_ULTRALYTICS = r"""
import json, logging, os, re, sys
import numpy as np, torch
from ultralytics.nn.tasks import DetectionModel
from ultralytics.utils import LOGGER
out, cases = sys.argv[1], json.loads(sys.argv[2])
lines = []
class Lines(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
LOGGER.addHandler(Lines())
res = {}
for case, (src, dst, names) in cases.items():
    ckpt = torch.load(os.path.join(out, "%s.pt" % src), map_location="cpu", weights_only=False)
    model = DetectionModel("yolo26%s.yaml" % dst, nc=len(names), verbose=False)
    model.names = dict(enumerate(names))
    del lines[:]
    model.load(ckpt)
    a, b = map(int, re.search(r"Transferred (\d+)/(\d+) items", [l for l in lines if "Transferred" in l][-1]).groups())
    np.savez(os.path.join(out, "loaded_%s.npz" % case), **{k: v.detach().float().numpy()
                                                          for k, v in model.state_dict().items()
                                                          if not k.endswith("num_batches_tracked")})
    res[case] = {"transferred": [a, b], "names": [model.names[i] for i in range(len(names))], "log": lines[:]}
print(json.dumps(res))
"""


def transfer_cases(coco256):
    coco = coco_names(coco256)
    perm = np.random.default_rng(0).permutation(80)
    return {"named": ("n", "n", ["person", "car", "dog"]),
            "placeholders": ("n", "n", ["0", "1", "2"]),
            "partly_named": ("n", "n", [" Dog", "widget", "PERSON"]),
            "reordered": ("n", "n", [coco[int(i)] for i in perm]),
            "s_into_n": ("s", "n", ["person", "car", "dog"])}


@pytest.fixture(scope="module")
def ultralytics_transfers(ultralytics_made, coco256):
    out, _ = ultralytics_made
    cases = transfer_cases(coco256)
    r = subprocess.run([sys.executable, "-c", TRANSFER_ULTRALYTICS, str(out), json.dumps(cases)], capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, YOLO_OFFLINE="1"))
    assert r.returncode == 0, r.stderr
    return out, cases, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.ultralytics
@pytest.mark.parametrize("case", ["named", "placeholders", "partly_named", "reordered", "s_into_n"])
def test_transfer_equals_ultralytics(ultralytics_transfers, case, capsys):
    """ptl's transfer of a real 80-class COCO checkpoint gives what Ultralytics 8.4.190's DetectionModel.load
    gives: the 'Transferred a/b items' numbers, the layout (the class branch rebuilt at the source's width
    for the same scale), every tensor or part of one that came from the source equal, and the rest at
    each side's own initialisation (ptl's draws differ from torch's, so only their names are compared)."""
    out, cases, ult = ultralytics_transfers
    src_scale, dst_scale, names = cases[case]
    want = ult[case]
    path = out / ("%s.pt" % src_scale)
    if case in ("reordered", "s_into_n"):  # Detector.load: the same model (a strict load) and another scale
        det = ptl.Detector.load(path, model="yolo26" + dst_scale, num_classes=len(names), names=names, seed=4)
    else:
        det = ptl.Detector("yolo26" + dst_scale, num_classes=len(names), names=names, seed=4, weights=path)
    err = capsys.readouterr().err
    plan = ptl.Detector("yolo26" + dst_scale, num_classes=len(names), names=names, seed=4,
                        cls_width=det.cls_width).load_weights(path, strict=False, verbose=False)
    assert [plan.transferred, plan.total] == want["transferred"], want["log"]
    if case != "reordered":
        assert "Transferred %d/%d items from %s.pt" % (*want["transferred"], src_scale) in err
    assert det.names == want["names"]
    loaded = dict(np.load(out / ("loaded_%s.npz" % case)))
    got = det.state_dict()
    assert list(got) == list(loaded) and all(got[k].shape == loaded[k].shape for k in got)  # the same layout
    init = ptl.Detector("yolo26" + dst_scale, num_classes=len(names), seed=4, cls_width=det.cls_width).state_dict()
    for k in plan.arrays:  # copied whole
        assert np.array_equal(got[k], loaded[k]), k
    for k, (part, _) in plan.parts.items():  # class rows remapped by name, the first conv's leading filters
        assert np.array_equal(got[k][part], loaded[k][part]), k
        rest = np.ones(got[k].shape, bool)
        rest[part] = False
        assert np.array_equal(got[k][rest], init[k][rest]), k
        if rest.any():  # rows no name matched: each side's own initialisation (random weights, the bias prior)
            assert np.array_equal(got[k][rest], loaded[k][rest]) == k.endswith(".bias"), k
    untransferred = [k for k in got if k not in plan.arrays and k not in plan.parts]
    assert all(np.array_equal(got[k], init[k]) for k in untransferred)
    # Ultralytics left the same tensors at its initialisation: its values differ from ptl's where ptl's are random
    # draws, and equal where both initialise alike (the class-bias prior, BatchNorm's ones and zeros)
    differ = {k for k in got if not np.array_equal(got[k], loaded[k])}
    assert differ <= set(untransferred) | set(plan.parts)
    drawn = {k for k in untransferred if k.endswith("conv.weight") or k.endswith(".2.weight")}
    assert drawn <= differ
    prior = [k for k in untransferred if re.fullmatch(r"model\.23\.(one2one_)?cv3\.\d\.2\.bias", k)]
    assert all(np.array_equal(got[k], loaded[k]) for k in prior)
    if case in ("named", "reordered"):
        assert not untransferred and not differ and plan.transferred == plan.total
    if case == "placeholders":
        assert sorted(untransferred) == sorted(CLS_OUT) and want["transferred"] == [696, 708]
    if src_scale == dst_scale:
        assert det.cls_width == 80  # the source's width: 8.4.190 rebuilds the branch of a model with < 80 classes
    else:
        assert det.cls_width == 64 and "model.0.conv.weight" in plan.parts
