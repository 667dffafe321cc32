"""Grouped GEMM (issue 11, part 1): the problem kind, the ATen and Triton templates in the
interpreter against float64 over ragged offsets (an empty group, a one-token group, unaligned
totals), each epilogue, all four shape cases, outputs poisoned with NaN; torch.compile of
``F.grouped_mm`` forward and backward through the Triton templates; and the SwiGLU / cast
fusion after the grouped call (the folded FX graph, patterns that must stay unfused, eager
equality, training left unfused). The descriptor template: tests/test_grouped_desc.py."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F

import tilewright
from tilewright.autotune.kinds import KINDS, kind_of, problem_from_json
from tilewright.compiler.report import collect_reports
from tilewright.grouped import (
    GroupedGemmProblem, make_inputs, poisoned_output, reference, run, synthetic_offsets,
)
from tilewright.problem import EpilogueInput, EpilogueOp
from tilewright.runtime.loader import load_module
from tilewright.templates import get_template

# (case, G, M, N, K, end offsets): the ragged dim's total is unaligned (37), with an empty group
# and a one-token group in each ragged case
CASES = [
    ("2d3d", 4, 37, 24, 20, [0, 1, 17, 37]),
    ("2d2d", 4, 10, 24, 37, [5, 5, 6, 37]),
    ("3d2d", 4, 10, 37, 20, [3, 3, 4, 37]),
    ("3d3d", 3, 10, 24, 20, None),
]
SMALL_TILE = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
TRITON = ("triton.grouped_gemm", "triton.grouped_gemm_desc")  # the tuner may pick either


def _launch(template_id: str, problem: GroupedGemmProblem, params: dict, cpu):
    r = get_template(template_id).render(problem, params, cpu)
    return load_module(r.source, name=r.name, interpret=r.interpret).launch


def _check(problem, offs, cpu, template_id="triton.grouped_gemm", params=SMALL_TILE, seed=0):
    x = make_inputs(problem, "cpu", seed, offs=None if offs is None else torch.tensor(offs, dtype=torch.int32))
    out = run(_launch(template_id, problem, params, cpu), x, poisoned_output(problem, "cpu"))
    ref = reference(problem, x)
    assert not torch.isnan(out).any(), "an element was left unwritten (poisoned NaN remains)"
    err, tol = KINDS["grouped_gemm"].error(problem, out, ref, False)
    assert err <= tol, f"{problem.describe()}: rel error {err:.2e} > {tol:.0e}"
    return out, ref


# -- the problem kind ----------------------------------------------------------------------------
def test_problem_json_roundtrip_and_describe():
    p = GroupedGemmProblem("2d3d", 8, 4096, 1536, 2048, "bf16", epilogue=(EpilogueOp("add", input=0), EpilogueOp("silu")),
                           epilogue_inputs=(EpilogueInput("BN", "bf16"),), dynamic=frozenset({"M"}))
    assert problem_from_json(p.to_json()) == p
    assert p.to_json()["kind"] == "grouped_gemm" and p.to_json()["offsets"] == "even"
    assert "offsets: even" in p.describe() and "ragged M" in p.describe()
    assert kind_of(p) is KINDS["grouped_gemm"]
    assert p.flops == 2 * 4096 * 1536 * 2048
    assert p.stable_hash() != GroupedGemmProblem("2d2d", 8, 4096, 1536, 2048, "bf16").stable_hash()


def test_every_field_changes_the_cache_key():
    base = GroupedGemmProblem("2d3d", 4, 64, 32, 16, "bf16")
    changed = {"case": "3d3d", "G": 8, "M": 128, "N": 64, "K": 32, "dtype": "fp16", "out_dtype": "fp32",
               "layout_a": "col", "layout_b": "col", "epilogue": (EpilogueOp("silu"),),
               "dynamic": frozenset({"M"}), "op": "grouped_mm_x", "glu": "silu"}
    for name, value in changed.items():
        other = dataclasses.replace(base, **{name: value})
        assert other.stable_hash() != base.stable_hash(), name


def test_synthetic_offsets_even_and_aligned():
    p = GroupedGemmProblem("2d3d", 4, 100, 16, 16, "fp32")
    assert synthetic_offsets(p).tolist() == [16, 32, 48, 100]  # 16-aligned shares, rest in the last
    assert synthetic_offsets(p).dtype == torch.int32
    assert synthetic_offsets(GroupedGemmProblem("3d3d", 4, 8, 8, 8, "fp32")) is None


def test_bad_problem_errors_name_the_fix():
    with pytest.raises(ValueError, match="per-group"):
        GroupedGemmProblem("3d2d", 2, 8, 8, 8, "fp32", epilogue=(EpilogueOp("add", input=0),),
                           epilogue_inputs=(EpilogueInput("BN", "fp32"),))
    from tilewright.kernels.grouped import grouped_mm
    with pytest.raises(ValueError, match="int32"):
        grouped_mm(torch.randn(8, 8), torch.randn(2, 8, 8), torch.tensor([4, 8]))


# -- templates in the interpreter against float64 --------------------------------------------------
@pytest.mark.parametrize("case,G,M,N,K,offs", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_cases_ragged(case, G, M, N, K, offs, dtype, cpu):
    _check(GroupedGemmProblem(case, G, M, N, K, dtype), offs, cpu)


@pytest.mark.parametrize("case,G,M,N,K,offs", CASES, ids=[c[0] for c in CASES])
def test_aten_template_matches_reference(case, G, M, N, K, offs, cpu):
    # 16-byte-aligned strides (N, K multiples of 4 fp32) take torch._grouped_mm; 37 the loop
    _check(GroupedGemmProblem(case, G, M, N, K, "fp32"), offs, cpu, "aten.grouped_gemm", {})


def _epilogue(case: str, kinds: str) -> dict:
    ops, inputs = [], []
    if "bias" in kinds:
        inputs.append(EpilogueInput("N" if case == "3d2d" else "BN", "fp32"))
        ops.append(EpilogueOp("add", input=0))
    if "silu" in kinds:
        ops.append(EpilogueOp("silu"))
    if "mul" in kinds:  # SwiGLU: silu(gate) * up
        inputs.append(EpilogueInput("BMN" if case in ("2d2d", "3d3d") else "MN", "fp32"))
        ops.append(EpilogueOp("mul", input=len(inputs) - 1))
    return {"epilogue": tuple(ops), "epilogue_inputs": tuple(inputs)}


@pytest.mark.parametrize("case,G,M,N,K,offs", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("kinds,dtype,out_dtype", [("bias+silu", "fp32", "fp32"), ("silu+mul", "bf16", "fp32"),
                                                   ("bias+mul", "fp32", "bf16")])
def test_triton_epilogues(case, G, M, N, K, offs, kinds, dtype, out_dtype, cpu):
    p = GroupedGemmProblem(case, G, M, N, K, dtype, out_dtype, **_epilogue(case, kinds))
    out, _ = _check(p, offs, cpu)
    assert out.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[out_dtype]


def test_empty_ragged_k_group_is_epilogue_of_zero(cpu):
    p = GroupedGemmProblem("2d2d", 3, 8, 16, 20, "fp32", **_epilogue("2d2d", "bias"))
    x = make_inputs(p, "cpu", 1, offs=torch.tensor([0, 0, 20], dtype=torch.int32))
    out = run(_launch("triton.grouped_gemm", p, SMALL_TILE, cpu), x, poisoned_output(p, "cpu"))
    bias = x.epilogue_inputs[0]
    torch.testing.assert_close(out[0], bias[0].expand(8, 16))
    torch.testing.assert_close(out[1], bias[1].expand(8, 16))


def test_kernel_never_reads_offsets_on_the_host(cpu):
    for case, G, M, N, K, _ in CASES:
        src = get_template("triton.grouped_gemm").render(GroupedGemmProblem(case, G, M, N, K, "bf16"), {}, cpu).source
        launcher = src[src.index("def launch"):]
        for sync in (".tolist(", ".item(", ".cpu(", "int(offs"):
            assert sync not in launcher, f"{case}: the launcher syncs on the offsets ({sync})"


# -- tuning, and the compiler ---------------------------------------------------------------------
def test_select_forced_triton_checks_against_reference(cpu, fresh_cache):
    from tilewright.autotune.select import select
    from tilewright.compiler.kernel_factory import default_factory

    p = GroupedGemmProblem("2d3d", 4, 64, 32, 32, "fp32", **_epilogue("2d3d", "bias+silu"))
    with tilewright.config.patch(force_backend="triton"):
        sel = select(p, cpu, default_factory)
    assert sel.winner.template_id in TRITON


def grouped_kernels(reports) -> list[tuple[GroupedGemmProblem, str]]:
    """(problem, winning template) of every grouped-GEMM kernel the graph reports list: grouped
    GEMMs are chosen in the pipeline's select stage, so the reports hold them."""
    return [(problem_from_json(k.problem_json), k.winner.split("[")[0])
            for r in reports for k in r.kernels if k.kind == "grouped_gemm"]


def _compiled_calls(fn, *args):
    """Compile and run ``fn`` (and its backward) with Triton forced; (output, (case, glu) of
    each grouped kernel the graphs compiled), every one a Triton grouped kernel."""
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(fn, backend="tilewright")(*args)
        if out.requires_grad:
            out.float().square().sum().backward()
    found = grouped_kernels(reports)
    assert all(t in TRITON for _, t in found), found
    return out, [(p.case, p.glu) for p, _ in found]


def test_compile_grouped_mm_forward_and_backward():
    torch.manual_seed(0)
    offs = torch.tensor([0, 1, 17, 37], dtype=torch.int32)
    a = torch.randn(37, 16, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4, 16, 32, dtype=torch.bfloat16, requires_grad=True)

    def f(a, b, offs):
        return F.silu(F.grouped_mm(a, b, offs=offs)) * 2

    ref = f(a, b, offs)
    ref.float().square().sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    out, calls = _compiled_calls(f, a, b, offs)
    # forward 2d3d; backward: dA another 2d3d, dB the 2d2d ragged-K weight gradient
    assert sorted(calls) == [("2d2d", ""), ("2d3d", ""), ("2d3d", "")]
    for x, y in ((out, ref), (a.grad, ga), (b.grad, gb)):
        assert ((x.double() - y.double()).norm() / y.double().norm()).item() < 2e-2


@pytest.mark.parametrize("case", ["3d2d", "3d3d"])
def test_compile_grouped_mm_3d_cases(case):
    torch.manual_seed(0)
    a = torch.randn(3, 16, 16, dtype=torch.bfloat16)
    if case == "3d2d":
        b, offs = torch.randn(16, 40, dtype=torch.bfloat16), torch.tensor([8, 8, 40], dtype=torch.int32)
    else:
        b, offs = torch.randn(3, 16, 24, dtype=torch.bfloat16), None

    def f(a, b, offs):
        return torch._grouped_mm(a, b, offs=offs)

    out, calls = _compiled_calls(f, a, b, offs)
    assert calls == [(case, "")]
    ref = f(a, b, offs)
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 2e-2


def test_compile_auto_on_cpu_runs_aten_grouped_mm():
    offs = torch.tensor([3, 3, 16], dtype=torch.int32)
    a, b = torch.randn(16, 16, dtype=torch.bfloat16), torch.randn(3, 16, 16, dtype=torch.bfloat16)
    with collect_reports() as reports:
        out = torch.compile(lambda a, b, o: F.grouped_mm(a, b, offs=o), backend="tilewright")(a, b, offs)
    assert [(p.case, t) for p, t in grouped_kernels(reports)] == [("2d3d", "aten.grouped_gemm")]
    torch.testing.assert_close(out, F.grouped_mm(a, b, offs=offs))


@pytest.mark.slow
def test_qwen3_moe_grouped_mm_experts_use_the_grouped_template(monkeypatch):
    """A tiny Qwen3-MoE (experts_implementation="grouped_mm", bf16) compiled with the grouped
    templates forced: every expert GEMM runs one, the gate_up projection with its
    ``silu(gate) * up`` fused (glu), and the logits match eager and the same backend with
    ``_grouped_mm`` left to ATen. (The backend once differed from eager by 5e-2 here: a cat's
    mask pushed into a fused reduction, see tests/test_moe_demo.py.)"""
    transformers = pytest.importorskip("transformers")
    import tilewright.compiler.lower_grouped as lower_grouped

    cfg = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4,
        num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM._from_config(
        cfg, experts_implementation="grouped_mm", torch_dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        eager = model(ids).logits
        out, calls = _compiled_calls(lambda i: model(i).logits, ids)
        # gate_up (with the SwiGLU) and down, two layers
        assert calls == [("2d3d", "silu"), ("2d3d", "")] * 2
        torch._dynamo.reset()
        monkeypatch.setattr(lower_grouped, "lower_grouped_mm", lambda node: False)
        with tilewright.config.patch(force_backend="triton"):
            base = torch.compile(lambda i: model(i).logits, backend="tilewright")(ids)
    assert ((out.double() - base.double()).norm() / base.double().norm()).item() < 2e-2
    assert ((out.double() - eager.double()).norm() / eager.double().norm()).item() < 2e-2


def test_public_op_fused_epilogue_matches_eager():
    from tilewright.kernels import grouped_mm

    torch.manual_seed(0)
    offs = torch.tensor([0, 7, 40], dtype=torch.int32)
    a, b = torch.randn(40, 16), torch.randn(3, 16, 24)
    bias, up = torch.randn(3, 24), torch.randn(40, 24)
    with tilewright.config.patch(force_backend="triton"):
        y = grouped_mm(a, b, offs, bias=bias, activation="silu", multiply=up, out_dtype=torch.bfloat16)
    group = torch.searchsorted(offs.long(), torch.arange(40), right=True)
    ref = F.silu(F.grouped_mm(a, b, offs=offs) + bias[group]) * up
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("case,G,M,N,K,offs", [
    ("2d3d", 4, 5, 16, 16, [0, 0, 0, 5]),   # all tokens in the last group
    ("2d3d", 1, 1, 16, 16, [1]),            # one group, one token
    ("2d2d", 3, 16, 16, 1, [0, 1, 1]),      # a one-element K group between empty ones
    ("3d2d", 2, 16, 3, 16, [0, 3]),
])
def test_triton_edge_offsets(case, G, M, N, K, offs, cpu):
    _check(GroupedGemmProblem(case, G, M, N, K, "fp32", **_epilogue(case, "bias+silu")), offs, cpu)


def test_no_tokens_writes_nothing_and_returns(cpu):
    p = GroupedGemmProblem("2d3d", 3, 0, 16, 16, "fp32")
    x = make_inputs(p, "cpu", 0, offs=torch.zeros(3, dtype=torch.int32))
    out = run(_launch("triton.grouped_gemm", p, SMALL_TILE, cpu), x, poisoned_output(p, "cpu"))
    assert out.shape == (0, 16)


@pytest.mark.parametrize("act,fn", [("silu", F.silu), ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"))])
def test_compile_folds_a_lone_activation_into_the_grouped_kernel(act, fn):
    offs = torch.tensor([0, 5, 32], dtype=torch.int32)
    a, b = torch.randn(32, 16, dtype=torch.bfloat16), torch.randn(3, 16, 16, dtype=torch.bfloat16)
    with torch.no_grad(), tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(lambda a, b, o: fn(F.grouped_mm(a, b, offs=o)), backend="tilewright")(a, b, offs)
    assert [p.epilogue for p, _ in grouped_kernels(reports)] == [(EpilogueOp(act),)]
    ref = fn(F.grouped_mm(a, b, offs=offs))
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 2e-2


# -- SwiGLU and casts fused after the grouped call ---------------------------------------------------
def _fx_graph(f, *args):
    """``f``'s ATen graph with its grouped calls lowered and their epilogues folded, as
    ``compiler.lower`` does it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tilewright.compiler.lower_grouped import fuse_epilogues, lower_grouped_mm

    gm = make_fx(f)(*args)
    for node in list(gm.graph.nodes):
        lower_grouped_mm(node)
    fuse_epilogues(gm)
    return gm


def _calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def _swiglu_chunk(a, b, offs):  # HF transformers' _default_apply_gate, then a cast
    gate, up = F.grouped_mm(a, b, offs=offs).chunk(2, dim=-1)
    return (F.silu(gate) * up).float()


def _swiglu_slices(a, b, offs):  # slices, the product the other way round, tanh-gelu
    y = F.grouped_mm(a, b, offs=offs)
    h = y.shape[-1] // 2
    return y[..., h:] * F.gelu(y[..., :h], approximate="tanh")


def _swiglu_split_sizes(a, b, offs):
    gate, up = torch.split(F.grouped_mm(a, b, offs=offs), [32, 32], dim=-1)
    return torch.sigmoid(gate) * up


def _gate_read_twice(a, b, offs):
    gate, up = F.grouped_mm(a, b, offs=offs).chunk(2, dim=-1)
    return F.silu(gate) * up + gate


def _act_on_the_up_half(a, b, offs):
    gate, up = F.grouped_mm(a, b, offs=offs).chunk(2, dim=-1)
    return gate * F.silu(up)


def _not_halves(a, b, offs):
    y = F.grouped_mm(a, b, offs=offs)
    return F.silu(y[..., :16]) * y[..., 16:32]


def _swiglu_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    offs = torch.tensor([0, 1, 20, 37], dtype=torch.int32)  # an empty and a one-token group
    a = torch.randn(37, 16, generator=gen).bfloat16()
    b = torch.randn(4, 64, 16, generator=gen).bfloat16().transpose(-1, -2)  # HF's transposed weight
    return a, b, offs


def _rel(x, y):
    return ((x.double() - y.double()).norm() / y.double().norm()).item()


@pytest.mark.parametrize("f,glu,dtype", [(_swiglu_chunk, "silu", torch.float32),
                                         (_swiglu_slices, "gelu_tanh", torch.bfloat16),
                                         (_swiglu_split_sizes, "sigmoid", torch.bfloat16)],
                         ids=["chunk+cast", "slices", "split_with_sizes"])
def test_swiglu_pattern_folds_into_the_grouped_call(f, glu, dtype):
    from tilewright.compiler.lower_grouped import TILEWRIGHT_GROUPED_MM

    a, b, offs = _swiglu_inputs()
    gm = _fx_graph(f, a, b, offs)
    (call,) = _calls(gm)  # the split, the activation, the product and the cast are gone
    assert call.target is TILEWRIGHT_GROUPED_MM and call.args[6] == glu and call.args[4] in (None, dtype)
    with tilewright.config.patch(force_backend="triton"):
        out = gm(a, b, offs)
    ref = f(a, b, offs)
    assert out.dtype == ref.dtype == dtype and out.shape == (37, 32)
    assert _rel(out, ref) < 2e-2


@pytest.mark.parametrize("f", [_gate_read_twice, _act_on_the_up_half, _not_halves],
                         ids=["gate-read-twice", "act-on-up", "not-halves"])
def test_other_products_stay_unfused_and_correct(f):
    a, b, offs = _swiglu_inputs(1)
    gm = _fx_graph(f, a, b, offs)
    grouped = [n for n in _calls(gm) if "grouped_mm" in str(n.target)]
    assert len(grouped) == 1 and grouped[0].args[5:] in ((), ("none", "none"))
    assert any(n.target is torch.ops.aten.mul.Tensor for n in _calls(gm))
    with tilewright.config.patch(force_backend="triton"):
        out = gm(a, b, offs)
    assert _rel(out, f(a, b, offs)) < 2e-2


def test_compile_fuses_swiglu_and_cast_and_matches_eager():
    a, b, offs = _swiglu_inputs(2)
    with torch.no_grad(), tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(_swiglu_chunk, backend="tilewright")(a, b, offs)
    assert [(p.glu, p.out_dtype, p.N) for p, _ in grouped_kernels(reports)] == [("silu", "fp32", 64)]
    ref = _swiglu_chunk(a, b, offs)
    assert out.dtype == torch.float32 and _rel(out, ref) < 2e-2


def test_compile_swiglu_training_is_left_unfused_and_grads_match():
    # the forward saves the product's halves for the backward: nothing folds, all stays right
    a, b, offs = _swiglu_inputs(3)
    a.requires_grad_(True)
    b = b.detach().requires_grad_(True)
    ref = _swiglu_chunk(a, b, offs)
    ref.square().sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    out, calls = _compiled_calls(_swiglu_chunk, a, b, offs)
    assert sorted(calls) == [("2d2d", ""), ("2d3d", ""), ("2d3d", "")]
    for x, y in ((out, ref), (a.grad, ga), (b.grad, gb)):
        assert _rel(x, y) < 2e-2


def test_public_op_glu_matches_eager():
    from tilewright.kernels import grouped_mm

    a, b, offs = _swiglu_inputs(4)
    with tilewright.config.patch(force_backend="triton"):
        y = grouped_mm(a, b, offs, glu="silu", out_dtype=torch.float32)
    acc = F.grouped_mm(a.float(), b.float(), offs=offs)
    ref = F.silu(acc[:, :32]) * acc[:, 32:]
    assert y.shape == (37, 32) and _rel(y, ref) < 2e-2
    with pytest.raises(ValueError, match="bias with glu"):
        grouped_mm(a, b, offs, glu="silu", bias=torch.randn(4, 64))


@pytest.mark.parametrize("kwargs, words", [
    (dict(bias=torch.randn(16)), "per-group bias of shape (3, 16)"),
    (dict(bias=torch.randn(5, 16)), "per-group bias of shape (3, 16)"),
    (dict(multiply=torch.randn(12, 8)), "output-shaped tensor (12, 16)"),
    (dict(out_dtype=torch.int32), "out_dtype"),
    (dict(offs=torch.tensor([4, 12], dtype=torch.int32)), "2 entries for 3 groups"),
    (dict(offs=torch.tensor([4, 8, 12, 12], dtype=torch.int32)), "4 entries for 3 groups"),
    (dict(offs=torch.tensor([4, 8, 12], dtype=torch.int32, device="meta")), "move offs to cpu"),
    (dict(offs=torch.tensor([4, 8, 12])), "int32"),
])
def test_bad_grouped_mm_arguments_are_refused_naming_the_fix(kwargs, words):
    from tilewright.errors import InvalidInputError
    from tilewright.kernels import grouped_mm

    kwargs = {"offs": torch.tensor([4, 8, 12], dtype=torch.int32), **kwargs}
    with pytest.raises(InvalidInputError, match=re.escape(words)):
        grouped_mm(torch.randn(12, 32), torch.randn(3, 32, 16), **kwargs)


@pytest.mark.parametrize("case, offs", [("2d3d", [4, 8, 100]), ("2d3d", [8, 4, 12]), ("2d2d", [8, 40, 99])])
@pytest.mark.parametrize("template_id", TRITON)
def test_offsets_past_the_total_or_out_of_order_stay_inside_the_operands(case, offs, template_id, cpu):
    """The kernels clamp each end offset to [previous end, ragged total]: offsets past the total
    end at it (as ATen does) and a decreasing one makes an empty group; nothing outside the
    operands is read or written (before the clamp, [4, 8, 100] crashed the interpreter)."""
    p = GroupedGemmProblem(case, len(offs), 12 if case == "2d3d" else 16, 16, 32 if case == "2d2d" else 16, "fp32")
    total, end, clamped = (p.M if case == "2d3d" else p.K), 0, []
    for o in offs:
        end = min(max(o, end), total)
        clamped.append(end)
    x = make_inputs(p, "cpu", 3, offs=torch.tensor(offs, dtype=torch.int32))
    out = run(_launch(template_id, p, SMALL_TILE, cpu), x, poisoned_output(p, "cpu"))
    ref = reference(p, dataclasses.replace(x, offs=torch.tensor(clamped, dtype=torch.int32)))
    rows = slice(0, clamped[-1])  # 2d3d rows past the last offset belong to no group
    err, tol = KINDS["grouped_gemm"].error(p, out[rows], ref[rows], False)
    assert err <= tol, (template_id, err)


# -- grouped GEMMs as kernels of the pipeline (issue 17): chosen in the select stage, reported ------
def _grouped_reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """2d3d in float64, group by group."""
    out, start = torch.zeros(a.shape[0], b.shape[-1], dtype=torch.float64), 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end].double() @ b[g].double()
        start = end
    return out


def _moe_inputs(tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(tokens, 16, generator=gen).bfloat16()  # torch's meta _grouped_mm takes bf16 only
    b = torch.randn(3, 16, 24, generator=gen).bfloat16()
    offs = torch.tensor([0, tokens // 3, tokens], dtype=torch.int32)  # an empty group first
    return a, b, offs


def test_graph_report_lists_the_grouped_kernel_chosen_in_select():
    """Before, ``_grouped_mm`` stayed an extern call tuned on its first call: no graph report
    listed it. Now it is a kernel of the graph, chosen in the select stage (Triton forced, the
    interpreter), reported with its candidates, and its output matches float64."""
    a, b, offs = _moe_inputs(37)
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(lambda a, b, o: F.grouped_mm(a, b, offs=o), backend="tilewright")(a, b, offs)
    assert _rel(out, _grouped_reference(a, b, offs)) < 1e-2  # bf16 output
    (graph,) = reports
    (k,) = [k for k in graph.kernels if k.kind == "grouped_gemm"]
    assert k.winner.split("[")[0] in TRITON and k.candidates and "2d3d" in k.problem
    assert problem_from_json(k.problem_json) == GroupedGemmProblem(
        "2d3d", 3, 64, 24, 16, "bf16", dynamic=frozenset({"M"}))  # 37 tokens: the bucket of 64
    assert graph.kernel_counts == {"grouped_gemm": 1} and graph.extern_ops == 0 and graph.launches == 1


def test_a_failing_grouped_kernel_costs_that_kernel_only(monkeypatch):
    """A generated grouped kernel that fails to render runs on ATen's grouped GEMM, with a
    warning; the graph compiles and the output is right."""
    from tilewright.errors import KernelCompileError

    def broken(self, problem, params, target):
        raise KernelCompileError("test: this template is broken")
    for tid in TRITON:
        monkeypatch.setattr(type(get_template(tid)), "render", broken)
    a, b, offs = _moe_inputs(40, seed=1)
    torch._dynamo.reset()
    with tilewright.config.patch(force_backend="triton", strict=False), collect_reports() as reports, \
            pytest.warns(RuntimeWarning, match="that kernel runs on ATen"):
        out = torch.compile(lambda a, b, o: F.relu(F.grouped_mm(a, b, offs=o)), backend="tilewright")(a, b, offs)
    assert _rel(out, _grouped_reference(a, b, offs).relu()) < 1e-2
    (k,) = [k for r in reports for k in r.kernels if k.kind == "grouped_gemm"]
    assert k.winner == "aten.grouped_gemm" and "failed" in k.reason


def test_a_grouped_kernel_dispatches_token_counts_to_their_buckets():
    """A dynamic token count (the ragged total): one kernel node, a kernel per bucket of it,
    the offsets read on the device."""
    torch._dynamo.reset()
    f = torch.compile(lambda a, b, o: F.grouped_mm(a, b, offs=o), backend="tilewright")
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        for tokens in (37, 20, 50):
            a, b, offs = _moe_inputs(tokens, seed=tokens)
            torch._dynamo.mark_dynamic(a, 0)
            assert _rel(f(a, b, offs), _grouped_reference(a, b, offs)) < 1e-2, tokens
    problems = [problem_from_json(k.problem_json) for r in reports for k in r.kernels if k.kind == "grouped_gemm"]
    assert len(problems) == 1 and problems[0].dynamic == frozenset({"M"})  # one graph, every size
