"""The dynamic-shape policy: which sizes a problem with a run-time-varying dimension is tuned at.

A dimension marked dynamic (``problem.dynamic``; a GEMM's M = tokens, usually) is tuned per *bucket*:
the next power of two at or above the size (1, 2, 4, ..., 1024, ...), never above
``config.bucket_max`` (sizes beyond it share that bucket). Kernels for a dynamic problem are
rendered size-generic (masks on every edge, 64-bit indexing), so every size in a bucket runs
correctly on the bucket's kernel; only its speed was measured at the bucket size.

When buckets are tuned:

* at run time, the first time a size in a new bucket is seen (the generated wrapper dispatches on
  the runtime size, see :mod:`tilewright.compiler.dispatch`);
* at compile time, every bucket from 1 up to the trace-time size's bucket, when
  ``config.pretune_buckets`` is on;
* offline, by ``tilewright warm`` (every bucket up to the largest hint, or up to ``--max-m``),
  so a server never tunes on a request.
"""

from __future__ import annotations

import itertools
from typing import Any

from tilewright._config import config

# the sizes all_buckets expands, in its order: a GEMM's and a grouped GEMM's (other kinds'
# dynamic sizes are bucketed one call at a time, bucket_problem)
DIMS = ("M", "N", "K", "batch")


def bucket(n: int, cap: int | None = None) -> int:
    """The size a dynamic dimension of size ``n`` is tuned at: the next power of two (0 and 1
    stay themselves), at most ``cap`` (default ``config.bucket_max``, itself rounded up to a
    power of two)."""
    if n <= 1:
        return max(n, 0)
    cap = config.bucket_max if cap is None else cap
    top = 1 << (max(cap, 1) - 1).bit_length()
    return min(1 << (n - 1).bit_length(), top)


def buckets_up_to(n: int, cap: int | None = None) -> list[int]:
    """Every bucket from 1 up to ``bucket(n)``: [1, 2, 4, ..., bucket(n)]."""
    top = bucket(max(n, 1), cap)
    out, b = [], 1
    while b <= top:
        out.append(b)
        b *= 2
    return out


def bucket_problem(problem: Any, sizes: dict[str, int]) -> Any:
    """``problem`` (of any kind: its ``dynamic`` and ``with_sizes``) at the buckets of ``sizes``
    for its dynamic dims (static dims keep theirs)."""
    return problem.with_sizes(**{d: bucket(sizes[d]) for d in problem.dynamic if d in sizes})


def all_buckets(problem: Any, upto: dict[str, int] | None = None) -> list[Any]:
    """The problem at every bucket combination of its dynamic dims, each dim from 1 up to the
    bucket of ``upto[dim]`` (default: its current size, the trace-time hint). A static problem
    is returned as it is."""
    dims = [d for d in DIMS if d in problem.dynamic]
    if not dims:
        return [problem]
    upto = upto or {}
    ranges = [buckets_up_to(upto.get(d, getattr(problem, d))) for d in dims]
    return [problem.with_sizes(**dict(zip(dims, combo))) for combo in itertools.product(*ranges)]
