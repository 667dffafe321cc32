"""Attention in compiled models: SDPA (forward and backward) and flex_attention (block mask,
score_mod, captured tensors) lowered to attention kernels, hand-written attention recognised,
judged against float64; graph reports list the attention kernels; what cannot be lowered stays
on ATen."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tilewright
from tilewright.compiler.report import collect_reports


def attention_reports(reports):
    return [(r.kind, k) for r in reports for k in r.kernels if k.kind == "attention"]


def aten_attention_calls(debug_dir: Path) -> list[str]:
    """The ATen calls of attention ops left in the compiled graphs (their kernel_ir.txt)."""
    import re

    lines = [line for p in Path(debug_dir).rglob("kernel_ir.txt") for line in p.read_text().splitlines()]
    return [line for line in lines if re.search(r"= \w+: \S*(scaled_dot_product|flex_attention)\S*\(", line)]


class SdpaBlock(torch.nn.Module):
    """A projection, GQA causal SDPA, a projection: the attention of a decoder layer."""

    def __init__(self, H=4, H_kv=2, D=16):
        super().__init__()
        self.H, self.H_kv, self.D = H, H_kv, D
        self.q = torch.nn.Linear(32, H * D)
        self.kv = torch.nn.Linear(32, 2 * H_kv * D)
        self.o = torch.nn.Linear(H * D, 32)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.H, self.D).transpose(1, 2)
        k, v = self.kv(x).view(B, S, 2, self.H_kv, self.D).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(a.transpose(1, 2).reshape(B, S, -1))


def test_sdpa_forward_and_backward_through_generated_kernels(tmp_path):
    torch.manual_seed(0)
    m = SdpaBlock()
    x = torch.randn(2, 19, 32, requires_grad=True)
    with tilewright.config.patch(force_backend="triton", debug_dir=str(tmp_path)), collect_reports() as reports:
        out = torch.compile(m, backend="tilewright")(x)
        out.square().sum().backward()
    found = attention_reports(reports)
    assert sorted(kind for kind, _ in found) == ["backward", "forward"]
    assert all(k.winner.startswith("triton.attention") for _, k in found), [k.winner for _, k in found]
    assert aten_attention_calls(tmp_path) == []
    ref = SdpaBlock().double()
    ref.load_state_dict(m.state_dict())
    xd = x.detach().double().requires_grad_()
    want = ref(xd)
    want.square().sum().backward()
    assert (out.double() - want).norm() / want.norm() < 1e-5
    assert (x.grad.double() - xd.grad).norm() / xd.grad.norm() < 1e-5
    for p, q in zip(m.parameters(), ref.parameters()):
        assert (p.grad.double() - q.grad).norm() / q.grad.norm() < 1e-5


def _flex_model():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, S, D = 2, 4, 40, 16
    doc = torch.tensor([0] * 15 + [1] * 25)
    slopes = torch.rand(H)

    def mask_mod(b, h, q, kv):
        return (q >= kv) & (doc[q] == doc[kv])

    def score_mod(s, b, h, q, kv):
        return 20 * torch.tanh(s / 20) + slopes[h] * (kv - q)

    bm = create_block_mask(mask_mod, B, None, S, S, device="cpu", BLOCK_SIZE=16)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(D, D)

        def forward(self, q, k, v):
            return self.proj(flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True))

    def reference(m, q, k, v):
        qd, kd, vd = q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
        s = 20 * torch.tanh(qd @ kd.transpose(-1, -2) * D ** -0.5 / 20)
        mm, nn = torch.arange(S)[:, None], torch.arange(S)[None]
        s = s + slopes.double()[None, :, None, None] * (nn - mm)
        s = s.masked_fill(~((mm >= nn) & (doc[mm] == doc[nn])), -math.inf)
        return F.linear(torch.softmax(s, -1) @ vd, m.proj.weight.double(), m.proj.bias.double())

    torch.manual_seed(0)
    args = (torch.randn(B, H, S, D), torch.randn(B, 2, S, D), torch.randn(B, 2, S, D))
    return M(), args, reference


def test_flex_attention_with_block_mask_and_score_mod_through_a_generated_kernel(tmp_path):
    """Forward only: torch refuses flex_attention's backward on a CPU, even in eager."""
    m, args, reference = _flex_model()
    with tilewright.config.patch(force_backend="triton", debug_dir=str(tmp_path)), collect_reports() as reports:
        out = torch.compile(m, backend="tilewright")(*args)
    found = attention_reports(reports)
    assert len(found) == 1 and found[0][1].winner.startswith("triton.attention["), found
    assert aten_attention_calls(tmp_path) == []
    want = reference(m, *args)
    assert (out.double() - want).norm() / want.norm() < 1e-5


def test_attention_by_default_is_timed_against_sdpas_own_op():
    """Without forcing generated kernels, a CPU times SDPA's own op (eager's values exactly)
    against the compiled C++ kernel (cpp.attention) and runs the faster: either way eager's
    values, exactly for ATen's."""
    torch.manual_seed(0)
    m = SdpaBlock()
    x = torch.randn(2, 19, 32)
    with collect_reports() as reports:
        out = torch.compile(m, backend="tilewright")(x)
    winners = [k.winner for _, k in attention_reports(reports)]
    assert len(winners) == 1 and winners[0].split("[")[0] in ("aten.attention", "cpp.attention"), winners
    tol = 1e-6 if winners[0] == "aten.attention" else 1e-5
    assert torch.allclose(out, m(x), atol=tol, rtol=tol)


def test_dropout_attention_stays_on_aten():
    from tilewright.compiler.capture import ModelSpec, aten_graphs
    from tilewright.compiler.lower_attention import NotAttention, lower_node

    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    q = torch.randn(1, 2, 8, 16)
    g = aten_graphs(ModelSpec(M().train(), (q, q, q)))["inference"]
    reasons = []
    for n in g.graph.nodes:
        try:
            lower_node(n, g)
        except NotAttention as e:
            reasons.append(str(e))
    assert any("dropout" in r for r in reasons) or not any(
        "scaled_dot_product" in str(n.target) for n in g.graph.nodes)


def _eager_attention(q, k, v, mask, scale):
    """transformers' eager attention, written as models write it (with repeat_kv)."""
    B, Hkv, S, D = k.shape
    G = q.shape[1] // Hkv
    k = k[:, :, None].expand(B, Hkv, G, S, D).reshape(B, Hkv * G, S, D)
    v = v[:, :, None].expand(B, Hkv, G, S, v.shape[-1]).reshape(B, Hkv * G, S, v.shape[-1])
    w = torch.matmul(q, k.transpose(2, 3)) * scale + mask
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


def test_hand_written_attention_is_recognised_and_rewritten():
    from tilewright.compiler.capture import ModelSpec, aten_graphs
    from tilewright.compiler.lower_eager_attention import SDPA, rewrite_eager_attention

    class M(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return _eager_attention(q, k, v, mask, 0.25) * 2

    q, k, v = torch.randn(2, 4, 12, 16), torch.randn(2, 2, 12, 16), torch.randn(2, 2, 12, 8)
    mask = torch.zeros(2, 1, 12, 12).masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), -math.inf)
    g = aten_graphs(ModelSpec(M(), (q, k, v, mask)))["inference"]
    # the graph's inputs in its own order (Dynamo may reorder them): found by shape
    by_shape = {tuple(t.shape): t for t in (q, k, v, mask)}
    args = [by_shape[tuple(n.meta["val"].shape)] for n in g.graph.nodes if n.op == "placeholder"]
    assert rewrite_eager_attention(g) == 1
    assert [n.target for n in g.graph.nodes if "bmm" in str(n.target)] == []
    assert sum(n.target is SDPA for n in g.graph.nodes) == 1
    got = g(*args)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert torch.allclose(got, M()(q, k, v, mask), atol=1e-5)


def test_hand_written_attention_in_a_compiled_model_runs_a_generated_kernel():
    class M(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return _eager_attention(q, k, v, mask, 0.25)

    q, k, v = torch.randn(1, 4, 20, 16), torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    mask = torch.zeros(1, 1, 20, 20).masked_fill(~torch.ones(20, 20, dtype=torch.bool).tril(), -math.inf)
    with tilewright.config.patch(force_backend="triton"), collect_reports() as reports:
        out = torch.compile(M(), backend="tilewright")(q, k, v, mask)
    assert [k.winner.split("[")[0] for _, k in attention_reports(reports)] == ["triton.attention"]
    want = _eager_attention(q.double(), k.double(), v.double(), mask.double(), 0.25)
    assert (out.double() - want).norm() / want.norm() < 1e-5


@pytest.mark.slow
def test_hand_written_attention_keeps_eagers_nan_for_a_row_masked_throughout():
    """SDPA gives 0 where a row's mask is -inf everywhere; eager's softmax gives NaN. A rewritten
    hand-written attention answers as eager (a new-user trial found the 0); a mask filled with a
    finite value (transformers' ``finfo.min``) cannot empty a row and pays for no check."""
    def f(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + mask, -1) @ v

    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=gen) for _ in range(3))
    mask = torch.randn(2, 1, 5, 5, generator=gen)
    mask[0, 0, 1, :] = -math.inf  # query row 1 of batch 0 sees nothing
    mask[1, 0, 3, 2:] = -math.inf  # a partly masked row: finite
    want = f(q.double(), k.double(), v.double(), mask.double())
    for race in ("auto", "off"):
        torch._dynamo.reset()
        with tilewright.config.patch(graph_race=race), collect_reports() as reports:
            compiled = torch.compile(f, backend="tilewright")
            outs = [compiled(q, k, v, mask) for _ in range(4)]  # the race's both sides
        assert attention_reports(reports), "the hand-written attention was not recognised"
        assert race == "auto" or any("all" in k.op.split("+") for r in reports for k in r.kernels)
        for out in outs:
            assert torch.equal(out.isnan(), want.isnan()) and out[0, 0, 1].isnan().all()
            ok = ~want.isnan()
            assert (out[ok].double() - want[ok]).norm() / want[ok].norm() < 1e-5

    def g(q, k, v, keep):
        mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
        return f(q, k, v, mask)

    keep = torch.rand(2, 1, 5, 5, generator=gen) > 0.3
    torch._dynamo.reset()
    with tilewright.config.patch(graph_race="off"), collect_reports() as reports:
        out = torch.compile(g, backend="tilewright")(q, k, v, keep)
    ops = [k.op.split("+") for r in reports for k in r.kernels]
    assert attention_reports(reports) and not [op for op in ops if "all" in op], ops  # no empty-row check
    want = g(q.double(), k.double(), v.double(), keep)
    assert (out.double() - want).norm() / want.norm() < 1e-5


def test_demo_llama_training_step_runs_attention_through_generated_kernels(tmp_path):
    """The demo's Llama (fp32, GQA, causal SDPA) forward and backward with generated kernels
    forced: attention runs as Triton kernels (no SDPA ATen call left) and loss and gradients
    match a float64 copy."""
    from tilewright.demo.models import build_llama, llama_inputs

    m = build_llama(torch.float32)
    ids = llama_inputs(batch=1, seq=20)
    with tilewright.config.patch(force_backend="triton", debug_dir=str(tmp_path)), collect_reports() as reports:
        out = torch.compile(m, backend="tilewright")(ids, labels=ids)
        out.loss.backward()
    found = attention_reports(reports)
    assert len(found) == 4 and all(k.winner.startswith("triton.attention") for _, k in found)
    assert aten_attention_calls(tmp_path) == []
    ref = build_llama(torch.float64)
    ref.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
    want = ref(ids, labels=ids)
    want.loss.backward()
    assert abs(out.loss.item() - want.loss.item()) < 1e-5
    for (name, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        if q.grad is not None:
            assert (p.grad.double() - q.grad).norm() / q.grad.norm() < 1e-4, name


def _fake_graph(target, args, kwargs, n_outputs, used=None):
    """A one-op FX graph over fake CUDA tensors (no GPU needed) and the op's node."""
    import operator

    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    g = fx.Graph()
    nodes = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Size):
            with mode:
                val = torch.empty(a, dtype=torch.bfloat16, device="cuda")
            p = g.placeholder(f"x{i}")
            p.meta["val"] = val
            nodes.append(p)
        else:
            nodes.append(a)
    node = g.call_function(target, tuple(nodes), kwargs)
    with mode:
        node.meta["val"] = target(*[n.meta["val"] if isinstance(n, torch.fx.Node) else n for n in nodes], **kwargs)
    outs = []
    for i in (used if used is not None else range(n_outputs)):
        item = g.call_function(operator.getitem, (node, i))
        item.meta["val"] = node.meta["val"][i]
        outs.append(item)
    g.output(tuple(outs))
    return fx.GraphModule(torch.nn.Module(), g), node


def test_cuda_sdpa_ops_lower_to_problems_without_a_gpu():
    from tilewright.compiler.lower_attention import NotAttention, lower_node

    aten = torch.ops.aten
    s = torch.Size((2, 8, 128, 64))
    gm, node = _fake_graph(aten._scaled_dot_product_flash_attention.default, (s, s, s, 0.0, True, False),
                           {"scale": 0.125}, 2)
    p, args, outs = lower_node(node, gm)
    assert (p.direction, p.causal, p.empty_lse, p.dtype, p.scale) == ("forward", True, -math.inf, "bf16", 0.125)
    assert args == ["x0", "x1", "x2"]
    # the efficient kernel's lse is padded to a multiple of 32 rows: lowered only while unread
    bias = torch.Size((2, 1, 128, 128))
    gm, node = _fake_graph(aten._scaled_dot_product_efficient_attention.default, (s, s, s, bias, True, 0.0, False),
                           {}, 2, used=[0])
    p, args, _ = lower_node(node, gm)
    assert p.score_mod and len(p.captures) == 1 and args == ["x0", "x1", "x2", "x3"]
    gm, node = _fake_graph(aten._scaled_dot_product_efficient_attention.default, (s, s, s, bias, True, 0.0, False),
                           {}, 2)
    with pytest.raises(NotAttention, match="padded lse"):
        lower_node(node, gm)
    # causal with Sq != Skv on the GPU: the kernels' alignment differs, so it stays on ATen
    gm, node = _fake_graph(aten._scaled_dot_product_flash_attention.default,
                           (s, torch.Size((2, 8, 96, 64)), torch.Size((2, 8, 96, 64)), 0.0, True, False), {}, 2)
    with pytest.raises(NotAttention, match="causal"):
        lower_node(node, gm)
