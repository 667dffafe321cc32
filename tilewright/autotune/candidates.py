"""A candidate is one (template, parameters) pair the autotuner may choose for a problem."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

_TILE = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
_SHORT = {"GROUP_M": "g", "num_warps": "w", "num_stages": "s"}


@dataclass(frozen=True)
class Candidate:
    """A template id, its source hash and parameter values, plus the policy's view of it.

    ``rank`` is the policy's order (0 first); ``predicted_ms`` the cost model's estimate when
    there is one. Two candidates are the same when template, hash and params are.
    """

    template_id: str
    template_hash: str
    params: tuple[tuple[str, Any], ...] = ()
    rank: int = 0
    predicted_ms: float | None = None

    @staticmethod
    def of(template_id: str, template_hash: str, params: Mapping[str, Any] | None = None,
           rank: int = 0, predicted_ms: float | None = None) -> "Candidate":
        return Candidate(template_id, template_hash, tuple((params or {}).items()), rank,
                         predicted_ms)

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def backend(self) -> str:
        return self.template_id.split(".", 1)[0]

    @property
    def key(self) -> str:
        """Identity in the tuning cache: template, its source hash and the parameters."""
        return f"{self.template_id}@{self.template_hash}:{json.dumps(dict(self.params), sort_keys=True, separators=(',', ':'))}"

    @property
    def name(self) -> str:
        """Short display name, e.g. ``triton.gemm[64x128x32 g8 w4 s3]``: the tile dims first, in
        M, N, K order whatever order the template's knobs come in (a Helion GEMM lists BLOCK_N
        before BLOCK_M: that read ``x6464x64``), then the other knobs."""
        if not self.params:
            return self.template_id
        params = dict(self.params)
        tile = [str(params.pop(k)) for k in _TILE if k in params]
        parts = ["x".join(tile)] if tile else []
        for k, v in params.items():
            if k == "SPLIT_K":
                parts.append(f"splitk{v}" if v > 1 else "")
            elif k == "SWAP_AB":
                parts.append("swapAB" if v else "")
            elif k == "PDL":
                parts.append("pdl" if v else "")
            else:
                parts.append(f"{_SHORT.get(k, k + '=')}{v}")
        return f"{self.template_id}[{' '.join(p for p in parts if p)}]"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Candidate) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)
