"""The exceptions and warnings that mean "the input is wrong", as opposed to a bug in ptl.

``ConfigError`` is raised where user input is checked (arguments, hyperparameters, files, checkpoints),
before any work is done on it; its message names the argument or file. ``python -m ptl.train`` prints
exactly these (and argparse's own errors) as one line on stderr and exits with status 2; any other
exception keeps its traceback.
"""

__all__ = ["CheckpointError", "ConfigError", "ResumeWarning"]


class ConfigError(ValueError):
    """A bad argument, hyperparameter, setting or input file (the message names it)."""


class CheckpointError(ConfigError):
    """A checkpoint that cannot be resumed: missing, damaged, foreign, or made by another model or setup.
    Raised before anything live (model, optimizer, trainer state) has been changed."""


class ResumeWarning(UserWarning):
    """Resuming does something an uninterrupted run would not (a changed schedule or hyperparameters), or
    there is nothing left to train."""
