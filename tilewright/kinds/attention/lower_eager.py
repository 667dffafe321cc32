"""Attention written out by hand, recognised: ``softmax(scale * Q Kᵀ + mask) V`` as models with
"eager" attention compute it (transformers' ``eager_attention_forward``: two ``matmul``s, a
scale, an additive mask, a float32 softmax, GQA's ``repeat_kv``), rewritten in the ATen FX graph
into one ``aten.scaled_dot_product_attention`` call, which :mod:`tilewright.kinds.attention.lower`
then lowers like any SDPA (or, left alone, runs as SDPA: the same values, without the Sq x Skv
scores in memory).

The pattern, in the graph aot_autograd makes (views and expands between the ops are looked
through; the softmax appears whole or decomposed into amax, sub, exp, sum, div):

    bmm(view(Q), view(transpose(K))) → view → mul/div by a scale → add a mask
      → softmax over the last dim (→ a cast) → view → bmm(·, view(V)) → view

Every intermediate must be read only by the next step: in a training graph the probabilities are
saved for the backward, so the pattern is left alone there (its GEMMs and loop kernels compute
it, as before). ``K`` and ``V`` of GQA come out of ``repeat_kv`` (unsqueeze, expand, clone,
reshape): the rewrite reads the KV heads themselves (``enable_gqa``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten
prims = torch.ops.prims
SDPA = aten.scaled_dot_product_attention.default
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
          aten.clone.default, aten.alias.default}
_CASTS = {aten._to_copy.default, prims.convert_element_type.default}


def _val(n: Any) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _shape(n: fx.Node) -> tuple:
    v = _val(n)
    return tuple(v.shape) if v is not None else ()


def _through_views(n: fx.Node, seen: list[fx.Node], rank: int = 4) -> fx.Node:
    """The first node of ``rank`` dims behind a chain of views, expands and clones (each
    recorded in ``seen``); an expand that broadcasts is not looked through."""
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in _VIEWS:
        if len(_shape(n)) == rank and n.target is not aten.expand.default and n.target is not aten.clone.default:
            break
        src = n.args[0]
        if n.target is aten.expand.default and _shape(src) != _shape(n):
            break
        seen.append(n)
        n = src
    return n


def _repeat_kv(n: fx.Node, seen: list[fx.Node]) -> tuple[fx.Node, int]:
    """(the KV heads, the group size) behind transformers' repeat_kv, or (n, 1)."""
    chain = []
    x = n
    if x.target in (aten._unsafe_view.default, aten.view.default, aten.reshape.default):
        chain.append(x)
        x = x.args[0]
        if x.target is aten.clone.default:
            chain.append(x)
            x = x.args[0]
        if x.target is aten.expand.default and len(_shape(x)) == 5:
            chain.append(x)
            e = x
            x = x.args[0]
            if x.target is aten.unsqueeze.default and x.args[1] in (2, -3):
                chain.append(x)
                base = x.args[0]
                b, hkv, g, s, d = _shape(e)
                if _shape(base) == (b, hkv, s, d):
                    seen.extend(chain)
                    return base, g
    return n, 1


def _sole_user(n: fx.Node, allowed: set[fx.Node]) -> bool:
    return all(u in allowed for u in n.users)


def _softmax_input(p: fx.Node, seen: list[fx.Node]) -> fx.Node | None:
    """X when ``p`` is softmax(X, -1) (whole or decomposed, optionally cast), else None."""
    if p.target in _CASTS:
        seen.append(p)
        p = p.args[0]
    if p.target is aten._softmax.default and p.args[1] in (-1, len(_shape(p)) - 1) and not p.args[2]:
        seen.append(p)
        x = p.args[0]
    elif p.target is aten.div.Tensor and isinstance(p.args[1], fx.Node):
        e, s = p.args
        if e.target is not aten.exp.default or s.target is not aten.sum.dim_IntList or s.args[0] is not e:
            return None
        sub = e.args[0]
        if sub.target is not aten.sub.Tensor or not isinstance(sub.args[1], fx.Node):
            return None
        x, mx = sub.args
        if mx.target is not aten.amax.default or mx.args[0] is not x:
            return None
        if list(s.args[1]) not in ([-1], [len(_shape(p)) - 1]) or list(mx.args[1]) not in ([-1], [len(_shape(p)) - 1]):
            return None
        seen.extend([p, e, s, sub, mx])
    else:
        return None
    if x.target in _CASTS:
        seen.append(x)
        x = x.args[0]
    return x


def _leads_to_bmm(n: fx.Node) -> bool:
    if n.target in (aten.mul.Tensor, aten.div.Tensor) and isinstance(n.args[1], (int, float, fx.Node)):
        n = n.args[0]
    return _through_views(n, [], rank=3).target is aten.bmm.default


def _scores(x: fx.Node, seen: list[fx.Node]) -> tuple[fx.Node, float, fx.Node | None] | None:
    """(the view of Q Kᵀ, scale, additive mask) of the softmax's input."""
    mask = None
    if x.target is aten.add.Tensor and all(isinstance(a, fx.Node) for a in x.args[:2]) and len(x.args) == 2:
        a, b = x.args
        s, mask = (a, b) if _leads_to_bmm(a) else (b, a)
        seen.append(x)
        x = s
    scale = 1.0
    if x.target in (aten.mul.Tensor, aten.div.Tensor) and isinstance(x.args[1], fx.Node):
        factor = _size_scalar(x.args[1])
        if factor is not None:
            scale = factor if x.target is aten.mul.Tensor else 1.0 / factor
            seen.append(x)
            x = x.args[0]
    elif x.target in (aten.mul.Tensor, aten.div.Tensor) and isinstance(x.args[1], (int, float)):
        scale = float(x.args[1]) if x.target is aten.mul.Tensor else 1.0 / float(x.args[1])
        seen.append(x)
        x = x.args[0]
    return x, scale, mask


_SCALAR_STEPS = {prims.convert_element_type.default: lambda x, *a: x, aten.sqrt.default: math.sqrt,
                 aten.rsqrt.default: lambda x: 1.0 / math.sqrt(x), aten.reciprocal.default: lambda x: 1.0 / x}


def _size_scalar(n: fx.Node) -> float | None:
    """The value of a 0-d tensor computed from a size alone (``/ math.sqrt(q.shape[-1])`` under
    ``dynamic=True``: sqrt of scalar_tensor(s)), the size fixed to its traced value with a guard
    (a head dim, which the attention kernel fixes anyway); None for anything else."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    chain = []
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in _SCALAR_STEPS:
        chain.append(n.target)
        n = n.args[0]
    if not isinstance(n, fx.Node) or n.target is not aten.scalar_tensor.default or len(n.users) != 1:
        return None
    leaf = n.args[0]
    val = leaf.meta.get("val") if isinstance(leaf, fx.Node) else leaf
    if isinstance(val, torch.SymInt):
        try:
            val = guard_int(val)
        except Exception:
            return None
    if not isinstance(val, (int, float)) or isinstance(val, bool):
        return None
    x = float(val)
    for step in reversed(chain):
        x = _SCALAR_STEPS[step](x)
    return x


def match(out_view: fx.Node) -> dict | None:
    """The attention whose output is ``out_view`` (the 4-D view of the second bmm), as
    {q, k, v, mask, scale, group, nodes}, or None."""
    if out_view.target not in (aten.view.default, aten._unsafe_view.default) or len(_shape(out_view)) != 4:
        return None
    pv = out_view.args[0]
    if pv.target is not aten.bmm.default or len(pv.users) != 1:
        return None
    seen: list[fx.Node] = [out_view, pv]
    p = _through_views(pv.args[0], seen)
    v4 = _through_views(pv.args[1], seen)
    x = _softmax_input(p, seen)
    if x is None:
        return None
    found = _scores(x, seen)
    if found is None:
        return None
    s4, scale, mask = found
    s4 = _through_views(s4, seen, rank=3)
    if s4.target is not aten.bmm.default:
        return None
    qk = s4
    seen.append(qk)
    q4 = _through_views(qk.args[0], seen)
    kt = _through_views(qk.args[1], seen)
    if kt.target is not aten.transpose.int or sorted(d % 4 for d in kt.args[1:3]) != [2, 3]:
        return None
    seen.append(kt)
    k4, gk = _repeat_kv(kt.args[0], seen)
    v4, gv = _repeat_kv(v4, seen)
    shapes = [_shape(t) for t in (q4, k4, v4)]
    if any(len(s) != 4 for s in shapes) or gk != gv:
        return None
    (B, H, Sq, D), (_, Hkv, Skv, _), (_, _, _, Dv) = shapes
    if _shape(out_view) != (B, H, Sq, Dv) or H != Hkv * gk or _shape(k4)[3] != D:
        return None
    inner = set(seen) - {out_view}
    # under dynamic shapes a later view may read a size off an intermediate score tensor: it is
    # read off q or k instead (the scores are (B, H, Sq, Skv))
    sizes = {u: ((q4, u.args[1]) if u.args[1] % 4 < 3 else (k4, 2)) for n in inner if n not in (q4, k4, v4, mask)
             for u in n.users if u.target is aten.sym_size.int and len(_shape(n)) == 4}
    if not all(_sole_user(n, inner | {out_view} | set(sizes)) for n in inner if n not in (q4, k4, v4, mask)):
        return None  # an intermediate is read elsewhere (a training graph saves the probabilities)
    if mask is not None and (len(_shape(mask)) > 4 or any(
            s not in (1, w) for s, w in zip(_shape(mask)[::-1], (Skv, Sq, H, B)))):
        return None
    return dict(q=q4, k=k4, v=v4, mask=mask, scale=scale, group=gk, nodes=inner, sizes=sizes)


# ops whose result is finite wherever their tensor operands are and their scalars are finite
_FINITE_KEEPING = _VIEWS | _CASTS | {aten.slice.Tensor, aten.unsqueeze.default, aten.squeeze.dim,
                                     aten.permute.default, aten.select.int}


def _finite(n: Any, depth: int = 0) -> bool:
    """Whether ``n`` (a mask node, a scalar) holds no -inf for certain, from how it is made:
    constants, ``where``/``masked_fill`` of finite values (transformers' masks fill with
    ``finfo.min``), and views and casts of those. False when unsure (a graph input, an ``add``
    of two masks, which can overflow to -inf)."""
    if isinstance(n, (int, float, bool)):
        return math.isfinite(n)
    if not isinstance(n, fx.Node) or n.op != "call_function" or depth > 16:
        return False
    v = _val(n)
    if v is not None and not v.is_floating_point():
        return True
    t = n.target
    if t in _FINITE_KEEPING:
        return _finite(n.args[0], depth + 1)
    if t in (aten.full.default, aten.scalar_tensor.default):
        return _finite(n.args[1] if t is aten.full.default else n.args[0], depth + 1)
    if t in (aten.zeros.default, aten.ones.default, aten.zeros_like.default, aten.ones_like.default):
        return True
    if t in (aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar):
        return all(_finite(a, depth + 1) for a in n.args[1:3])
    if t in (aten.masked_fill.Scalar, aten.masked_fill.Tensor):
        return _finite(n.args[0], depth + 1) and _finite(n.args[2], depth + 1)
    return False


def _empty_rows_nan(gm: fx.GraphModule, out: fx.Node, mask: fx.Node) -> fx.Node:
    """``out`` (SDPA's result) with NaN in the rows whose additive ``mask`` is -inf throughout,
    as eager's ``softmax`` gives them (exp(-inf - -inf)); SDPA, and so the attention kernels,
    give 0 there. Inserted after ``out``; returns the node to use in its place."""
    fake_mask, fake_out = _val(mask), _val(out)
    with gm.graph.inserting_after(out):
        neg = gm.graph.call_function(aten.eq.Scalar, (mask, float("-inf")))
        with gm.graph.inserting_after(neg):
            empty = gm.graph.call_function(aten.all.dim, (neg, -1, True))
            with gm.graph.inserting_after(empty):
                guarded = gm.graph.call_function(aten.where.ScalarSelf, (empty, float("nan"), out))
    mode = getattr(fake_out, "fake_mode", None)
    with mode if mode is not None else contextlib.nullcontext():
        neg.meta["val"] = aten.eq.Scalar(fake_mask, float("-inf"))
        empty.meta["val"] = aten.all.dim(neg.meta["val"], -1, True)
        guarded.meta["val"] = aten.where.ScalarSelf(empty.meta["val"], float("nan"), fake_out)
    return guarded


def rewrite_eager_attention(gm: fx.GraphModule) -> int:
    """Replace every hand-written attention of ``gm`` (see the module docstring) by one
    ``aten.scaled_dot_product_attention`` node, in place; returns how many."""
    count = 0
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.graph is None:
            continue
        found = match(node)
        if found is None:
            continue
        q, k, v, mask = found["q"], found["k"], found["v"], found["mask"]
        if len({_val(t).dtype for t in (q, k, v)}) != 1 or not math.isfinite(found["scale"]):
            continue
        with gm.graph.inserting_before(node):
            kwargs = {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False, "scale": found["scale"],
                      "enable_gqa": found["group"] > 1}
            new = gm.graph.call_function(SDPA, (q, k, v), kwargs)
        new.meta.update(node.meta)
        for size_node, (src, dim) in found["sizes"].items():
            size_node.args = (src, dim)
        # a mask that may hold a row of -inf (a graph input, say): eager's softmax makes that row
        # NaN where SDPA makes it 0, so the rewrite puts eager's NaN back (a mask filled with a
        # finite value, as transformers' are, needs nothing)
        result = new if mask is None or _finite(mask) else _empty_rows_nan(gm, new, mask)
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        for dead in sorted(found["nodes"], key=lambda n: -position.get(n, -1)):
            if not dead.users and dead.graph is not None:
                gm.graph.erase_node(dead)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


__all__ = ["SDPA", "match", "rewrite_eager_attention"]
