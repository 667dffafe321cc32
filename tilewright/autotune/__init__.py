"""Choosing kernels: candidate policies, the cost model, benchmarking (in-process or in isolated
worker processes), deterministic selection, the tuning cache and its bundles, the dynamic-shape
bucket policy and the offline warmer.

Never renders source and never parses FX: it receives :class:`~tilewright.kinds.gemm.problem.GemmProblem`s
and builds candidates through a :class:`~tilewright.autotune.select.KernelFactory`.
"""

from tilewright.autotune.candidates import Candidate
from tilewright.autotune.select import Selection, select_gemm

__all__ = ["Candidate", "Selection", "select_gemm"]
