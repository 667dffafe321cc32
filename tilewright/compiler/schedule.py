"""Moved to :mod:`tilewright.kinds.loop.fusion.schedule`; this path is kept for one release (a DeprecationWarning)."""

from tilewright._moved import alias

alias(__name__, "tilewright.kinds.loop.fusion.schedule")
