"""The exceptions and warnings that mean "the input is wrong", as opposed to a bug in ptl.

``ConfigError`` is raised where user input is checked (arguments, hyperparameters, files, checkpoints),
before any work is done on it; its message names the argument or file. ``python -m ptl.train`` prints
exactly these (and argparse's own errors) as one line on stderr and exits with status 2; any other
exception keeps its traceback.
"""

__all__ = ["CheckpointError", "ConfigError", "NonFiniteLossError", "ResumeWarning"]


class ConfigError(ValueError):
    """A bad argument, hyperparameter, setting or input file (the message names it)."""


class CheckpointError(ConfigError):
    """A checkpoint that cannot be resumed: missing, damaged, foreign, or made by another model or setup.
    Raised before anything live (model, optimizer, trainer state) has been changed."""


class NonFiniteLossError(FloatingPointError):
    """A training batch's loss is NaN or infinite: the weights are no longer usable, so the fit stops
    before anything is saved from them (the checkpoints already written are kept). A non-finite gradient
    shows here too, as the next batch's loss. Attributes: ``epoch``, ``batch`` (index within the epoch),
    ``step`` (optimizer steps taken before it) and ``losses`` (name -> value)."""

    def __init__(self, message, epoch, batch, step, losses):
        super().__init__(message)
        self.epoch, self.batch, self.step, self.losses = epoch, batch, step, losses


class ResumeWarning(UserWarning):
    """Resuming does something an uninterrupted run would not (a changed schedule or hyperparameters), or
    there is nothing left to train."""
