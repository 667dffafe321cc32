"""Block-scaled ``F.scaled_grouped_mm`` / ``torch._scaled_grouped_mm`` (MoE experts in MXFP8,
MXFP4, NVFP4) rewritten to ``tilewright.scaled_grouped_mm`` (:mod:`tilewright.kernels.scaled_grouped`),
before lowering (this kind's ``rewrite_fx`` hook; lowering then makes the call a grouped-GEMM
kernel node whose problem's dtype is the recipe, tuned among the block-scaled templates), with what follows fused into its epilogue as the grouped kind fuses it
after ``F.grouped_mm`` (:mod:`tilewright.kinds.grouped_gemm.lower`): the MoE gate_up
projection's gated product ``act(gate) * up`` (``glu``), then a unary activation.

What PyTorch traces (ATen), the 2d3d case (the MoE forward: tokens (M_total, K) in ragged
groups by ``offs``, experts' weights ``mat_b`` (G, K, N), column-major, i.e. stored (G, N, K)):

* ``aten._scaled_grouped_mm(a, b, scale_a, scale_b, offs, bias, scale_result, out_dtype,
  use_fast_accum)``: block-scaled (MXFP8) when both scales are ``float8_e8m0fnu``; their layout
  is torch's inference (SWIZZLE_32_4_4 on CUDA builds, NO_SWIZZLE on ROCm builds);
* ``aten._scaled_grouped_mm_v2(a, b, scale_a[], recipe_a[], swizzle_a[], scale_b[], recipe_b[],
  swizzle_b[], offs, bias, out_dtype, contraction_dim, use_fast_accum)``: recipes
  ``[BlockWise1x32]`` (MXFP8 with e4m3 operands, MXFP4 with ``float4_e2m1fn_x2``),
  ``[BlockWise1x16]`` (NVFP4) or ``[BlockWise1x16, TensorWise]`` (NVFP4 with fp32 global
  decode scales, one per group: (G,) each, their product the group's alpha).

A's swizzled scales are each group's own SWIZZLE_32_4_4 block, concatenated (their size depends
on the group sizes), decoded on the device by ``tilewright.grouped_scales_rows``; B's are one
block per expert, ``tilewright.stacked_scales_rows``; NO_SWIZZLE scales are row-major
(M_total, K/block) and (G, N, K/block), a ``reshape``. A call that does not fit (other cases,
row-wise fp8 with fp32 scales, a bias, a contraction_dim, fp8 outputs, operands not K-contiguous,
K, N or G varying at run time) stays ATen's, its reason logged and kept in
``node.meta["tilewright_aten_reason"]``.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from tilewright import _scaled_grouped_meta
from tilewright.compiler.lower import is_op
from tilewright.kinds.gemm.lower_scaled import (
    BLOCK_1X16, E4M3, E8M0, FP4, NO_SWIZZLE, OUT_DTYPES, SWIZZLE_32_4_4, TENSORWISE, Refused, _Builder, _fmt,
    _recipe, _static, _val,
)
from tilewright.quant.scales import swizzled_numel

log = logging.getLogger("tilewright.compiler")
aten = torch.ops.aten
_scaled_grouped_meta.register()

V1 = aten._scaled_grouped_mm.default
V2 = getattr(aten, "_scaled_grouped_mm_v2", None)
V2 = V2.default if V2 is not None else None
OURS = "tilewright::scaled_grouped_mm"  # the public op (tilewright.kernels), by name
ACTIVATION, GLU = 9, 10  # the op's argument indices of its fused activation and gated product


def op(name: str):
    """``torch.ops.tilewright.<name>.default``: the public ops of
    :mod:`tilewright.kernels.scaled_grouped`, the layer above the compiler, imported when a
    graph is first rewritten."""
    import tilewright.kernels.scaled_grouped  # noqa: F401 - registers them

    return getattr(torch.ops.tilewright, name).default


def __getattr__(name: str):
    if name in ("OP", "GROUPED_ROWS", "STACKED_ROWS"):
        return op({"OP": "scaled_grouped_mm", "GROUPED_ROWS": "grouped_scales_rows",
                   "STACKED_ROWS": "stacked_scales_rows"}[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_scaled(target) -> bool:
    """Whether an FX node's target is ``tilewright.scaled_grouped_mm`` (compared by name)."""
    return is_op(target, OURS)


def _plan_v1(node: fx.Node) -> dict:
    names = ("self", "mat2", "scale_a", "scale_b", "offs", "bias", "scale_result", "out_dtype", "use_fast_accum")
    bound = dict(zip(names, node.args)) | dict(node.kwargs)
    sa, sb = _val(bound["scale_a"]), _val(bound["scale_b"])
    if sa is None or sb is None or sa.dtype != E8M0 or sb.dtype != E8M0:
        raise Refused("not block-scaled (row-wise fp8 with float32 scales has no tilewright grouped template)")
    if bound.get("scale_result") is not None:
        raise Refused("a scale_result (fp8 output scaling)")
    swizzle = NO_SWIZZLE if torch.version.hip else SWIZZLE_32_4_4  # torch's inference, as for _scaled_mm
    return dict(bound, block=32, scales_a=[bound["scale_a"]], scales_b=[bound["scale_b"]],
                swizzle_a=swizzle, swizzle_b=swizzle)


def _plan_v2(node: fx.Node) -> dict:
    names = ("self", "mat2", "scale_a", "recipe_a", "swizzle_a", "scale_b", "recipe_b", "swizzle_b", "offs",
             "bias", "out_dtype", "contraction_dim", "use_fast_accum")
    bound = dict(zip(names, node.args)) | dict(node.kwargs)
    if list(bound.get("contraction_dim") or []):
        raise Refused(f"contraction_dim {bound['contraction_dim']}")
    block_a, swz_a, two_a = _recipe(bound["recipe_a"], bound["swizzle_a"], "A")
    block_b, swz_b, two_b = _recipe(bound["recipe_b"], bound["swizzle_b"], "B")
    if (block_a, two_a) != (block_b, two_b):
        raise Refused("different recipes for A and B")
    return dict(bound, block=block_a, scales_a=list(bound["scale_a"]), scales_b=list(bound["scale_b"]),
                swizzle_a=swz_a, swizzle_b=swz_b)


def _stored_b(build: _Builder, mat2: fx.Node) -> fx.Node:
    """B as stored, (G, N, K/vpb): the input of mat2's last-two-dims transpose when it is one."""
    if mat2.op == "call_function" and len(mat2.args) >= 2:
        src = mat2.args[0]
        v = _val(src)
        if isinstance(v, torch.Tensor) and v.dim() == 3 and (
                (mat2.target is aten.transpose.int and sorted(int(d) % 3 for d in mat2.args[1:3]) == [1, 2])
                or (mat2.target is aten.permute.default and [int(d) % 3 for d in mat2.args[1]] == [0, 2, 1])):
            return src
    return build.call(aten.transpose.int, mat2, -2, -1)


def _scales_a(build: _Builder, scale: fx.Node, swizzle: int, offs: fx.Node, rows, cols: int) -> fx.Node:
    s = _val(scale)
    if not s.is_contiguous():
        raise Refused("A's block scales are not contiguous")
    if swizzle == SWIZZLE_32_4_4:
        tile = swizzled_numel(128, cols)  # each group's scales are whole 128-row tiles
        if isinstance(s.numel(), int) and s.numel() % tile:
            raise Refused(f"A's per-group SWIZZLE_32_4_4 scales have {s.numel()} elements, not whole 128-row tiles")
        return build.call(op("grouped_scales_rows"), scale, offs, rows, cols)
    if swizzle != NO_SWIZZLE:
        raise Refused(f"swizzle type {swizzle}")
    if isinstance(rows, int) and s.numel() != rows * cols:
        raise Refused(f"NO_SWIZZLE A scales with {s.numel()} elements for {rows}x{cols} blocks")
    return build.call(aten.reshape.default, scale, [rows, cols])


def _scales_b(build: _Builder, scale: fx.Node, swizzle: int, G: int, N: int, cols: int) -> fx.Node:
    s = _val(scale)
    if not s.is_contiguous():
        raise Refused("B's block scales are not contiguous")
    if swizzle == SWIZZLE_32_4_4:
        if s.numel() != G * swizzled_numel(N, cols):
            raise Refused(f"B's SWIZZLE_32_4_4 scales have {s.numel()} elements, {G} experts x {N}x{cols} "
                          f"blocks need {G * swizzled_numel(N, cols)}")
        return build.call(op("stacked_scales_rows"), scale, G, N, cols)
    if swizzle != NO_SWIZZLE:
        raise Refused(f"swizzle type {swizzle}")
    if s.numel() != G * N * cols:
        raise Refused(f"NO_SWIZZLE B scales with {s.numel()} elements for {G}x{N}x{cols} blocks")
    return build.call(aten.reshape.default, scale, [G, N, cols])


def _rewrite(gm: fx.GraphModule, node: fx.Node, plan: dict) -> None:
    a, mat2, offs = plan["self"], plan["mat2"], plan.get("offs")
    va, vb, vo = _val(a), _val(mat2), _val(node)
    if not all(isinstance(v, torch.Tensor) for v in (va, vb, vo)):
        raise Refused("operands without traced tensor values")
    if (va.dim(), vb.dim()) != (2, 3):
        raise Refused(f"the {va.dim()}d{vb.dim()}d case (tilewright's block-scaled grouped GEMM is 2d3d, the MoE forward)")
    if offs is None or _val(offs) is None:
        raise Refused("no offsets")
    if plan.get("bias") is not None:
        raise Refused("a bias (torch's grouped GEMMs take none either)")
    fmt = _fmt(va, vb, plan["block"])
    vpb = 2 if va.dtype == FP4 else 1
    G, Kp, N = _static(vb.shape[0]), _static(vb.shape[1]), _static(vb.shape[2])
    K, block = Kp * vpb, plan["block"]
    if K % block or K == 0:
        raise Refused(f"K={K} is not a multiple of the {block}-value scale block")
    if vo.dtype not in OUT_DTYPES:
        raise Refused(f"output dtype {vo.dtype} (the block-scaled grouped GEMM writes fp32/fp16/bf16)")
    if va.stride(1) != 1 or vb.stride(1) != 1:
        raise Refused("operands that are not K-contiguous (torch wants A row-major and mat_b column-major)")
    two_level = len(plan["scales_a"]) == 2
    if two_level:
        for g in (plan["scales_a"][1], plan["scales_b"][1]):
            vg = _val(g)
            if not isinstance(vg, torch.Tensor) or vg.dtype != torch.float32 or vg.numel() != G:
                raise Refused(f"NVFP4 global scales that are not fp32 with one value per group ({G})")
    build = _Builder(gm, node)
    try:
        M = va.shape[0]
        if isinstance(M, torch.SymInt):  # the token count as a value of the graph
            M = build.call(aten.sym_size.int, a, 0)
        b = _stored_b(build, mat2)
        if vpb == 2:  # packed fp4 as its bytes: the op's contract
            a, b = build.call(aten.view.dtype, a, torch.uint8), build.call(aten.view.dtype, b, torch.uint8)
        sa = _scales_a(build, plan["scales_a"][0], plan["swizzle_a"], offs, M, K // block)
        sb = _scales_b(build, plan["scales_b"][0], plan["swizzle_b"], G, N, K // block)
    except Refused:
        build.undo()
        raise
    ga, gb = (plan["scales_a"][1], plan["scales_b"][1]) if two_level else (None, None)
    node.target, node.kwargs = op("scaled_grouped_mm"), {}
    node.args = (a, sa, b, sb, offs, ga, gb, fmt, vo.dtype, "none", "none")
    if isinstance(mat2, fx.Node) and not mat2.users:
        gm.graph.erase_node(mat2)


def rewrite_scaled_grouped_mm(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Retarget one block-scaled ``_scaled_grouped_mm``/``_v2`` call to
    ``tilewright.scaled_grouped_mm``, in place (module docstring); False, with the reason logged
    and kept in ``node.meta["tilewright_aten_reason"]``, when it stays ATen's."""
    if node.op != "call_function" or node.target not in (V1, V2) or node.target is None:
        return False
    try:
        _rewrite(gm, node, _plan_v1(node) if node.target is V1 else _plan_v2(node))
        return True
    except Refused as why:
        node.meta["tilewright_aten_reason"] = str(why)
        log.info("tilewright: %s (%s) stays on ATen: %s", node.name, node.target, why)
        return False


def fuse_glu(gm: fx.GraphModule) -> int:
    """Fold ``act(y[..., :N/2]) * y[..., N/2:]`` of ``y = tilewright.scaled_grouped_mm(...)``
    into the call (``glu=act``: the kernel computes both halves and writes the product) when
    nothing else reads ``y``, its halves or the activation, in place; the number folded. The
    ``mul`` node becomes the call (its name, meta and users kept)."""
    from tilewright.compiler.graph import TensorMeta
    from tilewright.kinds.grouped_gemm.lower import _activation, _halves, _only_user, _static as size

    folded = 0
    for node in list(gm.graph.nodes):
        if not is_op(node.target, OURS) or node.args[ACTIVATION] != "none" or node.args[GLU] != "none":
            continue
        meta = TensorMeta.of(node)
        n = size(meta.shape[-1]) if meta is not None else None
        if n is None or n % 2 or (found := _halves(node, n, meta.ndim)) is None:
            continue
        gate, up, splits = found
        act, mul = _only_user(gate), _only_user(up)
        kind = _activation(act, gate) if act is not None else None
        if kind is None or mul is None or mul.target is not aten.mul.Tensor or _only_user(act) is not mul \
                or set(mul.args) != {act, up} or len(mul.args) != 2 or mul.kwargs:
            continue
        mul.target, mul.kwargs = node.target, {}
        mul.args = tuple(node.args[:ACTIVATION]) + ("none", kind)
        for dead in [act] + splits + [node]:
            gm.graph.erase_node(dead)
        folded += 1
    return folded


def fuse_activations(gm: fx.GraphModule) -> int:
    """Fold ``act(tilewright.scaled_grouped_mm(...))`` (its only user, a unary activation) into
    the call's epilogue, in place; the number folded."""
    from tilewright.kinds.grouped_gemm.lower import _activation, _only_user

    folded = 0
    for node in list(gm.graph.nodes):
        if not is_op(node.target, OURS) or node.args[ACTIVATION] != "none":
            continue
        user = _only_user(node)
        kind = _activation(user, node) if user is not None else None
        if kind is None:
            continue
        user.target, user.kwargs = node.target, {}
        user.args = tuple(node.args[:ACTIVATION]) + (kind, node.args[GLU])
        gm.graph.erase_node(node)
        folded += 1
    return folded


def rewrite_all(gm: fx.GraphModule) -> int:
    """:func:`rewrite_scaled_grouped_mm` on every node, then :func:`fuse_glu` and
    :func:`fuse_activations`; the number of nodes retargeted or folded."""
    done = sum(rewrite_scaled_grouped_mm(gm, n) for n in list(gm.graph.nodes))
    if done:
        done += fuse_glu(gm)
        done += fuse_activations(gm)
    if done:
        gm.recompile()
    return done
