"""The FlyDSL top-k template (``flydsl.topk``): what it refuses and why, its gfx950 build
(compile-only: 3 compiles, the butterfly's shuffles counted in the ISA, no LDS, no scratch), and
its selection and tie order proven in torch form against ``torch.topk`` on this host."""

from __future__ import annotations

import importlib.util

import re

import pytest
import torch

from tilewright.problem import GemmProblem
from tilewright.templates.flydsl import runtime as fly
from tilewright.runtime.targets import get_target
from tilewright.runtime.verify import verify
from tilewright.templates import get_template, templates_for
from tilewright.templates.flydsl.topk import TopkProblem, order_keys, resource_failures, selection_in_torch

GFX950 = get_target("hip:gfx950")
TOPK = get_template("flydsl.topk")


@pytest.fixture
def toolchain():
    why = fly.toolchain_problem()
    if why:
        pytest.skip(f"FlyDSL compile-only toolchain not ready: {why}")


@pytest.mark.skipif(importlib.util.find_spec("flydsl") is None,
                    reason="flydsl is not installed: these refusals are the ones past the package")
def test_registered_for_hip_and_refuses_with_reasons():
    assert TOPK in templates_for("topk", "hip")
    assert TOPK.supports(TopkProblem(256, 8, "bf16"), GFX950)
    refusals = {
        TopkProblem(257, 8, "bf16"): "257 elements",
        TopkProblem(128, 9, "fp32"): "k=9",
        TopkProblem(4, 5, "fp32"): "k=5",
        TopkProblem(128, 2, "fp64"): "dtype fp64",
        GemmProblem(M=64, N=64, K=64, dtype="bf16"): "TopkProblem only",
    }
    for problem, why in refusals.items():
        s = TOPK.supports(problem, GFX950)
        assert not s and why in s.reason, (problem, s.reason)
    s = TOPK.supports(TopkProblem(64, 2, "fp32"), get_target("hip:gfx942"))
    assert not s and "gfx950" in s.reason
    assert "ROWS=3" in TOPK.check({"ROWS": 3}, TopkProblem(64, 2, "fp32"), GFX950)
    over = resource_failures(lds_bytes=161 * 1024, vgprs=257, agprs=0, scratch_bytes=4)
    assert len(over) == 3 and "LDS" in over[0] and "scratch" in over[1] and "257 VGPRs" in over[2]


def test_render_names_its_arch_and_entry():
    rk = TOPK.render(TopkProblem(100, 6, "fp16", largest=False), {"ROWS": 2}, GFX950)
    assert rk.aot.language == "flydsl" and rk.aot.options == {"gpu_arch": "gfx950"}
    assert "def compile_aot():" in rk.source and "ITEMS = 2" in rk.source and "K = 6" in rk.source
    assert "key = ~key" in rk.source  # smallest-first keys
    assert "key = ~key" not in TOPK.render(TopkProblem(100, 6, "fp16"), {}, GFX950).source


# three compiles: each dtype, both orders, 1/2/4 items per lane and rows per workgroup
BUILDS = [TopkProblem(64, 1, "fp32", largest=False), TopkProblem(100, 6, "fp16"), TopkProblem(256, 8, "bf16")]


@pytest.mark.parametrize("problem", BUILDS, ids=lambda p: f"E{p.E}-k{p.k}-{p.dtype}")
def test_compiles_for_gfx950_with_the_butterfly_in_registers(problem, toolchain, tmp_path):
    rows = {1: 1, 6: 2, 8: 4}[problem.k]
    rk = TOPK.render(problem, {"ROWS": rows}, GFX950)
    src = tmp_path / "kernel.py"
    src.write_text(rk.source)
    res = fly.compile_source(src, "gfx950", tmp_path / "dump")
    assert res.arch == "gfx950" and res.kernel_name.startswith("topk_rows")
    checked = verify({"amdgcn": res.isa_path}, TOPK.expected_instructions(problem, rk.params, GFX950))
    assert checked.ok, checked.failures
    assert resource_failures(res.lds_bytes, res.vgprs, res.agprs, res.scratch_bytes) == []
    assert res.lds_bytes == 0 and res.scratch_bytes == 0 and res.vgprs <= 64
    isa = res.isa
    # k rounds x 6 butterfly steps x (key, column): every shuffle is one cross-lane op, no more
    cross_lane = len(re.findall(r"\b(ds_swizzle_b32|v_permlane(16|32)_swap_b32)", isa))
    assert cross_lane == problem.k * 6 * 2
    assert len(re.findall(r"\bglobal_store_", isa)) == 2 * problem.k  # one value, one index per round


def _rows(n, E, dtype, ties=False):
    if ties:  # few distinct values: many ties, ragged
        return torch.randint(-3, 4, (n, E)).to(dtype)
    return torch.randn(n, E, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("E", [1, 7, 63, 64, 65, 100, 129, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_form_selects_what_torch_topk_selects(E, dtype):
    g = torch.Generator().manual_seed(E)
    if dtype == torch.float32:
        x = torch.randn(9, E, generator=g, dtype=dtype)
    else:  # distinct integers, exact in 16 bits: one right answer per row
        x = torch.stack([torch.randperm(E, generator=g) - E // 2 for _ in range(9)]).to(dtype)
    assert all(len(set(r.tolist())) == E for r in x)
    for k in sorted({1, min(E, 2), min(E, 8)}):
        for largest in (True, False):
            v, i = selection_in_torch(x, k, largest)
            ref = torch.topk(x.double(), k, largest=largest)
            assert torch.equal(i, ref.indices), (k, largest)
            assert torch.equal(v, x.gather(1, ref.indices)) and v.dtype == dtype


@pytest.mark.parametrize("largest", [True, False])
def test_torch_form_tie_order_is_lowest_index_first(largest):
    x = _rows(33, 200, torch.bfloat16, ties=True)
    v, i = selection_in_torch(x, 8, largest)
    ref = torch.topk(x, 8, largest=largest)
    assert torch.equal(v, ref.values)  # the same values as ATen, tie order aside
    # a stable sort of the keys is "larger value first, then lower index"
    stable = torch.sort(order_keys(x, largest), dim=1, descending=True, stable=True).indices[:, :8]
    assert torch.equal(i, stable)
    assert torch.equal(x.gather(1, i), v)


def test_torch_form_nan_zero_and_infinities_as_torch_orders_them():
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, nan, -0.0, inf, 0.0, -inf, nan, 2.0],
                      [-0.0, 0.0, -0.0, 0.0, -1.0, -1.0, 3.0, -inf]])
    for largest in (True, False):
        for k in (1, 4, 8):  # k = E: every slot, NaNs included, is selected exactly once
            v, i = selection_in_torch(x, k, largest)
            ref = torch.topk(x, k, largest=largest)
            assert torch.equal(v.isnan(), ref.values.isnan())
            assert torch.equal(v.nan_to_num(), ref.values.nan_to_num())
            assert all(len(set(r.tolist())) == k for r in i)
    v, i = selection_in_torch(x, 3, True)
    assert i[0].tolist() == [1, 6, 3]  # NaNs first, lowest index first, then +inf
    assert i[1, 1:].tolist() == [0, 1]  # after 3.0: -0.0 and +0.0 tie, lowest index first
    assert torch.signbit(v[1, 1]) and not torch.signbit(v[1, 2])  # values re-read: sign kept


def test_kernel_text_and_torch_form_state_the_same_rules():
    # the torch form proves the kernel only while both say the same thing: one order, one layout
    import inspect

    from tilewright.templates.flydsl import topk as module

    kernel = TOPK.render(TopkProblem(256, 8, "bf16"), {}, GFX950).source
    torch_form = inspect.getsource(module.selection_in_torch) + inspect.getsource(module.order_keys)
    for rule_kernel, rule_torch in [
        ("(ka > kb) | ((ka == kb) & (ca < cb))", "(ka > kb) | ((ka == kb) & (ca < cb))"),  # tie rule
        ("col = lane + i * WAVE", "is column l + i * WAVE"),                                # lane layout
        ("WAVE >> (s + 1)", "lane ^ (WAVE >> (s + 1))"),                                    # butterfly
        ("(bits < 0).select(bits ^ INT_MAX, bits)", "torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)"),
        ("(x == 0.0).select(fx.Int32(0)", "torch.where(x == 0, torch.zeros_like(bits)"),
        ("(x != x).select(fx.Int32(INT_MAX)", "torch.where(torch.isnan(x), torch.full_like(key, 2**31 - 1)"),
        ("TAKEN = 1 << 20", "value=1 << 20"),
    ]:
        assert rule_kernel in kernel and rule_torch in torch_form, (rule_kernel, rule_torch)
