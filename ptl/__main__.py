"""``python -m ptl``: the ``ptl`` command (:mod:`ptl.cli`)."""
import sys

from .cli import main

sys.exit(main())
