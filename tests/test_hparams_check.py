"""ptl.hparams_check: range checks of hyperparameters, optimizer settings and data arguments (issue 18.8),
called directly (the lead wires them into Detector.hparams / OptimConfig / DetectionData)."""
import dataclasses
import math

import pytest

import ptl
from ptl import optim
from ptl.hparams_check import (OPTIMIZERS, check_bool, check_choice, check_data_args, check_float, check_hparams,
                               check_int, check_optim_config)


def test_defaults_pass():
    defaults = {k: getattr(optim.OptimConfig(), k) for k in ptl.Detector.HPARAMS if hasattr(optim.OptimConfig, k)}
    defaults.update(box=7.5, cls=0.5, dfl=1.5)
    assert set(defaults) == set(ptl.Detector.HPARAMS)
    assert check_hparams(defaults) == defaults
    check_optim_config(optim.OptimConfig())
    check_data_args()
    check_data_args(imgsz=32, batch_size=1, workers=0, cache="ram", mosaic=0.0, scale=0.999, perspective=0.1)


def test_every_hyperparameter_has_a_rule():
    assert set(check_hparams.__globals__["_HPARAM_RULES"]) == set(ptl.Detector.HPARAMS)
    fields = {f.name for f in dataclasses.fields(optim.OptimConfig)}
    assert set(check_optim_config.__globals__["_OPTIM_RULES"]) == fields


@pytest.mark.parametrize("key,value", [
    ("lr0", -1e-9), ("lr0", math.nan), ("lr0", math.inf), ("lr0", "0.01"), ("lr0", True),
    ("lrf", 0.0), ("lrf", -0.1), ("lrf", math.nan),
    ("momentum", 1.0), ("momentum", -0.1), ("momentum", math.nan),
    ("weight_decay", -1e-4), ("weight_decay", math.inf),
    ("warmup_epochs", -1.0), ("warmup_momentum", 1.0), ("warmup_bias_lr", -0.1),
    ("nbs", 0), ("nbs", 64.0), ("nbs", True),
    ("cos_lr", 1), ("cos_lr", "yes"),
    ("ema_decay", 0.0), ("ema_decay", 1.0), ("ema_decay", 1.5), ("ema_tau", 0.0), ("ema_tau", -5.0),
    ("box", -1.0), ("cls", math.nan), ("dfl", math.inf),
    ("optimizer", "Adam"), ("optimizer", None), ("optimizer", 3),
])
def test_bad_hyperparameter_names_itself(key, value):
    with pytest.raises(ptl.ConfigError, match="hparams: %s: expected" % key):
        check_hparams({key: value})


def test_unknown_keys_and_types():
    with pytest.raises(ptl.ConfigError, match="unknown key 'lr'"):
        check_hparams({"lr": 0.1})
    with pytest.raises(ptl.ConfigError, match="expected a dict"):
        check_hparams([("lr0", 0.1)])
    assert isinstance(ptl.ConfigError("x"), ValueError)


def test_optimizer_names_fold_case():
    assert check_hparams({"optimizer": "sgd"})["optimizer"] == "SGD"
    assert check_hparams({"optimizer": "AUTO"})["optimizer"] == "auto"
    for name in OPTIMIZERS[1:]:  # every name the checker accepts, the optimizer builds
        cfg = optim.OptimConfig(optimizer=name)
        assert optim.choose_optimizer(cfg)[0] == name


@pytest.mark.parametrize("field,value", [("epochs", 0), ("batch", 0), ("max_norm", -1.0), ("nc", 0),
                                         ("n_train_images", -1), ("lr0", math.nan), ("momentum", 1.0)])
def test_bad_optim_config(field, value):
    cfg = dataclasses.replace(optim.OptimConfig(), **{field: value})
    with pytest.raises(ptl.ConfigError, match="OptimConfig.%s: expected" % field):
        check_optim_config(cfg)


@pytest.mark.parametrize("kw,words", [
    ({"imgsz": 100}, "imgsz"), ({"imgsz": 0}, "imgsz"), ({"imgsz": 64.0}, "imgsz"), ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"), ({"workers": -1}, "workers"), ({"workers": 257}, "workers"),
    ({"cache": "disk"}, "cache"), ({"seed": -1}, "seed"), ({"close_mosaic": -1}, "close_mosaic"),
    ({"val_batch_size": 0}, "val_batch_size"), ({"prefetch": 0}, "prefetch"),
    ({"mosaic": 1.01}, "mosaic"), ({"mosaic": -0.1}, "mosaic"), ({"fliplr": 2}, "fliplr"), ({"flipud": -1}, "flipud"),
    ({"scale": 1.0}, "scale"), ({"translate": 1.5}, "translate"), ({"degrees": 361}, "degrees"),
    ({"shear": 90}, "shear"), ({"hsv_h": math.nan}, "hsv_h"), ({"hsv_s": 1.5}, "hsv_s"), ({"hsv_v": -0.5}, "hsv_v"),
    ({"perspective": 0.2}, "perspective"), ({"mixup": 0.5}, "unknown data argument mixup"),
])
def test_bad_data_argument_names_itself(kw, words):
    with pytest.raises(ptl.ConfigError, match=words):
        check_data_args(**kw)


def test_scalar_helpers():
    assert check_int("n", 3, 1, 5) == 3
    assert check_int("n", None, 1, none_ok=True) is None
    assert check_float("x", 0.5, 0.0, 1.0, lo_open=True) == 0.5
    assert check_bool("b", False) is False
    assert check_choice("c", "max", ("min", "max")) == "max"
    with pytest.raises(ptl.ConfigError, match=r"n: expected an int in \[1, 5\], got 6"):
        check_int("n", 6, 1, 5)
    with pytest.raises(ptl.ConfigError, match=r"x: expected a number in \(0, 1\], got 0"):
        check_float("x", 0, 0.0, 1.0, lo_open=True)
    with pytest.raises(ptl.ConfigError, match=r"seed: expected an int in \[0, 18446744073709551615\]"):
        check_int("seed", -1, 0, 2 ** 64 - 1)
    with pytest.raises(ptl.ConfigError, match="c: expected one of 'min', 'max'"):
        check_choice("c", "MAX", ("min", "max"))
