"""What each compiled graph did, for the demo, ``tilewright explain`` and debugging.

``collect_reports()`` gathers the :class:`GraphReport` of every graph compiled inside a ``with``
block; :func:`publish` is how the pipeline hands them over.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Iterator

from tilewright._moved import moved_names


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
class KernelReport:
    """One kernel of any kind but GEMM (those have
    :class:`~tilewright.kinds.gemm.report.GemmReport`): a loop kernel
    (pointwise or reduction), a grouped GEMM, ...: what it computes, the kernel chosen, and the
    bytes it moves per call at the trace-time sizes (modelled: each input read and each output
    written once). ``kind`` is the problem kind, ``members`` the loop nodes a loop kernel
    computes (0 for other kinds), ``problem`` the problem's description and ``problem_json``
    its JSON (:func:`tilewright.kinds.problem_from_json` reads it back). Times in ms."""

    node: str
    kind: str
    op: str
    members: int
    winner: str
    reason: str
    bytes: int
    tune_seconds: float = 0.0
    problem: str = ""
    problem_json: dict[str, Any] = field(default_factory=dict)
    winner_ms: float | None = None
    candidates: list[CandidateReport] = field(default_factory=list)
    # the list of GraphReport it goes in (a kind's own report type names its own)
    section: ClassVar[str] = "kernels"


def candidate_reports(selection: Any) -> list[CandidateReport]:
    """Every candidate a :class:`~tilewright.autotune.select.Selection` considered."""
    return [CandidateReport(r.candidate.name, r.record.status, r.record.median_ms, r.record.spread_ms,
                            r.candidate.predicted_ms, r.record.rel_err, r.record.reason, r.from_cache)
            for r in selection.results]


@dataclass
class GraphReport:
    """One compiled FX graph (a forward, backward or inference graph).

    Launch counts are per call of the graph: ``kernel_counts`` the kernels of each problem kind
    ("gemm", "pointwise", "reduction", "grouped_gemm", ...), of which ``gemm_nodes`` GEMM
    kernels and ``loop_kernels`` generated pointwise/reduction kernels; ``extern_ops`` ATen calls
    that launch work (views and tuple accesses are free and not counted); ``aten_dispatches``
    is what one call really makes of ATen calls, once counted (a loop kernel run as PyTorch
    operators is one launch here and several ATen calls there). ``gemms`` reports each
    GEMM, ``kernels`` each kernel of every other kind. ``bytes_moved`` models the memory
    traffic of the compiled graph, ``eager_bytes`` that of running the same graph op by op in
    eager mode.
    """

    graph_id: int
    kind: str
    fx_nodes: int = 0
    gemm_nodes: int = 0
    fused_nodes: int = 0
    extern_nodes: int = 0
    loop_kernels: int = 0
    loop_ops: int = 0
    extern_ops: int = 0
    bytes_moved: int = 0
    eager_bytes: int = 0
    eager_launches: int = 0
    kernel_counts: dict[str, int] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    gemms: list[Any] = field(default_factory=list)  # tilewright.kinds.gemm.report.GemmReport
    kernels: list[KernelReport] = field(default_factory=list)
    fallback: str | None = None
    debug_dir: str | None = None
    # consecutive kernels and whether they overlap with PDL (compiler/pdl.py EdgeDecision)
    pdl_edges: list[dict[str, Any]] = field(default_factory=list)
    # top-level ATen calls one call of the graph makes at run time, counted by the profiler
    # (compiler/dispatches.py: ``counting``); None until counted
    aten_dispatches: int | None = None
    # of those, the calls that ran work (not an output allocation nor a free view:
    # dispatches.does_work): what the launch report counts; None until counted
    aten_work_calls: int | None = None
    # the graph race's outcome once decided (compiler/race.py): each side's median ms, the winner
    race: dict[str, Any] | None = None
    # CUDA graphs (compiler/cudagraphs.py), when asked for: {"status": "refused", "reason"} or
    # {"status": "on", "calls", "warmups", "recordings", "replays", ...}, counted as calls run
    cudagraphs: dict[str, Any] | None = None
    # kernels that failed and run on ATen instead (compiler/fallbacks.py KernelFallback): at
    # compile time, or at run time for one size bucket (appended when it happens, so a report
    # read after later calls shows them)
    kernel_fallbacks: list[Any] = field(default_factory=list)

    @property
    def launches(self) -> int:
        """Kernel launches per call: the kernels of every kind + ATen calls."""
        return sum(self.kernel_counts.values()) + self.extern_ops

    @property
    def generated_kernels(self) -> int:
        """Kernels other than GEMMs (loop kernels, grouped GEMMs, ...) launched per call."""
        return sum(self.kernel_counts.values()) - self.gemm_nodes

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"launches": self.launches}


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
            # by identity: nested blocks' lists hold the same reports and compare equal
            _sinks[:] = [other for other in _sinks if other is not sink]


# the GEMM kind's report, kept here for one release
__getattr__ = moved_names(__name__, {"GemmReport": "tilewright.kinds.gemm.report"})
