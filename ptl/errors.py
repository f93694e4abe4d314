"""The exceptions and warnings that mean "the input is wrong", as opposed to a bug in ptl.

``ConfigError`` is raised where user input is checked (arguments, hyperparameters, files, checkpoints),
before any work is done on it; its message names the argument or file. ``python -m ptl.train`` prints
exactly these (and argparse's own errors) as one line on stderr and exits with status 2; any other
exception keeps its traceback.
"""

__all__ = ["CheckpointError", "ConfigError", "DivergenceError", "ResumeWarning"]


class ConfigError(ValueError):
    """A bad argument, hyperparameter, setting or input file (the message names it)."""


class CheckpointError(ConfigError):
    """A checkpoint that cannot be resumed: missing, damaged, foreign, or made by another model or setup.
    Raised before anything live (model, optimizer, trainer state) has been changed."""


class DivergenceError(FloatingPointError):
    """Training diverged: a batch's loss, or the weights about to be saved, are NaN or infinite. The fit
    stops before anything is saved from the broken weights (the checkpoints already written are kept).
    Attributes: ``epoch``, ``batch`` (index within the epoch), ``step`` (optimizer steps taken before it),
    ``losses`` (name -> value; None when the weights were caught) and ``tensors`` (the non-finite
    checkpoint tensors; empty when the loss was caught)."""

    def __init__(self, message, epoch, batch, step, losses=None, tensors=()):
        super().__init__(message)
        self.epoch, self.batch, self.step, self.losses, self.tensors = epoch, batch, step, losses, list(tensors)


class ResumeWarning(UserWarning):
    """Resuming does something an uninterrupted run would not (a changed schedule or hyperparameters), or
    there is nothing left to train."""
