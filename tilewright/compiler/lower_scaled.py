"""Moved to :mod:`tilewright.kinds.gemm.lower_scaled`; this path is kept for one release (a DeprecationWarning)."""

from tilewright._moved import alias

alias(__name__, "tilewright.kinds.gemm.lower_scaled")
