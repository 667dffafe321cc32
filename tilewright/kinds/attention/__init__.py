"""The attention kind, one folder: SDPA and FlexAttention forward, backward and decode.

============== ===========================================================================
``problem``    :class:`AttentionProblem` (with :class:`BlockMaskSpec`, :class:`Capture`): what
               the templates and the tuning cache see
``mods``       score_mod / mask_mod as expression IR
``views``      the launcher's calling convention, shared by every language's templates
``reference``  the float64 reference and the ATen fallback's math
``checks``     inputs, poisoned outputs, running a launcher, judging its result
``policy``     candidates and the cost estimate
``lower``      SDPA ops in an FX graph -> problems (``lower_flex``: FlexAttention;
               ``lower_eager``: hand-written softmax(QK^T)V rewritten into one SDPA first)
``kind``       :class:`AttentionKind`, registered once (:data:`tilewright.kinds.BUILTIN`)
============== ===========================================================================

The templates live in the language folders (``templates/triton/attention*``,
``templates/aten/attention.py``). Importing this package imports only the problem, so the
templates (below the autotuner and the compiler) can; ``KIND`` and ``AttentionKind`` load on
first use.
"""

from typing import Any

from tilewright.kinds.attention.problem import AttentionProblem, BlockMaskSpec, Capture


def __getattr__(name: str) -> Any:
    # the kind imports the autotuner: loaded when asked for, never by a template's import
    if name in ("KIND", "AttentionKind"):
        from tilewright.kinds.attention import kind

        return getattr(kind, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AttentionKind", "AttentionProblem", "BlockMaskSpec", "Capture", "KIND"]
