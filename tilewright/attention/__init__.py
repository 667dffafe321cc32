"""Moved to :mod:`tilewright.kinds.attention` (the attention kind's folder); this package and its
modules (``problem``, ``mods``, ``reference``, ``tuning``, now ``checks``) are kept for one
release, each a :func:`tilewright._moved.alias` of its new module, with a DeprecationWarning."""

import warnings

from tilewright.kinds.attention.problem import AttentionProblem, BlockMaskSpec, Capture

warnings.warn("tilewright.attention moved to tilewright.kinds.attention; import it from there "
              "(tilewright.attention is removed in the next release)", DeprecationWarning, stacklevel=2)

__all__ = ["AttentionProblem", "BlockMaskSpec", "Capture"]
