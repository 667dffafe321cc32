"""Moved to :mod:`tilewright.kinds.gemm.fuse`; this path is kept for one release (a DeprecationWarning)."""

from tilewright._moved import alias

alias(__name__, "tilewright.kinds.gemm.fuse")
