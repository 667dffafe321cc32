"""Moved to :mod:`tilewright.kinds.loop.lower` (the loop kind's FX lowering rules); this package
and its modules are kept for one release as the same modules, with a DeprecationWarning."""

from tilewright._moved import alias_package

alias_package(__name__, "tilewright.kinds.loop.lower")
