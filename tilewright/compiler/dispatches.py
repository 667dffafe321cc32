"""Counting the ATen calls a compiled graph really makes per call (what the graph report's
launch count cannot see: a loop kernel written as PyTorch operators is one launch in the
kernel graph and many ATen calls at run time).

Every compiled graph's callable is wrapped by :func:`traced`, which costs one flag test per call
until counting is on. :func:`counting` runs a block under the PyTorch profiler (CPU events
only) with the flag set: each graph's calls then run inside a ``record_function`` range of its
own, and every *top-level* ATen call (one whose profiler parent is not itself an ATen op: what
Python called, not what that op called inside) is attributed to the graph whose range holds it.
That is the count the profiler shows for eager code too, so the two compare: the same model run
eagerly under :func:`counting` gives eager's figure.

Of those, ``work_per_graph`` keeps the calls that run work (:func:`does_work`): not an
allocation, and not a view unless it copies inside (``aten::to`` casting, ``reshape`` of a
non-viewable layout): what a launch report counts as an ATen call.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

_state = threading.local()
_LABEL = "tilewright::graph_"


def active() -> bool:
    """Whether :func:`counting` is on in this thread."""
    return _active()


def _active() -> bool:
    return getattr(_state, "on", False)


def traced(fn: Callable[[list], Any], graph_id: int) -> Callable[[list], Any]:
    """``fn`` (a boxed compiled graph) that, while :func:`counting` is on, runs in a profiler
    range naming its graph."""
    label = f"{_LABEL}{graph_id}"

    def call(args: list) -> Any:
        if not getattr(_state, "on", False):  # _active() inlined: one frame less per call
            return fn(args)
        with torch.profiler.record_function(label):
            return fn(args)

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


@dataclass
class DispatchCount:
    """Top-level ATen calls made inside a :func:`counting` block: ``total``, per compiled
    graph id (``per_graph``; calls outside any compiled graph are under -1) and per op name."""

    total: int = 0
    per_graph: Counter = field(default_factory=Counter)
    per_op: Counter = field(default_factory=Counter)
    work_per_graph: Counter = field(default_factory=Counter)  # of those, calls that run work


# uninitialised allocations: the caching allocator hands out memory, no kernel runs
_ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                          "empty_permuted"})


@functools.lru_cache(maxsize=None)
def _aliases(op: str) -> bool:
    """Whether every overload of ``aten::op`` returns views of its inputs (read, not written)."""
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return False
    try:
        schemas = [getattr(packet, o)._schema for o in packet.overloads()]
    except Exception:  # noqa: BLE001 - an op torch cannot describe counts as work
        return False
    return bool(schemas) and all(
        s.returns and all(r.alias_info is not None and not r.alias_info.is_write for r in s.returns)
        for s in schemas)


def does_work(event: Any) -> bool:
    """Whether a profiler event of an ATen call ran work: not an allocation, and not a view
    unless an ATen call inside it does work (a cast through ``aten::to``, a copying reshape)."""
    op = event.name[len("aten::"):] if event.name.startswith("aten::") else event.name
    if op in _ALLOCATIONS:
        return False
    if not _aliases(op):
        return True
    return any(does_work(c) for c in event.cpu_children if c.name.startswith("aten::"))


def _graph_of(event: Any) -> int:
    e = event
    while e is not None:
        if e.name.startswith(_LABEL):
            return int(e.name[len(_LABEL):])
        e = e.cpu_parent
    return -1


def _top_level(event: Any) -> bool:
    if not event.name.startswith("aten::"):
        return False
    p = event.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return False
        p = p.cpu_parent
    return True


@contextlib.contextmanager
def counting(reports: Sequence[Any] = ()) -> Iterator[DispatchCount]:
    """Count the top-level ATen calls made inside the block (see the module docstring). On
    exit, each of ``reports`` (:class:`~tilewright.compiler.report.GraphReport`) gets its
    graph's count in ``aten_dispatches`` and, of those, the calls that ran work in
    ``aten_work_calls``. Run one call of the model inside; the counts are per
    block, so two calls count double.

    Raises:
        RuntimeError: another profiler is already running in this process (torch allows one).
    """
    result = DispatchCount()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _state.on = True
        try:
            yield result
        finally:
            _state.on = False
    for e in prof.events():
        if _top_level(e):
            result.total += 1
            result.per_graph[_graph_of(e)] += 1
            result.per_op[e.name] += 1
            if does_work(e):
                result.work_per_graph[_graph_of(e)] += 1
    for r in reports:
        r.aten_dispatches = result.per_graph.get(r.graph_id, 0)
        r.aten_work_calls = result.work_per_graph.get(r.graph_id, 0)
