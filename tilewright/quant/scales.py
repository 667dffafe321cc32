"""Block-scale layouts as PyTorch's ``F.scaled_mm`` / ``torch._scaled_mm`` take them.

``SwizzleType.NO_SWIZZLE``: the scales of a (rows, K) operand are (rows, K/block) row-major (any
shape with that many elements, read in row-major order), one per block of ``block`` values along
K. This is what ROCm's hipBLASLt path reads.

``SwizzleType.SWIZZLE_32_4_4``: cuBLAS's "1D block scaling factors layout" (the layout
Blackwell's block-scaled MMA reads), which torch builds with
``torch.testing._internal.common_quantized.to_blocked`` and checks by element count in
``torch/_meta_registrations.py`` (``round_up(rows, 128) * round_up(K/block, 4)``). The scale
matrix is padded to a multiple of 128 rows and 4 columns and cut into 128x4 tiles, stored tile
after tile, tiles in row-major order (``tile = (r // 128) * (padded_cols / 4) + c // 4``);
inside a tile, scale (r, c) is byte ``(r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``: 32 lines
of 16 bytes, line i holding rows i, i+32, i+64, i+96, four scales each. The flat tensor has
``round_up(rows, 128) * round_up(cols, 4)`` elements; torch accepts it in any shape with that
count (1-D from ``to_blocked``, or 2-D). :func:`tilewright.quant.nvfp4.swizzle_scales` writes
this layout; :func:`unswizzle` reads it back.
"""

from __future__ import annotations

import torch

from tilewright.errors import InvalidInputError

TILE_ROWS, TILE_COLS = 128, 4


def _round_up(n, m: int):
    return (n + m - 1) // m * m


def swizzled_numel(rows, cols):
    """Elements of a (rows, cols) scale matrix in the SWIZZLE_32_4_4 layout (padded)."""
    return _round_up(rows, TILE_ROWS) * _round_up(cols, TILE_COLS)


def unswizzle(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Row-major (rows, cols) block scales from ``scale`` in the SWIZZLE_32_4_4 layout (module
    docstring), dtype kept (E8M0, E4M3 or their uint8 bytes); the padding is dropped.

    Args:
        scale: the swizzled scales, any shape with :func:`swizzled_numel` elements, contiguous
            (torch requires it); read in flat order.
        rows: rows of the operand (M for A, N for B); cols: scales per row (K / block).

    Raises:
        InvalidInputError: an element count that is not the padded layout's.
    """
    need = swizzled_numel(rows, cols)
    if scale.numel() != need:
        raise InvalidInputError(
            f"SWIZZLE_32_4_4 scales of {rows} rows x {cols} blocks need {need} elements "
            f"(rows padded to 128, blocks to 4), got {scale.numel()} {tuple(scale.shape)}")
    R, C = _round_up(rows, TILE_ROWS), _round_up(cols, TILE_COLS)
    # flat index = ((rt * C/4 + ct) * 32 + r32) * 16 + r4 * 4 + c4 with r = rt*128 + r4*32 + r32
    # and c = ct*4 + c4: undo the nesting, then reorder the axes to (rt, r4, r32, ct, c4)
    tiles = scale.reshape(R // TILE_ROWS, C // TILE_COLS, 32, 4, TILE_COLS)
    full = tiles.permute(0, 3, 2, 1, 4).reshape(R, C)
    return full[:rows, :cols].contiguous()


def rows_of(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Row-major (rows, cols) scales from NO_SWIZZLE ``scale`` (any shape with rows * cols
    elements, read in row-major order).

    Raises:
        InvalidInputError: a different element count.
    """
    if scale.numel() != rows * cols:
        raise InvalidInputError(f"NO_SWIZZLE scales of {rows} rows x {cols} blocks need {rows * cols} "
                                f"elements, got {scale.numel()} {tuple(scale.shape)}")
    return scale.reshape(rows, cols)


# -- grouped GEMMs (F.scaled_grouped_mm, MoE) ------------------------------------------------
# torch's grouped block-scaled GEMM takes, for a 2-D operand whose rows are ragged groups (the
# tokens of each expert, ``offs`` their end offsets), each group's scales swizzled on their own
# and concatenated: group g's (M_g, cols) scales padded to round_up(M_g, 128) rows (an empty
# group adds nothing). Every block is whole 128-row tiles, so the concatenation is the
# SWIZZLE_32_4_4 layout of one (sum_g round_up(M_g, 128), cols) matrix in which group g starts
# at padded row sum_{i<g} round_up(M_i, 128). A 3-D operand (the experts' weights) has one
# swizzled block per expert: (G, round_up(rows, 128) * round_up(cols, 4)).


def _tiles_to_rows(flat: torch.Tensor, cols: int) -> torch.Tensor:
    """The padded row-major (R, round_up(cols, 4)) matrix of SWIZZLE_32_4_4 bytes ``flat``
    whose element count is a whole number of 128x4 tiles per padded row block."""
    C = _round_up(cols, TILE_COLS)
    R = flat.numel() // C
    tiles = flat.reshape(R // TILE_ROWS, C // TILE_COLS, 32, 4, TILE_COLS)
    return tiles.permute(0, 3, 2, 1, 4).reshape(R, C)


def unswizzle_groups(scale: torch.Tensor, offs: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Row-major (rows, cols) scales of a 2-D operand with ragged row groups from torch's
    per-group swizzled layout (the block comment above). ``offs``: the int32 end offsets (G,),
    on the scales' device; read there (searchsorted, cumsum), never on the host, so the call
    does not synchronise. Rows past ``offs[-1]`` belong to no group: their scales are
    unspecified (the GEMM writes no output there).

    Raises:
        InvalidInputError: an element count that is not a whole number of padded 128-row
            blocks of ``round_up(cols, 4)`` scales.
    """
    C = _round_up(cols, TILE_COLS)
    if scale.numel() % (TILE_ROWS * C):
        raise InvalidInputError(
            f"per-group SWIZZLE_32_4_4 scales of {cols} blocks per row come in 128-row tiles of "
            f"{TILE_ROWS * C} elements (each group's rows padded to 128), got {scale.numel()} {tuple(scale.shape)}")
    full = _tiles_to_rows(scale.reshape(-1), cols)
    padded_rows = full.shape[0]
    if rows == 0 or padded_rows == 0:
        return full.new_zeros((rows, cols)) if padded_rows == 0 else full[:0, :cols].contiguous()
    ends = offs.to(torch.int64).clamp(0, rows)
    ends = torch.cummax(ends, 0).values  # out-of-order offsets: later groups empty, as the kernel reads them
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    padded = (ends - starts + TILE_ROWS - 1) // TILE_ROWS * TILE_ROWS
    padded_starts = torch.cumsum(padded, 0) - padded
    r = torch.arange(rows, device=scale.device)
    g = torch.searchsorted(ends, r, right=True).clamp_(max=ends.numel() - 1)
    where = (padded_starts[g] + r - starts[g]).clamp_(0, padded_rows - 1)
    return full[where, :cols].contiguous()


def unswizzle_stacked(scale: torch.Tensor, groups: int, rows: int, cols: int) -> torch.Tensor:
    """(groups, rows, cols) row-major scales of a 3-D operand from one SWIZZLE_32_4_4 block per
    group (any shape with ``groups * swizzled_numel(rows, cols)`` elements, contiguous).

    Raises:
        InvalidInputError: a different element count.
    """
    need = groups * swizzled_numel(rows, cols)
    if scale.numel() != need:
        raise InvalidInputError(
            f"SWIZZLE_32_4_4 scales of {groups} groups x {rows} rows x {cols} blocks need {need} elements "
            f"(each group's rows padded to 128, blocks to 4), got {scale.numel()} {tuple(scale.shape)}")
    full = _tiles_to_rows(scale.reshape(-1), cols)
    return full.reshape(groups, _round_up(rows, TILE_ROWS), -1)[:, :rows, :cols].contiguous()
