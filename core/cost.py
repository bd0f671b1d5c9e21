"""Moved to `amflow.cost`: the cost model reads the run layout and the step registry, which
are the app's, so it lives in the app layer now.

This alias keeps the old entry points working, with a DeprecationWarning:
`python -m core.cost ...` runs `python -m amflow.cost ...`, and `from core import cost` /
`import core.cost` give the `amflow.cost` module itself. It is looked up by name when used
(importlib), so the base does not import the app; delete this file when no one calls
`core.cost` any more.
"""
from __future__ import annotations

import importlib
import sys
import warnings

warnings.warn("core.cost moved to amflow.cost (python -m amflow.cost); core.cost is an alias",
              DeprecationWarning, stacklevel=2)
_moved = importlib.import_module("amflow.cost")

if __name__ == "__main__":
    raise SystemExit(_moved.main())
sys.modules[__name__] = _moved
