"""Block-scaled ``torch._scaled_mm`` / ``F.scaled_mm`` rewritten to tilewright's block-scaled GEMM
ops, before lowering (the GEMM kind's ``rewrite_fx`` hook), so they become one GEMM node with the
IR epilogue fused (:func:`tilewright.kinds.gemm.lower.lower_mx_mm` / ``lower_nvfp4_mm``).

What PyTorch traces (ATen):

* ``aten._scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)``
  (``torch._scaled_mm``): block-scaled when both scales are ``float8_e8m0fnu`` (MX: MXFP8 with
  e4m3 operands, MXFP4 with ``float4_e2m1fn_x2``; one scale per 32 values) or ``float8_e4m3fn``
  with fp4 operands (NVFP4, one scale per 16 values, no global scale). The scale layout is
  torch's own inference (``torch._inductor.utils.infer_scale_swizzle``): SWIZZLE_32_4_4 on
  CUDA builds of torch, NO_SWIZZLE on ROCm builds;
* ``aten._scaled_mm_v2(a, b, scale_a[], recipe_a[], swizzle_a[], scale_b[], recipe_b[],
  swizzle_b[], bias, out_dtype, contraction_dim, use_fast_accum)`` (``F.scaled_mm``): recipes
  ``[BlockWise1x32]`` (MX), ``[BlockWise1x16]`` (NVFP4, single level) or ``[BlockWise1x16,
  TensorWise]`` (NVFP4 with fp32 global decode scales), each with its swizzle (an empty list is
  NO_SWIZZLE). Tensor-wise and row-wise fp8 recipes become the equivalent ``aten._scaled_mm``
  call, which lowering makes an fp8 GEMM with the scales in its epilogue.

Each becomes ``tilewright.mx_mm(a, sa, b, sb, None, bias, fmt, out_dtype)`` (MX, single-level
NVFP4) or ``tilewright.nvfp4_mm(a, sa, gsa, b, sb, gsb, bias, out_dtype)`` (two-level NVFP4, the
global scales as the GEMM's alpha) on B as stored, (N, K/vpb) (``mat2`` is its transposed view),
with row-major scales: swizzled ones pass through ``tilewright.block_scales_rows`` (the layout
decoded as :mod:`tilewright.quant.scales` documents), plain ones through a ``reshape`` view.
A call that does not fit (other recipes, e5m2 or fp8 outputs, a contraction_dim, operands that
are not K-contiguous, a K or N that varies at run time) stays ATen's: it is logged with its
reason and stored in ``node.meta["tilewright_aten_reason"]``. ``_scaled_grouped_mm`` and its v2 are
the grouped-GEMM kind's (:mod:`tilewright.kinds.grouped_gemm.scaled`).
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.fx as fx
from torch.fx.node import map_arg

from tilewright.quant.scales import swizzled_numel

log = logging.getLogger("tilewright.compiler")
aten = torch.ops.aten

SCALED_MM = aten._scaled_mm.default
SCALED_MM_V2 = getattr(aten, "_scaled_mm_v2", None)
SCALED_MM_V2 = SCALED_MM_V2.default if SCALED_MM_V2 is not None else None
# the public ops a rewrite retargets to (tilewright.kernels, the layer above the compiler),
# imported when a graph is first rewritten; MX_MM, NVFP4_MM and ROWS read as the ops themselves
_OPS = {"MX_MM": "mx_mm", "NVFP4_MM": "nvfp4_mm", "ROWS": "block_scales_rows"}


def op(name: str):
    """The default overload of ``torch.ops.tilewright.<name>``, its module imported first."""
    import tilewright.kernels.mx  # noqa: F401 - mx_mm
    import tilewright.kernels.nvfp4  # noqa: F401 - nvfp4_mm
    import tilewright.kernels.scaled  # noqa: F401 - block_scales_rows

    return getattr(torch.ops.tilewright, name).default


def __getattr__(name: str):
    if name in _OPS:
        return op(_OPS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# torch.nn.functional.ScalingType / SwizzleType values (the same in torch 2.11 and 2.13)
TENSORWISE, ROWWISE, BLOCK_1X16, BLOCK_1X32 = 0, 1, 2, 3
NO_SWIZZLE, SWIZZLE_32_4_4 = 0, 1
FP4 = torch.float4_e2m1fn_x2
E8M0, E4M3 = torch.float8_e8m0fnu, torch.float8_e4m3fn
OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TRANSPOSES = (aten.t.default, aten.transpose.int, aten.permute.default)


class Refused(Exception):
    """This call stays ATen's; the message says why."""


class _AsV1(Exception):
    """A tensor- or row-wise fp8 ``_scaled_mm_v2``: the same call as ``_scaled_mm``'s (scales
    multiplied in the epilogue), which :func:`tilewright.kinds.gemm.lower.lower_scaled_mm` takes."""

    def __init__(self, bound: dict):
        super().__init__()
        self.bound = bound


def _val(x):
    return x.meta.get("val") if isinstance(x, fx.Node) else None


def _static(n) -> int:
    if isinstance(n, torch.SymInt):
        raise Refused("a K or N that varies at run time (the weight's sizes must be fixed)")
    return int(n)


def _fmt(a: torch.Tensor, b: torch.Tensor, block: int) -> str:
    if a.dtype != b.dtype:
        raise Refused(f"mixed operand dtypes {a.dtype} and {b.dtype}")
    if block == 16:
        if a.dtype != FP4:
            raise Refused(f"1x16 block scales with {a.dtype} operands (NVFP4 needs float4_e2m1fn_x2)")
        return "nvfp4"
    if a.dtype == FP4:
        return "mxfp4"
    if a.dtype == E4M3:
        return "mxfp8"
    raise Refused(f"1x32 block scales with {a.dtype} operands (tilewright's MX GEMMs take e4m3 or fp4)")


def _plan_v1(node: fx.Node) -> dict:
    names = ("self", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")
    bound = dict(zip(names, node.args)) | dict(node.kwargs)
    sa, sb = _val(bound["scale_a"]), _val(bound["scale_b"])
    if sa is None or sb is None or sa.dtype != sb.dtype or sa.dtype not in (E8M0, E4M3):
        raise Refused("not block-scaled (tensor/row-wise fp8 scaling lowers as fp8 scaled_mm)")
    if bound.get("scale_result") is not None:
        raise Refused("a scale_result (fp8 output scaling)")
    swizzle = NO_SWIZZLE if torch.version.hip else SWIZZLE_32_4_4  # torch's infer_scale_swizzle
    return dict(a=bound["self"], b=bound["mat2"], block=16 if sa.dtype == E4M3 else 32,
                scales_a=[bound["scale_a"]], scales_b=[bound["scale_b"]],
                swizzle_a=swizzle, swizzle_b=swizzle, bias=bound.get("bias"),
                out_dtype=bound.get("out_dtype"))


def _recipe(recipes, swizzles, which: str) -> tuple[int, int, bool]:
    """(block, swizzle, two-level) of one operand's recipe list."""
    recipes = [int(r) for r in recipes]
    swizzle = int(swizzles[0]) if swizzles else NO_SWIZZLE
    if recipes == [BLOCK_1X32]:
        return 32, swizzle, False
    if recipes == [BLOCK_1X16]:
        return 16, swizzle, False
    if recipes == [BLOCK_1X16, TENSORWISE]:
        return 16, swizzle, True
    raise Refused(f"scale recipe {recipes} for {which} (tilewright lowers BlockWise1x32, BlockWise1x16 "
                  "and [BlockWise1x16, TensorWise]; tensor/row-wise fp8 goes through torch._scaled_mm)")


def _plan_v2(node: fx.Node) -> dict:
    names = ("self", "mat2", "scale_a", "recipe_a", "swizzle_a", "scale_b", "recipe_b", "swizzle_b",
             "bias", "out_dtype", "contraction_dim", "use_fast_accum")
    bound = dict(zip(names, node.args)) | dict(node.kwargs)
    if list(bound.get("contraction_dim") or []) not in ([], [1, 0]):
        raise Refused(f"contraction_dim {bound['contraction_dim']}")
    recipes = ([int(r) for r in bound["recipe_a"]], [int(r) for r in bound["recipe_b"]])
    if recipes in (([TENSORWISE], [TENSORWISE]), ([ROWWISE], [ROWWISE])):
        raise _AsV1(bound)
    block_a, swz_a, two_a = _recipe(bound["recipe_a"], bound["swizzle_a"], "A")
    block_b, swz_b, two_b = _recipe(bound["recipe_b"], bound["swizzle_b"], "B")
    if (block_a, two_a) != (block_b, two_b):
        raise Refused("different recipes for A and B")
    return dict(a=bound["self"], b=bound["mat2"], block=block_a, scales_a=list(bound["scale_a"]),
                scales_b=list(bound["scale_b"]), swizzle_a=swz_a, swizzle_b=swz_b,
                bias=bound.get("bias"), out_dtype=bound.get("out_dtype"))


class _Builder:
    """Inserts calls before ``at``, each with its fake value (what lowering reads)."""

    def __init__(self, gm: fx.GraphModule, at: fx.Node):
        self.graph, self.at = gm.graph, at
        self.mode = torch._guards.detect_fake_mode([_val(at)])
        self.made: list[fx.Node] = []

    def call(self, target, *args) -> fx.Node:
        with self.graph.inserting_before(self.at):
            n = self.graph.call_function(target, args)
        self.made.append(n)
        vals = map_arg(args, _val)
        with self.mode if self.mode is not None else contextlib.nullcontext():
            n.meta["val"] = target(*vals)
        return n

    def undo(self) -> None:
        for n in reversed(self.made):
            self.graph.erase_node(n)
        self.made = []


def _scales_rows(build: _Builder, scale: fx.Node, swizzle: int, rows, cols: int) -> fx.Node:
    """Row-major (rows, cols) scales; ``rows`` an int, or an FX node of a size that varies at run
    time (its element count is then checked when the call runs: ``tilewright.block_scales_rows``
    raises, and so does the reshape, as torch's own op would)."""
    s = _val(scale)
    if isinstance(rows, fx.Node):
        if swizzle not in (SWIZZLE_32_4_4, NO_SWIZZLE):
            raise Refused(f"swizzle type {swizzle}")
        if not s.is_contiguous():
            raise Refused("scales that are not contiguous")
        return build.call(op("block_scales_rows"), scale, rows, cols) if swizzle == SWIZZLE_32_4_4 else \
            build.call(aten.reshape.default, scale, [rows, cols])
    if swizzle == SWIZZLE_32_4_4:
        if s.numel() != swizzled_numel(rows, cols):
            raise Refused(f"SWIZZLE_32_4_4 scales with {s.numel()} elements for {rows}x{cols} blocks "
                          f"(need {swizzled_numel(rows, cols)})")
        if not s.is_contiguous():
            raise Refused("swizzled scales that are not contiguous")
        return build.call(op("block_scales_rows"), scale, rows, cols)
    if swizzle != NO_SWIZZLE:
        raise Refused(f"swizzle type {swizzle}")
    if s.numel() != rows * cols:
        raise Refused(f"NO_SWIZZLE scales with {s.numel()} elements for {rows}x{cols} blocks")
    if tuple(s.shape) == (rows, cols) and s.stride() == (cols, 1):
        return scale
    if not s.is_contiguous():
        raise Refused("NO_SWIZZLE scales that are not row-major")
    return build.call(aten.reshape.default, scale, [rows, cols])


def _stored_b(build: _Builder, mat2: fx.Node) -> fx.Node:
    """B as stored, (N, K/vpb) K-contiguous: the input of mat2's transpose when it is one."""
    if mat2.op == "call_function" and mat2.target in TRANSPOSES and len(mat2.args) >= 1:
        src = mat2.args[0]
        v = _val(src)
        if isinstance(v, torch.Tensor) and v.dim() == 2 and (
                mat2.target is aten.t.default or (mat2.target is aten.transpose.int and
                                                  sorted(int(d) % 2 for d in mat2.args[1:3]) == [0, 1])
                or (mat2.target is aten.permute.default and [int(d) % 2 for d in mat2.args[1]] == [1, 0])):
            return src
    return build.call(aten.t.default, mat2)


def rewrite_scaled_mm(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Retarget one block-scaled ``_scaled_mm``/``_scaled_mm_v2`` call to tilewright's op, in
    place (module docstring); False, with the reason logged and kept in
    ``node.meta["tilewright_aten_reason"]``, when it stays ATen's."""
    if node.op != "call_function":
        return False
    try:
        if node.target is SCALED_MM:
            plan = _plan_v1(node)
        elif SCALED_MM_V2 is not None and node.target is SCALED_MM_V2:
            try:
                plan = _plan_v2(node)
            except _AsV1 as v1:
                b = v1.bound
                node.target, node.kwargs = SCALED_MM, {}
                node.args = (b["self"], b["mat2"], b["scale_a"][0], b["scale_b"][0], b.get("bias"), None,
                             b.get("out_dtype"), bool(b.get("use_fast_accum", False)))
                return True
        else:
            return False
        return _rewrite(gm, node, plan)
    except Refused as why:
        if node.target is SCALED_MM and str(why).startswith("not block-scaled"):
            return False  # lower_scaled_mm's (fp8 with fp32 scales)
        node.meta["tilewright_aten_reason"] = str(why)
        log.info("tilewright: %s (%s) stays on ATen: %s", node.name, node.target, why)
        return False


def _rewrite(gm: fx.GraphModule, node: fx.Node, plan: dict) -> bool:
    a, mat2 = plan["a"], plan["b"]
    va, vb, vo = _val(a), _val(mat2), _val(node)
    if not all(isinstance(v, torch.Tensor) for v in (va, vb, vo)) or va.dim() != 2 or vb.dim() != 2:
        raise Refused("operands that are not 2-D tensors")
    fmt = _fmt(va, vb, plan["block"])
    vpb = 2 if va.dtype == FP4 else 1
    # M (the tokens) may vary at run time; K and N (the weight's) are fixed
    # (A's K equals B's: torch checked; dynamic=True makes A's symbolic, B's is the weight's)
    M, Kp, N = va.shape[0], _static(vb.shape[0]), _static(vb.shape[1])
    K, block = Kp * vpb, plan["block"]
    if K % block or K == 0:
        raise Refused(f"K={K} is not a multiple of the {block}-value scale block")
    if vo.dtype not in OUT_DTYPES:
        raise Refused(f"output dtype {vo.dtype} (tilewright's block-scaled GEMMs write fp32/fp16/bf16)")
    if va.stride(1) != 1 or vb.stride(0) != 1:
        raise Refused("operands that are not K-contiguous (torch wants A row-major and mat2 column-major)")
    bias = plan["bias"]
    if bias is not None:
        vbias = _val(bias)
        if not isinstance(vbias, torch.Tensor) or tuple(vbias.shape) not in ((N,), (1, N)):
            raise Refused("a bias that is not a vector over N")
    build = _Builder(gm, node)
    try:
        _build(build, node, plan, fmt, vpb, M, N, K, vo.dtype)
    except Refused:
        build.undo()
        raise
    if isinstance(mat2, fx.Node) and not mat2.users:
        gm.graph.erase_node(mat2)  # the transpose whose input the GEMM now reads
    return True


def _build(build: _Builder, node: fx.Node, plan: dict, fmt: str, vpb: int, M: int, N: int, K: int,
           out_dtype: torch.dtype) -> None:
    a, mat2, bias, block = plan["a"], plan["b"], plan["bias"], plan["block"]
    two_level = len(plan["scales_a"]) == 2
    if isinstance(M, torch.SymInt):  # the size as a value of the graph, for the scales' shape
        M = build.call(aten.sym_size.int, a, 0)
    b = _stored_b(build, mat2)
    if vpb == 2:  # packed fp4 as its bytes: the contract of tilewright's block-scaled ops
        a, b = build.call(aten.view.dtype, a, torch.uint8), build.call(aten.view.dtype, b, torch.uint8)
    sa = _scales_rows(build, plan["scales_a"][0], plan["swizzle_a"], M, K // block)
    sb = _scales_rows(build, plan["scales_b"][0], plan["swizzle_b"], N, K // block)
    if bias is not None and _val(bias).dim() == 2:
        bias = build.call(aten.reshape.default, bias, [N])
    if two_level:
        gsa, gsb = plan["scales_a"][1], plan["scales_b"][1]
        for g in (gsa, gsb):
            vg = _val(g)
            if not isinstance(vg, torch.Tensor) or vg.numel() != 1 or vg.dtype != torch.float32:
                raise Refused("NVFP4 global scales that are not one fp32 value")
        gsa, gsb = (build.call(aten.reshape.default, g, []) if _val(g).dim() else g for g in (gsa, gsb))
        node.target, node.args = op("nvfp4_mm"), (a, sa, gsa, b, sb, gsb, bias, out_dtype)
    else:
        node.target, node.args = op("mx_mm"), (a, sa, b, sb, None, bias, fmt, out_dtype)
    node.kwargs = {}


def rewrite_all(gm: fx.GraphModule) -> int:
    """:func:`rewrite_scaled_mm` on every node; the number retargeted."""
    done = sum(rewrite_scaled_mm(gm, n) for n in list(gm.graph.nodes))
    if done:
        gm.recompile()
    return done
