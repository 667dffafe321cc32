"""fp8 e4m3 GEMMs with tensor-wise and row-wise scales, and the grouped GEMM (MoE forward), on
the Metal backend, as far as Linux can prove them: the shaders pass the host syntax check and run
on the host (``tests/metal_host.py``: OS threads, barriers and SIMD-group exchanges in place of a
GPU) into NaN-poisoned outputs, against float64 references built from torch's own decoding
(``float8_e4m3fn`` -> float64) and against ``torch._scaled_mm`` / ``torch._grouped_mm`` on the
CPU.

What this cannot show (no Mac here): Apple's compiler's verdict and speed.
"""

from __future__ import annotations

import pytest
import torch
from metal_host import host_launcher

from tilewright.errors import UnsupportedProblemError
from tilewright.problem import GemmProblem
from tilewright.runtime.metal_check import check_shader
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template, templates_for
from tilewright.grouped import GroupedGemmProblem
from tilewright.problem import EpilogueOp
from tilewright.templates.metal.grouped import MetalGroupedGemm, grouped_gemm_kernel, grouped_mm_reference

MPS = get_target("mps")
GEMM = get_template("metal.gemm")
GEMV = get_template("metal.gemv")
FP8 = torch.float8_e4m3fn


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


# -- fp8 e4m3 -------------------------------------------------------------------------------------
def test_every_e4m3_code_decodes_as_torch_decodes_it():
    """All 256 byte values through the GEMM (K = 1, B = 1.0): the shader's bit-level decode gives
    exactly torch's float8_e4m3fn value, NaN codes NaN, subnormals and +-448 included."""
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(FP8).double()
    p = GemmProblem(M=256, N=1, K=1, dtype="fp8e4m3", out_dtype="fp32", op="scaled_mm")
    params = {"BLOCK_M": 32, "BLOCK_N": 8, "BLOCK_K": 8, "num_warps": 4}
    r = GEMM.render(p, params, MPS)
    check_shader(r.meta["shader"])
    assert "device const uchar* a [[buffer(0)]]" in r.meta["shader"] and "tw_e4m3(a[" in r.meta["shader"]
    mod = host_launcher(r)
    out = mod.launch(codes.view(FP8).view(256, 1), torch.ones(1, 1).to(FP8), out=torch.full((256, 1), 7.0))
    got = out.view(-1).double()
    nan = want.isnan()
    assert nan.sum() == 2 and torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan], want[~nan])
    assert got[0x7E] == 448.0 and got[0x01] == 2.0 ** -9 and got[0x08] == 2.0 ** -6
    # uint8 tensors holding the codes are accepted as well (MPS has no float8 tensors)
    out = mod.launch(codes.view(256, 1), torch.ones(1, 1).to(FP8).view(torch.uint8))
    assert torch.equal(out.view(-1)[~nan].double(), want[~nan])


def _fp8_operands(M: int, N: int, K: int, seed: int):
    """A (M, K) and B (K, N) column-major (B = W.t(), as _scaled_mm wants), spread over e4m3's
    range: normals, subnormals and the largest value +-448."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(M, K, generator=g) * 6).to(FP8)
    w = (torch.randn(N, K, generator=g) * 6).to(FP8)
    flat = a.view(-1)
    flat[0], flat[1], flat[2] = 448.0, -448.0, 2.0 ** -9
    return a, w.t()


def _scaled_problem(M, N, K, out_dtype, rowwise):
    """The GemmProblem of ``torch._scaled_mm`` as ``compiler/lower.py`` builds it, by lowering
    the traced call itself."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tilewright.compiler.capture import gemm_problem
    from tilewright.kinds.gemm.node import GemmNode
    from tilewright.compiler.lower import lower

    a, b = _fp8_operands(M, N, K, 0)
    sa = torch.ones(M, 1) if rowwise else torch.tensor(1.0)
    sb = torch.ones(1, N) if rowwise else torch.tensor(1.0)
    gm = make_fx(lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb, out_dtype=out_dtype))(a, b, sa, sb)
    (node,) = [n for n in lower(gm).nodes if isinstance(n, GemmNode)]
    return gemm_problem(node)


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_fp8_scaled_gemm_matches_float64_and_torch_scaled_mm(rowwise, out_dtype):
    M, N, K = 37, 70, 45  # ragged in every dim: partial tiles and a partial K step
    p = _scaled_problem(M, N, K, out_dtype, rowwise)
    assert (p.dtype, p.op, p.layout_b) == ("fp8e4m3", "scaled_mm", "col")
    assert [e.broadcast for e in p.epilogue_inputs] == (["M", "N"] if rowwise else ["", ""])
    assert [op.kind for op in p.epilogue] == ["mul", "mul"]
    assert GEMM.supports(p, MPS)
    a, b = _fp8_operands(M, N, K, 1)
    g = torch.Generator().manual_seed(2)
    sa = torch.rand(M, 1, generator=g) + 0.25 if rowwise else torch.tensor(0.37)
    sb = torch.rand(1, N, generator=g) + 0.25 if rowwise else torch.tensor(1.9)
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())  # torch's e4m3 decoding, float64
    torch_out = torch._scaled_mm(a, b, sa, sb, out_dtype=out_dtype)
    tol = 1e-2 if out_dtype == torch.bfloat16 else 1e-5
    assert rel(torch_out, ref) < tol
    seeds = GEMM.seed_params(p, MPS)
    for params in seeds[:2]:
        r = GEMM.render(p, params, MPS)
        check_shader(r.meta["shader"])
        out = torch.full((M, N), float("nan"), dtype=out_dtype)
        got = host_launcher(r).launch(a, b, sa.expand(M, N), sb.expand(M, N), out=out)
        assert got is out and not out.isnan().any()
        assert rel(out, ref) < tol, params
    # the decode path too (M <= 8): metal.gemv on the same operands' first rows
    d = _scaled_problem(5, N, K, out_dtype, rowwise)
    assert GEMV.supports(d, MPS)
    r = GEMV.render(d, GEMV.seed_params(d, MPS)[0], MPS)
    check_shader(r.meta["shader"])
    out = host_launcher(r).launch(a[:5], b, (sa[:5] if rowwise else sa).expand(5, N), sb.expand(5, N))
    assert rel(out, ref[:5]) < tol  # a row of the product depends on its own row's scale only


def test_what_the_fp8_gemm_does_not_take_is_refused_with_a_reason():
    e5m2 = GemmProblem(M=8, N=8, K=8, dtype="fp8e5m2")
    assert "fp8e4m3" in GEMM.supports(e5m2, MPS).reason and "ATen" in GEMM.supports(e5m2, MPS).reason
    mx = GemmProblem(M=8, N=8, K=32, dtype="mxfp8", scale_layout="row", layout_b="col")
    assert not GEMM.supports(mx, MPS)
    p = GemmProblem(M=16, N=16, K=16, dtype="fp8e4m3", out_dtype="fp32", op="scaled_mm")
    mod = host_launcher(GEMM.render(p, GEMM.seed_params(p, MPS)[0], MPS))
    with pytest.raises(TypeError, match="float8_e4m3fn .* operands, got torch.bfloat16"):
        mod.launch(torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16())


# -- grouped GEMM ---------------------------------------------------------------------------------
GROUPED = get_template("metal.grouped_gemm")


def test_the_grouped_gemm_is_registered_for_mps_only():
    assert isinstance(GROUPED, MetalGroupedGemm)
    # (aten.grouped_gemm and triton.grouped_gemm serve the graph-lowered problem kind too)
    assert [t.id for t in templates_for("grouped_gemm", "mps") if t.backend == "metal"] == \
        ["metal.grouped_gemm", "metal.grouped_gemv"]  # the tiled kernel and its decode path
    p = GroupedGemmProblem("2d3d", 2, 16, 16, 16, "bf16")
    assert GROUPED.supports(p, MPS)
    assert "mps target only" in GROUPED.supports(p, get_target("h200")).reason
    fp8 = GroupedGemmProblem("2d3d", 1, 8, 8, 8, "fp8e4m3")
    assert "fp32, fp16 and bf16" in GROUPED.supports(fp8, MPS).reason
    assert not GROUPED.supports(GemmProblem(M=8, N=8, K=8, dtype="fp32"), MPS)
    assert not GEMM.supports(p, MPS)  # and the plain GEMM does not take it for a bmm
    # the graph-lowered problem kind's other cases and fused epilogues stay on ATen, with the reason
    assert "2d2d case" in GROUPED.supports(GroupedGemmProblem("2d2d", 2, 16, 16, 16, "bf16"), MPS).reason
    silu = GroupedGemmProblem("2d3d", 2, 16, 16, 16, "bf16", epilogue=(EpilogueOp("silu"),))
    assert "fused epilogue" in GROUPED.supports(silu, MPS).reason


# ragged offsets: an empty first group, a one-token group, an empty group in the middle, groups
# spanning several row tiles and not multiples of any tile, and tokens past the last offset
OFFSETS = [0, 1, 1, 18, 27, 27, 40]


@pytest.mark.parametrize("dtype,layout_b", [("bf16", "col"), ("fp32", "row"), ("fp16", "col")])
def test_grouped_gemm_matches_float64_and_torch_grouped_mm(dtype, layout_b):
    M, K, N, G = 43, 37, 21, len(OFFSETS)
    tdt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dtype]
    g = torch.Generator().manual_seed(4)
    a = torch.randn(M, K, generator=g).to(tdt)
    # a MoE weight is stored (G, N, K) and used transposed: B K-contiguous
    b = (torch.randn(G, N, K, generator=g).to(tdt).transpose(1, 2) if layout_b == "col"
         else torch.randn(G, K, N, generator=g).to(tdt))
    offs = torch.tensor(OFFSETS, dtype=torch.int32)
    ref = grouped_mm_reference(a, b, offs)
    used = OFFSETS[-1]
    if dtype == "bf16":  # torch's own grouped_mm agrees with the reference where it is defined
        # (torch wants 16-byte strides: K zero-padded to 48, which leaves the product as it is)
        a48 = torch.zeros(M, 48, dtype=tdt)
        a48[:, :K] = a
        b48 = torch.zeros(G, N, 48, dtype=tdt)
        b48[:, :, :K] = b.transpose(1, 2)
        assert rel(torch._grouped_mm(a48, b48.transpose(1, 2), offs)[:used], ref[:used]) < 1e-2
    p = GroupedGemmProblem("2d3d", G, M, N, K, dtype, layout_b=layout_b)
    tol = 1e-5 if dtype == "fp32" else 1e-2
    settings = [q for q in GROUPED.seed_params(p, MPS) if GROUPED.check(q, p, MPS) is None]
    settings.append({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 8, "num_warps": 4})  # a 16-row tile
    assert len(settings) >= 3
    for params in settings:
        r = GROUPED.render(p, params, MPS)
        check_shader(r.meta["shader"])
        mod = host_launcher(r)
        out = torch.full((M, N), float("nan"), dtype=tdt)
        got = mod.launch(a, b, offs, out=out)
        assert got is out
        assert not out[:used].isnan().any(), params
        assert out[used:].isnan().all(), "rows past the last offset belong to no group: not written"
        assert rel(out[:used], ref[:used]) < tol, params
        assert out[0].double().allclose(a[0].double() @ b[1].double(), rtol=tol, atol=tol * 10)  # one-token group
        (threads,), (group,) = mod._library.calls[-1]
        slots = -(-M // params["BLOCK_M"]) + G
        assert (threads, group) == (slots * -(-N // params["BLOCK_N"]) * group, params["num_warps"] * 32)
        assert (threads, group) == (r.meta["threads"], r.meta["group_size"])


def test_grouped_gemm_kernel_is_callable_and_refuses_bad_calls():
    p = GroupedGemmProblem("2d3d", 3, 9, 8, 16, "fp32")
    mod = grouped_gemm_kernel(p)
    assert mod.RENDERED.params == GROUPED.seed_params(p, MPS)[0]
    mod.require_metal_runtime = lambda: None
    from metal_host import HostLibrary

    mod._library = HostLibrary(mod.RENDERED)
    a, b = torch.randn(9, 16), torch.randn(3, 16, 8)
    offs = torch.tensor([4, 4, 9], dtype=torch.int32)
    assert rel(mod.launch(a, b, offs), grouped_mm_reference(a, b, offs)) < 1e-5
    # every group empty: nothing written, nothing read out of bounds
    out = mod.launch(a, b, torch.zeros(3, dtype=torch.int32), out=torch.full((9, 8), float("nan")))
    assert out.isnan().all()
    with pytest.raises(ValueError, match=r"offs must be int32 of shape \(3,\).*offs.to\(torch.int32\)"):
        mod.launch(a, b, offs.long())
    with pytest.raises(ValueError, match="K differs"):
        mod.launch(a, torch.randn(3, 15, 8), offs)
    with pytest.raises(UnsupportedProblemError, match="do not split over 8 simdgroups"):
        grouped_gemm_kernel(p, {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 8})


def test_launching_the_grouped_gemm_without_mps_refuses_in_one_line():
    from tilewright.errors import EnvironmentMismatchError

    if torch.backends.mps.is_available():
        pytest.skip("this host has MPS")
    mod = grouped_gemm_kernel(GroupedGemmProblem("2d3d", 3, 9, 8, 16, "bf16"))
    with pytest.raises(EnvironmentMismatchError, match="compile-checked only"):
        mod.launch(torch.randn(9, 16), torch.randn(3, 16, 8), torch.tensor([1, 2, 9], dtype=torch.int32))


# -- the command line lists them --------------------------------------------------------------------
def test_templates_and_explain_list_the_metal_templates(tmp_path, capsys):
    from tilewright.cli.main import main

    assert main(["templates"]) == 0
    out = capsys.readouterr().out
    for tid in ("metal.pointwise", "metal.reduction", "metal.gemm", "metal.gemv", "metal.grouped_gemm",
                "metal.grouped_gemv"):
        assert tid in out
    cache = str(tmp_path / "tuning.json")
    assert main(["explain", "256", "256", "128", "--dtype", "bf16", "--target", "mps", "--cache", cache]) == 0
    out = capsys.readouterr().out
    assert "metal.gemm[" in out and "on mps" in out and "target not local" in out
    assert main(["explain", "4", "256", "128", "--dtype", "bf16", "--target", "mps", "--cache", cache]) == 0
    out = capsys.readouterr().out
    assert "metal.gemv[" in out and "metal.gemm[" in out


def test_the_policy_proposes_metal_fp8_candidates_that_fit():
    from tilewright._config import config
    from tilewright.autotune.policy import policy_for

    with config.patch(force_backend="auto"):
        for M, want in ((5, {"metal.gemm", "metal.gemv"}), (300, {"metal.gemm"})):
            p = _scaled_problem(M, 64, 48, torch.bfloat16, rowwise=True)
            cands = [c for c in policy_for("gemm", MPS).candidates(p, MPS) if c.template_id.startswith("metal.")]
            assert {c.template_id for c in cands} == want
            for c in cands:
                r = get_template(c.template_id).render(p, c.param_dict, MPS)
                assert r.meta["group_size"] <= MPS.max_threads_per_block
                assert r.meta["threadgroup_bytes"] <= MPS.smem_per_block
                check_shader(r.meta["shader"])
