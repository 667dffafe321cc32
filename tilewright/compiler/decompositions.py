"""The decomposition table aot_autograd applies before lowering.

Deliberately chosen, not the full core-ATen set. Ops are decomposed when what they decompose to
is something tilewright generates: ops that turn *into* GEMMs,

* ``addmv``, ``mv``, ``dot``, ``addbmm``, ``addr``, ``outer``: become mm/bmm + elementwise ops;

and, while loop kernels are on (``config.loop_kernels``), composite ops whose parts are pointwise
ops and reductions (softmax, log-softmax, layer/group/RMS norm, the losses, and their backward
formulas): the scheduler fuses the parts back into one kernel each. Everything else stays whole
and runs on ATen;

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


# composite ops whose decomposition is pointwise ops and reductions the loop lowering handles:
# the scheduler fuses them back into one kernel each (softmax, layer norm, ...), and their
# backward formulas come out the same way
LOOP_EXPOSING = [
    aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
    aten.native_layer_norm, aten.native_layer_norm_backward, aten.nll_loss_forward,
    aten.nll_loss_backward, aten.logsumexp, aten.native_group_norm, aten.native_group_norm_backward,
    aten.rms_norm, aten._fused_rms_norm, aten._fused_rms_norm_backward, aten.silu_backward,
    aten.gelu_backward, aten.mse_loss, aten.mse_loss_backward, aten.binary_cross_entropy,
    aten.binary_cross_entropy_backward, aten.huber_loss, aten.smooth_l1_loss, aten.glu,
    aten.glu_backward, aten.hardswish_backward,
    aten.hardsigmoid_backward, aten.leaky_relu_backward, aten.softplus_backward,
    aten.elu_backward, aten.nll_loss2d_forward,
    # SDPA's math form (a mask that requires grad, 5-D inputs): rows all -inf give 0
    aten._safe_softmax,
    # a static KV cache's write (transformers' StaticCache): an index_put, a scatter kernel
    aten.index_copy,
]


def decomposition_table() -> dict[Any, Callable]:
    """The OpOverload → decomposition mapping handed to aot_autograd (the loop-exposing ones
    only while ``config.loop_kernels`` is on)."""
    from tilewright._config import config

    from tilewright.compiler.native import tagged

    ops = GEMM_EXPOSING + (LOOP_EXPOSING if config.loop_kernels else [])
    table = get_decompositions(ops)
    kept = {getattr(p, name) for p in KEEP_WHOLE for name in p.overloads()}
    # the loop-exposing ones remember the call they replaced (compiler/native.py): a kernel the
    # scheduler fuses back into exactly that op can then run it natively
    loop = set(get_decompositions(LOOP_EXPOSING)) if config.loop_kernels else set()
    return {op: tagged(op, fn) if op in loop else fn for op, fn in table.items() if op not in kept}
