"""Lowering attention: FX nodes → :class:`~tilewright.kinds.attention.AttentionProblem` (the kind
:mod:`tilewright.kinds.attention` makes each a kernel node).

What is recognised (anything else stays the ATen call it is, so a model never fails here):

* ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward (every SDPA call on a
  CPU: causal, additive mask, scale, GQA; ``dropout_p`` must be 0). Its lse is base e and 0 for
  a row with nothing kept, and the problem says so, so a kernel of ours and ATen's op can be
  mixed between forward and backward;
* ``aten._scaled_dot_product_flash_attention`` and its backward (CUDA's flash SDPA: no mask;
  causal only for Sq == Skv, where top-left and bottom-right alignment agree), and
  ``aten._scaled_dot_product_efficient_attention`` (an additive bias) when its padded lse is
  not used;
* ``higher_order.flex_attention`` and ``flex_attention_backward``: the score_mod and mask_mod
  subgraphs are lowered by the loop rules (:mod:`tilewright.kinds.loop.lower`) into the
  expression IR (:mod:`tilewright.kinds.attention.mods`), their captured tensors become the problem's
  captures, the block mask's tensors run-time inputs. The operator's lse is base 2. A mask
  covering everything with one block (what flex builds when no block mask is given) is no block
  mask; a mask_mod that is constantly true is none;
* attention written out by hand (:mod:`tilewright.kinds.attention.lower_eager`).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx as fx

from tilewright.kinds.attention import mods, sdpa_ops  # noqa: F401 - sdpa_ops registers its ops
from tilewright.kinds.attention.problem import AttentionProblem, Capture
from tilewright.compiler.graph import TensorMeta, size_hint
from tilewright.ir import dtypes
from tilewright.problem import DTYPE_NAMES

aten = torch.ops.aten
CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_FLASH_BWD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
CUDA_FLASH = aten._scaled_dot_product_flash_attention.default
CUDA_FLASH_BWD = aten._scaled_dot_product_flash_attention_backward.default
EFFICIENT = aten._scaled_dot_product_efficient_attention.default
SDPA = aten.scaled_dot_product_attention.default  # what hand-written attention is rewritten to
# SDPA with a float mask that requires grad (kinds/attention/sdpa_ops.py): the backward's
# fourth output is the scores' gradient
MASK_GRAD = torch.ops.tilewright.sdpa_mask_grad.default
MASK_GRAD_BWD = torch.ops.tilewright.sdpa_mask_grad_backward.default


class NotAttention(Exception):
    """This node stays on ATen; the message says why (logged, for ``explain``)."""


# -- shapes and layouts -----------------------------------------------------------------------------
def _meta(x: Any) -> TensorMeta:
    m = TensorMeta.of(x) if isinstance(x, fx.Node) else None
    if m is None:
        raise NotAttention(f"{x} is not a tensor with traced metadata")
    return m


def _order(node: fx.Node | None) -> tuple[int, ...] | None:
    """The physical dim order (outermost first) of a traced tensor value."""
    val = node.meta.get("val") if node is not None else None
    if not isinstance(val, torch.Tensor):
        return None
    strides = [size_hint(s) for s in val.stride()]
    sizes = [size_hint(s) for s in val.shape]
    return tuple(sorted(range(val.dim()), key=lambda d: (-strides[d] if sizes[d] > 1 else 0, d)))


def _getitems(node: fx.Node, count: int) -> list[fx.Node | None]:
    out: list[fx.Node | None] = [None] * count
    for user in node.users:
        if user.target is operator.getitem and isinstance(user.args[1], int) and user.args[1] < count:
            out[user.args[1]] = user
    return out


def specialize_heads(*nodes: Any) -> None:
    """Fix symbolic head counts and head dims of q, k, v nodes (dims 1 and 3) to their traced
    values, with a guard: under ``dynamic=True`` every size is a symbol, but a kernel is
    rendered for its heads and head dims (tiles of the head dim are compile-time constants), and
    a model's heads do not vary between calls. Dynamo recompiles should they ever change.
    Lengths and the batch stay symbolic."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    for n in nodes:
        val = n.meta.get("val") if isinstance(n, fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() != 4:
            continue
        for d in (1, 3):
            size = val.shape[d]
            if isinstance(size, torch.SymInt) and size.node.expr.free_symbols:
                try:
                    guard_int(size)
                except Exception as e:  # a dim marked dynamic by the user: it stays dynamic
                    raise NotAttention(f"a dynamic head count or head dim ({e.__class__.__name__})") from None


def _dims(q: TensorMeta, k: TensorMeta, v: TensorMeta) -> dict[str, Any]:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise NotAttention("attention over tensors that are not (B, H, S, D)")
    if len({q.dtype, k.dtype, v.dtype}) != 1 or DTYPE_NAMES.get(q.dtype) not in ("fp32", "fp16", "bf16"):
        raise NotAttention(f"dtypes {q.dtype}, {k.dtype}, {v.dtype} (fp32/fp16/bf16 alike are lowered)")
    if len({q.device, k.device, v.device}) != 1:
        raise NotAttention("operands on different devices")
    if any(e.free_symbols for e in (q.shape[1], q.shape[3], k.shape[1], v.shape[3])):
        raise NotAttention("a dynamic head count or head dim")
    names = ("B", "Sq", "Skv")
    dims = dict(B=q.hint_shape[0], H=q.hint_shape[1], H_kv=k.hint_shape[1], Sq=q.hint_shape[2],
                Skv=k.hint_shape[2], D=q.hint_shape[3], Dv=v.hint_shape[3], dtype=DTYPE_NAMES[q.dtype])
    if dims["H"] % dims["H_kv"] or k.hint_shape[0] != dims["B"] or v.hint_shape[:3] != k.hint_shape[:3]:
        raise NotAttention(f"shapes q {q.hint_shape}, k {k.hint_shape}, v {v.hint_shape} do not form attention")
    dyn = {n for n, e in zip(names, (q.shape[0], q.shape[2], k.shape[2])) if e.free_symbols}
    dims["dynamic"] = frozenset(dyn)
    return dims


def _orders(named: dict[str, fx.Node | None]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    out = []
    for name, node in named.items():
        o = _order(node)
        if o is not None and o != tuple(range(len(o))):
            out.append((name, o))
    return tuple(out)


# -- SDPA ---------------------------------------------------------------------------------------------
def mask_dims(m: TensorMeta, full: tuple[Any, ...], names: tuple[str, ...]) -> tuple[str | None, ...]:
    """Which dynamic problem size each dim of a mask of meta ``m`` follows (None: a fixed
    extent), its dims aligned to the right of ``full`` (the sizes named ``names``, sympy).

    Raises:
        NotAttention: a symbolic mask extent that is none of the sizes it broadcasts against.
    """
    lead = len(full) - m.ndim
    out: list[str | None] = []
    for d, e in enumerate(m.shape):
        if not e.free_symbols:
            if full[lead + d].free_symbols and int(e) != 1:
                raise NotAttention(f"a mask extent {e} fixed where {names[lead + d]} is dynamic")
            out.append(None)
        elif (e - full[lead + d]).simplify() == 0:
            out.append(names[lead + d])
        else:
            raise NotAttention(f"a mask extent {e} that is not {names[lead + d]} ({full[lead + d]})")
    return tuple(out)


def _sdpa_mask(mask: fx.Node | None, dims: dict, full: tuple[Any, ...] = ()
               ) -> tuple[str, str, list[fx.Node], tuple[Capture, ...]]:
    """(score_mod, mask_mod, captured nodes, captures) of SDPA's ``attn_mask``; ``full`` is
    (B, H, Sq, Skv) as traced (sympy), so a mask's dynamic dims follow the sizes they are."""
    if mask is None:
        return "", "", [], ()
    m = _meta(mask)
    if m.ndim > 4:
        raise NotAttention("an attention mask of rank > 4")
    shape = tuple(m.hint_shape)
    want = (dims["B"], dims["H"], dims["Sq"], dims["Skv"])[4 - len(shape):]
    if any(s not in (1, w) for s, w in zip(shape, want)):
        raise NotAttention(f"attention mask {shape} does not broadcast to {want}")
    follow = mask_dims(m, full, ("B", "H", "Sq", "Skv")) if m.symbolic else ()
    if any(follow):
        # a dim that follows a dynamic size indexes by its variable even where the bucket is 1
        shape = tuple(max(s, 2) if f else s for s, f in zip(shape, follow))
    dt = dtypes.name_of(m.dtype)
    if dt == "bool":
        return "", mods.dumps(mods.boolean_mask(0, shape)), [mask], (Capture(shape, "bool", dims=follow),)
    if dt not in ("fp32", "fp16", "bf16"):
        raise NotAttention(f"attention mask of dtype {m.dtype}")
    return mods.dumps(mods.additive_mask(0, shape, dt)), "", [mask], (Capture(shape, dt, dims=follow),)


def _scale(value: Any, D: int) -> float:
    if value is None:
        return 1.0 / math.sqrt(D)
    if not isinstance(value, (int, float)):
        raise NotAttention("a scale that is not a number")
    return float(value)


def lower_sdpa(node: fx.Node) -> tuple[AttentionProblem, list[str], list[str]]:
    """(problem, argument values, output values) of an SDPA op node.

    Raises:
        NotAttention: dropout, unknown arguments, or shapes it cannot take.
    """
    target = node.target
    kw = dict(node.kwargs)
    if target in (CPU_FLASH, CPU_FLASH_BWD):
        bwd = target is CPU_FLASH_BWD
        names = (["grad_out", "q", "k", "v", "out", "lse", "dropout_p", "is_causal"] if bwd
                 else ["q", "k", "v", "dropout_p", "is_causal"])
        a = dict(zip(names, node.args)) | kw
        empty_lse, mask = 0.0, a.get("attn_mask")
    elif target in (CUDA_FLASH, CUDA_FLASH_BWD):
        bwd = target is CUDA_FLASH_BWD
        names = (["grad_out", "q", "k", "v", "out", "lse", "cum_q", "cum_k", "max_q", "max_k", "dropout_p",
                  "is_causal"] if bwd else ["q", "k", "v", "dropout_p", "is_causal", "return_debug_mask"])
        a = dict(zip(names, node.args)) | kw
        empty_lse, mask = -math.inf, None
        if a.get("return_debug_mask"):
            raise NotAttention("the debug attention mask is requested")
    elif target is SDPA:
        bwd = False
        a = dict(zip(["q", "k", "v", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"], node.args)) | kw
        empty_lse, mask = -math.inf, a.get("attn_mask")
    elif target in (MASK_GRAD, MASK_GRAD_BWD):
        bwd = target is MASK_GRAD_BWD
        names = (["grad_out", "q", "k", "v", "attn_mask", "out", "lse", "scale", "score_grad"] if bwd
                 else ["q", "k", "v", "attn_mask", "scale"])
        a = dict(zip(names, node.args)) | kw
        empty_lse, mask = 0.0, a["attn_mask"]
    elif target is EFFICIENT:
        bwd = False
        a = dict(zip(["q", "k", "v", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal"], node.args)) | kw
        empty_lse, mask = -math.inf, a.get("attn_bias")
        if any(u.args[1] != 0 for u in node.users if u.target is operator.getitem):
            raise NotAttention("the efficient kernel's padded lse is used")
    else:
        raise NotAttention(f"{target} is not an SDPA op tilewright lowers")
    if a.get("dropout_p", 0.0) not in (0, 0.0):
        raise NotAttention("dropout (dropout_p > 0) in attention")
    specialize_heads(a["q"], a["k"], a["v"])
    q, k, v = (_meta(a[n]) for n in ("q", "k", "v"))
    dims = _dims(q, k, v)
    causal = bool(a.get("is_causal", False))
    if causal and target in (CUDA_FLASH, CUDA_FLASH_BWD, EFFICIENT) and dims["Sq"] != dims["Skv"]:
        raise NotAttention("causal GPU SDPA with Sq != Skv (its alignment is the kernel's)")
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    score_mod, mask_mod, cap_nodes, captures = _sdpa_mask(mask, dims, full)
    renorm = target is MASK_GRAD_BWD  # the math form's P (sdpa_ops)
    score_grad = renorm and bool(a.get("score_grad"))
    outs = [node, None] if target is SDPA else _getitems(node, (4 if score_grad else 3) if bwd else 2)
    named = ({"dq": outs[0], "dk": outs[1], "dv": outs[2]} if bwd else {"out": outs[0], "lse": outs[1]})
    if score_grad:
        named["ds"] = outs[3]
    problem = AttentionProblem(**dims, scale=_scale(a.get("scale"), dims["D"]), causal=causal,
                               direction="backward" if bwd else "forward", score_mod=score_mod,
                               mask_mod=mask_mod, captures=captures, empty_lse=empty_lse,
                               score_grad=score_grad, renorm=renorm, orders=_orders(named), op="sdpa")
    if target is SDPA and bool(a.get("enable_gqa", False)) != (dims["H"] != dims["H_kv"]):
        raise NotAttention("query and key heads differ without enable_gqa")
    head = [a["q"], a["k"], a["v"]] + ([a["out"], a["grad_out"], a["lse"]] if bwd else [])
    args = [n.name for n in head + cap_nodes]
    return problem, args, [o.name if o is not None else "" for o in outs]


# -- the pass -----------------------------------------------------------------------------------------
SDPA_OPS = (CPU_FLASH, CPU_FLASH_BWD, CUDA_FLASH, CUDA_FLASH_BWD, EFFICIENT, SDPA, MASK_GRAD, MASK_GRAD_BWD)


def lower_node(node: fx.Node, gm: fx.GraphModule) -> tuple[AttentionProblem, list[str], list[str]] | None:
    """(problem, argument values, output values) of an attention FX node, None for other nodes.

    Raises:
        NotAttention: an attention node that stays on ATen (the reason in the message).
    """
    from tilewright.kinds.attention.lower_flex import FLEX, FLEX_BWD, lower_flex, lower_flex_backward

    if node.op != "call_function":
        return None
    if node.target in SDPA_OPS:
        return lower_sdpa(node)
    if node.target is FLEX:
        return lower_flex(node, gm)
    if node.target is FLEX_BWD:
        return lower_flex_backward(node, gm)
    return None
