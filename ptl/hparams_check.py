"""Range checks for what users pass in: training hyperparameters, optimizer settings, data arguments.

Each check raises :class:`ptl.errors.ConfigError` (a ValueError) naming the argument, before any work is
done with it. ``check_hparams`` takes ``Detector.hparams``-style dicts, ``check_optim_config`` an
``OptimConfig`` (or its fields as a dict), ``check_data_args`` DetectionData's arguments; the scalar
helpers (``check_int``, ``check_float``, ``check_bool``, ``check_choice``) are shared with the Trainer,
the callbacks and the command line.
"""
import math
import numbers

from .errors import ConfigError

__all__ = ["OPTIMIZERS", "check_bool", "check_choice", "check_data_args", "check_float", "check_hparams",
           "check_int", "check_optim_config"]

OPTIMIZERS = ("auto", "MuSGD", "SGD", "AdamW")  # matched case-insensitively, as optim.choose_optimizer does


def check_int(name, value, lo=None, hi=None, *, none_ok=False):
    """An int (not a bool) in [lo, hi]; returns it."""
    if value is None and none_ok:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError("%s: expected an int%s, got %r" % (name, _range_text(lo, hi, True, True), value))
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError("%s: expected an int%s, got %r" % (name, _range_text(lo, hi, True, True), value))
    return int(value)


def check_float(name, value, lo=None, hi=None, *, lo_open=False, hi_open=False, none_ok=False):
    """A finite real number (not a bool) in the interval given (open ends with lo_open / hi_open)."""
    if value is None and none_ok:
        return value
    text = _range_text(lo, hi, not lo_open, not hi_open)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError("%s: expected a number%s, got %r" % (name, text, value))
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError("%s: expected a finite number%s, got %r" % (name, text, value))
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ConfigError("%s: expected a number%s, got %r" % (name, text, value))
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise ConfigError("%s: expected a number%s, got %r" % (name, text, value))
    return v


def check_bool(name, value):
    if not isinstance(value, bool):
        raise ConfigError("%s: expected True or False, got %r" % (name, value))
    return value


def check_choice(name, value, choices, *, fold_case=False):
    """value is one of choices (compared case-insensitively for strings with fold_case)."""
    for c in choices:
        same = (isinstance(value, str) and isinstance(c, str) and value.lower() == c.lower()) if fold_case else \
            (value == c and type(value) is type(c))
        if same:
            return c
    raise ConfigError("%s: expected one of %s, got %r" % (name, ", ".join(repr(c) for c in choices), value))


def _num(v):
    return str(v) if isinstance(v, int) else "%g" % v


def _range_text(lo, hi, lo_closed, hi_closed):
    if lo is None and hi is None:
        return ""
    if hi is None:
        return " %s %s" % (">=" if lo_closed else ">", _num(lo))
    if lo is None:
        return " %s %s" % ("<=" if hi_closed else "<", _num(hi))
    return " in %s%s, %s%s" % ("[" if lo_closed else "(", _num(lo), _num(hi), "]" if hi_closed else ")")


# name -> check(name, value): Detector.hparams keys (spec §10), then the rest of OptimConfig's fields
_HPARAM_RULES = {
    "optimizer": lambda n, v: check_choice(n, v, OPTIMIZERS, fold_case=True),
    "lr0": lambda n, v: check_float(n, v, 0.0),
    "lrf": lambda n, v: check_float(n, v, 0.0, lo_open=True),
    "momentum": lambda n, v: check_float(n, v, 0.0, 1.0, hi_open=True),
    "weight_decay": lambda n, v: check_float(n, v, 0.0),
    "warmup_epochs": lambda n, v: check_float(n, v, 0.0),
    "warmup_momentum": lambda n, v: check_float(n, v, 0.0, 1.0, hi_open=True),
    "warmup_bias_lr": lambda n, v: check_float(n, v, 0.0),
    "nbs": lambda n, v: check_int(n, v, 1),
    "cos_lr": check_bool,
    "ema_decay": lambda n, v: check_float(n, v, 0.0, 1.0, lo_open=True, hi_open=True),
    "ema_tau": lambda n, v: check_float(n, v, 0.0, lo_open=True),
    "box": lambda n, v: check_float(n, v, 0.0),
    "cls": lambda n, v: check_float(n, v, 0.0),
    "dfl": lambda n, v: check_float(n, v, 0.0),
}
_OPTIM_RULES = dict(_HPARAM_RULES, **{
    "epochs": lambda n, v: check_int(n, v, 1),
    "batch": lambda n, v: check_int(n, v, 1),
    "max_norm": lambda n, v: check_float(n, v, 0.0),
    "nc": lambda n, v: check_int(n, v, 1),
    "n_train_images": lambda n, v: check_int(n, v, 0),
})
_OPTIM_RULES.pop("box"), _OPTIM_RULES.pop("cls"), _OPTIM_RULES.pop("dfl")


def _check_with(rules, values, what, prefix):
    unknown = sorted(set(values) - set(rules))
    if unknown:
        raise ConfigError("%s: unknown key%s %s; expected some of %s" % (
            what, "s" if len(unknown) > 1 else "", ", ".join(map(repr, unknown)), ", ".join(rules)))
    return {k: rules[k](prefix + k, v) for k, v in values.items()}


def check_hparams(hparams):
    """Checks a ``Detector.hparams`` dict (any subset of its keys); returns the values as checked
    (optimizer names in their canonical spelling). Unknown keys are an error."""
    if not isinstance(hparams, dict):
        raise ConfigError("hparams: expected a dict, got %s" % type(hparams).__name__)
    return _check_with(_HPARAM_RULES, hparams, "hparams", "hparams: ")


def check_optim_config(cfg):
    """Checks every field of an ``OptimConfig`` (a dataclass instance or a dict of its fields)."""
    fields = cfg if isinstance(cfg, dict) else {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    return _check_with(_OPTIM_RULES, fields, "OptimConfig", "OptimConfig.")


# DetectionData's augmentation probabilities and ranges (spec §10), inclusive
_AUGMENT_RANGES = {"mosaic": (0.0, 1.0), "fliplr": (0.0, 1.0), "flipud": (0.0, 1.0), "scale": (0.0, 0.999),
                   "translate": (0.0, 1.0), "degrees": (0.0, 360.0), "shear": (0.0, 89.0), "hsv_h": (0.0, 1.0),
                   "hsv_s": (0.0, 1.0), "hsv_v": (0.0, 1.0), "perspective": (0.0, 0.1)}
MAX_WORKERS = 256


def check_data_args(imgsz=640, batch_size=16, workers=8, cache=None, seed=0, close_mosaic=10,
                    val_batch_size=None, prefetch=None, **augment):
    """Checks DetectionData's arguments (the augmentation ones by keyword: mosaic, fliplr, flipud, scale,
    translate, degrees, shear, hsv_h, hsv_s, hsv_v, perspective)."""
    check_int("imgsz", imgsz, 32)
    if imgsz % 32:
        raise ConfigError("imgsz: expected a multiple of 32 (the network's largest stride), got %r" % (imgsz,))
    check_int("batch_size", batch_size, 1)
    check_int("workers", workers, 0, MAX_WORKERS)
    if cache not in (None, False, "ram"):
        raise ConfigError("cache: expected None or 'ram', got %r" % (cache,))
    check_int("seed", seed, 0, 2 ** 64 - 1)
    check_int("close_mosaic", close_mosaic, 0)
    check_int("val_batch_size", val_batch_size, 1, none_ok=True)
    check_int("prefetch", prefetch, 1, none_ok=True)
    unknown = sorted(set(augment) - set(_AUGMENT_RANGES))
    if unknown:
        raise ConfigError("unknown data argument%s %s" % ("s" if len(unknown) > 1 else "", ", ".join(unknown)))
    for k, v in augment.items():
        lo, hi = _AUGMENT_RANGES[k]
        check_float(k, v, lo, hi)
