"""Moved to :mod:`tilewright.templates.flydsl.gate` (the FlyDSL language's eager dispatch lives in
its folder; ``kernels/`` holds the public ops only); this path is kept for one release (a
DeprecationWarning)."""

from tilewright._moved import alias

alias(__name__, "tilewright.templates.flydsl.gate")
