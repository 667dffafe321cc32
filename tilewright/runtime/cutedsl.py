"""Moved to :mod:`tilewright.templates.cutedsl.runtime`.

The CuTeDSL glue and its AOT compile (``compile_cutedsl``) belong to the language's folder; this path is kept for one release (a
DeprecationWarning).
"""

from tilewright._moved import alias

alias(__name__, "tilewright.templates.cutedsl.runtime")
