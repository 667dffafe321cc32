"""Torch-form copies of the FlyDSL GEMM kernels' index math, run on the CPU to prove it.

The FlyDSL kernels (``gemm.py.jinja``, ``grouped_gemm.py.jinja``, ``mainloop.py.jinja``) are
compile-checked only here (no AMD GPU). What is ours in them, and can be wrong without the
compiler noticing, is index math: the GROUP_M swizzle of the block id, the group scan over the
end offsets, the A view starting at a group's first row, the operand reads past the edges
(buffer descriptors return 0 past a tensor's end), the K ring (which slab sits in which LDS
buffer when it is read), the epilogue's element walk (``tid + i * THREADS``), the epilogue
inputs' stride math and the edge masks. This module does each of those exactly as the kernels
do, in the same order, with torch ops per workgroup; the MFMA fragment layouts inside
``fx.gemm`` are FlyDSL's and are not emulated (a slab product is ``a @ b.T``).

:func:`dense` and :func:`grouped` return the output and how often each element was written,
so a test can compare against a float64 reference and check every element is written exactly
once (and rows outside every group never).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from tilewright.ir import dtypes
from tilewright.ir.expr import Node, toposort
from tilewright.ir.ops import OPS


@dataclass(frozen=True)
class Tile:
    """The kernel parameters the index math depends on."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 1
    num_stages: int = 2
    num_warps: int = 4

    @property
    def threads(self) -> int:
        return self.num_warps * 64


def buffer_read(flat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A buffer load: elements of ``flat`` at ``index``, 0 at or past its end (the descriptor
    carries the tensor's size in bytes; AMD returns 0 for out-of-range buffer reads)."""
    inside = index < flat.numel()
    return torch.where(inside, flat[index.clamp(max=flat.numel() - 1)], torch.zeros((), dtype=flat.dtype))


def swizzle(pid: int, M: int, N: int, t: Tile) -> tuple[int, int]:
    """The dense kernel's GROUP_M swizzle: block id -> (pid_m, pid_n)."""
    tiles_m = -(-M // t.BLOCK_M)
    tiles_n = -(-N // t.BLOCK_N)
    per_group = t.GROUP_M * tiles_n
    first_m = (pid // per_group) * t.GROUP_M
    group_rows = min(tiles_m - first_m, t.GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


def slab(flat: torch.Tensor, row0: int, rows: int, ld: int, k0: int, bk: int) -> torch.Tensor:
    """A (rows, bk) slab at row ``row0``, column ``k0`` of a row-major operand with ``ld``
    elements a row, read as the DMA reads it (flat offsets, zero past the buffer)."""
    r = torch.arange(rows).view(-1, 1)
    c = torch.arange(bk).view(1, -1)
    return buffer_read(flat, (row0 + r) * ld + k0 + c)


def k_loop(a_flat, a_row0, b_flat, b_row0, K: int, k_tiles: int, t: Tile) -> torch.Tensor:
    """The main loop over a num_stages ring, in the kernel's order: the prologue fills buffers
    0..S-2; iteration kt copies slab kt+S-1 into buffer (kt+S-1) % S, then multiplies the
    slabs in buffer kt % S (INTERLEAVE copies B after the first half-slab's MFMAs: another
    buffer, so what is read does not change). Returns the (BLOCK_M, BLOCK_N) float64
    accumulator."""
    S = t.num_stages
    ring: list = [None] * S
    def copy(k: int) -> None:
        ring[k % S] = (k, slab(a_flat, a_row0, t.BLOCK_M, K, k * t.BLOCK_K, t.BLOCK_K),
                       slab(b_flat, b_row0, t.BLOCK_N, K, k * t.BLOCK_K, t.BLOCK_K))
    acc = torch.zeros(t.BLOCK_M, t.BLOCK_N, dtype=torch.float64)
    for s in range(S - 1):
        copy(s)
    for kt in range(k_tiles):
        copy(kt + S - 1)
        k, a, b = ring[kt % S]
        assert k == kt, f"buffer {kt % S} holds slab {k} when slab {kt} is read"
        acc += a.double() @ b.double().T
    return acc


def eval_epilogue(root: Node, acc: torch.Tensor, load: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """The epilogue IR over ``acc`` (float64 here: this proves indexing, not rounding), the
    input loads coming from ``load(k)`` (already gathered at the elements' (b, m, n))."""
    vals: dict[Node, torch.Tensor] = {}
    for n in toposort([root]):
        if n.op == "acc":
            v = acc
        elif n.op == "const":
            v = torch.tensor(n.arg, dtype=torch.float64 if dtypes.is_float(n.dtype) else torch.int64)
        elif n.op == "load":
            v = load(int(n.arg[0][1:])).double()
        elif n.op == "cast":
            src = vals[n.src[0]]
            v = src.to(dtypes.TORCH[n.dtype]).double() if n.dtype in ("bf16", "fp16") else src
        else:
            v = OPS[n.op].torch(*[vals[s] for s in n.src])
        vals[n] = v
    return vals[root]


def _epilogue_walk(out, writes, acc, row0, col0, row_end, col_end, t: Tile, root, inputs, group):
    """The kernel's epilogue: lane tid takes elements tid + i * THREADS of the tile."""
    e = torch.arange(t.threads).view(-1, 1) + torch.arange(t.BLOCK_M * t.BLOCK_N // t.threads).view(1, -1) * t.threads
    e = e.flatten()
    r, c = e // t.BLOCK_N, e % t.BLOCK_N
    m, n = row0 + r, col0 + c

    def load(k: int) -> torch.Tensor:
        flat, sb, sm, sn = inputs[k]
        return buffer_read(flat, group * sb + m * sm + n * sn)

    v = eval_epilogue(root, acc[r, c], load)
    keep = (m < row_end) & (n < col_end)
    out[m[keep], n[keep]] = v[keep].to(out.dtype)
    writes[m[keep], n[keep]] += 1


def input_strides(shape: Sequence[int], pattern: str) -> dict[str, int]:
    """Strides of a contiguous input of broadcast ``pattern`` over (b, m, n); 0 where it does
    not vary (as the launchers pass them)."""
    strides, size = {}, 1
    for d, s in zip(reversed(pattern), reversed(shape)):
        strides[d] = size
        size *= s
    return {d: strides.get(d, 0) for d in "BMN"}


def dense(a: torch.Tensor, b: torch.Tensor, t: Tile, root: Node, inputs: Sequence[torch.Tensor] = (),
          patterns: Sequence[str] = (), out_dtype: torch.dtype = torch.float32, poison: float = float("nan")):
    """``flydsl.gemm``'s index math: a (M, K), b (N, K), epilogue ``root`` over inputs of
    broadcast ``patterns``. Returns (out (M, N) ``out_dtype``, writes (M, N) int).

    Raises:
        AssertionError: a K-ring slot read before its slab arrived.
    """
    M, K = a.shape
    N = b.shape[0]
    assert K % t.BLOCK_K == 0, "the kernel refuses a K tail"
    out = torch.full((M, N), poison, dtype=out_dtype)
    writes = torch.zeros(M, N, dtype=torch.int32)
    flat_inputs = []
    for x, p in zip(inputs, patterns):
        s = input_strides(x.shape, p)
        flat_inputs.append((x.reshape(-1), s["B"], s["M"], s["N"]))
    grid = -(-M // t.BLOCK_M) * -(-N // t.BLOCK_N)
    for pid in range(grid):
        pid_m, pid_n = swizzle(pid, M, N, t)
        acc = k_loop(a.reshape(-1), pid_m * t.BLOCK_M, b.reshape(-1), pid_n * t.BLOCK_N, K, K // t.BLOCK_K, t)
        _epilogue_walk(out, writes, acc, pid_m * t.BLOCK_M, pid_n * t.BLOCK_N, M, N, t, root, flat_inputs, 0)
    return out, writes


def group_of(t_index: int, offs: Sequence[int], block_m: int) -> tuple[int, int, int]:
    """The grouped kernel's scan: M tile ``t_index`` -> (group, first row, group end); (0, 0, 0)
    past the last tile (that workgroup stores nothing). Same selects, same order."""
    start = seen = b = row0 = row_end = 0
    for g, end in enumerate(offs):
        count = (end - start + block_m - 1) // block_m
        if seen <= t_index < seen + count:
            b, row0, row_end = g, start + (t_index - seen) * block_m, end
        seen += count
        start = end
    return b, row0, row_end


def grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, t: Tile, root: Node,
            inputs: Sequence[torch.Tensor] = (), patterns: Sequence[str] = (),
            out_dtype: torch.dtype = torch.float32, poison: float = float("nan")):
    """``flydsl.grouped_gemm``'s index math: a (T, K) tokens sorted by group, b (G, N, K),
    offs (G,) int32 end offsets. Returns (out (T, N), writes (T, N) int)."""
    T, K = a.shape
    G, N, _ = b.shape
    assert K % t.BLOCK_K == 0, "the kernel refuses a K tail"
    ends = [int(x) for x in offs]
    out = torch.full((T, N), poison, dtype=out_dtype)
    writes = torch.zeros(T, N, dtype=torch.int32)
    flat_inputs = []
    for x, p in zip(inputs, patterns):
        s = input_strides(x.shape, p)
        flat_inputs.append((x.reshape(-1), s["B"], s["M"], s["N"]))
    tiles_n = -(-N // t.BLOCK_N)
    grid = (-(-T // t.BLOCK_M) + G) * tiles_n
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    for pid in range(grid):
        t_index, pid_n = pid // tiles_n, pid % tiles_n
        g, row0, row_end = group_of(t_index, ends, t.BLOCK_M)
        k_tiles = K // t.BLOCK_K if row_end > row0 else 0
        # A starts at the group's first row; B is group g's (N, K) slice of the flat buffer
        acc = k_loop(a_flat[row0 * K:], 0, b_flat[g * N * K:], pid_n * t.BLOCK_N, K, k_tiles, t)
        _epilogue_walk(out, writes, acc, row0, pid_n * t.BLOCK_N, row_end, N, t, root, flat_inputs, g)
    return out, writes
