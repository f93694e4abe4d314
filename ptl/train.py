"""Command line of training and validation: ``ptl train`` / ``python -m ptl.train`` and ``ptl val``.

Every argument of :mod:`ptl.arguments` is an option, in either form: ``--imgsz 640`` (``--imgsz=640``,
``--single-cls`` / ``--single_cls``) or Ultralytics' ``imgsz=640``; booleans take ``true`` / ``false``
(``--rect`` alone means true). ``cfg=args.yaml`` (``--cfg``) reads a flat YAML of arguments, such as the
``args.yaml`` of a run folder; the command line overrides it, and it overrides the defaults, which are the
objects' own (``Trainer``, ``DetectionData``, ``OptimConfig``). ``resume=PATH`` (or ``last`` / ``best``)
continues a checkpoint, ``digest=true`` prints the run's digests at the end.

Several devices: ``device=0,1,2,3`` (GPU ordinals) or ``device=cpu devices=2`` (CPU processes),
``num_nodes``; ``batch`` is then the global batch, divided over the ranks as Ultralytics does (it must
divide evenly).

Messages go to stderr through the ``ptl`` logger (INFO; ``verbose=false``: warnings and errors only), one
line each, ``<prog>: <message>``; warnings as ``<prog>: <Category>: <message>``.

Exit status: 0 when the fit ran or the resumed checkpoint had nothing left to train; 2 for a user
error, printed as one line on stderr: argparse's errors, any error raised while the arguments are
turned into data, model and trainer (those checks raise ValueError, TypeError, KeyError or OSError
naming the argument or file), and a ``ptl.ConfigError`` from inside the fit (a bad checkpoint, no
CUDA device). Any other exception is a bug and keeps its traceback.
"""
import argparse
import contextlib
import datetime
import json
import logging
import os
import sys
import warnings

from ptl import arguments
from ptl.errors import ConfigError, yaml_error_line

log = logging.getLogger("ptl.train")
_GROUPS = {"data": "data", "model": "model", "hparams": "model", "trainer": "trainer", "fit": "trainer",
           "cli": "run"}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, "%s: error: %s\n" % (self.prog, message))


def _reader(arg):
    """argparse's type= for an argument: coerce, with its message on failure."""
    def read(text):
        try:
            return arguments.coerce(arg, text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    read.__name__ = arg.kind
    return read


def _shown(value):
    return "none" if value is None else value


def build_parser(command="train", prog=None):
    """The parser of ``command`` ("train" or "val"); every default is argparse.SUPPRESS (only what is given
    ends up in the namespace), the help shows the objects' defaults."""
    p = _Parser(prog=prog or "python -m ptl.%s" % command,
                description="Train a YOLO26 detector with ptl." if command == "train" else
                "Validate a YOLO26 detector with ptl.",
                epilog="Every option also takes Ultralytics' form key=value (imgsz=640, single_cls=true).")
    groups = {}
    for a in arguments.ARGS:
        if command not in a.commands:
            continue
        title = _GROUPS[a.target]
        if title not in groups:
            groups[title] = p.add_argument_group(title)
        flags = ["--" + n.replace("_", "-") for n in (a.name,) + a.aliases]
        d = arguments.default(a)
        kw = {"dest": a.name, "default": argparse.SUPPRESS, "type": _reader(a),
              "help": "%s (%s)" % (a.help, "required" if d is arguments.inspect.Parameter.empty else _shown(d))}
        if a.kind == "bool":
            kw.update(nargs="?", const=True, metavar="BOOL")
        groups[title].add_argument(*flags, **kw)
    return p


def normalize(argv, parser):
    """argv with Ultralytics' ``key=value`` tokens as ``--key=value`` options (``--key value...`` for an
    option of several values, the flag alone or nothing for a true / false switch) and ``_`` in option
    names as ``-``. A key the parser does not know is a ConfigError naming it."""
    options = parser._option_string_actions
    out = []
    takes_value = False  # the previous token is an option still waiting for its value
    for tok in argv:
        if takes_value:
            out.append(tok)
            takes_value = False
        elif tok.startswith("--"):
            flag, eq, value = tok.partition("=")
            flag = flag.replace("_", "-")
            out.append(flag + eq + value)
            action = options.get(flag)
            takes_value = not eq and action is not None and action.nargs is None
        elif "=" in tok and not tok.startswith("-"):
            key, _, value = tok.partition("=")
            flag = "--" + key.replace("_", "-")
            action = options.get(flag)
            if action is None:
                raise ConfigError("unknown argument %r (in %r); see --help" % (key, tok))
            if action.nargs == 0:  # a store_true switch
                if value.strip().lower() in ("1", "true", "yes", "on"):
                    out.append(flag)
                elif value.strip().lower() not in ("0", "false", "no", "off"):
                    raise ConfigError("%s: expected true or false, got %r" % (key, value))
            elif action.nargs in ("+", "*"):
                out += [flag] + value.replace(",", " ").split()
            else:
                out.append(flag + "=" + value)
        else:
            out.append(tok)
    return out


def read_cfg(path, command):
    """The arguments of a flat YAML file (a run's args.yaml): {name: value}. Keys of another command are
    left out; unknown keys and values that do not read are ConfigErrors naming the file."""
    import yaml
    if not os.path.isfile(path):
        raise ConfigError("cfg: %s %s" % (path, "is not a file" if os.path.exists(path) else "does not exist"))
    try:
        with open(path) as f:
            values = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise ConfigError("cfg: " + yaml_error_line(exc, path)) from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError("cfg: %s: expected a mapping of argument names to values, got %s"
                          % (path, type(values).__name__))
    known = arguments.by_name()
    out = {}
    for key, value in values.items():
        a = known.get(str(key))
        if a is None:
            raise ConfigError("cfg: %s: unknown argument %r" % (path, key))
        if command in a.commands and a.target != "cli":
            try:
                out[a.name] = arguments.coerce(a, value)
            except ConfigError as e:
                raise ConfigError("cfg: %s: %s" % (path, e)) from None
    return out


def resolve(argv, command="train", prog=None):
    """(values, given) of a command line: every argument's value (defaults, then cfg, then the command
    line) and the names set by the cfg file or the command line."""
    parser = build_parser(command, prog)
    explicit = vars(parser.parse_args(normalize(argv, parser)))
    from_cfg = read_cfg(explicit["cfg"], command) if explicit.get("cfg") else {}
    values = {a.name: arguments.default(a) for a in arguments.ARGS if command in a.commands}
    values.update(from_cfg)
    values.update(explicit)
    # a cfg file lists every argument: those at their default count as not given (no "ignoring lr0" noise)
    given = {k for k, v in from_cfg.items() if v != arguments.default(arguments.by_name()[k])} | set(explicit)
    if "time" in given and "max_time" in given:
        raise ConfigError("time and max_time: give one of them (both set the time budget)")
    return values, given


# ----------------------------------------------------------------------------------------------- building
def _of(values, target, command="train"):
    return {a.param: values[a.name] for a in arguments.ARGS
            if a.target == target and command in a.commands and a.name in values and a.recorded}


def _check_files(values, command):
    from ptl.hparams_check import check_data_args, check_hparams
    from ptl.runlog import check_run_name
    if values.get("data") in (None, arguments.inspect.Parameter.empty):
        raise ConfigError("data: missing (--data data.yaml or data=data.yaml)")
    data_args = _of(values, "data", command)
    data_args.pop("data")
    check_data_args(**data_args)
    check_hparams({k: v for k, v in _of(values, "hparams", command).items()})
    if command == "train":
        check_run_name(values["name"])
    project = values["project"]
    if project is not None and os.path.exists(project) and not os.path.isdir(project):
        raise ConfigError("--project: %s exists and is not a folder" % project)
    data = values["data"]
    if not isinstance(data, dict) and not os.path.isfile(data):
        raise ConfigError("--data: %s %s" % (data, "is not a file" if os.path.exists(data) else "does not exist"))
    resume = values.get("resume")
    if resume is not None and resume not in ("last", "best") and not os.path.isfile(resume):
        raise ConfigError("--resume: %s %s" % (resume, "is not a file" if os.path.exists(resume)
                                               else "does not exist"))
    model = values["model"]
    if model.endswith((".pt", ".pth", ".safetensors", ".ckpt")) and not os.path.isfile(model):
        raise ConfigError("--model: %s does not exist" % model)


def _world(values, accelerator, devices):
    """The ranks of the job the arguments ask for; the global batch must divide over them."""
    from ptl import distributed
    try:
        world = distributed.planned_world_size(accelerator, devices, values.get("num_nodes", 1))
    except ValueError as exc:
        raise ConfigError("--device %s%s: %s" % (values["device"], " --devices %s" % values["devices"]
                                                  if values["devices"] != "auto" else "", exc)) from None
    if values["batch"] < world or values["batch"] % world:
        raise ConfigError("--batch %d is the batch of all %d ranks: it must be a multiple of %d"
                          % (values["batch"], world, world))
    return world


def _trainer_args(values, command):
    t = _of(values, "trainer", command)
    accelerator, devices = arguments.parse_device(t["accelerator"], t["devices"])
    t.update(accelerator=accelerator, devices=devices, seed=values["seed"])
    if values.get("time") is not None:
        t["max_time"] = datetime.timedelta(hours=values["time"])
    elif values.get("max_time") is not None:
        t["max_time"] = values["max_time"]
    if command == "val":
        t.update(enable_checkpointing=False, logger=False)
    return t


def _build(values, given, command="train"):
    """Data, model and trainer from the arguments; the train loader is made (and its files scanned) here,
    so that a bad dataset is reported as a user error before the fit begins."""
    import ptl
    from ptl.data import DetectionData
    from ptl.engine import _limit
    from ptl.trainer import Trainer

    _check_files(values, command)
    args = _trainer_args(values, command)
    world = _world(values, args["accelerator"], args["devices"])
    trainer = Trainer(**args)
    device = trainer.device
    if values.get("capture_network") and device == "cpu":
        raise ConfigError("--capture-network needs a CUDA device (--device cuda)")
    if values.get("all_reduce_in_graph") and not values.get("capture_network"):
        raise ConfigError("--all-reduce-in-graph records the all-reduce in the network's CUDA graphs: it needs "
                          "--capture-network")
    if device == "cpu" and values["precision"] not in (None, "auto", "32-true", "32", 32):
        raise ConfigError("--precision %s needs CUDA; the CPU trains in 32-true" % values["precision"])
    data_args = _of(values, "data", command)
    data_args["batch_size"] //= world
    data = DetectionData(data_args.pop("data"), **data_args)
    model_arg = values["model"]
    hparams = {k: v for k, v in _of(values, "hparams", command).items() if k in given}
    if model_arg.endswith((".pt", ".pth", ".safetensors", ".ckpt")):  # start from weights (ptl.weights)
        model = _load_model_file(model_arg, data, values["seed"])
        trainer.run_args["model"] = os.path.abspath(model_arg)
    else:
        model = ptl.Detector(model_arg, num_classes=data.num_classes, seed=values["seed"])
    model.hparams = hparams
    if command == "train":
        # the splits are scanned here, so bad data fails before the fit; their caches fill in the fit
        n = len(data.scan("train"))
        if _limit(trainer.limit_train_batches, n, "limit_train_batches") == 0:
            raise ConfigError("--limit-train-batches %s leaves none of the %d training batches"
                              % (values["limit_train_batches"], n))
        try:
            data.scan("val")
        except (ValueError, KeyError):
            pass  # no usable validation split: the fit runs without validation
    else:
        data.scan("val")
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
        raise ConfigError("--model: %s" % one_line(exc)) from None


def one_line(message):
    return " ".join(str(message).split()) or "error"


@contextlib.contextmanager
def cli_logging(prog):
    """While the command runs: the ``ptl`` loggers print ``<prog>: <message>`` lines on stderr (INFO), and
    every warning is one such line, ``<prog>: <Category>: <message>``."""
    logger = logging.getLogger("ptl")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(prog + ": %(message)s"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.showwarning = lambda message, category, *rest, **kw: logger.warning(
                "%s: %s", category.__name__, one_line(message))
            yield logger
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _run(argv, command, prog, body):
    """Parses, builds and runs body(values, data, model, trainer); maps user errors to one line, status 2."""
    with cli_logging(prog) as logger:
        try:
            values, given = resolve(argv, command, prog)
            if not values["verbose"]:
                logger.setLevel(logging.WARNING)
            data, model, trainer = _build(values, given, command)
            return body(values, data, model, trainer)
        except ConfigError as exc:
            print("%s: error: %s" % (prog, one_line(exc)), file=sys.stderr)
            return 2
        except (ValueError, TypeError, KeyError, OSError) as exc:
            if not _before_fit(exc):
                raise
            print("%s: error: %s" % (prog, one_line(exc.args[0] if isinstance(exc, KeyError) and exc.args
                                                     else exc)), file=sys.stderr)
            return 2


def _fit(values, data, model, trainer):
    trainer.fit(model, data, ckpt_path=values["resume"], capture_network=values["capture_network"])
    if trainer.log_dir is None:  # the checkpoint had finished: the ResumeWarning above says so
        return 0
    if trainer.is_global_zero:
        log.info("run folder %s", trainer.log_dir)
    if values["digest"]:
        print(json.dumps(trainer.digest(), indent=1, sort_keys=True))
    return 0


def _validate(values, data, model, trainer):
    metrics = trainer.validate(model, data)[0]
    print(json.dumps(metrics, indent=1, sort_keys=True))
    return 0


def main(argv=None, prog="ptl.train"):
    """Runs the training command line; returns the exit status: 0 done (or nothing left to train), 2 a user
    error (one line on stderr). Any other exception is a bug and keeps its traceback."""
    return _run(sys.argv[1:] if argv is None else list(argv), "train", prog, _fit)


def val_main(argv=None, prog="ptl val"):
    """``ptl val data=... model=best.safetensors``: validates the model (its current weights) and prints the
    metrics as JSON on stdout; exit status as :func:`main`."""
    return _run(sys.argv[1:] if argv is None else list(argv), "val", prog, _validate)


def _before_fit(exc):
    """Whether exc was raised while the arguments were turned into objects (those checks raise
    ValueError, TypeError, KeyError or OSError naming the argument or file) rather than by the fit."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in (_build.__code__, resolve.__code__):
            return True
        tb = tb.tb_next
    return False


if __name__ == "__main__":
    sys.exit(main())
