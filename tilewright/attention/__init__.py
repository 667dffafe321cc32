"""Attention as a kernel kind: the problem (:mod:`.problem`), its modifications as expression
IR (:mod:`.mods`), the float64 reference and ATen fallback (:mod:`.reference`) and what the
autotuner needs of it (:mod:`.tuning`). Lowering from FX lives in
:mod:`tilewright.compiler.lower_attention`, the kernels in ``templates/triton/attention*``."""

from tilewright.attention.problem import AttentionProblem, BlockMaskSpec, Capture

__all__ = ["AttentionProblem", "BlockMaskSpec", "Capture"]
