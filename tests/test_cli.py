"""``python -m ptl.train``: every user error is one line on stderr and exit status 2, also those found
once the fit has begun (issue 18.9); internal errors keep their traceback."""
import json
import os
import subprocess
import sys

import pytest

import ptl
from ptl import train

from ckpt_corpus import drop_tensor, patch_trainer


def run_main(argv, capsys):
    """(exit status, stderr lines, stdout) of train.main(argv) in this process."""
    try:
        rc = train.main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, err.splitlines(), out


@pytest.fixture(scope="module")
def files(coco256, tmp_path_factory):
    """A good checkpoint (64 px, batch 4, 1 of 3 epochs done) and bad inputs made from it."""
    root = tmp_path_factory.mktemp("cli")
    base = ["--data", coco256 / "data.yaml", "--imgsz", "64", "--batch", "4", "--workers", "2", "--device", "cpu",
            "--limit-train-batches", "1", "--limit-val-batches", "1", "--progress-bar", "false", "--project", root]
    rc = train.main([str(a) for a in base + ["--epochs", "1"]])
    assert rc == 0
    good = root / "runs" / "train" / "version_0" / "checkpoints" / "last.ckpt"
    raw = good.read_bytes()
    f = {"root": root, "good": good}
    f["unfinished"] = root / "unfinished.ckpt"
    f["unfinished"].write_bytes(patch_trainer(raw, lambda s: s.update(max_epochs=3)))
    f["truncated"] = root / "truncated.ckpt"
    f["truncated"].write_bytes(raw[:-100])
    f["nograds"] = root / "nograds.ckpt"
    f["nograds"].write_bytes(drop_tensor(patch_trainer(raw, lambda s: s.update(max_epochs=3)), "trainer.grads"))
    f["model3"] = root / "three.safetensors"
    ptl.Detector("yolo26n", num_classes=3).save(f["model3"])
    f["badmodel"] = root / "bad.safetensors"
    f["badmodel"].write_bytes(f["model3"].read_bytes()[:-10])
    f["foreign"] = root / "foreign.safetensors"
    ptl.save_safetensors(f["foreign"], {"w": ptl.tensor([1.0, 2.0])})
    yamls = {
        "syntax": "path: %s\ntrain: images/train2017\nval: images/val2017\nnames: [a, b\n  c: d\n" % coco256,
        "list": "- a\n- b\n",
        "nonames": "path: %s\ntrain: images/train2017\nval: images/val2017\n" % coco256,
        "notrain": "path: %s\ntrain: images/nothing_here\nval: images/val2017\nnames: [a]\n" % coco256,
        "nc": "path: %s\ntrain: images/train2017\nval: images/val2017\nnc: 3\nnames: [a, b]\n" % coco256,
    }
    for k, text in yamls.items():
        f["yaml_" + k] = root / (k + ".yaml")
        f["yaml_" + k].write_text(text)
    f["afile"] = root / "a_file"
    f["afile"].write_text("x")
    f["base"] = base
    return f


# (name, extra arguments, words the one stderr line must hold); base arguments come first, later flags win
CASES = [
    ("epochs not an int", ["--epochs", "two"], "--epochs"),
    ("unknown flag", ["--frobnicate"], "unrecognized"),
    ("precision choice", ["--precision", "8-true"], "--precision"),
    ("cache choice", ["--cache", "disk"], "--cache"),
    ("bool flag", ["--deterministic", "maybe"], "--deterministic"),
    ("limit not a number", ["--limit-train-batches", "all"], "--limit-train-batches"),
    ("epochs 0", ["--epochs", "0"], "max_epochs"),
    ("epochs negative", ["--epochs", "-3"], "max_epochs"),
    ("batch 0", ["--batch", "0"], "batch_size"),
    ("workers negative", ["--workers", "-1"], "workers"),
    ("imgsz not /32", ["--imgsz", "100"], "imgsz"),
    ("imgsz 0", ["--imgsz", "0"], "imgsz"),
    ("lr0 negative", ["--lr0", "-1"], "lr0"),
    ("lr0 nan", ["--lr0", "nan"], "lr0"),
    ("lr0 inf", ["--lr0", "inf"], "lr0"),
    ("lrf 0", ["--lrf", "0"], "lrf"),
    ("momentum 1", ["--momentum", "1.0"], "momentum"),
    ("weight decay negative", ["--weight-decay", "-0.1"], "weight_decay"),
    ("ema decay 1", ["--ema-decay", "1"], "ema_decay"),
    ("ema decay 0", ["--ema-decay", "0"], "ema_decay"),
    ("ema tau 0", ["--ema-tau", "0"], "ema_tau"),
    ("nbs 0", ["--nbs", "0"], "nbs"),
    ("warmup negative", ["--warmup-epochs", "-1"], "warmup_epochs"),
    ("warmup momentum 1", ["--warmup-momentum", "1"], "warmup_momentum"),
    ("box gain negative", ["--box", "-1"], "box"),
    ("unknown optimizer", ["--optimizer", "Adam"], "optimizer"),
    ("mosaic > 1", ["--mosaic", "1.5"], "mosaic"),
    ("fliplr < 0", ["--fliplr", "-0.1"], "fliplr"),
    ("hsv_h > 1", ["--hsv-h", "2"], "hsv_h"),
    ("degrees > 360", ["--degrees", "400"], "degrees"),
    ("close mosaic negative", ["--close-mosaic", "-1"], "close_mosaic"),
    ("seed negative", ["--seed", "-1"], "seed"),
    ("max steps 0", ["--max-steps", "0"], "max_steps"),
    ("accumulate 0", ["--accumulate-grad-batches", "0"], "accumulate_grad_batches"),
    ("clip negative", ["--gradient-clip-val", "-1"], "gradient_clip_val"),
    ("val every 0", ["--check-val-every-n-epoch", "0"], "check_val_every_n_epoch"),
    ("limit train 0", ["--limit-train-batches", "0"], "limit_train_batches"),
    ("limit train fraction > 1", ["--limit-train-batches", "1.5"], "limit_train_batches"),
    ("limit train fraction leaves none", ["--limit-train-batches", "0.001"], "none of the 32 training batches"),
    ("limit val negative", ["--limit-val-batches", "-1"], "limit_val_batches"),
    ("empty name", ["--name", ""], "name"),
    ("name with a slash", ["--name", "a/b"], "name"),
    ("project is a file", ["--project", "{afile}"], "--project"),
    ("data missing", ["--data", "{root}/missing.yaml"], "missing.yaml does not exist"),
    ("data is a folder", ["--data", "{root}"], "is not a file"),
    ("data YAML syntax error", ["--data", "{yaml_syntax}"], "syntax.yaml, line 5, column 4: YAML syntax error"),
    ("data YAML not a mapping", ["--data", "{yaml_list}"], "expected a mapping"),
    ("data without names", ["--data", "{yaml_nonames}"], "names"),
    ("train images missing", ["--data", "{yaml_notrain}"], "nothing_here"),
    ("nc against names", ["--data", "{yaml_nc}"], "nc=3 but 2 names"),
    ("unknown model", ["--model", "yolo26q"], "model"),
    ("model file missing", ["--model", "{root}/nope.safetensors"], "nope.safetensors does not exist"),
    ("model file damaged", ["--model", "{badmodel}"], "bad.safetensors"),
    ("model file of a foreign program", ["--model", "{foreign}"], "foreign.safetensors"),
    ("model classes against data", ["--model", "{model3}"], "3 classes"),
    ("device unknown", ["--device", "tpu"], "--device"),
    ("capture network on cpu", ["--capture-network"], "--capture-network"),
    ("low precision on cpu", ["--precision", "bf16-mixed"], "needs CUDA"),
    ("resume missing", ["--resume", "{root}/nope.ckpt"], "--resume"),
    ("resume a folder", ["--resume", "{root}"], "--resume"),
    ("resume truncated", ["--resume", "{truncated}", "--epochs", "3"], "truncated.ckpt' is truncated"),
    ("resume a model file", ["--resume", "{model3}", "--epochs", "3"], "not a ptl training checkpoint"),
    ("resume without grads", ["--resume", "{nograds}", "--epochs", "3"], "'trainer.grads' is missing"),
    ("resume other batch", ["--resume", "{unfinished}", "--epochs", "3", "--batch", "8"], "batch_size=4"),
    ("resume other imgsz", ["--resume", "{unfinished}", "--epochs", "3", "--imgsz", "96"], "imgsz=64"),
    ("resume other scale", ["--resume", "{unfinished}", "--epochs", "3", "--model", "yolo26s"], "holds a yolo26n"),
]


def expand(args, files):
    return [a.format(**{k: v for k, v in files.items() if k != "base"}) if isinstance(a, str) else a for a in args]


def test_there_are_enough_cases():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name,extra,words", CASES, ids=[c[0] for c in CASES])
def test_user_error_is_one_line_and_exit_status_2(files, capsys, name, extra, words):
    runs = files["root"] / "runs" / "train"
    before, runs_before = sorted(os.listdir(files["root"])), sorted(os.listdir(runs))
    rc, err, out = run_main(files["base"] + expand(extra, files), capsys)
    assert rc == 2, (name, err)
    assert len(err) == 1, err
    assert err[0].startswith("ptl.train: error: ") and words in err[0], err[0]
    assert "Traceback" not in err[0] and out == ""
    assert sorted(os.listdir(files["root"])) == before  # nothing written
    assert sorted(os.listdir(runs)) == runs_before  # no run folder left by the refused run


@pytest.mark.skipif(ptl.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_requested_without_a_gpu(files, capsys):
    rc, err, _ = run_main(files["base"] + ["--device", "cuda"], capsys)
    assert rc == 2 and len(err) == 1 and "no CUDA device" in err[0]


def test_finished_checkpoint_trains_nothing_and_exits_0(files, capsys):
    """The checkpoint has done its 1 epoch: a one-line ResumeWarning, no training, no run folder."""
    runs = files["root"] / "runs" / "train"
    before = sorted(os.listdir(runs))
    rc, err, out = run_main(files["base"] + ["--epochs", "1", "--resume", files["good"], "--digest"], capsys)
    assert rc == 0 and out == ""
    assert len(err) == 1 and err[0].startswith("ptl.train: ResumeWarning: ") and "nothing to train" in err[0]
    assert sorted(os.listdir(runs)) == before


def test_internal_error_keeps_its_traceback(files, capsys, monkeypatch):
    """A ValueError from inside the fit is not a user error: main lets it through (a traceback, exit 1)."""
    from ptl import engine

    def broken(self, batch, epoch, i):
        raise ValueError("an internal bug")
    monkeypatch.setattr(engine.Engine, "train_step", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        train.main([str(a) for a in files["base"] + ["--epochs", "1", "--checkpointing", "false"]])


def test_subprocess_exit_status_and_one_line(files):
    """The real command: status 2 and one line, for an error found before and one found after the fit began."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(ptl.__file__))] + sys.path))
    for extra, words in ((["--lr0", "nan"], "lr0"), (["--resume", files["nograds"], "--epochs", "3"], "trainer.grads")):
        r = subprocess.run([sys.executable, "-m", "ptl.train"] + [str(a) for a in files["base"] + extra],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_resume_that_continues_prints_the_digest(files, capsys):
    """A resume for fewer epochs than planned (1 done, 3 planned, 2 asked): one warning line, one epoch."""
    rc, err, out = run_main(files["base"] + ["--epochs", "2", "--resume", files["unfinished"], "--digest",
                                             "--checkpointing", "false"], capsys)
    assert rc == 0, err
    assert set(json.loads(out)) == {"losses", "model", "optimizer", "schedule", "ema", "metrics"}
    assert len(err) == 2 and err[0].startswith("ptl.train: ResumeWarning: ") and "planned for 3" in err[0]
    assert err[1].startswith("ptl.train: run folder ")
