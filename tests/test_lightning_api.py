"""Lightning conformity (issue 15.5): the signatures of the callbacks and the Trainer arguments ptl shares
with Lightning, against tables written from Lightning 2.6's API documentation
(lightning.ai/docs/pytorch/stable, 2.6.6: lightning.pytorch.callbacks.EarlyStopping, ModelCheckpoint,
LearningRateMonitor and lightning.pytorch.trainer.trainer.Trainer). pytorch-lightning is not installed:
the tables are the reference."""
import inspect

import pytest

import ptl
from ptl import callbacks as cb

P = inspect.Parameter
REQUIRED = P.empty

# name, default, in Lightning 2.6's positional order
EARLY_STOPPING = [("monitor", REQUIRED), ("min_delta", 0.0), ("patience", 3), ("verbose", False), ("mode", "min"),
                  ("strict", True), ("check_finite", True), ("stopping_threshold", None),
                  ("divergence_threshold", None), ("check_on_train_epoch_end", None), ("log_rank_zero_only", False)]
MODEL_CHECKPOINT = [("dirpath", None), ("filename", None), ("monitor", None), ("verbose", False), ("save_last", None),
                    ("save_top_k", 1), ("save_on_exception", False), ("save_weights_only", False), ("mode", "min"),
                    ("auto_insert_metric_name", True), ("every_n_train_steps", None), ("train_time_interval", None),
                    ("every_n_epochs", None), ("save_on_train_epoch_end", None), ("enable_version_counter", True)]
LEARNING_RATE_MONITOR = [("logging_interval", None), ("log_momentum", False), ("log_weight_decay", False)]

# Lightning 2.6's Trainer (keyword-only) arguments that ptl shares, in Lightning's order, with their defaults
TRAINER = [("accelerator", "auto"), ("strategy", "auto"), ("devices", "auto"), ("num_nodes", 1), ("precision", None),
           ("logger", None), ("callbacks", None),
           ("fast_dev_run", False), ("max_epochs", None), ("max_steps", -1), ("max_time", None),
           ("limit_train_batches", None), ("limit_val_batches", None), ("overfit_batches", 0.0),
           ("val_check_interval", None), ("check_val_every_n_epoch", 1), ("num_sanity_val_steps", None),
           ("enable_checkpointing", None), ("enable_progress_bar", None), ("accumulate_grad_batches", 1),
           ("gradient_clip_val", None), ("deterministic", None), ("default_root_dir", None)]
# where ptl keeps Ultralytics' default: name -> ptl's default (the Trainer's docstring says why)
ULTRALYTICS_DEFAULTS = {"accumulate_grad_batches": None, "gradient_clip_val": 10.0}


@pytest.mark.parametrize("cls,table", [(cb.EarlyStopping, EARLY_STOPPING), (cb.ModelCheckpoint, MODEL_CHECKPOINT),
                                       (cb.LearningRateMonitor, LEARNING_RATE_MONITOR)],
                         ids=["EarlyStopping", "ModelCheckpoint", "LearningRateMonitor"])
def test_callback_signature_is_lightnings(cls, table):
    """Lightning's arguments come first, positionally, in its order and with its defaults; ptl's own
    arguments (ModelCheckpoint's monitor_optional, save_weights) are keyword-only after them."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    shared = params[:len(table)]
    assert [(p.name, p.default) for p in shared] == table
    assert all(p.kind is P.POSITIONAL_OR_KEYWORD for p in shared)
    assert all(p.kind is P.KEYWORD_ONLY for p in params[len(table):])


def test_callbacks_positional_calls_mean_what_they_mean_in_lightning():
    es = cb.EarlyStopping("val/box_loss", 0.5)  # issue 15: this was patience 0.5 -> now min_delta
    assert (es.monitor, es.min_delta, es.patience, es.mode) == ("val/box_loss", 0.5, 3, "min")
    ck = cb.ModelCheckpoint("ckpts", "best", "fitness")
    assert (ck.dirpath, ck.filename, ck.monitor, ck.save_top_k, ck.mode) == ("ckpts", "best", "fitness", 1, "min")
    lrm = cb.LearningRateMonitor("step", True)
    assert (lrm.logging_interval, lrm.log_momentum, lrm.log_weight_decay) == ("step", True, False)


def test_trainer_shares_lightnings_arguments():
    """Keyword-only like Lightning's, in its relative order, with its defaults except where ptl keeps
    Ultralytics' (the docstring says so); None defaults that Lightning resolves mean the same here."""
    params = inspect.signature(ptl.Trainer.__init__).parameters
    names = [n for n in params if n != "self"]
    assert all(params[n].kind is P.KEYWORD_ONLY for n in names)
    shared = [n for n in names if n in dict(TRAINER)]
    assert shared == [n for n, _ in TRAINER]  # every one present, in Lightning's order
    for name, lightning in TRAINER:
        assert params[name].default == ULTRALYTICS_DEFAULTS.get(name, lightning), name
    doc = ptl.Trainer.__doc__
    for name in ULTRALYTICS_DEFAULTS:
        assert "``%s=%s``" % (name, ULTRALYTICS_DEFAULTS[name]) in doc and "(Lightning: " in doc


def test_ultralytics_defaults_are_pinned():
    """nominal batch 64 accumulation, clip 10.0, 100 epochs: what the Trainer does with its defaults."""
    tr = ptl.Trainer()
    assert tr.accumulate_grad_batches is None and tr.gradient_clip_val == 10.0
    assert tr.max_epochs is None and tr.max_epochs_effective == ptl.trainer.MAX_EPOCHS == 100  # Lightning: 1000
    assert ptl.optim.OptimConfig().nbs == 64 and ptl.optim.accumulate_steps(16) == 4
    doc = ptl.Trainer.__doc__
    assert "``max_epochs=None`` trains 100 epochs (Lightning: 1000)" in doc
    assert "nominal batch of 64" in doc


def test_lightnings_resolved_defaults():
    """Lightning resolves these None defaults at run time; ptl resolves them the same way."""
    tr = ptl.Trainer()
    assert tr.num_sanity_val_steps == 2 and tr.val_check_interval == 1.0
    assert tr.enable_checkpointing and tr.enable_progress_bar and tr.logger
    assert tr.devices == "auto" and tr.accelerator == "auto" and tr.fast_dev_run is False
    assert tr.default_root_dir and tr.overfit_batches == 0.0


def test_sanity_check_hooks_exist():
    assert {"on_sanity_check_start", "on_sanity_check_end"} <= set(cb.HOOKS)
    for hook in cb.HOOKS:
        assert callable(getattr(cb.Callback, hook))
