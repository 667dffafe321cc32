"""Deprecated: the SYCL runtime (device, kernel compiler, host shim) lives in its language's
folder now, :mod:`tilewright.templates.sycl.runtime`. Importing this name gives that module
itself (so patching an attribute here patches it there), with a DeprecationWarning, for one
release.
"""

import importlib
import sys
import warnings

warnings.warn("tilewright.runtime.sycl is deprecated; use tilewright.templates.sycl.runtime",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = importlib.import_module("tilewright.templates.sycl.runtime")
