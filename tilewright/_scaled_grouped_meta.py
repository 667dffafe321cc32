"""A fake-tensor (Meta) kernel for ``aten._scaled_grouped_mm_v2`` (``F.scaled_grouped_mm``).

Torch 2.11 and 2.13 register none (``aten._scaled_grouped_mm``, the v1 op, has one): tracing
``F.scaled_grouped_mm`` with fake tensors ran the op on the CPU and failed ("Could not run
'aten::_scaled_grouped_mm_v2' with arguments from the 'CPU' backend"), so Dynamo could not
capture a model that calls it, on any device. The output is what the v1 meta computes for the
same operands (``_create_grouped_mm_output_tensor``: (M, N) for 2d3d, (G, M, N) for 2d2d and
3d3d, (M, N_total) for 3d2d; bf16 unless ``out_dtype``). Registered once, when Dynamo's trace
rules load (:mod:`tilewright._dynamo_registration`) and when the lowering module is imported,
and only where torch has no Meta kernel of its own.
"""

from __future__ import annotations

_lib = None


def register() -> bool:
    """Register the Meta kernel unless one exists; True when this call registered it."""
    global _lib
    import torch

    name = "aten::_scaled_grouped_mm_v2"
    if _lib is not None or not hasattr(torch.ops.aten, "_scaled_grouped_mm_v2") or \
            torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"):
        return False
    try:
        from torch._meta_registrations import _create_grouped_mm_output_tensor
    except ImportError:  # a torch without the helper: leave the op as torch has it
        return False

    def meta(mat_a, mat_b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, offs=None, bias=None,
             out_dtype=None, contraction_dim=(), use_fast_accum=False):
        torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                     lambda: f"Multiplicands must be 2D or 3D, got {mat_a.dim()}D and {mat_b.dim()}D")
        torch._check(mat_a.size(-1) == mat_b.size(-2) or (mat_a.dim() == 2 and mat_b.dim() == 2),
                     lambda: "contraction dimension of mat_a and mat_b must match")
        torch._check((mat_a.dim() == 3 and mat_b.dim() == 3) or offs is not None,
                     lambda: "Offsets tensor not provided, but is needed for 2D multiplicand layouts")
        return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or torch.bfloat16)

    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_scaled_grouped_mm_v2", meta, "Meta")
    return True
