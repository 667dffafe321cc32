"""Where the problem kinds used to be listed; they are registered in :mod:`tilewright.kinds` now.

Kept so that code importing the old names keeps working: ``KINDS`` (name -> kind, a live view of
the registry), ``kind_of``, ``kind_name``, ``problem_from_json`` and the loop kind's input and
error helpers (:mod:`tilewright.kinds.loop`). New code imports from :mod:`tilewright.kinds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from tilewright.kinds import ProblemKind, get_kind, kind_name, kind_names, kind_of, problem_from_json

# the loop kind's helpers, read from its module when first asked for: a kind module imports the
# autotuner (its layer), so the autotuner imports no kind module at its own import
_LOOP_NAMES = ("DISCRETE_TOLERANCE", "LOOP_TOLERANCE", "LoopInputs", "_loop_error", "_loop_run", "loop_error",
               "make_loop_inputs", "poisoned_loop_outputs", "special_loop_inputs")


def __getattr__(name: str) -> Any:
    if name in _LOOP_NAMES:
        from tilewright.kinds import loop

        return getattr(loop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Registry(Mapping):
    """Kind name -> :class:`~tilewright.kinds.ProblemKind`, read from the registry at each use."""

    def __getitem__(self, name: str) -> ProblemKind:
        return get_kind(name)

    def __iter__(self) -> Iterator[str]:
        return iter(kind_names())

    def __len__(self) -> int:
        return len(kind_names())


KINDS: Mapping[str, Any] = _Registry()

__all__ = ["DISCRETE_TOLERANCE", "KINDS", "LOOP_TOLERANCE", "LoopInputs", "kind_name", "kind_of", "loop_error",
           "make_loop_inputs", "poisoned_loop_outputs", "problem_from_json"]
