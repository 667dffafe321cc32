"""The GEMM kind's part of a graph's report: :class:`GemmReport`, one GEMM kernel
(:attr:`tilewright.compiler.report.GraphReport.gemms`; the JSON is ``dataclasses.asdict``'s).
It moved here from ``tilewright.compiler.report`` (issue 30: a kind is its folder).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tilewright.compiler.report import CandidateReport


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
    kind: str = ""  # the problem kind, as KernelReport's (set by the kind's report hook)
    # the list of GraphReport it goes in (KernelReport.section)
    section: ClassVar[str] = "gemms"

    @property
    def tried(self) -> int:
        return len(self.candidates)
