"""Moved to :mod:`tilewright.templates.flydsl.launch`.

How a rendered FlyDSL module launches its kernel belongs to the language's folder; this path is
kept for one release (a DeprecationWarning).
"""

from tilewright._moved import alias

alias(__name__, "tilewright.templates.flydsl.launch")
