"""The decomposition table aot_autograd applies before lowering.

Deliberately small. tilewright generates GEMM kernels and fuses elementwise epilogues into them;
everything else runs on ATen, where a whole op (``native_layer_norm``, ``_softmax``, SDPA) is
faster than the dozen primitive ops a full decomposition would leave behind. So only ops that
turn *into* GEMMs are decomposed:

* ``addmv``, ``mv``, ``dot``, ``addbmm``, ``addr``, ``outer``: become mm/bmm + elementwise ops;

and, on purpose, nothing of scaled dot-product attention: the decomposition of
``_scaled_dot_product_flash_attention_for_cpu`` hands its backward the attention probabilities
where it expects the logsumexp, and training gradients come out wrong (DESIGN.md, measured
relative error up to ~7e4 on a Llama). CompositeImplicit ops (``linear``, ``matmul``,
``einsum``) are decomposed by aot_autograd regardless.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._decomp import get_decompositions

aten = torch.ops.aten

# ops whose decomposition exposes a GEMM tilewright can lower
GEMM_EXPOSING = [aten.addmv, aten.mv, aten.dot, aten.addbmm, aten.addr, aten.outer]
# must never be decomposed (see module docstring)
KEEP_WHOLE = [
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
    aten.scaled_dot_product_attention,
]


def decomposition_table() -> dict[Any, Callable]:
    """The OpOverload → decomposition mapping handed to aot_autograd."""
    table = get_decompositions(GEMM_EXPOSING)
    kept = {getattr(p, name) for p in KEEP_WHOLE for name in p.overloads()}
    return {op: fn for op, fn in table.items() if op not in kept}
