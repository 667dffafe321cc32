"""The fusion scheduler puts composite ops back together: RMSNorm, LayerNorm, softmax, a GELU
MLP's activation and rotary embeddings each become exactly ONE generated loop kernel with no
ATen pointwise op left beside it, and train (forward and backward through aot_autograd) to the
same values and gradients as eager, in float64."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from loop_check import check_against_eager, check_training

F = torch.nn.functional
BF16 = torch.bfloat16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Seeded normal values."""
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


def randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random normal (no ones and zeros from the initialiser)."""
    g = _gen(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p.ndim == 1 else 0.0))
    return module


class RMSNorm(nn.Module):
    """RMSNorm as Llama writes it: in fp32, cast back, then the weight."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Softmax(nn.Module):
    """Scaled softmax over the last dim (attention scores)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 0.125, dim=-1)


class GeluMLP(nn.Module):
    """Linear, GELU, linear: the GEMMs stay GEMMs, the GELU is one loop kernel."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the last dim's halves."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Rotary position embedding (Llama's apply_rotary_pos_emb on q)."""

    def __init__(self, seq: int, dim: int):
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        freqs = torch.arange(seq).float()[:, None] * inv[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return q * self.cos + rotate_half(q) * self.sin


B, S, H, D = 2, 5, 3, 8  # odd sequence, few heads: ragged blocks everywhere
MODULES = {
    "rms_norm": (lambda: randomise(RMSNorm(24)), (B, S, 24)),
    "layer_norm": (lambda: randomise(nn.LayerNorm(24)), (B, S, 24)),
    "softmax": (lambda: Softmax(), (B, H, S, 12)),
    "gelu_mlp": (lambda: randomise(GeluMLP(16, 32)), (B, S, 16)),
    "rotary": (lambda: Rotary(S, D), (B, H, S, D)),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_composite_op_is_one_loop_kernel_and_trains_like_eager(name):
    make, shape = MODULES[name]
    module = make()
    # the MLP's GELU rides in the up-projection's epilogue, which also stores the saved product
    reports = check_training(module, randn(*shape, seed=1).requires_grad_(),
                             fwd_kernels=0 if name == "gelu_mlp" else 1)
    fwd = next(r for r in reports if r.kind == "forward")
    bwd = next(r for r in reports if r.kind == "backward")
    if name == "gelu_mlp":
        assert any(g.epilogue.startswith("(store acc)") and "gelu" in g.epilogue for g in fwd.gemms)
    assert fwd.extern_ops == 0, f"ATen ops left in the forward: {fwd.extern_ops}"
    assert bwd.extern_ops == 0, f"ATen ops left in the backward: {bwd.extern_ops}"
    # the GEMMs stay GEMMs (two forward, four backward), everything else is generated
    assert fwd.gemm_nodes == (2 if name == "gelu_mlp" else 0)
    assert bwd.gemm_nodes == (4 if name == "gelu_mlp" else 0)
    # a backward needs at most one kernel for the input's gradient and one per parameter
    # reduction over the other axis (LayerNorm's weight and bias share it)
    assert 1 <= bwd.loop_kernels <= 3


@pytest.mark.parametrize("name", sorted(MODULES))
def test_composite_op_is_one_loop_kernel_in_inference(name):
    make, shape = MODULES[name]
    module = make()
    # inference: the GELU has one user and folds into the up-projection's epilogue
    with torch.no_grad():
        reports = check_against_eager(module, randn(*shape, seed=1), kernels=0 if name == "gelu_mlp" else 1,
                                      ref_fn=copy.deepcopy(module).double())
    (graph,) = reports
    assert graph.extern_ops == 0
    assert graph.gemm_nodes == (2 if name == "gelu_mlp" else 0)


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "softmax", "rotary"])
def test_composite_op_trains_like_eager_in_bf16(name):
    make, shape = MODULES[name]
    module = make().to(BF16)
    reports = check_training(module, randn(*shape, dtype=BF16, seed=1).requires_grad_(), fwd_kernels=1)
    assert all(r.extern_ops == 0 for r in reports)


def test_a_transformer_block_norm_attention_scores_and_mlp_fuse_around_the_gemms():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = RMSNorm(16)
            self.mlp = GeluMLP(16, 32)

        def forward(self, x):
            h = self.norm(x)
            scores = torch.softmax(h @ h.transpose(-1, -2) * 0.25, dim=-1)
            return x + self.mlp(scores @ h)

    block = randomise(Block())
    reports = check_training(block, randn(B, S, 16, seed=1).requires_grad_())
    fwd = next(r for r in reports if r.kind == "forward")
    assert fwd.extern_ops == 0
    # RMSNorm, softmax and the GELU: three kernels at most around the GEMMs
    assert fwd.loop_kernels <= 3


@pytest.mark.parametrize("name", ["softmax_dim0", "softmax_dim0_square", "softmax_dim1_of_3d",
                                  "centre_columns", "normalise_columns"])
def test_softmax_over_a_leading_dim_is_one_loop_kernel(name):
    # the fusion builder placed pointwise members on (outer, reduced) in that order only; a
    # reduction over a leading dim reads them at (reduced, outer): they are placed by the data
    # flow now (kinds/loop/fusion/build.py, _Builder._place_by_flow), square shapes included
    fn, shape = {"softmax_dim0": (lambda a: a.softmax(0), (7, 13)),
                 "softmax_dim0_square": (lambda a: a.softmax(0), (6, 6)),
                 "softmax_dim1_of_3d": (lambda a: a.softmax(1) * 2, (3, 5, 6)),
                 "centre_columns": (lambda a: a - a.mean(0, keepdim=True), (7, 7)),
                 "normalise_columns": (lambda a: a / a.norm(dim=0, keepdim=True), (9, 4))}[name]
    check_against_eager(fn, randn(*shape), kernels=1)


def test_softmax_over_a_leading_dim_trains_in_one_kernel_each_way():
    check_training(lambda a: a.softmax(0), randn(7, 13).requires_grad_(), fwd_kernels=1, bwd_kernels=1)

