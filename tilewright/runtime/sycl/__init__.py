"""Moved to :mod:`tilewright.templates.sycl.runtime`.

The SYCL runtime (device, kernel compiler, host shim) belong to the language's folder; this path is kept for one release (a
DeprecationWarning).
"""

from tilewright._moved import alias

alias(__name__, "tilewright.templates.sycl.runtime")
