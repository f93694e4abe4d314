"""The training arguments as one flat table: the command line's options and ``args.yaml``'s keys.

Each :class:`Arg` has a flat name (Ultralytics' where ptl shares it: ``epochs``, ``batch``, ``imgsz``,
``device``, ``project``, ``time``, ``patience``, ...; otherwise the Lightning or ptl parameter name), the
object it configures and that object's parameter:

- ``trainer``: a keyword of :class:`ptl.Trainer`; ``data``: of :class:`ptl.DetectionData`; ``hparams``: a key
  of ``Detector.hparams`` (its defaults: ``ptl.optim.OptimConfig``'s fields and the loss gains
  ``ptl.objective.GAINS``); ``model``: the model (a scale name, or weights to start from); ``fit``: a keyword
  of ``Trainer.fit``; ``cli``: the command line's own (``cfg``, ``digest``).

Defaults are read from those objects (signatures, dataclass fields), never written here, so the command
line, ``args.yaml`` and the library cannot disagree. :func:`coerce` reads a value from command-line text or
from YAML; the objects' own checks (``ptl.hparams_check``, ``Trainer``) then judge it.
"""
import dataclasses
import inspect
import numbers
import os

from .errors import ConfigError

__all__ = ["ARGS", "Arg", "by_name", "coerce", "default", "parse_device", "resolved_args"]


@dataclasses.dataclass(frozen=True)
class Arg:
    name: str
    target: str
    param: str
    kind: str
    help: str
    commands: tuple = ("train",)
    aliases: tuple = ()
    recorded: bool = True  # written to args.yaml (an alias of another argument is not)


TV = ("train", "val")
_AUGMENT = (("mosaic", "probability of a 4-image mosaic"), ("degrees", "rotation range (deg)"),
            ("translate", "translation fraction"), ("scale", "scale gain range"), ("shear", "shear range (deg)"),
            ("perspective", "perspective fraction"), ("hsv_h", "hue gain"), ("hsv_s", "saturation gain"),
            ("hsv_v", "value gain"), ("flipud", "probability of an up-down flip"),
            ("fliplr", "probability of a left-right flip"))
_HPARAMS = (("optimizer", "str", "auto, MuSGD, SGD or AdamW (auto: by run length, spec 4.1)"),
            ("lr0", "float", "initial learning rate (ignored by optimizer=auto)"),
            ("lrf", "float", "final learning rate, a fraction of lr0"),
            ("momentum", "float", "SGD momentum / Adam beta1 (ignored by optimizer=auto)"),
            ("weight_decay", "float", "weight decay at the nominal batch"),
            ("warmup_epochs", "float", "warm-up epochs"), ("warmup_momentum", "float", "warm-up start momentum"),
            ("warmup_bias_lr", "float", "warm-up start bias learning rate"), ("nbs", "int", "nominal batch size"),
            ("cos_lr", "bool", "cosine learning-rate decay (linear otherwise)"),
            ("ema_decay", "float", "EMA decay"), ("ema_tau", "float", "EMA warm-up time constant"),
            ("box", "float", "box loss gain"), ("cls", "float", "class loss gain"),
            ("dfl", "float", "L1 box loss gain (reg_max 1)"))

ARGS = (
    # data
    Arg("data", "data", "data", "path", "data.yaml (path, train, val, names)", TV),
    Arg("imgsz", "data", "imgsz", "imgsz", "image size: N or H,W (rounded up to a multiple of 32)", TV),
    Arg("batch", "data", "batch_size", "int", "batch size over all ranks", TV, ("batch_size",)),
    Arg("workers", "data", "workers", "int", "loader threads", TV),
    Arg("cache", "data", "cache", "cache", "decoded-image cache: none, ram or disk", TV),
    Arg("cache_dir", "data", "cache_dir", "path?", "disk cache folder for read-only datasets", TV),
    Arg("close_mosaic", "data", "close_mosaic", "int", "last epochs without mosaic"),
    *(Arg(k, "data", k, "float", "augmentation: " + h) for k, h in _AUGMENT),
    Arg("rect", "data", "rect", "bool", "rectangular training batches (no mosaic)"),
    Arg("single_cls", "data", "single_cls", "bool", "train every class as one", TV),
    Arg("fraction", "data", "fraction", "fraction", "first fraction (or count) of the training images"),
    Arg("max_pixels", "data", "max_pixels", "int?", "skip images with more pixels (none: no limit)", TV),
    Arg("jpeg_scale_pixels", "data", "jpeg_scale_pixels", "int?",
        "decode larger JPEGs at a DCT scale (0: never)", TV),
    Arg("allow_empty_labels", "data", "allow_empty_labels", "bool", "train on a split without labels"),
    Arg("seed", "data", "seed", "int", "seed of the data, the model's initialisation and ptl's generator", TV),
    Arg("verbose", "data", "verbose", "bool", "INFO messages (false: warnings and errors only)", TV),
    # model
    Arg("model", "model", "model", "str",
        "yolo26n/s/m/l/x, or weights to start from: an Ultralytics .pt, a ptl .safetensors or .ckpt", TV),
    *(Arg(k, "hparams", k, kind, h) for k, kind, h in _HPARAMS),
    # trainer
    Arg("epochs", "trainer", "max_epochs", "int?", "epochs (none: 100)", aliases=("max_epochs",)),
    Arg("max_steps", "trainer", "max_steps", "int", "optimizer steps limit (-1: none)"),
    Arg("time", "trainer", "max_time", "hours", "time budget in hours (sets the schedule's length)"),
    Arg("max_time", "trainer", "max_time", "max_time", "time budget DD:HH:MM:SS (as time)", recorded=False),
    Arg("patience", "trainer", "patience", "int?", "stop after N validations without a better fitness"),
    Arg("freeze", "trainer", "freeze", "freeze", "freeze the first N layers, or layers i,j,... / name prefixes"),
    Arg("precision", "trainer", "precision", "str?", "auto, 32-true, bf16-mixed or 16-mixed", TV),
    Arg("float32_matmul_precision", "trainer", "float32_matmul_precision", "str",
        "32-true on a GPU: highest (strict float32 convolutions), high or medium (TF32)", TV),
    Arg("benchmark", "trainer", "benchmark", "bool",
        "GPU: time cuDNN's candidates per convolution and keep the fastest (faster; a rerun may differ in bits)",
        TV),
    Arg("device", "trainer", "accelerator", "device", "auto, cpu, cuda, cuda:N, N (GPU N) or GPU ordinals N,M",
        TV),
    Arg("devices", "trainer", "devices", "devices", "with device cpu/cuda/auto: how many (CPU processes, GPUs)", TV),
    Arg("num_nodes", "trainer", "num_nodes", "int", "nodes of a multi-node job"),
    Arg("strategy", "trainer", "strategy", "str", "auto or ddp"),
    Arg("timeout", "trainer", "timeout", "float?", "seconds any wait of a distributed job may take (none: default)"),
    Arg("all_reduce_in_graph", "trainer", "all_reduce_in_graph", "bool",
        "several GPUs with capture_network: record the gradient all-reduce in the backward's CUDA graph"),
    Arg("accumulate_grad_batches", "trainer", "accumulate_grad_batches", "int?",
        "fixed batches per optimizer step (none: the nominal batch rule)"),
    Arg("gradient_clip_val", "trainer", "gradient_clip_val", "float?", "gradient norm clip (0: none)"),
    Arg("limit_train_batches", "trainer", "limit_train_batches", "limit",
        "training batches per epoch: N or a fraction"),
    Arg("limit_val_batches", "trainer", "limit_val_batches", "limit", "validation batches: N or a fraction", TV),
    Arg("plots", "trainer", "plots", "bool", "write the run's plots (labels, batches, curves, confusion matrix)"),
    Arg("coco_eval", "trainer", "coco_eval", "bool", "COCO evaluation of every validation (predictions.json)", TV),
    Arg("end2end", "trainer", "end2end", "bool",
        "validate the one-to-one head's top-k without NMS (false: the one-to-many head with NMS)", TV),
    Arg("overfit_batches", "trainer", "overfit_batches", "limit", "train and validate on the same first batches"),
    Arg("val_check_interval", "trainer", "val_check_interval", "limit",
        "also validate every fraction of an epoch, or every N training batches"),
    Arg("check_val_every_n_epoch", "trainer", "check_val_every_n_epoch", "int", "validate every N epochs"),
    Arg("num_sanity_val_steps", "trainer", "num_sanity_val_steps", "int?",
        "validation batches run before training (-1: all)"),
    Arg("fast_dev_run", "trainer", "fast_dev_run", "dev_run", "N batches of training and validation, nothing written"),
    Arg("deterministic", "trainer", "deterministic", "deterministic", "ptl is always deterministic"),
    Arg("progress_bar", "trainer", "enable_progress_bar", "bool?", "show progress", aliases=("enable_progress_bar",)),
    Arg("checkpointing", "trainer", "enable_checkpointing", "bool?", "write checkpoints",
        aliases=("enable_checkpointing",)),
    Arg("project", "trainer", "default_root_dir", "path?", "runs/<name>/version_N is made under it (none: .)", TV,
        ("default_root_dir",)),
    Arg("name", "trainer", "name", "str", "run name"),
    # fit
    Arg("resume", "fit", "ckpt_path", "path?", "checkpoint to continue from (or last / best)", aliases=("ckpt_path",)),
    Arg("capture_network", "fit", "capture_network", "bool", "CUDA: replay the network as recorded CUDA graphs"),
    # the command line's own
    Arg("cfg", "cli", "cfg", "path?", "a flat YAML of these arguments (a run's args.yaml)", TV, recorded=False),
    Arg("digest", "cli", "digest", "bool", "print the run's digests (JSON) at the end", recorded=False),
)
_CLI_DEFAULTS = {"cfg": None, "digest": False}


def by_name():
    """name (and alias) -> Arg."""
    out = {}
    for a in ARGS:
        for n in (a.name,) + a.aliases:
            out[n] = a
    return out


def _signature_default(fn, param):
    return inspect.signature(fn).parameters[param].default


def default(arg):
    """The default of an argument, read from the object it configures."""
    if arg.target == "trainer":
        from .trainer import Trainer
        return _signature_default(Trainer.__init__, arg.param)
    if arg.target == "data":
        from .data import DetectionData
        return _signature_default(DetectionData.__init__, arg.param)
    if arg.target == "hparams":
        from .objective import GAINS
        from .optim import OptimConfig
        gains = dict(zip(("box", "cls", "dfl"), GAINS))
        return gains[arg.param] if arg.param in gains else OptimConfig.__dataclass_fields__[arg.param].default
    if arg.target == "model":
        from .model import Detector
        return _signature_default(Detector.__init__, arg.param)
    if arg.target == "fit":
        from .trainer import Trainer
        return _signature_default(Trainer.fit, arg.param)
    return _CLI_DEFAULTS[arg.param]


# ---------------------------------------------------------------------------------------------- reading values
_NONE = ("", "none", "null", "~")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _fail(arg, what, value):
    raise ConfigError("%s: expected %s, got %r" % (arg.name, what, value))


def _int(arg, v):
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            _fail(arg, "an int", v)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        _fail(arg, "an int", v)
    return int(v)


def _float(arg, v):
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            _fail(arg, "a number", v)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        _fail(arg, "a number", v)
    return float(v)


def _number(arg, v, what):
    """An int stays an int, anything with a point or exponent is a float (limits, fractions)."""
    if isinstance(v, str):
        text = v.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            _fail(arg, what, v)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        _fail(arg, what, v)
    return v


def _bool(arg, v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
        return v.strip().lower() in _TRUE
    _fail(arg, "true or false", v)


def _int_list(arg, v, what):
    text = v.strip().strip("[]()") if isinstance(v, str) else v
    items = [t for t in text.replace(" ", ",").split(",") if t] if isinstance(text, str) else list(text)
    try:
        return [int(t) if isinstance(t, str) else t for t in items]
    except ValueError:
        _fail(arg, what, v)


def _imgsz(arg, v):
    if isinstance(v, (list, tuple)) or (isinstance(v, str) and any(c in v for c in ", []()")):
        sizes = _int_list(arg, v, "N or H,W")
        return sizes[0] if len(sizes) == 1 else sizes
    return _int(arg, v)


def _cache(arg, v):
    if v is None or v is False or (isinstance(v, str) and v.strip().lower() in _NONE + _FALSE):
        return None
    if v is True or (isinstance(v, str) and v.strip().lower() in _TRUE):
        return "ram"
    return v.strip().lower() if isinstance(v, str) else v


def _freeze(arg, v):
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, str):
        items = [t.strip() for t in v.strip().strip("[]").split(",") if t.strip()]
        parsed = [int(t) if t.lstrip("-").isdigit() else t for t in items]
        return parsed[0] if len(parsed) == 1 and isinstance(parsed[0], int) and "," not in v else parsed
    return v


def _dev_run(arg, v):
    if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
        return _bool(arg, v)
    return v if isinstance(v, bool) else _int(arg, v)


def _deterministic(arg, v):
    if isinstance(v, str) and v.strip().lower() == "warn":
        return "warn"
    return _bool(arg, v)


def _hours(arg, v):
    hours = _float(arg, v)
    if not hours > 0:
        _fail(arg, "a positive number of hours", v)
    return hours


_READERS = {"int": _int, "float": _float, "bool": _bool, "str": lambda a, v: v if isinstance(v, str) else str(v),
            "path": lambda a, v: os.fspath(v) if not isinstance(v, dict) else v, "imgsz": _imgsz, "cache": _cache,
            "fraction": lambda a, v: _number(a, v, "a fraction in (0, 1] or an image count"),
            "limit": lambda a, v: _number(a, v, "a batch count or a fraction"), "freeze": _freeze,
            "device": lambda a, v: v, "devices": lambda a, v: v, "dev_run": _dev_run, "deterministic": _deterministic,
            "hours": _hours,
            "max_time": lambda a, v: v}


def coerce(arg, value):
    """An argument's value from command-line text or a YAML value: text is parsed by the argument's kind
    ("none" / "null" give None where None is allowed), other values are passed on (the objects check them)."""
    nullable = arg.kind.endswith("?") or arg.kind in ("limit", "cache", "freeze", "device", "hours", "max_time",
                                                      "deterministic")
    if value is None or (nullable and isinstance(value, str) and value.strip().lower() in _NONE):
        if not nullable:
            _fail(arg, "a value", value)
        return None
    return _READERS[arg.kind.rstrip("?")](arg, value)


def parse_device(device, devices="auto"):
    """The command line's ``device`` (and ``devices``) as Trainer's ``(accelerator, devices)``: ``auto``,
    ``cpu``, ``cuda`` / ``gpu`` with ``devices`` (how many: CPU processes, GPUs), or GPUs by ordinal: ``N``,
    ``cuda:N``, ``N,M`` or a list (then ``devices`` must stay "auto")."""
    if device is None or (isinstance(device, str) and device.strip().lower() in ("auto", "cpu", "cuda", "gpu")):
        text = "auto" if device is None else device.strip().lower()
        return {"gpu": "cuda"}.get(text, text), devices
    ids = None
    if isinstance(device, str):
        text = device.strip().lower()
        text = text[5:] if text.startswith("cuda:") else text
        items = [t.strip() for t in text.split(",") if t.strip()]
        if items and all(t.isdigit() for t in items):
            ids = [int(t) for t in items]
    elif isinstance(device, numbers.Integral) and not isinstance(device, bool) and device >= 0:
        ids = [int(device)]
    elif isinstance(device, (list, tuple)) and device and all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in device):
        ids = [int(d) for d in device]
    if ids is None:
        raise ConfigError("device: expected auto, cpu, cuda, cuda:N, N (GPU N) or GPU ordinals N,M, got %r"
                          % (device,))
    if devices not in (None, "auto"):
        raise ConfigError("--devices: not with --device %s (the GPU ordinals already say which)" % (device,))
    return "cuda", ids


# ------------------------------------------------------------------------------------------ recording a run
def _data_source(data):
    """What DetectionData was made from: the data.yaml's absolute path, or the dict it was given."""
    cfg = data.cfg
    where = cfg.get("yaml")
    if where and os.path.isfile(where):
        return os.path.abspath(where)
    return {k: cfg[k] for k in ("path", "train", "val", "names")}


def resolved_args(trainer, model, data, ckpt_path=None, capture_network=False):
    """Every recorded argument's value in this fit, flat (``args.yaml``): the trainer's arguments as given
    (precision and device resolved), the data's, every hyperparameter (defaults filled in), the model and
    the fit's; then ``trainer.run_args`` (the command line records the weights file a model started from)."""
    hp = dict(getattr(model, "hparams", None) or {})
    out = {}
    for a in ARGS:
        if not a.recorded:
            continue
        if a.target == "trainer":
            if a.name in ("device", "devices") and trainer.world_size == 1:  # the device alone says it
                v = trainer.device if a.name == "device" else "auto"
            elif a.name == "device":
                v = trainer.accelerator
            elif a.name == "time":
                v = None if trainer.max_time is None else trainer.max_time.total_seconds() / 3600
            elif a.name == "project":
                v = os.path.abspath(trainer.default_root_dir)
            else:
                v = getattr(trainer, a.param)
        elif a.target == "data":
            v = _data_source(data) if a.name == "data" else data.hyp[a.param] if a.param in data.hyp else \
                getattr(data, a.param)
        elif a.target == "hparams":
            v = hp.get(a.param, default(a))
        elif a.target == "model":
            v = model.model_name
        else:
            v = {"ckpt_path": None if ckpt_path is None else os.path.abspath(os.fspath(ckpt_path)),
                 "capture_network": bool(capture_network)}[a.param]
        out[a.name] = v
    out.update(trainer.run_args)
    return out
