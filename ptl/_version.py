"""ptl's version: the one place it is written (pyproject.toml reads it for the package metadata)."""
__version__ = "0.1.0"
