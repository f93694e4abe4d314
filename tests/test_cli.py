"""``python -m ptl.train`` and the ``ptl`` command: every user error is one line on stderr and exit status 2,
also those found once the fit has begun (issue 18.9); internal errors keep their traceback. Both argument
styles (``--imgsz 64`` and ``imgsz=64``) and ``cfg=args.yaml`` give the same run (issue 15.4, 14.4)."""
import glob
import json
import os
import re
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
            "--limit-train-batches", "1", "--limit-val-batches", "1", "--progress-bar", "false", "--project", root,
            "--verbose", "false"]
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
    f["badcfg"] = root / "badcfg.yaml"
    f["badcfg"].write_text("epochs: 2\nfrobnicate: 1\n")
    f["typecfg"] = root / "typecfg.yaml"
    f["typecfg"].write_text("epochs: two\n")
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
    ("epochs not an int, key=value", ["epochs=two"], "epochs: expected an int, got 'two'"),
    ("unknown flag", ["--frobnicate"], "unrecognized"),
    ("unknown key=value", ["lr=0.1"], "unknown argument 'lr'"),
    ("precision choice", ["--precision", "8-true"], "precision"),
    ("cache choice", ["--cache", "foo"], "cache: expected None, 'ram' or 'disk'"),
    ("bool flag", ["--deterministic", "maybe"], "deterministic"),
    ("bool key=value", ["single_cls=maybe"], "single_cls: expected true or false"),
    ("bool switch", ["--rect", "maybe"], "rect"),
    ("limit not a number", ["--limit-train-batches", "all"], "--limit-train-batches"),
    ("epochs 0", ["--epochs", "0"], "max_epochs"),
    ("epochs negative", ["--epochs", "-3"], "max_epochs"),
    ("batch 0", ["--batch", "0"], "batch_size"),
    ("workers negative", ["--workers", "-1"], "workers"),
    ("imgsz 0", ["--imgsz", "0"], "imgsz"),
    ("imgsz h,w with 0", ["imgsz=64,0"], "imgsz"),
    ("imgsz three sizes", ["--imgsz", "64,64,64"], "imgsz"),
    ("fraction 0", ["--fraction", "0"], "fraction"),
    ("max pixels 0", ["--max-pixels", "0"], "max_pixels"),
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
    ("val check interval 0", ["--val-check-interval", "0"], "val_check_interval"),
    ("sanity steps -2", ["--num-sanity-val-steps", "-2"], "num_sanity_val_steps"),
    ("fast dev run negative", ["--fast-dev-run", "-1"], "fast_dev_run"),
    ("overfit batches > 1", ["--overfit-batches", "1.5"], "overfit_batches"),
    ("patience negative", ["--patience", "-1"], "patience"),
    ("freeze negative", ["--freeze", "-1"], "freeze"),
    ("time negative", ["--time", "-1"], "time: expected a positive number of hours"),
    ("max time malformed", ["--max-time", "1:00"], "max_time: expected 'DD:HH:MM:SS'"),
    ("time and max time", ["time=1", "max_time=00:01:00:00"], "give one of them"),
    ("limit train 0", ["--limit-train-batches", "0"], "limit_train_batches"),
    ("limit train fraction > 1", ["--limit-train-batches", "1.5"], "limit_train_batches"),
    ("limit train fraction leaves none", ["--limit-train-batches", "0.001"], "none of the 32 training batches"),
    ("limit val negative", ["--limit-val-batches", "-1"], "limit_val_batches"),
    ("empty name", ["--name", ""], "name"),
    ("name with a slash", ["--name", "a/b"], "name"),
    ("project is a file", ["--project", "{afile}"], "--project"),
    ("data missing", ["--data", "{root}/missing.yaml"], "missing.yaml does not exist"),
    ("data is a folder", ["--data", "{root}"], "is not a file"),
    ("data YAML syntax error", ["--data", "{yaml_syntax}"],
     "syntax.yaml, line 5, column 4: YAML syntax error: expected ',' or ']', but got ':' (while parsing a flow "
     "sequence from line 4, column 8)"),
    ("data YAML not a mapping", ["--data", "{yaml_list}"], "expected a mapping"),
    ("data without names", ["--data", "{yaml_nonames}"], "names"),
    ("train images missing", ["--data", "{yaml_notrain}"], "nothing_here"),
    ("nc against names", ["--data", "{yaml_nc}"], "nc=3 but 2 names"),
    ("cfg missing", ["cfg={root}/none.yaml"], "none.yaml does not exist"),
    ("cfg unknown key", ["--cfg", "{badcfg}"], "badcfg.yaml: unknown argument 'frobnicate'"),
    ("cfg bad value", ["--cfg", "{typecfg}"], "typecfg.yaml: epochs: expected an int, got 'two'"),
    ("cfg YAML syntax error", ["--cfg", "{yaml_syntax}"], "syntax.yaml, line 5, column 4: YAML syntax error: "
     "expected ',' or ']', but got ':' (while parsing a flow sequence from line 4, column 8)"),
    ("unknown model", ["--model", "yolo26q"], "model"),
    ("model file missing", ["--model", "{root}/nope.safetensors"], "nope.safetensors does not exist"),
    ("model file damaged", ["--model", "{badmodel}"], "bad.safetensors"),
    ("model file of a foreign program", ["--model", "{foreign}"], "foreign.safetensors"),
    ("device unknown", ["--device", "tpu"], "device: expected auto, cpu, cuda"),
    ("two GPUs without one", ["device=0,1"], "--device 0,1: devices=[0, 1] on CUDA: no CUDA device is available"),
    ("GPU ordinals with devices", ["device=0", "devices=2"], "--devices: not with --device 0"),
    ("batch not a multiple of the ranks", ["device=cpu", "devices=3", "batch=4"],
     "--batch 4 is the batch of all 3 ranks"),
    ("capture network on cpu", ["--capture-network"], "--capture-network"),
    ("all-reduce in graph without replay", ["--all-reduce-in-graph"], "it needs --capture-network"),
    ("low precision on cpu", ["--precision", "bf16-mixed"], "needs CUDA"),
    ("resume missing", ["--resume", "{root}/nope.ckpt"], "--resume"),
    ("resume a folder", ["--resume", "{root}"], "--resume"),
    ("resume last without a run", ["--name", "other", "resume=last"], "no last checkpoint found"),
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
    assert err[0].count("ptl.train: error:") == 1
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


# the cases found once the data is scanned or the fit has begun, when INFO lines come before the error
AFTER_SCAN = ["limit train fraction leaves none", "data YAML syntax error", "resume truncated", "resume a model file",
              "resume without grads", "resume other batch", "resume other scale"]


@pytest.mark.parametrize("name", AFTER_SCAN)
def test_user_error_when_verbose_is_one_line_after_the_info_lines(files, capsys, name):
    """With the CLI's default verbosity the INFO lines said before the error (the label counts, the precision)
    are ``ptl.train: <message>`` lines of the ptl logger, and the error is still one line, the last."""
    extra, words = {c[0]: c[1:] for c in CASES}[name]
    rc, err, out = run_main(files["base"] + expand(extra, files) + ["--verbose", "true"], capsys)
    assert rc == 2 and out == "", (name, err)
    assert all(e.startswith("ptl.train: ") for e in err) and not any("Traceback" in e for e in err), err
    assert [e for e in err if e.startswith("ptl.train: error: ")] == [err[-1]] and words in err[-1], err
    assert not any(e.startswith("ptl.train: error: ") or "error:" in e for e in err[:-1]), err


def test_resume_that_continues_prints_the_digest(files, capsys):
    """A resume for fewer epochs than planned (1 done, 3 planned, 2 asked): one warning line, one epoch; every
    stderr line is a ptl logger message, the digests alone are on stdout."""
    rc, err, out = run_main(files["base"] + ["--epochs", "2", "--resume", files["unfinished"], "--digest",
                                             "--checkpointing", "false", "--verbose", "true"], capsys)
    assert rc == 0, err
    assert set(json.loads(out)) == {"losses", "model", "optimizer", "schedule", "ema", "metrics"}
    data = str(files["base"][1].parent / "images")
    expected = [r"train %s/train2017: 128 images: 126 with labels, 0 empty, 2 without a label file$" % re.escape(data),
                r"val %s/val2017: 128 images: 128 with labels, 0 empty, 0 without a label file$" % re.escape(data),
                r"precision: 32-true \(the default on cpu\)$",
                r"ResumeWarning: ckpt_path: .*unfinished\.ckpt comes from a run planned for 3 epoch\(s\); resuming it "
                r"for 2 changes the learning-rate schedule",
                r"resuming from .*unfinished\.ckpt at epoch 1$",
                # the fit's summary (ptl.report): model, datasets, optimizer choice and groups
                r"YOLO26n summary: 260 layers, 2,572,280 parameters, 2,572,280 gradients, [0-9.]+ GFLOPs$",
                r"train: .*128 images, ", r"val: .*128 images, ", r"optimizer: ", r"optimizer: ",
                r"run folder %s\d+$" % re.escape(str(files["root"] / "runs" / "train" / "version_"))]
    assert len(err) == len(expected), err
    for line, pattern in zip(err, expected):
        assert line.startswith("ptl.train: ") and re.match(pattern, line[len("ptl.train: "):]), (line, pattern)


def test_model_file_of_other_classes_is_transferred(files, capsys):
    """A 3-class weight file for the 80-class data: the model is built with the file's class-branch width (64)
    as 8.4.190 loads it, so all but the 12 final class tensors transfer, and the fit runs; the CLI says so in
    one INFO line, Ultralytics' 'Transferred a/b items' (the list of what was left out is DEBUG)."""
    rc, err, out = run_main(files["base"] + ["--model", files["model3"], "--epochs", "1", "--checkpointing", "false",
                                             "--verbose", "true", "--digest"], capsys)
    assert rc == 0, err
    assert set(json.loads(out)) == {"losses", "model", "optimizer", "schedule", "ema", "metrics"}
    assert "ptl.train: Transferred 696/708 items from three.safetensors" in err, err
    assert all(e.startswith("ptl.train: ") and not e.startswith("ptl.train:  ") for e in err), err
    rc, err, _ = run_main(files["base"] + ["--model", files["model3"], "--epochs", "1", "--checkpointing", "false"],
                          capsys)
    assert rc == 0 and err == [], err  # verbose=false: nothing but warnings and errors


# ---- issue 15.4 / 14.4 / 19.10: one command line, both argument styles, args.yaml --------------------------------

def _digest_run(argv, capsys, entry=None):
    """(exit status, digests, stderr lines) of a fit run in this process through ``entry``."""
    try:
        rc = (entry or train.main)([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 and out else None), err.splitlines()


def test_both_argument_styles_and_cfg_give_one_run(coco256, tmp_path, capsys):
    """The same options as --flags, as Ultralytics' key=value through the ptl command, and read back from the
    first run's args.yaml give identical digests (options away from their defaults included)."""
    import yaml

    from ptl import cli
    dashes = ["--data", coco256 / "data.yaml", "--imgsz", "64", "--batch", "4", "--workers", "2", "--device", "cpu",
              "--epochs", "1", "--limit-train-batches", "2", "--limit-val-batches", "1", "--progress-bar", "false",
              "--project", tmp_path, "--optimizer", "SGD", "--lr0", "0.02", "--close-mosaic", "0", "--fliplr", "0.2",
              "--fraction", "0.5", "--single-cls", "--digest"]
    rc, first, err = _digest_run(dashes, capsys)
    assert rc == 0, err
    assert "ptl.train: precision: 32-true (the default on cpu)" in err  # the resolved choice is said
    assert err[-1] == "ptl.train: run folder %s" % (tmp_path / "runs" / "train" / "version_0")
    keys = ["train", "data=%s" % (coco256 / "data.yaml"), "imgsz=64", "batch=4", "workers=2", "device=cpu",
            "epochs=1", "limit_train_batches=2", "limit_val_batches=1", "progress_bar=False",
            "project=%s" % tmp_path, "optimizer=SGD", "lr0=0.02", "close_mosaic=0", "fliplr=0.2", "fraction=0.5",
            "single_cls=True", "digest=true"]
    rc, second, err = _digest_run(keys, capsys, cli.main)
    assert rc == 0, err
    assert second == first
    args_yaml = tmp_path / "runs" / "train" / "version_0" / "args.yaml"
    recorded = yaml.safe_load(args_yaml.read_text())
    assert (recorded["single_cls"], recorded["fraction"], recorded["lr0"], recorded["optimizer"]) == (
        True, 0.5, 0.02, "SGD")
    rc, third, err = _digest_run(["--cfg", args_yaml, "--digest"], capsys)
    assert rc == 0, err
    assert third == first
    # the command line overrides the file, the file the defaults
    values, given = train.resolve(["cfg=%s" % args_yaml, "lr0=0.03"])
    assert (values["lr0"], values["optimizer"], values["fraction"]) == (0.03, "SGD", 0.5)
    assert {"lr0", "optimizer", "fraction", "cfg"} <= given and "mosaic" not in given  # at its default


def test_issue_19_options_on_the_command_line(coco256, tmp_path, capsys):
    """imgsz=100 trains at 128 (a warning), the disk cache is valid, rect / patience / freeze / time are
    accepted and recorded in args.yaml."""
    import yaml
    argv = ["--data", coco256 / "data.yaml", "imgsz=100", "batch=4", "workers=2", "device=cpu", "epochs=1",
            "limit_train_batches=1", "limit_val_batches=1", "progress_bar=false", "project=%s" % tmp_path,
            "cache=disk", "cache_dir=%s" % (tmp_path / "cache"), "fraction=8", "--rect", "patience=5",
            "freeze=0,1", "time=1", "verbose=false"]
    rc, _, err = _digest_run(argv, capsys)
    assert rc == 0, err
    assert any("UserWarning: imgsz=100 must be a multiple of the stride 32: updating to 128" in e for e in err), err
    recorded = yaml.safe_load((tmp_path / "runs" / "train" / "version_0" / "args.yaml").read_text())
    assert (recorded["imgsz"], recorded["cache"], recorded["rect"], recorded["patience"], recorded["freeze"],
            recorded["time"]) == (128, "disk", True, 5, [0, 1], 1.0)
    assert any((tmp_path / "cache").rglob("*"))  # the disk cache was written where it was told


def test_defaults_come_from_the_objects(coco256, monkeypatch):
    """The command line's defaults are read from DetectionData's, Trainer's and OptimConfig's own: change one
    there and the command line follows."""
    from ptl import arguments, optim
    values, given = train.resolve(["data=x.yaml"])
    assert given == {"data"}
    for a in arguments.ARGS:
        assert a.name == "data" or values[a.name] == arguments.default(a), a.name
    assert (values["imgsz"], values["batch"], values["lr0"], values["gradient_clip_val"], values["epochs"]) == (
        640, 16, 0.01, 10.0, None)
    monkeypatch.setitem(ptl.DetectionData.__init__.__kwdefaults__, "close_mosaic", 7)
    monkeypatch.setitem(ptl.Trainer.__init__.__kwdefaults__, "gradient_clip_val", 3.0)
    monkeypatch.setattr(optim.OptimConfig.__dataclass_fields__["lrf"], "default", 0.2)
    values, _ = train.resolve(["data=x.yaml"])
    assert (values["close_mosaic"], values["gradient_clip_val"], values["lrf"]) == (7, 3.0, 0.2)
    text = train.build_parser().format_help()
    assert "(7)" in text[text.index("\n  --close-mosaic"):].split("\n  --")[1]


def test_argument_forms_read_alike():
    """--flag value, --flag=value, --under_score, key=value and a bare boolean switch give the same values."""
    forms = [["--data", "d.yaml", "--single-cls", "--imgsz", "96,128", "--max-epochs", "3"],
             ["--data=d.yaml", "--single_cls=true", "--imgsz=96,128", "--epochs=3"],
             ["data=d.yaml", "single_cls=True", "imgsz=[96, 128]", "epochs=3"]]
    seen = [train.resolve(f)[0] for f in forms]
    assert seen[0] == seen[1] == seen[2]
    assert (seen[0]["single_cls"], seen[0]["imgsz"], seen[0]["epochs"]) == (True, [96, 128], 3)
    values = train.resolve(["data=d.yaml", "cache=true", "limit_val_batches=0.5", "freeze=3", "device=cuda:1"])[0]
    assert (values["cache"], values["limit_val_batches"], values["freeze"], values["device"]) == (
        "ram", 0.5, 3, "cuda:1")


def test_device_parsing():
    from ptl.arguments import parse_device
    assert parse_device("auto") == ("auto", "auto")
    assert parse_device("cpu") == ("cpu", "auto") and parse_device("cpu", 2) == ("cpu", 2)
    assert parse_device("cuda") == parse_device("gpu") == ("cuda", "auto")
    assert parse_device("0") == parse_device(0) == parse_device("cuda:0") == ("cuda", [0])
    assert parse_device("cuda:1") == ("cuda", [1])
    assert parse_device("0,1") == parse_device([0, 1]) == ("cuda", [0, 1])  # passed on to the Trainer
    for bad in ("tpu", "cuda:x", "-1", -1, "0,a", [], True):
        with pytest.raises(ptl.ConfigError, match="device"):
            parse_device(bad)
    with pytest.raises(ptl.ConfigError, match="--devices: not with --device 0,1"):
        parse_device("0,1", 2)


def test_ptl_command_and_its_subcommands(files, tmp_path, capsys):
    """ptl (console script, python -m ptl): train, val, predict, export, in either argument style."""
    import tomllib

    from ptl import cli
    with open(os.path.join(os.path.dirname(os.path.dirname(ptl.__file__)), "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"] == {"ptl": "ptl.cli:main"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(ptl.__file__))] + sys.path))
    r = subprocess.run([sys.executable, "-m", "ptl", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and all(c in r.stdout for c in ("train", "val", "predict", "export"))
    r = subprocess.run([sys.executable, "-m", "ptl", "frobnicate"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown command 'frobnicate'" in r.stderr
    weights = files["root"] / "runs" / "train" / "version_0" / "weights" / "last.safetensors"
    data = str(files["base"][1])
    assert cli.main(["val", "data=%s" % data, "model=%s" % weights, "imgsz=64", "batch=4", "workers=2", "device=cpu",
                     "limit_val_batches=1", "verbose=false"]) == 0
    out, err = capsys.readouterr()
    assert set(json.loads(out)) >= {"metrics/mAP50-95", "val/box_loss", "fitness"}, err
    assert cli.main(["val", "--data", data, "--model", "yolo26q"]) == 2
    assert "ptl val: error: " in capsys.readouterr().err
    src = sorted(glob.glob(os.path.join(os.path.dirname(data), "images", "val2017", "*.jpg")))[0]
    assert cli.main(["predict", "model=%s" % weights, "source=%s" % src, "imgsz=64", "project=%s" % tmp_path,
                     "save_txt=true", "no_save=true"]) == 0
    assert list((tmp_path / "runs" / "predict" / "version_0" / "labels").glob("*.txt"))
    out, err = capsys.readouterr()  # the detections on stdout, the messages through the logger on stderr
    assert out.startswith(src + ": ") and out.count("\n") == 1
    assert err.splitlines() == ["ptl predict: predictions saved to %s" % (tmp_path / "runs" / "predict" / "version_0")]
    assert cli.main(["predict", "model=%s" % files["badmodel"], "source=%s" % src]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ptl predict: error: ") and "bad.safetensors" in err, err
    pytest.importorskip("onnx")
    assert cli.main(["export", "model=%s" % weights, "imgsz=64", "output=%s" % (tmp_path / "m.onnx")]) == 0
    assert (tmp_path / "m.onnx").stat().st_size > 1_000_000
    assert capsys.readouterr().err.splitlines() == ["ptl export: wrote %s" % (tmp_path / "m.onnx")]
    assert cli.main(["export", "model=%s" % files["badmodel"]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ptl export: error: ") and "bad.safetensors" in err, err
