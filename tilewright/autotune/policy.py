"""The candidate policy of a problem kind: :func:`policy_for` asks the kind
(:meth:`tilewright.kinds.ProblemKind.policy`). Every policy is a
:class:`~tilewright.autotune.policy_base.CandidatePolicy`.

The GEMM policy that lived here (``GemmPolicy``, ``POLICIES``, the seed tiles, ``clamp_tile``)
moved to :mod:`tilewright.kinds.gemm.policy`; its names are still importable from here for one
release, with a DeprecationWarning.
"""

from __future__ import annotations

from tilewright._moved import moved_names
from tilewright.runtime.targets import Target

_MOVED = {name: "tilewright.kinds.gemm.policy" for name in ('GPU_SEEDS', 'DECODE_SEEDS', 'INTERPRETER_SEEDS', 'clamp_tile', 'GemmPolicy', 'POLICIES', '_pow2_at_least')}


def policy_for(op: str, target: Target):
    """The candidate policy for a problem kind ("gemm", "pointwise", "reduction", "grouped_gemm",
    any registered kind) on a target: the kind's own (:meth:`tilewright.kinds.ProblemKind.policy`;
    GEMMs: ``POLICIES`` by target backend, targets without one get ATen only)."""
    from tilewright.kinds import policy_for as kind_policy  # the registry imports the policies

    return kind_policy(op, target)


__getattr__ = moved_names(__name__, _MOVED)
