"""Lowering and fusion on real graphs: the expected GEMM nodes and fused epilogues, counted;
everything else stays an ATen node; no FX node is lost."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn as nn
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from tilewright.compiler.decompositions import decomposition_table
from tilewright.kinds.gemm.fuse import fuse_epilogues
from tilewright.compiler.graph import ExternNode
from tilewright.kinds.gemm.node import GemmNode, gemm_nodes
from tilewright.compiler.lower import lower


def aten_graphs(model, *inputs, train=False):
    """The ATen graphs aot_autograd hands a backend, by kind."""
    graphs = {}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = gm
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           inference_compiler=keep("inference"), decompositions=decomposition_table())
    compiled = torch.compile(model, backend=backend)
    if train:
        out = compiled(*inputs)
        (out if isinstance(out, torch.Tensor) else out.loss).float().sum().backward()
    else:
        with torch.no_grad():
            compiled(*inputs)
    return graphs


def lowered(gm):
    kg = lower(gm)
    fuse_epilogues(kg, gm)
    # conservation: every FX call is a GEMM's (possibly fused) node or an ATen node, once
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "get_attr")]
    covered = [f for node in kg.nodes for f in node.fx_nodes]
    assert sorted(n.name for n in calls) == sorted(f.name for f in covered)
    return kg


def epilogues(kg):
    return collections.Counter(
        " → ".join(op.describe(tuple(e.pattern for e in g.epilogue_inputs)) for op in g.epilogue) or "-"
        for g in gemm_nodes(kg))


class MLP(nn.Module):
    def __init__(self, d=32, h=64):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(d, h), nn.Linear(h, h), nn.Linear(h, d)

    def forward(self, x):
        y = torch.relu(self.l1(x))
        y = nn.functional.gelu(self.l2(y), approximate="tanh")
        return self.l3(y) + x


class Attention(nn.Module):
    """Attention written out (no SDPA): two batched GEMMs around a softmax."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, S, D = x.shape
        split = lambda t: t.view(B, S, self.h, self.dh).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = (q @ k.transpose(-1, -2)) * self.dh ** -0.5
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, S, D)
        return self.o(y) + x


@pytest.mark.parametrize("shape", [(8, 32), (4, 8, 32)], ids=["2d", "3d"])
def test_mlp_inference_fuses_every_epilogue(shape):
    kg = lowered(aten_graphs(MLP(), torch.randn(*shape))["inference"])
    assert len(gemm_nodes(kg)) == 3
    assert epilogues(kg) == {"add[N] → relu": 1, "add[N] → gelu_tanh": 1, "add[N] → add[MN]": 1}
    assert all(g.layout_b == "col" for g in gemm_nodes(kg)), "weights are read transposed, not copied"


def test_mlp_training_keeps_saved_values_and_lowers_backward():
    graphs = aten_graphs(MLP(), torch.randn(4, 8, 32, requires_grad=True), train=True)
    fw, bw = lowered(graphs["forward"]), lowered(graphs["backward"])
    # relu's and gelu's inputs are saved for backward, so those chains stop at the bias add
    assert epilogues(fw) == {"add[N] → relu": 1, "add[N]": 1, "add[N] → add[MN]": 1}
    # dX and dW for each of 3 linears
    assert len(gemm_nodes(bw)) == 6 and {g.op for g in gemm_nodes(bw)} == {"mm"}


def test_attention_block():
    """Attention written out (no SDPA) is recognised and becomes one attention kernel between
    the projections (tilewright.compiler.lower_eager_attention)."""
    kg = lowered(aten_graphs(Attention(), torch.randn(2, 8, 32))["inference"])
    ops = collections.Counter(g.op for g in gemm_nodes(kg))
    assert ops == {"addmm": 4}
    attention = [n for n in kg.nodes if getattr(n, "kind", "") == "attention" and hasattr(n, "problem")]
    assert len(attention) == 1 and attention[0].problem.scale == 8 ** -0.5
    assert epilogues(kg)["add[N] → add[MN]"] == 1  # output projection + residual


def test_attention_block_in_training_keeps_its_gemms():
    """A training graph saves the probabilities for the backward: the written-out attention
    stays two batched GEMMs around a softmax, the scale fused into the first."""
    fw = lowered(aten_graphs(Attention(), torch.randn(2, 8, 32, requires_grad=True), train=True)["forward"])
    ops = collections.Counter(g.op for g in gemm_nodes(fw))
    assert ops == {"addmm": 4, "bmm": 2}
    scores = [g for g in gemm_nodes(fw) if g.op == "bmm" and g.epilogue]
    assert len(scores) == 1 and scores[0].epilogue[0].kind == "mul", "the 1/sqrt(d) scale fuses"


@pytest.mark.slow
def test_minilm_graph():
    from tilewright.demo import models

    m = models.load_minilm()
    kg = lowered(aten_graphs(m, models.minilm_inputs(m))["inference"])
    assert len(gemm_nodes(kg)) == 36 and all(g.op == "addmm" for g in gemm_nodes(kg))
    assert epilogues(kg) == {"add[N]": 18, "add[N] → gelu": 6, "add[N] → add[MN]": 12}
    # SDPA is kept whole (not decomposed) and each call becomes one attention kernel
    attention = [n for n in kg.nodes if getattr(n, "kind", "") == "attention" and hasattr(n, "problem")]
    assert len(attention) == 6 and all(n.problem.op == "sdpa" and n.problem.captures for n in attention)


@pytest.mark.slow
def test_llama_inference_graph():
    from tilewright.demo import models

    kg = lowered(aten_graphs(models.build_llama(), models.llama_inputs())["inference"])
    assert len(gemm_nodes(kg)) == 15  # 2 layers x (q, k, v, o, gate, up, down) + lm_head
    counts = epilogues(kg)
    assert counts["silu → mul[MN]"] == 2, "SwiGLU: silu(gate) * up fuses into the gate GEMM"
    assert counts["add[MN]"] == 4, "o_proj and down_proj take the residual"


def test_symbolic_batch_lowers_with_sympy_sizes():
    import torch._dynamo

    graphs = {}

    def keep(gm, ex):
        graphs["g"] = gm
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=keep, inference_compiler=keep)
    f = torch.compile(MLP(), backend=backend, dynamic=True)
    with torch.no_grad():
        f(torch.randn(5, 32))
    kg = lowered(graphs["g"])
    assert len(gemm_nodes(kg)) == 3
    assert all(g.dynamic == {"M"} for g in gemm_nodes(kg))
    assert all(g.M.free_symbols for g in gemm_nodes(kg))


def test_unsupported_gemms_stay_on_aten():
    def f(a, b, i, j):
        return a @ b, i @ j  # fp64 and int64: not lowered

    graphs = aten_graphs(f, torch.randn(4, 5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64),
                         torch.randint(0, 5, (4, 5)), torch.randint(0, 5, (5, 3)))
    kg = lowered(graphs["inference"])
    assert gemm_nodes(kg) == []
    assert all(isinstance(n, ExternNode) for n in kg.nodes)
    assert not any(isinstance(n, GemmNode) for n in kg.nodes)
