"""The decode policy of the CuTeDSL block-scaled sm_100a template: swap-AB (D^T = B A^T, the
operands and their scales trading places, the output stored transposed), 32/64-column tiles
(B's scales read from inside a 128-row scale atom) and split-K (fp32 workspace + a reduce
kernel that runs the epilogue).

CuTeDSL kernels do not run on a CPU, so the mapping is proven by a float64 emulation of the
template's tiling (the persistent walk, the K share of each split, where each tile's scales sit
in the swizzled bytes, the transposed store and the epilogue in the kernel's coordinates) that
must match the float64 reference, and fails when a piece of the mapping is wrong; the kernels
themselves are AOT-compiled for sm_100a and checked for block-scaled tcgen05 MMAs, and run
against float64 on a real sm_100a by the ``gpu`` test."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

import tilewright
from tilewright.autotune.policy import policy_for
from tilewright.errors import InvalidInputError
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.quant import nvfp4
from tilewright.runtime import cutedsl as dsl_runtime
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template
from tilewright.templates.cutedsl.blockscaled_sm100 import decode_tiles, k_tiles_of, sfb_atom

SM100 = get_target("cuda:sm_100a")
BLOCKSCALED = get_template("cutedsl.blockscaled_sm100")

# the ModelOpt linear: both global decode scales as scalar multiplies (alpha), a bias, SiLU and
# a residual: every kind of epilogue input in both orientations
OPS = (EpilogueOp("mul", input=0), EpilogueOp("mul", input=1), EpilogueOp("add", input=2),
       EpilogueOp("silu"), EpilogueOp("add", input=3))
INPUTS = (EpilogueInput("", "fp32"), EpilogueInput("", "fp32"), EpilogueInput("N", "fp32"),
          EpilogueInput("MN", "fp32"))


def decode_problem(M: int, N: int = 4096, K: int = 4096, **kw) -> GemmProblem:
    args = dict(dtype="nvfp4", out_dtype="bf16", layout_b="col", scale_layout="row",
                epilogue=OPS[:2], epilogue_inputs=INPUTS[:2])
    args.update(kw)
    return GemmProblem(M=M, N=N, K=K, **args)


def params(**kw) -> dict:
    p = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 256, "CTA_GROUP": 1, "GROUP_M": 8, "num_warps": 6,
         "num_stages": 4, "SWAP_AB": False, "SPLIT_K": 1, "PDL": False}
    p.update(kw)
    return p


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# -- a float64 emulation of the template's tiling --------------------------------------------------
def tile_of(linear: int, tiles_m: int, tiles_n: int, group_m: int) -> tuple[int, int]:
    """common.jinja's tile_scheduler, in Python."""
    per_group = group_m * tiles_n
    first_m = (linear // per_group) * group_m
    rows = min(tiles_m - first_m, group_m)
    in_group = linear % per_group
    return first_m + in_group % rows, in_group // rows


def scale_rows(swizzled: torch.Tensor, atom: int, word0: int, rows: int, col0: int, cols: int,
               scale_cols: int) -> torch.Tensor:
    """The scales an MMA reads for ``rows`` rows starting ``word0`` TMEM words into 128-row
    scale atom ``atom`` (32 rows per word), scale columns [col0, col0 + cols), from the flat
    128x4 tiled bytes: row r of an atom sits in lane r % 32 of word r // 32, a lane holding 16
    bytes (4 words of 4 scales). Bytes past the tensor read as 0 (TMA fill)."""
    j, c = torch.arange(rows)[:, None], torch.arange(cols)[None, :]
    word, lane, col = word0 + j // 32, j % 32, col0 + c
    atoms = atom + word // 4  # rows past the atom continue in the next one (BLOCK_N = 256)
    padded_cols = -(-scale_cols // 4) * 4
    byte = (atoms * (padded_cols // 4) + col // 4) * 512 + lane * 16 + (word % 4) * 4 + col % 4
    inside = byte < swizzled.numel()
    got = swizzled[byte.clamp(max=swizzled.numel() - 1)].view(torch.float8_e4m3fn).double()
    return torch.where(inside, got, torch.zeros_like(got))


def values(v: torch.Tensor, row0: int, rows: int, k0: int, k1: int) -> torch.Tensor:
    """Decoded E2M1 values ``v`` of rows [row0, row0 + rows) and K [k0, k1), zero past the
    tensor (TMA fill)."""
    out = torch.zeros(rows, k1 - k0, dtype=torch.float64)
    part = v[row0:row0 + rows, k0:k1]
    out[:part.shape[0], :part.shape[1]] = part
    return out


def apply_epilogue(x: torch.Tensor, inputs: list[torch.Tensor], problem: GemmProblem) -> torch.Tensor:
    for op in problem.epilogue:
        other = inputs[op.input] * op.scale if op.input is not None else op.scalar
        if op.kind == "mul":
            x = x * other
        elif op.kind == "add":
            x = x + other
        elif op.kind == "silu":
            x = F.silu(x)
        else:
            raise NotImplementedError(op.kind)
    return x


def emulate(problem: GemmProblem, p: dict, qa: nvfp4.NVFP4Tensor, qb: nvfp4.NVFP4Tensor,
            eps: list[torch.Tensor], out: torch.Tensor, grid: int = 7, sfb_word=None) -> None:
    """What the rendered kernel and its launcher do, tile by tile, in float64 (``sfb_word``
    replaces the B scale offset rule, to show a wrong one is caught)."""
    sfb_word = sfb_word or (lambda tn, bn: sfb_atom(tn, bn)[1])
    M, N, K = problem.M, problem.N, problem.K
    sa = nvfp4.swizzle_scales(qa.scale.view(torch.uint8))  # the launcher's "row" -> 128x4
    sb = nvfp4.swizzle_scales(qb.scale.view(torch.uint8))
    eps = [e.double().expand(M, N) for e in eps]
    dst = out
    if p["SWAP_AB"]:  # the launcher: D^T = B A^T, inputs and the output as transposed views
        qa, qb, sa, sb, M, N = qb, qa, sb, sa, N, M
        eps, dst = [e.t() for e in eps], out.t()
    BM, BN, BK, S = p["BLOCK_M"], p["BLOCK_N"], p["BLOCK_K"], p["SPLIT_K"]
    da, db = (nvfp4.e2m1_decode(nvfp4.unpack_e2m1(q.data)).double() for q in (qa, qb))
    tiles_m, tiles_n = -(-M // BM), -(-N // BN)
    num_tiles, num_k = tiles_m * tiles_n, -(-K // BK)
    sv, scale_cols = nvfp4.BLOCK, K // nvfp4.BLOCK
    work_space = torch.full((S, M, N), float("nan"), dtype=torch.float64)
    for cta in range(grid):  # the persistent walk: CTA i takes items i, i + grid, ...
        for work in range(cta, num_tiles * S, grid):
            tm, tn = tile_of(work % num_tiles, tiles_m, tiles_n, p["GROUP_M"])
            split = work // num_tiles
            acc = torch.zeros(BM, BN, dtype=torch.float64)
            for kt in range(*k_tiles_of(split, num_k, S)):
                k0, k1 = kt * BK, (kt + 1) * BK
                va, vb = values(da, tm * BM, BM, k0, k1), values(db, tn * BN, BN, k0, k1)
                fa = scale_rows(sa, tm, 0, BM, k0 // sv, BK // sv, scale_cols)
                atom = sfb_atom(tn, BN)[0] if BN < 128 else tn * BN // 128
                fb = scale_rows(sb, atom, sfb_word(tn, BN) if BN < 128 else 0, BN, k0 // sv, BK // sv, scale_cols)
                acc += (va * fa.repeat_interleave(sv, 1)) @ (vb * fb.repeat_interleave(sv, 1)).t()
            rows, cols = slice(tm * BM, min((tm + 1) * BM, M)), slice(tn * BN, min((tn + 1) * BN, N))
            part = acc[:rows.stop - rows.start, :cols.stop - cols.start]
            if S == 1:
                x = apply_epilogue(part, [e[rows, cols] for e in eps], problem)
                dst[rows, cols] = x.to(dst.dtype)
            else:
                work_space[split, rows, cols] = part
    if S > 1:  # reduce_kernel: the partials in split order, then the epilogue
        total = work_space[0]
        for s in range(1, S):
            total = total + work_space[s]
        dst.copy_(apply_epilogue(total, eps, problem).to(dst.dtype))


def reference(problem: GemmProblem, qa, qb, eps) -> torch.Tensor:
    prod = nvfp4.dequantize_packed(qa.data, qa.scale, torch.float64) @ \
        nvfp4.dequantize_packed(qb.data, qb.scale, torch.float64).t()
    return apply_epilogue(prod, [e.double().expand(problem.M, problem.N) for e in eps], problem)


def operands(M: int, N: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    qa, qb = nvfp4.quantize(torch.randn(M, K, generator=g)), nvfp4.quantize(torch.randn(N, K, generator=g) * 3)
    eps = [qa.global_scale * 1e3, qb.global_scale, torch.randn(N, generator=g), torch.randn(M, N, generator=g)]
    return qa, qb, eps


EMULATED = [  # (M, N, K, overrides): ragged M, N and K, every tile width, splits that do not divide
    (1, 200, 512, dict(SWAP_AB=True, BLOCK_N=32)),
    (5, 200, 768, dict(SWAP_AB=True, BLOCK_N=64, SPLIT_K=2)),
    (16, 328, 1280, dict(SWAP_AB=True, BLOCK_N=32, SPLIT_K=4)),
    (40, 136, 512, dict(SWAP_AB=True, BLOCK_N=64)),
    (33, 200, 768, dict(SWAP_AB=False, BLOCK_N=32, SPLIT_K=2)),
    (7, 264, 512, dict(SWAP_AB=False, BLOCK_N=64, SPLIT_K=2)),
    (130, 72, 512, dict(SWAP_AB=True, BLOCK_N=256, SPLIT_K=2)),
]


@pytest.mark.parametrize("M,N,K,overrides", EMULATED)
def test_emulated_tiling_of_swap_ab_and_split_k_matches_float64(M, N, K, overrides):
    problem = decode_problem(M, N, K, out_dtype="fp32", epilogue=OPS, epilogue_inputs=INPUTS)
    p = params(**overrides)
    assert BLOCKSCALED.check(p, problem, SM100) is None
    qa, qb, eps = operands(M, N, K)
    out = torch.full((M, N), float("nan"))
    emulate(problem, p, qa, qb, eps, out)
    assert not out.isnan().any()
    assert rel_err(out, reference(problem, qa, qb, eps)) < 1e-6


def test_emulation_catches_a_wrong_scale_offset_or_a_lost_transpose():
    """The emulation can fail: B's scales read from the start of the atom for every tile (the
    128-column rule applied to 32-column tiles), or a swapped kernel storing untransposed."""
    M, N, K = 100, 328, 512  # 4 token tiles of 32 when swapped, 11 weight tiles when not
    problem = decode_problem(M, N, K, out_dtype="fp32", epilogue=OPS, epilogue_inputs=INPUTS)
    qa, qb, eps = operands(M, N, K, seed=1)
    ref = reference(problem, qa, qb, eps)
    out = torch.full((M, N), float("nan"))
    emulate(problem, params(SWAP_AB=True, BLOCK_N=32), qa, qb, eps, out, sfb_word=lambda tn, bn: 0)
    assert rel_err(out, ref) > 0.1
    out = torch.full((M, N), float("nan"))
    emulate(problem, params(SWAP_AB=False, BLOCK_N=32), qa, qb, eps, out, sfb_word=lambda tn, bn: 0)
    assert rel_err(out, ref) > 0.1
    sq = decode_problem(64, 64, K, out_dtype="fp32", epilogue=OPS, epilogue_inputs=INPUTS)
    qa, qb, eps = operands(64, 64, K, seed=2)
    out = torch.full((64, 64), float("nan"))
    emulate(sq, params(SWAP_AB=True, BLOCK_N=64), qa, qb, eps, out.t())  # stored untransposed
    assert rel_err(out, reference(sq, qa, qb, eps)) > 0.1


def test_split_k_shares_cover_k_once():
    for num_k in range(1, 40):
        for s in (1, 2, 3, 4, 8, 16):
            if num_k < s:
                continue
            spans = [k_tiles_of(i, num_k, s) for i in range(s)]
            assert all(b > a for a, b in spans), (num_k, s)  # never an empty split
            assert [k for a, b in spans for k in range(a, b)] == list(range(num_k))
    assert [sfb_atom(tn, 32) for tn in range(5)] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert [sfb_atom(tn, 64) for tn in range(3)] == [(0, 0), (0, 2), (1, 0)]
    assert sfb_atom(3, 128) == (3, 0)


# -- refusals, the policy ----------------------------------------------------------------------------
def test_check_refuses_bad_combinations_with_reasons():
    prob = decode_problem(8, 4096, 512)
    cases = [
        (params(SPLIT_K=4), "K=512 is too short to split 4 ways of BLOCK_K=256"),
        (params(BLOCK_N=64, CTA_GROUP=2), "2-CTA MMAs"),
        (params(SPLIT_K=2, CTA_GROUP=2), "SPLIT_K > 1 runs 1-CTA MMAs"),
        (params(BLOCK_N=16, SWAP_AB=True), "BLOCK_N=16 is not one of"),
        (params(SPLIT_K=3), "SPLIT_K=3 is not one of"),
    ]
    for p, reason in cases:
        why = BLOCKSCALED.check(p, prob, SM100)
        assert why and reason in why, (p, why)
    assert BLOCKSCALED.check(params(SPLIT_K=2, SWAP_AB=True, BLOCK_N=32), prob, SM100) is None


@pytest.mark.parametrize("M", [1, 8, 16, 64, 128])
def test_policy_offers_swap_ab_and_split_k_up_to_m_128(monkeypatch, M):
    monkeypatch.setattr(dsl_runtime, "available", lambda: True)
    problem = decode_problem(M)
    tiles = decode_tiles(problem, SM100, set(BLOCKSCALED.space.names()))
    assert 0 < len(tiles) <= 8
    for swap in (False, True):  # a few per orientation
        assert 0 < sum(t["SWAP_AB"] == swap for t in tiles) <= 4
    with tilewright.config.patch(pdl="off"):
        ranked = policy_for("gemm", SM100).ranked(problem, SM100, BLOCKSCALED)
    got = [p for _, p in ranked]
    assert all(BLOCKSCALED.check(p, problem, SM100) is None for p in got)
    swapped = [p for p in got if p["SWAP_AB"]]
    assert swapped and all(p["BLOCK_N"] >= max(32, M) and p["CTA_GROUP"] == 1 for p in swapped)
    if M <= 16:  # too few tiles for 148 SMs: split-K in both orientations
        assert {p["SWAP_AB"] for p in got if p["SPLIT_K"] > 1} == {False, True}
    if M <= 64:  # the thinnest proposed tile: 32 columns wait for a GPU check of their scale offset
        assert any(p["BLOCK_N"] == 64 for p in swapped) and not any(p["BLOCK_N"] == 32 for p in got)


def test_policy_keeps_the_old_list_beyond_decode(monkeypatch):
    monkeypatch.setattr(dsl_runtime, "available", lambda: True)
    assert decode_tiles(decode_problem(256), SM100, set(BLOCKSCALED.space.names())) == []
    ranked = policy_for("gemm", SM100).ranked(decode_problem(256), SM100, BLOCKSCALED)
    assert ranked and not any(p["SWAP_AB"] or p["SPLIT_K"] > 1 for _, p in ranked)


def test_nvfp4_check_suite_candidates_hold_cutedsl_decode_kernels(monkeypatch):
    """bench/device_check.sh's NVFP4 rows (suite nvfp4-check) tune the policy's candidates: on
    sm_100a the CuTeDSL swap-AB and split-K kernels are among them."""
    from tilewright.perf.suites import suite_problems

    monkeypatch.setattr(dsl_runtime, "available", lambda: True)
    rows = [p for p in suite_problems("nvfp4-check") if p.problem.M == 1]
    split_rows = 0
    for row in rows:
        assert BLOCKSCALED.supports(row.problem, SM100), BLOCKSCALED.supports(row.problem, SM100).reason
        cands = policy_for("gemm", SM100).candidates(row.problem, SM100, [BLOCKSCALED])
        ours = [c.param_dict for c in cands if c.template_id == BLOCKSCALED.id]
        assert any(p["SWAP_AB"] for p in ours), row.name
        # split-K where the grid is short of a wave (not for a 28672-wide gate_up_proj)
        wanted = any(t["SPLIT_K"] > 1 for t in decode_tiles(row.problem, SM100, set(BLOCKSCALED.space.names())))
        assert any(p["SPLIT_K"] > 1 for p in ours) == wanted, row.name
        split_rows += wanted
    assert rows and split_rows


@pytest.mark.parametrize("M", [1, 16])
def test_aot_plan_builds_cutedsl_swap_ab_and_split_k_for_decode(monkeypatch, M):
    """What ``tilewright aot`` builds for an NVFP4 decode GEMM on sm_100a: beside the best
    CuTeDSL setting, its best swap-AB and split-K ones (the issue's "swap-AB block-scaled kernels
    for M <= 16")."""
    from tilewright.compiler import aot
    from tilewright.compiler.capture import CapturedKernel

    monkeypatch.setattr(dsl_runtime, "available", lambda: True)
    kernels, _ = aot.plan([CapturedKernel(decode_problem(M), ["inference.gemm_0"])], [SM100])
    ours = [k for k in kernels if k.template is BLOCKSCALED]
    assert any(k.params["SWAP_AB"] for k in ours) and any(k.params["SPLIT_K"] > 1 for k in ours)
    assert len({k.name for k in ours}) == len(ours)  # SWAP_AB / SPLIT_K are in the names
    swapped = next(k for k in ours if k.params["SWAP_AB"])
    assert "SWAP_AB1" in swapped.name and "SWAP_AB_LAUNCH = True" in swapped.job.source


# -- rendered source -----------------------------------------------------------------------------------
def test_source_swaps_and_splits_as_emulated():
    prob = decode_problem(8, 384, 1024, epilogue=OPS[:3], epilogue_inputs=INPUTS[:3])
    src = BLOCKSCALED.render(prob, params(SWAP_AB=True, BLOCK_N=32, SPLIT_K=2), SM100).source
    # the output is a transposed view; the bias along the user's N is per-row in the kernel
    assert "cute.make_layout((m, n), stride=(1, cute.assume(ldc, divby=OUT_ALIGN)))" in src
    assert "stride=(1, 0)))  # one value per row" in src
    assert "a, b, sfa, sfb, M, N = b, a, sfb, sfa, N, M" in src and "SWAP_AB_LAUNCH = True" in src
    # the K share and the B-scale offset are the ones the emulation proves
    assert "range(split * num_k_tiles // SPLIT_K, (split + 1) * num_k_tiles // SPLIT_K)" in src
    assert "tBgSFB[(None, tn // SFB_TILES_PER_ATOM, kt)]" in src
    assert "(tn % SFB_TILES_PER_ATOM) * SFB_WORDS" in src
    # partials without the epilogue; the reduce adds them and runs it
    assert "def reduce_kernel(" in src and "gCs.store(rAcc.load())" in src
    reduce = src[src.index("def reduce_kernel("):src.index("def gemm_host(")]
    assert "x = x * s0" in reduce and "x = x + rE2.load().to(ACC)" in reduce
    plain = BLOCKSCALED.render(prob, params(), SM100).source
    assert "reduce_kernel" not in plain and "SWAP_AB_LAUNCH = False" in plain
    assert "stride=(cute.assume(ldc, divby=OUT_ALIGN), 1)" in plain


# -- ahead of time for sm_100a ----------------------------------------------------------------------
AOT = [("swap-n32", dict(SWAP_AB=True, BLOCK_N=32)),
       ("swap-n64-split4-pdl", dict(SWAP_AB=True, BLOCK_N=64, SPLIT_K=4, PDL=True)),
       ("plain-n64-split2", dict(BLOCK_N=64, SPLIT_K=2)),
       ("swap-n128-split8", dict(SWAP_AB=True, BLOCK_N=128, SPLIT_K=8))]


@pytest.mark.slow
def test_swap_ab_and_split_k_compile_to_block_scaled_tcgen05(tmp_path):
    pytest.importorskip("cutlass")
    from tilewright.runtime.aot import CompileJob, compile_jobs
    from tilewright.runtime.verify import verify

    prob = decode_problem(8, 384, 4096, epilogue=OPS, epilogue_inputs=INPUTS)
    jobs, meta = [], {}
    with tilewright.config.patch(pdl="auto"):
        for name, over in AOT:
            p = params(**over)
            assert BLOCKSCALED.check(p, prob, SM100) is None, name
            r = BLOCKSCALED.render(prob, p, SM100)
            jobs.append(CompileJob(name, r.source, r.aot.to_json(), SM100.triton))
            meta[name] = p
    for res in compile_jobs(jobs, tmp_path, workers=2, timeout_s=600):
        assert res.ok, (res.name, res.error[-800:])
        arts = {k: tmp_path / v for k, v in res.artifacts.items()}
        p = meta[res.name]
        v = verify(arts, BLOCKSCALED.expected_instructions(prob, p, SM100))
        assert v.ok, (res.name, v.failures)
        ptx = arts["ptx"].read_text()
        assert re.search(r"tcgen05\.mma\.cta_group::1\.kind::mxf4nvf4\.block_scale\.block16", ptx)
        assert re.search(r"^\.target\s+sm_100a\b", ptx, re.M)
        # split-K builds the reduce kernel beside the GEMM; without it there is none
        assert (re.search(r"\.entry \w*reduce_kernel", ptx) is not None) == (p["SPLIT_K"] > 1), res.name


def test_launcher_swaps_operands_and_refuses_a_short_k():
    """The launcher's arguments fit the compiled host function under swap-AB + split-K (no
    driver here: the compiled function checks count and types), and a K with fewer tiles than
    SPLIT_K is refused by name."""
    pytest.importorskip("cutlass")
    import cuda.bindings.driver as cuda

    M, N, K = 5, 384, 1024
    prob = decode_problem(M, N, K, epilogue=OPS[:3], epilogue_inputs=(*INPUTS[:2], EpilogueInput("N", "bf16")))
    module = load_module(BLOCKSCALED.render(prob, params(SWAP_AB=True, BLOCK_N=32, SPLIT_K=4), SM100).source,
                         name="cutedsl_nvfp4_swap_split", interpret=False)
    qa, qb = nvfp4.quantize(torch.randn(M, K)), nvfp4.quantize(torch.randn(N, K))
    eps = [qa.global_scale, qb.global_scale, torch.randn(N).bfloat16()]
    out = torch.empty(M, N, dtype=torch.bfloat16)
    args, keep = module.host_args(qa.data, qb.data, qa.scale, qb.scale, eps, out, 148, cuda.CUstream(0))
    module.compiled("sm_100a").generate_execution_args(*args)
    # the kernel's A is the user's B (N rows), and sizes are the kernel's (N, M)
    assert torch.equal(keep[0], qb.data) and torch.equal(keep[1], qa.data)
    assert torch.equal(keep[2], nvfp4.swizzle_scales(qb.scale.view(torch.uint8)))
    assert args[-8:-5] == [N, M, K]
    ws = keep[-1]
    assert ws.dtype == torch.float32 and ws.shape == (4, N, 8)  # (SPLIT_K, kernel M, M rounded to 16 bytes)
    short = nvfp4.quantize(torch.randn(M, 512)), nvfp4.quantize(torch.randn(N, 512))
    with pytest.raises(InvalidInputError, match="too short for this kernel's SPLIT_K=4"):
        module.host_args(short[0].data, short[1].data, short[0].scale, short[1].scale, eps, out, 148,
                         cuda.CUstream(0))


# -- on a Blackwell GPU --------------------------------------------------------------------------------
def _sm100_device() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (10, 0)


GPU_CASES = [(1, 4096, 4096, dict(SWAP_AB=True, BLOCK_N=32)),
             (16, 4096, 4096, dict(SWAP_AB=True, BLOCK_N=64, SPLIT_K=4)),
             (5, 1000, 2048, dict(SWAP_AB=True, BLOCK_N=32, SPLIT_K=2, PDL=True)),
             (33, 2048, 1024, dict(BLOCK_N=64, SPLIT_K=2)),
             (100, 776, 3072, dict(SWAP_AB=True, BLOCK_N=128, SPLIT_K=8)),
             (64, 384, 512, dict(BLOCK_N=32))]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,overrides", GPU_CASES)
def test_swap_ab_and_split_k_match_float64_on_sm100(M, N, K, overrides):
    pytest.importorskip("cutlass")
    if not _sm100_device():
        pytest.skip("needs an sm_100a GPU (B200/GB200)")
    problem = decode_problem(M, N, K, out_dtype="bf16", epilogue=OPS,
                             epilogue_inputs=(*INPUTS[:2], EpilogueInput("N", "bf16"), EpilogueInput("MN", "bf16")))
    p = params(**overrides)
    with tilewright.config.patch(pdl="auto"):
        assert BLOCKSCALED.check(p, problem, SM100) is None
    launch = load_module(BLOCKSCALED.render(problem, p, SM100).source, name=f"bs_gpu_{M}_{N}", interpret=False).launch
    qa, qb, eps = operands(M, N, K, seed=M)
    eps = [eps[0], eps[1], eps[2].bfloat16(), eps[3].bfloat16()]
    dev = [e.cuda() for e in eps]
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch(qa.data.cuda(), qb.data.cuda(), *dev, out=out, a_scale=qa.scale.cuda(), b_scale=qb.scale.cuda())
    torch.cuda.synchronize()
    ref = reference(problem, qa, qb, [e.double() for e in eps])
    assert not out.isnan().any()
    assert rel_err(out.cpu(), ref) < 1e-2  # bf16 output
    assert math.isfinite(rel_err(out.cpu(), ref))
