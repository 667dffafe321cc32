"""The GEMM kind's epilogue fusion (its :meth:`~tilewright.kinds.gemm.kind.GemmKind.fuse` hook,
the pipeline's fuse stage): absorb the elementwise chain after each GEMM into the GEMM's kernel.

Starting at a GEMM, follow its value forward while it has exactly one user and that user is a
step the templates can apply on the fp32 accumulator:

* bias / residual add, sub, mul, div with a tensor that broadcasts to the output, or a scalar;
* relu, gelu (erf and tanh), silu, sigmoid, tanh;
* a cast to fp32/fp16/bf16 (``_to_copy``), a ``clone`` (the kernel's output is already fresh);
* one reshape that only regroups the leading dims (``[B*S, N] → [B, S, N]``), so linears on 3-D
  activations fuse too; later operands are broadcast in the reshaped space.

A tensor operand must not depend on the GEMM (checked with networkx on the FX graph). A value
with two users (say, saved for backward) ends the chain: it must exist in memory anyway.
Values are computed in fp32 and rounded once, at the store, where eager rounds after every op.
It moved here from :mod:`tilewright.compiler.fuse` (issue 30), which is an alias of this module
for one release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import networkx as nx
import sympy
import torch
import torch.fx as fx

from tilewright.compiler.graph import ExternNode, KernelGraph, TensorMeta
from tilewright.kinds.gemm.lower import FusedInput, broadcast_pattern
from tilewright.kinds.gemm.node import GemmNode, gemm_nodes
from tilewright.problem import DTYPE_NAMES, EpilogueInput, EpilogueOp

aten = torch.ops.aten
prims = torch.ops.prims

FUSABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
UNARY = {
    aten.relu.default: "relu", aten.silu.default: "silu", aten.sigmoid.default: "sigmoid",
    aten.tanh.default: "tanh",
}
BINARY = {
    aten.add.Tensor: "add", aten.sub.Tensor: "sub", aten.mul.Tensor: "mul",
    aten.div.Tensor: "div", aten.add.Scalar: "add", aten.sub.Scalar: "sub",
    aten.mul.Scalar: "mul", aten.div.Scalar: "div",
}
VIEW_OPS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_IDENTITY_FORMATS = (None, torch.contiguous_format, torch.preserve_format)


@dataclass
class _Chain:
    """Where a GEMM's epilogue chain stands: the shape of its current value and the space
    (the GEMM's own shape, or that of the one absorbed view) operands broadcast in."""

    gemm: GemmNode
    gemm_shape: tuple[sympy.Expr, ...]
    shape: tuple[sympy.Expr, ...]
    space: str = "gemm"

    def dim_name(self, i: int) -> str:
        n = len(self.shape)
        if self.gemm.batched:
            return "N" if i == n - 1 else "M" if i == n - 2 else "B"
        return "N" if i == n - 1 else "M"


def _same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return a == b or sympy.simplify(a - b) == 0


def _regroups_leading_dims(chain: _Chain, new_shape: tuple[sympy.Expr, ...]) -> bool:
    g = chain.gemm
    if len(new_shape) < 2 or not _same(new_shape[-1], g.N):
        return False
    if g.batched:
        return len(new_shape) >= 3 and _same(new_shape[-2], g.M) and \
            _same(sympy.Mul(*new_shape[:-2]), g.batch)
    return _same(sympy.Mul(*new_shape[:-1]), g.M)


def _operand(chain: _Chain, other: object, descendants: set[str]) -> FusedInput | float | None:
    """A binary op's other side as a fused input or scalar; None when it cannot be fused."""
    if isinstance(other, bool) or not isinstance(other, (int, float, fx.Node)):
        return None
    if not isinstance(other, fx.Node):
        return float(other) if math.isfinite(other) else None
    meta = TensorMeta.of(other)
    if meta is None or meta.dtype not in FUSABLE_DTYPES or meta.device != chain.gemm.device:
        return None
    if other.name in descendants:
        return None  # it needs this GEMM's result: it cannot be read inside it
    pattern = broadcast_pattern(meta, chain.shape, chain.gemm.batched, chain.dim_name)
    if pattern is None:
        return None
    return FusedInput(other.name, EpilogueInput(pattern, DTYPE_NAMES[meta.dtype]), chain.space)


def _binary_steps(kind: str, node: fx.Node, cur: fx.Node, chain: _Chain,
                  descendants: set[str]) -> list[tuple[EpilogueOp, FusedInput | None]] | None:
    """Steps for ``add/sub/mul/div``; a tensor operand's index is filled in by the caller."""
    x, y = node.args[0], node.args[1]
    if x is cur and y is cur:
        return None
    cur_first = x is cur
    other = _operand(chain, y if cur_first else x, descendants)
    if other is None:
        return None

    def step(k: str, scale: float = 1.0, reverse: bool = False):
        if isinstance(other, float):
            return (EpilogueOp(k, scalar=other * scale, reverse=reverse), None)
        return (EpilogueOp(k, input=-1, scale=scale, reverse=reverse), other)

    alpha = float(node.kwargs.get("alpha", 1))
    if kind in ("add", "sub"):
        if cur_first:  # acc ± alpha * other
            return [step(kind, scale=alpha)]
        # other ± alpha * acc
        pre = [(EpilogueOp("mul", scalar=alpha), None)] if alpha != 1.0 else []
        return pre + [step("add") if kind == "add" else step("sub", reverse=True)]
    if kind == "mul":
        return [step("mul")]
    return [step("div", reverse=not cur_first)]


def _match(node: fx.Node, cur: fx.Node, chain: _Chain, descendants: set[str]):
    """The epilogue steps ``node`` adds to the chain (a list), "view", "identity", or None."""
    out_meta = TensorMeta.of(node)
    if out_meta is None or out_meta.dtype not in FUSABLE_DTYPES or out_meta.device != chain.gemm.device:
        return None
    target = node.target
    if target in VIEW_OPS:
        if node.args[0] is not cur:
            return None
        if tuple(out_meta.shape) == tuple(chain.shape):
            return "identity"
        if chain.space == "gemm" and _regroups_leading_dims(chain, out_meta.shape):
            return "view"
        return None
    if len(out_meta.shape) != len(chain.shape) or not all(
            _same(a, b) for a, b in zip(out_meta.shape, chain.shape)):
        return None  # the op broadcasts the GEMM's result to a bigger shape
    if target == aten.clone.default:
        return "identity" if node.kwargs.get("memory_format") in _IDENTITY_FORMATS else None
    if target == aten._to_copy.default:
        allowed = {"dtype", "layout", "device", "pin_memory", "memory_format", "non_blocking"}
        kw = node.kwargs
        if set(kw) - allowed or kw.get("layout") not in (None, torch.strided) \
                or kw.get("memory_format") in (torch.channels_last,) or kw.get("pin_memory"):
            return None
        if kw.get("device") is not None and torch.device(kw["device"]) != chain.gemm.device:
            return None
        return []  # a cast: the output dtype follows the chain's last node
    if target == prims.convert_element_type.default:
        return []
    if target in UNARY:
        return [(EpilogueOp(UNARY[target]), None)]
    if target == aten.gelu.default:
        approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        return [(EpilogueOp("gelu_tanh" if approx == "tanh" else "gelu"), None)]
    if target in BINARY:
        return _binary_steps(BINARY[target], node, cur, chain, descendants)
    return None


class _NotEpilogue(Exception):
    pass


def _ir_step(node: fx.Node, cur: fx.Node, chain: _Chain, descendants: set[str]):
    """``node`` as epilogue IR, when it is a pointwise op with a loop-lowering rule whose other
    tensor operands broadcast to the chain's shape: (its body over the output index, with the
    chain's value loaded as ``__acc__``; the operands as (fx name, FusedInput)). None otherwise."""
    import tilewright.kinds.loop.lower.rules  # noqa: F401 - registers the rules
    from tilewright.kinds.loop.lower import RULES, Buffer, LoopLowering, Unsupported, bind
    from tilewright.ir import dtypes

    rule = RULES.get(node.target)
    out_meta, cur_meta = TensorMeta.of(node), TensorMeta.of(cur)
    if rule is None or out_meta is None or cur_meta is None or out_meta.dtype not in FUSABLE_DTYPES:
        return None
    if out_meta.device != chain.gemm.device or len(out_meta.shape) != len(chain.shape) or not all(
            _same(a, b) for a, b in zip(out_meta.shape, chain.shape)):
        return None
    if sum(1 for x in node.all_input_nodes if x is cur) != 1 or any(
            isinstance(a, fx.Node) and a is cur for a in node.kwargs.values()):
        return None  # the chain's value used twice, or as a keyword: keep it simple
    ctx = LoopLowering()
    ctx.values[cur.name] = Buffer("__acc__", cur_meta.shape, dtypes.name_of(cur_meta.dtype))
    operands = []
    for x in node.all_input_nodes:
        if x is cur:
            continue
        fi = _operand(chain, x, descendants)
        meta = TensorMeta.of(x)
        if not isinstance(fi, FusedInput) or meta is None:
            return None
        ctx.values[x.name] = Buffer(x.name, meta.shape, dtypes.name_of(meta.dtype))
        operands.append((x.name, fi, meta.shape))
    try:
        result = rule(ctx, node, bind(node))
    except (Unsupported, KeyError, ValueError):
        return None
    if result is None or len(ctx.nodes) != 1 or ctx.nodes[0].is_reduction:
        return None
    return ctx.nodes[0].body, operands


def _absorb_ir(g: GemmNode, body, operands, *, ndim: int, cur_shape) -> bool:
    """Fold one IR step into ``g``'s epilogue (turning its kinds into IR the first time);
    False, with ``g`` unchanged, when the step reads anything but the chain's value at the
    current element and its operands broadcast."""
    from tilewright.kinds.loop.lower import broadcast_index
    from tilewright.ir import expr as E
    from tilewright.ir.epilogue import epilogue_expr, input_index
    from tilewright.ir.index import variables

    prev = g.epilogue_ir if g.epilogue_ir is not None else \
        epilogue_expr(g.epilogue, [e.pattern for e in g.epilogue_inputs])
    out_idx = variables("i", ndim)
    slots = {name: (len(g.epilogue_inputs) + j, fi, broadcast_index(shape, out_idx))
             for j, (name, fi, shape) in enumerate(operands)}

    def fn(n, src):
        if n.op == "index":
            raise _NotEpilogue("an index value")
        if n.op != "load":
            return None
        if n.src:
            raise _NotEpilogue("a masked or gathered load")
        if n.arg[0] == "__acc__":
            if tuple(n.arg[1]) != tuple(broadcast_index(cur_shape, out_idx)):
                raise _NotEpilogue("the chain's value read at another element")
            return E.cast(prev, n.dtype)  # implicit: cancels against the rule's cast back
        k, fi, expected = slots[n.arg[0]]
        if tuple(n.arg[1]) != tuple(expected):
            raise _NotEpilogue("an operand read other than broadcast")
        return E.load(f"e{k}", input_index(fi.pattern.broadcast), n.dtype)

    try:
        value = E.rewrite([body], fn)[0]
    except _NotEpilogue:
        return False
    if value.op == "cast" and not value.arg:  # the store rounds once, at the end
        value = value.src[0]
    g.epilogue = []
    g.epilogue_inputs.extend(fi for _, fi, _ in operands)
    g.epilogue_ir = value
    return True


def _acc_chain_start(g: GemmNode, gemm_fx: fx.Node, chain: _Chain, descendants: set[str],
                     extern: dict, absorbed: set[int]) -> fx.Node | None:
    """When the GEMM's own value has several users, the one user an epilogue chain can start
    with: the kernel then stores both the product and the chain's result (a saved GEMM output
    no longer costs its consumer a kernel). None when the value has one user (the ordinary
    chain), when the GEMM cannot store its product too (scaled or packed operands), or when no
    user is a real epilogue step (a bare view or cast saves nothing)."""
    if len(gemm_fx.users) < 2 or g.fmt or g.op not in ("mm", "bmm", "addmm", "baddbmm"):
        return None
    if g.dtype not in FUSABLE_DTYPES:
        return None
    for user in gemm_fx.users:
        if user not in extern or id(extern[user]) in absorbed:
            continue
        cur, node, chain_copy = gemm_fx, user, _Chain(g, chain.gemm_shape, chain.shape)
        while True:  # look through views/identities for a real step, without fusing anything
            step = _match(node, cur, chain_copy, descendants)
            if step is None:
                break
            if step not in ("view", "identity") and step != []:
                return user
            if step == "view":
                chain_copy.space, chain_copy.shape = "view", TensorMeta.of(node).shape  # type: ignore[union-attr]
            if len(node.users) != 1 or next(iter(node.users)) not in extern \
                    or id(extern[next(iter(node.users))]) in absorbed:
                break
            cur, node = node, next(iter(node.users))
    return None


def fuse_epilogues(kg: KernelGraph, gm: fx.GraphModule,
                   fuses: Callable[[GemmNode], bool] | None = None) -> int:
    """Fuse epilogue chains into the graph's GEMMs in place; returns the FX nodes absorbed.
    ``fuses(gemm)`` False leaves that GEMM's chain to the loop kernels (what lowering already
    put in the GEMM, a bias or scales, stays): the GEMM kind asks its policy for the GEMM's
    target (:meth:`~tilewright.kinds.gemm.policy.GemmPolicy.fuses_epilogues`)."""
    fx_graph = nx.DiGraph()
    position: dict[fx.Node, int] = {}
    for i, n in enumerate(gm.graph.nodes):
        position[n] = i
        fx_graph.add_node(n.name)
        for inp in n.all_input_nodes:
            fx_graph.add_edge(inp.name, n.name)
    extern = {n.fx_node: n for n in kg.nodes if isinstance(n, ExternNode)}
    absorbed: set[int] = set()
    total = 0

    for g in gemm_nodes(kg):
        gemm_fx = g.fx_nodes[0]
        if fuses is not None and not fuses(g):
            g.acc_after = len(g.epilogue)
            g.value, g.out_dtype = gemm_fx.name, TensorMeta.of(gemm_fx).dtype  # type: ignore[union-attr]
            continue
        # the GEMM's own value is never an operand of its epilogue (it is being computed)
        descendants = nx.descendants(fx_graph, gemm_fx.name) | {gemm_fx.name}
        shape = TensorMeta.of(gemm_fx).shape  # type: ignore[union-attr]
        chain = _Chain(g, shape, shape)
        cur = gemm_fx
        start = _acc_chain_start(g, gemm_fx, chain, descendants, extern, absorbed)
        g.acc_after = len(g.epilogue)  # what lowering put there (bias, scales) is the GEMM's own value
        taken: list[tuple[fx.Node, object]] = []  # what this chain absorbed, to undo if idle
        real = False
        while len(cur.users) == 1 or (cur is gemm_fx and start is not None):
            nxt = start if cur is gemm_fx and start is not None else next(iter(cur.users))
            ext = extern.get(nxt)
            if ext is None or id(ext) in absorbed:
                break
            step = _match(nxt, cur, chain, descendants)
            ir_mode = g.epilogue_ir is not None
            if (step is None or (ir_mode and isinstance(step, list) and step)) and start is not None and g.acc_after:
                break  # the stored value is a prefix of the kinds: the chain stays in kinds
            if step is None or (ir_mode and isinstance(step, list) and step):
                # not one of the kinds, or the chain is IR already: any pointwise op the loop
                # lowering expresses joins as IR
                ir = _ir_step(nxt, cur, chain, descendants)
                if ir is None or not _absorb_ir(g, *ir, ndim=len(chain.shape), cur_shape=TensorMeta.of(cur).shape):
                    break
                real, step = True, "identity"
            if step == "view":
                chain.space, chain.shape, g.view = "view", TensorMeta.of(nxt).shape, nxt  # type: ignore[union-attr]
            elif step != "identity":
                real = real or bool(step)
                for op, operand in step:
                    if operand is not None:
                        g.epilogue_inputs.append(operand)
                        op = EpilogueOp(op.kind, input=len(g.epilogue_inputs) - 1,
                                        scale=op.scale, reverse=op.reverse)
                    g.epilogue.append(op)
            g.fx_nodes.append(nxt)
            absorbed.add(id(ext))
            taken.append((nxt, ext))
            total += 1
            cur = nxt
        if start is not None and not real:
            # only views or casts followed the stored product: the kernel would write the same
            # values twice, so leave them to their own nodes
            for node, ext in taken:
                absorbed.discard(id(ext))
            g.fx_nodes = g.fx_nodes[:len(g.fx_nodes) - len(taken)]
            g.view, total, cur, start = None, total - len(taken), gemm_fx, None
        g.value = cur.name
        g.out_dtype = TensorMeta.of(cur).dtype  # type: ignore[union-attr]
        if start is not None and cur is not gemm_fx:
            g.acc_value = gemm_fx.name  # stored beside the epilogue's result

    kg.nodes = [n for n in kg.nodes if id(n) not in absorbed]
    # a fused GEMM runs where the value it now produces was computed: all its operands exist
    # by then, since each one fed a node of its chain; a GEMM that also stores its product
    # moves the product's other users after it (they do not feed the chain)
    kg.nodes.sort(key=lambda n: position[n.fx_nodes[-1]])
    if any(g.acc_value for g in gemm_nodes(kg)):
        by_name = {n.name: n for n in kg.nodes}
        order = {n.name: i for i, n in enumerate(kg.nodes)}
        deps = kg.dependency_graph()
        deps.remove_nodes_from([v for v in list(deps) if v not in by_name])
        kg.nodes = [by_name[v] for v in nx.lexicographical_topological_sort(deps, key=order.__getitem__)]
    _check_order(kg)
    return total


def _check_order(kg: KernelGraph) -> None:
    deps = kg.dependency_graph()
    order = {n.name: i for i, n in enumerate(kg.nodes)}
    for src, dst in deps.edges:
        if src in order and order[src] >= order[dst]:
            raise AssertionError(f"fusion broke dependency order: {src} must run before {dst}")
