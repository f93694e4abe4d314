"""Command line: ``python -m ptl.train --data coco256/data.yaml --model yolo26n --epochs 6 --batch 4 ...``

Every Trainer, Detector and DetectionData option has a flag; ``--resume PATH`` continues a checkpoint,
``--digest`` prints the run's digests at the end. Bad arguments exit with status 2 and one line on
stderr.
"""
import argparse
import json
import sys


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
    g.add_argument("--batch", type=int, default=16, help="batch size (16)")
    g.add_argument("--workers", type=int, default=8, help="loader threads (8)")
    g.add_argument("--cache", choices=["none", "ram"], default="none", help="decoded-image cache (none)")
    g.add_argument("--close-mosaic", type=int, default=10, help="epochs at the end without mosaic (10)")
    for name, default in (("mosaic", 1.0), ("degrees", 0.0), ("translate", 0.1), ("scale", 0.5), ("shear", 0.0),
                          ("perspective", 0.0), ("hsv-h", 0.015), ("hsv-s", 0.7), ("hsv-v", 0.4),
                          ("flipud", 0.0), ("fliplr", 0.5)):
        g.add_argument("--" + name, type=float, default=default, help="augmentation (%g)" % default)
    g = p.add_argument_group("model")
    g.add_argument("--model", default="yolo26n", help="yolo26n/s/m/l/x, or a .safetensors file to start from")
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
    g.add_argument("--device", default="auto", help="cpu, cuda or auto")
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
    g.add_argument("--resume", default=None, metavar="PATH", help="checkpoint to continue from")
    g.add_argument("--digest", action="store_true", help="print the run's digests (JSON) at the end")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    import ptl
    from ptl.data import DetectionData
    from ptl.trainer import Trainer

    try:
        data = DetectionData(args.data, imgsz=args.imgsz, batch_size=args.batch, workers=args.workers,
                             cache=None if args.cache == "none" else "ram", seed=args.seed,
                             close_mosaic=args.close_mosaic, mosaic=args.mosaic, degrees=args.degrees,
                             translate=args.translate, scale=args.scale, shear=args.shear,
                             perspective=args.perspective, hsv_h=args.hsv_h, hsv_s=args.hsv_s, hsv_v=args.hsv_v,
                             flipud=args.flipud, fliplr=args.fliplr)
        if args.model.endswith(".safetensors"):
            model = ptl.Detector.load(args.model)
        else:
            model = ptl.Detector(args.model, num_classes=data.num_classes, seed=args.seed)
        model.hparams = {"optimizer": args.optimizer, "lr0": args.lr0, "lrf": args.lrf, "momentum": args.momentum,
                         "weight_decay": args.weight_decay, "warmup_epochs": args.warmup_epochs,
                         "warmup_momentum": args.warmup_momentum, "warmup_bias_lr": args.warmup_bias_lr,
                         "nbs": args.nbs, "cos_lr": args.cos_lr, "ema_decay": args.ema_decay,
                         "ema_tau": args.ema_tau, "box": args.box, "cls": args.cls, "dfl": args.dfl}
        trainer = Trainer(max_epochs=args.epochs, max_steps=args.max_steps, precision=args.precision,
                          accumulate_grad_batches=args.accumulate_grad_batches,
                          gradient_clip_val=args.gradient_clip_val, limit_train_batches=args.limit_train_batches,
                          limit_val_batches=args.limit_val_batches,
                          check_val_every_n_epoch=args.check_val_every_n_epoch,
                          enable_progress_bar=args.progress_bar, enable_checkpointing=args.checkpointing,
                          deterministic=args.deterministic, default_root_dir=args.project,
                          accelerator=args.device, name=args.name, seed=args.seed)
        if args.capture_network and trainer.device == "cpu":
            raise ValueError("--capture-network needs a CUDA device (--device cuda)")
    except (ValueError, TypeError, KeyError, OSError) as exc:
        print("ptl.train: error: %s" % exc, file=sys.stderr)
        return 2
    trainer.fit(model, data, ckpt_path=args.resume, capture_network=args.capture_network)
    print("ptl.train: run folder %s" % trainer.log_dir, file=sys.stderr)
    if args.digest:
        print(json.dumps(trainer.digest(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
