"""The Triton attention templates in the interpreter against the float64 reference, outputs
poisoned with NaN: forward (prefill), decode (split keys) and backward, with and without tensor
descriptors, over the modifications models use (causal, sliding window, a document mask read
from a captured tensor through a block mask, ALiBi, soft-capping), GQA/MQA, head dims 64 and
128, lengths that are not multiples of the block, and a fully masked row. Small shapes: each
case is one interpreted launch (or three for the backward)."""

from __future__ import annotations

import math

import pytest
import torch

from tilewright.attention import AttentionProblem, BlockMaskSpec, Capture, mods, tuning
from tilewright.attention import reference as ref
from tilewright.ir import expr as E
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template

CPU = get_target("cpu")


def softcap(cap: float) -> E.Node:
    return cap * E.op("tanh", mods.score() / cap)


def alibi_bias(k: int) -> E.Node:
    """slope[h] * (n - m), the slopes captured tensor ``c{k}``."""
    dist = E.cast(E.op("sub", mods.index_var("n"), mods.index_var("m")), "fp32")
    return E.op("mul", E.load(f"c{k}", (mods.H_VAR,), "fp32"), dist)


def alibi(k: int) -> E.Node:
    return E.op("add", mods.score(), alibi_bias(k))


def document(k: int) -> E.Node:
    """doc[m] == doc[n] for the document ids captured as ``c{k}`` (gathered at m and at n)."""
    at = lambda v: E.load(f"c{k}", (mods.SYMBOLS["ind0"],), "i64", indirect=(E.cast(mods.index_var(v), "i64"),))  # noqa: E731
    return E.op("eq", at("m"), at("n"))


def masked_row(row: int) -> E.Node:
    """Causal, and query ``row`` sees nothing."""
    return E.op("logical_and", E.op("ne", mods.index_var("m"), E.const(row, "i32")), mods.causal())


def with_captures(problem: AttentionProblem, x: tuning.AttentionInputs, captures: list[torch.Tensor]):
    """``x`` with these captured tensors, and the block mask rebuilt for them."""
    named = dict(zip(x.names, x.tensors)) | {f"c{k}": c for k, c in enumerate(captures)}
    if problem.block_mask is not None:
        bm = problem.block_mask
        tensors = ref.block_mask_tensors(tuning.dense_keep(problem, captures), bm.q_block, bm.kv_block, full=bm.full)
        named |= dict(zip(tuning.block_mask_names(problem), tensors))
    return tuning.AttentionInputs([named[n] for n in x.names], x.names)


def run(problem: AttentionProblem, template: str, captures=None, **params):
    """(errors per output, tolerance, outputs, reference) of one interpreted run."""
    t = get_template(template)
    full = t.space.complete(params)
    assert t.supports(problem, CPU), t.supports(problem, CPU).reason
    assert t.check(full, problem, CPU) is None, t.check(full, problem, CPU)
    rendered = t.render(problem, full, CPU)
    launch = load_module(rendered.source, name=rendered.name, interpret=True).launch
    x = tuning.make_inputs(problem, "cpu", seed=3)
    if captures is not None:
        x = with_captures(problem, x, captures)
    outs = tuning.poisoned(problem, "cpu")
    result = tuning.run(launch, x, outs)
    expected = tuning.reference(problem, x)
    errs = [tuning.rel_error(o, r) for o, r in zip(result, expected)]
    worst, tol = tuning.error(problem, result, expected, False)
    return errs, worst, tol, result, expected


def assert_close(problem, template, captures=None, **params):
    errs, worst, tol, result, expected = run(problem, template, captures, **params)
    assert worst <= tol, f"{template} {problem.describe()}: errors {errs} > {tol}"
    for o in result:
        assert not torch.isnan(o).any(), "a NaN survived (an output element the kernel never wrote)"
    return result, expected


FWD = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
CASES = {
    "causal": dict(causal=True),
    "sliding_window": dict(mask_mod=mods.dumps(mods.sliding_window(7))),
    "softcap_alibi": dict(causal=True, score_mod=mods.dumps(E.op("add", softcap(20.0), alibi_bias(0))),
                          captures=(Capture((4,), "fp32"),)),
}


@pytest.mark.parametrize("desc", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_mods(case, desc):
    p = AttentionProblem(B=1, H=4, H_kv=2, Sq=37, Skv=45, D=16, Dv=16, dtype="fp32", scale=0.3, **CASES[case])
    assert_close(p, "triton.attention", DESC=desc, **FWD)


def test_document_mask_from_captured_tensor_through_a_block_mask():
    doc_causal = E.op("logical_and", mods.causal(), document(0))
    p = AttentionProblem(B=2, H=2, H_kv=2, Sq=40, Skv=40, D=16, Dv=16, dtype="fp32", scale=0.25,
                         mask_mod=mods.dumps(doc_causal), captures=(Capture((40,), "i64"),),
                         block_mask=BlockMaskSpec(16, 16, 1, 1, True), lse_base="2")
    doc = torch.tensor([0] * 32 + [1] * 8)
    x = with_captures(p, tuning.make_inputs(p, "cpu"), [doc])
    num, full = x.get("kv_num_blocks"), x.get("full_kv_num_blocks")
    assert num.sum() > 0 and full.sum() > 0, "the test needs partial and full blocks"
    assert_close(p, "triton.attention", captures=[doc], **FWD)


@pytest.mark.parametrize("D", [64, 128])
def test_head_dims_bf16_gqa(D):
    p = AttentionProblem(B=1, H=4, H_kv=1, Sq=20, Skv=33, D=D, Dv=D, dtype="bf16", scale=1 / math.sqrt(D), causal=True)
    assert_close(p, "triton.attention", DESC=True, BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)


def test_head_dims_differ_and_not_powers_of_two():
    p = AttentionProblem(B=1, H=2, H_kv=2, Sq=17, Skv=19, D=40, Dv=24, dtype="fp16", scale=0.2)
    assert_close(p, "triton.attention", **FWD)


def test_fully_masked_row_is_zero_with_the_empty_lse():
    """FlexAttention gives a row with no kept key out = 0 and lse = -inf (measured, torch 2.13);
    SDPA's CPU kernel gives lse = 0: the problem carries which, the kernels write it."""
    for empty in (-math.inf, 0.0):
        p = AttentionProblem(B=1, H=1, H_kv=1, Sq=20, Skv=20, D=16, Dv=16, dtype="fp32", scale=0.25,
                             mask_mod=mods.dumps(masked_row(3)), empty_lse=empty)
        (out, lse), _ = assert_close(p, "triton.attention", **FWD)
        assert torch.equal(out[0, 0, 3], torch.zeros(16)) and lse[0, 0, 3].item() == empty


def test_flex_semantics_of_the_fully_masked_row_match_torch():
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    def mask_mod(b, h, q, kv):
        return (q != 3) & (q >= kv)

    q, k, v = (torch.randn(1, 1, 20, 16) for _ in range(3))
    bm = create_block_mask(mask_mod, 1, 1, 20, 20, device="cpu", BLOCK_SIZE=16)
    out, aux = flex_attention(q, k, v, block_mask=bm, scale=0.25, return_aux=AuxRequest(lse=True))
    p = AttentionProblem(B=1, H=1, H_kv=1, Sq=20, Skv=20, D=16, Dv=16, dtype="fp32", scale=0.25,
                         mask_mod=mods.dumps(masked_row(3)))
    o, lse = ref.forward(p, q, k, v)
    assert torch.allclose(o.float(), out, atol=1e-5) and torch.equal(lse[0, 0, 3], aux.lse[0, 0, 3].double())
    assert torch.allclose(lse.float(), aux.lse, atol=1e-5)


def test_decode_one_query_long_kv_split():
    p = AttentionProblem(B=2, H=4, H_kv=2, Sq=1, Skv=300, D=32, Dv=32, dtype="fp32", scale=0.2)
    assert_close(p, "triton.attention_decode", BLOCK_M=16, BLOCK_N=32, SPLIT=4, num_warps=4, num_stages=1)


def test_decode_block_mask_document_alibi_desc():
    p = AttentionProblem(B=2, H=2, H_kv=1, Sq=1, Skv=200, D=16, Dv=16, dtype="bf16", scale=0.25,
                         mask_mod=mods.dumps(document(0)), score_mod=mods.dumps(alibi(1)),
                         captures=(Capture((200,), "i64"), Capture((2,), "fp32")),
                         block_mask=BlockMaskSpec(32, 32, 2, 1, True), lse_base="2")
    assert_close(p, "triton.attention_decode", BLOCK_M=16, BLOCK_N=16, SPLIT=2, DESC=True, num_warps=4, num_stages=1)


BWD = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)


@pytest.mark.parametrize("desc", [False, True])
def test_backward_causal_gqa_softcap(desc):
    p = AttentionProblem(B=1, H=4, H_kv=2, Sq=33, Skv=29, D=16, Dv=16, dtype="fp32", scale=0.25, direction="backward",
                         causal=True, score_mod=mods.dumps(softcap(20.0)), empty_lse=0.0)
    assert_close(p, "triton.attention_bwd", DESC=desc, **BWD)


def test_backward_document_block_mask_and_lse_gradient_bf16():
    doc_causal = E.op("logical_and", mods.causal(), document(0))
    p = AttentionProblem(B=2, H=2, H_kv=1, Sq=40, Skv=40, D=16, Dv=32, dtype="bf16", scale=0.25,
                         direction="backward", mask_mod=mods.dumps(doc_causal), captures=(Capture((40,), "i64"),),
                         block_mask=BlockMaskSpec(16, 16, 1, 1, True), lse_base="2", lse_grad=True)
    assert_close(p, "triton.attention_bwd", **BWD)


def test_backward_fully_masked_row_has_zero_gradient():
    p = AttentionProblem(B=1, H=1, H_kv=1, Sq=20, Skv=20, D=16, Dv=16, dtype="fp32", scale=0.25,
                         direction="backward", mask_mod=mods.dumps(masked_row(3)))
    (dq, dk, dv), _ = assert_close(p, "triton.attention_bwd", **BWD)
    assert torch.equal(dq[0, 0, 3], torch.zeros(16))


def test_reference_backward_matches_autograd():
    """The FlashAttention-2 formulas of the reference against autograd through the written-out
    float64 math (sliding window, soft-capping, GQA, Dv != D)."""
    p = AttentionProblem(B=1, H=4, H_kv=2, Sq=10, Skv=12, D=16, Dv=8, dtype="fp32", scale=0.25, direction="backward",
                         score_mod=mods.dumps(softcap(20.0)), mask_mod=mods.dumps(mods.sliding_window(5)))
    x = tuning.make_inputs(p, "cpu")
    dq, dk, dv = tuning.reference(p, x)
    q, k, v = (x.get(n).double().requires_grad_() for n in "qkv")
    s = 20 * torch.tanh(q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 0.25 / 20)
    m, n = torch.arange(10)[:, None], torch.arange(12)[None]
    s = s.masked_fill(~((m - n >= 0) & (m - n < 5)), -math.inf)
    out = torch.softmax(s, -1) @ v.repeat_interleave(2, 1)
    assert (out - x.get("out").double()).abs().max() < 1e-6  # the tuning inputs are consistent
    out.backward(x.get("dout").double())
    for got, want in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert (got - want).norm() / want.norm() < 1e-6


def test_problem_json_round_trip_and_hash():
    p = AttentionProblem(B=2, H=4, H_kv=2, Sq=40, Skv=40, D=16, Dv=16, dtype="bf16", scale=0.25, causal=True,
                         score_mod=mods.dumps(alibi(0)), mask_mod=mods.dumps(document(1)),
                         captures=(Capture((4,), "fp32"), Capture((40,), "i64", (0, 3))),
                         block_mask=BlockMaskSpec(16, 32, 2, 1, False), lse_base="2", empty_lse=0.0,
                         orders=(("out", (0, 2, 1, 3)),), dynamic=frozenset({"Sq"}))
    assert AttentionProblem.from_json(p.to_json()) == p
    assert p.stable_hash() == AttentionProblem.from_json(p.to_json()).stable_hash()
    import dataclasses
    for change in ({"causal": False}, {"scale": 0.5}, {"score_mod": ""}, {"empty_lse": -math.inf},
                   {"block_mask": None}, {"H_kv": 4}, {"orders": ()}):
        assert dataclasses.replace(p, **change).stable_hash() != p.stable_hash(), change


def test_problem_refuses_bad_shapes_with_the_fix():
    with pytest.raises(ValueError, match="multiple of KV heads"):
        AttentionProblem(B=1, H=3, H_kv=2, Sq=1, Skv=1, D=16, Dv=16, dtype="fp32", scale=1.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        AttentionProblem(B=2, H=4, H_kv=2, Sq=1, Skv=1, D=16, Dv=16, dtype="fp32", scale=1.0,
                         block_mask=BlockMaskSpec(16, 16, 3, 1))
