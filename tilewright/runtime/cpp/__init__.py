"""Moved to :mod:`tilewright.templates.cpp.runtime`.

The C++ kernels' build driver, kernel cache and CPython launcher belong to the language's folder; this path is kept for one release (a
DeprecationWarning).
"""

from tilewright._moved import alias

alias(__name__, "tilewright.templates.cpp.runtime")
