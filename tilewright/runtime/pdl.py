"""Moved to :mod:`tilewright.templates.triton.pdl`.

What the installed Triton offers for programmatic dependent launch is the Triton folder's; this
path is kept for one release (a DeprecationWarning).
"""

from tilewright._moved import alias

alias(__name__, "tilewright.templates.triton.pdl")
