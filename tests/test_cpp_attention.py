"""``cpp.attention`` (the C++ attention forward on the cpu target) against the float64
reference, outputs poisoned with NaN: both score layouts (Sᵀ for prefill, dot products for
decode's packed GQA group), bf16/fp16/fp32, ragged lengths and head dims off 16, non-contiguous
Q/K/V and outputs, causal ranges, score_mods and mask_mods, block masks with partial and full
blocks, a document mask gathered from a captured tensor, fully masked rows (finfo.min averages
V as eager; -inf gives 0 and the problem's empty lse), a captured index out of range, the
policy offering it under ``auto``, and a compiled flex model running it."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import tilewright
from tilewright.kinds.attention import checks as tuning
from tilewright.kinds.attention import mods
from tilewright.kinds.attention.problem import AttentionProblem, BlockMaskSpec, Capture
from tilewright.compiler.report import collect_reports
from tilewright.ir import expr as E
from tilewright.templates.cpp import runtime as cpp
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

pytestmark = pytest.mark.skipif(not cpp.available(), reason="no C++ compiler")
CPU = get_target("cpu")


def softcap(cap: float) -> E.Node:
    return cap * E.op("tanh", mods.score() / cap)


def alibi_bias(k: int) -> E.Node:
    """slope[h] * (n - m), the slopes captured as ``c{k}``."""
    dist = E.cast(E.op("sub", mods.index_var("n"), mods.index_var("m")), "fp32")
    return E.op("mul", E.load(f"c{k}", (mods.H_VAR,), "fp32"), dist)


def document(k: int) -> E.Node:
    at = lambda v: E.load(f"c{k}", (mods.SYMBOLS["ind0"],), "i64", indirect=(E.cast(mods.index_var(v), "i64"),))  # noqa: E731
    return E.op("eq", at("m"), at("n"))


def launcher(problem: AttentionProblem, **params):
    t = get_template("cpp.attention")
    full = t.space.complete(params)
    assert t.supports(problem, CPU), t.supports(problem, CPU).reason
    assert t.check(full, problem, CPU) is None, t.check(full, problem, CPU)
    rendered = t.render(problem, full, CPU)
    return load_module(rendered.source, name=rendered.name, interpret=False).launch


def strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a (B, S, H, D) layout seen as (B, H, S, D): no unit stride but D's."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def check(problem: AttentionProblem, x: tuning.AttentionInputs | None = None, outs=None, **params):
    x = x or tuning.make_inputs(problem, "cpu", seed=3)
    outs = outs or tuning.poisoned(problem, "cpu")
    result = tuning.run(launcher(problem, **params), x, outs)
    expected = tuning.reference(problem, x)
    worst, tol = tuning.error(problem, result, expected, False)
    errs = [tuning.rel_error(o, r) for o, r in zip(result, expected)]
    assert worst <= tol, f"{problem.describe()} {params}: errors {errs} > {tol}"
    assert not any(torch.isnan(o).any() for o in result), "an output element the kernel never wrote"
    return result, expected


BASE = AttentionProblem(B=2, H=4, H_kv=2, Sq=37, Skv=70, D=40, Dv=24, dtype="fp32", scale=0.3)
CASES = {
    "plain_fp32": (dict(), dict(BLOCK_M=16, BLOCK_N=32)),
    "causal_bf16": (dict(dtype="bf16", causal=True), dict(BLOCK_M=32, BLOCK_N=16)),
    "softcap_alibi_fp16": (dict(dtype="fp16", score_mod=mods.dumps(E.op("add", softcap(20.0), alibi_bias(0))),
                                captures=(Capture((4,), "fp32"),)), dict(BLOCK_M=16, BLOCK_N=64)),
    "sliding_window_block_mask": (dict(Sq=64, Skv=64, mask_mod=mods.dumps(mods.sliding_window(20)), lse_base="2",
                                       block_mask=BlockMaskSpec(32, 16)), dict(BLOCK_M=32, BLOCK_N=16)),
    "decode_packed_gqa": (dict(Sq=1, Skv=300, H=8, H_kv=2), dict(BLOCK_M=1, BLOCK_N=64, PACK=True)),
    # query 3 sees no key: out 0 and flex's empty lse (-inf), matched exactly by the check
    "fully_masked_row_flex": (dict(mask_mod=mods.dumps(E.op("logical_and", E.op("ne", mods.index_var("m"), E.const(3, "i32")),
                                                              mods.causal())), lse_base="2"), dict(BLOCK_M=16, BLOCK_N=16)),
    # fp32 rows of whole vectors with a unit stride are read in place, not copied
    "fp32_rows_in_place": (dict(D=32, Dv=64, Skv=77, causal=True), dict(BLOCK_M=32, BLOCK_N=16)),
    "decode_fp32_rows_in_place": (dict(Sq=1, Skv=301, H=8, H_kv=2, D=64, Dv=32), dict(BLOCK_M=1, BLOCK_N=64, PACK=True)),
    "decode_three_queries_bf16": (dict(Sq=3, Skv=131, dtype="bf16", causal=True), dict(BLOCK_M=4, BLOCK_N=32, PACK=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_against_float64(case):
    change, params = CASES[case]
    check(dataclasses.replace(BASE, **change), **params)


def test_non_contiguous_inputs_and_outputs():
    """Q/K/V in (B, S, H, D) memory and the output stored (B, S, H, Dv) as SDPA's CPU op does."""
    p = dataclasses.replace(BASE, causal=True, orders=(("out", (0, 2, 1, 3)),))
    x = tuning.make_inputs(p, "cpu", seed=5)
    x.tensors[:3] = [strided(t) for t in x.tensors[:3]]
    assert x.tensors[0].stride(-2) != p.D
    (out, _), _ = check(p, x, BLOCK_M=16, BLOCK_N=32)
    assert out.stride(1) == p.Dv  # written through the output's strides


def test_document_mask_gathered_through_a_block_mask_with_full_blocks():
    p = AttentionProblem(B=2, H=2, H_kv=1, Sq=72, Skv=72, D=16, Dv=16, dtype="fp32", scale=0.25,
                         mask_mod=mods.dumps(E.op("logical_and", mods.causal(), document(0))),
                         captures=(Capture((72,), "i64"),), block_mask=BlockMaskSpec(16, 16), lse_base="2")
    x = tuning.make_inputs(p, "cpu")
    doc = torch.tensor([0] * 40 + [1] * 32)
    named = dict(zip(x.names, x.tensors)) | {"c0": doc}
    from tilewright.kinds.attention import reference as ref

    bm = ref.block_mask_tensors(tuning.dense_keep(p, [doc]), 16, 16)
    named |= dict(zip(tuning.block_mask_names(p), bm))
    x = tuning.AttentionInputs([named[n] for n in x.names], x.names)
    assert x.get("kv_num_blocks").sum() > 0 and x.get("full_kv_num_blocks").sum() > 0
    check(p, x, BLOCK_M=16, BLOCK_N=16)


def test_gathered_index_out_of_range_raises_index_error():
    p = AttentionProblem(B=1, H=1, H_kv=1, Sq=8, Skv=8, D=16, Dv=16, dtype="fp32", scale=0.25,
                         mask_mod=mods.dumps(document(0)), captures=(Capture((8,), "i64"),))
    x = tuning.make_inputs(p, "cpu")
    bad = torch.full((8,), 0, dtype=torch.int64)
    bad[0] = 99  # a document id that is then used as an index into itself
    mask = mods.dumps(E.op("eq", E.load("c0", (mods.SYMBOLS["ind0"],), "i64",
                                        indirect=(E.load("c0", (mods.M_VAR,), "i64"),)), E.const(0, "i64")))
    p = dataclasses.replace(p, mask_mod=mask)
    with pytest.raises(IndexError):
        launcher(p, BLOCK_M=8, BLOCK_N=16)(x.get("q"), x.get("k"), x.get("v"), bad)


def test_a_score_mod_gather_through_a_loaded_index_is_checked():
    """score + bias[doc[m]] (lower_flex wraps doc[m] in a checked node bounded by bias's 4
    entries): right while doc stays inside, eager's IndexError once it does not."""
    doc = E.load("c1", (mods.M_VAR,), "i64")
    by_doc = E.op("add", mods.score(), E.load("c0", (E.indirect_symbol(0),), "fp32", indirect=(E.checked(doc, 4),)))
    p = AttentionProblem(B=1, H=2, H_kv=2, Sq=16, Skv=16, D=16, Dv=16, dtype="fp32", scale=0.25,
                         score_mod=mods.dumps(by_doc), captures=(Capture((4,), "fp32"), Capture((16,), "i64")))
    x = tuning.make_inputs(p, "cpu", seed=2)
    check(p, x, BLOCK_M=16, BLOCK_N=16)
    launch = launcher(p, BLOCK_M=16, BLOCK_N=16)
    with pytest.raises(IndexError):
        launch(x.get("q"), x.get("k"), x.get("v"), x.get("c0"), torch.arange(16) // 4 + 1)


@pytest.mark.parametrize("fill", ["finfo_min", "-inf"])
def test_fully_masked_rows_give_eagers_values(fill):
    """An additive mask (SDPA's form: score + c0) with fully masked rows: finfo.min rows average V
    as eager's softmax of equal scores does; -inf rows give 0 and SDPA's CPU lse (0)."""
    torch.manual_seed(4)
    value = torch.finfo(torch.float32).min if fill == "finfo_min" else -math.inf
    p = AttentionProblem(B=2, H=2, H_kv=2, Sq=6, Skv=9, D=16, Dv=16, dtype="fp32", scale=0.25, empty_lse=0.0,
                         score_mod=mods.dumps(mods.additive_mask(0, (2, 1, 6, 9), "fp32")),
                         captures=(Capture((2, 1, 6, 9), "fp32"),))
    q, k, v = torch.randn(2, 2, 6, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    m = torch.randn(2, 1, 6, 9)
    m[0, :, 1] = value
    m[1, :, 4] = value
    m[1, :, 2, 3] = value
    out, lse = launcher(p, BLOCK_M=8, BLOCK_N=16)(q, k, v, m)
    want, want_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m, scale=0.25)[:2]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    if fill == "finfo_min":
        torch.testing.assert_close(out[0, :, 1], v[0].mean(1), rtol=1e-5, atol=1e-6)
    else:
        assert torch.equal(out[0, :, 1], torch.zeros(2, 16)) and torch.equal(lse[0, :, 1], want_lse[0, :, 1])


def test_refusals_name_the_reason():
    t = get_template("cpp.attention")
    assert "backward" in t.supports(dataclasses.replace(BASE, direction="backward"), CPU).reason
    bm = dataclasses.replace(BASE, Sq=64, Skv=64, block_mask=BlockMaskSpec(16, 16))
    assert "divide" in t.check({"BLOCK_M": 32}, bm, CPU)
    assert "cpu target" in t.supports(BASE, get_target("sm_90a")).reason


def test_policy_offers_it_on_the_cpu_under_auto():
    from tilewright.kinds.attention.policy import AttentionPolicy

    with tilewright.config.patch(force_backend="auto"):
        ids = [c.template_id for c in AttentionPolicy().candidates(BASE, CPU)]
    assert ids[0] == "aten.attention" and "cpp.attention" in ids
    assert not any(i.startswith("triton.") for i in ids)  # interpreted Triton only loses on a CPU


@pytest.mark.slow
def test_compiled_flex_runs_the_cpp_kernel_when_forced():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 100, 32) for _ in range(3))
    bm = create_block_mask(lambda b, h, m, n: m >= n, 1, 1, 100, 100, device="cpu", BLOCK_SIZE=32)

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, m, n: 20.0 * torch.tanh(s / 20.0), block_mask=bm)

    want = f(q.double(), k.double(), v.double())
    with tilewright.config.patch(force_backend="cpp", graph_race="off"), collect_reports() as reports:
        out = torch.compile(f, backend="tilewright")(q, k, v)
    kernels = [k for r in reports for k in r.kernels if k.kind == "attention"]
    assert kernels and kernels[0].winner.startswith("cpp.attention"), [k.winner for k in kernels]
    assert ((out.double() - want).norm() / want.norm()).item() < 1e-5


def test_bf16_softcap_score_loop_is_vectorised():
    """A bf16 flex score_mod rounds through bf16 between its ops (tw_round_bf16). Its NaN select
    was control flow to g++ 12, which cannot if-convert a loop that also calls tanhf: the whole
    score loop ran scalar tanhf (flex bf16 4x slower, 138 ms against 33). Every score loop of
    both instances (masked and unmasked tiles) must call libmvec's vector tanhf."""
    import re
    import shutil
    import subprocess

    if not cpp.toolchain().libmvec >= 2 or shutil.which("objdump") is None:
        pytest.skip("needs glibc's libmvec (level 2: tanhf) and objdump")
    rnd = lambda v: E.cast(E.cast(v, "bf16", explicit=True), "fp32")  # noqa: E731 - flex bf16 rounds each op
    score = rnd(E.op("mul", rnd(E.op("tanh", rnd(E.op("truediv", mods.score(), E.const(20.0, "fp32"))))), E.const(20.0, "fp32")))
    p = AttentionProblem(B=1, H=1, H_kv=1, Sq=64, Skv=64, D=32, Dv=32, dtype="bf16", scale=0.2,
                         score_mod=mods.dumps(score), causal=True)
    t = get_template("cpp.attention")
    source = t.render(p, t.space.complete({"BLOCK_M": 32, "BLOCK_N": 32}), CPU).source
    assert "tw_round_bf16" in source
    kernel = re.search(r"SOURCE = r'''(.*?)'''\n_KERNEL", source, re.S).group(1)
    lib = cpp.build(kernel, "cpp_attention")
    calls = subprocess.run(["objdump", "-d", str(lib)], capture_output=True, text=True).stdout
    assert len(re.findall(r"call.*<_ZGV\w*v_tanhf", calls)) >= 2, "a score loop calls scalar tanhf only"


def test_threads_take_tasks():
    """Two OpenMP threads (torch.get_num_threads()) over the tasks give the one-thread values."""
    p = dataclasses.replace(BASE, causal=True, B=3)
    x = tuning.make_inputs(p, "cpu", seed=7)
    launch = launcher(p, BLOCK_M=16, BLOCK_N=32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = launch(*x.tensors)
        torch.set_num_threads(2)
        two = launch(*x.tensors)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


# -- the softmax's exp (glibc's vector expf leaves its fast path for lanes below -87.3) ---------
def _spread_scores(x: tuning.AttentionInputs, factor: float) -> tuning.AttentionInputs:
    """Q scaled so a row's scores span about +-5 * factor: many fall 87..104 below the row max
    (exp is a denormal there, 0 in the kernel) and many further (0 either way)."""
    tensors = list(x.tensors)
    tensors[0] = strided(tensors[0] * factor)
    tensors[1:3] = [strided(t) for t in tensors[1:3]]
    return tuning.AttentionInputs(tensors, x.names)


@pytest.mark.parametrize("layout", ["prefill_packed_gqa", "decode_dot_products"])
def test_exp_clamp_against_float64_with_wide_scores_and_a_nan_row(layout):
    """The demo Llama's training shape (GQA 4/2 heads, Sq 24 under BLOCK_M 32, causal: -inf in
    most score vectors) through both score layouts, on (B, S, H, D)-strided inputs and into
    poisoned outputs: against float64 with scores whose differences reach past -104, and a
    NaN query row giving NaN as eager's (the clamp must not turn NaN into a number)."""
    Sq, params = (24, dict(BLOCK_M=32, BLOCK_N=64, PACK=True)) if layout == "prefill_packed_gqa" else \
        (2, dict(BLOCK_M=2, BLOCK_N=16, PACK=True))
    p = AttentionProblem(B=2, H=4, H_kv=2, Sq=Sq, Skv=24 if Sq == 24 else 37, D=32, Dv=32, dtype="fp32",
                         scale=32 ** -0.5, causal=Sq == 24, orders=(("out", (0, 2, 1, 3)), ("lse", (0, 2, 1))))
    x = _spread_scores(tuning.make_inputs(p, "cpu", seed=11), 25.0)
    s = torch.einsum("bhmd,bhnd->bhmn", x.tensors[0].double(),
                     x.tensors[1].double().repeat_interleave(2, 1)) * p.scale
    if p.causal:
        s = s.masked_fill(torch.ones(Sq, Sq, dtype=torch.bool).triu(1), -math.inf)
    gap = s.amax(-1, keepdim=True) - s
    assert ((gap > 87) & (gap < 104)).any() and ((gap > 104) & (gap < math.inf)).any()
    check(p, x, **params)
    q = x.tensors[0].clone()
    q[1, 2, Sq - 1, 5] = float("nan")
    out, lse = launcher(p, **params)(q, *x.tensors[1:])
    assert out[1, 2, Sq - 1].isnan().all() and lse[1, 2, Sq - 1].isnan()
    out[1, 2, Sq - 1] = 0.0
    assert not out.isnan().any()


def test_rows_rendered_for_the_problems_sq_still_serve_a_longer_call():
    """BLOCK_M 32 over Sq 24 renders 24-row tasks (no padding rows); a call with Sq 50 (the
    launcher takes any) runs in more tasks and stays right."""
    p = AttentionProblem(B=1, H=4, H_kv=2, Sq=24, Skv=24, D=32, Dv=32, dtype="fp32", scale=0.2, causal=True)
    t = get_template("cpp.attention")
    ctx = t.context(p, t.space.complete({"BLOCK_M": 32, "BLOCK_N": 64, "PACK": True}), CPU)
    assert ctx["BLOCK_M"] == 24 and ctx["rows_pad"] == 48
    launch = launcher(p, BLOCK_M=32, BLOCK_N=64, PACK=True)
    longer = dataclasses.replace(p, Sq=50, Skv=50)
    x = tuning.make_inputs(longer, "cpu", seed=2)
    got = launch(*x.tensors)
    want = tuning.reference(longer, x)
    worst, tol = tuning.error(longer, got, want, False)
    assert worst <= tol


def test_softmax_exp_calls_are_vector_calls_only():
    """Prefill (Sᵀ) layout, fp32, causal: every expf of the online softmax (p and the rescale
    alpha) is a libmvec vector call; the rescale's loop used to call scalar expf."""
    import re
    import shutil
    import subprocess

    if not cpp.toolchain().libmvec >= 1 or shutil.which("objdump") is None:
        pytest.skip("needs glibc's libmvec and objdump")
    p = AttentionProblem(B=2, H=4, H_kv=2, Sq=24, Skv=24, D=32, Dv=32, dtype="fp32", scale=0.2, causal=True)
    t = get_template("cpp.attention")
    source = t.render(p, t.space.complete({"BLOCK_M": 32, "BLOCK_N": 64, "PACK": True}), CPU).source
    kernel = re.search(r"SOURCE = r'''(.*?)'''\n_KERNEL", source, re.S).group(1)
    calls = subprocess.run(["objdump", "-d", str(cpp.build(kernel, "cpp_attention"))],
                           capture_output=True, text=True).stdout
    assert re.findall(r"call.*<_ZGV\w*v_expf", calls)
    assert not re.findall(r"call.*<expf@plt>", calls), "a softmax loop calls scalar expf"


def test_launcher_refuses_other_tensors_and_returns_empty_batches():
    """The launcher reads each tensor attribute once (its per-call cost): its checks still name
    the mismatch, and an empty batch gives empty outputs without running the kernel."""
    p = AttentionProblem(B=2, H=4, H_kv=2, Sq=5, Skv=7, D=16, Dv=8, dtype="fp32", scale=0.25)
    launch = launcher(p, BLOCK_M=8, BLOCK_N=16)
    q, k, v = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 8)
    with pytest.raises(ValueError, match="H=4, H_kv=2"):
        launch(q, torch.randn(2, 4, 7, 16), v)
    with pytest.raises(ValueError, match="float64"):
        launch(q.double(), k, v)
    with pytest.raises(ValueError, match="0 captured and 0 block-mask tensors, got 1"):
        launch(q, k, v, q)
    out, lse = launch(q[:0], k[:0], v[:0])
    assert out.shape == (0, 4, 5, 8) and lse.shape == (0, 4, 5)
