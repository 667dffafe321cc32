"""Moved to :mod:`tilewright.kinds.grouped_gemm.lower`; this path is kept for one release (a DeprecationWarning)."""

from tilewright._moved import alias

alias(__name__, "tilewright.kinds.grouped_gemm.lower")
