"""Torch replay of ``flydsl.mx_gemm``'s index and scale math: the numerics proof on a host with
no gfx950 (the kernel compiles here but cannot run).

:func:`emulate` walks the kernel's grid in its grouped tile order and, per workgroup, does what
``mx_gemm.py.jinja`` does with the same formulas (:class:`.mx_gemm.Geometry` supplies every
size): 16-byte loads of A/B K tiles into an LDS byte array through the ``num_stages`` ring, each
lane's operand bytes read back from LDS, its E8M0 scale byte fetched per 32-value K block, the
scaled MFMA applied in the CDNA4 lane layout, and the masked, alpha-scaled, cast stores into a
(poisoned) output. Buffer-descriptor semantics are modelled: a load past the operand's end
reads zeros, a store past the output's end is dropped.

MFMA model (AMD CDNA4 ISA, V_MFMA_SCALE_F32_16X16X128_F8F6F4 with 32-value blocks): lane l
holds row l % 16 of A (column of B) and K values 32*(l // 16) ... +31 in its operand registers
(fp4: byte j = values 2j (low nibble) and 2j+1; fp8: one E4M3 per byte) and one E8M0 scale for
them; ``D[i][j] = C[i][j] + sum_g 2^(sa[i,g]-127) 2^(sb[j,g]-127) sum_e a[i,32g+e] b[j,32g+e]``
in fp32; result register r of lane l is ``D[4*(l // 16) + r][l % 16]``. The nibble order within
a lane is a convention A and B share, so the product does not depend on it; which 32 values a
lane holds, and which scale byte goes with them, does, and that is what this replay checks.

:func:`reference` is the float64 definition (OCP MX v1.0: value * 2^(scale - 127)).
"""

from __future__ import annotations

from typing import Callable

import torch

from tilewright.quant.nvfp4 import e2m1_decode, unpack_e2m1
from tilewright.templates.flydsl.mx_gemm import Geometry

OOB = 0x7FFFFFFF


# -- formats ----------------------------------------------------------------------------------
def decode_values(fmt: str, data: torch.Tensor) -> torch.Tensor:
    """float64 values (..., K) of MX value bytes (..., K / values-per-byte): mxfp4 packed E2M1
    (even index in the low nibble), mxfp8 E4M3."""
    data = data.view(torch.uint8) if data.dtype != torch.uint8 else data
    if fmt == "mxfp4":
        return e2m1_decode(unpack_e2m1(data)).double()
    if fmt == "mxfp8":
        return data.view(torch.float8_e4m3fn).double()
    raise ValueError(f"not an MX format: {fmt!r}")


def decode_scales(scale: torch.Tensor) -> torch.Tensor:
    """float64 2^(e - 127) of E8M0 scale bytes (uint8 or float8_e8m0fnu); 255 is NaN."""
    e = (scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale).double()
    return torch.where(e == 255, torch.full_like(e, float("nan")), torch.exp2(e - 127))


def random_operand(fmt: str, rows: int, K: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (values, scales) for a (rows, K) MX operand: every E2M1 code, or E4M3 from a
    normal draw (never NaN); E8M0 scales 2^-4 ... 2^4. Both uint8."""
    if fmt == "mxfp4":
        data = torch.randint(0, 256, (rows, K // 2), generator=gen, dtype=torch.uint8)
    else:
        data = (torch.randn(rows, K, generator=gen) * 2).to(torch.float8_e4m3fn).view(torch.uint8)
    scale = torch.randint(127 - 4, 127 + 5, (rows, K // 32), generator=gen).to(torch.uint8)
    return data, scale


def reference(fmt: str, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
              alpha: float = 1.0) -> torch.Tensor:
    """float64 ``alpha * dequant(A) @ dequant(B).T``: A (M, K/vpb) with scales (M, K/32), B
    stored (N, K/vpb) with (N, K/32); returns (M, N)."""
    da = decode_values(fmt, a) * decode_scales(sa).repeat_interleave(32, dim=-1)
    db = decode_values(fmt, b) * decode_scales(sb).repeat_interleave(32, dim=-1)
    return alpha * (da @ db.t())


# -- the kernel's index math (each mirrors one formula of mx_gemm.py.jinja) --------------------
def tile_order(g: Geometry, pid: int, M: int, N: int) -> tuple[int, int]:
    """(pid_m, pid_n) of workgroup ``pid``: grouped order, GROUP_M tile rows at a time."""
    tiles_m, tiles_n = -(-M // g.BM), -(-N // g.BN)
    width = g.GROUP_M * tiles_n
    first_m = (pid // width) * g.GROUP_M
    rows = min(tiles_m - first_m, g.GROUP_M)
    return first_m + (pid % width) % rows, (pid % width) // rows


def load_offsets(g: Geometry, tid: torch.Tensor, i: int, row0: int, row_bytes: int, t: int) -> torch.Tensor:
    """Byte offset in A (or B) of 16-byte load ``i`` of each thread for K tile ``t``."""
    c = tid + i * g.threads
    return (row0 + c // g.chunks_per_row) * row_bytes + t * g.row_B + (c % g.chunks_per_row) * 16


def lds_store_offsets(g: Geometry, tid: torch.Tensor, i: int, stage: int, is_b: bool) -> torch.Tensor:
    """LDS byte offset where that load lands (A rows first, then B, padded rows)."""
    c = tid + i * g.threads
    base = stage * g.stage_B + (g.a_buf_B if is_b else 0)
    return base + (c // g.chunks_per_row) * g.lds_row_B + (c % g.chunks_per_row) * 16


def operand_offsets(g: Geometry, lane: torch.Tensor, wave_pos: int, tile: int, ks: int, stage: int,
                    is_b: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(tile row of each lane, LDS byte offset of its LANE_B operand bytes) for MFMA tile
    ``tile`` of the wave at ``wave_pos`` (wm for A, wn for B), K step ``ks``."""
    wave_rows = (g.tn if is_b else g.tm) * 16
    r = wave_pos * wave_rows + tile * 16 + lane % 16
    base = stage * g.stage_B + (g.a_buf_B if is_b else 0)
    return r, base + r * g.lds_row_B + ks * g.step_B + (lane // 16) * g.lane_B


def scale_offset(g: Geometry, lane: torch.Tensor, row: torch.Tensor, scale_cols: int, t: int,
                 ks: int) -> torch.Tensor:
    """Byte offset of each lane's E8M0 scale: its row, K block ``t*BK/32 + 4*ks + lane//16``."""
    return row * scale_cols + t * (g.BK // 32) + ks * 4 + lane // 16


def out_coords(g: Geometry, lane: torch.Tensor, m0: int, n0: int, wm: int, wn: int, mi: int,
               ni: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of result register ``r`` of each lane of MFMA tile (mi, ni)."""
    row = m0 + wm * g.tm * 16 + mi * 16 + (lane // 16) * 4 + r
    col = n0 + wn * g.tn * 16 + ni * 16 + lane % 16
    return row, col


# -- the replay ------------------------------------------------------------------------------
def _buffer_load(flat: torch.Tensor, off: torch.Tensor, nbytes: int) -> torch.Tensor:
    """(lanes, nbytes) bytes at byte offsets ``off``; past the end reads 0 (buffer bound)."""
    idx = off.unsqueeze(-1) + torch.arange(nbytes)
    inside = idx < flat.numel()
    return torch.where(inside, flat[idx.clamp(max=max(flat.numel() - 1, 0))], torch.zeros((), dtype=flat.dtype))


def _lane_values(fmt: str, lane_bytes: torch.Tensor) -> torch.Tensor:
    """(64, 32) float32 values a lane's operand bytes hold, in K order."""
    return decode_values(fmt, lane_bytes).float()


def _scaled_mfma(fmt: str, acc: torch.Tensor, a_bytes, a_scale, b_bytes, b_scale) -> torch.Tensor:
    """V_MFMA_SCALE 16x16x128 on lane-form operands, batched: a_bytes (..., TM, 64, LANE_B)
    with a_scale (..., TM, 64), b likewise with TN; acc and result (..., TM, TN, 64, 4)."""
    lane = torch.arange(64)

    def matrix(byts, scale):  # row i, K 32g + e  <-  lane 16g + i, value e
        v = _lane_values(fmt, byts) * decode_scales(scale).float().unsqueeze(-1)
        return v.unflatten(-2, (4, 16)).transpose(-3, -2).flatten(-2)      # (..., 16, 128)

    A, B = matrix(a_bytes, a_scale), matrix(b_bytes, b_scale)
    D = A.unsqueeze(-3) @ B.unsqueeze(-4).transpose(-1, -2)                # (..., TM, TN, 16, 16)
    rows = (lane // 16)[:, None] * 4 + torch.arange(4)[None, :]           # (64, 4)
    return acc + D[..., rows, (lane % 16)[:, None].expand(64, 4)]


def emulate(g: Geometry, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
            out: torch.Tensor, alpha: float = 1.0,
            epilogue: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
            ) -> torch.Tensor:
    """Run the kernel's schedule in torch: a (M, K/vpb), b (N, K/vpb), scales (rows, K/32), all
    uint8; ``out`` (M, N) is written in place (poison it first to see unwritten elements) and
    returned. ``epilogue(acc, m, n)`` maps fp32 accumulators of elements (m, n) (1-D, one per
    lane) to output values, as the kernel's emitted epilogue does per element; the default
    multiplies by ``alpha``.

    Runs torch single-threaded (restored after): its tensors are a few KiB, and thread
    hand-offs made it 10x slower on a loaded 2-core host.

    Raises:
        AssertionError: the grid misses an output tile.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _emulate(g, a, sa, b, sb, out, epilogue or (lambda acc, m, n: acc * alpha))
    finally:
        torch.set_num_threads(threads)


def _emulate(g: Geometry, a, sa, b, sb, out: torch.Tensor, epilogue) -> torch.Tensor:
    M, N, K = a.shape[0], b.shape[0], a.shape[1] * g.vpb
    row_bytes, scale_cols = K // g.vpb, K // 32
    fa, fb, fsa, fsb = (x.contiguous().view(-1) for x in (a, b, sa, sb))
    fout = out.view(-1)
    tid, lane = torch.arange(g.threads), torch.arange(64)
    tiles_m, tiles_n = -(-M // g.BM), -(-N // g.BN)
    seen = set()
    for pid in range(tiles_m * tiles_n):
        pid_m, pid_n = tile_order(g, pid, M, N)
        seen.add((pid_m, pid_n))
        m0, n0 = pid_m * g.BM, pid_n * g.BN
        lds = torch.zeros(g.lds_B, dtype=torch.uint8)

        def load_tile(t):
            regs = [_buffer_load(fa, load_offsets(g, tid, i, m0, row_bytes, t), 16) for i in range(g.a_loads)]
            return regs + [_buffer_load(fb, load_offsets(g, tid, i, n0, row_bytes, t), 16)
                           for i in range(g.b_loads)]

        def store_tile(regs, stage):
            for i, r in enumerate(regs):
                is_b = i >= g.a_loads
                off = lds_store_offsets(g, tid, i - g.a_loads if is_b else i, stage, is_b)
                lds[off.unsqueeze(-1) + torch.arange(16)] = r

        waves = [(w // g.warps[1], w % g.warps[1]) for w in range(g.num_warps)]
        wms = torch.tensor([w[0] for w in waves]).view(-1, 1, 1)            # (W, 1, 1)
        wns = torch.tensor([w[1] for w in waves]).view(-1, 1, 1)
        accs = torch.zeros(g.num_warps, g.tm, g.tn, 64, 4)
        for s in range(g.stages - 1):
            store_tile(load_tile(s), s)
        for t in range(K // g.BK):
            ahead = load_tile(t + g.stages - 1)
            stage = t % g.stages
            for ks in range(g.ksteps):
                ops = []
                for pos, count, row0, fs, is_b in ((wms, g.tm, m0, fsa, False), (wns, g.tn, n0, fsb, True)):
                    tiles = torch.arange(count).view(1, -1, 1)
                    r, off = operand_offsets(g, lane, pos, tiles, ks, stage, is_b)   # (W, count, 64)
                    byts = lds[off.unsqueeze(-1) + torch.arange(g.lane_B)]
                    sc = _buffer_load(fs, scale_offset(g, lane, row0 + r, scale_cols, t, ks), 1)[..., 0]
                    ops += [byts, sc]
                accs = _scaled_mfma(g.fmt, accs, *ops)
            store_tile(ahead, (t + g.stages - 1) % g.stages)
        for w, (wm, wn) in enumerate(waves):
            for mi in range(g.tm):
                for ni in range(g.tn):
                    for r in range(4):
                        row, col = out_coords(g, lane, m0, n0, wm, wn, mi, ni, r)
                        off = torch.where((row < M) & (col < N), row * N + col, torch.full_like(row, OOB))
                        keep = off < fout.numel()
                        fout[off[keep]] = epilogue(accs[w, mi, ni, keep, r], row[keep], col[keep]).to(out.dtype)
    assert seen == {(i, j) for i in range(tiles_m) for j in range(tiles_n)}, "grid misses output tiles"
    return out
