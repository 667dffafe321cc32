"""What each compiled graph did, for the demo, ``tilewright explain`` and debugging.

``collect_reports()`` gathers the :class:`GraphReport` of every graph compiled inside a ``with``
block; :func:`publish` is how the pipeline hands them over.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator


@dataclass
class CandidateReport:
    name: str
    status: str
    median_ms: float | None
    spread_ms: float | None
    predicted_ms: float | None
    rel_err: float | None
    reason: str
    cached: bool


@dataclass
class GemmReport:
    """One GEMM node: problem, fused epilogue and the kernel chosen. Times in ms."""

    node: str
    op: str
    batch: int
    M: int
    N: int
    K: int
    dtype: str
    out_dtype: str
    epilogue: str
    dynamic: list[str]
    winner: str
    winner_ms: float | None
    reason: str
    candidates: list[CandidateReport] = field(default_factory=list)
    tune_seconds: float = 0.0

    @property
    def tried(self) -> int:
        return len(self.candidates)


@dataclass
class GraphReport:
    """One compiled FX graph (a forward, backward or inference graph)."""

    graph_id: int
    kind: str
    fx_nodes: int = 0
    gemm_nodes: int = 0
    fused_nodes: int = 0
    extern_nodes: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    gemms: list[GemmReport] = field(default_factory=list)
    fallback: str | None = None
    debug_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_lock = threading.Lock()
_sinks: list[list[GraphReport]] = []


def publish(report: GraphReport) -> None:
    with _lock:
        for sink in _sinks:
            sink.append(report)


@contextlib.contextmanager
def collect_reports() -> Iterator[list[GraphReport]]:
    """Collect the report of every graph compiled inside the block."""
    sink: list[GraphReport] = []
    with _lock:
        _sinks.append(sink)
    try:
        yield sink
    finally:
        with _lock:
            _sinks.remove(sink)
