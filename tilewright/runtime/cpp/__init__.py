"""Deprecated: the C++ kernels' build driver, kernel cache and CPython launcher live in their
language's folder now, :mod:`tilewright.templates.cpp.runtime`. Importing this name gives that
module itself (so patching an attribute here patches it there), with a DeprecationWarning, for
one release.
"""

import importlib
import sys
import warnings

warnings.warn("tilewright.runtime.cpp is deprecated; use tilewright.templates.cpp.runtime",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("tilewright.templates.cpp.runtime")
