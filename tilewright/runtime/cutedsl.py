"""Deprecated: the CuTeDSL glue (and its AOT compile, ``compile_cutedsl``) lives in its
language's folder now, :mod:`tilewright.templates.cutedsl.runtime`. Importing this name gives
that module itself (so patching an attribute here patches it there), with a DeprecationWarning,
for one release.
"""

import importlib
import sys
import warnings

warnings.warn("tilewright.runtime.cutedsl is deprecated; use tilewright.templates.cutedsl.runtime",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("tilewright.templates.cutedsl.runtime")
