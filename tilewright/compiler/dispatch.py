"""Run-time side of a fused GEMM in the generated wrapper.

A :class:`GemmCall` is what the wrapper calls for one GEMM node. Static problems get their kernel
chosen at compile time. For a problem with a symbolic size the kernel is chosen per *bucket* of
that size (see :mod:`tilewright.autotune.buckets` for the policy: powers of two up to
``config.bucket_max``), and every call dispatches on the runtime size to its bucket's kernel.
A bucket is tuned the first time a size in it is seen, or at compile time for every bucket up to
the trace-time size with ``config.pretune_buckets``; the kernel itself is size-generic, so any
size in the bucket runs correctly.
"""

from __future__ import annotations

import math
import threading
from typing import Sequence

import torch

from tilewright._config import config
from tilewright.autotune.buckets import all_buckets, bucket, bucket_problem
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.select import KernelFactory, Launcher, Selection, select_gemm
from tilewright.problem import GemmProblem
from tilewright.runtime.targets import Target

__all__ = ["GemmCall", "bucket"]


def _resolve_view(shape: Sequence[int], numel: int) -> list[int]:
    shape = [int(s) for s in shape]
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return shape


class GemmCall:
    """Callable ``(a, b, *epilogue_inputs, view=None) -> Tensor`` for one fused GEMM.

    Args:
        name: the kernel's name in the wrapper ("gemm_3").
        problem: the problem at its trace-time sizes (``dynamic`` names the symbolic dims).
        spaces: per epilogue input, "gemm" or "view": the shape it broadcasts against.
        target: where it runs.
        factory: builds launchers for candidates.
        fixed: a candidate to use without tuning (unknown targets fall back to ATen this way).
    """

    def __init__(self, name: str, problem: GemmProblem, spaces: Sequence[str], target: Target,
                 factory: KernelFactory, fixed: Candidate | None = None):
        self.name = name
        self.problem = problem
        self.spaces = tuple(spaces)
        self.target = target
        self.factory = factory
        self.fixed = fixed
        self.selections: dict[tuple[int, ...], Selection] = {}
        self._launchers: dict[tuple[int, ...], Launcher] = {}
        self._lock = threading.Lock()

    # -- choosing ---------------------------------------------------------------------------------
    def prepare(self, sizes: dict[str, int] | None = None) -> Selection | None:
        """Choose (tune) the kernel for these sizes (the trace-time ones by default); with
        ``config.pretune_buckets``, first every bucket up to the trace-time sizes."""
        if sizes is None:
            trace = {d: getattr(self.problem, d) for d in ("M", "N", "K", "batch")}
            selection = self.prepare(trace)  # first, so it is the one reports show
            if config.pretune_buckets and self.problem.dynamic:
                for p in all_buckets(self.problem):
                    self.prepare({d: getattr(p, d) for d in ("M", "N", "K", "batch")})
            return selection
        problem = bucket_problem(self.problem, sizes)
        key = tuple(getattr(problem, d) for d in ("M", "N", "K", "batch"))
        with self._lock:
            if key in self._launchers:
                return self.selections.get(key)
        if self.fixed is not None:
            selection = Selection(problem, self.target, self.fixed, reason="fixed", measured=False)
        else:
            selection = select_gemm(problem, self.target, self.factory)
        launch = self.factory.build(problem, selection.winner, self.target)
        with self._lock:
            self.selections[key] = selection
            self._launchers[key] = launch
        return selection

    def _launcher(self, M: int, N: int, K: int, batch: int) -> Launcher:
        if not self.problem.dynamic and len(self._launchers) == 1:
            return next(iter(self._launchers.values()))
        sizes = {"M": M, "N": N, "K": K, "batch": batch}
        key = tuple(bucket(sizes[d]) if d in self.problem.dynamic else getattr(self.problem, d)
                    for d in ("M", "N", "K", "batch"))
        launch = self._launchers.get(key)
        if launch is None:
            self.prepare(sizes)
            launch = self._launchers[key]
        return launch

    # -- running ----------------------------------------------------------------------------------
    def __call__(self, a: torch.Tensor, b: torch.Tensor, *epilogue_inputs: torch.Tensor,
                 view: Sequence[int] | None = None, **scales: torch.Tensor) -> torch.Tensor:
        if self.problem.block_scaled:  # packed (M, K/2) and (N, K/2)
            M, K, N = a.shape[0], a.shape[1] * 2, b.shape[0]
        else:
            M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
        if self.problem.batched:
            batch = max(a.shape[0], b.shape[0])
            gemm_shape: tuple[int, ...] = (batch, M, N)
        else:
            batch, gemm_shape = 1, (M, N)
        launch = self._launcher(M, N, K, batch)
        view_shape = _resolve_view(view, math.prod(gemm_shape)) if view is not None else None
        prepared = [
            e.expand(view_shape).reshape(gemm_shape) if space == "view" else e.expand(gemm_shape)
            for e, space in zip(epilogue_inputs, self.spaces)
        ]
        out = launch(a, b, *prepared, **scales)
        return out.view(view_shape) if view_shape is not None else out

    def __repr__(self) -> str:
        return f"<GemmCall {self.name}: {self.problem.describe()}>"
