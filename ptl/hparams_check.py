"""Range checks for what users pass in: training hyperparameters, optimizer settings, data arguments.

Each check raises :class:`ptl.errors.ConfigError` (a ValueError) naming the argument, before any work is
done with it. ``check_hparams`` takes ``Detector.hparams``-style dicts, ``check_optim_config`` an
``OptimConfig`` (or its fields as a dict), ``check_data_args`` DetectionData's arguments; the scalar
helpers (``check_int``, ``check_float``, ``check_bool``, ``check_choice``) are shared with the Trainer,
the callbacks and the command line.
"""
import math
import numbers
import os

from .errors import ConfigError

__all__ = ["OPTIMIZERS", "check_bool", "check_choice", "check_data_args", "check_float", "check_hparams",
           "check_imgsz_arg", "check_int", "check_optim_config"]

# the optimizer names (matched case-insensitively); optim.choose_optimizer, param_groups and FlatOptimizer read
# them here, "auto" first (the optimizers themselves are the rest)
OPTIMIZERS = ("auto", "MuSGD", "SGD", "AdamW")


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
CACHE_CHOICES = (None, False, True, "ram", "disk")  # True means "ram" (Ultralytics' cache=True)


def check_imgsz_arg(name, value):
    """An image size: an int >= 1 or (h, w) ints >= 1. Rounding up to the stride is DetectionData's (with a
    warning), so any positive size passes here."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ConfigError("%s: expected an int or (h, w), got %r" % (name, value))
        for v in value:
            _check_size(name, v, value)
        return value
    return _check_size(name, value, value)


def _check_size(name, v, whole):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ConfigError("%s: expected an int >= 1 or (h, w) ints >= 1, got %r" % (name, whole))
    return v


def _check_cache(name, value):
    if not any(value is c or (isinstance(c, str) and value == c) for c in CACHE_CHOICES):
        raise ConfigError("%s: expected None, 'ram' or 'disk' (True means 'ram'), got %r" % (name, value))
    return value


def _check_fraction(name, value):
    if isinstance(value, bool) or not (
            (isinstance(value, numbers.Integral) and value >= 1)
            or (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and 0.0 < value <= 1.0)):
        raise ConfigError("%s: expected a float in (0, 1] or an image count >= 1, got %r" % (name, value))
    return value


def _check_path(name, value):
    if value is None:
        return value
    try:
        return os.fspath(value)
    except TypeError:
        raise ConfigError("%s: expected a folder path or None, got %r" % (name, value)) from None


def _check_optional_bool(name, value):
    return value if value is None else check_bool(name, value)


# name -> check(name, value) of every DetectionData argument but ``data`` (read_data_yaml checks that file)
_DATA_RULES = {
    "imgsz": check_imgsz_arg,
    "batch_size": lambda n, v: check_int(n, v, 1),
    "workers": lambda n, v: check_int(n, v, 0, MAX_WORKERS),
    "cache": _check_cache,
    "persistent_workers": check_bool,
    "seed": lambda n, v: check_int(n, v, 0, 2 ** 64 - 1),
    "epochs": lambda n, v: check_int(n, v, 1, none_ok=True),
    "close_mosaic": lambda n, v: check_int(n, v, 0),
    "val_batch_size": lambda n, v: check_int(n, v, 1, none_ok=True),
    "rect_val": check_bool,
    "prefetch": lambda n, v: check_int(n, v, 1, none_ok=True),
    "pin_memory": _check_optional_bool,
    "verbose": check_bool,
    "rect": check_bool,
    "single_cls": check_bool,
    "fraction": _check_fraction,
    "max_pixels": lambda n, v: check_int(n, v, 1, none_ok=True),
    "jpeg_scale_pixels": lambda n, v: check_int(n, v, 0, none_ok=True),
    "allow_empty_labels": check_bool,
    "cache_dir": _check_path,
}
_DATA_RULES.update({k: (lambda lo, hi: lambda n, v: check_float(n, v, lo, hi))(*r) for k, r in _AUGMENT_RANGES.items()})


def check_data_args(**args):
    """Checks any of DetectionData's arguments, given by keyword (``DetectionData.__init__`` and the command
    line both call it: one set of rules). Unknown names are an error. ``imgsz`` not a multiple of 32 passes:
    DetectionData rounds it up with a warning, as Ultralytics does."""
    unknown = sorted(set(args) - set(_DATA_RULES))
    if unknown:
        raise ConfigError("unknown data argument%s %s" % ("s" if len(unknown) > 1 else "", ", ".join(unknown)))
    for k, v in args.items():
        _DATA_RULES[k](k, v)
