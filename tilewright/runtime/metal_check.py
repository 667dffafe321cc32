"""Deprecated: the Metal host syntax check lives in its language's folder now,
:mod:`tilewright.templates.metal.check`. Importing this name gives that module itself (so
patching an attribute here patches it there), with a DeprecationWarning, for one release.
"""

import importlib
import sys
import warnings

warnings.warn("tilewright.runtime.metal_check is deprecated; use tilewright.templates.metal.check",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("tilewright.templates.metal.check")
