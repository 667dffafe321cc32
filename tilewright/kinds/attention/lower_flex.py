"""FlexAttention's higher-order ops → :class:`~tilewright.kinds.attention.AttentionProblem`.

``flex_attention(q, k, v, score_mod, block_mask, scale, kernel_options, score_mod_other_buffers,
mask_mod_other_buffers)`` carries its score_mod and mask_mod as FX subgraphs of 0-d tensors:
``score_mod(score, b, h, m, n, *buffers)``, ``mask_mod(b, h, m, n, *buffers)``. Each is lowered
op by op by the loop rules (the same rules that build loop kernels) and composed into one IR
value: the score becomes the IR's ``acc``, the indices ``index`` values, the buffers captures
``c0, c1, ...`` (a buffer read at a loaded position is an indirect load). An op without a rule
leaves the whole attention on ATen.

The block mask tuple (torch's ``BlockMask.as_tuple()``: lengths, ``kv_num_blocks``,
``kv_indices``, ``full_kv_*``, ``q_*``, ``full_q_*``, ..., the two block sizes, the mask_mod)
gives the problem's :class:`BlockMaskSpec`; its tensors are run-time inputs of the kernel.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import sympy
import torch
import torch.fx as fx

from tilewright.kinds.attention import mods
from tilewright.kinds.attention.problem import AttentionProblem, BlockMaskSpec, Capture
from tilewright.compiler.graph import TensorMeta, size_hint
from tilewright.kinds.attention.lower import NotAttention, _dims, _getitems, _meta, _orders, specialize_heads
from tilewright.ir import dtypes
from tilewright.ir import expr as E

FLEX = torch.ops.higher_order.flex_attention
FLEX_BWD = torch.ops.higher_order.flex_attention_backward
SCORE_ARGS = ("score", "b", "h", "m", "n")
MASK_ARGS = ("b", "h", "m", "n")


def _subgraph(gm: fx.GraphModule, node: Any) -> fx.GraphModule:
    if isinstance(node, fx.Node) and node.op == "get_attr":
        sub = gm
        for part in str(node.target).split("."):
            sub = getattr(sub, part)
        if isinstance(sub, fx.GraphModule):
            return sub
    raise NotAttention("a modification that is not a traced subgraph")


def lower_mod_graph(sub: fx.GraphModule, leading: tuple[str, ...], capture_ids: list[int]) -> E.Node:
    """The IR value a score_mod/mask_mod subgraph computes (see the module docstring).

    ``capture_ids[i]`` is the capture number of the subgraph's i-th buffer argument.

    Raises:
        NotAttention: an op without a loop rule, or arguments the rule cannot express.
    """
    import tilewright.kinds.loop.lower.rules  # noqa: F401 - registers the rules
    from tilewright.kinds.loop.lower import RULES, Buffer, LoopLowering, Unsupported, bind

    ctx = LoopLowering()
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(leading) + len(capture_ids):
        raise NotAttention(f"a modification with {len(placeholders)} arguments")
    for i, ph in enumerate(placeholders):
        if i >= len(leading) and capture_ids[i - len(leading)] is None:
            if ph.users:  # a size argument (a captured tensor's, under dynamic shapes) read as a value
                raise NotAttention(f"modification argument {ph.name} is a size the modification reads")
            continue
        meta = TensorMeta.of(ph)
        if meta is None or meta.dtype not in dtypes.NAMES:
            raise NotAttention(f"modification argument {ph.name} has no tensor metadata")
        if i < len(leading):
            ctx.values[ph.name] = Buffer(f"__{leading[i]}__", (), dtypes.name_of(meta.dtype))
        else:
            # the traced extents: a dynamic one follows a problem size (Capture.dims), and
            # the modification indexes by the variables, not by the extent
            shape = tuple(sympy.Integer(s) for s in meta.hint_shape)
            ctx.values[ph.name] = Buffer(f"c{capture_ids[i - len(leading)]}", shape, dtypes.name_of(meta.dtype))
    result = None
    for node in sub.graph.nodes:
        if node.op == "call_function":
            if node.target is operator.getitem:
                parent = ctx.values.get(node.args[0].name)
                if not isinstance(parent, tuple):
                    raise NotAttention("a tuple the IR does not hold")
                ctx.values[node.name] = parent[node.args[1]]
                continue
            rule = RULES.get(node.target)
            if rule is None:
                raise NotAttention(f"no loop rule for {node.target} in a modification")
            try:
                value = rule(ctx, node, bind(node))
            except (Unsupported, KeyError, ValueError) as e:
                raise NotAttention(f"{node.target} in a modification: {e}") from None
            if value is None:
                raise NotAttention(f"{node.target} in a modification: no IR for these arguments")
            ctx.values[node.name] = value
        elif node.op == "output":
            out = node.args[0]
            out = out[0] if isinstance(out, (tuple, list)) else out
            result = ctx.value(out)
        elif node.op != "placeholder":
            raise NotAttention(f"a {node.op} node in a modification")
    if result is None or not hasattr(result, "load"):
        raise NotAttention("a modification without a tensor result")
    if len(result.shape) != 0:
        raise NotAttention("a modification whose result is not one value per score")
    return _compose(result.load(()), {ln.name: ln.body for ln in ctx.nodes})


def _compose(root: E.Node, bodies: dict[str, E.Node]) -> E.Node:
    """``root`` with every load of an intermediate 0-d value replaced by its body, the score by
    ``acc`` and the indices by ``index`` values."""
    done: dict[str, E.Node] = {}
    special = {f"__{n}__": mods.index_var(n) for n in ("b", "h", "m", "n")} | {"__score__": mods.score()}

    def fn(n: E.Node, src: tuple[E.Node, ...]) -> E.Node | None:
        if n.op != "load":
            return None
        name = n.arg[0]
        if name in special:
            return special[name]
        if name in bodies:
            if name not in done:
                done[name] = E.rewrite([bodies[name]], fn)[0]
            return done[name]
        return None

    return E.rewrite([root], fn)[0]


def capture_bounds(values: list[E.Node], shapes: list[tuple[int, ...]]) -> dict[int, tuple[int, int]]:
    """For integer captures used as gathered indices, the range the index allows (random tuning
    inputs must stay inside it): capture k read into dim d of a capture of shape s → [0, s[d])."""
    bounds: dict[int, tuple[int, int]] = {}
    for value in values:
        for n in E.toposort([value]):
            if n.op != "load" or not E.load_indirect(n) or not n.arg[0].startswith("c"):
                continue
            shape = shapes[int(n.arg[0][1:])]
            for j, ind in enumerate(E.load_indirect(n)):
                sym = E.indirect_symbol(j)
                dims = [d for d, e in enumerate(n.arg[1]) if sym in e.free_symbols]
                size = shape[dims[0]] if dims else None
                if ind.op == "checked" and ind.src[1].arg.is_number:  # a view's extent
                    bound = int(ind.src[1].arg)
                    size = bound if size is None else min(size, bound)
                if size is None:
                    continue
                for inner in E.toposort([ind]):
                    if inner.op == "load" and inner.arg[0].startswith("c") and dtypes.is_int(inner.dtype):
                        k = int(inner.arg[0][1:])
                        lo, hi = bounds.get(k, (0, size))
                        bounds[k] = (0, min(hi, size))
    return bounds


def _is_size(n: Any) -> bool:
    """A captured size (a SymInt Dynamo passes beside a dynamically sized captured tensor)."""
    val = n.meta.get("val") if isinstance(n, fx.Node) else n
    return isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool)


def _captures(nodes: list[fx.Node]) -> tuple[list[fx.Node], dict[str, int]]:
    unique: list[fx.Node] = []
    ids: dict[str, int] = {}
    for n in nodes:
        if _is_size(n):
            continue
        if not isinstance(n, fx.Node):
            raise NotAttention("a captured value that is not a tensor")
        if n.name not in ids:
            ids[n.name] = len(unique)
            unique.append(n)
    return unique, ids


def _capture_ids(bufs: Any, ids: dict[str, int]) -> list[int | None]:
    return [None if _is_size(n) else ids[n.name] for n in bufs]


def _static_int(x: Any, what: str) -> int:
    """An int argument (a block size) as an int; a symbolic one (``dynamic=True`` makes every
    int an input) is fixed to its traced value with a guard."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    val = x.meta.get("val") if isinstance(x, fx.Node) else x
    if isinstance(val, torch.SymInt):
        try:
            return int(guard_int(val))
        except Exception:
            raise NotAttention(f"dynamic {what}") from None
    if isinstance(val, int) and not isinstance(val, bool):
        return val
    raise NotAttention(f"{what} that is not an int")


def _hint_int(x: Any) -> int | None:
    val = x.meta.get("val") if isinstance(x, fx.Node) else x
    return size_hint(val) if isinstance(val, (int, torch.SymInt)) else None


def _capture_dims(n: fx.Node, full: tuple[Any, ...]) -> tuple[str | None, ...]:
    """Per dim of a captured tensor, the dynamic problem size it is (B, Sq, Skv), None for a
    fixed extent; a symbolic extent that is none of them (a table Dynamo made dynamic) is fixed
    to its traced value with a guard."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return ()
    out: list[str | None] = []
    for size in val.shape:
        e = size.node.expr if isinstance(size, torch.SymInt) else None
        if e is None or not e.free_symbols:
            out.append(None)
            continue
        name = next((nm for nm, f in zip(("B", "Sq", "Skv"), full) if f.free_symbols and (e - f).simplify() == 0),
                    None)
        if name is None:
            try:
                guard_int(size)
            except Exception:
                raise NotAttention("a captured tensor with a dynamic size") from None
        out.append(name)
    return tuple(out) if any(out) else ()


def _block_mask(bm: tuple, dims: dict, backward: bool) -> tuple[BlockMaskSpec | None, list[fx.Node]]:
    """The spec and the tensors (kv lists, then for the backward the q lists) of a block mask
    tuple; (None, []) for a mask of one block covering everything."""
    if not isinstance(bm, (tuple, list)) or len(bm) < 13:
        raise NotAttention("a block mask this torch version lays out differently")
    q_len, kv_len = (_hint_int(x) for x in bm[:2])
    q_block, kv_block = _static_int(bm[-3], "block sizes"), _static_int(bm[-2], "block sizes")
    if q_block >= dims["Sq"] and kv_block >= dims["Skv"] and (not dims["dynamic"] or min(q_block, kv_block) >= 1 << 30):
        return None, []  # one block over everything (flex's own when none is given)
    if q_len != dims["Sq"] or kv_len != dims["Skv"]:
        raise NotAttention(f"a block mask for lengths {q_len}x{kv_len} on Sq={dims['Sq']}, Skv={dims['Skv']}")
    kv_num, kv_idx, full_num, full_idx, q_num, q_idx, fq_num, fq_idx = bm[2:10]
    if isinstance(kv_num, fx.Node) and isinstance(kv_num.meta.get("val"), torch.Tensor):
        for d in (0, 1):  # the mask's own batch and heads: fixed (the query blocks may vary)
            size = kv_num.meta["val"].shape[d] if kv_num.meta["val"].dim() == 3 else 1
            if isinstance(size, torch.SymInt):
                _static_int(size, "block mask batch or heads")
    m = _meta(kv_num)
    if m.ndim != 3 or any(e.free_symbols for e in m.shape[:2]):
        raise NotAttention("a block mask of unexpected rank or dynamic batch or heads")
    spec = BlockMaskSpec(q_block, kv_block, m.hint_shape[0], m.hint_shape[1], full_num is not None)
    if m.hint_shape[2] != -(-dims["Sq"] // q_block):
        raise NotAttention("a block mask whose query blocks do not cover Sq")
    tensors = [kv_num, kv_idx] + ([full_num, full_idx] if spec.full else [])
    if backward:
        if q_num is None or (spec.full and fq_num is None):
            raise NotAttention("a block mask without the transposed lists the backward needs")
        tensors += [q_num, q_idx] + ([fq_num, fq_idx] if spec.full else [])
    return spec, tensors


def _mods(gm: fx.GraphModule, score_node: Any, mask_node: Any, score_bufs, mask_bufs, full: tuple = ()
          ) -> tuple[str, str, list[fx.Node], tuple[Capture, ...]]:
    nodes, ids = _captures(list(score_bufs) + list(mask_bufs))
    follow = [_capture_dims(n, full) for n in nodes]
    score = _in_working_precision(
        lower_mod_graph(_subgraph(gm, score_node), SCORE_ARGS, _capture_ids(score_bufs, ids)))
    mask = lower_mod_graph(_subgraph(gm, mask_node), MASK_ARGS, _capture_ids(mask_bufs, ids))
    if mask.op == "const" and mask.arg:
        mask = None  # constantly true: no mask
    if score.op == "acc":
        score = None
    if mask is not None and mask.dtype != "bool":
        mask = E.cast(mask, "bool")
    shapes = [tuple(_meta(n).hint_shape) for n in nodes]
    bounds = capture_bounds([v for v in (score, mask) if v is not None], shapes)
    caps = tuple(Capture(s, dtypes.name_of(_meta(n).dtype), bounds.get(k), follow[k])
                 for k, (n, s) in enumerate(zip(nodes, shapes)))
    return mods.dumps(score), mods.dumps(mask), nodes, caps


def _in_working_precision(score: E.Node) -> E.Node:
    """The score_mod as FlexAttention computes it: on the score in fp32 whatever q's dtype (its
    math reference works in fp32, fp64 for fp64 inputs; Inductor's kernels too), where the
    traced graph's ops carry q's dtype and the loop rules round each result to it (bf16: a
    soft-cap ``50 * tanh(s / 50)`` rounded three times came out 7e-2 from float64, eager 2e-3).
    Drops those implicit roundings of values that depend on the score; an explicit cast the
    user wrote (``.to(torch.bfloat16)``) still rounds."""
    reads: dict[int, bool] = {}

    def reads_score(n: E.Node) -> bool:
        if id(n) not in reads:
            reads[id(n)] = n.op == "acc" or any(reads_score(s) for s in n.src)
        return reads[id(n)]

    def fn(n: E.Node, src: tuple[E.Node, ...]) -> E.Node | None:
        if n.op == "cast" and not n.arg and src:
            x = src[0]
            if n.dtype in ("bf16", "fp16") and dtypes.is_float(x.dtype) and reads_score(x):
                return x  # kept in its compute type
            if x.dtype == n.dtype:  # the widening back of a rounding dropped above
                return x
        return None

    return E.rewrite([score], fn)[0]


def _full(q: fx.Node, k: fx.Node) -> tuple[Any, ...]:
    """(B, Sq, Skv) as traced (sympy)."""
    qm, km = _meta(q), _meta(k)
    return (qm.shape[0], qm.shape[2], km.shape[2])


def _options(opts: Any) -> dict:
    return dict(opts) if isinstance(opts, dict) else {}


def lower_flex(node: fx.Node, gm: fx.GraphModule) -> tuple[AttentionProblem, list[str], list[str]]:
    """(problem, argument values, output values) of a ``flex_attention`` node.

    Raises:
        NotAttention: the max scores are read, or a part it cannot lower.
    """
    q, k, v, score_node, bm, scale, options, score_bufs, mask_bufs = node.args[:9]
    specialize_heads(q, k, v)
    dims = _dims(_meta(q), _meta(k), _meta(v))
    full = _full(q, k)
    outs = _getitems(node, 3)
    if outs[2] is not None and outs[2].users:
        raise NotAttention("the max scores of flex_attention are read")
    spec, bm_tensors = _block_mask(bm, dims, backward=False)
    score_mod, mask_mod, cap_nodes, caps = _mods(gm, score_node, bm[-1], score_bufs, mask_bufs, full)
    lse_base = "e" if _options(options).get("BACKEND") == "FLASH" else "2"
    problem = AttentionProblem(**dims, scale=float(scale) if scale is not None else 1 / math.sqrt(dims["D"]),
                               score_mod=score_mod, mask_mod=mask_mod, captures=caps, block_mask=spec,
                               lse_base=lse_base, orders=_orders({"out": outs[0], "lse": outs[1]}),
                               op="flex_attention")
    args = [q.name, k.name, v.name] + [n.name for n in cap_nodes] + [t.name for t in bm_tensors]
    return problem, args, [o.name if o is not None else "" for o in outs[:2]]


def lower_flex_backward(node: fx.Node, gm: fx.GraphModule) -> tuple[AttentionProblem, list[str], list[str]]:
    """(problem, argument values, output values) of a ``flex_attention_backward`` node; the
    score_mod's derivative comes from its forward subgraph (the joint graph is not needed).

    Raises:
        NotAttention: gradients of captured tensors are read, or a part it cannot lower.
    """
    (q, k, v, out, lse, grad_out, grad_lse, fw_graph, _joint, bm, scale, options,
     score_bufs, mask_bufs) = node.args[:14]
    specialize_heads(q, k, v)
    dims = _dims(_meta(q), _meta(k), _meta(v))
    full = _full(q, k)
    outs = _getitems(node, 4)
    if outs[3] is not None and any(u.target is not operator.getitem or u.users for u in outs[3].users):
        raise NotAttention("gradients of the modifications' captured tensors are read")
    spec, bm_tensors = _block_mask(bm, dims, backward=True)
    score_mod, mask_mod, cap_nodes, caps = _mods(gm, fw_graph, bm[-1], score_bufs, mask_bufs, full)
    lse_grad = isinstance(grad_lse, fx.Node)
    lse_base = "e" if _options(options).get("BACKEND") == "FLASH" else "2"
    problem = AttentionProblem(**dims, scale=float(scale) if scale is not None else 1 / math.sqrt(dims["D"]),
                               direction="backward", score_mod=score_mod, mask_mod=mask_mod, captures=caps,
                               block_mask=spec, lse_base=lse_base, lse_grad=lse_grad,
                               orders=_orders({"dq": outs[0], "dk": outs[1], "dv": outs[2]}),
                               op="flex_attention")
    args = ([q.name, k.name, v.name, out.name, grad_out.name, lse.name] + [n.name for n in cap_nodes]
            + [t.name for t in bm_tensors] + ([grad_lse.name] if lse_grad else []))
    return problem, args, [o.name if o is not None else "" for o in outs[:3]]
