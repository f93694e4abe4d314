"""Command line: ``python -m ptl.train --data coco256/data.yaml --model yolo26n --epochs 6 --batch 4 ...``

Every Trainer, Detector and DetectionData option has a flag; ``--resume PATH`` continues a checkpoint,
``--digest`` prints the run's digests at the end.

Several devices: ``--device 0,1,2,3`` (GPU ordinals) or ``--device cpu --devices 2`` (CPU processes),
``--num-nodes``; ``--batch`` is then the global batch, divided over the ranks as Ultralytics does (it must
divide evenly).

Exit status: 0 when the fit ran or the resumed checkpoint had nothing left to train; 2 for a user
error, printed as one line on stderr: argparse's errors, any error raised while the arguments are
turned into data, model and trainer (those checks raise ValueError, TypeError, KeyError or OSError
naming the argument or file), and a ``ptl.ConfigError`` from inside the fit (a bad checkpoint, no
CUDA device). Any other exception is a bug and keeps its traceback. Warnings print as one line each.
"""
import argparse
import json
import os
import sys
import warnings

from ptl.errors import ConfigError

AUGMENT = ("mosaic", "degrees", "translate", "scale", "shear", "perspective", "hsv_h", "hsv_s", "hsv_v", "flipud",
           "fliplr")


def _fraction_or_int(text):
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected an int or a fraction, got %r" % text) from None


def _bool(text):
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError("expected true or false, got %r" % text)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, "ptl.train: error: %s\n" % message)


def build_parser():
    p = _Parser(prog="python -m ptl.train", description="Train a YOLO26 detector with ptl.")
    g = p.add_argument_group("data")
    g.add_argument("--data", required=True, help="data.yaml (path, train, val, names)")
    g.add_argument("--imgsz", type=int, default=640, help="training image size, a multiple of 32 (640)")
    g.add_argument("--batch", type=int, default=16, help="batch size over all ranks (16)")
    g.add_argument("--workers", type=int, default=8, help="loader threads (8)")
    g.add_argument("--cache", choices=["none", "ram"], default="none", help="decoded-image cache (none)")
    g.add_argument("--close-mosaic", type=int, default=10, help="epochs at the end without mosaic (10)")
    for name, default in (("mosaic", 1.0), ("degrees", 0.0), ("translate", 0.1), ("scale", 0.5), ("shear", 0.0),
                          ("perspective", 0.0), ("hsv-h", 0.015), ("hsv-s", 0.7), ("hsv-v", 0.4),
                          ("flipud", 0.0), ("fliplr", 0.5)):
        g.add_argument("--" + name, type=float, default=default, help="augmentation (%g)" % default)
    g = p.add_argument_group("model")
    g.add_argument("--model", default="yolo26n",
                   help="yolo26n/s/m/l/x, or weights to start from: an Ultralytics .pt, a ptl .safetensors or "
                        ".ckpt (tensors that fit the data's class count are transferred)")
    from .objective import GAINS
    from .optim import OptimConfig
    for name, typ, default in (("optimizer", str, OptimConfig.optimizer), ("lr0", float, OptimConfig.lr0),
                               ("lrf", float, OptimConfig.lrf), ("momentum", float, OptimConfig.momentum),
                               ("weight-decay", float, OptimConfig.weight_decay),
                               ("warmup-epochs", float, OptimConfig.warmup_epochs),
                               ("warmup-momentum", float, OptimConfig.warmup_momentum),
                               ("warmup-bias-lr", float, OptimConfig.warmup_bias_lr), ("nbs", int, OptimConfig.nbs),
                               ("ema-decay", float, OptimConfig.ema_decay), ("ema-tau", float, OptimConfig.ema_tau),
                               ("box", float, GAINS[0]), ("cls", float, GAINS[1]), ("dfl", float, GAINS[2])):
        g.add_argument("--" + name, type=typ, default=default, help="(%s)" % default)
    g.add_argument("--cos-lr", action="store_true", help="cosine learning-rate decay (linear by default)")
    g = p.add_argument_group("trainer")
    g.add_argument("--epochs", type=int, default=100, help="max_epochs (100)")
    g.add_argument("--max-steps", type=int, default=-1, help="optimizer steps limit (-1: none)")
    g.add_argument("--precision", default="32-true", choices=["32-true", "16-mixed", "bf16-mixed"])
    g.add_argument("--device", default="auto", help="cpu, cuda, auto, or GPU ordinals such as 0,1,2,3")
    g.add_argument("--devices", default=None, help="with --device cpu/cuda/auto: how many (CPU processes, GPUs)")
    g.add_argument("--num-nodes", type=int, default=1, help="nodes of a multi-node job (1)")
    g.add_argument("--timeout", type=float, default=None, help="seconds any wait of a distributed job may take")
    g.add_argument("--accumulate-grad-batches", type=int, default=None, help="fixed accumulation (spec rule)")
    g.add_argument("--gradient-clip-val", type=float, default=OptimConfig.max_norm)
    g.add_argument("--limit-train-batches", type=_fraction_or_int, default=None)
    g.add_argument("--limit-val-batches", type=_fraction_or_int, default=None)
    g.add_argument("--check-val-every-n-epoch", type=int, default=1)
    g.add_argument("--project", default=".", help="default_root_dir: runs/<name>/version_N is made under it")
    g.add_argument("--name", default="train")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--deterministic", type=_bool, default=True)
    g.add_argument("--progress-bar", type=_bool, default=True)
    g.add_argument("--checkpointing", type=_bool, default=True)
    g.add_argument("--capture-network", action="store_true",
                   help="CUDA: replay the network's forward and backward as recorded CUDA graphs")
    g.add_argument("--end2end", action="store_true",
                   help="validate the one-to-one head's top-300 without NMS (default: the one-to-many head with NMS)")
    g.add_argument("--resume", default=None, metavar="PATH", help="checkpoint to continue from")
    g.add_argument("--digest", action="store_true", help="print the run's digests (JSON) at the end")
    return p


def _yaml_error_line(exc, path):
    """A PyYAML error as one line naming the file, line and column."""
    mark = getattr(exc, "problem_mark", None)
    where = "%s, line %d, column %d" % (path, mark.line + 1, mark.column + 1) if mark is not None else path
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return "%s: YAML syntax error: %s" % (where, problem)


def _check_cli_args(args):
    """The command line's own arguments and the hyperparameters, before anything is built."""
    from ptl.hparams_check import check_data_args, check_hparams
    from ptl.runlog import check_run_name
    check_data_args(imgsz=args.imgsz, batch_size=args.batch, workers=args.workers, seed=args.seed,
                    close_mosaic=args.close_mosaic, **{k: getattr(args, k) for k in AUGMENT})
    check_hparams(_hparams(args))
    check_run_name(args.name)
    if os.path.exists(args.project) and not os.path.isdir(args.project):
        raise ConfigError("--project: %s exists and is not a folder" % args.project)
    if not os.path.isfile(args.data):
        raise ConfigError("--data: %s %s" % (args.data, "is not a file" if os.path.exists(args.data)
                                             else "does not exist"))
    if args.resume is not None and not os.path.isfile(args.resume):
        raise ConfigError("--resume: %s %s" % (args.resume, "is not a file" if os.path.exists(args.resume)
                                               else "does not exist"))
    if args.model.endswith(".safetensors") and not os.path.isfile(args.model):
        raise ConfigError("--model: %s does not exist" % args.model)
    accelerator, devices = device_arguments(args.device, args.devices)
    from ptl import distributed
    try:
        world = distributed.planned_world_size(accelerator, devices, args.num_nodes)
    except ValueError as exc:
        raise ConfigError("--device %s%s: %s" % (args.device, " --devices %s" % args.devices if args.devices else "",
                                                  exc)) from None
    if args.batch < world or args.batch % world:
        raise ConfigError("--batch %d is the batch of all %d ranks: it must be a multiple of %d"
                          % (args.batch, world, world))
    return accelerator, devices, world


def device_arguments(device, devices):
    """(accelerator, devices) of the --device and --devices flags."""
    text = device.strip().lower()
    if text in ("cpu", "cuda", "gpu", "auto"):
        return ("cuda" if text == "gpu" else text), (devices if devices is not None else "auto")
    if devices is not None:
        raise ConfigError("--devices: not with --device %s (the GPU ordinals already say which)" % device)
    if not all(t.strip().isdigit() for t in text.split(",")):
        raise ConfigError("--device: expected cpu, cuda, auto or GPU ordinals such as 0,1, got %r" % device)
    return "cuda", device


def _hparams(args):
    return {"optimizer": args.optimizer, "lr0": args.lr0, "lrf": args.lrf, "momentum": args.momentum,
            "weight_decay": args.weight_decay, "warmup_epochs": args.warmup_epochs,
            "warmup_momentum": args.warmup_momentum, "warmup_bias_lr": args.warmup_bias_lr, "nbs": args.nbs,
            "cos_lr": args.cos_lr, "ema_decay": args.ema_decay, "ema_tau": args.ema_tau, "box": args.box,
            "cls": args.cls, "dfl": args.dfl}


def _build(args):
    """Data, model and trainer from the arguments; the train loader is made (and its files scanned) here,
    so that a bad dataset is reported as a user error before the fit begins."""
    import yaml

    import ptl
    from ptl.data import DetectionData
    from ptl.engine import _limit
    from ptl.trainer import Trainer

    accelerator, devices, world = _check_cli_args(args)
    trainer = Trainer(max_epochs=args.epochs, max_steps=args.max_steps, precision=args.precision,
                      accumulate_grad_batches=args.accumulate_grad_batches,
                      gradient_clip_val=args.gradient_clip_val, limit_train_batches=args.limit_train_batches,
                      limit_val_batches=args.limit_val_batches, check_val_every_n_epoch=args.check_val_every_n_epoch,
                      enable_progress_bar=args.progress_bar, enable_checkpointing=args.checkpointing,
                      deterministic=args.deterministic, default_root_dir=args.project, accelerator=accelerator,
                      devices=devices, num_nodes=args.num_nodes, timeout=args.timeout, name=args.name, seed=args.seed,
                      end2end=args.end2end)
    device = trainer.device
    if args.capture_network and device == "cpu":
        raise ConfigError("--capture-network needs a CUDA device (--device cuda)")
    if device == "cpu" and args.precision != "32-true":
        raise ConfigError("--precision %s needs CUDA; the CPU trains in 32-true" % args.precision)
    try:
        data = DetectionData(args.data, imgsz=args.imgsz, batch_size=args.batch // world, workers=args.workers,
                             cache=None if args.cache == "none" else "ram", seed=args.seed,
                             close_mosaic=args.close_mosaic, **{k: getattr(args, k) for k in AUGMENT})
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error_line(exc, args.data)) from None
    if args.model.endswith((".pt", ".pth", ".safetensors", ".ckpt")):  # start from weights (ptl.weights)
        model = _load_model_file(args.model, data, args.seed)
    else:
        model = ptl.Detector(args.model, num_classes=data.num_classes, seed=args.seed)
    model.hparams = _hparams(args)
    if model.num_classes != data.num_classes:
        raise ConfigError("--model %s has %d classes but %s has %d" % (args.model, model.num_classes, args.data,
                                                                       data.num_classes))
    n = len(data.train_loader())
    if _limit(args.limit_train_batches, n, "limit_train_batches") == 0:
        raise ConfigError("--limit-train-batches %s leaves none of the %d training batches"
                          % (args.limit_train_batches, n))
    try:
        data.val_loader()
    except (ValueError, KeyError):
        pass  # no usable validation split: the fit runs without validation
    return data, model, trainer


def _load_model_file(path, data, seed):
    """A Detector from a weight file (Detector.save's .safetensors, a run's weights/*.safetensors, a training
    checkpoint's EMA, an Ultralytics .pt) for the data's classes: every tensor is checked before any is
    loaded, and those of another class count are transferred where their shapes allow (ptl.weights)."""
    import ptl
    if not os.path.isfile(path):
        raise ConfigError("--model: %s does not exist" % path)
    try:
        return ptl.Detector.load(path, num_classes=data.num_classes, names=data.names, seed=seed)
    except (ValueError, KeyError, OSError) as exc:  # a file that is not such weights (CheckpointError included)
        raise ConfigError("--model: %s" % _one_line(exc)) from None


def _one_line(message):
    return " ".join(str(message).split()) or "error"


def main(argv=None):
    """Runs the command line; returns the exit status: 0 done (or nothing left to train), 2 a user
    error (one line on stderr). Any other exception is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        # every warning as one line, e.g. "ptl.train: DataWarning: <file>: <reason>"
        warnings.showwarning = lambda message, category, *rest, **kw: print(
            "ptl.train: %s: %s" % (category.__name__, _one_line(message)), file=sys.stderr)
        try:
            data, model, trainer = _build(args)
            trainer.fit(model, data, ckpt_path=args.resume, capture_network=args.capture_network)
        except ConfigError as exc:
            print("ptl.train: error: %s" % _one_line(exc), file=sys.stderr)
            return 2
        except (ValueError, TypeError, KeyError, OSError) as exc:
            if not _before_fit(exc):
                raise
            print("ptl.train: error: %s" % _one_line(exc.args[0] if isinstance(exc, KeyError) and exc.args
                                                      else exc), file=sys.stderr)
            return 2
    if trainer.log_dir is None:  # the checkpoint had finished: the ResumeWarning above says so
        return 0
    if trainer.is_global_zero:
        print("ptl.train: run folder %s" % trainer.log_dir, file=sys.stderr)
    if args.digest:
        print(json.dumps(trainer.digest(), indent=1, sort_keys=True))
    return 0


def _before_fit(exc):
    """Whether exc was raised while the arguments were turned into objects (those checks raise
    ValueError, TypeError, KeyError or OSError naming the argument or file) rather than by the fit."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is _build.__code__:
            return True
        tb = tb.tb_next
    return False


if __name__ == "__main__":
    sys.exit(main())
