"""Moved to :mod:`tilewright.templates.metal.check`.

The Metal host syntax check belongs to the language's folder; this path is kept for one release (a
DeprecationWarning).
"""

from tilewright._moved import alias

alias(__name__, "tilewright.templates.metal.check")
