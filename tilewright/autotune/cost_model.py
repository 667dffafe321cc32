"""What every kind's cost model shares: :class:`CostEstimate` (a predicted time and what bounds
it), the launch latency of one kernel on a GPU and the Triton interpreter's measured costs.

Each kind's model is in its folder (``kinds/<kind>/cost.py`` or its policy): the GEMM roofline
with tile and wave effects :mod:`tilewright.kinds.gemm.cost`, loop kernels
:mod:`tilewright.kinds.loop.cost`. Their old names here resolve for one release, with a
DeprecationWarning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilewright._moved import moved_names

# the loop kernels' cost model is the loop kind's (its names here are kept for one release)
_MOVED = {name: "tilewright.kinds.loop.cost" for name in (
    "LOOP_BW_EFFICIENCY", "INTERP_PROGRAM_MS", "INTERP_ELEMENT_MS", "LOOP_DESC_EFFICIENCY", "estimate_loop")}
# and the GEMM's is the GEMM kind's
_MOVED.update({name: "tilewright.kinds.gemm.cost" for name in ("estimate_gemm", "roofline_ms", "_mma_efficiency")})

LAUNCH_US = 4.0  # launch + tail latency of one kernel on a GPU, µs
# Triton interpreter, measured: ~3.1 ms per program-step plus ~1.1 ns per tile MAC (numpy)
INTERP_STEP_MS = 3.1
INTERP_MAC_MS = 1.1e-6


@dataclass(frozen=True)
class CostEstimate:
    """Predicted time and what bounds it. Times in ms, rates in TFLOP/s and GB/s."""

    ms: float
    compute_ms: float
    memory_ms: float
    bound: str  # "compute", "memory" or "latency"
    waves: float
    tile_efficiency: float

    @property
    def as_dict(self) -> dict[str, Any]:
        return {"ms": self.ms, "compute_ms": self.compute_ms, "memory_ms": self.memory_ms,
                "bound": self.bound, "waves": self.waves, "tile_efficiency": self.tile_efficiency}


__getattr__ = moved_names(__name__, _MOVED)
