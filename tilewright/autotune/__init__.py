"""Choosing kernels: candidate policies, the cost model, benchmarking and the tuning cache.

Never renders source and never parses FX: it receives :class:`~tilewright.problem.GemmProblem`s
and builds candidates through a :class:`~tilewright.autotune.select.KernelFactory`.
"""

from tilewright.autotune.candidates import Candidate
from tilewright.autotune.select import Selection, select_gemm

__all__ = ["Candidate", "Selection", "select_gemm"]
