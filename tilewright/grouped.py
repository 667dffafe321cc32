"""Moved to :mod:`tilewright.kinds.grouped_gemm` (the problem in ``.problem``; inputs, checks
and the float64 reference in ``.checks``); this module re-exports both for one release, with a
DeprecationWarning."""

import warnings

from tilewright.kinds.grouped_gemm.checks import (
    GroupedInputs, error, make_inputs, poisoned_output, reference, run,
)
from tilewright.kinds.grouped_gemm.problem import (
    ALIGN, CASES, GLU_ACTIVATIONS, OFFSET_KINDS, RAGGED, GroupedGemmProblem, broadcast_epilogue_input, case_of,
    group_starts_ends, synthetic_offsets,
)

warnings.warn("tilewright.grouped moved to tilewright.kinds.grouped_gemm (.problem, .checks); import it from "
              "there (tilewright.grouped is removed in the next release)", DeprecationWarning, stacklevel=2)

__all__ = [
    "ALIGN", "CASES", "GLU_ACTIVATIONS", "GroupedGemmProblem", "GroupedInputs", "OFFSET_KINDS", "RAGGED",
    "broadcast_epilogue_input", "case_of", "error", "group_starts_ends", "make_inputs", "poisoned_output",
    "reference", "run", "synthetic_offsets",
]
